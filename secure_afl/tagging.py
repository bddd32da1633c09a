"""Aggregate tags: the key holder checks that it decrypted the sum of the manifest's contributions.

Why. A CKKS ciphertext is malleable by anyone with the public key. A malicious
server could take one hospital's ciphertext, add an encryption of its own
choosing (contributor counter K, ``(K-1) gamma`` on the Gram diagonal) and
present it with a manifest of K genuine, signed uploads as "the aggregate":
every signature and sanity check would pass, and the key holder would publish
one hospital's model (threat_model/THREAT_MODEL.md, T25).

How. Each hospital k draws a fresh random tag ``r_k`` (4 values, uniform in
``[-H/2, H/2]`` with H the declared per-hospital bound, so the CKKS parameters
are unaffected), puts it in the ``tag`` slots of its packed vector (encrypted
with everything else), and also sends it to the key holder:

    box_k = eph_pub || ChaCha20-Poly1305_{HKDF(X25519(eph, T_pub))}(r_k)

where ``T_pub`` is the key holder's per-session tag key (bound into the
session parameters), the AEAD associated data binds session, parameters and
hospital, and the hospital signs ``(session, params, hospital, payload hash,
box)`` with its Ed25519 identity. After decrypting, the key holder requires

    | tag(aggregate) - sum_{k in manifest} r_k |  <=  E     (each of the 4 slots)

with E the CKKS error bound. To pass with fewer ciphertexts than the manifest
claims, the server would have to add ``sum_{k not included} r_k`` without
knowing it (the boxes are sealed to the key holder and are not malleable); it
succeeds with probability about ``(2E / H)^4`` per attempt, and a failed check
blocks the key for good (:class:`secure_afl.release_checks.ReleaseLedger`).

Runs on: hospital (:func:`new_tag`, :func:`seal_tag`, :func:`sign_tag`),
server (:func:`verify_tag` at upload), key holder (:func:`check_aggregate_tag`).
"""

from __future__ import annotations

import secrets
from typing import Mapping

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from . import domains
from .exceptions import DecryptionRefused, InvalidContribution, InvalidSignature, MalformedPayload
from .packing import TAG_SLOTS
from .params import SessionParams
from .encoding import canonical_json
from .signing import box_statement, sign_box_statement, verify_box_statement

__all__ = ["TAG_KEY_PARAM", "new_tag", "generate_tag_key", "seal_tag", "open_tag", "sign_tag", "verify_tag",
           "check_aggregate_tag"]

TAG_KEY_PARAM = "tag_public_key"
_SIG_PREFIX = domains.TAG
_KDF_INFO = domains.TAG_BOX
_BOX_LEN = 32 + 8 * TAG_SLOTS + 16


def _tag_public_key(params: SessionParams) -> bytes:
    value = params.backend_params.get(TAG_KEY_PARAM)
    try:
        raw = bytes.fromhex(value)
    except (TypeError, ValueError):
        raw = b""
    if len(raw) != 32:
        raise MalformedPayload("session parameters carry no key-holder tag key")
    return raw


def new_tag(params: SessionParams) -> np.ndarray:
    """A fresh random tag, uniform in [-H/2, H/2]^4 (H = the declared per-hospital bound)."""
    half = 0.5 * params.bounds.hospital_bound(params.gamma)
    return np.random.default_rng(secrets.randbits(128)).uniform(-half, half, TAG_SLOTS)


def generate_tag_key() -> tuple[bytes, str]:
    """Key holder: a fresh X25519 tag key for one session -> (private raw bytes, public hex)."""
    sk = X25519PrivateKey.generate()
    raw = sk.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return raw, sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def _aead(shared: bytes, params: SessionParams, hospital: str) -> tuple[ChaCha20Poly1305, bytes]:
    ad = canonical_json({"session_id": params.session_id, "params_digest": params.digest().hex(),
                         "hospital": hospital})
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_KDF_INFO + b"\0" + ad).derive(shared)
    return ChaCha20Poly1305(key), ad


