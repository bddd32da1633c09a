"""Durable file writes shared by the PKI, key storage, the audit log and the server store."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_all", "fsync_dir"]


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written (a single call may write fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def fsync_dir(directory: Path) -> None:
    """fsync a directory so a file created or renamed in it survives a crash."""
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(dfd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(dfd)
