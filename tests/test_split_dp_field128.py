"""split with differential privacy over one Field128 word per value, the default session: the DP statement read at
the word's scale, and under the Gram statement the noise share beside the lanes bounded by projection rows of its
own (no per-entry bits) and by groups of its l2 bound, each small enough to bound every entry as Goldilocks' bits
do. The verdicts come from the server's signed verifier message and the key holder's judgement on its own share
(the release path's protocol functions). tests/test_split_dp_gram.py and tests/test_split_dp.py test the
Goldilocks path."""

from __future__ import annotations

import math

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secure_afl import split
from secure_afl.backends import get_backend
from secure_afl.backends.session_params import dp_session_params
from secure_afl.dp import DPSpec, add_noise_share, noise_share
from secure_afl.dp.mechanism import grid_bits
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.stats import SufficientStatistics, local_statistics
from support.sessions import split_verdict
from secure_afl_tools.attacks_validity import field_decode, noisy_zero_upload

SPEC = DPSpec(1.0, 1e-5, 3)
GAMMA = 1.0
LAY = Layout(6, 3)
BND = Bounds(2.0, 200, 8)


def _session(gram: bool):
    # no field named: the default
    params = dp_session_params(SPEC, "split", f"dp128-{gram}", LAY, GAMMA, BND, gram_proof=gram)
    keys = split.generate_keys(params)
    params = split.bind_public_context(params, keys.public_context)
    return params, get_backend(params), Ed25519PrivateKey.generate(), keys


@pytest.fixture(scope="module")
def sessions():
    return {g: _session(g) for g in (False, True)}


_verdict = split_verdict


def _vector(n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, LAY.dim))
    X *= (BND.max_norm * rng.uniform(0.2, 1.0, n) / np.linalg.norm(X, axis=1))[:, None]
    y = np.concatenate([np.arange(min(n, 3)), rng.integers(0, 3, max(0, n - 3))])
    return LAY.pack(local_statistics(X, y, 3, gamma=GAMMA))


# -- the session ---------------------------------------------------------------------------------------------
def test_the_default_dp_session_is_field128_with_the_share_bounded_by_rows_and_groups(sessions):
    params, be = sessions[True][:2]
    c = be.circuit
    assert params.backend_params["field"] == "field128" and c.lanes_per_value == 1
    d = split.describe(c)
    g = c.sizes["gram"]
    assert d["gram"]["noise_range"] == "projection rows" and d["gram"]["residual_words"] == 0
    assert ("proj_z", split.sizes.ROWS, g["m_z"]) in c.statement.blocks()
    assert not any(name == "noise" for name, _, _ in c.statement.blocks())
    # the share's words are grid units, at 2^f2 within a word; the statement reads at the word's scale
    f1, f2 = (int(v) for v in params.backend_params["frac_bits"])
    assert grid_bits(params) == f1 and c.part("gram").z_scale == 1 << f2 and (c.f1, c.f2) == (f1 + f2, 0)
    tau = split.sizes.noise_bound(params)
    assert c.tau == tau << f2
    # every entry is bounded by its group's proven squared norm below 2^(2 (bitlen(tau) + 1)): under 4 tau
    assert g["m_g"] <= 2 * (tau.bit_length() + 1) and tau < 2 ** g["z_log2"] < 4 * tau
    # the rows alone would bound an entry only by 2 T_z, about 12 times the share's whole l2 norm
    assert 2 ** g["m_z"] > 6 * math.sqrt(g["l2_z"])
    assert d["soundness_bits_q64"] >= 64.0


def test_a_dp_session_signed_by_the_session_definition_is_field128_too():
    from secure_afl.session.definition import normalise
    from secure_afl.session.schema import parse

    sections = {"session": {"id": "dp128", "backend": "split", "dim": 6, "classes": 3, "hospitals":
                            ["h1", "h2", "h3"], "min_clients": 3},
                "bounds": {"max_norm": 2.0, "n_max": 200, "k_max": 8}, "dp": {"epsilon": 1.0}}
    definition = normalise(parse(sections))
    params = definition.session_params()
    assert params.backend_params["field"] == "field128" and split.noise_beside(params)
    assert split.Circuit(params).sizes["gram"]["n_r"] == 0
    # what sign, show, server run and the audit report print: snapped under DP, not the exact lanes
    from secure_afl.session.definition import split_validity

    line = split_validity(definition)
    assert "snapped" in line and "exact lanes" not in line and "projection rows" in line


# -- an honest hospital ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 3, 40, 200])
def test_an_honest_dp_upload_proves_with_and_without_the_gram_statement(sessions, n):
    z = lambda: noise_share(sessions[True][0], np.random.default_rng(n))  # noqa: E731
    gram = sessions[True]
    c = gram[1].circuit
    v = _vector(n, seed=n)
    assert _verdict(gram, *c.prove("h1", v, noise=z())) is None
    # the release reads the statistics plus the share: as the plain DP path gives, but for the factor's rounding
    # at 2^-f (f about (f1 + f2) / 2, far below the noise grid)
    got = field_decode(c.params, c.witness(v, noise=z())[0])
    plain = add_noise_share(c.params, v, rng=np.random.default_rng(n))
    g = c.sizes["gram"]
    a = n * BND.max_norm ** 2 + GAMMA
    assert np.max(np.abs(got - plain)) <= 2.0 ** -g["f"] * 2 * np.sqrt(g["m"] * a) + g["m"] * 2.0 ** (-2 * g["f"]) \
        + 2.0 ** -grid_bits(c.params)
    sl = LAY.slices
    assert abs(got[sl["n"]][0] - plain[sl["n"]][0]) <= 2.0 ** -grid_bits(c.params)
    # without the Gram statement: the noisy statistics on the grid, one word each
    plain_sess = sessions[False]
    noisy = add_noise_share(plain_sess[0], v, rng=np.random.default_rng(n))
    pc = plain_sess[1].circuit
    assert _verdict(plain_sess, *pc.prove("h1", noisy)) is None
    assert np.array_equal(field_decode(pc.params, pc.lanes(noisy)), noisy)


