"""The mechanism: sensitivity of the released statistics, noise scale, privacy accounting.

Neighbouring data sets differ by one sample (add/remove) at one hospital. One
sample (x, y) with ||x||_2 <= B and a one-hot label changes the noised part of
the packed aggregate (``triu(C)``, ``Q``, ``n``, ``counts``) by

    triu(x x^T)   L2 <= ||x||^2 = B^2,        L1 <= ||x||_1^2 <= d B^2
    x y^T         L2  = ||x||   <= B,         L1 <= sqrt(d) B
    n, counts     L2  = sqrt(2),              L1  = 2

so ``Delta_2 = sqrt(B^4 + B^2 + 2)`` and ``Delta_1 = d B^2 + sqrt(d) B + 2``.
Every noised entry receives independent noise of standard deviation
``sigma = z Delta_2`` in total (``z`` the noise multiplier), split over the
hospitals (:mod:`secure_afl.dp.noise`).

Two mechanisms, one per kind of backend:

* ``gaussian`` (plain, ckks): real Gaussian noise. Its Renyi DP curve is
  ``eps(alpha) = alpha / (2 z^2)``.
* ``skellam`` (secagg, bfv, split): integer noise on the fixed-point grid 2^-f, each share a
  Skellam variable (difference of two Poissons). Skellam is closed under
  summation, so the survivors' shares add up to one Skellam variable of
  variance ``2 mu`` exactly, whatever the dropouts. Renyi DP (Agarwal, Kairouz
  and Liu, 2021) in integer units, with the rounding of each hospital's sum to
  the grid folded into the sensitivities (``Delta_2 2^f + sqrt(m)``,
  ``Delta_1 2^f + m`` for m noised entries)::

      eps(alpha) <= alpha D2^2 / (4 mu)
                    + min(((2 alpha - 1) D2^2 + 6 D1) / (16 mu^2), 3 D1 / (4 mu))

Accounting: the Renyi curves are converted to (epsilon, delta) by
``dp_accounting``'s RDP conversion (:func:`dp_accounting.rdp.compute_epsilon`)
at its default orders; for the Gaussian the curve is exactly the one
``dp_accounting.rdp.RdpAccountant`` computes for a ``GaussianDpEvent``, and the
tests check that the two agree. Composition over releases adds the curves
(:mod:`secure_afl.dp.ledger`). The noise multiplier for a target (epsilon,
delta) is found by bisection on the same conversion.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from .._validation import check_int, check_real, param_error
from ..exceptions import InvalidParameterError
from ..params import Bounds, SessionParams

__all__ = ["ORDERS", "share_std", "share_bound", "DPSpec", "sensitivity", "gaussian_rdp", "skellam_rdp", "epsilon_from_rdp",
           "noise_multiplier_for", "release_rdp", "release_epsilon", "MECHANISMS", "dp_config",
           "noised_entries", "share_square_log_mgf", "share_square_tail"]

#: Renyi orders of the accountant (dp_accounting's defaults).
# dp_accounting's DEFAULT_RDP_ORDERS (a test checks they are equal): written out so that importing this module,
# which every party does, does not import dp_accounting (a second of start-up); only accounting does
ORDERS = np.asarray([1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024],
                    dtype=np.float64)
#: Real noise where the sum is real (plain, ckks); integer noise on the fixed-point grid where the sum
#: is exact integer arithmetic on the two-lane encoding (secagg in Z_(2^64), bfv modulo its plaintext prime).
MECHANISMS = {"plain": "gaussian", "ckks": "gaussian", "secagg": "skellam", "bfv": "skellam", "split": "skellam"}
#: A share entry beyond TAIL standard deviations is redrawn (probability < 1e-32 per entry), so the
#: noisy sums have a hard bound the protection parameters can be sized for.
TAIL = 12.0
#: Integer noise standard deviation per Skellam share, in grid units: the grid 2^-f is chosen so that
#: a share's noise is about 2^20 grid steps (rounding far below the noise, Poisson rates < 2^40).
SKELLAM_SHARE_STEPS = 2.0 ** 20


@dataclass(frozen=True)
class DPSpec:
    """What a session declares: a target (epsilon, delta), or a noise multiplier z directly.

    ``min_contributors`` is t, the fewest hospitals whose shares must add up to the
    full noise: each adds 1/t of the variance, so t or more survivors give at
    least the declared noise, and the key holder refuses a release with fewer.
    """

    epsilon: float | None
    delta: float
    min_contributors: int
    noise_multiplier: float | None = None
    beta: float = 0.01

    def __post_init__(self):
        if (self.epsilon is None) == (self.noise_multiplier is None):
            raise param_error("epsilon", "DPSpec", "exactly one of epsilon and noise_multiplier", self.epsilon)
        if self.epsilon is not None:
            check_real("epsilon", self.epsilon, "DPSpec", low=0.0, low_open=True)
        if self.noise_multiplier is not None:
            check_real("noise_multiplier", self.noise_multiplier, "DPSpec", low=0.0, low_open=True)
        if check_real("delta", self.delta, "DPSpec", low=0.0, low_open=True) >= 0.1:
            raise param_error("delta", "DPSpec", "a float in (0, 0.1)", self.delta)
        check_int("min_contributors", self.min_contributors, "DPSpec", low=1)
        if check_real("beta", self.beta, "DPSpec", low=0.0, low_open=True) >= 0.5:
            raise param_error("beta", "DPSpec", "a float in (0, 0.5)", self.beta)


def sensitivity(bounds: Bounds, dim: int) -> tuple[float, float]:
    """(Delta_2, Delta_1) of the noised statistics for one sample (module docstring)."""
    B = float(bounds.max_norm)
    return math.sqrt(B ** 4 + B ** 2 + 2.0), dim * B * B + math.sqrt(dim) * B + 2.0


def noised_entries(layout) -> slice:
    """triu(C^r), Q, n and counts: everything but the contributor counter and the tag slots."""
    s = layout.slices
    return slice(s["gram"].start, s["counts"].stop)


def gaussian_rdp(z: float, orders=ORDERS) -> np.ndarray:
    return np.asarray(orders, dtype=np.float64) / (2.0 * z * z)


def skellam_rdp(mu: float, d2: float, d1: float, orders=ORDERS) -> np.ndarray:
    """Agarwal et al. (2021) bound for Skellam noise Poisson(mu) - Poisson(mu) per entry."""
    a = np.asarray(orders, dtype=np.float64)
    extra = np.minimum(((2 * a - 1) * d2 * d2 + 6 * d1) / (16 * mu * mu), 3 * d1 / (4 * mu))
    return a * d2 * d2 / (4 * mu) + extra


def epsilon_from_rdp(rdp, delta: float) -> float:
    from dp_accounting import rdp as _rdp

    eps, _ = _rdp.rdp_privacy_accountant.compute_epsilon(ORDERS, np.asarray(rdp, dtype=np.float64), delta)
    return float(eps)


def _skellam_units(z: float, d2: float, d1: float, frac_bits: int, m: int):
    """Integer-grid (mu, D2_int, D1_int) of the declared noise (z) summed over t shares of mu/t each."""
    sigma_int = z * d2 * 2.0 ** frac_bits
    mu = sigma_int ** 2 / 2.0
    return mu, d2 * 2.0 ** frac_bits + math.sqrt(m), d1 * 2.0 ** frac_bits + m


def release_rdp(params: SessionParams, contributors: int) -> np.ndarray:
    """Renyi curve of one release of ``params`` summed over ``contributors`` noise shares."""
    dp = params.dp
    if dp is None:
        raise InvalidParameterError("the session has no differential privacy configured")
    t = int(dp["min_contributors"])
    if contributors < t:
        raise InvalidParameterError(f"{contributors} noise shares carry less than the declared noise "
                                    f"(min_contributors={t})")
    scale = contributors / t  # each share has 1/t of the declared variance
    z = float(dp["noise_multiplier"]) * math.sqrt(scale)
    if dp["mechanism"] == "gaussian":
        return gaussian_rdp(z)
    mu, d2, d1 = _skellam_units(float(dp["noise_multiplier"]), float(dp["l2_sensitivity"]),
                                float(dp["l1_sensitivity"]), grid_bits(params),
                                int(dp["noised_entries"]))
    return skellam_rdp(mu * scale, d2, d1)


def release_epsilon(params: SessionParams, contributors: int) -> float:
    return epsilon_from_rdp(release_rdp(params, contributors), float(params.dp["delta"]))


def noise_multiplier_for(epsilon: float, delta: float, curve=None) -> float:
    """Smallest z (to 1e-6 relative) whose Renyi curve converts to at most ``epsilon``.

    ``curve(z)`` gives the curve; default the Gaussian one.
    """
    curve = curve or gaussian_rdp
    lo, hi = 1e-3, 1.0
    while epsilon_from_rdp(curve(hi), delta) > epsilon:
        hi *= 2.0
        if hi > 1e7:
            raise InvalidParameterError(f"epsilon={epsilon} is out of reach at delta={delta}")
    while hi / lo > 1 + 1e-6:
        mid = math.sqrt(lo * hi)
        if epsilon_from_rdp(curve(mid), delta) > epsilon:
            lo = mid
        else:
            hi = mid
    return hi


def grid_bits(params) -> int:
    """Fractional bits f of the Skellam noise grid 2^-f: the high lane's (grid values leave the low lane 0)."""
    fb = params.backend_params["frac_bits"]
    return int(fb[0]) if isinstance(fb, (list, tuple)) else int(fb)


