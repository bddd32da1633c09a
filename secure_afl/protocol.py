"""Wire vocabulary shared by the hospital client, the server and the key holder.

No network code: header names and the signed-request scheme (refusal reasons
and their HTTP status live with the exception classes in
:mod:`secure_afl.exceptions`). Every request that changes state or reads
something non-public carries an Ed25519 signature by the caller's identity
key (mTLS authenticates the connection; the signature authenticates the
request itself and survives in the audit log):

    statement = {type: "request", v: 1, party: "<role>:<name>", method, path,
                 body_sha256, nonce (16 bytes hex), time (unix s)}
    X-SAFL-Party, X-SAFL-Time, X-SAFL-Nonce, X-SAFL-Signature headers

The server refuses a statement older than ``MAX_SKEW_S`` or whose nonce it has
seen before (replay), with a machine-readable reason.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
import time as _time
from typing import Callable, Mapping

from cryptography.exceptions import InvalidSignature as _CryptoInvalidSignature

from . import domains
from .exceptions import InvalidSignature, MalformedPayload, ReplayedContribution
from .encoding import canonical_json, parse_json

__all__ = ["H_BODY", "verify_request_digest", "H_PARTY", "H_TIME", "H_NONCE", "H_SIGNATURE", "H_UPLOAD", "H_TAG", "REQUEST_PREFIX",
           "SECAGG_REQUEST_PREFIX", "SECAGG_CONSISTENCY", "SECAGG_COMPLAINT", "MAX_SKEW_S",
           "sign_request", "verify_request", "API", "context_publication",
           "parse_context_publication"]

H_PARTY = "x-safl-party"
H_TIME = "x-safl-time"
H_NONCE = "x-safl-nonce"
H_SIGNATURE = "x-safl-signature"
H_UPLOAD = "x-safl-upload"
H_TAG = "x-safl-tag"
# the signed body digest travels ahead of the body, so the server checks the signature before it
# reads a byte of the body and then checks the streamed body against the digest
H_BODY = "x-safl-body-sha256"
REQUEST_PREFIX = domains.REQUEST
SECAGG_REQUEST_PREFIX = domains.SECAGG_REQUEST  # server's signature on each secagg stage request
# Bonawitz et al.'s consistency check: the first half of the secagg unmask stage, run by the service
SECAGG_CONSISTENCY = "consistency"
# a holder's proof, instead of its masked input, that a dealer dealt it shares off the dealer's signed check
SECAGG_COMPLAINT = "complaint"
MAX_SKEW_S = 300

API = "/v1"

def _statement(party: str, method: str, path: str, body_sha256: str, nonce: str, t: int) -> dict:
    return {"type": "request", "v": 1, "party": party, "method": method.upper(), "path": path,
            "body_sha256": body_sha256, "nonce": nonce, "time": int(t)}


def sign_request(identity_key, party: str, method: str, path: str, body: bytes = b"", *,
                 nonce: bytes | None = None, timestamp: float | None = None) -> dict[str, str]:
    """Headers that authenticate one request as ``party`` ("role:name")."""
    n = (nonce if nonce is not None else secrets.token_bytes(16)).hex()
    t = int(_time.time() if timestamp is None else timestamp)
    st = _statement(party, method, path, hashlib.sha256(body).hexdigest(), n, t)
    sig = identity_key.sign(REQUEST_PREFIX + canonical_json(st)).hex()
    return {H_PARTY: party, H_TIME: str(t), H_NONCE: n, H_SIGNATURE: sig, H_BODY: st["body_sha256"]}


def verify_request(headers: Mapping[str, str], method: str, path: str, body: bytes,
                   lookup_pub: Callable[[str], object], *, now: float | None = None,
                   max_skew_s: float = MAX_SKEW_S) -> dict:
    """Return the verified statement, or raise a typed error.

    ``lookup_pub(party)`` returns the party's Ed25519 public key or raises
    (e.g. PolicyViolation for an unknown party). Nonce uniqueness is the
    caller's job (it must persist seen nonces).
    """
    return verify_request_digest(headers, method, path, hashlib.sha256(body).hexdigest(), lookup_pub,
                                 now=now, max_skew_s=max_skew_s)


def verify_request_digest(headers: Mapping[str, str], method: str, path: str, body_sha256: str,
                          lookup_pub: Callable[[str], object], *, now: float | None = None,
                          max_skew_s: float = MAX_SKEW_S) -> dict:
    """:func:`verify_request` for a body known only by its SHA-256 (hex) so far."""
    if not isinstance(body_sha256, str) or len(body_sha256) != 64 or \
            any(c not in "0123456789abcdef" for c in body_sha256):
        raise MalformedPayload("body digest must be 32 bytes of lower-case hex")
    try:
        party = headers[H_PARTY]
        t = int(headers[H_TIME])
        nonce = headers[H_NONCE]
        sig = bytes.fromhex(headers[H_SIGNATURE])
    except (KeyError, ValueError, TypeError):
        raise MalformedPayload("missing or malformed request-signature headers") from None
    if len(nonce) != 32 or any(c not in "0123456789abcdef" for c in nonce):
        raise MalformedPayload("request nonce must be 16 bytes of lower-case hex")
    pub = lookup_pub(party)
    st = _statement(party, method, path, body_sha256, nonce, t)
    try:
        pub.verify(sig, REQUEST_PREFIX + canonical_json(st))
    except _CryptoInvalidSignature:
        raise InvalidSignature() from None
    current = _time.time() if now is None else now
    if abs(current - t) > max_skew_s:
        skew = t - current
        raise ReplayedContribution(
            f"request timestamp outside the accepted window: the request's clock is {abs(skew):.0f} s "
            f"{'ahead of' if skew > 0 else 'behind'} the server's (at most {max_skew_s:.0f} s is accepted): set "
            "the clocks of both machines right (NTP) and retry")
    return st


def context_publication(public_context: bytes, tag_public_key: str, params_signature: str) -> bytes:
    """The key holder's publish body: the CKKS public context, its per-session tag key, and its
    signature over the parameters they bind (:mod:`secure_afl.keyholder_params`)."""
    return json.dumps({"public_context": base64.b64encode(public_context).decode(),
                       "tag_public_key": tag_public_key, "params_signature": params_signature}).encode()


def parse_context_publication(body: bytes) -> tuple[bytes, str, str]:
    """Inverse of :func:`context_publication`; :class:`MalformedPayload` if it is not one."""
    try:
        msg = parse_json(body, "publish body")
        if not isinstance(msg, dict):
            raise ValueError
        context = base64.b64decode(msg["public_context"], validate=True)
        tag_key = str(msg["tag_public_key"]).lower()
        signature = str(msg["params_signature"]).lower()
        if len(bytes.fromhex(tag_key)) != 32 or len(bytes.fromhex(signature)) != 64:
            raise ValueError
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise MalformedPayload("publish body must be JSON with a base64 public_context, a 32-byte hex "
                               "tag_public_key and a 64-byte hex params_signature") from None
    return context, tag_key, signature
