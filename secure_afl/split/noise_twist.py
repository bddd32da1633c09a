"""The post-commitment signed permutation of an upload's noise words (split with DP and the Gram statement).

Under DP with the Gram statement each upload carries its noise share ``z`` (``n_z`` words) beside its lanes,
and its lanes hold the statistics plus ``z`` at the noised entries. The statement bounds ``z`` (per entry and
in l2) but cannot tell an honest share from a residual the hospital aimed: a share as large as an honest one,
put in one direction of Q against the others' sums, moves the release (docs/VALIDITY.md, "What a cheater still
gains"). So the release does not sum ``z`` as uploaded: it sums ``lanes - z + pi(z)``, with ``pi`` a signed
permutation of the ``n_z`` words, ``pi(z)_i = s_i z_(o_i)``, drawn per upload from that upload's query seed.

* **After the commitment.** The query seed is the key holder's HMAC over the hospital-signed commitment
  (:func:`secure_afl.split.signed_messages.query_seed`): nobody knows ``pi`` before the upload is fixed, so
  an aimed residual is sent, uniformly at random, to another signed arrangement of its entries.
* **DP unchanged.** An honest share's entries are i.i.d. and symmetric (Skellam, redrawn beyond tau), so
  ``pi(z)`` has exactly the distribution of ``z``, whatever ``pi``: the summed noise, and so the accounting,
  is that of the shares as drawn.
* **On shares.** ``(P - I) z`` is linear in the words: the server adds ``(P - I)`` of its masked words
  ``z + m_z`` to its masked sum and the key holder ``(P - I)`` of its mask share ``-m_z`` to its share, so the
  two still recombine to the exact aggregate plus the permuted noise.

``pi``: ``key = SHA-256(SPLIT_NOISE_PERM || query seed)``, ``2 n_z`` words of ChaCha20 under
``SPLIT_NOISE_PERM_XOF``; the order is the stable argsort of the first ``n_z`` (a uniform permutation up to
ties among 64-bit keys, probability below ``n_z^2 / 2^65``), ``s_i`` the low bit of the others (1: minus).
"""

from __future__ import annotations

import hashlib

import numpy as np

from .. import domains
from ..hazmat import prg

__all__ = ["noise_permutation", "noise_twist"]


def noise_permutation(query_seed: bytes, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(order, negate)``: ``pi(z)_i = -z[order[i]]`` where ``negate[i]``, else ``z[order[i]]``."""
    key = hashlib.sha256(domains.SPLIT_NOISE_PERM + bytes(query_seed)).digest()
    words = prg.expand(key, 2 * int(n), domain=domains.SPLIT_NOISE_PERM_XOF)
    return np.argsort(words[:n], kind="stable"), (words[n:] & np.uint64(1)).astype(bool)


def noise_twist(circuit, share: np.ndarray, query_seed: bytes) -> np.ndarray | None:
    """The lane words ``(P - I) z`` of one upload's share (the server's masked words, or the key holder's mask
    share) at its query seed, placed at the noised entries' high lanes; None where the session's uploads carry
    no noise words (every session but DP with the Gram statement): the release then sums the lanes as they are."""
    gram = circuit.part("gram")
    if gram is None or not gram.noise:
        return None
    F = circuit.F
    off = circuit.main_len + _words_before(circuit.statement, gram) + gram.n_f
    z = np.asarray(share, dtype=F.dtype)[off:off + gram.n_z]
    order, negate = noise_permutation(query_seed, gram.n_z)
    pz = z[order]
    pz[negate] = F.neg(pz[negate])
    delta = F.sub(pz, z)
    if circuit.lanes_per_value == 1:  # one word per value: the noise sits at 2^f2 within it
        delta = F.scale(delta, 1 << int(circuit.params.backend_params["frac_bits"][1]))
    out = F.zeros(circuit.main_len)
    out[gram.i_noise] = delta
    return out


def _words_before(statement, part) -> int:
    parts = getattr(statement, "parts", [statement])
    return sum(p.n_words for p in parts[:[id(p) for p in parts].index(id(part))])
