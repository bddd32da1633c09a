"""The aggregation server for ``secagg`` sessions: the SecAgg rounds (no HTTP: the routes are in app.py).

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
import functools
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

from .aggregator import AggregationServer, log

__all__ = ["SecAggAggregationServer"]

CONSISTENCY = SECAGG_CONSISTENCY
COMPLAINT = SECAGG_COMPLAINT
_MESSAGE_STAGES = (Stage.SETUP, Stage.ADVERTISE_KEYS, Stage.SHARE_KEYS, Stage.UNMASK)


class SecAggAggregationServer(AggregationServer):
    """:class:`AggregationServer` plus the SecAgg key-exchange and unmask rounds."""

    def __init__(self, config):
        self._round: SecAggServerRound | None = None
        self._stop = threading.Event()
        super().__init__(config)
        self._ticker = threading.Thread(target=self._tick_loop, name="secagg-stage-clock", daemon=True)
        self._ticker.start()

    # -- identities -------------------------------------------------------------------
    # computed once: every poll and every audit record looks ids and names up, and K polls per second at
    # K = 1000 must not each sort K names
    @functools.cached_property
    def _names(self) -> tuple[str, ...]:
        return tuple(sorted(self._enrolled))

    @functools.cached_property
    def client_ids(self) -> dict[str, int]:
        """Hospital name -> SecAgg client id (1..n in sorted-name order; also the Shamir x)."""
        return {name: i + 1 for i, name in enumerate(self._names)}

    def _name(self, cid: int) -> str:
        return self._names[cid - 1]

    # -- state & recovery -----------------------------------------------------------------
    def _new_combiner(self):
        return None  # the round owns the running sum

    @property
    def round_number(self) -> int:
        return int(self.store.get_meta("secagg_round", 1))

    def _mkey(self, stage: str) -> str:
        """Where ``stage``'s messages of the current round are stored (round 1: the stage name itself)."""
        r = self.round_number
        return stage if r == 1 else f"{stage}@{r}"

    def _new_round(self, r: int) -> SecAggServerRound:
        """Round ``r`` over every enrolled hospital but the dealers proved to have cheated in this session."""
        ids = self.client_ids
        excluded = set(self.store.get_meta("secagg_excluded", []))
        return SecAggServerRound(self.params, participants=[ids[n] for n in ids if n not in excluded], round=r,
                                 identity_keys={ids[n]: e.public_key() for n, e in self._enrolled.items()})

    def _rebuild(self) -> None:
        super()._rebuild()
        self._round = self._new_round(self.round_number)
        closed = self.store.get_meta("secagg_closed", [])
        for stage in Stage.all():
            if self._round.stage != stage:
                break
            if stage == Stage.MASKED_INPUT:
                for data in self.store.messages(self._mkey(COMPLAINT)).values():
                    self._round.receive(decode_message(data))
                for row in self.store.uploads():
                    self._round.receive(MaskedInput.from_bytes(self.store.get_blob(row["payload_sha256"])))
            else:
                if stage == Stage.UNMASK:
                    for data in self.store.messages(self._mkey(CONSISTENCY)).values():
                        self._round.receive(decode_message(data))
                for data in self.store.messages(self._mkey(stage)).values():
                    self._round.receive(decode_message(data))
            if stage in closed:
                try:
                    self._round.close_stage()
                except InsufficientShares:
                    break

    def _combine_upload(self, hospital: str, payload: bytes) -> None:
        m = MaskedInput.from_bytes(payload)
        if m.client_id != self.client_ids[hospital]:
            raise Forbidden(f"{hospital} sent a masked input for client {m.client_id}")
        with self._lock:  # the round's state is read by every poll
            self._round.receive(m)

    def _check_stage_allows_upload(self, hospital: str) -> None:
        if self._round.stage != Stage.MASKED_INPUT:
            raise StageError(f"masked inputs are accepted in the masked_input stage; the round is in "
                             f"{self._round.stage}")

    @property
    def round_stage(self) -> str:
        if self.store.get_meta("secagg_aborted"):
            return "aborted"
        return self._round.stage if self._round else Stage.SETUP

    def info(self) -> dict:
        d = super().info()
        d["secagg"] = {"stage": self.round_stage, "round": self.round_number,
                       "max_rounds": self.config.secagg_max_rounds, "client_ids": self.client_ids,
                       "active": sorted(self._name(c) for c in self._round.active) if self._round else []}
        return d

    # -- stage clock ----------------------------------------------------------------------------
    def _tick_loop(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.tick()
            except Exception:  # the clock must never die; the error is in the audit log
                log.exception("secagg stage clock")

    def tick(self, *, now: float | None = None) -> None:
        """Close the current stage if everyone answered or its time is up."""
        with self._lock:
            r = self._round
            if r is None or self.round_stage in ("done", "aborted"):
                return
            if self._in_flight:
                return  # a masked input is between the round and the store: the stage closes once it is stored
            now = time.time() if now is None else now
            opened = self.store.get_meta("secagg_stage_opened")
            if opened is None:
                return  # the round opens with its first hospital, not with the server process
            opened = float(opened)
            everyone = not r.waiting_for
            if not everyone and now - opened < self.config.stage_timeout_s:
                return
            stage = r.stage
            missing = sorted(self._name(c) for c in r.waiting_for)
            answered, expected = len(r.responded), len(r.active)
            unmasking = r.unmask_open  # unmask requests may have gone out: shares may have been revealed
            try:
                r.close_stage()
            except InsufficientShares as e:
                self.store.set_meta("secagg_aborted", {"message": str(e), "stage": stage, "round": r.round,
                                                       "after_unmask": unmasking, "answered": answered,
                                                       "expected": expected, "dropped": missing})
                dealer = getattr(e, "dealer", None)  # an inconsistent dealer, named
                self.audit.append("secagg_stage_closed", actor=self.config.name, outcome="refused",
                                  session=self.config.session_id, reason=e.reason,
                                  details={"round": r.round, "stage": stage, "answered": answered,
                                           "expected": expected, "dropped": missing, "message": str(e)[:300],
                                           "retry": self._may_retry(),
                                           **({"dealer": self._name(dealer)} if dealer else {})})
                log.warning("[Stage %s] round %d aborted (%d of %d answered): %s", stage, r.round, answered,
                            expected, e)
                return
            self.store.set_meta("secagg_closed", self.store.get_meta("secagg_closed", []) + [stage])
            self.store.set_meta("secagg_stage_opened", now)
            self.audit.append("secagg_stage_closed", actor=self.config.name, outcome="accepted",
                              session=self.config.session_id,
                              details={"round": r.round, "stage": stage, "answered": answered,
                                       "expected": expected, "dropped": missing, "next": r.stage,
                                       "active": len(r.active)})

    # -- rounds -----------------------------------------------------------------------------------
    def _may_retry(self) -> bool:
        """An aborted round is retried while rounds remain and no unmask request of it went out."""
        aborted = self.store.get_meta("secagg_aborted")
        if not aborted:
            return False
        if self.round_number >= self.config.secagg_max_rounds:
            return False
        # Once unmask requests went out, the server may hold shares of this round's secrets; a retry could
        # then let it difference two sums over different survivor sets (THREAT_MODEL.md, 6.2).
        return not (isinstance(aborted, dict) and aborted.get("after_unmask"))

    def _open_next_round(self, hospital: str) -> None:
        """Round r aborted: open r + 1 under the same session, parameters and enrolments."""
        old = self._round
        r = old.round + 1
        aborted = self.store.get_meta("secagg_aborted")
        now = time.time()
        retired = self.store.retire_uploads(f"{Stage.MASKED_INPUT}@retired{old.round}", {
            "secagg_round": r, "secagg_closed": [], "secagg_aborted": None, "secagg_stage_opened": now,
            "secagg_previous_abort": aborted})
        self._round = self._new_round(r)
        self.audit.append("secagg_round_opened", actor=hospital, outcome="accepted", session=self.config.session_id,
                          details={"round": r, "stage": self._round.stage, "max_rounds": self.config.secagg_max_rounds,
                                   "hospitals": len(self._round.participants), "previous_abort": aborted,
                                   "excluded": sorted(self.store.get_meta("secagg_excluded", [])),
                                   "retired_masked_inputs": retired})
        log.warning("secagg round %d opened by %s after round %d aborted (%d masked inputs set aside)", r,
                    hospital, old.round, retired)

    # -- hospital endpoints -------------------------------------------------------------------------
    @functools.cached_property
    def poll_s(self) -> float:
        """The longest pause between a waiting hospital's polls: K hospitals together poll at most ~25 times a
        second. A waiting hospital closes its connection, so each poll costs a new mutual-TLS handshake, a
        signed-request check and a durable nonce: about 6 ms of server CPU here (and 5 ms at the hospital),
        so 200 polls a second (the earlier spread) took more than the two cores of the benchmark machine at
        K = 1000. The price is latency: a hospital learns of a new stage up to ``poll_s`` late (30 s at
        K >= 750, 4 s at K = 100, 1 s below K = 25)."""
        return min(30.0, max(1.0, len(self._enrolled) / 25))

    def open_round(self, actor: str) -> None:
        """Start the current round's stage clock, once, with an audit record naming who started it: the first
        hospital whose signed poll arrives, or the operator's own driver (the Flower ServerApp, which asks on
        the hospitals' behalf, so no hospital is named for it)."""
        with self._lock:
            if self.round_stage in ("done", "aborted") or self.store.get_meta("secagg_stage_opened") is not None:
                return
            self.store.set_meta("secagg_stage_opened", time.time())
            self.audit.append("secagg_round_opened", actor=actor, outcome="accepted",
                              session=self.config.session_id,
                              details={"round": self.round_number, "stage": self.round_stage})

    def secagg_request(self, hospital: str) -> dict:
        """What ``hospital`` should do now: a small status, or (once per stage) its signed stage request."""
        return {**self._secagg_request(hospital), "poll_s": self.poll_s}

    def secagg_request_in_round(self, hospital: str) -> dict | None:
        """:meth:`secagg_request`, or None once the round has aborted, checked and asked under one lock.

        For a driver that runs exactly one round (the Flower ServerApp): the
        stage clock runs in another thread and could abort the round between a
        separate check and the request, and a request after an abort may open
        the next round.
        """
        with self._lock:
            if self.round_stage == "aborted":
                return None
            return self.secagg_request(hospital)

    def _secagg_request(self, hospital: str) -> dict:
        with self._lock:
            if self.round_stage == "aborted" and self._may_retry():
                self._open_next_round(hospital)
            stage, r = self.round_stage, self.round_number
            if stage == "aborted":  # why, so a hospital's one line says more than "aborted"
                return {"stage": stage, "round": r, "abort": self._abort_summary("secagg_aborted")}
            if stage == "done":
                return {"stage": stage, "round": r}
            cid = self.client_ids[hospital]
            # the stage clock starts when the first hospital asks, so an early server never times out
            self.open_round(hospital)
            if cid not in self._round.active:
                # a hospital that never acknowledged setup was never in the round: it is told so, not "dropped"
                return {"stage": stage, "round": r, "dropped": True,
                        "left_at": self._round.left_at.get(cid, Stage.SETUP)}
            if self._round.has_responded(cid):
                # whom it waits for and until when: the roster is every member's to know, and a hospital
                # otherwise sits silent up to stage_timeout_s
                opened = float(self.store.get_meta("secagg_stage_opened", time.time()))
                return {"stage": stage, "round": r, "waiting": True,
                        "waiting_for": sorted(self._name(c) for c in self._round.waiting_for),
                        "closes_in_s": max(0.0, opened + self.config.stage_timeout_s - time.time()),
                        **({"previous_abort": self._abort_summary("secagg_previous_abort")} if r > 1 else {})}
            if stage == Stage.UNMASK:
                gate = self._consistency_gate(cid)
                if gate is not None:
                    return {**gate, "round": r}
            if r > 1 and stage == Stage.SETUP:
                prev = {"previous_abort": self._abort_summary("secagg_previous_abort")}
            else:
                prev = {}
            raw = self._round.request(cid).to_bytes()
            # signed, so a hospital holds evidence of what it was asked (e.g. two different
            # survivor lists would be provable equivocation); the stage closings are in the audit log
            return {"stage": stage, "round": r, "request": base64.b64encode(raw).decode(),
                    "signature": self._key.sign(SECAGG_REQUEST_PREFIX + raw).hex(), **prev}

    def _abort_summary(self, key: str) -> dict | None:
        """The stored abort (stage, round, counts, who was dropped, why) as a hospital is told it."""
        a = self.store.get_meta(key)
        if not isinstance(a, dict):
            return None
        return {k: a.get(k) for k in ("round", "stage", "answered", "expected", "dropped", "message")}

    # -- consistency check (opens the unmask stage) ---------------------------------------------------
    def _consistency_gate(self, cid: int) -> dict | None:
        """None once this hospital may receive its unmask request."""
        r = self._round
        if not r.has_signed(cid):
            return {"stage": CONSISTENCY, "survivors": list(r.survivors_), "quorum": r.quorum}
        opened = float(self.store.get_meta("secagg_stage_opened", time.time()))
        everyone = r.signed_count == len(r.survivors_)
        late = time.time() - opened >= self.config.stage_timeout_s / 2
        if r.unmask_open and (everyone or late):
            return None
        return {"stage": Stage.UNMASK, "waiting": True}

    def secagg_consistency(self, hospital: str, body: bytes) -> dict:
        """A survivor's signed statement of the survivor set (Bonawitz et al.'s consistency check)."""
        with self._lock:
            try:
                if self.round_stage != Stage.UNMASK:
                    raise StageError(f"the round is in {self.round_stage}, not in its consistency check")
                msg = decode_message(body)
                if not isinstance(msg, ConsistencyStatement) or msg.client_id != self.client_ids[hospital]:
                    raise Forbidden(f"{hospital} may only sign its own consistency statement")
                self._round.receive(msg)
            except SecureAFLError as e:
                self.refuse("secagg_consistency", hospital, e)
                raise
            self.store.put_message(self._mkey(CONSISTENCY), hospital, body)
            self.audit.append("secagg_consistency", actor=hospital, outcome="accepted",
                              session=self.config.session_id,
                              details={"round": self._round.round, "survivors": len(self._round.survivors_),
                                       "signed": self._round.signed_count})
            return {"accepted": True, "stage": CONSISTENCY}

    def secagg_complaint(self, hospital: str, body: bytes) -> dict:
        """A holder's proof that the dealer of its shares cheated: the dealer is named, the round will abort."""
        with self._lock:
            try:
                if self.round_stage != Stage.MASKED_INPUT:
                    raise StageError(f"the round is in {self.round_stage}; complaints belong to {Stage.MASKED_INPUT}")
                msg = decode_message(body)
                if not isinstance(msg, DealerComplaint) or msg.client_id != self.client_ids[hospital]:
                    raise Forbidden(f"{hospital} may only send its own complaint")
                if self.store.has_message(self._mkey(COMPLAINT), hospital):
                    raise DuplicateContribution(f"{hospital} already sent a complaint")
                self._round.receive(msg)  # refuses, changing nothing, a complaint that proves nothing
            except SecureAFLError as e:
                self.refuse("secagg_complaint", hospital, e)
                raise
            except (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError) as e:
                err = MalformedPayload(f"unusable complaint: {type(e).__name__}")
                self.refuse("secagg_complaint", hospital, err)
                raise err from None
            dealer = self._name(msg.deal.dealer)
            self.store.put_message(self._mkey(COMPLAINT), hospital, body)
            excluded = self.store.get_meta("secagg_excluded", [])
            if dealer not in excluded:
                self.store.set_meta("secagg_excluded", sorted(excluded + [dealer]))
            # the evidence travels whole: with the dealer's enrolled key anyone can re-check it
            # (DealerComplaint.proves), without trusting this server or the holder
            self.audit.append("secagg_inconsistent_dealer", actor=hospital, outcome="refused",
                              session=self.config.session_id, reason="inconsistent_dealer",
                              details={"round": self._round.round, "dealer": dealer, "holder": hospital,
                                       "evidence": base64.b64encode(body).decode()})
            log.warning("[Stage 3] %s proved that %s dealt inconsistent shares; round %d will abort and %s takes "
                        "part in no later round", hospital, dealer, self._round.round, dealer)
            return {"accepted": True, "stage": COMPLAINT}

    def secagg_message(self, hospital: str, stage: str, body: bytes) -> dict:
        """One hospital's answer for ``stage``."""
        with self._lock:
            try:
                if stage not in _MESSAGE_STAGES:
                    raise StageError(f"{stage!r} is not a message stage (masked inputs go to /uploads)")
                if self.round_stage != stage:
                    raise StageError(f"the round is in {self.round_stage}, not {stage}")
                msg = decode_message(body)
                if getattr(msg, "client_id", None) != self.client_ids[hospital]:
                    raise Forbidden(f"{hospital} may only speak for client {self.client_ids[hospital]}")
                if self.store.has_message(self._mkey(stage), hospital):
                    raise DuplicateContribution(f"{hospital} already answered {stage}")
                bad_before = len(self._round.bad_shares)
                self._round.receive(msg)
            except SecureAFLError as e:
                self.refuse(f"secagg_{stage}"[:64], hospital, e)
                raise
            except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as e:
                err = MalformedPayload(f"unusable {stage} message: {type(e).__name__}")
                self.refuse(f"secagg_{stage}"[:64], hospital, err)
                raise err from None
            self.store.put_message(self._mkey(stage), hospital, body)
            self.audit.append(f"secagg_{stage}", actor=hospital, outcome="accepted", session=self.config.session_id,
                              details={"round": self._round.round, "bytes": len(body)})
            for bad in self._round.bad_shares[bad_before:]:
                # the holder's other shares are kept; the round goes on while t correct shares remain
                self.audit.append("secagg_bad_share", actor=hospital, outcome="refused",
                                  session=self.config.session_id, reason="bad_share",
                                  details={"holder": hospital, "owner": self._name(bad.owner), "kind": bad.kind})
                log.warning("[Stage 4] %s revealed a share of %s that does not match its commitment; discarded",
                            hospital, self._name(bad.owner))
            return {"accepted": True, "stage": stage}

    # -- release --------------------------------------------------------------------------------------
    def _final_aggregate(self) -> bytes:
        if self.round_stage != "done":
            raise StageError(f"the secagg round is {self.round_stage}; the masked sum can be released only "
                             "after the unmask round completed")
        return self._round.aggregate

    def unmask_material(self) -> dict:
        if self.status != "released":
            raise StageError("the aggregate has not been released")
        return self._round.unmask_material().to_dict()

    def shutdown(self) -> None:
        self._stop.set()
        super().shutdown()
