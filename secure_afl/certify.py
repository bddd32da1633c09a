"""Certified bound on the error of W that protection (and float64) can cause.

Every backend reveals the summed statistics C^r = sum_k C_k^r and
Q = sum_k Q_k with a per-entry error bound: ``eps_C`` on each entry of C^r and
``eps_Q`` on each entry of Q (ckks: encryption noise + float64 FFT error +
any noise flooding the key holder adds; secagg and bfv: the two-lane rounding
plus one final rounding; plain: float64 summation in some order). This module
turns those into a bound on ``||W - W*||_F / ||W*||_F``, where W is the
computed solution and W* the exact-arithmetic solution of the exact sums.

Derivation (A = C + lam I symmetric; revealed A = A* + dA, Q = Q* + dQ):

1. Data. ``||dA||_2 <= rho`` and ``||dQ||_F <= phi``. Entrywise errors give
   ``rho = d eps_C`` (``||dA||_2 <= ||dA||_F``; RI restoration C = C^r - K gamma I
   with the exact integer K adds one rounding per diagonal entry, folded into
   eps_C by :func:`entry_error_bounds`; an unrounded decrypted K would add
   gamma times its error, which is why every caller rounds it) and
   ``phi = sqrt(d c) eps_Q``. Gaussian flooding of standard deviation sigma
   (independent on and above the diagonal, mirrored below) adds G with
   ``||G||_2 <= sigma (2 sqrt(d) + sqrt(2) t)`` except with probability
   ``2 exp(-t^2/2)`` (:func:`gaussian_spectral_bound`: Sudakov-Fernique
   comparison with 2<g, v> gives E lambda_max(G) <= 2 sigma sqrt(d), and
   lambda_max is sqrt(2) sigma-Lipschitz in the Gaussians, so the
   Tsirelson-Ibragimov-Sudakov concentration inequality gives the tail; the
   same for -lambda_min), and F with ``||F||_F <= sigma (sqrt(d c) + t)``
   except with probability ``exp(-t^2/2)``.
   The bound below holds for EVERY perturbation within (rho, phi): the
   probability is only that of the flooding staying within them. With W' the exact solution of the
   revealed system, ``A*(W' - W*) = dQ - dA W'`` so
   ``||W' - W*||_F <= (||dQ||_F + ||dA||_2 ||W'||_F) / lambda_min(A*)`` and
   ``lambda_min(A*) >= lambda_min(A) - ||dA||_2`` (Weyl).
2. Solve, a posteriori. ``W - W' = -A^{-1} R`` with ``R = Q - A W``; R is
   computed in extended precision (``numpy.longdouble``, unit roundoff u_x)
   with a rounding error of at most ``(d + 2) u_x (|A||W| + |Q|)`` entrywise,
   so ``||W - W'||_F <= (||R||_F + (d + 2) u_x || |A||W| + |Q| ||_F) / lambda_min(A)``.
   This certifies the solve actually performed (Cholesky or the
   eigendecomposition) instead of a worst case, which at d = 512 and
   cond 1e9 would be useless.
3. lambda_min(A) itself comes from ``eigvalsh``; we subtract ``d u ||A||_F``,
   the backward-error size of a symmetric eigensolver, before using it.

The total ``||W - W*||_F <= e_solve + e_data`` is divided by
``||W*||_F >= ||W||_F - (e_solve + e_data)``.

When it does not apply: if lambda_min(A) is within the perturbation of zero
(C singular or so ill-conditioned that dA can close the gap) the solve is the
minimum-norm one, which is discontinuous where the rank changes, and no bound
of this kind holds; :func:`w_error_bound` then says so (``applies=False``,
verdict "no bound (C singular at this noise)") instead of a number. So does a
bound of 100 % or more, which says nothing about W.

Comparing two pipelines (secure vs plain): both are within their own bound of
the same W*, so ``||W_s - W_p||`` is at most the sum of the two absolute
bounds; :func:`plain_summation_error` is the plaintext pipeline's eps.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ._blas import one_blas_thread
from ._validation import check_real
from .exceptions import InvalidInputError
from secure_afl.hazmat.fixedpoint import abs_error_bound

__all__ = ["WBound", "w_error_bound", "certify_release", "entry_error_bounds", "plain_summation_error",
           "summand_magnitudes", "session_w_target", "UNIT_ROUNDOFF", "gaussian_spectral_bound",
           "gaussian_frobenius_bound", "WITHIN", "NO_BOUND", "EXCEEDS", "verdict_text", "FLOOD_TAIL"]

UNIT_ROUNDOFF = 2.0 ** -53


@dataclass(frozen=True)
class WBound:
    """A certified bound on ``||W - W*||_F / ||W*||_F`` (module docstring).

    ``rel_bound`` is the total, ``data_rel_bound`` the part due to the
    backend's per-entry error and ``solve_rel_bound`` the float64 solve's
    (certified a posteriori); ``abs_bound`` bounds ``||W - W*||_F``. ``applies`` is False
    (and ``rel_bound`` inf) when C is too close to singular for any such bound.
    """

    rel_bound: float
    data_rel_bound: float
    solve_rel_bound: float
    applies: bool
    eps_C: float
    eps_Q: float
    lambda_min: float
    lambda_max: float
    condition_number: float
    target: float | None
    warning: str | None
    abs_bound: float = math.inf
    solution: str = "C^+ Q"
    spectral_C: float = math.nan
    frobenius_Q: float = math.nan
    probability: float = 0.0

    @property
    def verdict(self) -> str:
        """The key holder's verdict: a bound exists, or C is singular at this noise."""
        return WITHIN if self.applies else NO_BOUND

    def to_dict(self) -> dict:
        out = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}
        out["verdict"] = self.verdict
        return out


