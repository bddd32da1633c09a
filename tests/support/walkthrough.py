"""The documented walkthroughs as a shell user runs them: the ``party$ command`` blocks of README.md and
docs/RUNNING.md, each party in its own directory, ``&`` in the background of that party's shell, ``wait``
where its lines say so; the hospitals' images are the only inputs made here."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from support import free_port

REPO = Path(__file__).resolve().parents[2]
# every file holding a "## A session, end to end..." section: README's walkthrough and the other backends'
WALKTHROUGHS = (REPO / "README.md", REPO / "docs" / "RUNNING.md")
HOSPITALS = ("hosp-a", "hosp-b", "hosp-c")
CLASSES = ("benign", "malignant", "normal")
PROMPT = re.compile(r"^([a-z][a-z0-9-]*)\$ (.*)$")


def session_sections(text: str) -> list[str]:
    """Every "## A session, end to end..." section of a Markdown file, up to the next level-2 heading."""
    return [m.group(0) for m in re.finditer(r"^## A session, end to end.*?(?=^## |\Z)", text, re.S | re.M)]


def prompt_commands(block: str) -> list[tuple[str, str]]:
    """``party$ command`` lines of a shell block as (party, command); a here-document's body stays with its
    command."""
    commands: list[list[str]] = []
    for line in block.splitlines():
        p = PROMPT.match(line)
        if p:
            commands.append([p.group(1), p.group(2)])
        else:  # the body of a here-document
            commands[-1][1] += "\n" + line
    return [(party, cmd) for party, cmd in commands]


def documented_sessions() -> dict[str, list[tuple[str, str]]]:
    """{"CKKS": [(party, command), ...], "BFV": [...], "SecAgg": [...], "split": [...]} from every walkthrough
    section."""
    out = {}
    sections = [sec for path in WALKTHROUGHS for sec in session_sections(path.read_text())]
    for m in (m for section in sections for m in re.finditer(r"### With (\w+).*?```sh\n(.*?)```", section, re.S)):
        commands: list[list[str]] = []
        assert m.group(1) not in out, f"two walkthroughs for {m.group(1)}"
        out[m.group(1)] = prompt_commands(m.group(2))
    return out


def make_inputs(root: Path) -> None:
    """What the README says each party holds before the session: the hospitals' images (the shared weights
    file is made by a documented command)."""
    from PIL import Image

    rng = np.random.default_rng(1)
    for h in HOSPITALS:
        for c in CLASSES:
            (root / h / "images" / c).mkdir(parents=True)
            for i in range(2):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(
                    root / h / "images" / c / f"{i}.png")


def run_session(root: Path, commands: list[tuple[str, str]]) -> dict:
    port, port2 = str(free_port()), str(free_port())  # the documented 8443, and 8444 of a session beside it
    env = {k: v for k, v in os.environ.items() if k != "SECURE_AFL_KEY_PASSPHRASE"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    servers, background = [], []

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
            cmd = cmd.replace("8443", port).replace("8444", port2)
            cwd = root / party
            cwd.mkdir(exist_ok=True)
            if cmd.rstrip().endswith("&") and "<<" not in cmd:
                err = root / f"bg-{i}-{party}.err"
                proc = subprocess.Popen(cmd.rstrip()[:-1], shell=True, executable="/bin/bash", cwd=cwd, env=env,
                                        stdout=subprocess.DEVNULL, stderr=open(err, "wb"), start_new_session=True)
                proc.stderr_path = err
                if "server run" in cmd:
                    servers.append(proc)
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
        for server in servers:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
