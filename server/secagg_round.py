"""The SecAgg rounds of a ``secagg`` session: functions over :class:`server.session_state.ServerSession` and its
:class:`~server.session_state.SecAggState` (no HTTP: the routes are in server/routes/secagg_rounds.py).

Runs on: the aggregation server. Sees: public keys, AEAD-encrypted shares it
relays, masked vectors, their mod-2^64 sum and, after the unmask round, the
self-mask seeds of survivors and mask keys of dropped hospitals: exactly what
removes the masks from the survivors' sum and nothing that reveals one
hospital's vector (secure_afl.secagg, threat_model/THREAT_MODEL.md).

Stages (Bonawitz et al. 2017; names from :class:`~secure_afl.secagg.Stage`)::

    [Stage 0] setup          GET  .../secagg/request   -> POST .../secagg/setup
    [Stage 1] advertise_keys GET  .../secagg/request   -> POST .../secagg/advertise_keys
    [Stage 2] share_keys     GET  .../secagg/request   -> POST .../secagg/share_keys
    [Stage 3] masked_input   GET  .../secagg/request   -> POST .../uploads  (signed upload, receipt)
    [Stage 4] unmask         GET  .../secagg/request   -> POST .../secagg/consistency (survivor set, signed)
                             GET  .../secagg/request   -> POST .../secagg/unmask (the request carries the
                                                          survivors' signed statements)

A stage closes when every active hospital answered or ``stage_timeout_s``
passed; who did not answer is dropped.

Rounds. A session's secagg round has a number r = 1, 2, ... bound into every
message, signature, key derivation and share AEAD, and every poll answer says
it. A round that aborts before any unmask request went out revealed nothing;
the first hospital that asks after such an abort opens round r + 1 under the
same session id (up to ``max_rounds``), and every hospital joins it with
fresh keys and a fresh self-mask seed. The aborted round's masked inputs stay
on record but no longer count; a message of round r sent in round r + 1 is
refused (``stale_round``), audited and not stored. A round that aborts after
unmask requests went out is never retried (THREAT_MODEL.md, 6.2).

Every accepted message is stored in SQLite before it is acknowledged, so a
restarted server replays them and reaches the same state; stage closings are
recorded too. Every check a hospital makes lives in
:class:`~secure_afl.secagg.SecAggClient`; this module only relays and reads
the round's public state.
"""

from __future__ import annotations

import base64
import logging
import threading
import time

from secure_afl.secagg import (
    ConsistencyStatement,
    DealerComplaint,
    MaskedInput,
    SecAggServerRound,
    Stage,
    decode_message,
)
from secure_afl.exceptions import (
    DuplicateContribution,
    Forbidden,
    InsufficientShares,
    MalformedPayload,
    SecureAFLError,
    StageError,
)
from secure_afl.protocol import SECAGG_COMPLAINT, SECAGG_CONSISTENCY, SECAGG_REQUEST_PREFIX

from .peer_auth import refuse
from .session_state import SecAggState, ServerSession

__all__ = ["check_upload_stage", "combine_upload", "final_aggregate", "open_round", "replay_round", "round_info",
           "round_number", "round_stage", "secagg_complaint", "secagg_consistency", "secagg_message",
           "secagg_request", "secagg_request_in_round", "secagg_state", "start_clock", "stop_clock", "tick",
           "unmask_material"]

log = logging.getLogger("secure_afl.server")

CONSISTENCY = SECAGG_CONSISTENCY
COMPLAINT = SECAGG_COMPLAINT
_MESSAGE_STAGES = (Stage.SETUP, Stage.ADVERTISE_KEYS, Stage.SHARE_KEYS, Stage.UNMASK)


