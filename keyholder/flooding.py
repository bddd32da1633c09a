"""Noise flooding of a CKKS decryption before anything leaves the key holder.

Why: CKKS decryption returns the message plus the ciphertext's noise e. Li and
Micciancio (2021) showed that publishing such a decryption lets whoever chose
the ciphertext solve for the secret key (IND-CPA-D): a ciphertext derived from
the public key decrypts to its error, and the error together with the public
key gives s. Re-summing signed uploads (``verify.py``) stops the server from
choosing what is decrypted, but a hospital still chooses its own upload, and
the released W is a function of every slot. So every decrypted slot gets
fresh Gaussian noise large enough that the released values are statistically
independent of e.

Sizing (after Li, Micciancio, Schultz and Sorrell 2022; OpenFHE's
noise-flooding decryption mode is built the same way): the error of one
released entry is bounded by ``e_bound`` (the certified bound of the sum), so
two admissible errors shift that entry's distribution by at most 2 e_bound.
With N(0, sigma^2) added and

    sigma = sqrt(12 q) * 2^(kappa/2) * e_bound

the KL divergence between the two shifted Gaussians, summed over the q
decryptions allowed under the key, is q (2 e_bound)^2 / (2 sigma^2) =
2^-kappa / 6. Key recovery is a search problem, for which a divergence of
2^-kappa costs the attacker at most about kappa bits (the halving that
Renyi/KL arguments give over statistical distance, hence 2^(kappa/2) and not
2^kappa). ``kappa`` = 30 is OpenFHE's default for this mode; the release
ledger allows ONE decryption per key, so q = 1.

Caveat, stated rather than hidden: the bound is per entry. Summed over all L
slots of one release the divergence grows by L (about 2^18 at d = 512), so
the margin over all slots at once is kappa - log2 L bits; the measured attack
(``secure-afl attack ckks-pk-chunks``) recovers nothing at this level, and
``flood_sigma(..., slots=L)`` gives the full-margin sigma at a precision cost
the benchmark reports.

The noise costs precision: each released entry is now within
``e_bound + Z sigma`` of the true sum except with probability
``erfc(Z / sqrt 2)`` per entry (Z = 7: 2.6e-12), which is the bound the
sanity checks and the report use. The solve then damps what the noise swamps: a symmetric d x d matrix of
independent N(0, sigma^2) entries has spectral norm close to 2 sigma sqrt(d)
(Wigner's semicircle), so eigen-directions of C below that level carry noise,
not data, and W = (C + lambda I)^-1 Q with lambda = 2 sigma sqrt(d)
(:func:`flood_ridge`) keeps them from dominating W. On the demo data (d = 256,
digits) the unregularised solve of a flooded release drops test accuracy to
about 0.3; with this ridge it stays within a point of the plaintext model.
Exact backends (plain, secagg's fixed-point
masking) have no decryption noise that depends on a key, so they need none.
"""

from __future__ import annotations

import math
import secrets

import numpy as np

__all__ = ["KAPPA", "QUERIES", "Z_TAIL", "flood_sigma", "flood", "flooded_bound", "flood_ridge"]

KAPPA = 30
QUERIES = 1
Z_TAIL = 7.0


def flood_sigma(e_bound: float, *, queries: int = QUERIES, kappa: int = KAPPA, slots: int = 1) -> float:
    """Standard deviation of the flooding noise for a per-entry decryption-error bound ``e_bound``.

    ``slots`` > 1 spreads the divergence budget over that many released entries.
    """
    if not (math.isfinite(e_bound) and e_bound > 0) or queries < 1 or kappa < 1 or slots < 1:
        raise ValueError("e_bound must be finite and > 0; queries, kappa and slots >= 1")
    return math.sqrt(12.0 * queries * slots) * 2.0 ** (kappa / 2.0) * e_bound


def flood(vector: np.ndarray, sigma: float) -> np.ndarray:
    """``vector`` plus fresh N(0, sigma^2) noise in every slot (OS-seeded generator)."""
    rng = np.random.default_rng(secrets.randbits(256))
    v = np.asarray(vector, dtype=np.float64)
    return v + rng.normal(0.0, sigma, size=v.shape)


def flooded_bound(e_bound: float, sigma: float, *, z: float = Z_TAIL) -> tuple[float, float]:
    """(per-entry bound after flooding, probability one entry exceeds it)."""
    return e_bound + z * sigma, math.erfc(z / math.sqrt(2.0))


def flood_ridge(sigma: float, dim: int) -> float:
    """Ridge at the flooding noise floor: about the spectral norm of the d x d noise added to C."""
    return 2.0 * sigma * math.sqrt(dim)
