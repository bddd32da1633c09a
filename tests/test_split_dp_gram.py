"""split's Gram statement with differential privacy: each upload proves its statistics BEFORE its noise share a
Gram matrix, and the share (carried beside the lanes) within its per-entry bound.

The circuit tests run the server's signed verifier message and the key holder's verdict on its own share (the
release path's protocol functions); the e2e test drives a real server process with the ordinary hospital client.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secure_afl import split
from secure_afl.backends import get_backend
from secure_afl.backends.session_params import dp_session_params
from secure_afl.dp import DPSpec, add_noise_share, noise_share
from secure_afl.dp.mechanism import noised_entries
from secure_afl.hazmat import fixedpoint, flp
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.split.statements import Prover
from secure_afl.stats import SufficientStatistics, local_statistics
from support.sessions import split_verdict
from secure_afl_tools.attacks_validity import gram_cheat, indefinite_statistics, raw_statistics

SPEC = DPSpec(1.0, 1e-5, 3)
GAMMA = 1.0
LAY = Layout(6, 3)
BND = Bounds(2.0, 200, 8)
#: what this file tests: the Goldilocks path (the noise share's range by its bits), which a session signs by
#: naming the field; tests/test_split_dp_field128.py has the default, Field128
FIELD = "goldilocks"


def _session(dim=6, classes=3, bounds=BND, gram=True):
    params = dp_session_params(SPEC, "split", f"dp-gram-{dim}-{gram}", Layout(dim, classes), GAMMA, bounds,
                               gram_proof=gram, field=FIELD)
    keys = split.generate_keys(params)
    params = split.bind_public_context(params, keys.public_context)
    return params, get_backend(params), Ed25519PrivateKey.generate(), keys


@pytest.fixture(scope="module")
def sessions():
    return {g: _session(gram=g) for g in (False, True)}


_verdict = split_verdict


def _vector(n, dim=6, classes=3, max_norm=2.0, seed=0):
    """n rows at up to the norm bound; the first min(n, classes) open a class each (one-sample classes)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, dim))
    X *= (max_norm * rng.uniform(0.2, 1.0, n) / np.linalg.norm(X, axis=1))[:, None]
    y = np.concatenate([np.arange(min(n, classes)), rng.integers(0, classes, max(0, n - classes))])
    return Layout(dim, classes).pack(local_statistics(X, y, classes, gamma=GAMMA))


def _packed(raw):
    return LAY.pack(SufficientStatistics(raw.gram + GAMMA * np.eye(LAY.dim), raw.cross, raw.n, raw.class_counts,
                                         1.0, GAMMA))


def _decode(c, x):
    return fixedpoint.decode(flp.decode_signed(x).view(np.uint64), (c.f1, c.f2))


def _snap_bound(c, n):
    """How far the proven statistics may be from the true ones: the factor's entries truncated by < 2^-f move
    A_ij by <= 2^-f (|L_i|_1 + |L_j|_1) + m 2^-2f with |L_i|_1 <= sqrt(m A_ii), A_ii <= n B^2 + gamma + jitter,
    and the diagonal by the jitter on top."""
    g = c.sizes["gram"]
    a = n * c.params.bounds.max_norm ** 2 + GAMMA + g["jitter"]
    return g["jitter"] + 2.0 ** -g["f"] * 2 * np.sqrt(g["m"] * a) + g["m"] * 2.0 ** (-2 * g["f"])


# -- the session ---------------------------------------------------------------------------------------------
def test_a_dp_session_with_gram_proof_signs_and_carries_the_noise_beside_the_lanes():
    from secure_afl.session.definition import normalise
    from secure_afl.session.schema import parse

    sections = {"session": {"id": "dp-gram", "backend": "split", "dim": 6, "classes": 3, "hospitals":
                            ["h1", "h2", "h3"], "min_clients": 3},
                "bounds": {"max_norm": 2.0, "n_max": 200, "k_max": 8}, "split": {"gram_proof": True, "field": FIELD},
                "dp": {"epsilon": 1.0}}
    params = normalise(parse(sections)).session_params()
    assert split.gram_enabled(params) and params.dp is not None and split.noise_beside(params)
    c = split.Circuit(params)
    d = split.describe(c)
    assert d["gram"]["noise_words"] == noised_entries(LAY).stop - noised_entries(LAY).start
    # every honest share entry (|z| <= tau) is inside the proven range, which is less than twice tau
    tau = c.tau
    assert tau < 2 ** d["gram"]["noise_bound_log2"] < 2 * tau + 2
    assert d["soundness_bits_q64"] >= 64.0


