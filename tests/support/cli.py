"""The ``secure-afl`` command as an operator runs it, and what an operator should see when it refuses.

Each call starts the console entry point in its own process (the test must be
marked ``e2e``), without ``$SECURE_AFL_KEY_PASSPHRASE`` so that a passphrase
only reaches the command through the flags a test names.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from secure_afl.clients.statsfile import write_statistics_file

#: What a retry would cost: a command that ends well within this did not retry.
RETRY_WINDOW_S = 30
#: Interpreter start and imports on a loaded two-core machine, plus the work itself.
FAST_S = 12
# words that give away a Python class where an operator should read a reason
_CLASS_NAMES = ("Error", "Exception", "<class")


def run_cli(*args, cwd=None, timeout=300) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``secure-afl ARGS``; returns the finished process and the seconds it took."""
    env = {k: v for k, v in os.environ.items() if k != "SECURE_AFL_KEY_PASSPHRASE"}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "secure_afl.cli", *map(str, args)], capture_output=True,
                         text=True, timeout=timeout, env=env, cwd=cwd)
    return out, time.monotonic() - t0


def error_line(err: str) -> str:
    """The one ``secure-afl: error [reason]: ...`` line in ``err`` (other lines, such as a wait notice, may
    precede it), whose reason is a word, not a Python class name."""
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("secure-afl: error [")]
    assert len(lines) == 1, err
    assert not any(w in lines[0].split("]: ", 1)[0] for w in _CLASS_NAMES), lines[0]
    return lines[0]


def one_line(out: subprocess.CompletedProcess, code: int, reason: str) -> str:
    """Assert the command exited ``code`` with nothing on stderr but the one error line of ``reason``."""
    lines = out.stderr.strip().splitlines()
    assert out.returncode == code, out.stderr
    assert "Traceback" not in out.stderr and len(lines) == 1, out.stderr
    assert lines[0].startswith(f"secure-afl: error [{reason}]: "), lines[0]
    return error_line(out.stderr)


def stats_file(c, name: str, path: Path, *, classes: int | None = None) -> Path:
    """Hospital ``name``'s statistics file as ``secure-afl client embed`` writes it (with ``classes`` labels
    folded into that many classes when it differs from the session's)."""
    from secure_afl.stats import StatisticsAccumulator

    X, y = c.data(name)
    classes = classes or c.classes
    if classes == c.classes:
        stats = c.stats(X, y)
    else:
        acc = StatisticsAccumulator(X.shape[1], classes, max_norm=c.max_norm)
        acc.update(X, y % classes)
        stats = acc.finalize(gamma=0.0)
    return write_statistics_file(path, stats, [f"class-{i}" for i in range(classes)],
                                 metadata={"max_row_norm": float(np.linalg.norm(X, axis=1).max())})


def submit_args(c, name: str, stats, *, pki_dir=None, session=None, server=None, receipts=None,
                wait_server=None) -> list:
    """``client submit`` of ``stats`` as hospital ``name``; by default to ``c``'s server and session, with the
    command's own retry window unless ``wait_server`` names one."""
    args = ["client", "submit", "--server", server or c.url, "--session", session or c.session_id,
            "--pki", pki_dir or c.pki_dir, "--name", name, "--stats", stats,
            "--receipts", receipts or c.root / "receipts", "--no-progress"]
    return args + (["--wait-server", wait_server] if wait_server is not None else [])


def finalize_args(c, out: Path, *extra, min_clients=None) -> list:
    """``keyholder finalize`` of ``c``'s session into the model file ``out``."""
    return ["keyholder", "finalize", "--pki", c.pki_dir, "--keys", c.root / "keys", "--server", c.url,
            "--session", c.session_id, "--min-clients", min_clients or c.min_clients, "--out", out, *extra]


def passphrase_file(path: Path, text: str) -> Path:
    """A passphrase file readable by its owner only, as the key holder commands require."""
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path