# -- identities -------------------------------------------------------------------
def secagg_state(enrolled: dict) -> SecAggState:
    """The rounds' state before any round: client ids 1..n in sorted-name order (also the Shamir x), computed
    once, since every poll and every audit record looks ids and names up and K polls per second at K = 1000
    must not each sort K names; and the poll interval.

    The poll interval is the longest pause between a waiting hospital's polls: K hospitals together poll at
    most ~25 times a second. A waiting hospital closes its connection, so each poll costs a new mutual-TLS
    handshake, a signed-request check and a durable nonce: about 6 ms of server CPU here (and 5 ms at the
    hospital), so 200 polls a second (the earlier spread) took more than the two cores of the benchmark
    machine at K = 1000. The price is latency: a hospital learns of a new stage up to ``poll_s`` late (30 s at
    K >= 750, 4 s at K = 100, 1 s below K = 25)."""
    names = tuple(sorted(enrolled))
    return SecAggState(names=names, client_ids={name: i + 1 for i, name in enumerate(names)},
                       poll_s=min(30.0, max(1.0, len(enrolled) / 25)))


def client_name(session: ServerSession, cid: int) -> str:
    return session.secagg.names[cid - 1]


# -- state & recovery -----------------------------------------------------------------
def round_number(session: ServerSession) -> int:
    return int(session.store.get_meta("secagg_round", 1))


def _mkey(session: ServerSession, stage: str) -> str:
    """Where ``stage``'s messages of the current round are stored (round 1: the stage name itself)."""
    r = round_number(session)
    return stage if r == 1 else f"{stage}@{r}"


def _new_round(session: ServerSession, r: int) -> SecAggServerRound:
    """Round ``r`` over every enrolled hospital but the dealers proved to have cheated in this session."""
    ids = session.secagg.client_ids
    excluded = set(session.store.get_meta("secagg_excluded", []))
    return SecAggServerRound(session.params, participants=[ids[n] for n in ids if n not in excluded], round=r,
                             identity_keys={ids[n]: e.public_key() for n, e in session.enrolled.items()})


def replay_round(session: ServerSession) -> None:
    """The current round, replayed from the stored messages and stage closings (after the running sum's
    rebuild: the masked inputs are the stored uploads)."""
    rnd = session.secagg.round = _new_round(session, round_number(session))
    closed = session.store.get_meta("secagg_closed", [])
    for stage in Stage.all():
        if rnd.stage != stage:
            break
        if stage == Stage.MASKED_INPUT:
            for data in session.store.messages(_mkey(session, COMPLAINT)).values():
                rnd.receive(decode_message(data))
            for row in session.store.uploads():
                rnd.receive(MaskedInput.from_bytes(session.store.get_blob(row["payload_sha256"])))
        else:
            if stage == Stage.UNMASK:
                for data in session.store.messages(_mkey(session, CONSISTENCY)).values():
                    rnd.receive(decode_message(data))
            for data in session.store.messages(_mkey(session, stage)).values():
                rnd.receive(decode_message(data))
        if stage in closed:
            try:
                rnd.close_stage()
            except InsufficientShares:
                break


def combine_upload(session: ServerSession, hospital: str, payload: bytes) -> None:
    """A masked input goes to the round, which owns the running sum."""
    m = MaskedInput.from_bytes(payload)
    if m.client_id != session.secagg.client_ids[hospital]:
        raise Forbidden(f"{hospital} sent a masked input for client {m.client_id}")
    with session.lock:  # the round's state is read by every poll
        session.secagg.round.receive(m)


def check_upload_stage(session: ServerSession) -> None:
    if session.secagg.round.stage != Stage.MASKED_INPUT:
        raise StageError(f"masked inputs are accepted in the masked_input stage; the round is in "
                         f"{session.secagg.round.stage}")


def round_stage(session: ServerSession) -> str:
    if session.store.get_meta("secagg_aborted"):
        return "aborted"
    return session.secagg.round.stage if session.secagg.round else Stage.SETUP


