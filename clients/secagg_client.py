"""Hospital side of a ``secagg`` session: the five SecAgg stages over HTTPS.

The hospital polls for the server's request of the current stage, answers it
with :class:`~secure_afl.backends.secagg.SecAggClient` (which refuses
out-of-order stages, tampered shares and overlapping unmask requests), and
uploads its masked vector as a signed upload (the receipt is kept like for
any backend). Its secrets (X25519 keys, self-mask seed, shares it holds) live
only in this process. A server restart is ridden out: requests are retried,
and an answer the server had already stored (409 duplicate) counts as sent.
"""

from __future__ import annotations

import base64
import json
import logging
import time

from secure_afl.backends.secagg import SecAggClient, Stage, decode_message
from cryptography.exceptions import InvalidSignature

from secure_afl import pki
from secure_afl.exceptions import (
    DuplicateContribution,
    InsufficientShares,
    InvalidContribution,
    SecureAFLError,
    StageError,
)
from secure_afl.protocol import H_PARTY, H_TIME, SECAGG_CONSISTENCY, SECAGG_REQUEST_PREFIX, verify_request
from secure_afl.signing import sign_consistency, verify_consistency
from secure_afl.params import SessionParams
from secure_afl.stats import SufficientStatistics

__all__ = ["SecAggParticipant", "run_secagg"]

CONSISTENCY = SECAGG_CONSISTENCY

log = logging.getLogger("secure_afl.client")


