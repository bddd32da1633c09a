"""Distributed DP, library level: noise shares, accounting against dp_accounting, the solve, the ledger."""

import math

import dp_accounting
import numpy as np
import pytest
from scipy import stats as st

from secure_afl.analytic import solve_from_sums
from secure_afl.dp import DPSpec, add_noise_share, dp_solve, noise_share, psd_repair
from secure_afl.backends.session_params import dp_session_params
from secure_afl.dp.ledger import PrivacyLedger
from secure_afl.dp.mechanism import (grid_bits, epsilon_from_rdp, gaussian_rdp, noise_multiplier_for, release_epsilon,
                                     release_rdp, skellam_rdp, noised_entries)
from secure_afl.dp.solve import calibrated_ridge
from secure_afl.exceptions import InvalidParameterError
from secure_afl.packing import Layout
from secure_afl.params import Bounds, SessionParams
from secure_afl.stats import StatisticsAccumulator

LAYOUT = Layout(12, 4)
BOUNDS = Bounds(1.0, 500, 10)
#: every variance test below rejects a correct sampler with probability 1e-6 (two-sided chi-square)
ALPHA = 1e-6


def _params(backend, spec, **kw):
    if backend == "secagg":
        kw.setdefault("n_parties", 8)
    return dp_session_params(spec, backend, "dp-test", LAYOUT, 1.0, BOUNDS, **kw)


def _chi2_ok(x: np.ndarray, var: float) -> bool:
    n = x.size
    s = float(np.sum(x * x))  # the mean is 0 by construction: n degrees of freedom
    lo, hi = st.chi2.ppf(ALPHA / 2, n), st.chi2.isf(ALPHA / 2, n)
    return lo <= s / var <= hi


@pytest.mark.parametrize("backend", ["ckks", "secagg", "bfv"])
@pytest.mark.parametrize("hospitals,dropped", [(6, 0), (6, 2), (4, 0)])
def test_noise_shares_sum_to_the_declared_variance_with_dropouts(backend, hospitals, dropped):
    # Prepare: t = 4; the survivors' shares must sum to (survivors / t) sigma^2 >= sigma^2
    params = _params(backend, DPSpec(1.0, 1e-5, 4))
    rng = np.random.default_rng(20261123)
    survivors = hospitals - dropped
    sl = noised_entries(LAYOUT)
    unit = 2.0 ** grid_bits(params) if backend != "ckks" else 1.0
    var = params.dp["sigma"] ** 2 * survivors / 4 * unit ** 2
    # Execute
    total = sum(noise_share(params, rng) for _ in range(survivors))
    many = np.concatenate([total[sl]] + [sum(noise_share(params, rng) for _ in range(survivors))[sl]
                                         for _ in range(9)])
    # Assert
    assert var >= params.dp["sigma"] ** 2 * unit ** 2
    assert _chi2_ok(many, var)
    assert np.all(total[sl.stop:] == 0)  # the contributor counter and tag slots are never noised
    if backend != "ckks":
        assert np.all(many == np.round(many))  # integer noise on the grid


def test_variance_test_detects_a_missing_share():
    # the same test, fed t - 1 shares, must reject: it has the power to fail
    params = _params("ckks", DPSpec(1.0, 1e-5, 4))
    rng = np.random.default_rng(7)
    sl = noised_entries(LAYOUT)
    short = np.concatenate([sum(noise_share(params, rng) for _ in range(3))[sl] for _ in range(10)])
    assert not _chi2_ok(short, params.dp["sigma"] ** 2)


@pytest.mark.parametrize("backend", ["secagg", "bfv"])
def test_skellam_noise_is_exactly_the_integer_share_in_the_lanes(backend):
    from secure_afl.hazmat import fixedpoint

    params = _params(backend, DPSpec(1.0, 1e-5, 4))
    f = params.backend_params["frac_bits"]
    v = np.random.default_rng(1).uniform(-50, 50, LAYOUT.length)
    noisy = add_noise_share(params, v, np.random.default_rng(3))
    share = noise_share(params, np.random.default_rng(3))
    hi_noisy, lo_noisy = fixedpoint.lane_sums(fixedpoint.encode(noisy, f))
    hi_v, _ = fixedpoint.lane_sums(fixedpoint.encode(v, f))
    # the noised statistics are rounded to the noise grid 2^-f1 (the high lane) and the share is added there
    # exactly; the counter and tag slots keep their full two-lane precision
    sl = noised_entries(LAYOUT)
    assert np.array_equal(hi_noisy - hi_v, share.astype(np.int64)) and not lo_noisy[sl].any()
    assert np.array_equal(noisy[sl.stop:], v[sl.stop:])


