"""A test run killed mid-way (SIGKILL: a CI timeout, an OOM kill) leaves none of its processes behind.

The run under test is a real pytest run with this suite's conftest, of a test
that starts what the suite's tests start: a server process, a process in a
session of its own, and a Flower SuperLink and SuperNode (whose SuperExec
detaches again). Every process of that run carries a probe variable in its
environment, which is how the survivors would be found.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import reaper

pytestmark = [pytest.mark.e2e, pytest.mark.flower]

TESTS = Path(__file__).resolve().parent
PROBE = "SECURE_AFL_TEST_PROBE"

VICTIM = '''
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import Consortium
from support.flower import FlowerDeployment


@pytest.mark.e2e
def test_starts_processes_then_waits(tmp_path):
    Consortium(tmp_path / "c", backend="plain").start()
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)"], start_new_session=True)
    flower = FlowerDeployment(tmp_path / "fl")
    flower.start_superlink()
    flower.start_supernode("h1", {"role": "hospital", "name": "h1"})
    Path(os.environ["VICTIM_READY"]).write_text("started")
    time.sleep(900)
'''


def _cmdlines(pids):
    out = {}
    for pid in pids:
        try:
            out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
        except OSError:
            pass
    return out


def test_a_killed_test_run_leaves_no_process_behind(tmp_path):
    pytest.importorskip("flwr")
    # Prepare: a pytest run with this suite's conftest (as a plugin) of a test that starts real processes
    probe = secrets.token_hex(8)
    ready = tmp_path / "ready"
    (tmp_path / "test_victim.py").write_text(VICTIM)
    env = {**os.environ, PROBE: probe, "VICTIM_READY": str(ready),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                            "-o", "markers=e2e", "test_victim.py"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while not ready.exists():  # bounded: the run starts everything, or exits, or the deadline passes
            assert run.poll() is None, run.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the victim run did not start its processes"
            time.sleep(0.2)
        started = _cmdlines(set(reaper.marked(PROBE, probe)) - {run.pid})
        assert sum("secure_afl.cli server run" in c for c in started.values()) == 1, started
        assert any("flower-superlink" in c for c in started.values()), started
        assert any("flower-supernode" in c for c in started.values()), started

        # Execute: SIGKILL the run itself (its children are not signalled)
        run.kill()
        run.wait(timeout=30)

        # Assert: within a bounded wait, nothing of that run is left
        deadline = time.monotonic() + 60
        while reaper.marked(PROBE, probe) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _cmdlines(reaper.marked(PROBE, probe))
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for pid in reaper.marked(PROBE, probe):  # the failing case: not left to outlive this run
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