#: The verdicts, the same words in the key holder's report, the CLI and the demo.
WITHIN = "within certified bound"
NO_BOUND = "no bound (C singular at this noise)"
NO_BOUND_HINT = ": use bfv, secagg or split for exact results"
EXCEEDS = "exceeds bound"


NO_BOUND_EXACT = "no bound (C singular)"
NO_BOUND_EXACT_NOTE = (": W is the minimum-norm solution C^+ Q of sums released exactly (no noise was added), "
                       "but a singular C gives it no perturbation bound; more samples or a --lambda ridge give one")


def verdict_text(verdict: str, backend: str, noisy: bool | None = None) -> str:
    """``verdict`` as printed: an approximate backend's "no bound" names the exact alternatives; an exact
    release without noise (``noisy`` False; default: only ckks adds noise) says that C alone is the cause."""
    if verdict != NO_BOUND:
        return verdict
    if noisy is None:
        noisy = backend == "ckks"
    if not noisy:
        return NO_BOUND_EXACT + NO_BOUND_EXACT_NOTE
    return verdict + (NO_BOUND_HINT if backend == "ckks" else "")


def gaussian_spectral_bound(sigma: float, dim: int, probability: float) -> float:
    """rho with P(||G||_2 > rho) <= ``probability`` for the symmetric d x d matrix G of independent
    N(0, sigma^2) entries on and above the diagonal (module docstring, step 1):
    rho = sigma (2 sqrt(d) + sqrt(2) t), 2 exp(-t^2/2) = probability."""
    t = math.sqrt(2.0 * math.log(2.0 / probability))
    return float(sigma) * (2.0 * math.sqrt(dim) + math.sqrt(2.0) * t)


def gaussian_frobenius_bound(sigma: float, entries: int, probability: float) -> float:
    """phi with P(||F||_F > phi) <= ``probability`` for ``entries`` independent N(0, sigma^2):
    E||F||_F <= sigma sqrt(entries) and ||F||_F is 1-Lipschitz, so phi = sigma (sqrt(entries) + t),
    exp(-t^2/2) = probability."""
    t = math.sqrt(2.0 * math.log(1.0 / probability))
    return float(sigma) * (math.sqrt(entries) + t)


