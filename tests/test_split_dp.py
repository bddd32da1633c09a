"""Distributed DP with ``split``: each hospital's Skellam share goes in before its mask, the key holder accounts
the release its share enables exactly as it accounts a secagg release, the collector solves the noisy sum."""

import os

import numpy as np
import pytest

from secure_afl.dp import DPSpec
from secure_afl.backends.session_params import dp_session_params
from secure_afl.dp.ledger import PrivacyLedger
from secure_afl.exceptions import BoundsExceeded, DecryptionRefused, SecureAFLError
from secure_afl.packing import Layout
from secure_afl.params import Bounds

from support import plain_reference
from support.dp_release import check_four_share_noise, check_noisy_solve
from support.split_cheat import keeping_honest_bits

DP = {"epsilon": 1.0, "delta": 1e-5, "min_contributors": 3}
SPEC = DPSpec(DP["epsilon"], DP["delta"], DP["min_contributors"])
NAMES = ("h1", "h2", "h3", "h4")
#: what this file tests: DP without the Gram statement (tests/test_split_dp_gram.py has it with), signed
#: explicitly since the default split session proves it
NO_GRAM = {"gram_proof": False, "field": "goldilocks"}


def _split_session(c):
    conn = c.connect_keyholder()
    c.keyholder.keygen(dp_session_params(SPEC, "split", c.session_id, Layout(c.dim, c.classes), 1.0,
                                         Bounds(c.max_norm, 1000, 8), **NO_GRAM))
    c.keyholder.publish(conn)
    return conn


def _data(c):
    return {h: c.data(h, n=60) for h in c.hospitals}


def _started_with_honest(consortium, honest, *, hospitals=NAMES, min_clients=3):
    """A DP split consortium with its key published and ``honest`` hospitals' statistics submitted by the
    ordinary client: (consortium, data, key holder connection)."""
    # one refusal within the signed limit: the tests below refuse one upload and judge what is left
    c = consortium(backend="split", hospitals=hospitals, min_clients=min_clients, dp=DP, split=NO_GRAM,
                   extra_session={"max_refusals": 1}).start()
    data = _data(c)
    conn = _split_session(c)
    for h in honest:
        cl = c.hospital(h)
        cl.submit(c.stats(*data[h]))
        cl.close()
    return c, data, conn


def _check_refused_for_short_noise(c, conn):
    """The key holder refuses its share for want of noise shares, accounts nothing, and the collector has
    nothing to release (it would hold a sum short of the declared noise)."""
    with pytest.raises(DecryptionRefused) as e:
        c.keyholder.finalize(conn, min_clients=2)
    assert e.value.reason == "dp_noise_short"
    with PrivacyLedger(c.keyholder.keys_dir / "privacy.sqlite3") as pl:
        assert pl.releases() == []
    with pytest.raises(SecureAFLError):
        conn.request("GET", conn.path("/split/result"))
    conn.close()


def test_split_and_secagg_noise_parameters_are_the_same():
    # Execute: the same declared DP on the same layout and bounds
    lay, b = Layout(6, 3), Bounds(4.0, 1000, 8)
    sp = dp_session_params(SPEC, "split", "s", lay, 1.0, b, **NO_GRAM)
    sa = dp_session_params(SPEC, "secagg", "s", lay, 1.0, b, n_parties=4, threshold=2, min_clients=3)

    # Assert: one mechanism, one noise, one grid (the high lane's bits), so one accounting
    assert sp.dp == sa.dp and sp.dp["mechanism"] == "skellam"
    assert sp.backend_params["frac_bits"][0] == sa.backend_params["frac_bits"][0]
    assert sp.bounds == sa.bounds


@pytest.mark.e2e
def test_split_dp_release_is_noisy_and_accounted_as_secagg_accounts_it(consortium):
    from support import run_hospitals

    # Prepare: the same four hospitals' data, once through split and once through secagg, both with [dp]
    c, data, conn = _started_with_honest(consortium, NAMES)
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
    expected_sd = check_four_share_noise(res, plain_reference(c, data, NAMES))
    # the same accounting as secagg's for the same declared DP and cohort: the same curve, epsilon and record
    dp, sdp = res.report["dp"], ref.report["dp"]
    for key in ("mechanism", "sigma", "noise_multiplier", "delta", "min_contributors", "contributors", "epsilon"):
        assert dp[key] == sdp[key], key
    assert dp["epsilon"] <= DP["epsilon"] and dp["epsilon_composed"] == pytest.approx(dp["epsilon"])
    with PrivacyLedger(c.keyholder.keys_dir / "privacy.sqlite3") as pl:
        rows = pl.releases()
    assert [(r["session_id"], r["aggregate_sha256"], r["epsilon"]) for r in rows] == \
        [(c.session_id, res.manifest["aggregate_sha256"], dp["epsilon"])]
    # the collector's solve: PSD repair plus the calibrated ridge beyond the RI term, never RI restoration
    check_noisy_solve(res, expected_sd)


