"""docs/FLOWER.md's deployment script, run as written by a shell user, in the party directories README's
walkthrough leaves (its operator, `cp` and `client embed` lines run first; its native session does not)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support import free_port
from support.walkthrough import documented_sessions, make_inputs, run_session

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
# README lines of its native session (the Flower round replaces them) and of what follows the release
_NATIVE = ("server run", "keyholder keygen", "keyholder publish", "client submit", "keyholder finalize", "predict",
           "audit verify", "audit compare", "cp ../server/", "cp ../keyholder/")


def test_the_flower_script_runs_as_written_and_releases(tmp_path):
    pytest.importorskip("flwr")
    pytest.importorskip("torch")

    # Prepare: README's parties, bundles and statistics; the documented script with free ports in place of
    # its fixed ones (nothing else of it changed)
    make_inputs(tmp_path)
    run_session(tmp_path, [(p, c) for p, c in documented_sessions()["split"] if not any(n in c for n in _NATIVE)])
    script = re.search(r"```sh\n(export FLWR_HOME.*?)```", (ROOT / "docs" / "FLOWER.md").read_text(), re.S).group(1)
    script = script.replace("9190", str(free_port())).replace("port=9201", f"port={free_port()}")
    script = script.replace("--port 9209", f"--port {free_port()}")
    env = {k: v for k, v in os.environ.items() if k != "SECURE_AFL_KEY_PASSPHRASE"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"

    # Execute: the whole block in one shell, as a reader pastes it
    out = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900, start_new_session=True)

    # Assert: the round released over the three hospitals, and hosp-a's audit check passed on the log
    log = (tmp_path / "flwr-run.log").read_text()
    assert "secure-afl round done" in log, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Connection to the SuperLink is unavailable" not in out.stdout + out.stderr
    report = json.loads((tmp_path / "keyholder" / "report-flower-cohort-split.json").read_text())
    assert report["participants"] == ["hosp-a", "hosp-b", "hosp-c"] and report["samples"] == 18
    assert re.search(r"^OK\b", out.stdout, re.M), out.stdout[-3000:]
