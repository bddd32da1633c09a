"""Hospital side of a ``secagg`` session: the SecAgg stages over HTTPS.

The hospital polls for the server's request of the current stage, checks the
server's signature on it, and hands it to its
:class:`~secure_afl.secagg.SecAggClient`, which holds every check against a
malicious server (signed advertisements, the graph seed, share commitments,
the survivor-set quorum, overlapping unmask lists). The masked vector goes up
as a signed upload (the receipt is kept like for any backend). Its secrets
(X25519 keys, self-mask seed, shares it holds) live only in this process. A
server restart is ridden out: requests are retried, and an answer the server
had already stored (409 duplicate) counts as sent.

Every poll answer names the session's round r. When the server opens round
r + 1 after an abort, the hospital starts over with a new state machine: fresh
X25519 keys and a fresh self-mask seed, nothing of round r reused. A hospital
that signed a survivor set takes no further part in the session, in any round
and in any later or concurrent process (it records that durably, under a
lock, before the signature leaves, in the store :mod:`secure_afl.secagg.record`
keeps in its PKI bundle for both transports): a server that completed a round, then re-ran it (with the same
round number or the next) after an abort or a restart, could otherwise
difference two sums over different survivor sets (THREAT_MODEL.md 6.2).

A hospital whose shares from some dealer miss that dealer's signed check
polynomial posts the proof (a complaint) instead of its masked input and
waits: the server aborts the round before any unmask and runs the next one
without the dealer.
"""

from __future__ import annotations

import base64
import logging
import time

from cryptography.exceptions import InvalidSignature

from secure_afl import pki
from secure_afl.exceptions import (
    DuplicateContribution,
    InconsistentDealer,
    InsufficientShares,
    InvalidContribution,
    StageError,
)
from secure_afl.params import SessionParams
from secure_afl.protocol import SECAGG_COMPLAINT, SECAGG_CONSISTENCY, SECAGG_REQUEST_PREFIX
from secure_afl.secagg import SecAggClient, Stage, decode_message
from secure_afl.secagg.record import SurvivorRecord
from secure_afl.stats import SufficientStatistics

__all__ = ["SecAggParticipant", "run_secagg"]

CONSISTENCY = SECAGG_CONSISTENCY
UNMASK_RESPONSE = "unmask_response"

log = logging.getLogger("secure_afl.client")
# the per-stage wait lines: on by default (a silent wait looks like a hang); a caller that runs many
# hospitals in one process (the demo) turns this logger down
_wait_log = logging.getLogger("secure_afl.client.wait")


