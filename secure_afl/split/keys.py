"""split's seed key and seed boxes: the key holder's per-session hybrid key (ML-KEM-768 + X25519) and the
hospital's HPKE box of its mask seed to it (RFC 9180 single shot)::

    box_k  = HPKE.SealBase(T_pub, info = SPLIT_SEED_HPKE || 0 || AD_k, aad = "", s_k)
             KEM ML-KEM-768 + X25519 (hybrid), KDF HKDF-SHA256, AEAD ChaCha20-Poly1305:
             enc (1120 bytes: 1088 ML-KEM ciphertext, 32 X25519) || ct (32) || tag (16) = 1168 bytes
    AD_k   = canonical JSON {session_id, params_digest, hospital, payload_sha256 = SHA-256(P_k)}

The hybrid KEM keeps a recorded box closed unless BOTH ML-KEM-768 and X25519
fall: a later quantum attack on X25519 alone opens nothing. The associated
data rides in HPKE's ``info`` (the one context input ``cryptography`` exposes
for single-shot HPKE); it enters the key schedule, so a box opens under
exactly the AD it was sealed for, as an AEAD's associated data would.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.mlkem import MLKEM768PrivateKey, MLKEM768PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from .. import domains
from ..encoding import canonical_json
from ..exceptions import InvalidContribution, MalformedPayload
from ..hazmat.prg import SEED_BYTES
from ..params import SessionParams

__all__ = ["SplitKeyPair", "generate_keys", "bind_public_context", "check_public_key", "seal_box", "open_box",
           "seed_private_key", "seal_seed", "open_seed", "refuse_retired", "PUBLIC_CONTEXT_KEY", "BOX_LEN", "ENC_LEN",
           "PUBLIC_KEY_LEN", "SECRET_KEY_LEN", "SEED_BOX_FORMAT", "seal_kept_seed", "open_kept_seed"]

PUBLIC_CONTEXT_KEY = "public_context_sha256"
#: RFC 9180 HPKE, hybrid KEM ML-KEM-768 + X25519, HKDF-SHA256, ChaCha20-Poly1305
_SUITE = hpke.Suite(hpke.KEM.MLKEM768_X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
SEED_BOX_FORMAT = "HPKE (RFC 9180) MLKEM768-X25519 / HKDF-SHA256 / ChaCha20-Poly1305"
_MLKEM_PUB, _MLKEM_SEED, _X25519 = 1184, 64, 32
#: the KEM's encapsulated key: 1088 bytes of ML-KEM-768 ciphertext and a 32-byte X25519 share
ENC_LEN = hpke.KEM.MLKEM768_X25519.enc_length()
BOX_LEN = ENC_LEN + SEED_BYTES + 16
#: the key holder's public seed key: ML-KEM-768 encapsulation key || X25519 public key
PUBLIC_KEY_LEN = _MLKEM_PUB + _X25519
#: its secret: the 64-byte ML-KEM-768 seed (d || z) || the X25519 private key
SECRET_KEY_LEN = _MLKEM_SEED + _X25519
#: the retired box (X25519 + HKDF-SHA256 + ChaCha20-Poly1305 by hand): refused by name, never opened
_RETIRED_BOX_LEN = 32 + SEED_BYTES + 16
_RETIRED_FORMAT = "X25519 + HKDF-SHA256 + ChaCha20-Poly1305 (the retired hand-built seed box, 80 bytes)"
_HPKE_INFO = domains.SPLIT_SEED_HPKE


@dataclass(frozen=True)
class SplitKeyPair:
    """The key holder's per-session hybrid seed key (ML-KEM-768 + X25519): :data:`SECRET_KEY_LEN` secret bytes,
    :data:`PUBLIC_KEY_LEN` public bytes (the public context)."""

    secret_context: bytes
    public_context: bytes


def generate_keys(params: SessionParams) -> SplitKeyPair:
    """Key holder: a FRESH hybrid ML-KEM-768 + X25519 key for this session's seed boxes."""
    mk, xk = MLKEM768PrivateKey.generate(), X25519PrivateKey.generate()
    return SplitKeyPair(mk.private_bytes_raw() + xk.private_bytes_raw(),
                        mk.public_key().public_bytes_raw() + xk.public_key().public_bytes_raw())


def check_public_key(public_context: bytes) -> bytes:
    if not isinstance(public_context, (bytes, bytearray)):
        raise MalformedPayload("a split public context is a byte string")
    raw = bytes(public_context)
    if len(raw) == 32:
        raise MalformedPayload(f"a 32-byte X25519 seed key is the retired {_RETIRED_FORMAT} format; this "
                               f"session's seed key is {PUBLIC_KEY_LEN} bytes for {SEED_BOX_FORMAT}")
    if len(raw) != PUBLIC_KEY_LEN:
        raise MalformedPayload(f"a split public context is one {PUBLIC_KEY_LEN}-byte ML-KEM-768 + X25519 key")
    try:  # a small-order X25519 point would drop the classical half: refuse it here, not at the first upload
        MLKEM768PublicKey.from_public_bytes(raw[:_MLKEM_PUB])
        X25519PrivateKey.generate().exchange(X25519PublicKey.from_public_bytes(raw[_MLKEM_PUB:]))
    except ValueError:
        raise InvalidContribution() from None
    return raw


def _public_key(raw: bytes) -> hpke.MLKEM768X25519PublicKey:
    return hpke.MLKEM768X25519PublicKey(MLKEM768PublicKey.from_public_bytes(raw[:_MLKEM_PUB]),
                                        X25519PublicKey.from_public_bytes(raw[_MLKEM_PUB:]))