# -- the DP statement at the word's scale ----------------------------------------------------------------------------
@pytest.mark.parametrize("step, verdict", [(0, None), (1, "linear")])
def test_n_at_its_widened_edge_proves_and_one_word_unit_beyond_is_refused(sessions, step, verdict):
    # n's word at n_max 2^(f1 + f2) + tau (n_max the session's, padded for the noise tail; tau in word units): the
    # edge; one unit of the word beyond it the range relation fails (the counts still sum to n within (C + 1) tau)
    sess = sessions[False]
    c = sess[1].circuit
    F = c.F
    lanes = c.lanes(_vector(BND.n_max, seed=4))
    n_word = c.params.bounds.n_max * (1 << c.f1) + c.tau + step
    lanes[LAY.slices["n"].start] = F.encode_signed(np.array([n_word], dtype=object))[0]
    assert _verdict(sess, *c.prove("h1", lanes=lanes, check=False)) == verdict


# -- a cheating hospital ----------------------------------------------------------------------------------------
def _prove_noise(sess, z):
    c = sess[1].circuit
    lanes, fw = noisy_zero_upload(c, z)
    for _ in range(20):  # modified software redraws until its statistics' own projection rows land in range
        verdict = _verdict(sess, *c.prove("h2", lanes=lanes, factor=fw, check=False), "h2")
        if verdict != "linear":
            return verdict
    return verdict


def test_one_entry_carrying_the_whole_l2_budget_is_refused_by_its_group():
    # the rows alone let an entry reach 2 T_z (more than the whole l2 norm): the spike at sqrt(l2_z), inside the
    # total l2 bound and the rows, is refused by its group's bound; at the group's edge it is accepted. (At
    # d = 6 the whole share is one group whose bound is already below (4 tau)^2: d = 64, C = 10 has six.)
    params = dp_session_params(SPEC, "split", "dp128-groups", Layout(64, 10), GAMMA, Bounds(1.0, 1000, 10))
    keys = split.generate_keys(params)
    params = split.bind_public_context(params, keys.public_context)
    sess = params, get_backend(params), Ed25519PrivateKey.generate(), keys
    gs = sess[1].circuit.part("gram")
    g = gs.g
    assert gs.z_groups > 1
    spike = math.isqrt(gs.l2_z)
    assert spike * spike <= gs.l2_z and spike < 2 ** g["m_z"] and spike * spike >= 1 << g["m_g"]
    edge = math.isqrt((1 << g["m_g"]) - 1)
    for value, verdict in ((edge, None), (spike, "noise")):
        z = np.zeros(gs.n_z, dtype=np.int64)
        z[params.layout.slices["cross"].start - gs.i_noise[0]] = value
        assert _prove_noise(sess, z) == verdict


def test_a_share_past_its_projection_rows_is_refused(sessions):
    # one entry far past 2 T_z, whose square wraps mod p (so its group's sum would not be its squared norm):
    # the noise rows fail (and the lanes' own projection with them)
    sess = sessions[True]
    gs = sess[1].circuit.part("gram")
    z = np.zeros(gs.n_z, dtype=object)
    # its square, 2^140, would wrap mod p; in the lanes it sits at 2^(70 + f2) < p / 2
    z[LAY.slices["cross"].start - gs.i_noise[0]] = 1 << 70
    c = sess[1].circuit
    lanes, fw = noisy_zero_upload(c, np.zeros(gs.n_z, dtype=np.int64))
    fw = fw.copy()
    fw[gs.n_f:gs.n_f + gs.n_z] = c.F.encode_signed(z)
    hi = c.F.decode_signed(lanes[:c.L]).astype(object)
    hi[gs.i_noise] += z * gs.z_scale
    lanes = np.concatenate([c.F.encode_signed(hi), lanes[c.L:]])
    body, seed, com = c.prove("h2", lanes=lanes, factor=fw, check=False)
    assert "noise_range" in c.evaluate(c.F.add(body, c.helper_share(seed)), com, "h2")
    assert _verdict(sess, body, seed, com, "h2") is not None


def test_statistics_hidden_in_the_noise_words_are_refused(sessions):
    # modified software: an indefinite Gram block (diag(+H, -H)) moved into the noise words, the statistics before
    # noise a Gram matrix; the entries fit the rows, the groups' l2 bounds do not hold them
    sess = sessions[True]
    c = sess[1].circuit
    gs = c.part("gram")
    H = int(BND.n_max * BND.max_norm ** 2 * 2 ** grid_bits(c.params))
    r, k = np.triu_indices(LAY.dim)
    diag = LAY.slices["gram"].start + np.nonzero(r == k)[0] - gs.i_noise[0]
    z = np.zeros(gs.n_z, dtype=np.int64)
    z[diag] = [H if i % 2 == 0 else -H for i in range(len(diag))]
    assert int(np.max(np.abs(z))) < 2 ** gs.g["m_z"]
    assert _prove_noise(sess, z) == "noise"
