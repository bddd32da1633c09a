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

import logging
import threading
import time
from pathlib import Path

from secure_afl import pki
from secure_afl.audit_log import AuditLog
from secure_afl.backends import get_backend, he_module
from secure_afl.cohort import release_policy
from secure_afl.exceptions import DeadlinePassed, MissingEnrolment, RoundAlreadyClosed, SecureAFLError, StageError
from secure_afl.params import KEYED_BACKENDS, SessionParams
from secure_afl.protocol import parse_context_publication
from secure_afl.session.relay import check_same
from secure_afl.session.signed import load_signed

from .closing import ReleaseStage
from .config import ServerConfig
from .intake import UploadIntake
from .peer_auth import PeerAuthentication
from .refusals import RefusalLog
from .running_sum import RunningSum
from .session_parties import SessionRoster
from .status import StatusSummary, session_info, status_view
from .store import Store

__all__ = ["AggregationServer", "DeadlinePassed"]

log = logging.getLogger("secure_afl.server")


class AggregationServer(PeerAuthentication, RunningSum, UploadIntake, ReleaseStage):
    """One session's server state machine (no HTTP here; see server/app.py): its set-up, state and the key
    holder's public context here; who is calling (:mod:`server.peer_auth`), the running sum
    (:mod:`server.running_sum`), uploads (:mod:`server.intake`) and the release (:mod:`server.closing`) in
    the mixins it is built from."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.dir = Path(config.data_dir) / config.session_id
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.store = Store(self.dir)
        self.party = pki.load_party(config.pki_dir, "server", config.name)
        self._key = self.party.identity_key()
        self.identity_pub_hex = pki.public_key_hex(self._key.public_key())
        self.status_summary = StatusSummary()  # folded from the log as it is read and appended, for the status view
        self.audit = AuditLog(self.dir / "audit.jsonl", signing_key=self._key, on_record=self.status_summary.observe)
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
        self.roster = SessionRoster(config.session_id, config.keyholder, self._enrolled, self._keyholders,
                                    server=self.party.enrolment())
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


    # -- public state ----------------------------------------------------------------
    @property
    def status(self) -> str:
        if self.store.get_meta("manifest") is not None:
            return "released"
        if self.params is None:
            return "awaiting_context"
        return "open"

    def info(self) -> dict:
        """The public session info every party reads (:func:`server.status.session_info`)."""
        return session_info(self)

    def session_status(self, party: str, peer: dict | None) -> dict:
        """Where the session stands, as much of it as ``party`` may see (:func:`server.status.status_view`)."""
        return status_view(self, party, peer)


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


    def shutdown(self) -> None:
        if self._combiner is not None:
            self._combiner.shutdown()
        self.flush_refusals()
        self.audit.close()
        self.store.close()
