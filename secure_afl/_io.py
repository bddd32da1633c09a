"""Durable file writes shared by the PKI, key storage, the audit log and the server store."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_all", "write_file", "fsync_dir"]


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written (a single call may write fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_file(path, data: bytes, *, mode: int = 0o600, exclusive: bool = True) -> None:
    """Create ``path`` with ``mode`` (whatever the umask), write ``data`` and fsync it.

    ``exclusive`` refuses an existing file (keys are never overwritten);
    symlinks are never followed.
    """
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC) | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(os.fspath(path), flags, mode)
    try:
        os.fchmod(fd, mode)
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


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
