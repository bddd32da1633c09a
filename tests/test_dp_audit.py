"""Empirical privacy audit (canary membership test): the measured lower bound stays under the accounted epsilon."""

import pytest

from secure_afl.dp import DPSpec
from secure_afl.privacy_audit import audit_params, audit_session

pytestmark = pytest.mark.security


@pytest.mark.parametrize("backend,eps", [("plain", 1.0), ("plain", 8.0), ("secagg", 8.0)])
def test_empirical_epsilon_stays_below_the_accounted_one(backend, eps):
    # Prepare
    kw = {"n_parties": 4} if backend == "secagg" else {}
    params = audit_params(DPSpec(eps, 1e-5, 4), backend, **kw)
    # Execute: 2 x 2000 releases, one hospital of four dropped
    r = audit_session(params, hospitals=5, survivors=4, runs=2000, seed=1)
    # Assert: a 95%-confidence lower bound; the accounted epsilon is an upper bound
    assert r.epsilon_lower_bound <= r.epsilon_accounted <= eps


def test_audit_detects_a_mechanism_that_adds_less_noise_than_it_accounts_for():
    # Prepare: the session accounts epsilon = 1 but its shares carry a tenth of the noise
    params = audit_params(DPSpec(1.0, 1e-5, 4))
    weak = params.with_dp({**params.dp, "sigma": params.dp["sigma"] / 10})
    # Execute
    r = audit_session(weak, runs=2000, seed=1, accounted=1.0)
    # Assert: the audit measures more leakage than the claim allows
    assert r.epsilon_lower_bound > 1.0


def test_bench_dp_audit_cli_prints_the_table(capsys):
    from secure_afl.cli import main

    assert main(["bench", "dp-audit", "--backends", "plain", "--epsilons", "2", "--runs", "400"]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| plain")][0]
    accounted, lower = (float(x) for x in row.split("|")[4:6])
    assert lower <= accounted <= 2.0