def round_info(session: ServerSession) -> dict:
    """The round as the session info shows it to every party."""
    rnd = session.secagg.round
    return {"stage": round_stage(session), "round": round_number(session),
            "max_rounds": session.config.secagg_max_rounds, "client_ids": session.secagg.client_ids,
            "active": sorted(client_name(session, c) for c in rnd.active) if rnd else []}


# -- stage clock ----------------------------------------------------------------------------
def start_clock(session: ServerSession) -> None:
    """The stage clock: a thread that closes a stage when everyone answered or its time is up."""
    session.secagg.ticker = threading.Thread(target=_tick_loop, args=(session,), name="secagg-stage-clock",
                                             daemon=True)
    session.secagg.ticker.start()


def stop_clock(session: ServerSession) -> None:
    session.secagg.stop.set()


def _tick_loop(session: ServerSession) -> None:
    while not session.secagg.stop.wait(0.2):
        try:
            tick(session)
        except Exception:  # the clock must never die; the error is in the audit log
            log.exception("secagg stage clock")


def tick(session: ServerSession, *, now: float | None = None) -> None:
    """Close the current stage if everyone answered or its time is up."""
    with session.lock:
        r = session.secagg.round
        if r is None or round_stage(session) in ("done", "aborted"):
            return
        if session.in_flight:
            return  # a masked input is between the round and the store: the stage closes once it is stored
        now = time.time() if now is None else now
        opened = session.store.get_meta("secagg_stage_opened")
        if opened is None:
            return  # the round opens with its first hospital, not with the server process
        opened = float(opened)
        everyone = not r.waiting_for
        if not everyone and now - opened < session.config.stage_timeout_s:
            return
        stage = r.stage
        missing = sorted(client_name(session, c) for c in r.waiting_for)
        answered, expected = len(r.responded), len(r.active)
        unmasking = r.unmask_open  # unmask requests may have gone out: shares may have been revealed
        try:
            r.close_stage()
        except InsufficientShares as e:
            session.store.set_meta("secagg_aborted", {"message": str(e), "stage": stage, "round": r.round,
                                                      "after_unmask": unmasking, "answered": answered,
                                                      "expected": expected, "dropped": missing})
            dealer = getattr(e, "dealer", None)  # an inconsistent dealer, named
            session.audit.append("secagg_stage_closed", actor=session.config.name, outcome="refused",
                                 session=session.config.session_id, reason=e.reason,
                                 details={"round": r.round, "stage": stage, "answered": answered,
                                          "expected": expected, "dropped": missing, "message": str(e)[:300],
                                          "retry": _may_retry(session),
                                          **({"dealer": client_name(session, dealer)} if dealer else {})})
            log.warning("[Stage %s] round %d aborted (%d of %d answered): %s", stage, r.round, answered,
                        expected, e)
            return
        session.store.set_meta("secagg_closed", session.store.get_meta("secagg_closed", []) + [stage])
        session.store.set_meta("secagg_stage_opened", now)
        session.audit.append("secagg_stage_closed", actor=session.config.name, outcome="accepted",
                             session=session.config.session_id,
                             details={"round": r.round, "stage": stage, "answered": answered,
                                      "expected": expected, "dropped": missing, "next": r.stage,
                                      "active": len(r.active)})


# -- rounds -----------------------------------------------------------------------------------
def _may_retry(session: ServerSession) -> bool:
    """An aborted round is retried while rounds remain and no unmask request of it went out."""
    aborted = session.store.get_meta("secagg_aborted")
    if not aborted:
        return False
    if round_number(session) >= session.config.secagg_max_rounds:
        return False
    # Once unmask requests went out, the server may hold shares of this round's secrets; a retry could
    # then let it difference two sums over different survivor sets (THREAT_MODEL.md, 6.2).
    return not (isinstance(aborted, dict) and aborted.get("after_unmask"))