def w_error_bound(C, Q, W, *, eps_C: float, eps_Q: float, lam: float = 0.0,
                  target: float | None = None, spectral_C: float | None = None,
                  frobenius_Q: float | None = None, probability: float = 0.0) -> WBound:
    """Certified relative error bound of W from the revealed, RI-restored C and Q.

    Parameters
    ----------
    C : (d, d) array
        The restored pooled Gram (``C^r - K gamma I``) as revealed.
    Q : (d, c) array
        The pooled cross term as revealed.
    W : (d, c) array
        The solution computed from them (``solve_head(C, Q, lam=lam)``).
    eps_C, eps_Q : float
        Per-entry absolute error bounds of the revealed C and Q.
    lam : float
        Ridge added before the solve (0: none).
    target : float, optional
        The session's relative target for what protection adds; a warning is
        set when ``data_rel_bound`` exceeds it (the solve's share is the same
        for a plaintext pipeline).
    spectral_C, frobenius_Q : float, optional
        Bounds rho >= ||dA||_2 and phi >= ||dQ||_F when tighter than the
        entrywise ones (Gaussian flooding: :func:`gaussian_spectral_bound`).
    probability : float
        Probability that the perturbation is NOT within (rho, phi) (0: always within).

    The bound is on the distance to W* = (C* + lam I)^-1 Q* of the exact sums
    (``solution`` names it): with lam > 0 that is the ridge solution, not C^+ Q.
    """
    eps_C = check_real("eps_C", eps_C, "w_error_bound", low=0.0)
    eps_Q = check_real("eps_Q", eps_Q, "w_error_bound", low=0.0)
    lam = check_real("lam", lam, "w_error_bound", low=0.0)
    C = np.asarray(C, dtype=np.float64)
    Q = np.asarray(Q, dtype=np.float64)
    W = np.asarray(W, dtype=np.float64)
    if C.ndim != 2 or C.shape[0] != C.shape[1] or Q.ndim != 2 or Q.shape[0] != C.shape[0] or W.shape != Q.shape:
        raise InvalidInputError(f"shapes C {C.shape}, Q {Q.shape}, W {W.shape} do not form C W = Q")
    if not (np.all(np.isfinite(C)) and np.all(np.isfinite(Q)) and np.all(np.isfinite(W))):
        raise InvalidInputError("C, Q or W contains NaN or inf")
    d, c = Q.shape
    A = 0.5 * (C + C.T)
    if lam > 0:
        A = A + lam * np.eye(d)
    ev = np.linalg.eigvalsh(A)
    lam_max = float(ev[-1])
    lam_lo = float(ev[0]) - d * UNIT_ROUNDOFF * float(np.linalg.norm(A))
    cond = lam_max / lam_lo if lam_lo > 0 else math.inf
    # step 2: residual in extended precision
    ux = float(np.finfo(np.longdouble).eps) / 2.0
    Al, Wl, Ql = A.astype(np.longdouble), W.astype(np.longdouble), Q.astype(np.longdouble)
    R = Ql - Al @ Wl
    # |A||W| + |Q| only bounds the rounding of R: float64 BLAS (one thread: the bound is reproduced bit for bit)
    # sums its d + 1 non-negative terms to within a relative (d + 1) u_64 (1e-13 at d = 512), which the 1e-6
    # margin below covers; a second extended-precision product cost 0.1-0.2 s of every release at d = 512, C = 100
    with one_blas_thread():
        mag = np.abs(A) @ np.abs(W) + np.abs(Q)
    r_norm = float(np.sqrt(np.sum(R * R))) + (d + 2) * ux * float(np.sqrt(np.sum(mag * mag))) * (1 + 1e-6)
    dA = d * eps_C if spectral_C is None else float(spectral_C)
    dQ = math.sqrt(d * c) * eps_Q if frobenius_Q is None else float(frobenius_Q)
    w_norm = float(np.linalg.norm(W))
    e_solve = e_data = math.inf
    if lam_lo > 0:
        e_solve = r_norm / lam_lo
        if lam_lo - dA > 0:
            e_data = (dQ + dA * (w_norm + e_solve)) / (lam_lo - dA)
    total = e_solve + e_data
    # a bound of 100 % or more says nothing about W: reported as no bound
    applies = math.isfinite(total) and 2.0 * total < w_norm
    denom = w_norm - total if applies else 0.0
    rel = total / denom if applies else math.inf
    data_rel = e_data / denom if applies else math.inf
    solve_rel = e_solve / denom if applies else math.inf
    warning = None
    if not applies:
        warning = (f"no W error bound: lambda_min(C + lam I) = {float(ev[0]):.3g} is within the perturbation "
                   f"{dA:.3g} (+ rounding) of zero, or the bound exceeds ||W|| (C is singular or nearly so at this "
                   "noise; the minimum-norm solve is not continuous there)")
    elif target is not None and data_rel > target:
        warning = (f"cond(C) = {cond:.3g}: the certified W error due to protection {data_rel:.3g} is above "
                   f"the session's target {target:.3g}")
    solution = "C^+ Q" if lam == 0 else f"(C + {lam:.3g} I)^-1 Q"
    return WBound(rel, data_rel, solve_rel, applies, float(eps_C), float(eps_Q), float(ev[0]), lam_max, cond,
                  None if target is None else float(target), warning, total if applies else math.inf,
                  solution=solution, spectral_C=float(dA), frobenius_Q=float(dQ), probability=float(probability))


