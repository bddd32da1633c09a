"""The post-commitment signed permutation of the noise words (split with DP and the Gram statement): both
verifiers sum ``lanes - z + pi(z)``, with ``pi`` drawn from each upload's query seed. An honest share keeps its
distribution; a residual aimed before the commitment lands, at random, elsewhere."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from scipy import stats

from secure_afl import split
from secure_afl.backends.session_params import dp_session_params
from secure_afl.dp import DPSpec, noise_share
from secure_afl.dp.mechanism import noised_entries
from secure_afl_tools.attacks_validity import field_decode
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.stats import local_statistics

LAY = Layout(6, 3)


@pytest.fixture(scope="module", params=["field128", "goldilocks"])
def session(request):
    # the default field (the share at 2^f2 within one word) and Goldilocks (the share in the high lane)
    params = dp_session_params(DPSpec(1.0, 1e-5, 3), "split", "noise-twist", LAY, 1.0, Bounds(2.0, 200, 8),
                               gram_proof=True, field=request.param)
    keys = split.generate_keys(params)
    return split.bind_public_context(params, keys.public_context), keys


def _permuted(z, qs):
    order, negate = split.noise_permutation(qs, len(z))
    return np.where(negate, -z[order], z[order])


def test_the_permutation_is_a_signed_permutation_fixed_by_the_query_seed_and_changed_by_any_other():
    qs = bytes(range(32))
    order, negate = split.noise_permutation(qs, 1000)
    assert sorted(order.tolist()) == list(range(1000)) and 400 < int(negate.sum()) < 600
    again = split.noise_permutation(qs, 1000)
    assert np.array_equal(order, again[0]) and np.array_equal(negate, again[1])
    for i in range(32):  # any other seed (one bit flipped in any byte) draws another permutation and signs
        other = bytearray(qs)
        other[i] ^= 1
        o2, n2 = split.noise_permutation(bytes(other), 1000)
        assert not np.array_equal(order, o2) and not np.array_equal(negate, n2)


def test_an_honest_shares_distribution_is_unchanged(session):
    params, _ = session
    sl = noised_entries(LAY)
    rng = np.random.default_rng(7)
    drawn, permuted = [], []
    for _ in range(3000):
        z = noise_share(params, rng)[sl]
        pz = _permuted(z, rng.bytes(32))
        # every draw: the same multiset of magnitudes, so the same norm, range and l2 bound
        assert np.array_equal(np.sort(np.abs(pz)), np.sort(np.abs(z)))
        drawn.append(z[[0, 20, 42]])
        permuted.append(pz[[0, 20, 42]])
    drawn, permuted = np.asarray(drawn), np.asarray(permuted)
    for j in range(3):  # a diagonal, an off-diagonal and a count entry: the same law after the permutation
        assert stats.ks_2samp(drawn[:, j], permuted[:, j]).pvalue > 1e-3
    # and the permuted entries are uncorrelated with each other, as the drawn ones are
    assert abs(np.corrcoef(permuted[:, 0], permuted[:, 1])[0, 1]) < 0.08


def test_the_release_through_every_role_is_the_statistics_plus_the_permuted_shares(session):
    params, keys = session
    circuit = split.Circuit(params)
    gs = circuit.part("gram")
    rng = np.random.default_rng(3)
    uploads, identities, expected = {}, {}, 0.0
    for k in range(3):
        X = rng.standard_normal((25, 6))
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        v = LAY.pack(local_statistics(X, np.arange(25) % 3, 3, gamma=1.0))
        z = noise_share(params, rng)
        h, key = f"h{k}", Ed25519PrivateKey.generate()
        body, seed, com = circuit.prove(h, v, noise=z)
        uploads[h] = split.seal_upload(params, body, seed, com, keys.public_context, h, key)
        identities[h] = key
    run = split.run_split(params, keys, {}, uploads=uploads, identities=identities)
    assert all(v is None for v in run.verdicts.values())
    F = circuit.F
    total = F.zeros(circuit.main_len)
    moved = False
    for h, (payload, st) in uploads.items():
        sha = hashlib.sha256(payload).hexdigest()
        seed = split.open_statement_seed(params, keys.secret_context, {h: st}, {h: identities[h].public_key()}, h,
                                         sha)
        plain = F.add(circuit.upload_share(payload), circuit.helper_share(seed))  # y + (-m): its own words
        z = F.decode_signed(plain[circuit.main_len + gs.n_f:circuit.main_len + gs.n_f + gs.n_z]).astype(np.int64)
        pz = _permuted(z, split.signed_query_seed(run.server_messages[h], h))
        moved |= not np.array_equal(pz, z)
        lanes = plain[:circuit.main_len].copy()
        # the share sits at 2^z_shift in the lanes (2^f2 within one Field128 word)
        lanes[gs.i_noise] = F.add(lanes[gs.i_noise], F.encode_signed((pz - z).astype(object) * gs.z_scale))
        total = F.add(total, lanes)
    want = field_decode(params, total)
    assert moved and np.array_equal(run.vector, want)


@pytest.mark.parametrize("field", ["goldilocks", "field128"])
def test_an_aimed_residual_no_longer_aims_through_the_real_roles(field):
    # one cheater among ten hospitals (d = 64, C = 10, a Gaussian fit of digits) puts the residual that hurts
    # most, as large as the statement lets it keep, in its Q noise words; through run_split (every role) it is
    # accepted, and the release it aimed at (its words as uploaded) loses points, the one released does not.
    # Goldilocks lets the whole l2 budget into Q; over Field128 the groups' l2 bounds keep the aimed loss itself
    # near a point (the benchmark: -1.3 on average against -7.2), so the gap asked of it is one point
    from secure_afl_tools.bench_dp_steer import steer_draw, steer_session

    params, keys = steer_session(1000, 10, field)
    # (the honest hospitals' shares are drawn from fresh entropy, as a hospital draws them: over three draws the
    # means are compared, the aimed loss -8 points on average in the benchmark, the released one -0.4)
    rng = np.random.default_rng(11)
    rows = [steer_draw(params, keys, rng) for _ in range(3)]
    assert all(r["verdict"] is None for r in rows)
    released = np.mean([r["released"] - r["honest"] for r in rows])
    aimed = np.mean([r["aimed"] - r["honest"] for r in rows])
    assert released > -0.02 and aimed < released - (0.02 if field == "goldilocks" else 0.005)