def _open_next_round(session: ServerSession, hospital: str) -> None:
    """Round r aborted: open r + 1 under the same session, parameters and enrolments."""
    old = session.secagg.round
    r = old.round + 1
    aborted = session.store.get_meta("secagg_aborted")
    now = time.time()
    retired = session.store.retire_uploads(f"{Stage.MASKED_INPUT}@retired{old.round}", {
        "secagg_round": r, "secagg_closed": [], "secagg_aborted": None, "secagg_stage_opened": now,
        "secagg_previous_abort": aborted})
    session.secagg.round = _new_round(session, r)
    session.audit.append("secagg_round_opened", actor=hospital, outcome="accepted", session=session.config.session_id,
                         details={"round": r, "stage": session.secagg.round.stage,
                                  "max_rounds": session.config.secagg_max_rounds,
                                  "hospitals": len(session.secagg.round.participants), "previous_abort": aborted,
                                  "excluded": sorted(session.store.get_meta("secagg_excluded", [])),
                                  "retired_masked_inputs": retired})
    log.warning("secagg round %d opened by %s after round %d aborted (%d masked inputs set aside)", r,
                hospital, old.round, retired)


# -- hospital endpoints -------------------------------------------------------------------------
def open_round(session: ServerSession, actor: str) -> None:
    """Start the current round's stage clock, once, with an audit record naming who started it: the first
    hospital whose signed poll arrives, or the operator's own driver (the Flower ServerApp, which asks on
    the hospitals' behalf, so no hospital is named for it)."""
    with session.lock:
        if round_stage(session) in ("done", "aborted") or session.store.get_meta("secagg_stage_opened") is not None:
            return
        session.store.set_meta("secagg_stage_opened", time.time())
        session.audit.append("secagg_round_opened", actor=actor, outcome="accepted",
                             session=session.config.session_id,
                             details={"round": round_number(session), "stage": round_stage(session)})


def secagg_request(session: ServerSession, hospital: str) -> dict:
    """What ``hospital`` should do now: a small status, or (once per stage) its signed stage request."""
    return {**_secagg_request(session, hospital), "poll_s": session.secagg.poll_s}


def secagg_request_in_round(session: ServerSession, hospital: str) -> dict | None:
    """:func:`secagg_request`, or None once the round has aborted, checked and asked under one lock.

    For a driver that runs exactly one round (the Flower ServerApp): the
    stage clock runs in another thread and could abort the round between a
    separate check and the request, and a request after an abort may open
    the next round.
    """
    with session.lock:
        if round_stage(session) == "aborted":
            return None
        return secagg_request(session, hospital)


def _secagg_request(session: ServerSession, hospital: str) -> dict:
    with session.lock:
        if round_stage(session) == "aborted" and _may_retry(session):
            _open_next_round(session, hospital)
        stage, r = round_stage(session), round_number(session)
        if stage == "aborted":  # why, so a hospital's one line says more than "aborted"
            return {"stage": stage, "round": r, "abort": _abort_summary(session, "secagg_aborted")}
        if stage == "done":
            return {"stage": stage, "round": r}
        cid = session.secagg.client_ids[hospital]
        # the stage clock starts when the first hospital asks, so an early server never times out
        open_round(session, hospital)
        if cid not in session.secagg.round.active:
            # a hospital that never acknowledged setup was never in the round: it is told so, not "dropped"
            return {"stage": stage, "round": r, "dropped": True,
                    "left_at": session.secagg.round.left_at.get(cid, Stage.SETUP)}
        if session.secagg.round.has_responded(cid):
            # whom it waits for and until when: the roster is every member's to know, and a hospital
            # otherwise sits silent up to stage_timeout_s
            opened = float(session.store.get_meta("secagg_stage_opened", time.time()))
            return {"stage": stage, "round": r, "waiting": True,
                    "waiting_for": sorted(client_name(session, c) for c in session.secagg.round.waiting_for),
                    "closes_in_s": max(0.0, opened + session.config.stage_timeout_s - time.time()),
                    **({"previous_abort": _abort_summary(session, "secagg_previous_abort")} if r > 1 else {})}
        if stage == Stage.UNMASK:
            gate = _consistency_gate(session, cid)
            if gate is not None:
                return {**gate, "round": r}
        if r > 1 and stage == Stage.SETUP:
            prev = {"previous_abort": _abort_summary(session, "secagg_previous_abort")}
        else:
            prev = {}
        raw = session.secagg.round.request(cid).to_bytes()
        # signed, so a hospital holds evidence of what it was asked (e.g. two different
        # survivor lists would be provable equivocation); the stage closings are in the audit log
        return {"stage": stage, "round": r, "request": base64.b64encode(raw).decode(),
                "signature": session.key.sign(SECAGG_REQUEST_PREFIX + raw).hex(), **prev}


