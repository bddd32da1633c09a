"""The noise share's l2 bound (split with DP and the Gram statement): the Chernoff bound of the share's own
distribution holds an honest share with the stated tail, checked independently of the bound's derivation:
exact enumeration of the truncated Skellam at a small variance, and Monte Carlo with the mechanism's own draws
at the variance a session has."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from secure_afl import split
from secure_afl.backends.session_params import dp_session_params
from secure_afl.dp import DPSpec
from secure_afl.dp.mechanism import share_square_log_mgf, share_square_tail
from secure_afl.packing import Layout
from secure_afl.params import Bounds


def _truncated_skellam(sd, tau):
    k = np.arange(-tau, tau + 1)
    p = stats.skellam.pmf(k, sd * sd / 2, sd * sd / 2)
    return k, p / p.sum()


def _bennett(sd, tau, n, tail_bits):
    """The variance-and-range bound the Chernoff bound replaces (Bennett's inequality on Y = z^2)."""
    v, b = 3.0 * sd ** 4 + sd * sd, float(tau) ** 2
    h = lambda u: (1 + u) * math.log1p(u) - u  # noqa: E731
    lo, hi = 0.0, 1.0
    while n * v / b ** 2 * h(hi) < tail_bits * math.log(2):
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if n * v / b ** 2 * h(mid) < tail_bits * math.log(2) else (lo, mid)
    return n * sd * sd + hi * n * v / b


@pytest.mark.parametrize("x", [0.01, 0.2, 0.6, 0.95])
def test_the_mgf_bound_of_the_square_is_above_the_exact_sum_over_the_support(x):
    for sd in (3.0, 30.0, 300.0):
        tau = int(12 * sd)
        k, p = _truncated_skellam(sd, tau)
        exact = math.log(float(np.sum(p * np.exp(x / (2 * sd * sd) * k.astype(float) ** 2))))
        assert share_square_log_mgf(x, sd, tau) >= exact
    # and at a session's variance it is the Gaussian's to within 1e-8 (nothing is lost to the bound)
    assert share_square_log_mgf(x, 2.0 ** 20, 12 * 2 ** 20) == pytest.approx(-0.5 * math.log1p(-x), rel=1e-8)


@pytest.mark.parametrize("tail_bits", [10, 20, 40])
def test_the_exact_tail_at_the_bound_is_below_the_stated_probability(tail_bits):
    # n = 3 entries of a truncated Skellam of sd 20: the exact distribution of z1^2 + z2^2 + z3^2 by enumeration
    sd, tau = 20.0, 240
    k, p = _truncated_skellam(sd, tau)
    sq = k.astype(np.int64) ** 2
    pair = (sq[:, None] + sq[None, :]).ravel()
    pp = (p[:, None] * p[None, :]).ravel()
    order = np.argsort(pair)
    pair, pp = pair[order], pp[order]
    above = np.concatenate([np.cumsum(pp[::-1])[::-1], [0.0]])  # P(pair >= pair[i])
    t = math.ceil(share_square_tail(sd, tau, 3, tail_bits))
    tail = float(np.sum(p * above[np.searchsorted(pair, t - sq, side="left")]))
    assert 0 < tail <= 2.0 ** -tail_bits
    assert t < _bennett(sd, tau, 3, tail_bits)


def test_monte_carlo_at_a_sessions_variance_stays_below_the_tail_and_near_it():
    # 16 entries at sd = 2^19.5, tail 2^-8: 2^17 draws of the mechanism's own Poisson difference
    sd, n, tail_bits, draws = 2.0 ** 19.5, 16, 8, 1 << 17
    tau = int(12 * sd)
    t = share_square_tail(sd, tau, n, tail_bits)
    rng = np.random.default_rng(5)
    lam = sd * sd / 2
    z = (rng.poisson(lam, (draws, n)) - rng.poisson(lam, (draws, n))).astype(np.float64)
    assert np.all(np.abs(z) <= tau)
    hits = int(np.count_nonzero(np.sum(z * z, axis=1) >= t))
    # the Chernoff bound is a bound: the frequency stays below 2^-8 (512 of 2^17) with a wide margin (the
    # Chernoff slack is a factor of a few), and it is not vacuous: a bound 10 % lower is crossed far more often
    assert hits <= draws >> tail_bits
    assert int(np.count_nonzero(np.sum(z * z, axis=1) >= 0.9 * t)) > 2 * hits
    assert t < _bennett(sd, tau, n, tail_bits)


def test_the_sessions_bound_is_tighter_than_bennetts_and_near_the_expected_norm():
    spec = DPSpec(1.0, 1e-5, 3)
    for dim, classes, hi in ((64, 10, 1.12), (64, 100, 1.07), (512, 100, 1.02)):
        params = dp_session_params(spec, "split", f"chernoff-{dim}-{classes}", Layout(dim, classes), 1.0,
                                   Bounds(1.0, 1000, 10), gram_proof=True)
        f1 = int(params.backend_params["frac_bits"][0])
        g = split.sizes.gramsizes(params, f1)
        sd = split.sizes.dp_share_std(params) * 2.0 ** f1
        tau = split.sizes.noise_bound(params, f1)
        assert g["n_z"] * sd * sd < g["l2_z"] < _bennett(sd, tau, g["n_z"], 41)
        assert 1.0 < math.sqrt(g["l2_z"] / g["n_z"]) / sd < hi
