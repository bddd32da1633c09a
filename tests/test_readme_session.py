"""The documented sessions ("A session, end to end"), run exactly as written, for every backend.

The commands are read from README.md (split) and docs/RUNNING.md (BFV, SecAgg, CKKS),
so the documentation cannot drift from what works. Every party has its own directory; the only things the test
puts there are the inputs the README says a party holds before the session
(a hospital's images). The port is replaced by a free one so parallel runs do not
collide. The lines run as a shell user would run them: a command ending in ``&`` runs in the background of
its party's shell and is waited for only where that party's lines say ``wait``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from support import free_port

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
from PIL import Image  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# every file holding a "## A session, end to end..." section: README's walkthrough and the other backends'
WALKTHROUGHS = (REPO / "README.md", REPO / "docs" / "RUNNING.md")
HOSPITALS = ("hosp-a", "hosp-b", "hosp-c")
CLASSES = ("benign", "malignant", "normal")
_PROMPT = re.compile(r"^([a-z][a-z0-9-]*)\$ (.*)$")


def _session_sections(text: str) -> list[str]:
    """Every "## A session, end to end..." section of a Markdown file, up to the next level-2 heading."""
    return [m.group(0) for m in re.finditer(r"^## A session, end to end.*?(?=^## |\Z)", text, re.S | re.M)]


def documented_sessions() -> dict[str, list[tuple[str, str]]]:
    """{"CKKS": [(party, command), ...], "BFV": [...], "SecAgg": [...], "split": [...]} from every walkthrough
    section."""
    out = {}
    sections = [sec for path in WALKTHROUGHS for sec in _session_sections(path.read_text())]
    for m in (m for section in sections for m in re.finditer(r"### With (\w+).*?```sh\n(.*?)```", section, re.S)):
        commands: list[list[str]] = []
        for line in m.group(2).splitlines():
            p = _PROMPT.match(line)
            if p:
                commands.append([p.group(1), p.group(2)])
            else:  # the body of a here-document
                commands[-1][1] += "\n" + line
        assert m.group(1) not in out, f"two walkthroughs for {m.group(1)}"
        out[m.group(1)] = [(party, cmd) for party, cmd in commands]
    return out


def _inputs(root: Path) -> None:
    """What the README says each party holds before the session: the hospitals' images (the shared weights
    file is made by a documented command)."""
    rng = np.random.default_rng(1)
    for h in HOSPITALS:
        for c in CLASSES:
            (root / h / "images" / c).mkdir(parents=True)
            for i in range(2):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(
                    root / h / "images" / c / f"{i}.png")


def _run_session(root: Path, commands: list[tuple[str, str]]) -> dict:
    port = str(free_port())
    env = {k: v for k, v in os.environ.items() if k != "SECURE_AFL_KEY_PASSPHRASE"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    server, background = None, []

    def wait_for(party):
        """``party$ wait``: that party's shell waits for its own background jobs, and only then."""
        for job in [j for j in background if j[0] == party]:
            background.remove(job)
            _, cmd, proc = job
            rc = proc.wait(timeout=300)
            assert rc == 0, f"{party}$ {cmd}\n{proc.stderr_path.read_text()}"

    t0 = time.monotonic()
    try:
        for i, (party, cmd) in enumerate(commands):
            cmd = cmd.replace("8443", port)
            cwd = root / party
            cwd.mkdir(exist_ok=True)
            if cmd.rstrip().endswith("&") and "<<" not in cmd:
                err = root / f"bg-{i}-{party}.err"
                proc = subprocess.Popen(cmd.rstrip()[:-1], shell=True, executable="/bin/bash", cwd=cwd, env=env,
                                        stdout=subprocess.DEVNULL, stderr=open(err, "wb"), start_new_session=True)
                proc.stderr_path = err
                if "server run" in cmd:
                    server = proc
                else:
                    background.append((party, cmd, proc))
                continue
            if cmd.strip() == "wait":
                wait_for(party)
                continue
            out = subprocess.run(cmd, shell=True, executable="/bin/bash", cwd=cwd, env=env, capture_output=True,
                                 text=True, timeout=300)
            assert out.returncode == 0, f"{party}$ {cmd}\n{out.stderr}"
        # a job the walkthrough never waits for is one a reader would leave running: it must not be needed
        assert not background, f"background jobs the walkthrough never waits for: {[c for _, c, _ in background]}"
        return {"seconds": time.monotonic() - t0}
    finally:
        for _, _, proc in background:
            os.killpg(proc.pid, signal.SIGTERM)
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)


def _holds_only_its_own_bundle(root: Path) -> None:
    expected = {"server": "server-aggregator", "keyholder": "keyholder-keyholder",
                **{h: f"hospital-{h}" for h in HOSPITALS}}
    for party, own in expected.items():
        pki_dir = root / party / "pki"
        assert sorted(p.name for p in pki_dir.iterdir()) == sorted(["ca.pem", "roster.json", "sessions", own]), party
    assert [p for p in root.rglob("ca.key")] == [root / "operator" / "pki" / "ca.key"]


def test_readme_documents_every_protected_backend():
    # README keeps one walkthrough; the others live in docs/RUNNING.md, run by the same test
    assert [m for m in re.findall(r"^### With (\w+)", "".join(_session_sections(WALKTHROUGHS[0].read_text())), re.M)] \
        == ["split"]
    sessions = documented_sessions()
    assert sorted(sessions) == ["BFV", "CKKS", "SecAgg", "split"]
    for commands in sessions.values():
        assert {p for p, _ in commands} == {"operator", "server", "keyholder", *HOSPITALS}


@pytest.mark.e2e
@pytest.mark.parametrize("backend", ["CKKS", "BFV", "SecAgg", "split"])
def test_documented_session_runs_as_written(tmp_path, backend):
    # Prepare
    _inputs(tmp_path)
    commands = documented_sessions()[backend]

    # Execute
    timing = _run_session(tmp_path, commands)

    # Assert: the key holder's model and report, the hospital's audit check, each party's files
    report = json.loads((tmp_path / "keyholder" / "report.json").read_text())
    assert report["participants"] == list(HOSPITALS)
    assert report["class_counts"] == [6, 6, 6] and report["samples"] == 18
    from secure_afl.keyholder import read_model

    W, meta = read_model(tmp_path / "keyholder" / "model.safetensors")
    assert W.shape == (512, 3) and np.all(np.isfinite(W))
    # the model says which session, class order and extractor it belongs to: the session.toml's own
    session_id = {"CKKS": "cohort-ckks", "BFV": "cohort-bfv", "SecAgg": "cohort-secagg",
                  "split": "cohort-split"}[backend]
    from secure_afl.server.config import load_config

    declared = load_config(tmp_path / "server" / "session.toml").extractor
    assert meta.session == session_id and meta.class_names == CLASSES
    assert meta.extractor.to_dict() == declared
    if backend == "BFV":  # exact decryption: nothing flooded, no ridge
        assert report["flood_sigma"] == 0.0 and report["flood_ridge"] == 0.0
    if backend == "split":  # README's hospital applies the model to its images (`secure-afl predict`)
        rows = (tmp_path / "hosp-a" / "predictions.csv").read_text().splitlines()
        assert rows[0] == "index,file,label,predicted,score" and len(rows) == 1 + 6
        assert all(r.split(",")[3] in CLASSES for r in rows[1:])
    assert len(list((tmp_path / "hosp-a" / "receipts").glob("*.json"))) == 1
    _holds_only_its_own_bundle(tmp_path)
    print(f"\n{backend}: documented session took {timing['seconds']:.1f} s")