def _abort_summary(session: ServerSession, key: str) -> dict | None:
    """The stored abort (stage, round, counts, who was dropped, why) as a hospital is told it."""
    a = session.store.get_meta(key)
    if not isinstance(a, dict):
        return None
    return {k: a.get(k) for k in ("round", "stage", "answered", "expected", "dropped", "message")}


# -- consistency check (opens the unmask stage) ---------------------------------------------------
def _consistency_gate(session: ServerSession, cid: int) -> dict | None:
    """None once this hospital may receive its unmask request."""
    r = session.secagg.round
    if not r.has_signed(cid):
        return {"stage": CONSISTENCY, "survivors": list(r.survivors_), "quorum": r.quorum}
    opened = float(session.store.get_meta("secagg_stage_opened", time.time()))
    everyone = r.signed_count == len(r.survivors_)
    late = time.time() - opened >= session.config.stage_timeout_s / 2
    if r.unmask_open and (everyone or late):
        return None
    return {"stage": Stage.UNMASK, "waiting": True}


def _own_message(session: ServerSession, hospital: str, body: bytes, stage: str, kind: type, not_now: str,
                 only: str):
    """The ``kind`` message in ``body``, taken only while the round is in ``stage`` and only as ``hospital``'s
    own (its client id): :class:`StageError` (the round's stage, then ``not_now``) or :class:`Forbidden`
    (``hospital`` may only ``only``) otherwise."""
    if round_stage(session) != stage:
        raise StageError(f"the round is in {round_stage(session)}{not_now}")
    msg = decode_message(body)
    if not isinstance(msg, kind) or msg.client_id != session.secagg.client_ids[hospital]:
        raise Forbidden(f"{hospital} may only {only}")
    return msg


def secagg_consistency(session: ServerSession, hospital: str, body: bytes) -> dict:
    """A survivor's signed statement of the survivor set (Bonawitz et al.'s consistency check)."""
    with session.lock:
        try:
            msg = _own_message(session, hospital, body, Stage.UNMASK, ConsistencyStatement,
                               ", not in its consistency check", "sign its own consistency statement")
            session.secagg.round.receive(msg)
        except SecureAFLError as e:
            refuse(session, "secagg_consistency", hospital, e)
            raise
        session.store.put_message(_mkey(session, CONSISTENCY), hospital, body)
        session.audit.append("secagg_consistency", actor=hospital, outcome="accepted",
                             session=session.config.session_id,
                             details={"round": session.secagg.round.round,
                                      "survivors": len(session.secagg.round.survivors_),
                                      "signed": session.secagg.round.signed_count})
        return {"accepted": True, "stage": CONSISTENCY}


