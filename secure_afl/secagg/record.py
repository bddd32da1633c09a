"""A hospital's durable record of the secagg sessions in which it signed a survivor set.

Two unmasked sums of one session over different survivor sets differ by the
hospitals left out of one of them. A server can obtain a second sum by
re-running a round (any round number, the same one included) after a
hospital restarted and lost its in-memory state. So once a hospital has
signed a survivor set of a session it takes no further part in that session:
no setup, no second signature, whatever round the server announces, until
the operator signs a new session. A retry before any signature (the round
aborted at setup or at the masked inputs) stays allowed.

Where it lives. By default in the hospital's own directory of its PKI bundle
(``<pki>/hospital-<name>/secagg-records``), for ``client submit`` and the
Flower ClientApp alike: that directory holds the hospital's identity key, so
every process that can sign as this hospital finds the record, whatever its
working directory. An explicit directory must be absolute for the same
reason. The record is written and synced before the signature leaves the
hospital. It holds no secret.

Two processes of one hospital. :meth:`SurvivorRecord.signing` holds an
exclusive ``flock`` on a lock file beside the record from the check, through
the signature and the durable write, until the signature has been handed on;
a second process that reaches it meanwhile is refused rather than made to
wait, so at most one survivor set of a session is ever signed.

A record that exists but cannot be read (truncated, edited, unreadable
permissions) refuses with :class:`UnreadableRecord`: it may be the trace of
a signature that left.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from ..exceptions import InvalidContribution, InvalidParameterError, UnreadableRecord

__all__ = ["SurvivorRecord", "default_directory"]

#: below the hospital's own directory of its PKI bundle
RECORD_DIR = "secagg-records"


def default_directory(party) -> Path:
    """The record directory of ``party`` (a hospital's :class:`secure_afl.pki.PartyFiles`): inside its own
    bundle directory, made absolute now (the process found its keys there)."""
    return Path(party.directory).resolve() / RECORD_DIR


class SurvivorRecord:
    """Per (session, hospital): whether, and in which round, this hospital signed a survivor set.

    Parameters
    ----------
    directory : path
        Absolute path of the hospital's record directory (created 0700); :func:`default_directory`.
    session_id, hospital : str
    """

    def __init__(self, directory, session_id: str, hospital: str):
        d = Path(directory)
        if not d.is_absolute():
            raise InvalidParameterError(
                f"the secagg record directory must be an absolute path, not {str(directory)!r}: a relative one "
                "would be another directory for a process started elsewhere, which would then sign again")
        # not *.json: a hospital may keep it in its receipts directory, whose JSON files are receipts
        self.path = d / f"secagg-signed-{session_id}-{hospital}.record"
        self.lock_path = d / f"secagg-signed-{session_id}-{hospital}.lock"
        self.session_id, self.hospital = session_id, hospital

    def signed_round(self) -> int | None:
        """The round whose survivor set this hospital signed in this session, or None.

        A record that exists but does not read as this session's and hospital's raises
        :class:`UnreadableRecord`."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise self._unreadable(e.strerror or type(e).__name__) from None
        try:
            rec = json.loads(raw)
            r = rec["round"]
            if (rec["session_id"], rec["hospital"]) != (self.session_id, self.hospital) \
                    or isinstance(r, bool) or not isinstance(r, int) or r < 1:
                raise ValueError("not this session's record")
        except (ValueError, KeyError, TypeError) as e:
            raise self._unreadable(str(e) or type(e).__name__) from None
        return r

    def _unreadable(self, why: str) -> UnreadableRecord:
        return UnreadableRecord(
            f"{self.hospital}'s secagg record {self.path} cannot be read ({why}): it may say that a survivor set "
            f"of session {self.session_id} was signed, so {self.hospital} takes no part in it; restore the record "
            "from a backup, or contribute to a new session")

    def refuse_if_signed(self, announced_round) -> None:
        """Refuse any part in this session once a survivor set of it was signed (:class:`InvalidContribution`;
        :class:`UnreadableRecord` when the record cannot be read)."""
        r = self.signed_round()
        if r is not None:
            raise InvalidContribution(
                f"{self.hospital} signed a survivor set of session {self.session_id} (round {r}; {self.path}) and "
                f"takes no further part in it (round {announced_round} announced): two unmasked sums over "
                "different survivor sets could be differenced; contribute to a new session instead")

    @contextlib.contextmanager
    def signing(self):
        """Exclusive among the processes of this hospital: the caller checks, signs, writes the record and hands
        the signature on inside; another process that gets here meanwhile is refused (:class:`InvalidContribution`)."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise InvalidContribution(
                    f"another process of {self.hospital} is signing a survivor set of session {self.session_id} "
                    f"({self.lock_path} is locked): this one takes no part in it") from None
            yield self
        finally:
            os.close(fd)  # releases the lock

    def write(self, r: int) -> None:
        """Record the signature of round ``r``'s survivor set, durably, before it leaves."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"session_id": self.session_id, "hospital": self.hospital, "round": int(r)}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
