"""Distributed DP with ``split``: each hospital's Skellam share goes in before its mask, the key holder accounts
the release its share enables exactly as it accounts a secagg release, the collector solves the noisy sum."""

import numpy as np
import pytest

from secure_afl.analytic import solve_from_sums, solve_head
from secure_afl.dp import DPSpec, dp_session_params, psd_repair
from secure_afl.dp.ledger import PrivacyLedger
from secure_afl.dp.solve import calibrated_ridge
from secure_afl.exceptions import DecryptionRefused, SecureAFLError
from secure_afl.packing import Layout
from secure_afl.params import Bounds

DP = {"epsilon": 1.0, "delta": 1e-5, "min_contributors": 3}
SPEC = DPSpec(DP["epsilon"], DP["delta"], DP["min_contributors"])
NAMES = ("h1", "h2", "h3", "h4")


def _split_session(c):
    conn = c.connect_keyholder()
    c.keyholder.keygen(dp_session_params(SPEC, "split", c.session_id, Layout(c.dim, c.classes), 1.0,
                                         Bounds(c.max_norm, 1000, 8)))
    c.keyholder.publish(conn)
    return conn


def _data(c):
    return {h: c.data(h, n=60) for h in c.hospitals}


def _total(c, data, names):
    total = None
    for h in names:
        s = c.stats(*data[h])
        total = s if total is None else total + s
    return total


def test_split_and_secagg_noise_parameters_are_the_same():
    # Execute: the same declared DP on the same layout and bounds
    lay, b = Layout(6, 3), Bounds(4.0, 1000, 8)
    sp = dp_session_params(SPEC, "split", "s", lay, 1.0, b)
    sa = dp_session_params(SPEC, "secagg", "s", lay, 1.0, b, n_parties=4, threshold=2, min_clients=3)

    # Assert: one mechanism, one noise, one grid (the high lane's bits), so one accounting
    assert sp.dp == sa.dp and sp.dp["mechanism"] == "skellam"
    assert sp.backend_params["frac_bits"][0] == sa.backend_params["frac_bits"][0]
    assert sp.bounds == sa.bounds


@pytest.mark.e2e
def test_split_dp_release_is_noisy_and_accounted_as_secagg_accounts_it(consortium):
    from support import run_hospitals

    # Prepare: the same four hospitals' data, once through split and once through secagg, both with [dp]
    c = consortium(backend="split", hospitals=NAMES, min_clients=3, dp=DP).start()
    data = _data(c)
    conn = _split_session(c)
    for h in NAMES:
        cl = c.hospital(h)
        cl.submit(c.stats(*data[h]))
        cl.close()
    s = consortium(backend="secagg", hospitals=NAMES, min_clients=3, dp=DP,
                   secagg={"threshold": 2, "stage_timeout_s": 6.0}).start()
    _, errors = run_hospitals(s, data, {})
    assert not errors, errors

    # Execute
    res = c.keyholder.finalize(conn, min_clients=3)
    conn.close()
    sconn = s.connect_keyholder()
    ref = s.keyholder.finalize(sconn, min_clients=3)
    sconn.close()

    # Assert: noise of four shares of sigma^2 / 3 is in the released Gram and cross
    truth = _total(c, data, NAMES)
    dp = res.report["dp"]
    iu = np.triu_indices(c.dim)
    resid = np.concatenate([(res.stats.gram - truth.gram - 4.0 * np.eye(c.dim))[iu],
                            (res.stats.cross - truth.cross).ravel()])
    expected_sd = dp["sigma"] * np.sqrt(4 / 3)
    assert 0.5 < resid.std() / expected_sd < 1.6  # 39 entries: the ratio's 1e-6 two-sided range is (0.45, 1.75)
    # the same accounting as secagg's for the same declared DP and cohort: the same curve, epsilon and record
    sdp = ref.report["dp"]
    for key in ("mechanism", "sigma", "noise_multiplier", "delta", "min_contributors", "contributors", "epsilon"):
        assert dp[key] == sdp[key], key
    assert dp["epsilon"] <= DP["epsilon"] and dp["epsilon_composed"] == pytest.approx(dp["epsilon"])
    with PrivacyLedger(c.keyholder.keys_dir / "privacy.sqlite3") as pl:
        rows = pl.releases()
    assert [(r["session_id"], r["aggregate_sha256"], r["epsilon"]) for r in rows] == \
        [(c.session_id, res.manifest["aggregate_sha256"], dp["epsilon"])]
    # the collector's solve: PSD repair plus the calibrated ridge beyond the RI term, never RI restoration
    lam = calibrated_ridge(expected_sd, c.dim, 0.01)
    W_expected = solve_head(psd_repair(res.stats.gram), res.stats.cross, lam=max(0.0, lam - 4.0))
    assert np.allclose(res.W, W_expected, rtol=1e-9, atol=1e-12)
    W_ri = solve_from_sums(res.stats)
    assert np.linalg.norm(res.W - W_ri) > 1e-3 * np.linalg.norm(W_ri)


@pytest.mark.e2e
def test_split_dp_share_refused_with_fewer_noise_shares_than_declared(consortium):
    # Prepare: min_clients 2 lets the server close on two uploads; the noise needs three shares
    c = consortium(backend="split", hospitals=("h1", "h2", "h3"), min_clients=2, dp=DP).start()
    conn = _split_session(c)
    data = _data(c)
    for h in ("h1", "h2"):
        cl = c.hospital(h)
        cl.submit(c.stats(*data[h]))
        cl.close()

    # Execute / Assert: no share leaves, nothing is accounted, the collector has nothing to release
    with pytest.raises(DecryptionRefused) as e:
        c.keyholder.finalize(conn, min_clients=2)
    assert e.value.reason == "dp_noise_short"
    with PrivacyLedger(c.keyholder.keys_dir / "privacy.sqlite3") as pl:
        assert pl.releases() == []
    with pytest.raises(SecureAFLError):
        conn.request("GET", conn.path("/split/result"))
    conn.close()
