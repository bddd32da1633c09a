"""The aggregation server role: blind, streaming, durable, audited.

Runs on: the consortium's aggregation server. Sees: enrolment records,
signatures, and protected payloads (CKKS ciphertexts under the key holder's
public key, or SecAgg masked vectors); with ``plain`` it sees plaintext
statistics (reference mode only). Trusted for availability, not for
confidentiality (threat_model/THREAT_MODEL.md).

Stages of a session, visible in :attr:`~server.session_state.ServerSession.status`:

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

This module opens a session (:func:`open_server`: the signed definition, the roster, the state rebuilt from
disk), takes the key holder's public context and shuts the session down; the state is one
:class:`~server.session_state.ServerSession` and every other stage is a module of functions over it.
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
from secure_afl.exceptions import MissingEnrolment, RoundAlreadyClosed, SecureAFLError, StageError
from secure_afl.params import KEYED_BACKENDS
from secure_afl.protocol import parse_context_publication
from secure_afl.session.relay import check_same
from secure_afl.session.signed import load_signed

from . import running_sum, secagg_round, split_round, status
from .config import ServerConfig
from .peer_auth import flush_refusals, refuse
from .refusals import RefusalLog
from .session_parties import SessionRoster
from .session_state import ServerSession, SplitState, StatusSummary
from .store import Store

__all__ = ["open_server", "publish_context", "shutdown"]

log = logging.getLogger("secure_afl.server")


def open_server(config: ServerConfig) -> ServerSession:
    """One session's server: its set-up checked against the operator's signed definition, its state rebuilt
    from what is durably stored, and (secagg) its stage clock started."""
    sdir = Path(config.data_dir) / config.session_id
    sdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = Store(sdir)
    party = pki.load_party(config.pki_dir, "server", config.name)
    key = party.identity_key()
    # folded from the log as it is read and appended: the status view never re-reads the log
    status_summary = StatusSummary()
    audit = AuditLog(sdir / "audit.jsonl", signing_key=key, on_record=lambda rec: status.observe_record(status_summary, rec))
    definition = _signed_definition(config)
    enrolled = _load_enrolled(config, definition)
    keyholders = pki.load_enrolments(config.pki_dir, role="keyholder")
    roster = SessionRoster(config.session_id, config.keyholder, enrolled, keyholders, server=party.enrolment())
    lock = threading.RLock()
    session = ServerSession(
        config=config, dir=sdir, store=store, party=party, key=key,
        identity_pub_hex=pki.public_key_hex(key.public_key()), audit=audit, definition=definition,
        release_policy=release_policy(definition), enrolled=enrolled, roster=roster, status_summary=status_summary,
        refusals=RefusalLog(audit, config.session_id, config.refusal_interval_s, roster.peer_party),
        lock=lock, drained=threading.Condition(lock),
        secagg=secagg_round.secagg_state(enrolled) if config.backend == "secagg" else None,
        split=SplitState() if config.backend == "split" else None)
    if store.get_meta("created_at") is None:
        store.set_meta("created_at", time.time())
        audit.append("session_created", actor=config.name, outcome="accepted", session=config.session_id,
                     details={"backend": config.backend, "min_clients": config.min_clients,
                              "hospitals": sorted(enrolled)})
    # in-memory state from SQLite and payload files, after a restart too
    running_sum.rebuild(session)
    if store.upload_count():
        audit.append("server_restarted", actor=config.name, outcome="accepted", session=config.session_id,
                     details={"recovered_uploads": store.upload_count(), "status": session.status})
    if session.secagg is not None:
        secagg_round.start_clock(session)
    return session


def _signed_definition(config: ServerConfig):
    """The operator-signed definition of this session; the server's own settings must agree with it."""
    signed = load_signed(config.pki_dir, config.session_id)
    check_same(signed.comparable(), config.definition.comparable(), what="",
               source=f"the server's session.toml ({config.session_id})")
    return signed


def _load_enrolled(config: ServerConfig, definition) -> dict:
    issued = pki.load_enrolments(config.pki_dir, role="hospital")
    names = definition.hospitals
    missing = [n for n in names if n not in issued]
    if missing:
        raise MissingEnrolment(f"hospitals {missing} are listed in the config but have no enrolment "
                               f"in {config.pki_dir}; issue them with `secure-afl pki issue`")
    return {n: issued[n] for n in names}


# -- ckks, bfv, split: the key holder publishes the public context ----------------------------
def publish_context(session: ServerSession, party: str, body: bytes) -> dict:
    """Key holder's signed ``{public_context, tag_public_key, params_signature}`` opens a keyed session.

    The parameters are recomputed here from the session config and must be
    the ones the key holder signed; a degenerate tag key or a context with a
    secret key is refused.
    """
    with session.lock:
        try:
            if session.config.backend not in KEYED_BACKENDS:
                raise StageError("this session does not use a public context")
            if session.params is not None:
                raise RoundAlreadyClosed("the public context is already published")
            from secure_afl.keyholder_params import check_tag_public_key, verify_session_params
            from secure_afl.tagging import TAG_KEY_PARAM

            bind_public_context = he_module(session.config.backend).bind_public_context
            context, tag_key, signature = parse_context_publication(body)
            # refuses secret-key contexts
            params = bind_public_context(session.definition.session_params(), context)
            check_tag_public_key(tag_key)
            params = params.with_backend_params(**{TAG_KEY_PARAM: tag_key})
            verify_session_params(params, signature, session.roster.lookup_pub(party))
            get_backend(params).combiner(public_context=context)
        except SecureAFLError as e:
            refuse(session, "publish_context", party, e)
            raise
        digest = session.store.put_blob(context)
        session.store.set_meta("public_context_sha256", digest)
        session.store.set_meta("params", params.to_dict())
        session.store.set_meta("params_signature", signature)
        session.params, session.public_context = params, context
        session.combiner = running_sum.new_combiner(session)
        session.audit.append("publish_context", actor=party, outcome="accepted", session=session.config.session_id,
                             details={"public_context_sha256": digest, "params_digest": params.digest().hex()})
        return status.session_info(session)


def shutdown(session: ServerSession) -> None:
    if session.secagg is not None:
        secagg_round.stop_clock(session)
    if session.split is not None:
        split_round.close_verifiers(session)
    if session.combiner is not None:
        session.combiner.shutdown()
    flush_refusals(session)
    session.audit.close()
    session.store.close()