def dp_config(spec: DPSpec, backend: str, bounds: Bounds, layout, *, frac_bits: int | None = None) -> dict:
    """The ``dp`` entry of the session parameters (bound into the parameter digest)."""
    if not isinstance(spec, DPSpec):
        raise param_error("spec", "dp_config", "a DPSpec", spec)
    mech = MECHANISMS[backend]
    d2, d1 = sensitivity(bounds, layout.dim)
    m = noised_entries(layout).stop
    if spec.noise_multiplier is not None:
        z = float(spec.noise_multiplier)
    elif mech == "gaussian":
        z = noise_multiplier_for(spec.epsilon, spec.delta)
    else:
        if frac_bits is None:
            raise InvalidParameterError("skellam noise needs the session's frac_bits")

        def curve(zz):
            mu, dd2, dd1 = _skellam_units(zz, d2, d1, frac_bits, m)
            return skellam_rdp(mu, dd2, dd1)

        z = noise_multiplier_for(spec.epsilon, spec.delta, curve)
    return {
        "mechanism": mech,
        "epsilon_target": None if spec.epsilon is None else float(spec.epsilon),
        "delta": float(spec.delta),
        "noise_multiplier": float(z),
        "sigma": float(z * d2),
        "l2_sensitivity": float(d2),
        "l1_sensitivity": float(d1),
        "noised_entries": int(m),
        "min_contributors": int(spec.min_contributors),
        "beta": float(spec.beta),
    }


