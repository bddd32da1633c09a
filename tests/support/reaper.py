"""Every process a test run starts dies with the run, however the run ends.

A run marks its environment with ``SECURE_AFL_TEST_RUN=<token>``; every process
it starts inherits the mark, including those that detach into sessions of their
own (Flower's SuperExec and app processes, a server started with
``start_new_session``), which a process group would not reach. A watcher
process, in a session of its own so that a signal to the run's process group
(``timeout``, a CI cancel) does not take it along, waits on a pidfd for the run
to exit (normally, by an exception or by SIGKILL) and then ends every live
process that carries the token: SIGTERM, a short grace, then SIGKILL until
none is left.

Run as ``python reaper.py PID TOKEN``: the watcher itself.
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

MARK = "SECURE_AFL_TEST_RUN"


def carries(pid: int, name: str, value: str) -> bool:
    """Whether ``pid``'s initial environment holds ``name=value`` (False for a zombie or a vanished pid)."""
    try:
        return f"{name}={value}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or not ours to read
        return False


def marked(name: str, value: str) -> list[int]:
    """Live processes other than this one whose initial environment holds ``name=value``."""
    return [int(d.name) for d in Path("/proc").iterdir()
            if d.name.isdigit() and int(d.name) != os.getpid() and carries(int(d.name), name, value)]


def _signal_marked(token: str, sig: int) -> list[int]:
    """Send ``sig`` to every process marked with ``token``; returns their pids.

    Each pid's environment is read again through an open pidfd, so a pid
    reused in between is never signalled.
    """
    sent = []
    for pid in marked(MARK, token):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            if carries(pid, MARK, token):
                signal.pidfd_send_signal(fd, sig)
                sent.append(pid)
        except OSError:
            pass
        finally:
            os.close(fd)
    return sent


def sweep(token: str, grace_s: float = 5.0, rounds: int = 50) -> list[int]:
    """End every process marked with ``token``; returns the pids it found.

    SIGTERM first, so that servers shut down as they would in production,
    and ``grace_s`` for helpers that end on their own once the run is gone
    (multiprocessing's resource tracker ignores SIGTERM and cleans up on
    EOF); then SIGKILL until none is left (a dying parent may still fork once).
    """
    found = _signal_marked(token, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while found and marked(MARK, token) and time.monotonic() < deadline:
        time.sleep(0.1)
    for _ in range(rounds):
        if not _signal_marked(token, signal.SIGKILL):
            break
        time.sleep(0.05)  # bounded by ``rounds``: lets the kernel tear the killed ones down
    return found


def start() -> str:
    """Mark this process's environment and start the watcher for it; returns the run's token."""
    token = f"{os.getpid()}-{secrets.token_hex(8)}"
    # unmarked (no token of this run nor of an enclosing one): no sweep ever kills a watcher
    env = {k: v for k, v in os.environ.items() if k != MARK}
    subprocess.Popen([sys.executable, os.path.abspath(__file__), str(os.getpid()), token], env=env,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)
    os.environ[MARK] = token
    return token


def _watch(pid: int, token: str) -> None:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # the run is already gone
        pass
    else:
        select.select([fd], [], [])  # readable once the run has exited, however it ended
    sweep(token)


if __name__ == "__main__":
    _watch(int(sys.argv[1]), sys.argv[2])
