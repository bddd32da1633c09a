"""Fixtures and run-wide hooks; the helpers themselves live in :mod:`support`.

Three rules hold for the whole run:

* every process the run starts dies with it (:mod:`support.reaper`);
* a test that starts a process (a server, the ``secure-afl`` CLI, a Python
  child, a Flower binary) is marked ``e2e``, so ``-m "not e2e"`` really runs
  in one process; an unmarked test that tries fails, naming the reason;
* a run that has not exited 180 s after its last test prints every thread's
  stack and exits 1;
* a security test that skips fails, unless the run passes
  ``--allow-security-skips`` (:mod:`support.skips`).
"""

from __future__ import annotations

import faulthandler
import os
import sys
from pathlib import Path

import pytest

from support import reaper
from support.skips import pytest_addoption, pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401

# what a library may run behind a one-process test's back (ctypes.util.find_library, platform probes, and
# fc-list: matplotlib lists the installed fonts once, the first time it runs without a font cache)
_SYSTEM_TOOLS = {"ldconfig", "ldconfig.real", "gcc", "cc", "ld", "objdump", "uname", "nvidia-smi", "lscpu",
                 "fc-list"}
_in_e2e_test = [True]  # outside a test (collection, session start) anything may start


def _audit(event, args):
    if event != "subprocess.Popen" or _in_e2e_test[0]:
        return
    cmd = args[0] if args[0] is not None else args[1]  # (executable, args, cwd, env)
    if not isinstance(cmd, (str, bytes, os.PathLike)):
        cmd = cmd[0]
    prog = Path(os.fsdecode(cmd)).name
    if prog not in _SYSTEM_TOOLS:
        raise RuntimeError(f"this test starts a process ({prog}) but is not marked e2e: mark it "
                           "@pytest.mark.e2e (and slow if it is long), or keep it in one process")


def pytest_configure(config):
    # plots are written to files: no display is looked for, whatever the machine has
    os.environ.setdefault("MPLBACKEND", "Agg")
    reaper.start()
    sys.addaudithook(_audit)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _in_e2e_test[0] = item.get_closest_marker("e2e") is not None
    try:
        yield
    finally:
        _in_e2e_test[0] = True


@pytest.fixture
def consortium(tmp_path):
    """Make consortia (server, key holder, hospitals on 127.0.0.1) for one test; all stopped at its end."""
    from support import Consortium

    made = []

    def make(**kw):
        c = Consortium(tmp_path / f"c{len(made)}", **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


def pytest_unconfigure(config):
    """Arm the exit watchdog (the reaper's watcher ends the run's processes once it has exited).

    A thread left running (a queue's feeder, a server that was not stopped)
    otherwise holds the interpreter at exit until CI kills the whole job, with
    no sign of which one it was.
    """
    faulthandler.dump_traceback_later(180, exit=True, file=sys.stderr)