def share_std(params: SessionParams) -> float:
    """Standard deviation of one hospital's noise share, in statistic units."""
    dp = params.dp
    return float(dp["sigma"]) / math.sqrt(int(dp["min_contributors"]))


def share_bound(params: SessionParams, frac_bits: int | None = None) -> int:
    """Skellam: the hard bound tau on |entry| of one hospital's noise share, in units of the grid 2^-f
    (``f`` the session's grid bits unless ``frac_bits`` is given): entries beyond TAIL standard deviations
    are redrawn, and the entries are integers. The split validity proof widens its statement by it."""
    dp = params.dp
    if dp is None or dp["mechanism"] != "skellam":
        raise InvalidParameterError("the session has no skellam noise configured")
    f = grid_bits(params) if frac_bits is None else int(frac_bits)
    return int(math.floor(TAIL * share_std(params) * 2.0 ** f))


def share_square_log_mgf(x: float, sd: float, tau: int) -> float:
    """An upper bound on ``ln E[exp(lambda z^2)]`` for one share entry z (Skellam of variance ``sd^2``, redrawn
    beyond ``|z| <= tau``), at ``x = 2 lambda sd^2`` in (0, 1).

    The pmf itself is out of reach at the sizes a session has (sd about 2^20 grid steps: Bessel functions of
    argument 2^40), so the MGF of the square is bounded through the Gaussian mixture
    ``exp(lambda z^2) = E_g exp(a g z)``, ``g ~ N(0, 1)``, ``a = sqrt(2 lambda)``. For each g the truncated entry
    has ``E[exp(a g z); |z| <= tau] <= min(exp(sd^2 (cosh(a g) - 1)), exp(a |g| tau))`` (the untruncated Skellam
    MGF, or the largest value on the support). Below a cut ``|g| <= u0`` the first is at most
    ``exp(lambda sd^2 g^2 (1 + eta))`` with ``eta = cosh(a u0) - 1`` (``cosh y - 1 <= (y^2 / 2) cosh y``), which
    integrates to ``(1 - x (1 + eta))^(-1/2)``; beyond, the second integrates to ``2 exp((a tau)^2 / 2)
    Phi(a tau - u0)``. The redraw conditions on ``|z| <= tau``, whose probability is at least ``1 - 2 exp(-tau^2
    / (2 (sd^2 + tau / 3)))`` (Bernstein for a difference of Poissons). Every cut gives a bound: the least over
    ``eta = 2^-1 .. 2^-60`` is taken; at sd = 2^20 it exceeds the Gaussian ``-ln(1 - x) / 2`` by a relative
    1e-8 at most."""
    from scipy import special

    a = math.sqrt(x) / sd
    eta = 2.0 ** -np.arange(1, 61, dtype=np.float64)
    c = x * (1.0 + eta)
    ok = c < 1.0
    eta, c = eta[ok], c[ok]
    main = -0.5 * np.log1p(-c)
    tail = math.log(2.0) + 0.5 * (a * tau) ** 2 + special.log_ndtr(a * tau - np.arccosh(1.0 + eta) / a)
    p_out = 2.0 * math.exp(-tau * tau / (2.0 * (sd * sd + tau / 3.0)))
    return float(np.min(np.logaddexp(main, tail))) - math.log1p(-p_out)