@pytest.mark.e2e
def test_split_dp_share_refused_with_fewer_noise_shares_than_declared(consortium):
    # Prepare: min_clients 2 lets the server close on two uploads; the noise needs three shares
    c, data, conn = _started_with_honest(consortium, ("h1", "h2"), hospitals=("h1", "h2", "h3"), min_clients=2)

    # Execute / Assert: no share leaves, nothing is accounted, the collector has nothing to release
    _check_refused_for_short_noise(c, conn)


# -- the validity proof under DP: the statement widened by the noise share's hard bound tau ----------------------
LAY, BND = Layout(6, 3), Bounds(4.0, 200, 8)


@pytest.fixture(scope="module")
def dp_split():
    """(params, backend, the server's identity key, the key holder's public seed key) of a DP split session."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from secure_afl import split
    from secure_afl.backends import get_backend

    params = dp_session_params(SPEC, "split", "dp-validity", LAY, 1.0, BND, **NO_GRAM)
    keys = split.generate_keys(params)
    params = split.bind_public_context(params, keys.public_context)
    return params, get_backend(params), Ed25519PrivateKey.generate(), keys.public_context


class _Drawing:
    """A generator whose Skellam draws come out as the share ``z`` (each |z| <= tau, so noise_share keeps it):
    the extremes a real share can take, fed through the hospital's own noise hook."""

    def __init__(self, z):
        self.z, self.calls = np.asarray(z, dtype=np.int64), 0

    def poisson(self, lam, size):
        out = np.maximum(self.z if self.calls == 0 else -self.z, 0)
        self.calls += 1
        assert out.shape == (size,)
        return out


def _edge_vector(n, labels, seed=0):
    from secure_afl.stats import local_statistics

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, LAY.dim))
    X *= BND.max_norm / np.linalg.norm(X, axis=1, keepdims=True)  # every row at the norm bound: trace = n B^2
    y = np.array([labels[i % len(labels)] for i in range(n)])
    return LAY.pack(local_statistics(X, y, LAY.n_classes, gamma=1.0))


def _extreme_share(params, tau, sign_n, seed=0):
    """Every noised entry at +-tau: n at ``sign_n tau``, counts and the Gram's diagonal at the opposite sign
    (the count sum and the trace at their widened edges), every other entry a random sign."""
    from secure_afl.dp.mechanism import noised_entries

    sl, base = LAY.slices, noised_entries(LAY).start
    z = np.random.default_rng(seed).choice([-tau, tau], size=noised_entries(LAY).stop - base)
    z[sl["n"].start - base] = sign_n * tau
    z[sl["counts"].start - base:sl["counts"].stop - base] = -sign_n * tau
    r, c = np.triu_indices(LAY.dim)
    z[np.nonzero(r == c)[0] + sl["gram"].start - base] = -sign_n * tau
    return z


def _verdict(dp_split, body, seed, com, hospital="h1"):
    import hashlib

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from secure_afl import split

    params, be, server_key, public = dp_split
    payload, st = be.seal_upload(body, seed, com, public, hospital, Ed25519PrivateKey.generate())
    split.check_upload(be.circuit, payload, st)
    sha = hashlib.sha256(payload).hexdigest()
    expected = split.query_seed(os.urandom(32), params, hospital, sha, st["validity"])
    msg = split.leader_message(be.circuit, hospital, payload, st, server_key, expected)
    qs, leader = split.verify_leader_message(msg, server_key.public_key(), be.circuit, hospital, sha,
                                                      expected)
    return split.helper_verdict(be.circuit, hospital, seed, st, qs, leader)


def test_split_dp_frac_bits_are_the_noise_grid_and_the_proofs_choice():
    from secure_afl import split

    params = dp_session_params(SPEC, "split", "s", LAY, 1.0, BND, **NO_GRAM)
    # the high lane is the noise grid; the low lane is what the widened statement leaves without a wrap
    assert split.choose_frac_bits(params) == tuple(params.backend_params["frac_bits"])
    c = split.Circuit(params)
    assert c.tau == split.noise_bound(params) > 0
    assert params.bounds.k_max * (1 << c.sizes["m_hi"]) < 1 << split.WRAP_BITS


