"""Durable file writes shared by the PKI, key storage, the audit log and the server store,
and the checks on files that must stay private (0600)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .exceptions import InsecureFileMode, WeakPassphrase

__all__ = ["write_all", "write_file", "refuse_existing", "place_new", "fsync_dir", "refuse_if_shared", "private_file", "read_private_file", "check_passphrase",
           "MIN_PASSPHRASE_CHARS"]

# scrypt slows guessing but cannot make a short passphrase safe: 12 characters of
# a passphrase from words or a password manager put brute force out of reach
MIN_PASSPHRASE_CHARS = 12


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


def refuse_existing(path, what: str, *, force: bool = False, hint: str = "") -> None:
    """:class:`InvalidInputError` (reason ``output_exists``) when ``path`` exists and ``force`` is not set: a
    command writes only files it creates in this run (a released model cannot be released again)."""
    from .exceptions import InvalidInputError

    p = Path(path)
    if p.is_dir():
        raise InvalidInputError(f"{what} {p} is a directory; name a file (nothing was changed)",
                                reason="is_a_directory")
    if p.exists() and not force:
        raise InvalidInputError(f"{what} {p} already exists; it was not written by this run and is left as it is: "
                                f"name another file{hint or ' or remove it first'} (nothing was changed)",
                                reason="output_exists")


def place_new(tmp, path, what: str, *, force: bool = False) -> None:
    """Move the finished ``tmp`` to ``path``: with ``force`` replacing it, otherwise only if ``path`` does not
    exist at that moment (a hard link fails on an existing name, so a file made meanwhile is never replaced)."""
    from .exceptions import InvalidInputError

    if force:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)
    except FileExistsError:
        os.unlink(tmp)
        raise InvalidInputError(f"{what} {path} appeared while this command ran; it is left as it is and "
                                "nothing was written to it", reason="output_exists") from None
    os.unlink(tmp)


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


def refuse_if_shared(path: Path, what: str) -> None:
    mode = os.stat(path).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InsecureFileMode(f"{what} {path} has mode {stat.S_IMODE(mode):04o}; it must not be readable by "
                               f"group or others: chmod 600 {path}")


def private_file(path, what: str = "file") -> Path:
    """``path`` as a file only its owner can read: created empty 0600 if missing, refused if it is shared."""
    path = Path(path)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600))
    except FileExistsError:
        refuse_if_shared(path, what)
    return path


def read_private_file(path, what: str = "secret file") -> bytes:
    """The bytes of a secret file, refused when its group or others may read it."""
    path = Path(path)
    refuse_if_shared(path, what)
    return path.read_bytes()


def check_passphrase(passphrase: bytes | str) -> bytes:
    """The passphrase as bytes, or :class:`WeakPassphrase` when it is shorter than the minimum."""
    raw = passphrase.encode() if isinstance(passphrase, str) else bytes(passphrase)
    if len(raw.decode("utf-8", "replace")) < MIN_PASSPHRASE_CHARS:
        raise WeakPassphrase(f"the passphrase has fewer than {MIN_PASSPHRASE_CHARS} characters; use a longer one "
                             "(several words, or one from a password manager)")
    return raw