def test_a_dp_session_whose_factor_rounding_exceeds_the_noise_spread_is_refused():
    from secure_afl.exceptions import InvalidParameterError

    # d = 64, C = 10, B = 1: n_max = 10 000 fits (rounding 66 < 2 sqrt(d) sd = 75), 100 000 does not (208)
    dp_session_params(SPEC, "split", "fits", Layout(64, 10), GAMMA, Bounds(1.0, 10000, 8), gram_proof=True,
                      field=FIELD)
    with pytest.raises(InvalidParameterError, match="Gram factor's scale"):
        dp_session_params(SPEC, "split", "too-coarse", Layout(64, 10), GAMMA, Bounds(1.0, 100000, 8),
                          gram_proof=True, field=FIELD)
    dp_session_params(SPEC, "split", "no-gram", Layout(64, 10), GAMMA, Bounds(1.0, 100000, 8), gram_proof=False,
                      field=FIELD)
    # the default DP session proves the statement, so it is refused there too, naming the way out
    with pytest.raises(InvalidParameterError, match="Gram factor's scale.*gram_proof = false"):
        dp_session_params(SPEC, "split", "default", Layout(64, 10), GAMMA, Bounds(1.0, 100000, 8), field=FIELD)


# -- an honest hospital ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 40, 200])
def test_an_honest_dp_upload_proves_and_matches_the_plain_dp_lanes_within_the_rounding(sessions, n):
    sess = sessions[True]
    c = sess[1].circuit
    v = _vector(n, seed=n)
    z = noise_share(c.params, np.random.default_rng(n))
    body, seed, com = c.prove("h1", v, noise=z)
    assert _verdict(sess, body, seed, com) is None
    # the plain DP path with the same share: the statistics plus z on the grid (add_noise_share draws the same z)
    plain = add_noise_share(c.params, v, rng=np.random.default_rng(n))
    got = _decode(c, c.witness(v, noise=z)[0])
    assert np.max(np.abs(got - plain)) <= _snap_bound(c, n)
    sl = LAY.slices
    assert np.array_equal(got[sl["counts"]], plain[sl["counts"]]) and got[sl["n"]][0] == plain[sl["n"]][0]