def seal_tag(params: SessionParams, hospital: str, tag: np.ndarray) -> bytes:
    """Hospital: seal ``tag`` to the key holder's tag key (fresh ephemeral key; nonce 0 is safe)."""
    peer = X25519PublicKey.from_public_bytes(_tag_public_key(params))
    eph = X25519PrivateKey.generate()
    aead, ad = _aead(eph.exchange(peer), params, hospital)
    body = np.asarray(tag, dtype="<f8").tobytes()
    if len(body) != 8 * TAG_SLOTS:
        raise MalformedPayload(f"a tag has {TAG_SLOTS} values")
    return eph.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) + aead.encrypt(bytes(12), body, ad)


def open_tag(params: SessionParams, hospital: str, box: bytes, tag_private_key: bytes) -> np.ndarray:
    """Key holder: open one hospital's tag box. A wrong box raises :class:`InvalidContribution`."""
    if len(box) != _BOX_LEN:
        raise MalformedPayload("tag box has the wrong length")
    sk = X25519PrivateKey.from_private_bytes(tag_private_key)
    try:
        aead, ad = _aead(sk.exchange(X25519PublicKey.from_public_bytes(box[:32])), params, hospital)
        body = aead.decrypt(bytes(12), box[32:], ad)
    except (InvalidTag, ValueError):
        raise InvalidContribution() from None
    return np.frombuffer(body, dtype="<f8").astype(np.float64)


def _statement(params: SessionParams, hospital: str, payload_sha256: str, box: bytes) -> dict:
    return box_statement("tag", 1, params, hospital, payload_sha256, box)


def sign_tag(identity_key, params: SessionParams, hospital: str, payload_sha256: str, box: bytes) -> dict:
    """Hospital: the signed tag statement sent with the upload."""
    return sign_box_statement(identity_key, _SIG_PREFIX, _statement(params, hospital, payload_sha256, box))


def verify_tag(statement: Mapping, identity_pub, params: SessionParams, hospital: str,
               payload_sha256: str) -> bytes:
    """Check a tag statement for this session, hospital and payload; return the box."""
    return verify_box_statement(statement, identity_pub, _SIG_PREFIX,
                                lambda box: _statement(params, hospital, payload_sha256, box), _BOX_LEN,
                                f"{hospital}'s tag statement")


def check_aggregate_tag(params: SessionParams, revealed_tag: np.ndarray, manifest: Mapping,
                        statements: Mapping[str, Mapping], enrolled: Mapping, tag_private_key: bytes,
                        abs_tol: float) -> dict:
    """Key holder: the decrypted tag must be the sum of the manifest participants' tags.

    ``statements`` maps hospital -> its signed tag statement (from the server);
    ``enrolled`` maps hospital -> Ed25519 public key. Raises
    :class:`DecryptionRefused` if a participant's tag is missing or invalid, or
    if the sums differ by more than ``abs_tol`` in any slot.
    """
    total = np.zeros(TAG_SLOTS)
    for p in manifest["participants"]:
        h = p["hospital"]
        if h not in statements:
            raise DecryptionRefused(f"no signed tag for participant {h}; the aggregate cannot be checked")
        box = verify_tag(statements[h], enrolled[h], params, h, p["payload_sha256"])
        total += open_tag(params, h, box, tag_private_key)
    # pass/fail only: the gap is a decrypted float (under ckks, one that a crafted upload can steer)
    if not bool(np.all(np.abs(np.asarray(revealed_tag, dtype=np.float64) - total) <= abs_tol)):
        raise DecryptionRefused(
            "the decrypted aggregate does not carry the sum of the manifest's tags within the decryption's "
            "proved bound: it is a forged sum, or a signed upload whose ciphertext is not a fresh encryption "
            "of its declared tag (honest data cannot cause this). Release refused.",
            reason="aggregate_forged")
    return {"passed": True, "tag_tolerance": abs_tol}
