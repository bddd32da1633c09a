"""Distributed DP through the real service: hospitals' noise shares, the key holder's accounting and solve."""

import numpy as np
import pytest

from secure_afl.dp import DPSpec
from secure_afl.backends.session_params import dp_session_params
from secure_afl.exceptions import DecryptionRefused
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from support import plain_reference
from support.dp_release import check_four_share_noise, check_noisy_solve


pytestmark = pytest.mark.e2e

DP = {"epsilon": 1.0, "delta": 1e-5, "min_contributors": 3}




def _session(c, backend, spec):
    conn = c.connect_keyholder()
    if backend in ("ckks", "bfv"):
        params = dp_session_params(spec, backend, c.session_id, Layout(c.dim, c.classes), 1.0,
                                   Bounds(c.max_norm, 1000, 8))
        c.keyholder.keygen(params)
        c.keyholder.publish(conn)
    return conn


def _upload_all(c, names):
    data = {h: c.data(h, n=60) for h in names}
    for h, (X, y) in data.items():
        cl = c.hospital(h)
        cl.submit(c.stats(X, y))
        cl.close()
    return plain_reference(c, data)


@pytest.mark.parametrize("backend", ["plain", "ckks", "bfv"])
def test_dp_release_is_noisy_accounted_and_never_ri_restored(consortium, backend):
    # Prepare
    spec = DPSpec(DP["epsilon"], DP["delta"], DP["min_contributors"])
    c = consortium(backend=backend, hospitals=("h1", "h2", "h3", "h4"), min_clients=3, dp=DP).start()
    conn = _session(c, backend, spec)
    # Execute
    truth = _upload_all(c, c.hospitals)
    res = c.keyholder.finalize(conn, min_clients=3)
    conn.close()
    # Assert: the revealed Gram carries noise of the summed shares' standard deviation (4 shares of sigma^2/3)
    expected_sd = check_four_share_noise(res, truth)
    # accounted: a release of 4 shares is better than the declared target; the ledger composes it
    dp = res.report["dp"]
    assert dp["epsilon"] <= DP["epsilon"] and dp["epsilon_composed"] == pytest.approx(dp["epsilon"])
    # the solve: PSD repair of the revealed C^r plus the calibrated ridge beyond the RI term, no RI restoration
    check_noisy_solve(res, expected_sd)


@pytest.mark.parametrize("backend", ["plain", "bfv"])
def test_dp_release_refused_with_fewer_noise_shares_than_declared(consortium, backend):
    # Prepare: min_clients 2 lets the server release two uploads; the noise needs three shares
    spec = DPSpec(DP["epsilon"], DP["delta"], DP["min_contributors"])
    c = consortium(backend=backend, hospitals=("h1", "h2", "h3"), min_clients=2, dp=DP).start()
    conn = _session(c, backend, spec)
    _upload_all(c, ["h1", "h2"])
    # Execute / Assert
    with pytest.raises(DecryptionRefused) as e:
        c.keyholder.finalize(conn, min_clients=2)
    assert e.value.reason == "dp_noise_short"
    # nothing was decrypted: asked again, the key holder gives the same answer (a decryption would have used
    # up or blocked the bfv key, and the second attempt would be refused for that instead)
    with pytest.raises(DecryptionRefused) as again:
        c.keyholder.finalize(conn, min_clients=2)
    conn.close()
    assert again.value.reason == "dp_noise_short"


def test_demo_with_dp_through_the_real_service(tmp_path, capsys):
    import json

    from secure_afl.cli import main

    # Execute: secagg (Skellam integer noise), three hospitals, a real server process
    rc = main(["demo", "--backend", "secagg", "--hospitals", "3", "--dp", "2", "--dataset", "breast-cancer",
               "--report", str(tmp_path / "r.json")])
    # Assert
    r = json.loads((tmp_path / "r.json").read_text())
    assert rc == 0 and r["verification"]["passed"]
    assert r["dp"]["mechanism"] == "skellam" and r["dp"]["epsilon"] <= 2.0
    assert r["verification"]["stats_max_abs_error"] > 1e-3  # the release is noisy, not the plaintext sum


