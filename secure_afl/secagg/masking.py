"""Key agreement, share encryption, pairwise masks and share commitments."""

from __future__ import annotations

import hashlib

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from .. import domains
from ..hazmat.prg import DOMAIN_PAIR_MASK, agree, expand
from ..hazmat.shamir import PRIME, evaluate

_COMMIT_PREFIX = domains.SECAGG_SHARE_COMMITMENT
_CHALLENGE_PREFIX = domains.SECAGG_DEAL_CHALLENGE

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
    return (f"{domains.SECAGG_SHARE_AD}{round_context(session_id, round)}/{digest_hex}/{sender}->{recipient}/"
            .encode() + commit_b + commit_s)


def share_commitment(session_id: str, digest_hex: str, kind: str, owner: int, holder: int, share: bytes, *,
                     round: int = 1) -> bytes:
    """SHA-256 commitment to one Shamir share (``kind`` "b": self-mask seed, "s": mask key) of one round.

    No salt: a share of a uniform 256-bit secret is itself unpredictable to
    anyone holding fewer than t shares, so the hash does not help guess it.
    """
    head = f"{round_context(session_id, round)}/{digest_hex}/{kind}/{owner}->{holder}".encode()
    return hashlib.sha256(_COMMIT_PREFIX + len(head).to_bytes(2, "big") + head + share).digest()


def deal_challenge(session_id: str, digest_hex: str, dealer: int, commitments, *, round: int = 1) -> tuple[int, int]:
    """Fiat-Shamir weights ``(c_1, c_2)`` in GF(p) of a dealing: SHAKE-256 of every holder's three commitments.

    ``commitments`` is the dealer's list of ``(holder, commit_b, commit_s, commit_r)``. The weights are fixed
    only once every share is committed, so the dealer cannot choose shares that pass for the weights it gets.
    80 bytes per weight reduced mod p: bias below 2^-100.
    """
    h = hashlib.shake_256(_CHALLENGE_PREFIX)
    head = f"{round_context(session_id, round)}/{digest_hex}/{dealer}".encode()
    h.update(len(head).to_bytes(2, "big") + head)
    for holder, cb, cs, cr in commitments:
        h.update(int(holder).to_bytes(2, "big") + cb + cs + cr)
    out = h.digest(160)
    return int.from_bytes(out[:80], "big") % PRIME, int.from_bytes(out[80:], "big") % PRIME


def on_check_polynomial(check, weights: tuple[int, int], holder: int, b: int, s: int, r: int) -> bool:
    """``z(i) == r_i + c_1 b_i + c_2 s_i (mod p)`` for holder ``i``: its three shares agree with the published ``z``.

    Verifiable dealing (a hash-based VSS): the dealer draws a uniform blinding polynomial ``r`` of degree t-1
    next to ``f_b`` and ``f_s``, commits to every holder's ``(f_b(i), f_s(i), r(i))``, derives ``(c_1, c_2)``
    from the commitments (:func:`deal_challenge`) and publishes ``z = r + c_1 f_b + c_2 f_s``. ``z(0) = r(0) +
    c_1 b + c_2 s`` is uniform whatever the secrets (``r(0)`` is), and t-1 holders learn nothing more. If the
    b- or s-values of the holders lie on no polynomial of degree t-1, the weight pairs that make every
    holder's check pass are at most a fraction 1/p of all pairs (two pairs differing in c_1 would put the
    b-values on a polynomial), so some holder's check fails: that holder's three shares, their commitments
    and the dealer's signature over commitments and ``z`` prove the inconsistency to anyone.
    """
    c1, c2 = weights
    return evaluate(check, holder) == (r + c1 * b + c2 * s) % PRIME


def pair_seed(mask_sk: X25519PrivateKey, peer_pk: bytes, session_id: str, u: int, v: int, *, round: int = 1) -> bytes:
    return agree(mask_sk, peer_pk, purpose="mask", session_id=round_context(session_id, round), u=u, v=v)


def raw_private(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def raw_public(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def add_pair_mask(acc: np.ndarray, seed: bytes, u: int, v: int, *, remove: bool = False) -> None:
    """``acc += sign(u, v) PRG(s_uv)`` (or ``-=`` with ``remove``), sign = +1 iff v > u."""
    m = expand(seed, acc.shape[0], domain=DOMAIN_PAIR_MASK)
    if (v > u) != remove:
        np.add(acc, m, out=acc)
    else:
        np.subtract(acc, m, out=acc)