@functools.lru_cache(maxsize=256)
def share_square_tail(sd: float, tau: int, n: int, tail_bits: float) -> float:
    """A bound t on ``|z|^2`` for n independent share entries (grid units squared) that an honest share exceeds
    with probability at most ``2^-tail_bits``: Chernoff, ``P(sum z_i^2 >= t) <= exp(-lambda t) M(lambda)^n`` for
    every lambda > 0 (M the MGF of z^2, bounded by :func:`share_square_log_mgf`), so every lambda gives the valid
    ``t(lambda) = (n ln M(lambda) + tail_bits ln 2) / lambda``; a bounded 1-D search takes the least (where it
    stops does not matter for validity). At sd about 2^19.2 and 2^-41, ``t / (n sd^2)`` is 1.218 at n = 2 731,
    1.120 at 8 581 and 1.025 at 182 629 (the squares of 1.104, 1.058, 1.013)."""
    from scipy import optimize

    sd, n = float(sd), int(n)
    target = float(tail_bits) * math.log(2.0)

    def t_of(x):
        return (n * share_square_log_mgf(x, sd, int(tau)) + target) * 2.0 * sd * sd / x

    best = optimize.minimize_scalar(t_of, bounds=(1e-12, 1.0 - 1e-12), method="bounded",
                                    options={"xatol": 1e-12})
    return float(min(t_of(float(best.x)), t_of(0.5)))