@pytest.mark.parametrize("z", [0.7, 1.3, 4.0, 11.0])
def test_gaussian_accounting_matches_dp_accounting(z):
    ours = epsilon_from_rdp(gaussian_rdp(z), 1e-5)
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(z))
    assert ours == pytest.approx(acc.get_epsilon(1e-5), rel=1e-12)
    # the tight (PLD) figure is never above the RDP one we report
    pld = dp_accounting.pld.PLDAccountant()
    pld.compose(dp_accounting.GaussianDpEvent(z))
    assert pld.get_epsilon(1e-5) <= ours + 1e-9


@pytest.mark.parametrize("eps", [0.5, 1.0, 8.0])
def test_calibrated_session_meets_its_target(eps):
    params = _params("ckks", DPSpec(eps, 1e-5, 3))
    z = params.dp["noise_multiplier"]
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(z))
    assert acc.get_epsilon(1e-5) <= eps
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(z * 0.999))
    assert acc.get_epsilon(1e-5) > eps  # the least noise that meets it
    assert release_epsilon(params, 3) <= eps


@pytest.mark.parametrize("backend", ["secagg", "bfv"])
def test_skellam_accounting_is_the_gaussian_plus_a_vanishing_term(backend):
    params = _params(backend, DPSpec(1.0, 1e-5, 4))
    rdp = release_rdp(params, 4)
    z_int = params.dp["noise_multiplier"]
    g = gaussian_rdp(z_int)
    assert np.all(rdp >= g * (1 - 1e-12)) and np.all(rdp <= g * 1.001)
    assert release_epsilon(params, 4) <= 1.0
    # small mu: the correction is what the paper's bound says, and it is not negligible
    assert skellam_rdp(10.0, 1.0, 5.0)[0] > gaussian_rdp(math.sqrt(20.0))[0]


def test_ledger_composes_releases_like_dp_accounting(tmp_path):
    params = _params("ckks", DPSpec(1.0, 1e-5, 3))
    with PrivacyLedger(tmp_path / "p.sqlite3") as pl:
        for i in range(3):
            r = release_rdp(params, 3)
            pl.record(f"s{i}", f"agg{i}", r, 1e-5, epsilon_from_rdp(r, 1e-5))
        pl.record("s0-again", "agg0", release_rdp(params, 3), 1e-5, 0.0)  # same aggregate: nothing new
        composed = pl.preview("agg-next", None if False else release_rdp(params, 3), 1e-5)
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(params.dp["noise_multiplier"]), 4)
    assert composed == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)


def test_a_release_without_dp_voids_the_composed_guarantee(tmp_path):
    params = _params("ckks", DPSpec(1.0, 1e-5, 3))
    with PrivacyLedger(tmp_path / "p.sqlite3") as pl:
        pl.record("plain", "agg0", None, 0.0, float("inf"))
        assert pl.preview("agg1", release_rdp(params, 3), 1e-5) == float("inf")


@pytest.mark.parametrize("backend", ["plain", "ckks", "secagg", "bfv"])
def test_dp_off_changes_nothing(backend):
    # no dp: the same parameters (digest) as before and the vector is untouched, so W is exactly today's
    from secure_afl.backends.bfv import bfv_session_params
    from secure_afl.backends.ckks import ckks_session_params
    from secure_afl.backends.secagg import secagg_session_params

    kw = {"n_parties": 5} if backend == "secagg" else {}
    p = dp_session_params(None, backend, "s", LAYOUT, 1.0, BOUNDS, **kw)
    ref = {"plain": lambda: SessionParams("s", "plain", LAYOUT, 1.0, BOUNDS),
           "ckks": lambda: ckks_session_params("s", LAYOUT, 1.0, BOUNDS),
           "secagg": lambda: secagg_session_params("s", LAYOUT, 1.0, BOUNDS, **kw),
           "bfv": lambda: bfv_session_params("s", LAYOUT, 1.0, BOUNDS)}[backend]()
    assert p.digest() == ref.digest() and "dp" not in p.to_dict()
    v = np.arange(LAYOUT.length, dtype=np.float64)
    assert add_noise_share(p, v) is v


def test_dp_is_bound_into_the_parameter_digest():
    a = _params("ckks", DPSpec(1.0, 1e-5, 3))
    b = _params("ckks", DPSpec(2.0, 1e-5, 3))
    assert a.digest() != b.digest()
    assert SessionParams.from_dict(a.to_dict()).digest() == a.digest()


def test_calibrated_ridge_dominates_the_noise():
    # lambda_min(E) >= -lambda in (much) more than 1 - beta of the draws
    params = _params("ckks", DPSpec(1.0, 1e-5, 1))
    rng = np.random.default_rng(11)
    d, s = LAYOUT.dim, params.dp["sigma"]
    lam = calibrated_ridge(s, d, 0.01)
    iu = np.triu_indices(d)
    worst = []
    for _ in range(300):
        E = np.zeros((d, d))
        E[iu] = rng.normal(0, s, iu[0].size)
        E = E + np.triu(E, 1).T
        worst.append(np.linalg.eigvalsh(E)[0])
    assert np.mean(np.array(worst) < -lam) <= 0.01


