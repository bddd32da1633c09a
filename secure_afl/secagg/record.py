"""A hospital's durable record of the secagg sessions in which it signed a survivor set.

Two unmasked sums of one session over different survivor sets differ by the
hospitals left out of one of them. A server can obtain a second sum by
re-running a round (any round number, the same one included) after a
hospital restarted and lost its in-memory state. So once a hospital has
signed a survivor set of a session it takes no further part in that session:
no setup, no second signature, whatever round the server announces, until
the operator signs a new session. A retry before any signature (the round
aborted at setup or at the masked inputs) stays allowed.

One store serves both transports (``client submit`` and the Flower
ClientApp): a file per (session, hospital) in a directory given as an
absolute path, so that a process started from another working directory, or
after a restart, finds the same record. The file is written and synced
before the signature leaves the hospital. It holds no secret.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..exceptions import InvalidContribution, InvalidParameterError

__all__ = ["SurvivorRecord"]


class SurvivorRecord:
    """Per (session, hospital): whether, and in which round, this hospital signed a survivor set.

    Parameters
    ----------
    directory : path
        Absolute path of the hospital's record directory (created 0700).
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
        self.session_id, self.hospital = session_id, hospital

    def signed_round(self) -> int | None:
        """The round whose survivor set this hospital signed in this session, or None."""
        try:
            return int(json.loads(self.path.read_text())["round"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            # an unreadable record still says a signature may have left: never sign again
            return -1

    def refuse_if_signed(self, announced_round) -> None:
        """Refuse any part in this session once a survivor set of it was signed (:class:`InvalidContribution`)."""
        r = self.signed_round()
        if r is not None:
            raise InvalidContribution(
                f"{self.hospital} signed a survivor set of session {self.session_id} (round {r}; {self.path}) and "
                f"takes no further part in it (round {announced_round} announced): two unmasked sums over "
                "different survivor sets could be differenced; contribute to a new session instead")

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