@pytest.mark.parametrize("sign_n", [1, -1])
def test_an_honest_noisy_upload_at_the_widened_edges_is_accepted(dp_split, sign_n):
    from secure_afl.dp import add_noise_share
    from secure_afl.dp.noise import share_bound

    params, be = dp_split[:2]
    c = be.circuit
    # n = n_max, every row at norm B, all in one class (two counts 0): with the share at its extremes (the
    # noise's own hard bound, as noise_share cuts it)
    for labels in ((0,), (0, 1)):
        v = add_noise_share(params, _edge_vector(params.bounds.n_max, labels),
                            rng=_Drawing(_extreme_share(params, share_bound(params), sign_n)))
        assert _verdict(dp_split, *c.prove("h1", v)) is None


def _noisy_lanes(dp_split, sign_n=1):
    from secure_afl.dp import add_noise_share
    from secure_afl.dp.noise import share_bound

    params, be = dp_split[:2]
    v = add_noise_share(params, _edge_vector(params.bounds.n_max, (0,)),
                        rng=_Drawing(_extreme_share(params, share_bound(params), sign_n)))
    return be.circuit.lanes(v).copy()


@pytest.mark.parametrize("violation", ["count_below", "n_above", "count_above", "sum_below", "sum_above",
                                       "count_off_grid", "trace_above", "contributor_noised"])
