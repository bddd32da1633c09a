"""The release: close the round at the quorum, fix the aggregate, sign the manifest and the close record, keep
the key holder's countersignature, and serve what was released.

Functions over :class:`server.session_state.ServerSession`; they read ``config``, ``store``, ``params``,
``audit``, ``release_policy``, ``enrolled``, ``roster``, ``key``, ``lock``, ``in_flight``, ``drained`` and
``combiner``, and set ``closing`` while the uploads in flight drain.
"""

from __future__ import annotations

import hashlib
import logging

from secure_afl import pki
from secure_afl.audit_log import verify_countersign
from secure_afl.encoding import parse_json
from secure_afl.exceptions import Forbidden, InsufficientContributors, NotFound, SecureAFLError, StageError
from secure_afl.signing import build_manifest

from . import audit_records, running_sum, secagg_round
from .peer_auth import flush_refusals, refuse
from .session_state import ServerSession

__all__ = ["close", "contribution", "masked_aggregate", "released", "store_countersign", "tags"]

log = logging.getLogger("secure_afl.server")


def close(session: ServerSession, party: str) -> dict:
    """Fix the aggregate and sign the manifest, if at least the release quorum contributed."""
    with session.lock:
        if session.status == "released":
            audit_records.finish_release(session, party)
            return session.store.get_meta("manifest")
        flush_refusals(session)  # the summaries belong before the head the manifest pins
        try:
            if session.params is None:
                raise StageError("nothing to close: the session never opened")
            # uploads already past their checks are accepted or refused before the sum is fixed; none start
            # while the lock is released for that wait (after it, the lock itself keeps them out)
            session.closing = True
            try:
                session.drained.wait_for(lambda: not session.in_flight)
            finally:
                session.closing = False
            if getattr(session.combiner, "lost", None):
                running_sum.rebuild(session)
            n = session.store.upload_count()
            q = session.release_policy.quorum
            if n < q:
                raise InsufficientContributors(
                    f"{n} contributions, fewer than the release quorum q = {q} of the signed session "
                    f"(min_clients = {session.config.min_clients}, colluders = {session.release_policy.colluders}); "
                    "nothing is released")
            aggregate = _final_aggregate(session)
            agg_sha = hashlib.sha256(aggregate).hexdigest()
            participants = []
            for row in session.store.uploads():
                participants.append({**row["statement"],
                                     "identity_pub": session.enrolled[row["hospital"]].identity_pub})
            manifest = build_manifest(session.key, session.config.session_id, session.params.digest(), participants,
                                      bytes.fromhex(agg_sha), q,
                                      enrolled=pki.enrolled_keys(session.enrolled),
                                      audit={"seq": session.audit.next_seq - 1, "head": session.audit.head})
        except SecureAFLError as e:
            refuse(session, "close", party, e)
            raise
        session.store.put_blob(aggregate)
        session.store.set_meta("aggregate_sha256", agg_sha)
        session.store.set_meta("manifest", manifest)
        audit_records.finish_release(session, party)
        log.info("[Stage release] aggregate of %d contributions released", len(participants))
        return manifest


def store_countersign(session: ServerSession, party: str, body: bytes) -> dict:
    """The key holder's countersignature over the close record (sent at finalize)."""
    with session.lock:
        try:
            cs = parse_json(body, "countersignature")
            close = audit_records.audit_head(session)["close"]
            verify_countersign(cs, session.roster.lookup_pub(party), close)
            if cs.get("keyholder") != party.partition(":")[2]:
                raise Forbidden("a key holder countersigns only in its own name")
        except SecureAFLError as e:
            refuse(session, "audit_countersign", party, e)
            raise
        if session.store.get_meta("audit_countersign") is None:
            session.store.set_meta("audit_countersign", cs)
            session.audit.append("audit_countersigned", actor=party, outcome="accepted",
                                 session=session.config.session_id,
                                 details={"seq": close["seq"], "head": close["head"]})
            audit_records.write_head_file(session)
        return audit_records.audit_head(session)


def _final_aggregate(session: ServerSession) -> bytes:
    if session.secagg is not None:  # the round owns the sum: released only once the unmask round completed
        return secagg_round.final_aggregate(session)
    return session.combiner.aggregate()


def released(session: ServerSession) -> tuple[bytes, dict]:
    if session.status != "released":
        raise StageError("the aggregate has not been released")
    return session.store.get_blob(session.store.get_meta("aggregate_sha256")), session.store.get_meta("manifest")


def masked_aggregate(session: ServerSession) -> bytes:
    """The released aggregate payload, for the key holder (plain, secagg)."""
    if session.split is not None:
        raise Forbidden("a split session serves no masked sum: whoever holds the seeds could read a forged one")
    return released(session)[0]


def contribution(session: ServerSession, hospital: str) -> bytes:
    """One accepted upload's payload bytes, for the key holder to verify and re-sum itself."""
    if session.split is not None:
        raise Forbidden("a split session serves no masked vector: whoever holds the seeds could read it")
    released(session)
    for row in session.store.uploads():
        if row["hospital"] == hospital:
            return session.store.get_blob(row["payload_sha256"])
    raise NotFound(f"no accepted upload from {hospital[:64]!r}")


def tags(session: ServerSession) -> dict:
    """The participants' signed tag statements, for the key holder's aggregate check."""
    released(session)
    return {row["hospital"]: row["tag"] for row in session.store.uploads() if row["tag"] is not None}