def summand_magnitudes(C_r: np.ndarray, n: float) -> tuple[float, float]:
    """Bounds on sum_k |C^r_k,ij| and sum_k |Q_k,ic| from the pooled sums alone.

    Every C_k^r is positive semi-definite, so ``|C_k,ij| <= sqrt(C_k,ii C_k,jj)``
    and, by Cauchy-Schwarz over k, ``sum_k |C_k,ij| <= max_i C^r_ii``. For Q,
    ``sum_k |Q_k,ic| <= sum_n |x_ni| <= sqrt(N max_i C_ii)``.
    """
    diag = float(np.max(np.diag(np.asarray(C_r)))) if np.size(C_r) else 0.0
    diag = max(diag, 0.0)
    return diag, math.sqrt(max(float(n), 0.0) * diag)


def plain_summation_error(n_clients: int, magnitude: float) -> float:
    """Float64 summation of ``n_clients`` terms in any order: ``(K - 1) u / (1 - (K - 1) u) * sum |x_k|``."""
    k = max(int(n_clients) - 1, 0)
    g = k * UNIT_ROUNDOFF
    return g / (1.0 - g) * float(magnitude)


#: Default relative W targets when the session declares none (``backend_params["w_rel_target"]``).
DEFAULT_W_TARGET = {"ckks": 1e-6, "plain": 1e-9, "secagg": 1e-9, "bfv": 1e-9}
#: Probability the flooding noise is not within the spectral/Frobenius bounds used (each).
FLOOD_TAIL = 2.0 ** -40


def session_w_target(params) -> float:
    t = params.backend_params.get("w_rel_target")
    return float(t) if t is not None else DEFAULT_W_TARGET.get(params.backend, 1e-9)


def entry_error_bounds(params, n_clients: int, stats, *, ckks=None) -> tuple[float, float]:
    """Per-entry bounds ``(eps_C, eps_Q)`` of the revealed, RI-restored C and Q of a session, before
    any flooding (the key holder's Gaussian noise is bounded spectrally in :func:`certify_release`).

    ``stats`` are the revealed sums (used for the magnitude terms only); ``ckks``: the session's CKKS
    parameters where the caller already holds them (derived once per session).
    """
    k = int(n_clients)
    mag_C, mag_Q = summand_magnitudes(stats.gram, stats.n)
    if params.backend == "ckks":
        from .backends.ckks import expected_abs_error

        base = expected_abs_error(params, k, cp=ckks)
        eps_C = eps_Q = base
    elif params.backend in ("secagg", "bfv", "split"):

        fb = tuple(params.backend_params["frac_bits"])
        eps_C = abs_error_bound(fb, k, mag_C)
        eps_Q = abs_error_bound(fb, k, mag_Q)
    else:
        eps_C = plain_summation_error(k, mag_C)
        eps_Q = plain_summation_error(k, mag_Q)
    # RI restoration subtracts K gamma from the diagonal: one more rounding of |C^r_ii|.
    return eps_C + UNIT_ROUNDOFF * mag_C, eps_Q


def certify_release(params, stats, W, n_clients: int, *, lam: float = 0.0, flood_sigma: float = 0.0,
                    flood_norms: tuple[float, float] | None = None, ckks=None) -> WBound:
    """:func:`w_error_bound` for a revealed aggregate of ``params``'s backend.

    RI restoration uses the integer ``n_clients`` (never the decrypted
    counter: its error times gamma would escape the bound). ``flood_sigma``
    is the largest standard deviation of Gaussian noise the key holder added
    to the Gram and cross slots; its spectral and Frobenius bounds
    (module docstring) fail with probability at most 2 x :data:`FLOOD_TAIL`.
    ``flood_norms`` = (rho, phi) gives those two bounds directly instead (the key
    holder's, for noise of two levels), failing with probability :data:`FLOOD_TAIL`.
    """
    from .analytic import ri_restore_gram

    K = int(n_clients)
    eps_C, eps_Q = entry_error_bounds(params, K, stats, ckks=ckks)
    C = ri_restore_gram(stats.gram, K, stats.gamma)
    d, c = stats.cross.shape
    spec = frob = None
    prob = 0.0
    if flood_norms is not None:
        spec, frob = d * eps_C + float(flood_norms[0]), math.sqrt(d * c) * eps_Q + float(flood_norms[1])
        prob = FLOOD_TAIL
    elif flood_sigma > 0:
        spec = d * eps_C + gaussian_spectral_bound(flood_sigma, d, FLOOD_TAIL)
        frob = math.sqrt(d * c) * eps_Q + gaussian_frobenius_bound(flood_sigma, d * c, FLOOD_TAIL)
        prob = 2 * FLOOD_TAIL
    return w_error_bound(C, stats.cross, W, eps_C=eps_C, eps_Q=eps_Q, lam=lam, target=session_w_target(params),
                         spectral_C=spec, frobenius_Q=frob, probability=prob)
