"""Noise flooding of the ONE ckks decryption, in the coefficient domain, before anything is decoded.

Why: CKKS decryption returns the message plus the ciphertext's noise. Li and
Micciancio (2021) showed that publishing such a decryption lets whoever chose
the ciphertext solve for the secret key (IND-CPA-D): a ciphertext derived from
the public key decrypts to its error, and the error together with the public
key gives s. Re-summing signed uploads (``verify.py``) stops the server from
choosing what is decrypted, but a hospital still chooses its own upload, and
the released W is a function of every slot. So the decryption is flooded with
fresh Gaussian noise large enough that what is released is statistically close
to something that does not depend on the key. Here, as in OpenFHE's
NOISE_FLOODING_DECRYPT (after Li, Micciancio, Schultz and Sorrell 2022), the
noise is added to the INTEGER decryption, before the float64 decode.

What the noise must cover: what is proved and what is heuristic
-----------------------------------------------------------------
For each summed chunk (c0, c1) the key holder computes, exactly mod Q,

    c0 + G + c1 s = M + E + G   (mod Q)

with M = sum_k m_k the K encoded messages (a function of the data alone:
round(2^s tau^-1(z_k))), E = sum_k e_k the encryption errors, and G a fresh
polynomial whose N coefficients are independent round(N(0, sigma^2)) draws
(:func:`secure_afl.hazmat.ckks.flood_decrypt`; sigma by (F) below,
:func:`secure_afl.hazmat.ckks.flood_coefficient_sigma`). E is what depends on the key:
for an honest encryption (SEAL: public-key encryption at level QP, then
division by P with rounding) e_k = r0 + r1 s + (v e + e0 + e1 s) / P with
|r0|, |r1| <= 1/2 coefficient-wise, s and v ternary and e, e0, e1 clipped at
19.2, so, PROVED, ``||E||_inf <= K (N/2 + 1)``
(:func:`secure_afl.hazmat.ckks.worst_key_error`).

The flooding is sized with a bound e on ||E||_inf, chosen by the signed
session option ``[ckks] flooding``:

* "heuristic" (the default): e is the Hoeffding bound of
  :func:`secure_afl.hazmat.ckks.key_error_bound`, about sqrt(K N) instead of
  K N / 2. It rests on the INDEPENDENCE HEURISTIC (the rounding errors r0, r1
  independent, mean zero and independent of s), as OpenFHE's noise estimates
  do; it is not proved for SEAL. Measured on SEAL's honest encryptions
  (tests/test_ckks_flooding.py) the key error's standard deviation is the
  model's sqrt(K (1 + 2N/3) / 12) and its maximum several times below e.
  Against the PROVED bound the same noise gives only KL 2^-25.4 (K = 3),
  2^-23.6 (K = 10, d = 512, C = 100) down to 2^-19.3 (K = 100); every
  release reports both (``flood_kl_log2`` under the sizing's model,
  ``flood_kl_log2_proved`` against the proved bound).
* "proved": e = K (N/2 + 1), the honest-encryption worst case, without the
  independence heuristic: the KL below holds for any two keys when every
  hospital encrypts honestly (a crafted ciphertext's error is not bounded
  by it) and up to the float64 sampler (both below). The noise per coefficient grows by the ratio
  of the two bounds (about sqrt(K N / 80): 13 times at K = 3, N = 4096);
  the session's parameters take a larger scale (more data bits, a larger N
  where needed) to keep ``max_abs_error``, so W's error stays about where it
  was and the uploads grow (docs/BENCHMARKS.md gives the measured cost).

Under two admissible keys the same messages decrypt to M + E + G and
M + E' + G with E - E' an integer vector, |E_j - E'_j| <= 2e. For integer
shifts, round(Y) + d = round(Y + d), so by data processing the KL divergence
between the two coefficient vectors is at most that of the continuous
Gaussians, sum_j (E_j - E'_j)^2 / (2 sigma^2) <= S (2e)^2 / (2 sigma^2) over
the S = N x chunks coefficients of the release (every coefficient of every
chunk, slots used or not). Choosing

    sigma = sqrt(12 q S) * 2^(kappa/2) * e                              (F)

gives KL <= 2^-kappa / 6 for the whole release with q = 1 decryption per key
(the release ledger). With kappa = 30 this is stated as "30-bit security
against key recovery" in the sense of OpenFHE and of Li, Micciancio, Schultz
and Sorrell (2022): key recovery is a search problem, for which a divergence
of 2^-kappa costs the attacker at most about kappa bits. It is NOT 30 bits of
statistical distance: by Pinsker KL 2^-32.6 gives a statistical distance of
at most sqrt(KL / 2) = 2^-16.8. Decoding, the checks, the solve
and everything after are post-processing of M + E + G: the float64 decode
error is an ACCURACY term now, not one the noise must cover (flooding the
decoded floats, as this module once did, counted 2^-46 of the magnitude as
key-dependent and drowned large-magnitude releases).

Also heuristic, in either mode: the float64 Box-Muller sampler behind G (any
float Gaussian sampler is an approximation), the float64 decode error
FLOAT_REL (MEASURED, ``secure_afl.hazmat.ckks``), and that hospitals encrypt
honestly (next paragraph). Proved: the worst-case bound on E, the KL of (F)
given e, and the Gaussian tails below.

What the flooding does NOT cover: a hospital that adds a multiple t of an
encryption of zero to its own (signed) upload multiplies the key-dependent
error of its upload by t, and no check that only sees the flooded sum can
tell t e from data below the checks' detection threshold. The KL then grows
by about t^2; ``threat_model/THREAT_MODEL.md`` states what that leaves and
``secure-afl attack noisy-upload`` measures it. ckks assumes hospitals
encrypt honestly; split or bfv do not need to.

Precision (proved, except FLOAT_REL): the real part of decoded slot i carries
Re tau(G)_i / 2^s, a Gaussian of standard deviation sigma sqrt(N/2) / 2^s
(independent over slots and chunks), plus |Re tau(E + U + R)_i| / 2^s <=
N (K (N/2 + 1) + K/2 + 1/2) / 2^s (U the encoding roundings, R G's own
rounding; :func:`secure_afl.hazmat.ckks.fixed_slot_error`), plus the decode's
FLOAT_REL times the magnitude. With z = :func:`tail_z` of the released entries,
every entry is within that bound except with probability 2^-TAIL_BITS. The
counts, n, contributors and tags sit in their own chunk (magnitude <= K times
the hospital bound, not the Gram's), so they come out within ``count_tol``,
below 1/2 for any session :func:`check_counts_releasable` admits, and are
rounded to the true integers; the Gram and cross chunks' decode error uses the
released n (honest hospitals: |C_k,ij| <= n_k B^2 + gamma, |Q_k,ic| <= n_k B).
The sanity checks (:func:`secure_afl.release_checks.sanity_check`) and the
certificate (:mod:`secure_afl.certify`) use exactly these bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from secure_afl.certify import gaussian_spectral_bound
from secure_afl.exceptions import InvalidParameterError
from secure_afl.hazmat import ckks as hz

__all__ = ["KAPPA", "QUERIES", "TAIL_BITS", "SECURITY", "SECURITIES", "tail_z", "kl_log2", "FloodedRelease",
           "flood_plan", "flood_decryption", "flood_norm_bounds", "release_norms", "check_counts_releasable"]

KAPPA = hz.KAPPA
QUERIES = hz.FLOOD_QUERIES
#: Every flooded entry of a release is within its stated bound except with probability 2^-TAIL_BITS.
TAIL_BITS = hz.TAIL_BITS
_KL_BITS = KAPPA + math.log2(6)
#: How the flooding's guarantee is stated everywhere (reports, docs), by the key-error model it is sized with.
SECURITIES = {
    model: (f"{KAPPA}-bit security against key recovery (OpenFHE / LMSS convention; KL 2^-{_KL_BITS:.1f} "
            f"{where}; statistical distance <= 2^-{(_KL_BITS + 1) / 2:.1f})")
    for model, where in (("heuristic", "under the independence heuristic"),
                         ("proved", "against the honest-encryption worst case, float64 sampler"))}
SECURITY = SECURITIES["heuristic"]


tail_z = hz.tail_z


def kl_log2(coefficients: int, e_bound: float, sigma: float) -> float:
    """log2 of the KL bound of a release of ``coefficients`` flooded coefficients whose key error is within
    ``e_bound``: S (2e)^2 / (2 sigma^2) (a bound only as good as ``e_bound``: heuristic or proved)."""
    return math.log2(coefficients * 2.0 * (e_bound / sigma) ** 2)


@dataclass(frozen=True)
class FloodedRelease:
    """A flooded decryption and the bounds that hold for it (all entries at once, w.p. >= 1 - 2^-TAIL_BITS).

    ``sigma`` is the standard deviation of each released value's Gaussian part, ``sigma_coefficients``
    that of each flooded integer coefficient; ``e_fixed`` bounds the non-Gaussian part of every entry
    (proved fixed error + measured decode error); ``count_tol`` bounds the counts block, ``tol`` every entry."""

    vector: np.ndarray
    sigma: float
    sigma_coefficients: float
    count_tol: float
    tol: float
    e_fixed: float
    e_key: float
    kl_log2: float
    tail_probability: float
    model: str = "heuristic"
    kl_log2_proved: float | None = None

    def to_report(self) -> dict:
        return {"flood_sigma": self.sigma, "flood_sigma_coefficients": self.sigma_coefficients,
                "flood_security": SECURITIES[self.model], "flood_key_error_model": self.model,
                "flood_kappa": KAPPA, "flood_kl_log2": self.kl_log2, "flood_kl_log2_proved": self.kl_log2_proved,
                "flood_queries": QUERIES, "error_bound_per_entry": self.tol, "error_bound_counts": self.count_tol,
                "decryption_error_bound": self.e_fixed, "flood_key_error_coefficients": self.e_key,
                "error_bound_exceed_probability": self.tail_probability}


def flood_plan(backend, K: int) -> dict:
    """Everything the flooding of a K-sum needs, known before decrypting, from the session's backend
    (whose CKKS parameters were derived once, :attr:`CKKSBackend.ckks_`)."""
    params, cp = backend.params, backend.ckks_
    lay, s = params.layout, params.layout.slices
    f = backend.flooding(K)
    counts = np.concatenate([np.arange(sl.start, sl.stop) for sl in (s["contributors"], s["n"], s["counts"])])
    z = tail_z(lay.length)
    zs = z * f["slot_sigma"]
    fixed = hz.fixed_slot_error(cp, K)
    B, gamma = float(params.bounds.max_norm), float(params.gamma)
    # the counts chunk: n, counts <= K n_max, contributors K, tags drawn up to the hospital bound
    m_tail = K * params.bounds.hospital_bound(params.gamma)
    count_fixed = fixed + hz.FLOAT_REL * (m_tail + zs)
    declared = params.bounds.aggregate_bound(params.gamma)

    def magnitude(n_upper: float) -> float:
        if params.dp is not None:  # DP noise shares sit on top of the statistics: keep the declared magnitude
            return declared
        # honest Gram and cross entries: |C^r_k,ij| <= n_k B^2 + gamma, |Q_k,ic| <= n_k B
        return min(declared, max(n_upper, 0.0) * max(B * B, B) + K * gamma)

    return {"K": K, "counts": counts, "n_index": s["n"].start, "sigma": f["sigma"],
            "slot_sigma": f["slot_sigma"], "coefficients": f["coefficients"], "z": z, "fixed": fixed,
            "magnitude": magnitude, "count_tol": count_fixed + zs, "count_fixed": count_fixed,
            "e_key": hz.key_error_bound(cp, K, f["coefficients"], model=f["model"]), "model": f["model"],
            "e_key_proved": hz.worst_key_error(cp, K)}


def flood_decryption(plan: dict, backend, ctx, chunks: list, *, extra_tol: float = 0.0) -> FloodedRelease:
    """The one flooded decryption of the summed ``chunks`` (:meth:`CKKSBackend.decrypt_flooded`) and its bounds.

    ``extra_tol``: error of the release that does not depend on the key (float64 summation of the tags)."""
    v = backend.decrypt_flooded(ctx, chunks, plan["sigma"])
    zs = plan["z"] * plan["slot_sigma"]
    count_tol = plan["count_tol"] + extra_tol
    e_main = plan["fixed"] + hz.FLOAT_REL * (plan["magnitude"](float(v[plan["n_index"]]) + count_tol) + zs)
    e_fixed = max(plan["count_fixed"], e_main)
    tol = e_fixed + zs + extra_tol
    kl = kl_log2(plan["coefficients"], plan["e_key"], plan["sigma"])
    kl_proved = kl_log2(plan["coefficients"], plan["e_key_proved"], plan["sigma"])
    return FloodedRelease(v, plan["slot_sigma"], plan["sigma"], count_tol, tol, e_fixed, plan["e_key"], kl,
                          2.0 ** -TAIL_BITS, plan["model"], kl_proved)


def flood_norm_bounds(plan: dict, fl: FloodedRelease, dim: int, classes: int, probability: float):
    """(rho, phi): ||G||_2 <= rho and ||F||_F <= phi for the Gaussian part of the noise on the Gram (G,
    symmetric, independent entries of standard deviation ``fl.sigma``) and on the cross term (F), both
    except with probability ``probability`` altogether: :func:`secure_afl.certify.gaussian_spectral_bound`
    at probability / 2, and for F, E||F||_F <= sqrt(d C) sigma with ||F||_F sigma-Lipschitz, so
    phi = sqrt(d C) sigma + t sigma with exp(-t^2/2) = probability / 2. The non-Gaussian part
    (``fl.e_fixed`` per entry) is added by the caller."""
    s = fl.sigma
    rho = gaussian_spectral_bound(s, dim, probability / 2.0)
    t = math.sqrt(2.0 * math.log(2.0 / probability))
    phi = math.sqrt(dim * classes) * s + t * s
    return rho, phi


def release_norms(plan: dict, fl: FloodedRelease, dim: int, classes: int, probability: float):
    """``(spectral, (rho', phi'))``: the bound on ||noise on C||_2 the checks and the ridge use, and the
    (spectral, Frobenius) norms for :func:`secure_afl.certify.certify_release`, each the Gaussian part
    (:func:`flood_norm_bounds`) plus the fixed part ``fl.e_fixed`` of every entry."""
    rho, phi = flood_norm_bounds(plan, fl, dim, classes, probability)
    spectral = dim * fl.e_fixed + rho
    return spectral, (spectral, phi + math.sqrt(dim * classes) * fl.e_fixed)


def check_counts_releasable(params) -> None:
    """Refuse, at keygen, a ckks session whose counts could not be released as integers.

    The counts block is its own ciphertext, flooded like every other with noise that does not depend
    on the magnitudes, so its bound ``count_tol`` is small for any session whose precision target is
    (the default is 2e-2); only a target loose enough to let it reach 1/2 at K = k_max fails. Checking
    the largest admissible K once, before any key exists, turns that into a configuration error with
    the fix named, and an admitted cohort is never refused for it.
    """
    if params.backend != "ckks":
        return
    from secure_afl.backends.ckks import CKKSBackend

    b = params.bounds
    tol = flood_plan(CKKSBackend(params), int(b.k_max))["count_tol"]
    if not tol < 0.5:
        raise InvalidParameterError(
            f"ckks session refused: with k_max {b.k_max} and CKKS parameters {params.backend_params} the "
            f"flooding would move the counts by up to {tol:.3g} (must stay below 1/2 to release them): "
            "create the session with a smaller max_abs_error (a larger scale), or use bfv or split",
            reason="imprecise_counts")