@pytest.mark.parametrize("sign_n", [1, -1])
@pytest.mark.parametrize("n", [1, 3, 200])
def test_an_honest_upload_with_n_and_the_counts_noise_at_opposite_extremes_proves(sessions, sign_n, n):
    # rows at the norm bound (trace n B^2), n's and the counts' noise at opposite extremes: the widened DP
    # relations near their edges, and the Gram identity of the statistics under them. Under the Gram statement
    # the share's l2 bound (about 1.5 times its expected norm at this layout's 43 noised entries) binds before
    # the per-entry range tau = 12 sd does, so the four entries sit at the largest magnitude a with 4 a^2 within
    # it, the rest of the share zero (each entry at +-tau is test_split_dp.py's, without the Gram statement)
    sess = sessions[True]
    c = sess[1].circuit
    tau = math.isqrt(c.part("gram").l2_z // 4)
    assert tau < c.tau
    rng = np.random.default_rng(n)
    X = rng.standard_normal((n, 6))
    X *= BND.max_norm / np.linalg.norm(X, axis=1, keepdims=True)
    y = np.concatenate([np.arange(min(n, 3)), rng.integers(0, 3, max(0, n - 3))])
    v = LAY.pack(local_statistics(X, y, 3, gamma=GAMMA))
    z = np.zeros(LAY.length)
    z[LAY.slices["n"]] = sign_n * tau
    z[LAY.slices["counts"]] = -sign_n * tau
    assert _verdict(sess, *c.prove("h1", v, noise=z)) is None


def test_the_noise_l2_bound_holds_an_honest_share_with_the_stated_tail():
    # the bound at the sessions the docs quote: about 1.10 sqrt(n_z) sd at d = 64, C = 10 and 1.01 at d = 512,
    # C = 100; and against shares drawn by the hospital's own noise function, none comes near it
    for dim, classes, lo, hi in ((64, 10, 1.08, 1.12), (512, 100, 1.005, 1.02)):
        params = dp_session_params(SPEC, "split", f"l2-{dim}", Layout(dim, classes), GAMMA, Bounds(1.0, 1000, 10),
                                   gram_proof=True, field=FIELD)
        f1 = int(params.backend_params["frac_bits"][0])
        g = split.sizes.gramsizes(params, f1)
        sd = split.sizes.dp_share_std(params) * 2.0 ** f1
        ratio = np.sqrt(g["l2_z"] / g["n_z"]) / sd
        assert lo < ratio < hi
        if dim == 64:
            sl = noised_entries(params.layout)
            norms = [float(np.sum(noise_share(params, np.random.default_rng(s))[sl] ** 2)) for s in range(20)]
            # |z|^2 concentrates at n_z sd^2 with relative sd sqrt(2 / n_z) = 2.7 %: 20 draws within 15 % (the
            # bound, 1.10^2 = 1.21 times n_z sd^2, is 7.8 such sds above the mean)
            assert max(norms) < 1.15 * g["n_z"] * sd * sd < g["l2_z"]


def test_the_prover_refuses_a_missing_share_or_one_beyond_the_bound(sessions):
    from secure_afl.exceptions import BoundsExceeded, InvalidInputError

    c = sessions[True][1].circuit
    v = _vector(20)
    with pytest.raises(InvalidInputError, match="noise share"):
        c.witness(v)
    z = np.zeros(c.L)
    z[LAY.slices["cross"].start] = c.part("gram").T_z
    with pytest.raises(BoundsExceeded, match="noise bound"):
        c.witness(v, noise=z)
    # every entry inside the range, the squared norm past l2_z: the honest software refuses to prove it
    z = np.zeros(c.L)
    z[LAY.slices["cross"]] = c.part("gram").T_z - 1
    with pytest.raises(BoundsExceeded, match="l2 norm"):
        c.prove("h1", v, noise=z)


def test_the_backend_draws_the_share_itself_and_the_hospital_hands_it_the_statistics_before_noise(sessions):
    from secure_afl.clients.hospital import protect_vector

    params, be = sessions[True][:2]
    stats = local_statistics(*(lambda X: (X / np.linalg.norm(X, axis=1, keepdims=True),
                                          np.arange(12) % 3))(np.random.default_rng(2).standard_normal((12, 6))),
                             3)
    packed = protect_vector(params, stats)
    assert np.array_equal(packed, LAY.pack(SufficientStatistics(stats.gram + GAMMA * np.eye(6), stats.cross,
                                                                stats.n, stats.class_counts, 1.0, GAMMA)))
    payload, st = be.protect(packed, public_context=sessions[True][3].public_context, hospital="h1",
                             identity_key=Ed25519PrivateKey.generate())
    share = be.upload_share(payload)
    assert share.shape == (be.circuit.total,) and st["validity"]


# -- a cheating hospital ----------------------------------------------------------------------------------------
def _attack(name):
    rng = np.random.default_rng(0)
    honest = raw_statistics(rng, k=2)
    return _packed(indefinite_statistics(name, honest, rng.choice([-5.0, 5.0], size=(6, 3))))


def _past_projection(sess, tries=20, **kw):
    """The verdict on the first upload whose l2 projection rows land in range (modified software redraws)."""
    c = sess[1].circuit
    for _ in range(tries):
        verdict = _verdict(sess, *c.prove("h2", check=False, **kw), "h2")
        if verdict != "linear":
            return verdict
    return verdict


@pytest.mark.parametrize("name", ["diag-exact-rows", "half-plus-minus-H", "rank-one-cancel-0.99"])
def test_an_indefinite_noisy_upload_is_refused_by_the_gram_statement(sessions, name):
    sess = sessions[True]
    c = sess[1].circuit
    v = _attack(name)
    lanes = c.lanes(add_noise_share(c.params, v, rng=np.random.default_rng(5)))
    # without the Gram statement the same noisy upload proves
    off = sessions[False]
    assert _past_projection(off, lanes=off[1].circuit.lanes(add_noise_share(off[0], v,
                                                                              rng=np.random.default_rng(5)))) is None
    stand_in = _vector(40, seed=9)
    for kw in (gram_cheat(c, lanes, stand_in=stand_in), {}):
        assert _past_projection(sess, lanes=lanes, **kw) == "gram"
    # the stand-in's factor beside its own honest noise words (the share it drew) fails the identity just as well
    z = noise_share(c.params, np.random.default_rng(6))
    fw = c.witness(stand_in, noise=z)[1]
    assert _past_projection(sess, lanes=lanes, factor=fw) == "gram"


def _hidden_in_noise(c, attack):
    """Modified software: statistics before noise all zero but n and the counts (a Gram matrix: gamma I and the
    counts), and the whole attack put in the 'noise' words, so that lanes less noise is that Gram matrix."""
    st = LAY.unpack(attack)
    zero = LAY.pack(SufficientStatistics(GAMMA * np.eye(6), np.zeros((6, 3)), st.n, st.class_counts, 1.0, GAMMA))
    x0, fw0 = c.witness(zero, noise=np.zeros(c.L))
    lanes = c.lanes(attack)
    gs = c.part("gram")
    hi = flp.decode_signed(lanes[:c.L]) - flp.decode_signed(x0[:c.L])
    z = hi[gs.i_noise]
    return lanes, np.concatenate([fw0[:gs.n_f], flp.encode_signed(z)]), z


def test_a_cheater_hiding_its_statistics_in_the_noise_is_refused_by_the_noise_bound(sessions):
    sess = sessions[True]
    c = sess[1].circuit
    lanes, fw, z = _hidden_in_noise(c, _attack("half-plus-minus-H"))
    assert np.max(np.abs(z)) >= c.part("gram").T_z  # the attack does not fit the share's proven range
    assert _past_projection(sess, lanes=lanes, factor=fw) == "noise"


def _residual_edge(gs, idx, step):
    """Integer residual on the entries ``idx`` (offsets into the share), signs alternating, with |z|^2 at most
    l2_z exactly at the edge (``step`` 0) or one grid step of one entry beyond it (``step`` 1)."""
    k = len(idx)
    h = math.isqrt(gs.l2_z // k)
    last = math.isqrt(gs.l2_z - (k - 1) * h * h) + step
    z = np.zeros(gs.n_z, dtype=np.int64)
    z[idx] = [h * (-1) ** i for i in range(k - 1)] + [last]
    assert (int(np.sum(z * z)) <= gs.l2_z) == (step == 0) and np.max(np.abs(z)) < gs.T_z
    return z


@pytest.mark.parametrize("block", ["gram", "cross"])
def test_a_residual_within_the_noise_l2_bound_is_what_a_cheater_keeps_and_one_step_beyond_is_refused(sessions,
                                                                                                     block):
    # the documented residue (docs/VALIDITY.md): statistics before noise a Gram matrix (gamma I and the counts),
    # and in the 'noise' words a structured perturbation (the Gram block's diagonal at +-H, or the cross block Q
    # at +-H: the Q-residual attack) with every entry inside the per-entry range; accepted while |z|^2 <= l2_z,
    # refused by name one grid step beyond, where the per-entry range alone would have let it through
    sess = sessions[True]
    c = sess[1].circuit
    gs = c.part("gram")
    zero = LAY.pack(SufficientStatistics(GAMMA * np.eye(6), np.zeros((6, 3)), 100.0, np.array([40.0, 30.0, 30.0]),
                                         1.0, GAMMA))
    x0, fw0 = c.witness(zero, noise=np.zeros(c.L))
    if block == "gram":
        r, k = np.triu_indices(6)
        idx = LAY.slices["gram"].start + np.nonzero(r == k)[0] - gs.i_noise[0]
    else:
        idx = np.arange(LAY.slices["cross"].start, LAY.slices["cross"].stop) - gs.i_noise[0]
    for step, verdict in ((0, None), (1, "noise")):
        z = _residual_edge(gs, idx, step)
        hi = flp.decode_signed(x0[:c.L])
        hi[gs.i_noise] += z
        lanes = np.concatenate([flp.encode_signed(hi), x0[c.L:]])
        fw = np.concatenate([fw0[:gs.n_f], flp.encode_signed(z)])
        assert _past_projection(sess, lanes=lanes, factor=fw) == verdict
        body, seed, com = c.prove("h2", lanes=lanes, factor=fw, check=False)
        assert c.evaluate(flp.add(body, c.helper_share(seed)), com, "h2") == ([] if step == 0 else ["noise_l2"])


def test_the_release_tolerates_the_proven_noise_and_refuses_beyond_it(sessions):
    from secure_afl.exceptions import SanityCheckFailed

    params = sessions[True][0]
    d = LAY.dim
    # three honest noisy uploads of one sample each: the noise makes the sum indefinite, and it is not refused
    noisy = [add_noise_share(params, _vector(1, seed=s), rng=np.random.default_rng(s)) for s in range(3)]
    gram = np.zeros((d, d))
    iu = np.triu_indices(d)
    tot = np.sum(noisy, axis=0)
    gram[iu] = tot[LAY.slices["gram"]]
    gram.T[iu] = tot[LAY.slices["gram"]]
    tol = split.psd_tolerance(params, gram)
    assert -tol <= float(np.linalg.eigvalsh(gram)[0]) < 0
    # the tolerance is k_max shares at the tighter of the proven per-entry (Gershgorin) and l2 bounds
    gs = sessions[True][1].circuit.part("gram")
    per_share = min(d * gs.T_z, np.sqrt(2.0 * gs.l2_z)) * 2.0 ** -sessions[True][1].circuit.f1
    assert per_share < d * gs.T_z * 2.0 ** -sessions[True][1].circuit.f1
    assert tol < params.bounds.k_max * per_share * 1.01


# -- through the service ----------------------------------------------------------------------------------------
@pytest.mark.e2e
@pytest.mark.parametrize("field", [None, FIELD])
def test_a_dp_gram_session_releases_through_the_service_within_the_proven_noise(consortium, tmp_path, field):
    # None: the default session (Field128, the share's range by projection rows); Goldilocks (by its bits)
    import subprocess
    import sys

    from secure_afl.dp.mechanism import share_std
    from secure_afl.keyholder import write_model
    from secure_afl.model_file import model_metadata

    names = ("h1", "h2", "h3")
    c = consortium(backend="split", hospitals=names, min_clients=3, dp={"epsilon": 1.0, "delta": 1e-5,
                                                                        "min_contributors": 3},
                   split={} if field is None else {"field": field}, n_max=200, max_norm=2.0).start()
    conn = c.connect_keyholder()
    params = dp_session_params(SPEC, "split", c.session_id, Layout(c.dim, c.classes), 1.0, Bounds(2.0, 200, 8),
                               **({} if field is None else {"field": field}))
    assert split.gram_enabled(params) and params.backend_params["field"] == (field or "field128")
    c.keyholder.keygen(params)
    c.keyholder.publish(conn)
    data = {h: c.data(h, n=60) for h in names}
    for h in names:
        cl = c.hospital(h)
        cl.submit(c.stats(*data[h]))
        cl.close()
    res = c.keyholder.finalize(conn, min_clients=3)
    conn.close()
    assert res.report["refused"] == {} and res.report["participants"] == list(names)
    assert res.report["dp"]["contributors"] == 3
    truth = None
    for h in names:
        s = c.stats(*data[h])
        truth = s if truth is None else truth + s
    circuit = split.Circuit(params)
    # three shares, each entry within tau, plus each upload's factor rounding (and its diagonal jitter)
    tau_real = circuit.tau * 2.0 ** -circuit.f1
    bound = 3 * (tau_real + _snap_bound(circuit, 60))
    assert abs(res.stats.n - truth.n) <= 3 * tau_real
    assert np.max(np.abs(res.stats.gram - truth.gram - 3.0 * np.eye(c.dim))) <= bound
    assert np.max(np.abs(res.stats.cross - truth.cross)) <= bound
    # noise was added: the release is not the truth (12 share std away from it only with probability ~0)
    assert np.max(np.abs(res.stats.gram - truth.gram - 3.0 * np.eye(c.dim))) > 0.01 * share_std(params)
    # the auditor recomputes the server's masked sum bit for bit, each upload's noise words permuted at the
    # query seed the server signed its verifier message at
    model = tmp_path / "model.safetensors"
    write_model(model, res.W, model_metadata(res.params, res.report, 0.0))
    ok = subprocess.run([sys.executable, "-m", "secure_afl.cli", "audit", "release", "--state",
                         str(c.root / "server" / c.session_id), "--pki", str(c.pki_dir), "--model", str(model),
                         "--kept", str(c.keyholder.keys_dir / f"{c.session_id}.split-commitment.json")],
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and "bit for bit" in ok.stdout, ok.stdout + ok.stderr


def _q_residual_past_l2(c):
    """Modified software: statistics before noise zero but n and the counts, and in the noise words every cross
    term at +-(T_z - 1): each entry inside its range, the share's squared norm past l2_z (the Q-residual attack
    at the size the per-entry range alone allowed)."""
    gs = c.part("gram")
    zero = LAY.pack(SufficientStatistics(GAMMA * np.eye(6), np.zeros((6, 3)), 100.0, np.array([40.0, 30.0, 30.0]),
                                         1.0, GAMMA))
    x0, fw0 = c.witness(zero, noise=np.zeros(c.L))
    z = np.zeros(gs.n_z, dtype=np.int64)
    idx = np.arange(LAY.slices["cross"].start, LAY.slices["cross"].stop) - gs.i_noise[0]
    z[idx] = [(gs.T_z - 1) * (-1) ** i for i in range(len(idx))]
    hi = flp.decode_signed(x0[:c.L])
    hi[gs.i_noise] += z
    return np.concatenate([flp.encode_signed(hi), x0[c.L:]]), np.concatenate([fw0[:gs.n_f], flp.encode_signed(z)]), z


@pytest.mark.e2e
@pytest.mark.parametrize("attack", ["indefinite", "q_residual"])
def test_a_hospital_hiding_its_attack_in_the_noise_is_refused_by_name_through_the_service(consortium, attack):
    names = ("h1", "h2", "h3", "h4")
    c = consortium(backend="split", hospitals=names, min_clients=3, dp={"epsilon": 1.0, "delta": 1e-5,
                                                                        "min_contributors": 3},
                   split={"gram_proof": True, "field": FIELD}, n_max=200, max_norm=2.0,
                   extra_session={"max_refusals": 1, "colluders": 0}).start()  # quorum 3 of 4: h4 may be refused
    conn = c.connect_keyholder()
    c.keyholder.keygen(dp_session_params(SPEC, "split", c.session_id, Layout(c.dim, c.classes), 1.0,
                                         Bounds(2.0, 200, 8), gram_proof=True, field=FIELD))
    c.keyholder.publish(conn)
    data = {h: c.data(h, n=60) for h in names[:3]}
    for h in names[:3]:
        cl = c.hospital(h)
        cl.submit(c.stats(*data[h]))
        cl.close()
    # h4 runs modified software: statistics before noise zero (a Gram matrix), its indefinite attack as "noise"
    cl = c.hospital("h4")
    params = cl.fetch_params()
    be = get_backend(params)
    gs = be.circuit.part("gram")
    if attack == "indefinite":  # past the per-entry range (and the l2 bound)
        lanes, fw, z = _hidden_in_noise(be.circuit, _attack("half-plus-minus-H"))
        assert np.max(np.abs(z)) >= gs.T_z
        broken = ["noise_range", "noise_l2"]
    else:  # inside the per-entry range, past the l2 bound only
        lanes, fw, z = _q_residual_past_l2(be.circuit)
        assert np.max(np.abs(z)) < gs.T_z and int(np.sum(z * z)) > gs.l2_z
        broken = ["noise_l2"]
    for _ in range(20):  # its own software redraws until the lanes' projection rows land in range
        body, seed, com = be.circuit.prove("h4", lanes=lanes, factor=fw, check=False)
        if be.circuit.evaluate(flp.add(body, be.circuit.helper_share(seed)), com, "h4") == broken:
            break
    assert be.circuit.evaluate(flp.add(body, be.circuit.helper_share(seed)), com, "h4") == broken
    ctx = cl.conn.request("GET", cl.conn.path("/context"), signed=False).content
    payload, st = be.seal_upload(body, seed, com, ctx, "h4", cl.party.identity_key())
    receipt = cl.upload(params, payload, tag=st)
    cl.close()
    res = c.keyholder.finalize(conn, min_clients=3)
    conn.close()
    assert receipt["hospital"] == "h4"
    assert res.report["refused"] == {"h4": "noise"} and res.report["participants"] == list(names[:3])


def test_a_share_too_long_for_one_exact_square_sum_is_proven_in_groups():
    # d = 730: n_z T_z^2 passes p, so |z|^2 is taken in two groups, each exact in F_p and proven below 2^m_g; the
    # group relations (on the true group sums, as the unshared circuit reads them) hold for an honest share and
    # fail when one group's claimed value is moved while the total stays within l2_z
    params = dp_session_params(SPEC, "split", "groups", Layout(730, 3), GAMMA, Bounds(1.0, 1000, 10),
                               gram_proof=True, field=FIELD)
    c = split.Circuit(params)
    gs, g = c.part("gram"), c.sizes["gram"]
    assert g["z_groups"] == 2 and g["z_len"] * gs.T_z ** 2 < flp.P and (2 << g["m_g"]) + (1 << g["m_l"]) <= flp.P
    assert gs.n_z * gs.T_z ** 2 >= flp.P
    z = noise_share(params, np.random.default_rng(3))[gs.i_noise].astype(np.int64)
    fw = np.concatenate([np.zeros(gs.n_f, dtype=np.uint64), flp.encode_signed(z)])
    vals = gs.witness(Prover({int(i): 0 for i in gs.i_counts}, None, fw, b"\0" * 32), check=False)
    sums = [int(np.sum(z[:g["z_len"]] ** 2)), int(np.sum(z[g["z_len"]:] ** 2))]
    assert vals["noise_sq"] == sums and vals["noise_l2"] == [gs.l2_z - sum(sums)]
    true = [flp.dot(v, v) for v in gs._z_groups(fw)]
    assert true == sums

    def l2_relations(claimed):
        def dec(name):
            return flp.to_field({"noise_sq": claimed, "noise_l2": [gs.l2_z - sum(claimed)],
                                 "proj_f": [0] * 130, "gram_slack": [0] * c.C,
                                 "noise": [int(v) + gs.T_z for v in z]}[name])
        return gs.values(np.zeros(c.L, dtype=np.uint64), fw, dec, None, b"\0" * 32, "00" * 32, leader=True,
                         squares=[0] * 3, zsquare=true)[4]

    assert not np.any(l2_relations(sums))
    assert np.any(l2_relations([sums[0] - 1, sums[1] + 1]))
