"""The aggregation server role: blind, streaming, durable, audited.

Runs on: the consortium's aggregation server. Sees: enrolment records,
signatures, and protected payloads (CKKS ciphertexts under the key holder's
public key, or SecAgg masked vectors); with ``plain`` it sees plaintext
statistics (reference mode only). Trusted for availability, not for
confidentiality (threat_model/THREAT_MODEL.md).

Stages of a session, visible in :attr:`AggregationServer.status`:

    awaiting_context (ckks only) -> open -> released

* ``open``: one signed upload per enrolled hospital is accepted, validated
  against the session parameters, written durably and added to a running sum
  (memory O(L): one combiner, never K payloads). After a restart the stored
  uploads are summed again by one process per core (secure_afl/parallel.py).
* ``released``: at least the release quorum q (``secure_afl.cohort``) contributed; the aggregate payload
  and a server-signed manifest (participants, payload hashes, upload
  signatures) are fixed. Nothing more is accepted.

Every decision, accepted or refused, is appended to the hash-chained audit log
before it is acknowledged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path

from secure_afl import pki
from secure_afl.audit_log import AuditLog, make_close_record, verify_countersign
from secure_afl.backends import HE_BACKENDS, get_backend, he_module
from secure_afl.exceptions import (
    DeadlinePassed,
    DuplicateContribution,
    Forbidden,
    InsufficientContributors,
    MalformedPayload,
    MissingEnrolment,
    NotFound,
    ReplayedContribution,
    RoundAlreadyClosed,
    SecureAFLError,
    ServerBusy,
    StageError,
    TooLarge,
    Unauthenticated,
)
from secure_afl.params import KEYED_BACKENDS, SessionParams
from secure_afl.protocol import MAX_SKEW_S, parse_context_publication, verify_request_digest
from secure_afl.signing import build_manifest, make_receipt, verify_upload

from .config import ServerConfig
from .refusals import RefusalLog
from .session_parties import SessionRoster
from .status import session_info, session_status
from .store import Store
from secure_afl.session.relay import check_same
from secure_afl.session.signed import load_signed
from secure_afl.cohort import release_policy
from secure_afl._io import write_file
from secure_afl.encoding import parse_json
from secure_afl.parallel import ParallelCombiner
from secure_afl.parallel import default_workers
from secure_afl.parallel import sum_payloads

__all__ = ["AggregationServer", "DeadlinePassed"]

log = logging.getLogger("secure_afl.server")


class AggregationServer:
    """One session's server state machine (no HTTP here; see server/app.py)."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.dir = Path(config.data_dir) / config.session_id
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.store = Store(self.dir)
        self.party = pki.load_party(config.pki_dir, "server", config.name)
        self._key = self.party.identity_key()
        self.identity_pub_hex = pki.public_key_hex(self._key.public_key())
        self.audit = AuditLog(self.dir / "audit.jsonl", signing_key=self._key)
        self._lock = threading.RLock()
        # uploads past their checks whose contribution a summing worker is adding outside the lock; close and
        # a rebuild of the sum wait for them (``_drained``), and nothing new starts while ``_closing``
        self._in_flight: set[str] = set()
        self._door = None  # the backend that admits uploads, built once per session parameters
        self._drained = threading.Condition(self._lock)
        self._closing = False
        self.definition = self._signed_definition()
        self.release_policy = release_policy(self.definition)
        self._enrolled = self._load_enrolled()
        self._keyholders = pki.load_enrolments(config.pki_dir, role="keyholder")
        self.roster = SessionRoster(config.session_id, config.keyholder, self._enrolled, self._keyholders)
        self.lookup_pub, self.enrolment = self.roster.lookup_pub, self.roster.enrolment
        self.refusals = RefusalLog(self.audit, config.session_id, config.refusal_interval_s, self.roster.peer_party)
        if self.store.get_meta("created_at") is None:
            self.store.set_meta("created_at", time.time())
            self.audit.append("session_created", actor=config.name, outcome="accepted",
                              session=config.session_id,
                              details={"backend": config.backend, "min_clients": config.min_clients,
                                       "hospitals": sorted(self._enrolled)})
        self.params: SessionParams | None = None
        self.public_context: bytes | None = None
        self._combiner = None
        self._recover()

    # -- set-up ------------------------------------------------------------------
    def _signed_definition(self):
        """The operator-signed definition of this session; the server's own settings must agree with it."""

        signed = load_signed(self.config.pki_dir, self.config.session_id)
        check_same(signed.body, self.config.definition.body, what="",
                           source=f"the server's session.toml ({self.config.session_id})")
        return signed

    def _load_enrolled(self) -> dict:
        issued = pki.load_enrolments(self.config.pki_dir, role="hospital")
        names = self.definition.hospitals
        missing = [n for n in names if n not in issued]
        if missing:
            raise MissingEnrolment(f"hospitals {missing} are listed in the config but have no enrolment "
                                    f"in {self.config.pki_dir}; issue them with `secure-afl pki issue`")
        return {n: issued[n] for n in names}

    def _base_params(self) -> SessionParams:
        return self.definition.session_params()

    def _recover(self) -> None:
        """Rebuild in-memory state from SQLite and payload files after a restart."""
        self._rebuild()
        if self.store.upload_count():
            self.audit.append("server_restarted", actor=self.config.name, outcome="accepted",
                              session=self.config.session_id,
                              details={"recovered_uploads": self.store.upload_count(), "status": self.status})

    def _rebuild(self) -> None:
        """In-memory state (parameters, running sum) from what is durably stored."""
        stored = self.store.get_meta("params")
        if stored is not None:
            self.params = SessionParams.from_dict(stored)
        elif self.config.backend not in KEYED_BACKENDS:
            self.params = self._base_params()
            self.store.set_meta("params", self.params.to_dict())
        ctx = self.store.get_meta("public_context_sha256")
        if ctx is not None:
            self.public_context = self.store.get_blob(ctx)
        if self.params is not None:
            self._combiner = self._new_combiner()
            rows = self.store.uploads()
            if self._combiner is not None and rows and self.store.get_meta("manifest") is None:
                self._resum_stored(rows)  # once released, the aggregate is stored: nothing to add
            for row in rows:
                if row["audit_seq"] is None:  # killed between commit and receipt: finish the bookkeeping
                    self._finish_acceptance(row["hospital"], row["payload_sha256"], recovered=True)
        if self.store.get_meta("manifest") is not None:
            self._finish_release(self.config.name)

    def _resum_stored(self, rows: list) -> None:
        """The running sum of the stored uploads, deserialised and added by all cores (after a restart
        the server may hold K uploads to add again; one process would use one core)."""

        stored = ((row["hospital"], self.store.get_blob(row["payload_sha256"])) for row in rows)
        ctx = self.public_context if self.params.backend in HE_BACKENDS else None
        for body, n in sum_payloads(self.params, stored, public_context=ctx, count=len(rows)):
            self._combiner.merge(body, n)

    def _new_combiner(self):

        if self._combiner is not None:
            self._combiner.shutdown()
        ctx = self.public_context if self.params.backend in HE_BACKENDS else None
        return ParallelCombiner(self.params, public_context=ctx, workers=self.combine_workers)

    @property
    def combine_workers(self) -> int:
        """Processes that check and add uploads at once: ``[server] combine_workers``, or by default the cores
        when the session's uploads are ciphertexts worth it (k_max uploads of >= 64 MB in all), else 1."""
        if self.config.combine_workers:
            return self.config.combine_workers
        if self.params is None or self.params.backend not in HE_BACKENDS:
            return 1  # adding float64 or uint64 vectors costs less than handing them to another process

        # a ciphertext carries at least ~30 bytes per value (docs/BENCHMARKS.md)
        return default_workers(self.config.bounds.k_max, 30 * self.params.layout.length)

    # -- public state ----------------------------------------------------------------
    @property
    def status(self) -> str:
        if self.store.get_meta("manifest") is not None:
            return "released"
        if self.params is None:
            return "awaiting_context"
        return "open"

    @property
    def deadline(self) -> float | None:
        c = self.config
        if c.deadline is not None:
            return c.deadline
        if c.deadline_s is not None:
            return float(self.store.get_meta("created_at")) + c.deadline_s
        return None

    def info(self) -> dict:
        """The public session info every party reads (:func:`server.status.session_info`)."""
        return session_info(self)

    def session_status(self) -> dict:
        """Where the session stands, for ``secure-afl session status`` (:func:`server.status.session_status`)."""
        return session_status(self)

    # -- authentication --------------------------------------------------------------
    def check_peer(self, party: str, peer: dict | None) -> None:
        """The Ed25519 signer must be the party enrolled for the TLS certificate the client presented.

        ``peer`` is the transport's record of the connection (server/tls_server.py); ``None`` means
        the app is driven without a network transport (in-process tests), where there is no
        certificate to bind to.
        """
        if peer is None or not self.config.require_client_cert:
            return
        if peer.get("cert_sha256") != self.enrolment(party).cert_sha256:
            raise Unauthenticated(f"the request is signed by {party!r} but the TLS client certificate is "
                                  "not the one enrolled for it")

    def authenticate(self, headers, method: str, path: str, body_sha256: str, *, roles: tuple[str, ...],
                     peer: dict | None = None) -> str:
        """Verify a signed request (body known by its digest); return the party.

        Refusals are audited as unauthenticated: until the signature and the
        certificate binding hold, the claimed party is only a claim.
        """
        try:
            st = verify_request_digest(headers, method, path, body_sha256, self.lookup_pub)
            self.check_peer(st["party"], peer)
        except SecureAFLError as e:
            self.refuse("request", None, e, {"method": method, "path": path[:200]}, peer=peer)
            raise
        party = st["party"]
        try:
            role = party.partition(":")[0]
            if role not in roles:
                raise Forbidden(f"{role} may not call {method} {path}")
            if not self.store.claim_nonce(st["nonce"], party):
                raise ReplayedContribution("request nonce was already used")
            return party
        except SecureAFLError as e:
            self.refuse("request", party, e, {"method": method, "path": path[:200]}, peer=peer)
            raise

    def authenticate_upload(self, statement, peer: dict | None = None) -> str:
        """The hospital whose signed upload statement this is (checked before the body is read)."""
        try:
            if not isinstance(statement, dict):
                raise MalformedPayload("the upload statement is not a JSON object")
            hospital = statement.get("hospital")
            if not isinstance(hospital, str) or hospital not in self._enrolled:
                raise self.roster.not_in_session(f"hospital:{str(hospital)[:64]}")
            sha = statement.get("payload_sha256")
            if not isinstance(sha, str) or len(sha) != 64:
                raise MalformedPayload("the upload statement lacks a payload digest")
            verify_upload(statement, self._enrolled[hospital].public_key(), session_id=self.config.session_id,
                          payload_sha256=bytes.fromhex(sha), hospital=hospital, max_age_s=MAX_SKEW_S)
            self.check_peer(f"hospital:{hospital}", peer)
            return hospital
        except SecureAFLError as e:
            self.refuse("upload", None, e, peer=peer)
            raise
        except (TypeError, ValueError, KeyError) as e:
            err = MalformedPayload(f"upload statement unusable: {type(e).__name__}")
            self.refuse("upload", None, err, peer=peer)
            raise err from None

    def refuse(self, event: str, actor: str | None, err: SecureAFLError, details: dict | None = None, *,
               peer: dict | None = None) -> None:
        """Audit a refusal (:meth:`server.refusals.RefusalLog.refuse`). ``actor``: an authenticated identity,
        or None."""
        self.refusals.refuse(event, actor, err, details, peer=peer)

    def flush_refusals(self) -> None:
        self.refusals.flush()

    # -- ckks: the key holder publishes the public context ----------------------------------
    def publish_context(self, party: str, body: bytes) -> dict:
        """Key holder's signed ``{public_context, tag_public_key, params_signature}`` opens a ckks session.

        The parameters are recomputed here from the session config and must be
        the ones the key holder signed; a degenerate tag key or a context with a
        secret key is refused.
        """
        with self._lock:
            try:
                if self.config.backend not in KEYED_BACKENDS:
                    raise StageError("this session does not use a public context")
                if self.params is not None:
                    raise RoundAlreadyClosed("the public context is already published")
                from secure_afl.keyholder_params import check_tag_public_key, verify_session_params
                from secure_afl.tagging import TAG_KEY_PARAM

                bind_public_context = he_module(self.config.backend).bind_public_context
                context, tag_key, signature = parse_context_publication(body)
                params = bind_public_context(self._base_params(), context)  # refuses secret-key contexts
                check_tag_public_key(tag_key)
                params = params.with_backend_params(**{TAG_KEY_PARAM: tag_key})
                verify_session_params(params, signature, self.lookup_pub(party))
                get_backend(params).combiner(public_context=context)
            except SecureAFLError as e:
                self.refuse("publish_context", party, e)
                raise
            digest = self.store.put_blob(context)
            self.store.set_meta("public_context_sha256", digest)
            self.store.set_meta("params", params.to_dict())
            self.store.set_meta("params_signature", signature)
            self.params, self.public_context = params, context
            self._combiner = self._new_combiner()
            self.audit.append("publish_context", actor=party, outcome="accepted", session=self.config.session_id,
                              details={"public_context_sha256": digest, "params_digest": params.digest().hex()})
            return self.info()

    # -- uploads ------------------------------------------------------------------------------
    def submit(self, hospital: str, statement: dict, payload: bytes, tag: dict | None = None, *,
               peer: dict | None = None, payload_sha256: str | None = None) -> dict:
        """Validate, store durably, add to the running sum, audit, return a signed receipt.

        ckks uploads carry the hospital's signed aggregate tag (:mod:`secure_afl.tagging`).
        ``payload_sha256``: the body's digest where the caller already computed it from these bytes (the HTTP
        layer, as the body streamed in); else it is computed here.
        """
        sha = payload_sha256 if payload_sha256 is not None else hashlib.sha256(payload).hexdigest()
        details = {"payload_sha256": sha, "bytes": len(payload)}
        opened = None
        with self._lock:
            try:  # until the statement verifies, ``hospital`` is only a claim
                if hospital not in self._enrolled:
                    raise self.roster.not_in_session(f"hospital:{str(hospital)[:64]}")
                verify_upload(statement, self._enrolled[hospital].public_key(),
                              session_id=self.config.session_id, payload_sha256=bytes.fromhex(sha),
                              hospital=hospital, max_age_s=MAX_SKEW_S)
            except SecureAFLError as e:
                self.refuse("upload", None, e, details, peer=peer)
                raise
            except (TypeError, ValueError, KeyError) as e:
                err = MalformedPayload(f"upload statement unusable: {type(e).__name__}")
                self.refuse("upload", None, err, details, peer=peer)
                raise err from None
            try:
                self._check_open()
                if len(payload) > self.config.max_upload_bytes:
                    raise TooLarge(f"payload of {len(payload)} bytes exceeds the cap of "
                                   f"{self.config.max_upload_bytes}")
                st = verify_upload(statement, self._enrolled[hospital].public_key(),
                                   session_id=self.config.session_id, params_digest=self.params.digest(),
                                   payload_sha256=bytes.fromhex(sha), hospital=hospital, max_age_s=MAX_SKEW_S)
                if not self.store.claim_nonce("upload:" + st["nonce"], "hospital:" + hospital):
                    raise ReplayedContribution("this upload statement was already presented")
                if self.store.has_upload(hospital):
                    raise DuplicateContribution(f"{hospital} already contributed to this session")
                self._check_stage_allows_upload(hospital)
                # each backend's own door (tag or seed statement, envelope, commitment): the words it opened,
                # where it opened any, feed the running sum
                if self._door is None or self._door.params is not self.params:
                    self._door = get_backend(self.params)
                opened = self._door.admit(payload, tag, hospital=hospital,
                                          identity_pub=self._enrolled[hospital].public_key(), payload_sha256=sha)
                if hospital in self._in_flight:
                    raise DuplicateContribution(f"an upload of {hospital} is being added already")
            except SecureAFLError as e:
                self.refuse("upload", hospital, e, details)
                raise
            except (TypeError, ValueError, KeyError) as e:
                err = MalformedPayload(f"upload statement unusable: {type(e).__name__}")
                self.refuse("upload", hospital, err, details)
                raise err from None
            self._in_flight.add(hospital)
        try:
            # outside the lock: the summing workers check and add up to W uploads at once
            try:
                # the words the upload check opened, where the sum runs in this process
                self._combine_upload(hospital, opened if opened is not None and self._combiner.sums_here
                                     else payload)
            except SecureAFLError as e:
                with self._lock:
                    self.refuse("upload", hospital, e, details)
                    if isinstance(e, ServerBusy):  # the server's failure, not the upload's: it may come again
                        self.store.release_nonce("upload:" + st["nonce"], "hospital:" + hospital)
                    if getattr(self._combiner, "lost", None):
                        self._rebuild_when_drained(hospital)
                raise
            except (TypeError, ValueError, KeyError) as e:
                err = MalformedPayload(f"unusable contribution: {type(e).__name__}")
                with self._lock:
                    self.refuse("upload", hospital, err, details)
                raise err from None
            with self._lock:
                try:
                    self.store.put_blob(payload, sha)
                    self.store.insert_upload(hospital, sha, st, tag)
                except Exception:
                    # not stored, so not accepted: the running sum holds it, so it is summed again from disk
                    self._rebuild_when_drained(hospital)
                    raise
                return self._finish_acceptance(hospital, sha)
        finally:
            with self._lock:
                self._in_flight.discard(hospital)
                self._drained.notify_all()

    def _rebuild_when_drained(self, hospital: str) -> None:
        """Sum the stored uploads again once no other upload is being added (they would be added to the
        running sum being replaced). Called with the lock held, by the upload ``hospital`` in flight."""
        self._in_flight.discard(hospital)
        self._drained.wait_for(lambda: not self._in_flight)
        self._rebuild()

    def _finish_acceptance(self, hospital: str, sha: str, *, recovered: bool = False) -> dict:
        # after a crash between the audit write and the receipt, the record is already there
        rec = self.audit.find("upload", hospital, payload_sha256=sha) if recovered else None
        if rec is None:
            rec = self.audit.append("upload", actor=hospital, outcome="accepted", session=self.config.session_id,
                                    details={"payload_sha256": sha, "recovered": recovered,
                                             "contributions": self.store.upload_count()})
        receipt = make_receipt(self._key, self.config.session_id, hospital, bytes.fromhex(sha), rec["seq"],
                               audit_head=rec["hash"])
        self.store.set_receipt(hospital, rec["seq"], receipt)
        log.info("[Stage upload] accepted %s (%d so far)", hospital, self.store.upload_count())
        return receipt

    def _check_open(self) -> None:
        if self.params is None:
            raise StageError("the session is not open yet (waiting for the key holder's public context)")
        if self.status == "released":
            raise RoundAlreadyClosed("the session's aggregate was released; it accepts nothing more")
        if self._closing:
            raise RoundAlreadyClosed("the session is being closed; it accepts nothing more")
        dl = self.deadline
        if dl is not None and time.time() > dl:
            raise DeadlinePassed("the session's upload deadline has passed")

    def _check_stage_allows_upload(self, hospital: str) -> None:
        """Hook for protocols with rounds before the upload (secagg overrides)."""

    def _combine_upload(self, hospital: str, payload: bytes) -> None:
        """Validate the body and add it to the running sum; a refused payload changes nothing. Called without
        the lock (the combiner is thread-safe)."""
        self._combiner.add(payload)

    def receipt(self, hospital: str) -> dict:
        for row in self.store.uploads():
            if row["hospital"] == hospital and row["receipt"]:
                return row["receipt"]
        raise NotFound(f"no accepted upload from {hospital}")

    # -- release ----------------------------------------------------------------------------------
    def close(self, party: str) -> dict:
        """Fix the aggregate and sign the manifest, if at least the release quorum contributed."""
        with self._lock:
            if self.status == "released":
                self._finish_release(party)
                return self.store.get_meta("manifest")
            self.flush_refusals()  # the summaries belong before the head the manifest pins
            try:
                if self.params is None:
                    raise StageError("nothing to close: the session never opened")
                # uploads already past their checks are accepted or refused before the sum is fixed; none start
                # while the lock is released for that wait (after it, the lock itself keeps them out)
                self._closing = True
                try:
                    self._drained.wait_for(lambda: not self._in_flight)
                finally:
                    self._closing = False
                if getattr(self._combiner, "lost", None):
                    self._rebuild()
                n = self.store.upload_count()
                q = self.release_policy.quorum
                if n < q:
                    raise InsufficientContributors(
                        f"{n} contributions, fewer than the release quorum q = {q} of the signed session "
                        f"(min_clients = {self.config.min_clients}, colluders = {self.release_policy.colluders}); "
                        "nothing is released")
                aggregate = self._final_aggregate()
                agg_sha = hashlib.sha256(aggregate).hexdigest()
                participants = []
                for row in self.store.uploads():
                    participants.append({**row["statement"],
                                         "identity_pub": self._enrolled[row["hospital"]].identity_pub})
                manifest = build_manifest(self._key, self.config.session_id, self.params.digest(), participants,
                                          bytes.fromhex(agg_sha), q,
                                          enrolled=pki.enrolled_keys(self._enrolled),
                                          audit={"seq": self.audit.next_seq - 1, "head": self.audit.head})
            except SecureAFLError as e:
                self.refuse("close", party, e)
                raise
            self.store.put_blob(aggregate)
            self.store.set_meta("aggregate_sha256", agg_sha)
            self.store.set_meta("manifest", manifest)
            self._finish_release(party)
            log.info("[Stage release] aggregate of %d contributions released", len(participants))
            return manifest

    def _finish_release(self, party: str) -> None:
        """The release record and the signed close record; once, also across a crash between them."""
        if self.store.get_meta("audit_close") is not None:
            return
        manifest = self.store.get_meta("manifest")
        agg_sha = manifest["aggregate_sha256"]
        names = sorted(p["hospital"] for p in manifest["participants"])
        rec = self.audit.find("release", None, aggregate_sha256=agg_sha)
        if rec is None:
            rec = self.audit.append("release", actor=party, outcome="accepted", session=self.config.session_id,
                                    details={"aggregate_sha256": agg_sha, "contributors": len(names),
                                             "participants": names})
        close = make_close_record(self._key, self.config.session_id, rec["seq"], rec["hash"], names)
        self.store.set_meta("audit_close", close)
        self._write_head_file()

    def _write_head_file(self) -> None:
        """``audit-head.json`` next to the log: what ``secure-afl audit verify --head`` takes."""

        tmp = self.dir / f".audit-head.{time.time_ns()}.tmp"
        write_file(tmp, json.dumps(self.audit_head(), indent=1).encode())
        os.replace(tmp, self.dir / "audit-head.json")

    def audit_head(self) -> dict:
        """The signed close record and, once the key holder finalized, its countersignature."""
        close = self.store.get_meta("audit_close")
        if close is None:
            raise StageError("the session has not closed; there is no audit head yet")
        return {"close": close, "countersign": self.store.get_meta("audit_countersign")}

    def store_countersign(self, party: str, body: bytes) -> dict:
        """The key holder's countersignature over the close record (sent at finalize)."""

        with self._lock:
            try:
                cs = parse_json(body, "countersignature")
                close = self.audit_head()["close"]
                verify_countersign(cs, self.lookup_pub(party), close)
                if cs.get("keyholder") != party.partition(":")[2]:
                    raise Forbidden("a key holder countersigns only in its own name")
            except SecureAFLError as e:
                self.refuse("audit_countersign", party, e)
                raise
            if self.store.get_meta("audit_countersign") is None:
                self.store.set_meta("audit_countersign", cs)
                self.audit.append("audit_countersigned", actor=party, outcome="accepted",
                                  session=self.config.session_id,
                                  details={"seq": close["seq"], "head": close["head"]})
                self._write_head_file()
            return self.audit_head()

    def _final_aggregate(self) -> bytes:
        return self._combiner.aggregate()

    def released(self) -> tuple[bytes, dict]:
        if self.status != "released":
            raise StageError("the aggregate has not been released")
        return self.store.get_blob(self.store.get_meta("aggregate_sha256")), self.store.get_meta("manifest")

    def masked_aggregate(self) -> bytes:
        """The released aggregate payload, for the key holder (plain, secagg)."""
        return self.released()[0]

    def contribution(self, hospital: str) -> bytes:
        """One accepted upload's payload bytes, for the key holder to verify and re-sum itself."""
        self.released()
        for row in self.store.uploads():
            if row["hospital"] == hospital:
                return self.store.get_blob(row["payload_sha256"])
        raise NotFound(f"no accepted upload from {hospital[:64]!r}")

    def tags(self) -> dict:
        """The participants' signed tag statements, for the key holder's aggregate check."""
        self.released()
        return {row["hospital"]: row["tag"] for row in self.store.uploads() if row["tag"] is not None}

    def shutdown(self) -> None:
        if self._combiner is not None:
            self._combiner.shutdown()
        self.flush_refusals()
        self.audit.close()
        self.store.close()