def test_secagg_dp_with_a_dropout_is_accounted_at_the_survivors_noise(consortium):
    from support import run_hospitals

    # Prepare: 5 hospitals, any 3 shares carry the declared noise; h05 vanishes before its masked input
    names = ("h01", "h02", "h03", "h04", "h05")
    # min_clients 2: with t = 3 (c = 2 colluders) the consistency quorum max((5 + 2) // 2 + 1, 2 + 2) = 4
    # still lets the round finish with one hospital gone; the key holder's own policy below asks for 3
    c = consortium(backend="secagg", hospitals=names, min_clients=2, dp=DP,
                   secagg={"threshold": 3, "stage_timeout_s": 6.0}).start()
    data = {h: c.data(h, n=60) for h in names}
    # Execute
    results, errors = run_hospitals(c, data, {"h05": "masked_input"})
    conn = c.connect_keyholder()
    res = c.keyholder.finalize(conn, min_clients=3)
    conn.close()
    # Assert: four integer shares summed; the key holder accounts exactly those
    assert not errors, errors
    survivors = ["h01", "h02", "h03", "h04"]
    assert res.report["participants"] == survivors
    check_four_share_noise(res, plain_reference(c, data, survivors))
    dp = res.report["dp"]
    assert dp["contributors"] == 4 and dp["epsilon"] < DP["epsilon"]


def test_dp_release_of_garbage_is_refused_by_the_noise_aware_checks(consortium):
    import base64
    import os

    from secure_afl.exceptions import SanityCheckFailed
    from secure_afl.params import SessionParams

    # Prepare: a secagg DP round; then the unmask material is corrupted (one survivor's self-mask seed)
    from support import run_hospitals

    # min_clients 2: three hospitals with t = 2 (c = 1) reach the quorum max((3 + 1) // 2 + 1, 2 + 1) = 3
    c = consortium(backend="secagg", hospitals=("h1", "h2", "h3"), min_clients=2, dp=DP,
                   secagg={"threshold": 2, "stage_timeout_s": 6.0}).start()
    _, errors = run_hospitals(c, {h: c.data(h, n=60) for h in c.hospitals}, {})
    assert not errors, errors
    conn = c.connect_keyholder()
    c.keyholder.close_round(conn)
    params = SessionParams.from_dict(conn.info()["params"])
    aggregate = conn.request("GET", conn.path("/aggregate")).content
    manifest = conn.request("GET", conn.path("/manifest")).json()
    material = conn.request("GET", conn.path("/secagg/unmask-material")).json()
    conn.close()
    first = sorted(material["self_mask_seeds"])[0]
    material["self_mask_seeds"][first] = base64.b64encode(os.urandom(32)).decode()
    # Execute / Assert: the unmasked "sum" is uniform garbage; noise does not excuse it
    with pytest.raises(SanityCheckFailed):
        c.keyholder.reveal_and_solve(params, aggregate, manifest, min_clients=3, unmask=material)


def test_rare_class_refusal_applies_without_dp_and_not_under_dp(consortium):
    # Prepare: 28 of 30 classes have 2 samples each; the same uploads with and without [dp]. Under DP each
    # noisy count lands in the refused range (0, 5) with probability ~1/4, so a key holder that applied the
    # rule to noisy counts would refuse this release with probability ~1 - 3e-4.
    def run(dp):
        c = consortium(backend="plain", hospitals=("h1", "h2", "h3"), min_clients=3, dp=dp, classes=30,
                       max_norm=0.5).start()
        conn = _session(c, "plain", None)
        for k, h in enumerate(c.hospitals):
            X, y = c.data(h, n=80)
            y = y % 2
            if k == 0:
                y[:56] = np.repeat(np.arange(2, 30), 2)
            cl = c.hospital(h)
            cl.submit(c.stats(X, y))
            cl.close()
        try:
            return c.keyholder.finalize(conn, min_clients=3)
        finally:
            conn.close()

    # Execute / Assert: exact counts disclose the rare classes and are refused; DP noise covers them
    from secure_afl.exceptions import PolicyViolation

    with pytest.raises(PolicyViolation, match="min_class_count"):
        run(None)
    res = run(DP)
    assert res.report["dp"]["epsilon"] <= DP["epsilon"]
    assert res.W.shape == (res.stats.dim, 30)
