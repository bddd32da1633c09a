"""The key holder's signature over an HE (ckks, bfv) session's parameters, checked by everyone who encrypts.

The server relays the key holder's public context and tag key to the
hospitals; a server that swaps them for keys of its own would read every
upload. So the key holder signs ``(session id, SessionParams.digest())`` with
its Ed25519 identity key, and the digest covers the CKKS parameters, the hash
of the public context, the tag key, the layout, gamma and the bounds. A
hospital verifies that signature against the key holder's identity from its
own PKI directory (:func:`secure_afl.pki.pinned_identity`) and checks the context bytes
and the tag key against the signed digest before it encrypts anything.
"""

from __future__ import annotations

from cryptography.exceptions import InvalidSignature as _CryptoInvalidSignature
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from . import domains
from . import pki
from .exceptions import InvalidSignature, ParameterMismatch
from .params import SessionParams
from .encoding import canonical_json
from secure_afl.backends import get_backend
from secure_afl.tagging import TAG_KEY_PARAM

__all__ = ["PARAMS_SIGNATURE", "sign_session_params", "verify_session_params", "check_tag_public_key",
           "check_published_keys"]

PARAMS_SIGNATURE = "keyholder_params_signature"
_PREFIX = domains.KEYHOLDER_PARAMS


def _statement(params: SessionParams) -> bytes:
    return _PREFIX + canonical_json({"session_id": params.session_id, "params_digest": params.digest().hex()})


def sign_session_params(identity_key, params: SessionParams) -> str:
    """Key holder: hex Ed25519 signature over the session id and the full parameter digest."""
    return identity_key.sign(_statement(params)).hex()


def verify_session_params(params: SessionParams, signature, keyholder_pub) -> None:
    """Raise :class:`InvalidSignature` unless ``signature`` is the key holder's over ``params``."""
    try:
        sig = bytes.fromhex(signature)
    except (TypeError, ValueError):
        raise InvalidSignature("the session parameters carry no key-holder signature") from None
    try:
        keyholder_pub.verify(sig, _statement(params))
    except _CryptoInvalidSignature:
        raise InvalidSignature("the session parameters are not signed by the pinned key holder") from None


def check_tag_public_key(tag_public_key) -> bytes:
    """Refuse a degenerate X25519 tag key (all-zero or another small-order point).

    Sealing to a small-order point yields a shared secret the server can
    guess, so the tag box would protect nothing. ``cryptography`` refuses an
    exchange whose result is all-zero, which is exactly the small-order case.
    """
    try:
        raw = bytes.fromhex(tag_public_key) if isinstance(tag_public_key, str) else bytes(tag_public_key)
        if len(raw) != 32:
            raise ValueError
        X25519PrivateKey.generate().exchange(X25519PublicKey.from_public_bytes(raw))
    except (TypeError, ValueError):
        raise ParameterMismatch("the tag key is not a usable X25519 public key (small-order or malformed)") from None
    return raw


def check_published_keys(params: SessionParams, public_context: bytes) -> None:
    """The context and tag key are the ones the signed digest names, and usable (no secret key in the context)."""
    from .backends.ckks import PUBLIC_CONTEXT_KEY

    backend = get_backend(params)  # ckks or bfv: the same binding, each scheme's own context checks
    if backend.scheme.context_sha256(public_context) != params.backend_params.get(PUBLIC_CONTEXT_KEY):
        raise ParameterMismatch("the public context is not the one the key holder signed")
    backend.scheme.load_context(public_context, backend.ckks_, secret=False)  # SecretKeyNotAllowed, wrong parms
    check_tag_public_key(params.backend_params.get(TAG_KEY_PARAM))