def secagg_complaint(session: ServerSession, hospital: str, body: bytes) -> dict:
    """A holder's proof that the dealer of its shares cheated: the dealer is named, the round will abort."""
    with session.lock:
        try:
            msg = _own_message(session, hospital, body, Stage.MASKED_INPUT, DealerComplaint,
                               f"; complaints belong to {Stage.MASKED_INPUT}", "send its own complaint")
            if session.store.has_message(_mkey(session, COMPLAINT), hospital):
                raise DuplicateContribution(f"{hospital} already sent a complaint")
            session.secagg.round.receive(msg)  # refuses, changing nothing, a complaint that proves nothing
        except SecureAFLError as e:
            refuse(session, "secagg_complaint", hospital, e)
            raise
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError) as e:
            err = MalformedPayload(f"unusable complaint: {type(e).__name__}")
            refuse(session, "secagg_complaint", hospital, err)
            raise err from None
        dealer = client_name(session, msg.deal.dealer)
        session.store.put_message(_mkey(session, COMPLAINT), hospital, body)
        excluded = session.store.get_meta("secagg_excluded", [])
        if dealer not in excluded:
            session.store.set_meta("secagg_excluded", sorted(excluded + [dealer]))
        # the evidence travels whole: with the dealer's enrolled key anyone can re-check it
        # (DealerComplaint.proves), without trusting this server or the holder
        session.audit.append("secagg_inconsistent_dealer", actor=hospital, outcome="refused",
                             session=session.config.session_id, reason="inconsistent_dealer",
                             details={"round": session.secagg.round.round, "dealer": dealer, "holder": hospital,
                                      "evidence": base64.b64encode(body).decode()})
        log.warning("[Stage 3] %s proved that %s dealt inconsistent shares; round %d will abort and %s takes "
                    "part in no later round", hospital, dealer, session.secagg.round.round, dealer)
        return {"accepted": True, "stage": COMPLAINT}


def secagg_message(session: ServerSession, hospital: str, stage: str, body: bytes) -> dict:
    """One hospital's answer for ``stage``."""
    with session.lock:
        try:
            if stage not in _MESSAGE_STAGES:
                raise StageError(f"{stage!r} is not a message stage (masked inputs go to /uploads)")
            if round_stage(session) != stage:
                raise StageError(f"the round is in {round_stage(session)}, not {stage}")
            msg = decode_message(body)
            if getattr(msg, "client_id", None) != session.secagg.client_ids[hospital]:
                raise Forbidden(f"{hospital} may only speak for client {session.secagg.client_ids[hospital]}")
            if session.store.has_message(_mkey(session, stage), hospital):
                raise DuplicateContribution(f"{hospital} already answered {stage}")
            bad_before = len(session.secagg.round.bad_shares)
            session.secagg.round.receive(msg)
        except SecureAFLError as e:
            refuse(session, f"secagg_{stage}"[:64], hospital, e)
            raise
        except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as e:
            err = MalformedPayload(f"unusable {stage} message: {type(e).__name__}")
            refuse(session, f"secagg_{stage}"[:64], hospital, err)
            raise err from None
        session.store.put_message(_mkey(session, stage), hospital, body)
        session.audit.append(f"secagg_{stage}", actor=hospital, outcome="accepted", session=session.config.session_id,
                             details={"round": session.secagg.round.round, "bytes": len(body)})
        for bad in session.secagg.round.bad_shares[bad_before:]:
            # the holder's other shares are kept; the round goes on while t correct shares remain
            session.audit.append("secagg_bad_share", actor=hospital, outcome="refused",
                                 session=session.config.session_id, reason="bad_share",
                                 details={"holder": hospital, "owner": client_name(session, bad.owner),
                                          "kind": bad.kind})
            log.warning("[Stage 4] %s revealed a share of %s that does not match its commitment; discarded",
                        hospital, client_name(session, bad.owner))
        return {"accepted": True, "stage": stage}


# -- release --------------------------------------------------------------------------------------
def final_aggregate(session: ServerSession) -> bytes:
    if round_stage(session) != "done":
        raise StageError(f"the secagg round is {round_stage(session)}; the masked sum can be released only "
                         "after the unmask round completed")
    return session.secagg.round.aggregate


def unmask_material(session: ServerSession) -> dict:
    if session.status != "released":
        raise StageError("the aggregate has not been released")
    return session.secagg.round.unmask_material().to_dict()
