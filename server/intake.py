"""Uploads: the signed statement, the upload window (stage, deadline), replay and duplicate checks, the
backend's own door (:meth:`ProtectionBackend.admit`), the running sum, durable storage and the signed receipt.

Names no backend: each backend admits its own uploads. The one protocol with a stage before the upload
(secagg's rounds) gates and sums its masked inputs in server/secagg_round.py. Functions over
:class:`server.session_state.ServerSession`; they read ``config``, ``store``, ``params``, ``audit``, ``enrolled``,
``roster``, ``lock``, ``drained``, ``closing`` and ``combiner``, and set ``door`` and ``in_flight``.
"""

from __future__ import annotations

import hashlib
import time

from secure_afl.backends import get_backend
from secure_afl.exceptions import (
    DeadlinePassed,
    DuplicateContribution,
    MalformedPayload,
    NotFound,
    ReplayedContribution,
    RoundAlreadyClosed,
    SecureAFLError,
    ServerBusy,
    StageError,
    TooLarge,
)
from secure_afl.protocol import MAX_SKEW_S
from secure_afl.signing import verify_upload

from . import audit_records, running_sum, secagg_round
from .peer_auth import refuse
from .session_state import ServerSession

__all__ = ["receipt", "submit"]


def submit(session: ServerSession, hospital: str, statement: dict, payload: bytes, tag: dict | None = None, *,
           peer: dict | None = None, payload_sha256: str | None = None) -> dict:
    """Validate, store durably, add to the running sum, audit, return a signed receipt.

    ckks uploads carry the hospital's signed aggregate tag (:mod:`secure_afl.tagging`).
    ``payload_sha256``: the body's digest where the caller already computed it from these bytes (the HTTP
    layer, as the body streamed in); else it is computed here.
    """
    sha = payload_sha256 if payload_sha256 is not None else hashlib.sha256(payload).hexdigest()
    details = {"payload_sha256": sha, "bytes": len(payload)}
    opened = None
    with session.lock:
        try:  # until the statement verifies, ``hospital`` is only a claim
            if hospital not in session.enrolled:
                raise session.roster.not_in_session(f"hospital:{str(hospital)[:64]}")
            verify_upload(statement, session.enrolled[hospital].public_key(),
                          session_id=session.config.session_id, payload_sha256=bytes.fromhex(sha),
                          hospital=hospital, max_age_s=MAX_SKEW_S)
        except SecureAFLError as e:
            refuse(session, "upload", None, e, details, peer=peer)
            raise
        except (TypeError, ValueError, KeyError) as e:
            err = MalformedPayload(f"upload statement unusable: {type(e).__name__}")
            refuse(session, "upload", None, err, details, peer=peer)
            raise err from None
        try:
            _check_open(session)
            if len(payload) > session.config.max_upload_bytes:
                raise TooLarge(f"payload of {len(payload)} bytes exceeds the cap of "
                               f"{session.config.max_upload_bytes}")
            st = verify_upload(statement, session.enrolled[hospital].public_key(),
                               session_id=session.config.session_id, params_digest=session.params.digest(),
                               payload_sha256=bytes.fromhex(sha), hospital=hospital, max_age_s=MAX_SKEW_S)
            if not session.store.claim_nonce("upload:" + st["nonce"], "hospital:" + hospital):
                raise ReplayedContribution("this upload statement was already presented")
            if session.store.has_upload(hospital):
                raise DuplicateContribution(
                    f"{hospital} already contributed to this session, and uploads are final: the first one "
                    "stands and is in the sum (its receipt is in the hospital's receipts folder); a corrected "
                    "file can only go into a new session the operator signs")
            if session.secagg is not None:  # a round before the upload: masked inputs in its stage only
                secagg_round.check_upload_stage(session)
            # each backend's own door (tag or seed statement, envelope, commitment): the words it opened,
            # where it opened any, feed the running sum
            if session.door is None or session.door.params is not session.params:
                session.door = get_backend(session.params)
            opened = session.door.admit(payload, tag, hospital=hospital,
                                        identity_pub=session.enrolled[hospital].public_key(), payload_sha256=sha)
            if hospital in session.in_flight:
                raise DuplicateContribution(f"an upload of {hospital} is being added already")
        except SecureAFLError as e:
            refuse(session, "upload", hospital, e, details)
            raise
        except (TypeError, ValueError, KeyError) as e:
            err = MalformedPayload(f"upload statement unusable: {type(e).__name__}")
            refuse(session, "upload", hospital, err, details)
            raise err from None
        session.in_flight.add(hospital)
    try:
        # outside the lock: the summing workers check and add up to W uploads at once
        try:
            # the words the upload check opened, where the sum runs in this process
            _combine_upload(session, hospital, opened if opened is not None and session.combiner.sums_here
                            else payload)
        except SecureAFLError as e:
            with session.lock:
                refuse(session, "upload", hospital, e, details)
                if isinstance(e, ServerBusy):  # the server's failure, not the upload's: it may come again
                    session.store.release_nonce("upload:" + st["nonce"], "hospital:" + hospital)
                if getattr(session.combiner, "lost", None):
                    _rebuild_when_drained(session, hospital)
            raise
        except (TypeError, ValueError, KeyError) as e:
            err = MalformedPayload(f"unusable contribution: {type(e).__name__}")
            with session.lock:
                refuse(session, "upload", hospital, err, details)
            raise err from None
        with session.lock:
            try:
                session.store.put_blob(payload, sha)
                session.store.insert_upload(hospital, sha, st, tag)
            except Exception:
                # not stored, so not accepted: the running sum holds it, so it is summed again from disk
                _rebuild_when_drained(session, hospital)
                raise
            return audit_records.finish_acceptance(session, hospital, sha)
    finally:
        with session.lock:
            session.in_flight.discard(hospital)
            session.drained.notify_all()


def _rebuild_when_drained(session: ServerSession, hospital: str) -> None:
    """Sum the stored uploads again once no other upload is being added (they would be added to the
    running sum being replaced). Called with the lock held, by the upload ``hospital`` in flight."""
    session.in_flight.discard(hospital)
    session.drained.wait_for(lambda: not session.in_flight)
    running_sum.rebuild(session)


def _check_open(session: ServerSession) -> None:
    if session.params is None:
        raise StageError("the session is not open yet (waiting for the key holder's public context)")
    if session.status == "released":
        raise RoundAlreadyClosed("the session's aggregate was released; it accepts nothing more")
    if session.closing:
        raise RoundAlreadyClosed("the session is being closed; it accepts nothing more")
    dl = session.deadline
    if dl is not None and time.time() > dl:
        raise DeadlinePassed("the session's upload deadline has passed")


def _combine_upload(session: ServerSession, hospital: str, payload: bytes) -> None:
    """Validate the body and add it to the running sum; a refused payload changes nothing. Called without
    the lock (the combiner is thread-safe)."""
    if session.secagg is not None:
        secagg_round.combine_upload(session, hospital, payload)
    else:
        session.combiner.add(payload)


def receipt(session: ServerSession, hospital: str) -> dict:
    for row in session.store.uploads():
        if row["hospital"] == hospital and row["receipt"]:
            return row["receipt"]
    raise NotFound(f"no accepted upload from {hospital}")
