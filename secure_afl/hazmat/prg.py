"""Mask generator (ChaCha20 keystream) and pairwise seed agreement (X25519 + HKDF).

.. warning::

    This is a "Hazardous Materials" module. You should **ONLY** use it if
    you're 100% absolutely sure that you know what you're doing because this
    module is full of land mines, dragons, and dinosaurs with laser guns.
    The recipe API is :mod:`secure_afl.secagg`.

Runs on: hospitals (masking) and the server (removing the masks of dropped
clients after reconstructing their keys). Sees: seeds only.

Mask expansion::

    PRG(seed, domain)[i] = LE64( ChaCha20(key=seed, counter=0, nonce=domain)(0^{8L}) [8i : 8i+8] )

over the *whole* 256-bit seed (Flower's SecAgg+ folds the seed to 32 bits
and feeds Mersenne Twister; we do not). ``domain`` is a 12-byte label so a
self-mask seed and a pairwise seed can never produce the same stream even if
they collided. The 32-bit block counter allows 2^32 * 64 bytes = 2^35 words.

Pairwise seed between parties ``u != v`` (the order of ``u`` and ``v`` does
not matter: both sides compute the same bytes)::

    s_uv = HKDF-SHA256(ikm = X25519(sk_u, pk_v), salt = None,
                       info = "secure-afl/secagg/v1/" + purpose + "/" + session_id
                              + "/" + min(u, v) + "/" + max(u, v), length = 32)
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .. import domains
from .._validation import check_int
from ..exceptions import InvalidContribution

__all__ = [
    "SEED_BYTES",
    "DOMAIN_SELF_MASK",
    "DOMAIN_PAIR_MASK",
    "DOMAIN_GRAPH",
    "DOMAIN_SPLIT_MASK",
    "MAX_WORDS",
    "expand",
    "add_expanded",
    "agree",
    "pairwise_info",
]

SEED_BYTES = 32
DOMAIN_SELF_MASK = domains.PRG_SELF_MASK
DOMAIN_PAIR_MASK = domains.PRG_PAIR_MASK
DOMAIN_GRAPH = domains.PRG_GRAPH
DOMAIN_SPLIT_MASK = domains.PRG_SPLIT_MASK
MAX_WORDS = (1 << 32) * 8  # 2^32 blocks of 64 bytes = 8 words each
_PURPOSES = ("mask", "share-enc")
_CHUNK = 1 << 16  # bytes of keystream per cipher call in expand


def _check_seed(seed) -> bytes:
    if not isinstance(seed, (bytes, bytearray, memoryview)):
        raise TypeError("seed must be bytes")
    seed = bytes(seed)
    if len(seed) != SEED_BYTES:
        raise ValueError(f"seed must be {SEED_BYTES} bytes, got {len(seed)}")
    return seed


def expand(seed: bytes, length: int, *, domain: bytes = DOMAIN_PAIR_MASK) -> np.ndarray:
    """Expand a 32-byte seed into ``length`` uniform uint64 words.

    Parameters
    ----------
    seed : bytes
        32 bytes, used whole as the ChaCha20 key.
    length : int
        Number of 64-bit words, ``0 <= length <= 2^35``.
    domain : bytes
        12-byte domain-separation nonce (:data:`DOMAIN_SELF_MASK`, ...).

    Returns
    -------
    words : ndarray of uint64, shape (length,)
        The keystream read as little-endian uint64 (writable, owned).
    """
    seed = _check_seed(seed)
    check_int("length", length, "expand", low=0, high=MAX_WORDS)
    if not isinstance(domain, bytes) or len(domain) != 12:
        raise ValueError("domain must be 12 bytes")
    enc = Cipher(algorithms.ChaCha20(seed, b"\x00\x00\x00\x00" + domain), mode=None).encryptor()
    # the keystream is written straight into the result from one small zero block (the stream goes on
    # across calls): three fresh 8L-byte buffers (zeros, ciphertext, writable copy) cost more than the cipher
    out = np.empty(length, dtype="<u8")
    view = memoryview(out).cast("B")
    zeros = bytes(min(_CHUNK, 8 * length))
    for i in range(0, 8 * length, _CHUNK):
        n = min(_CHUNK, 8 * length - i)
        enc.update_into(zeros[:n] if n < len(zeros) else zeros, view[i:i + n])
    return out.astype(np.uint64, copy=False)


def add_expanded(words: np.ndarray, seed: bytes, *, domain: bytes = DOMAIN_PAIR_MASK,
                 subtract: bool = False) -> np.ndarray:
    """``words += PRG(seed, domain)[:len(words)]`` (or ``-=``) mod 2^64, in place; returns ``words``.

    The same stream as :func:`expand`, added a block at a time, so masking or unmasking a vector of
    L words needs no second L-word array.
    """
    seed = _check_seed(seed)
    if not isinstance(words, np.ndarray) or words.dtype != np.uint64 or words.ndim != 1 \
            or not words.flags.c_contiguous or not words.flags.writeable:
        raise TypeError("words must be a writable contiguous 1-D uint64 array")
    check_int("length", words.shape[0], "add_expanded", low=0, high=MAX_WORDS)
    if not isinstance(domain, bytes) or len(domain) != 12:
        raise ValueError("domain must be 12 bytes")
    enc = Cipher(algorithms.ChaCha20(seed, b"\x00\x00\x00\x00" + domain), mode=None).encryptor()
    step = _CHUNK // 8
    zeros = bytes(_CHUNK)
    block = np.empty(step, dtype="<u8")
    view = memoryview(block).cast("B")
    op = np.subtract if subtract else np.add
    for i in range(0, words.shape[0], step):
        n = min(step, words.shape[0] - i)
        enc.update_into(zeros[:8 * n] if n < step else zeros, view[:8 * n])
        op(words[i:i + n], block[:n], out=words[i:i + n])
    return words


def pairwise_info(purpose: str, session_id: str, u: int, v: int) -> bytes:
    """HKDF ``info`` binding purpose, session and the ordered pair {u, v}."""
    if purpose not in _PURPOSES:
        raise ValueError(f"purpose must be one of {_PURPOSES}")
    if not isinstance(session_id, str) or "/" in session_id:
        raise ValueError("session_id must be a string without '/'")
    u = check_int("u", u, "pairwise_info", low=0)
    v = check_int("v", v, "pairwise_info", low=0)
    if u == v:
        raise ValueError("a pairwise seed needs two distinct parties")
    lo, hi = min(u, v), max(u, v)
    return f"{domains.SECAGG_PAIRWISE}{purpose}/{session_id}/{lo}/{hi}".encode()


def agree(
    private_key: X25519PrivateKey, peer_public: bytes, *, purpose: str, session_id: str, u: int, v: int
) -> bytes:
    """32-byte pairwise seed ``HKDF(X25519(sk_u, pk_v), info(purpose, session, {u, v}))``.

    A peer key of small order (all-zero shared secret) raises
    :class:`InvalidContribution`.
    """
    if not isinstance(private_key, X25519PrivateKey):
        raise TypeError("private_key must be an X25519PrivateKey")
    if not isinstance(peer_public, (bytes, bytearray)) or len(peer_public) != 32:
        raise InvalidContribution()
    try:
        shared = private_key.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
    except ValueError:
        raise InvalidContribution() from None
    if shared == bytes(32):  # pragma: no cover - cryptography already refuses
        raise InvalidContribution()
    return HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=pairwise_info(purpose, session_id, u, v)
    ).derive(shared)
