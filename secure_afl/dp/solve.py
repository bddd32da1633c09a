"""The key holder's solve for a noisy aggregate: PSD repair and a calibrated ridge.

The revealed Gram is ``C~ = C + K gamma I + E`` with E symmetric, every entry
of its upper triangle N(0, s^2), s^2 = (K/t) sigma^2 the noise actually summed
(skellam: the same variance on the grid). RI restoration would subtract
K gamma I and hand an indefinite ``C + E`` to a minimum-norm solve, whose
small eigenvalues are pure noise and blow W up; so with DP on the key holder
never restores RI. Instead:

1. PSD repair: symmetrise and clip the eigenvalues of ``C~`` at 0 (the
   nearest PSD matrix in Frobenius norm).
2. Calibrated ridge: ``||E||_2 <= s (2 sqrt(d) + 2 sqrt(ln(1/beta)))`` with
   probability about 1 - beta (the expected norm of a d x d Wigner matrix is
   at most 2 s sqrt(d) asymptotically; ||E||_2 is sqrt(2) s-Lipschitz in the
   standard-normal entries, so Gaussian concentration gives the tail term). A
   ridge of that size makes ``C + E + lambda I`` dominate C, so
   ``lambda = s (2 sqrt(d) + 2 sqrt(ln(1/beta)))``. The RI term already in C~
   counts towards it: the key holder adds ``max(0, lambda - K gamma)``.

Everything here is post-processing of the noisy aggregate: it costs no privacy.
"""

from __future__ import annotations

import math

import numpy as np

from .._blas import one_blas_thread
from ..analytic import solve_head
from ..exceptions import SanityCheckFailed
from ..params import SessionParams
from ..stats import SufficientStatistics

__all__ = ["calibrated_ridge", "psd_repair", "dp_solve", "dp_sanity_check", "summed_noise_std"]


def summed_noise_std(params: SessionParams, contributors: int) -> float:
    """Standard deviation of the noise in each entry of a sum of ``contributors`` shares."""
    dp = params.dp
    return float(dp["sigma"]) * math.sqrt(contributors / int(dp["min_contributors"]))


def calibrated_ridge(noise_std: float, dim: int, beta: float) -> float:
    return noise_std * (2.0 * math.sqrt(dim) + 2.0 * math.sqrt(math.log(1.0 / beta)))


def psd_repair(C: np.ndarray) -> np.ndarray:
    with one_blas_thread():  # as the solve: W a function of the release alone, whatever the thread count
        A = 0.5 * (C + C.T)
        w, V = np.linalg.eigh(A)
        return (V * np.clip(w, 0.0, None)) @ V.T


def dp_solve(stats: SufficientStatistics, params: SessionParams, contributors: int, *,
             lam: float = 0.0) -> tuple[np.ndarray, dict]:
    """W from a noisy aggregate (module docstring); returns (W, what was applied).

    ``lam`` is a ridge the key holder asks for on top; the larger of it and the
    calibrated one is used.
    """
    s = summed_noise_std(params, contributors)
    lam = max(float(lam), calibrated_ridge(s, stats.dim, float(params.dp["beta"])))
    ri = contributors * float(params.gamma)
    extra = max(0.0, lam - ri)
    A = psd_repair(stats.gram)
    W = solve_head(A, stats.cross, lam=extra)
    return W, {"noise_std": s, "calibrated_ridge": lam, "ri_term_kept": ri, "ridge_added": extra,
               "ri_restored": False}


def dp_sanity_check(stats: SufficientStatistics, params: SessionParams, expected_contributors: int, *,
                    advisory: tuple = ()) -> dict:
    """The checks that noise does not invalidate: the contributor counter, finiteness, and a noise-aware
    bound on every entry (a garbage or wrapped aggregate fails it). A check named in ``advisory`` is
    reported (False) instead of refusing: split's validity proof already rules out a wrapped sum, and it
    bounds entries more loosely than the declared bound, so there a proven upload must not veto through it."""
    checks = {}
    if abs(stats.contributors - expected_contributors) > 0.5:
        raise SanityCheckFailed(f"aggregate fails the contributors check: the counter is not the manifest's "
                                f"{expected_contributors}")
    checks["contributors"] = True
    vals = np.concatenate([stats.gram.ravel(), stats.cross.ravel(), [stats.n], stats.class_counts])
    if not np.all(np.isfinite(vals)):
        raise SanityCheckFailed("aggregate fails the finite check")
    checks["finite"] = True
    from .mechanism import TAIL

    s = summed_noise_std(params, expected_contributors)
    limit = expected_contributors * params.bounds.hospital_bound(params.gamma) + TAIL * s
    ok = float(np.max(np.abs(vals))) <= limit
    if not ok and "noisy_bound" not in advisory:
        raise SanityCheckFailed(f"aggregate fails the noisy bound check: an entry exceeds {limit:.6g}")
    checks["noisy_bound"] = ok
    return checks