def test_dp_solve_is_usable_where_ri_restoration_is_not():
    # Prepare: a small cohort whose noisy C (RI removed) is indefinite
    rng = np.random.default_rng(0)
    params = _params("ckks", DPSpec(1.0, 1e-5, 3))
    acc = StatisticsAccumulator(LAYOUT.dim, LAYOUT.n_classes, max_norm=1.0)
    X = rng.standard_normal((500, LAYOUT.dim))
    X *= 0.999 / np.linalg.norm(X, axis=1, keepdims=True)
    y = np.argmax(X[:, :4], axis=1)
    acc.update(X, y)
    clean = acc.finalize(gamma=0.0)
    v = LAYOUT.pack(type(clean)(clean.gram + 3 * np.eye(LAYOUT.dim), clean.cross, clean.n, clean.class_counts,
                                3.0, 1.0))
    noisy = v + sum(noise_share(params, rng) for _ in range(3))
    stats = LAYOUT.unpack(noisy, gamma=1.0)
    # Execute
    W, info = dp_solve(stats, params, 3)
    W_ri = solve_from_sums(stats)
    # Assert: RI-restored noisy C is indefinite and its W is useless; the DP solve classifies
    C_ri = stats.gram - 3 * np.eye(LAYOUT.dim)
    assert np.linalg.eigvalsh(C_ri)[0] < 0
    acc_dp = np.mean(np.argmax(X @ W, 1) == y)
    acc_ri = np.mean(np.argmax(X @ W_ri, 1) == y)
    assert acc_dp > 0.7 and acc_dp > acc_ri + 0.1
    assert np.all(np.linalg.eigvalsh(psd_repair(stats.gram)) >= -1e-9)


def test_bad_dp_declarations_are_typed_errors():
    with pytest.raises(InvalidParameterError):
        DPSpec(None, 1e-5, 3)
    with pytest.raises(InvalidParameterError):
        DPSpec(1.0, 0.5, 3)
    with pytest.raises(InvalidParameterError):
        DPSpec(-1.0, 1e-5, 3)
    with pytest.raises(InvalidParameterError):
        _params("ckks", DPSpec(1.0, 1e-5, 11))  # t > k_max
    with pytest.raises(InvalidParameterError):
        release_rdp(_params("ckks", DPSpec(1.0, 1e-5, 3)), 2)


def test_dp_sanity_check_refuses_garbage_and_a_wrong_counter():
    from secure_afl.dp import dp_sanity_check
    from secure_afl.exceptions import BoundsExceeded, SanityCheckFailed

    params = _params("secagg", DPSpec(1.0, 1e-5, 3))
    stats = LAYOUT.unpack(np.zeros(LAYOUT.length), gamma=1.0)
    stats.contributors = 3.0
    assert dp_sanity_check(stats, params, 3)["noisy_bound"]
    with pytest.raises(SanityCheckFailed):
        dp_sanity_check(stats, params, 4)
    stats.gram[0, 0] = 2.0 ** 62  # what a wrapped or unmasked-with-wrong-material sum looks like
    with pytest.raises(SanityCheckFailed):
        dp_sanity_check(stats, params, 3)
    with pytest.raises(BoundsExceeded):
        add_noise_share(params, np.full(LAYOUT.length, 2.0 ** 40))


def test_session_toml_dp_section(tmp_path):
    from secure_afl.server.config import load_config, write_config

    base = {"session": {"id": "s", "backend": "ckks", "dim": 4, "classes": 2, "min_clients": 3,
                        "hospitals": ["a", "b", "c"]},
            "bounds": {"max_norm": 1.0, "n_max": 10, "k_max": 5}}
    write_config(tmp_path / "a.toml", {**base, "dp": {"epsilon": 2.0}})
    cfg = load_config(tmp_path / "a.toml")
    assert (cfg.dp.epsilon, cfg.dp.delta, cfg.dp.min_contributors) == (2.0, 1e-5, 3)
    write_config(tmp_path / "b.toml", {**base, "dp": {"epsilon": 2.0, "sigma": 3.0}})
    with pytest.raises(InvalidParameterError):
        load_config(tmp_path / "b.toml")
    write_config(tmp_path / "c.toml", base)
    assert load_config(tmp_path / "c.toml").dp is None


def test_renyi_orders_are_dp_accountings_defaults():
    from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS

    from secure_afl.dp.mechanism import ORDERS

    np.testing.assert_array_equal(ORDERS, np.asarray(DEFAULT_RDP_ORDERS, dtype=np.float64))
