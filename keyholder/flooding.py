"""Noise flooding of a CKKS decryption before anything leaves the key holder.

Why: CKKS decryption returns the message plus the ciphertext's noise e. Li and
Micciancio (2021) showed that publishing such a decryption lets whoever chose
the ciphertext solve for the secret key (IND-CPA-D): a ciphertext derived from
the public key decrypts to its error, and the error together with the public
key gives s. Re-summing signed uploads (``verify.py``) stops the server from
choosing what is decrypted, but a hospital still chooses its own upload, and
the released W is a function of every slot. So every decrypted slot gets
fresh Gaussian noise large enough that the released values are statistically
close to values that do not depend on e.

Sizing over the whole release (after Li, Micciancio, Schultz and Sorrell
2022; OpenFHE's noise-flooding decryption sizes for all slots the same way).
Let ``e`` bound the key-dependent part of the decryption error of one entry,
so two admissible keys shift that entry's mean by at most 2e. With
N(0, sigma^2) added, the KL divergence between the two shifted Gaussians is
(2e)^2 / (2 sigma^2) per entry and adds up over the S entries of a release
and the q decryptions allowed under the key. Choosing

    sigma = sqrt(12 q S) * 2^(kappa/2) * e                          (F)

makes the sum q S (2e)^2 / (2 sigma^2) = 2^-kappa / 6 for the WHOLE release,
i.e. a margin of kappa + log2 6 bits (:func:`margin_bits`). Key recovery is a
search problem, for which a divergence of 2^-kappa costs the attacker at most
about kappa bits (the halving that Renyi/KL arguments give over statistical
distance, hence 2^(kappa/2) and not 2^kappa). ``kappa`` = 30 is OpenFHE's
default; the release ledger allows ONE decryption per key, so q = 1.

Two stages (:func:`flood_release`). What moves a decryption with the key is
the encryption noise (``noise_bound``, a function of (N, scale, K)) plus the
float64 encode/decode error, which scales with the magnitude M of the values
in each ciphertext chunk (``FLOAT_REL * M``). The declared worst case M
(K n_max B^2) is often 1e3 times the real one, so:

1. every chunk holding a count slot (contributors, n, class counts) or a tag
   slot (tags are drawn up to the declared bound) is flooded with (F) at e =
   the declared-magnitude bound and S = 2 x its slots, i.e. half of the
   divergence budget; the counts are then known to within their bound;
2. every other chunk holds Gram and cross entries only, of an honest
   hospital at most n_k B^2 + gamma and n_k B, so M <= n max(B^2, B) + K gamma
   with n bounded from above by stage 1's release; those chunks are flooded
   with (F) at that tighter e and S = 2 x their slots, the other half. KL
   divergences of an adaptive composition add (chain rule), so the total
   stays 2^-kappa / 6; stage 2's bound fails only if stage 1's count bound
   does (probability 2^-TAIL_BITS).

What the flooding does NOT cover: a hospital that adds a multiple t of an
encryption of zero to its own (signed) upload multiplies the key-dependent
error of its upload by t, and no check that only sees the flooded sum can
tell t e from data below the checks' detection threshold (about
:data:`TAIL_BITS`-tail times sigma). The margin then drops by about
2 log2 t bits; ``threat_model/THREAT_MODEL.md`` states what that leaves.
``secure-afl attack decryption-error`` measures the honest case.

Precision: every flooded entry is within ``e + z sigma`` of the true sum,
with z chosen so that ALL entries of the release are within it except with
probability 2^-TAIL_BITS (:func:`tail_z`, a union bound over the entries of the
Gaussian tail P(|N(0,1)| > z) <= exp(-z^2/2)). The sanity checks
(:func:`secure_afl.release_checks.sanity_check`) and the certificate
(:mod:`secure_afl.certify`) use exactly that bound.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import numpy as np
from secure_afl.certify import gaussian_spectral_bound
from secure_afl.exceptions import InvalidParameterError

__all__ = ["KAPPA", "QUERIES", "TAIL_BITS", "flood_sigma", "flood", "tail_z", "margin_bits", "FloodedRelease",
           "flood_release", "flood_plan", "flood_decryption", "flood_norm_bounds", "check_counts_releasable"]

KAPPA = 30
QUERIES = 1
#: Every flooded entry of a release is within its stated bound except with probability 2^-TAIL_BITS.
TAIL_BITS = 40


def flood_sigma(e_bound: float, *, slots: int, queries: int = QUERIES, kappa: int = KAPPA) -> float:
    """(F): the standard deviation that keeps ``slots`` entries with key-dependent error <= ``e_bound``
    within a KL divergence of 2^-kappa / 6 altogether."""
    if not (math.isfinite(e_bound) and e_bound > 0) or queries < 1 or kappa < 1 or slots < 1:
        raise ValueError("e_bound must be finite and > 0; queries, kappa and slots >= 1")
    return math.sqrt(12.0 * queries * slots) * 2.0 ** (kappa / 2.0) * e_bound


def flood(vector: np.ndarray, sigma: float) -> np.ndarray:
    """``vector`` plus fresh N(0, sigma^2) noise in every slot (OS-seeded generator)."""
    rng = np.random.default_rng(secrets.randbits(256))
    v = np.asarray(vector, dtype=np.float64)
    return v + rng.normal(0.0, sigma, size=v.shape)


def tail_z(entries: int, *, bits: int = TAIL_BITS) -> float:
    """z with P(any of ``entries`` N(0, 1) draws exceeds z in absolute value) <= 2^-bits.

    Union bound over the entries of P(|N(0,1)| > z) <= exp(-z^2 / 2), so
    z = sqrt(2 (ln entries + bits ln 2))."""
    return math.sqrt(2.0 * (math.log(max(int(entries), 1)) + bits * math.log(2.0)))


def margin_bits(parts) -> float:
    """-log2 of the KL divergence of a release flooded in ``parts`` = [(entries, e, sigma), ...]
    between any two admissible keys (sum over entries of (2e)^2 / (2 sigma^2))."""
    kl = sum(n * 2.0 * (e / s) ** 2 for n, e, s in parts if n)
    return -math.log2(kl) if kl > 0 else math.inf


@dataclass(frozen=True)
class FloodedRelease:
    """A flooded decryption and the bounds that hold for it (all entries at once, w.p. >= 1 - 2^-TAIL_BITS).

    ``count_tol`` bounds the error of stage 1's slots (counts, tags and whatever shares
    their chunks), ``tol`` every slot; ``sigma_counts`` is stage 1's noise, ``sigma`` stage 2's."""

    vector: np.ndarray
    sigma_counts: float
    sigma: float
    count_tol: float
    tol: float
    e_key: float
    margin_bits: float
    tail_probability: float

    def to_report(self) -> dict:
        return {"flood_sigma": self.sigma, "flood_sigma_counts": self.sigma_counts, "flood_kappa": KAPPA,
                "flood_queries": QUERIES, "flood_margin_bits": self.margin_bits,
                "error_bound_per_entry": self.tol, "error_bound_counts": self.count_tol,
                "decryption_error_bound": self.e_key,
                "error_bound_exceed_probability": self.tail_probability}


def flood_release(raw: np.ndarray, first_index: np.ndarray, count_index: np.ndarray, *, e_first: float,
                  e_rest, extra_tol: float = 0.0) -> FloodedRelease:
    """Flood a raw decryption in the two stages of the module docstring.

    Parameters
    ----------
    raw : (L,) array
        The decryption; nothing here inspects it beyond adding noise.
    first_index : int array
        Stage 1: the slots of every ciphertext chunk that holds a count or a tag
        slot, flooded at ``e_first`` (the declared-magnitude bound).
    count_index : int array
        The count slots (contributors, n, class counts), a subset of ``first_index``.
    e_rest : callable
        ``e_rest(counts_upper) -> e``: the key-dependent error bound of the
        remaining chunks given upper bounds on the true counts (all that stage
        1 released about them).
    extra_tol : float
        Error of the release that does not depend on the key (float64 summation of the tags).
    """
    raw = np.asarray(raw, dtype=np.float64)
    L = raw.size
    first = np.asarray(first_index, dtype=np.int64)
    rest = np.setdiff1d(np.arange(L), first)
    z = tail_z(L)
    sigma0 = flood_sigma(e_first, slots=2 * first.size)
    out = np.empty_like(raw)
    out[first] = flood(raw[first], sigma0)
    first_tol = e_first + z * sigma0 + extra_tol
    if rest.size:
        e_key = min(e_first, float(e_rest(out[np.asarray(count_index)] + first_tol)))
        sigma = flood_sigma(e_key, slots=2 * rest.size)
        out[rest] = flood(raw[rest], sigma)
    else:
        e_key, sigma = e_first, sigma0
    tol = max(first_tol, e_key + z * sigma + extra_tol)
    margin = margin_bits([(first.size, e_first, sigma0), (rest.size, e_key, sigma)])
    return FloodedRelease(out, sigma0, sigma, first_tol, tol, e_key, margin, 2.0 ** -TAIL_BITS)


def flood_plan(params, K: int) -> dict:
    """What :func:`flood_release` needs, all known before decrypting (``flooding.py``, two stages):
    the slots of the chunks holding a count or a tag, the declared-magnitude error bound, and the
    error bound of the other chunks as a function of upper bounds on the released counts."""
    from secure_afl.backends.ckks import ckks_parameters, expected_abs_error
    from secure_afl.hazmat import ckks as hz

    lay = params.layout
    cp = ckks_parameters(params)
    s = lay.slices
    counts = np.concatenate([np.arange(L.start, L.stop) for L in (s["contributors"], s["n"], s["counts"])])
    special = np.concatenate([counts, np.arange(s["tag"].start, s["tag"].stop)])
    chunk = cp.slots
    chunks = np.unique(special // chunk)
    first = np.concatenate([np.arange(c * chunk, min((c + 1) * chunk, lay.length)) for c in chunks])
    e_declared = expected_abs_error(params, K)
    noise = hz.noise_bound(cp, K)
    B, gamma = float(params.bounds.max_norm), float(params.gamma)
    n_pos = int(np.flatnonzero(counts == s["n"].start)[0])

    def e_rest(upper):
        if params.dp is not None:  # DP noise shares sit on top of the statistics: keep the declared magnitude
            return e_declared
        # honest Gram and cross entries: |C^r_k,ij| <= n_k B^2 + gamma, |Q_k,ic| <= n_k B
        n_up = max(float(upper[n_pos]), 0.0)
        return noise + hz.FLOAT_REL * (n_up * max(B * B, B) + K * gamma)

    z = tail_z(lay.length)
    sigma0 = flood_sigma(e_declared, slots=2 * first.size)
    # the Gram entries of stage 1 (packed row-major upper triangle) lie in a trailing m x m block
    g_first = first[first < s["gram"].stop]
    m = 0
    if g_first.size:
        d = lay.dim
        row_start = np.concatenate([[0], np.cumsum(np.arange(d, 0, -1))])
        m = d - int(np.searchsorted(row_start, int(g_first.min()), side="right") - 1)
    cross_first = int(np.count_nonzero((first >= s["cross"].start) & (first < s["cross"].stop)))
    return {"first": first, "counts": counts, "e_declared": e_declared, "e_rest": e_rest,
            "count_tol": e_declared + z * sigma0, "gram_block": m, "cross_first": cross_first}


def flood_norm_bounds(plan: dict, fl: "FloodedRelease", dim: int, classes: int, probability: float):
    """(rho, phi): ||G||_2 <= rho and ||F||_F <= phi for the Gaussian noise flooded onto the Gram (G) and
    the cross term (F), both except with probability ``probability`` altogether.

    G = A + B: A carries stage 2's sigma (or nothing) on every entry, B stage 1's sigma_0 on the
    entries of a trailing m x m block (``plan["gram_block"]``); ||G|| <= ||A|| + ||B|| and each gets
    :func:`secure_afl.certify.gaussian_spectral_bound` (whose comparison argument allows entries with
    smaller or zero variance) at probability / 4 per tail pair. F: E||F||_F <= sqrt(sum of variances)
    and ||F||_F is max(sigma)-Lipschitz, so phi = sqrt(sum var) + t max(sigma), exp(-t^2/2) = probability / 2.
    """

    s, s0, m = fl.sigma, fl.sigma_counts, int(plan["gram_block"])
    rho = gaussian_spectral_bound(s, dim, probability / 4.0)
    if m:
        rho += gaussian_spectral_bound(s0, m, probability / 4.0)
    nq0 = int(plan["cross_first"])
    t = math.sqrt(2.0 * math.log(2.0 / probability))
    phi = math.sqrt((dim * classes - nq0) * s * s + nq0 * s0 * s0) + t * (max(s, s0) if nq0 else s)
    return rho, phi


def flood_decryption(plan: dict, raw: np.ndarray, *, extra_tol: float = 0.0) -> FloodedRelease:
    """:func:`flood_release` of a ckks session's raw decryption by its :func:`flood_plan`."""
    return flood_release(raw, plan["first"], plan["counts"], e_first=plan["e_declared"], e_rest=plan["e_rest"],
                         extra_tol=extra_tol)


def check_counts_releasable(params) -> None:
    """Refuse, at keygen, a ckks session whose releases could never be opened.

    Stage 1 floods the chunk holding the counts at the declared magnitude, so
    its error bound ``count_tol`` grows with K (the magnitude K n_max B^2 and
    the encryption noise both do). The counts must come out within 1/2 to be
    rounded to the true integers; if that fails at K = k_max, some cohort the
    session admits could only be refused after the hospitals uploaded. Checking
    the largest admissible K once, before any key exists, turns that into a
    configuration error with the fix named, and an admitted cohort is never
    refused for it.
    """
    if params.backend != "ckks":
        return

    b = params.bounds
    tol = flood_plan(params, int(b.k_max))["count_tol"]
    if not tol < 0.5:
        raise InvalidParameterError(
            f"ckks session refused: with k_max {b.k_max}, n_max {b.n_max} and max_norm {b.max_norm} the "
            f"flooding of the chunk holding the counts would move them by up to {tol:.3g} (must stay below 1/2 "
            "to release them): declare a smaller n_max, max_norm or k_max (the bound grows with "
            "k_max n_max max_norm^2), or use bfv or secagg", reason="imprecise_counts")