class SecAggParticipant:
    """One hospital's part in one secagg round; :meth:`run` may pause and resume."""

    def __init__(self, hospital, params: SessionParams, stats: SufficientStatistics):
        self.hospital = hospital
        self.params = params
        self.vector = hospital.protect_vector(params, stats)
        # n, the numbering, t, the degree and min_clients come from the signed definition; the server's
        # numbering must be the same, or it could seat hospitals in the graph or add a sybil to the quorum
        definition = hospital.definition
        self.client_ids = definition.client_ids  # fetch_params checked that the server relays the same
        peers = pki.load_enrolments(hospital.party.pki_dir, role="hospital")
        missing = sorted(set(self.client_ids) - set(peers))
        if missing:
            raise InvalidContribution(f"the signed session names hospitals {missing} that the roster does not enrol")
        self._keys = {self.client_ids[n]: peers[n].public_key() for n in self.client_ids}
        self.client = SecAggClient(params, self.client_ids[hospital.name], hospital.party.identity_key(), self._keys)
        self.receipt: dict | None = None
        self._answered: set[str] = set()
        self._record = SurvivorRecord(hospital.secagg_record_dir, params.session_id, hospital.name)
        # a process that starts after this hospital signed a survivor set of the session (a restart, a second
        # `client submit`) holds none of that round's keys: it takes no part, whatever round is announced
        self._record.refuse_if_signed(self.client.round)
        self._signed_round: int | None = None

    def _join_round(self, r, previous_abort=None) -> None:
        """The server opened round ``r``: a new state machine, so new keys and self-mask seed."""
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise InvalidContribution(f"the server announced round {r!r}")
        if self._signed_round is not None and r != self._signed_round:
            raise InvalidContribution(
                f"{self.hospital.name} signed the survivor set of round {self._signed_round} of this session and "
                f"takes part in no other round (round {r} announced): two unmasked sums over different survivor "
                "sets could be differenced; contribute to a new session instead")
        self.client = SecAggClient(self.params, self.client.client_id, self.hospital.party.identity_key(),
                                   self._keys, round=r)
        self.receipt = None
        self._answered = set()
        log.warning("%s joins secagg round %d with fresh keys%s", self.hospital.name, r, _why(previous_abort))

    def run(self, *, pause_before: str | None = None, timeout: float = 600.0, poll: float = 0.1,
            progress: bool = False) -> dict | None:
        """Answer stages until the round is done (returns the receipt).

        With ``pause_before=STAGE`` return None as soon as the round reaches
        STAGE, without answering it; call :meth:`run` again to go on. A site
        that never resumes is a dropout (failure drills use this).
        ``pause_before="unmask_response"`` pauses after signing the survivor
        set, before revealing any share.
        """
        conn = self.hospital.conn
        deadline = time.monotonic() + timeout
        waiting_in, pause = None, poll
        while time.monotonic() < deadline:
            # A hospital about to wait a second or more gives its connection back with the answer: the
            # server serves at most max_connections at once, and K waiting hospitals that kept theirs alive
            # would hold every slot while the rest were turned away until their stages closed.
            release = None if pause < 1.0 else {"connection": "close"}
            r = conn.request("GET", conn.path("/secagg/request"), headers=release).json()
            stage = r["stage"]
            if r.get("round", 1) != self.client.round or (self._signed_round not in (None, self.client.round)):
                self._join_round(r.get("round"), r.get("previous_abort"))
            if stage != waiting_in:
                pause = poll
            if stage == "done":
                return self.receipt
            if stage == "aborted":
                raise InsufficientShares(f"the server aborted secagg round {self.client.round}"
                                         f"{_why(r.get('abort')) or ' (too many dropouts)'} and opens no further round; nothing was revealed")
            if r.get("dropped"):
                left = r.get("left_at")
                if left == Stage.SETUP:
                    raise StageError(f"{self.hospital.name} never joined round {self.client.round} of session "
                                     f"{self.params.session_id}: the round went on without it once its setup "
                                     "stage closed (stage_timeout_s), so its statistics are not in it; if the "
                                     "round aborts it may join the next")
                raise StageError(f"{self.hospital.name} was dropped from round {self.client.round} at stage "
                                 f"{left if isinstance(left, str) else stage}: it did not answer within the "
                                 "stage timeout (or too few of its share holders did)")
            phase = Stage.UNMASK if stage == CONSISTENCY else stage  # the check opens the unmask stage
            if pause_before == phase and phase not in self._answered:
                log.warning("%s pauses before %s", self.hospital.name, stage)
                return None
            # a process that starts while a round is past its setup holds none of that round's keys:
            # it sits the round out and joins the next one if this one aborts
            missed = self.client.stage == Stage.SETUP and phase != Stage.SETUP
            if stage == CONSISTENCY and CONSISTENCY not in self._answered and not missed:
                self._sign_survivors(r.get("survivors"))
                continue
            if "request" not in r or stage in self._answered or missed:
                if waiting_in != stage:  # one line per stage, and a poll that backs off to 1 s
                    # said without -v: a wait of up to stage_timeout_s looks like a hang otherwise
                    whom = r.get("waiting_for")
                    whom = (f"{', '.join(map(str, whom))}" if isinstance(whom, list) and whom and not missed
                            else "the next round" if missed else "the other hospitals")
                    until = r.get("closes_in_s")
                    until = (f"; the stage closes within {until:.0f} s" if isinstance(until, (int, float))
                             and not isinstance(until, bool) else "")
                    _wait_log.warning("%s waits for %s (%s, round %d%s)", self.hospital.name, whom, stage,
                                      self.client.round, until)
                    waiting_in = stage
                time.sleep(pause)
                cap = r.get("poll_s", 1.0)  # the server spreads K hospitals' polls; bounded here all the same
                cap = min(float(cap), 30.0) if isinstance(cap, (int, float)) and not isinstance(cap, bool) else 1.0
                pause = min(2 * pause, max(poll, cap))
                continue
            if pause_before == UNMASK_RESPONSE and stage == Stage.UNMASK:
                log.warning("%s pauses before its unmask response", self.hospital.name)
                return None
            raw = base64.b64decode(r["request"])
            try:
                self.hospital.server_pub.verify(bytes.fromhex(r.get("signature", "")), SECAGG_REQUEST_PREFIX + raw)
            except (InvalidSignature, ValueError):
                raise InvalidContribution("a secagg request does not carry the server's signature") from None
            self._answer(stage, decode_message(raw), progress)
        raise TimeoutError(f"secagg round did not finish within {timeout:.0f} s")

    def _sign_survivors(self, survivors) -> None:
        """Consistency check, step 1: the state machine signs the announced survivor set (once) or refuses."""
        if not isinstance(survivors, list) or any(isinstance(s, bool) or not isinstance(s, int) for s in survivors):
            raise InvalidContribution("the announced survivor set is not a list of client ids")
        # one process of this hospital at a time from the check to the signature's post: two that both passed
        # the check at their start cannot both sign
        with self._record.signing():
            if self._signed_round is None:
                self._record.refuse_if_signed(self.client.round)  # another process of this hospital signed one
            statement = self.client.sign_survivors(survivors)
            self._signed_round = self.client.round
            self._record.write(self.client.round)  # before the signature can reach the server
            self._post(CONSISTENCY, statement.to_bytes())
        self._answered.add(CONSISTENCY)

    def _post(self, stage: str, body: bytes) -> None:
        conn = self.hospital.conn
        try:
            conn.request("POST", conn.path(f"/secagg/{stage}"), body=body)
        except DuplicateContribution:
            pass  # stored before a connection drop: the server has this answer
        self.hospital.bytes_uploaded += len(body)

    def _answer(self, stage: str, request, progress: bool) -> None:
        try:
            response = self.client.handle(request, vector=self.vector if stage == Stage.MASKED_INPUT else None)
        except InconsistentDealer as e:
            # this round is over for us (nothing of ours was revealed); the proof lets the server abort it
            # before any unmask and leave the dealer out of the next one
            log.warning("%s: %s; sending the proof", self.hospital.name, e)
            self._post(SECAGG_COMPLAINT, e.complaint.to_bytes())
            self._answered.add(stage)
            return
        if stage == Stage.MASKED_INPUT:
            self.receipt = self.hospital.upload(self.params, response.to_bytes(), progress=progress)
        else:
            self._post(stage, response.to_bytes())
        self._answered.add(stage)
        log.info("[Stage %d] %s answered %s", Stage.index(stage), self.hospital.name, stage)


def _why(abort) -> str:
    """The server's account of an aborted round, for one line; empty when it sent none."""
    if not isinstance(abort, dict):
        return ""
    dropped = abort.get("dropped")
    dropped = f", dropped {', '.join(map(str, dropped))}" if isinstance(dropped, list) and dropped else ""
    return (f" (round {abort.get('round')} aborted at {abort.get('stage')}: {abort.get('answered')} of "
            f"{abort.get('expected')} answered{dropped})")


def run_secagg(hospital, params: SessionParams, stats: SufficientStatistics, *, progress: bool = False,
               timeout: float = 600.0, stop_before: str | None = None) -> dict | None:
    """Take part in every stage; return the receipt of the masked upload.

    ``stop_before`` makes this hospital go silent at that stage, as a crashed
    site would (failure drills); it then returns None.
    """
    return SecAggParticipant(hospital, params, stats).run(pause_before=stop_before, timeout=timeout,
                                                          progress=progress)
