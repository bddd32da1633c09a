"""Key agreement, share encryption, pairwise masks and share commitments."""

from __future__ import annotations

import hashlib

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from ..hazmat.prg import DOMAIN_PAIR_MASK, agree, expand

_COMMIT_PREFIX = b"secure-afl/secagg/v2/share-commitment\0"

def round_context(session_id: str, round: int = 1) -> str:
    """Session id and round number, as bound into every key derivation, AEAD and commitment of a round.

    Keys and masks of round r can then never open, verify or cancel anything
    of round r + 1 under the same session id.
    """
    return f"{session_id}#round={int(round)}"


def share_key(enc_sk: X25519PrivateKey, peer_pk: bytes, session_id: str, u: int, v: int, *,
               round: int = 1) -> ChaCha20Poly1305:
    return ChaCha20Poly1305(agree(enc_sk, peer_pk, purpose="share-enc", session_id=round_context(session_id, round),
                                  u=u, v=v))


def share_ad(session_id: str, digest_hex: str, sender: int, recipient: int, commit_b: bytes, commit_s: bytes, *,
              round: int = 1) -> bytes:
    """AEAD associated data: session and round, parameter digest, direction sender -> recipient, commitments."""
    return (f"secure-afl/secagg/v2/share/{round_context(session_id, round)}/{digest_hex}/{sender}->{recipient}/"
            .encode() + commit_b + commit_s)


def share_commitment(session_id: str, digest_hex: str, kind: str, owner: int, holder: int, share: bytes, *,
                     round: int = 1) -> bytes:
    """SHA-256 commitment to one Shamir share (``kind`` "b": self-mask seed, "s": mask key) of one round.

    No salt: a share of a uniform 256-bit secret is itself unpredictable to
    anyone holding fewer than t shares, so the hash does not help guess it.
    """
    head = f"{round_context(session_id, round)}/{digest_hex}/{kind}/{owner}->{holder}".encode()
    return hashlib.sha256(_COMMIT_PREFIX + len(head).to_bytes(2, "big") + head + share).digest()


def pair_seed(mask_sk: X25519PrivateKey, peer_pk: bytes, session_id: str, u: int, v: int, *, round: int = 1) -> bytes:
    return agree(mask_sk, peer_pk, purpose="mask", session_id=round_context(session_id, round), u=u, v=v)


def _raw_private(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def _raw_public(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def add_pair_mask(acc: np.ndarray, seed: bytes, u: int, v: int, *, remove: bool = False) -> None:
    """``acc += sign(u, v) PRG(s_uv)`` (or ``-=`` with ``remove``), sign = +1 iff v > u."""
    m = expand(seed, acc.shape[0], domain=DOMAIN_PAIR_MASK)
    if (v > u) != remove:
        np.add(acc, m, out=acc)
    else:
        np.subtract(acc, m, out=acc)