def seed_private_key(raw) -> hpke.MLKEM768X25519PrivateKey:
    """The key holder's HPKE private key from its secret context (``raw``), or ``raw`` itself if it is that key
    already: deriving the ML-KEM-768 key from its seed costs half of one box's opening, so a key holder that
    opens many boxes builds it once."""
    if isinstance(raw, hpke.MLKEM768X25519PrivateKey):
        return raw
    raw = bytes(raw)
    if len(raw) != SECRET_KEY_LEN:
        raise MalformedPayload(f"a split secret context is {SECRET_KEY_LEN} bytes (ML-KEM-768 seed || X25519 key)")
    return hpke.MLKEM768X25519PrivateKey(MLKEM768PrivateKey.from_seed_bytes(raw[:_MLKEM_SEED]),
                                         X25519PrivateKey.from_private_bytes(raw[_MLKEM_SEED:]))


def bind_public_context(params: SessionParams, public_context: bytes) -> SessionParams:
    return params.with_backend_params(
        **{PUBLIC_CONTEXT_KEY: hashlib.sha256(check_public_key(public_context)).hexdigest()})



def _ad(params: SessionParams, hospital: str, payload_sha256: str) -> bytes:
    return canonical_json({"session_id": params.session_id, "params_digest": params.digest().hex(),
                           "hospital": hospital, "payload_sha256": payload_sha256})


def _info(ad: bytes) -> bytes:
    return _HPKE_INFO + b"\0" + ad


def refuse_retired(box_len: int, what: str) -> None:
    if box_len == _RETIRED_BOX_LEN:
        raise MalformedPayload(f"{what} is sealed in the retired {_RETIRED_FORMAT} format; this session takes "
                               f"{SEED_BOX_FORMAT} boxes of {BOX_LEN} bytes")


def seal_box(public_context: bytes, ad: bytes, seed: bytes) -> bytes:
    """HPKE single-shot SealBase of ``seed`` to the hybrid seed key, ``info = SPLIT_SEED_HPKE || 0 || ad``."""
    return _SUITE.encrypt(bytes(seed), _public_key(check_public_key(public_context)), info=_info(ad))


def open_box(secret_key: bytes, ad: bytes, box: bytes, what: str = "a seed box") -> bytes:
    """Inverse of :func:`seal_box`: the seed, or :class:`MalformedPayload` (a retired or mis-sized box) or
    :class:`InvalidContribution` (another key or another ``ad``). ``secret_key``: the secret context, or the
    key :func:`seed_private_key` built from it."""
    box = bytes(box)
    refuse_retired(len(box), what)
    if len(box) != BOX_LEN:
        raise MalformedPayload(f"{what} has the wrong length")
    try:
        seed = _SUITE.decrypt(box, seed_private_key(secret_key), info=_info(ad))
    except (InvalidTag, ValueError):
        seed = None
    if seed is None or len(seed) != SEED_BYTES:
        raise InvalidContribution(f"{what} does not open under this key and associated data")
    return seed


def seal_seed(params: SessionParams, public_context: bytes, hospital: str, payload_sha256: str,
              seed: bytes) -> bytes:
    """Hospital: the HPKE box of ``seed`` to the key holder's seed key, AD = (session, params, hospital, hash)."""
    return seal_box(public_context, _ad(params, hospital, payload_sha256), seed)


def open_seed(params: SessionParams, secret_key: bytes, hospital: str, payload_sha256: str, box: bytes) -> bytes:
    """Key holder: the seed in ``box``, if it was sealed for this session, hospital and payload hash;
    else :class:`InvalidContribution` naming the hospital."""
    try:
        return open_box(secret_key, _ad(params, hospital, payload_sha256), box, f"{hospital}'s seed box")
    except InvalidContribution:
        raise InvalidContribution(f"{hospital}'s seed box does not open for this session, hospital and "
                                  "payload (replayed from another upload, or tampered)") from None


# -- the hospital's own seed, kept at rest beside its receipt ------------------------------------------------


def _kept_seed_key(identity_key) -> bytes:
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    raw = identity_key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                     serialization.NoEncryption())
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=domains.SPLIT_KEPT_SEED_KEY).derive(raw)


def _kept_seed_ad(session_id: str, hospital: str, payload_sha256: str) -> bytes:
    return domains.SPLIT_KEPT_SEED_AD + canonical_json({"session_id": session_id, "hospital": hospital,
                                                        "payload_sha256": payload_sha256})


def seal_kept_seed(identity_key, session_id: str, hospital: str, payload_sha256: str, seed: bytes) -> bytes:
    """Hospital: its mask seed sealed at rest (AES-256-GCM under a key derived from its own identity key, bound to
    the upload): with it, the hospital recomputes the key holder's verifier message to dispute a refusal
    (:func:`secure_afl.split.roles.dispute`). ``nonce || ciphertext``."""
    import os

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(12)
    return nonce + AESGCM(_kept_seed_key(identity_key)).encrypt(
        nonce, bytes(seed), _kept_seed_ad(session_id, hospital, payload_sha256))


def open_kept_seed(identity_key, session_id: str, hospital: str, payload_sha256: str, sealed: bytes) -> bytes:
    """The seed :func:`seal_kept_seed` sealed for this upload; :class:`MalformedPayload` otherwise (another
    hospital's key, another upload, or altered bytes)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        return AESGCM(_kept_seed_key(identity_key)).decrypt(
            bytes(sealed[:12]), bytes(sealed[12:]), _kept_seed_ad(session_id, hospital, payload_sha256))
    except (InvalidTag, ValueError):
        raise MalformedPayload(f"the kept seed of {hospital}'s upload does not open under its identity key for this "
                               "upload") from None