def test_a_noisy_upload_beyond_the_widened_bounds_is_refused(dp_split, violation):
    from secure_afl.hazmat import flp

    params, be = dp_split[:2]
    c, sl, P = be.circuit, LAY.slices, flp.P
    tau = c.tau
    top = params.bounds.n_max * (1 << c.f1) + tau
    i_n, i_c = sl["n"].start, sl["counts"].start

    def get(lanes, i):
        return int(flp.decode_signed(lanes[i:i + 1])[0])

    def put(lanes, i, value, lane=0):
        lanes[lane * c.L + i] = int(value) % P

    # from the edges an honest share reaches: one grid step (or one unit of the lo lane) past one of them
    honest = _noisy_lanes(dp_split, sign_n=1 if violation in ("n_above", "sum_below", "count_below") else -1)
    lanes = honest.copy()
    if violation == "count_below":  # class 1 at -tau - 1 (it holds no sample; the sum stays within its range)
        assert get(lanes, i_c + 1) == -tau
        put(lanes, i_c + 1, -tau - 1)
    elif violation == "n_above":  # n at n_max 2^f1 + tau + 1, class 0 with it (the sum unchanged)
        assert get(lanes, i_n) == top
        put(lanes, i_n, top + 1)
        put(lanes, i_c, get(lanes, i_c) + 1)
    elif violation == "count_above":  # class 0 at n_max 2^f1 + tau + 1, n with it
        assert get(lanes, i_c) == top
        put(lanes, i_c, top + 1)
        put(lanes, i_n, get(lanes, i_n) + 1)
    elif violation == "sum_below":  # sum counts - n = -(C + 1) tau - 1
        put(lanes, i_c, get(lanes, i_c) - 1)
    elif violation == "sum_above":  # sum counts - n = (C + 1) tau + 1 (class 1, at +tau, moves)
        put(lanes, i_c + 1, get(lanes, i_c + 1) + 1)
    elif violation == "count_off_grid":  # class 0 plus 2^-(f1 + f2): off the noise grid
        put(lanes, i_c, 1, lane=1)
    elif violation == "trace_above":  # the diagonal past the widened trace bound by one grid step (times 2^f1)
        r, col = np.triu_indices(LAY.dim)
        diag = np.nonzero(r == col)[0]
        slack = c.sizes["c_B"] * (get(lanes, i_n) + tau) + c.sizes["trace_c"] - \
            (1 << c.f1) * sum(get(lanes, i) + tau for i in diag)
        put(lanes, diag[0], get(lanes, diag[0]) + slack // (1 << c.f1) + 1)
    elif violation == "contributor_noised":  # the contributor counter is not noised: it stays exactly 1
        put(lanes, sl["contributors"].start, (1 << c.f1) + 1)
    # the cheater keeps every relation it does not attack: these blocks' bits are those of the honest lanes
    keep = {"count_below": ("counts", "count_gap", "sum", "sum_gap"), "sum_below": ("sum", "sum_gap"),
            "sum_above": ("sum_gap",)}.get(violation, ())
    cheat = keeping_honest_bits(honest, keep)
    assert _verdict(dp_split, *c.prove("h1", lanes=lanes, check=False, aux_override=cheat)) == "linear"
    if violation != "contributor_noised":  # the honest prover checks the statistics' ranges before proving
        with pytest.raises(BoundsExceeded):
            c.prove("h1", lanes=lanes)


def _put(lanes, circuit, i, value):
    from secure_afl.hazmat import flp

    lanes[Layout(circuit.d, circuit.C).slices["counts"].start + i] = int(value) % flp.P


def _modified_upload(c, data, name, edit):
    """What a hospital running modified software sends: its noisy statistics, edited, with a proof of them."""
    from secure_afl.backends import get_backend
    from secure_afl.dp import add_noise_share

    cl = c.hospital(name)
    params = cl.fetch_params()
    be = get_backend(params)
    lanes = be.circuit.lanes(add_noise_share(params, Layout(c.dim, c.classes).pack(c.stats(*data[name])))).copy()
    edit(lanes, be.circuit)
    body, seed, com = be.circuit.prove(name, lanes=lanes, check=False)
    ctx = cl.conn.request("GET", cl.conn.path("/context"), signed=False).content
    payload, st = be.seal_upload(body, seed, com, ctx, name, cl.party.identity_key())
    receipt = cl.upload(params, payload, tag=st)
    cl.close()
    return receipt


@pytest.mark.e2e
def test_split_dp_upload_beyond_the_widened_bounds_is_refused_by_name_and_the_rest_released(consortium):
    # Prepare: h1..h3 honest (three noise shares, the declared minimum); h4 runs modified software: its noisy
    # upload puts class 1 one grid step below -tau, the widened statement's edge
    c, data, conn = _started_with_honest(consortium, NAMES[:3])
    receipt = _modified_upload(c, data, "h4", lambda lanes, circuit: _put(lanes, circuit, 1, -circuit.tau - 1))

    # Execute
    res = c.keyholder.finalize(conn, min_clients=3)
    conn.close()

    # Assert: receipted, refused by name, released over the three honest noisy uploads, accounted at three shares
    assert receipt["hospital"] == "h4"
    assert res.report["refused"] == {"h4": "linear"} and res.report["participants"] == list(NAMES[:3])
    assert res.report["dp"]["contributors"] == 3
    truth = plain_reference(c, data, NAMES[:3])
    sd = res.report["dp"]["sigma"]  # three shares of sigma^2 / 3: the noise of one declared sigma
    assert abs(res.stats.n - truth.n) < 12 * sd
    with PrivacyLedger(c.keyholder.keys_dir / "privacy.sqlite3") as pl:
        (row,) = pl.releases()
    from secure_afl.dp.mechanism import release_epsilon

    assert row["epsilon"] == pytest.approx(release_epsilon(c.keyholder.params(c.session_id), 3))


@pytest.mark.e2e
def test_split_dp_refusal_that_leaves_fewer_noise_shares_than_declared_releases_nothing(consortium):
    # Prepare: min_clients 2, three noise shares declared; h3's upload fails its proof, so two shares would remain
    c, data, conn = _started_with_honest(consortium, ("h1", "h2"), hospitals=("h1", "h2", "h3"), min_clients=2)
    _modified_upload(c, data, "h3", lambda lanes, circuit: _put(lanes, circuit, 1, -circuit.tau - 1))

    # Execute / Assert: the key holder refuses its share (the collector would hold a sum short of the noise)
    _check_refused_for_short_noise(c, conn)


@pytest.mark.e2e
def test_split_dp_proven_upload_past_the_declared_bound_is_released_not_vetoed(consortium):
    # Prepare: h4's Gram entry at 3/4 of the proven bound T (far past the declared per-hospital bound, inside
    # what its proof allows): a valid upload, so it must not veto the noisy release through the noisy bound
    c, data, conn = _started_with_honest(consortium, NAMES[:3])

    def big(lanes, circuit):
        from secure_afl.hazmat import flp

        lanes[1] = (3 * circuit.T // 4) % flp.P

    _modified_upload(c, data, "h4", big)

    # Execute
    res = c.keyholder.finalize(conn, min_clients=3)
    conn.close()

    # Assert: released over all four, the noisy bound reported as failed rather than refusing
    params = c.keyholder.params(c.session_id)
    assert res.report["refused"] == {} and res.report["participants"] == list(NAMES)
    assert res.stats.gram[0, 1] > 4 * params.bounds.hospital_bound(params.gamma)
    assert res.report["sanity"]["checks"]["noisy_bound"] is False