class SecAggParticipant:
    """One hospital's part in one secagg round; :meth:`run` may pause and resume."""

    def __init__(self, hospital, params: SessionParams, stats: SufficientStatistics):
        self.hospital = hospital
        self.params = params
        self.vector = hospital.protect_vector(params, stats)
        self.client_ids = hospital.conn.info()["secagg"]["client_ids"]
        if self.client_ids != {n: i + 1 for i, n in enumerate(sorted(self.client_ids))}:
            raise InvalidContribution("the server's client numbering is not the sorted enrolment order")
        self.peers = pki.load_enrolments(hospital.party.pki_dir, role="hospital")
        self.client = SecAggClient(params, self.client_ids[hospital.name])
        self.receipt: dict | None = None
        self._answered: set[str] = set()
        self._survivors: list[str] = []

    def run(self, *, pause_before: str | None = None, timeout: float = 600.0, poll: float = 0.1,
            progress: bool = False) -> dict | None:
        """Answer stages until the round is done (returns the receipt).

        With ``pause_before=STAGE`` return None as soon as the round reaches
        STAGE, without answering it; call :meth:`run` again to go on. A site
        that never resumes is a dropout (failure drills use this).
        """
        conn = self.hospital.conn
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = conn.request("GET", conn.path("/secagg/request")).json()
            stage = r["stage"]
            if stage == "done":
                return self.receipt
            if stage == "aborted":
                raise InsufficientShares("the server aborted the secagg round (too many dropouts); "
                                         "nothing was revealed")
            if r.get("dropped"):
                raise StageError(f"{self.hospital.name} was dropped from the round at stage {stage}")
            phase = Stage.UNMASK if stage == CONSISTENCY else stage  # the check opens the unmask stage
            if pause_before == phase and phase not in self._answered:
                log.warning("%s pauses before %s", self.hospital.name, stage)
                return None
            if stage == CONSISTENCY and CONSISTENCY not in self._answered:
                self._sign_survivors(r["survivors"])
                continue
            if "request" not in r or stage in self._answered:
                time.sleep(poll)
                continue
            raw = base64.b64decode(r["request"])
            try:
                self.hospital.server_pub.verify(bytes.fromhex(r.get("signature", "")), SECAGG_REQUEST_PREFIX + raw)
            except (InvalidSignature, ValueError):
                raise InvalidContribution("a secagg request does not carry the server's signature") from None
            request = decode_message(raw)
            if stage == Stage.SHARE_KEYS:
                self._check_advertisements(request, r.get("advertisement_signatures") or {})
            if stage == Stage.UNMASK:
                self._check_consistency(request, r.get("consistency") or {})
            self._answer(stage, request, progress)
        raise TimeoutError(f"secagg round did not finish within {timeout:.0f} s")

    def _check_advertisements(self, request, signatures: dict) -> None:
        """Every relayed key advertisement must carry its hospital's own signature.

        The hospital signed its advertisement when it sent it (a signed request over
        exactly these bytes); re-checking that signature with the peer's enrolled
        identity key stops a server from swapping in keys of its own and collecting
        the shares encrypted to them.
        """
        names = {cid: name for name, cid in self.client_ids.items()}
        path = self.hospital.conn.path(f"/secagg/{Stage.ADVERTISE_KEYS}")
        for ad in request.advertisements:
            name = names.get(ad.client_id)
            auth = signatures.get(name)
            if name is None or not isinstance(auth, dict) or auth.get(H_PARTY) != f"hospital:{name}":
                raise InvalidContribution(f"advertisement of client {ad.client_id} is not signed by its hospital")
            try:
                peer_pub = self.peers[name].public_key()
                verify_request(auth, "POST", path, ad.to_bytes(), lambda _party, pub=peer_pub: pub,
                               now=int(auth[H_TIME]))
            except (KeyError, ValueError):
                raise InvalidContribution(f"advertisement of {name} is not signed by an enrolled hospital") from None
            except SecureAFLError:
                raise InvalidContribution(f"advertisement of {name} does not carry its hospital's signature") \
                    from None

    def _sign_survivors(self, survivors: list[str]) -> None:
        """Consistency check, step 1: sign the survivor set the server announced (once)."""
        if self.hospital.name not in survivors or not set(survivors) <= set(self.client_ids):
            raise InvalidContribution("the announced survivor set is not a set of enrolled hospitals with us in it")
        st = sign_consistency(self.hospital.party.identity_key(), self.params.session_id, self.params.digest(),
                              self.hospital.name, survivors)
        conn = self.hospital.conn
        try:
            conn.request("POST", conn.path(f"/secagg/{CONSISTENCY}"), body=json.dumps(st).encode())
        except DuplicateContribution:
            pass  # stored before a connection drop
        self._survivors = sorted(survivors)
        self._answered.add(CONSISTENCY)

    def _check_consistency(self, request, statements: dict) -> None:
        """Consistency check, step 2: reveal shares only if a quorum signed the same survivor set.

        Quorum = max(threshold, majority of all enrolled hospitals): two different
        survivor sets cannot both gather it from honest hospitals, so a server cannot
        ask one group for b-shares and another for key-shares of the same hospital.
        """
        cfg = self.client.cfg
        quorum = max(cfg.threshold, cfg.n_parties // 2 + 1)
        signers = set()
        for name, st in statements.items():
            if name not in self._survivors or name not in self.peers or st.get("hospital") != name:
                raise InvalidContribution(f"consistency statement by {name!r} is not from a survivor")
            try:
                verify_consistency(st, self.peers[name].public_key(), session_id=self.params.session_id,
                                   params_digest=self.params.digest(), survivors=self._survivors)
            except SecureAFLError:
                raise InvalidContribution(f"{name} did not sign the survivor set we signed") from None
            signers.add(name)
        if len(signers) < quorum:
            raise InvalidContribution(f"only {len(signers)} hospitals confirmed the survivor set; {quorum} needed")
        ids = {self.client_ids[n] for n in self._survivors}
        if not set(request.survivors) <= ids or set(request.dropped) & ids:
            raise InvalidContribution("the unmask request contradicts the signed survivor set")

    def _answer(self, stage: str, request, progress: bool) -> None:
        response = self.client.handle(request, vector=self.vector if stage == Stage.MASKED_INPUT else None)
        if stage == Stage.MASKED_INPUT:
            self.receipt = self.hospital.upload(self.params, response.to_bytes(), progress=progress)
        else:
            body = response.to_bytes()
            conn = self.hospital.conn
            try:
                conn.request("POST", conn.path(f"/secagg/{stage}"), body=body)
            except DuplicateContribution:
                pass  # stored before a connection drop: the server has this answer
            self.hospital.bytes_uploaded += len(body)
        self._answered.add(stage)
        log.info("[Stage %d] %s answered %s", Stage.index(stage), self.hospital.name, stage)


def run_secagg(hospital, params: SessionParams, stats: SufficientStatistics, *, progress: bool = False,
               timeout: float = 600.0, stop_before: str | None = None) -> dict | None:
    """Take part in every stage; return the receipt of the masked upload.

    ``stop_before`` makes this hospital go silent at that stage, as a crashed
    site would (failure drills); it then returns None.
    """
    return SecAggParticipant(hospital, params, stats).run(pause_before=stop_before, timeout=timeout,
                                                          progress=progress)
