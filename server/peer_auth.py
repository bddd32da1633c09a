"""Who is calling: a signed request or upload statement, bound to the TLS certificate enrolled for its signer,
with every refusal audited (as unauthenticated until the signature holds).

Functions over :class:`server.session_state.ServerSession`; they read ``config``, ``store``, ``roster``,
``enrolled`` and ``refusals``.
"""

from __future__ import annotations

from secure_afl.exceptions import Forbidden, MalformedPayload, ReplayedContribution, SecureAFLError, Unauthenticated
from secure_afl.protocol import MAX_SKEW_S, verify_request_digest
from secure_afl.signing import verify_upload

from .session_state import ServerSession

__all__ = ["authenticate", "authenticate_upload", "check_peer", "flush_refusals", "refuse"]


def check_peer(session: ServerSession, party: str, peer: dict | None) -> None:
    """The Ed25519 signer must be the party enrolled for the TLS certificate the client presented.

    ``peer`` is the transport's record of the connection (server/tls_server.py); ``None`` means
    the app is driven without a network transport (in-process tests), where there is no
    certificate to bind to.
    """
    if peer is None or not session.config.require_client_cert:
        return
    if peer.get("cert_sha256") != session.roster.enrolment(party).cert_sha256:
        raise Unauthenticated(f"the request is signed by {party!r} but the TLS client certificate is "
                              "not the one enrolled for it")


def authenticate(session: ServerSession, headers, method: str, path: str, body_sha256: str, *,
                 roles: tuple[str, ...], peer: dict | None = None) -> str:
    """Verify a signed request (body known by its digest); return the party.

    Refusals are audited as unauthenticated: until the signature and the
    certificate binding hold, the claimed party is only a claim.
    """
    try:
        st = verify_request_digest(headers, method, path, body_sha256, session.roster.lookup_pub)
        check_peer(session, st["party"], peer)
    except SecureAFLError as e:
        refuse(session, "request", None, e, {"method": method, "path": path[:200]}, peer=peer)
        raise
    party = st["party"]
    try:
        role = party.partition(":")[0]
        if role not in roles:
            raise Forbidden(f"{role} may not call {method} {path}")
        if not session.store.claim_nonce(st["nonce"], party):
            raise ReplayedContribution("request nonce was already used")
        return party
    except SecureAFLError as e:
        refuse(session, "request", party, e, {"method": method, "path": path[:200]}, peer=peer)
        raise


def authenticate_upload(session: ServerSession, statement, peer: dict | None = None) -> str:
    """The hospital whose signed upload statement this is (checked before the body is read)."""
    try:
        if not isinstance(statement, dict):
            raise MalformedPayload("the upload statement is not a JSON object")
        hospital = statement.get("hospital")
        if not isinstance(hospital, str) or hospital not in session.enrolled:
            raise session.roster.not_in_session(f"hospital:{str(hospital)[:64]}")
        sha = statement.get("payload_sha256")
        if not isinstance(sha, str) or len(sha) != 64:
            raise MalformedPayload("the upload statement lacks a payload digest")
        verify_upload(statement, session.enrolled[hospital].public_key(), session_id=session.config.session_id,
                      payload_sha256=bytes.fromhex(sha), hospital=hospital, max_age_s=MAX_SKEW_S)
        check_peer(session, f"hospital:{hospital}", peer)
        return hospital
    except SecureAFLError as e:
        refuse(session, "upload", None, e, peer=peer)
        raise
    except (TypeError, ValueError, KeyError) as e:
        err = MalformedPayload(f"upload statement unusable: {type(e).__name__}")
        refuse(session, "upload", None, err, peer=peer)
        raise err from None


def refuse(session: ServerSession, event: str, actor: str | None, err: SecureAFLError, details: dict | None = None,
           *, peer: dict | None = None) -> None:
    """Audit a refusal (:meth:`server.refusals.RefusalLog.refuse`). ``actor``: an authenticated identity,
    or None."""
    session.refusals.refuse(event, actor, err, details, peer=peer)


def flush_refusals(session: ServerSession) -> None:
    session.refusals.flush()
