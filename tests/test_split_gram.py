"""split's Gram statement ([split] gram_proof): every upload proves [[C, Q], [Q^T, diag(counts)]] = 2^t (L L^T + D).

The circuit tests run the server's signed verifier message and the key holder's verdict on its own share (the
release path's protocol functions); the e2e test drives a real server process as a malicious hospital would.
"""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secure_afl import split
from secure_afl.backends import get_backend
from secure_afl.exceptions import BoundsExceeded, SanityCheckFailed
from secure_afl.hazmat import flp
from secure_afl.hazmat.flp_square import SquareSumProof
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.stats import SufficientStatistics, local_statistics
from secure_afl_tools.attacks_validity import INDEFINITE, field_factor, gram_cheat, indefinite_statistics

P = flp.P
GAMMA = 1.0


def _session(dim, classes, n_max, gram=True, gamma=GAMMA, k_max=8, max_norm=1.0, field="goldilocks"):
    params = split.split_session_params(f"gram-{dim}-{gram}", Layout(dim, classes), gamma,
                                        Bounds(max_norm, n_max, k_max), gram_proof=gram, field=field)
    keys = split.generate_keys(params)
    params = split.bind_public_context(params, keys.public_context)
    return params, get_backend(params), Ed25519PrivateKey.generate(), keys


def _verdict(sess, body, seed, com, hospital="h1"):
    params, be, server_key, keys = sess
    payload, st = be.seal_upload(body, seed, com, keys.public_context, hospital, Ed25519PrivateKey.generate())
    split.check_upload(be.circuit, payload, st)
    sha = hashlib.sha256(payload).hexdigest()
    # the key holder's query seed for this upload, as it derives it (from its own key and the commitment)
    expected = split.query_seed(split.query_key(keys.secret_context), params, hospital, sha,
                                         st.get("validity"))
    msg = split.leader_message(be.circuit, hospital, payload, st, server_key, expected)
    qs, leader = split.verify_leader_message(msg, server_key.public_key(), be.circuit, hospital, sha,
                                                      expected)
    return split.helper_verdict(be.circuit, hospital, seed, st, qs, leader)


def _embeddings(n, dim, classes, seed):
    """Real-valued l2-normalised embeddings; the first min(n, classes) samples each open a class of their own."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, dim))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = np.concatenate([np.arange(min(n, classes)), rng.integers(0, classes, max(0, n - classes))])
    return X, y


# -- the square-sum proof ------------------------------------------------------------------------------------
def test_square_sum_proof_outputs_the_squared_norms_and_refuses_a_wrong_one():
    rng = random.Random(3)
    for length, groups in ((1, 1), (9, 3), (200, 3)):
        sq = SquareSumProof(length, groups)
        v = flp.to_field([rng.randrange(P) for _ in range(length * groups)])
        proof = sq.prove(v, flp.to_field([rng.randrange(P) for _ in range(sq.chunk)]))
        r0 = flp.to_field([rng.randrange(P) for _ in range(v.size)])
        p0 = flp.to_field([rng.randrange(P) for _ in range(sq.proof_len)])
        t = rng.randrange(P)
        msg = flp.add(sq.query(flp.sub(v, r0), flp.sub(proof, p0), t), sq.query(r0, p0, t))
        assert sq.decide(msg) and msg.shape == (sq.chunk + 1,)  # no output in the message: they are private
        want = [sum(int(x) ** 2 for x in v[g * length:(g + 1) * length]) % P for g in range(groups)]
        outs = flp.add(sq.outputs(flp.sub(proof, p0)), sq.outputs(p0))
        assert [int(x) for x in outs] == want
        for i in (sq.chunk, sq.proof_len - 1, 0):  # another P, or another seed: P(t) gives it away
            bad = proof.copy()
            bad[i] = (int(bad[i]) + 1) % P
            assert not sq.decide(flp.add(sq.query(flp.sub(v, r0), flp.sub(bad, p0), t), sq.query(r0, p0, t)))


# -- honest uploads always prove ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dim,classes,n_max", [(64, 10, 100), pytest.param(512, 100, 1000, marks=pytest.mark.slow)])
def test_honest_l2_normalised_embeddings_always_prove(dim, classes, n_max):
    sess = _session(dim, classes, n_max)
    be = sess[1]
    for k, n in enumerate((1, 2, classes, n_max // 3, n_max)):  # n = 1 .. n_max, one-sample classes
        X, y = _embeddings(n, dim, classes, k)
        v = Layout(dim, classes).pack(local_statistics(X, y, classes, gamma=GAMMA))
        assert _verdict(sess, *be.circuit.prove(f"h{k}", v), hospital=f"h{k}") is None, n


def test_without_gamma_the_jitter_lets_a_rank_deficient_hospital_prove_within_the_trace_bound():
    sess = _session(16, 4, 40, gamma=0.0)
    c = sess[1].circuit
    assert c.sizes["gram"]["jitter"] > 0  # the session's diagonal, accounted in the trace relation's constant
    for n in (1, 3, 40):  # rank n < d: singular without the jitter
        X, y = _embeddings(n, 16, 4, n)
        v = Layout(16, 4).pack(local_statistics(X, y, 4, gamma=0.0))
        assert _verdict(sess, *c.prove("h1", v)) is None


def test_the_snapped_statistics_are_within_the_stated_rounding_of_the_true_ones():
    sess = _session(64, 10, 100)
    c = sess[1].circuit
    X, y = _embeddings(100, 64, 10, 7)
    v = Layout(64, 10).pack(local_statistics(X, y, 10, gamma=GAMMA))
    x, _ = c.witness(v)
    from secure_afl.hazmat import fixedpoint

    got = fixedpoint.decode(flp.decode_signed(x).view(np.uint64), (c.f1, c.f2))
    # each factor entry truncated by < 2^-f: |dA_ij| <= 2^-f (|L_i|_1 + |L_j|_1) + m 2^-2f, |L_i|_1 <= sqrt(m A_ii)
    m = c.sizes["gram"]["m"]
    bound = 2.0 ** -c.sizes["gram"]["f"] * 2 * np.sqrt(m * (100 + 2)) + m * 2.0 ** (-2 * c.sizes["gram"]["f"])
    assert 0 < np.max(np.abs(got - v)) <= bound
    sl = Layout(64, 10).slices
    assert np.array_equal(got[sl["counts"]], v[sl["counts"]]) and got[sl["n"]][0] == v[sl["n"]][0]


def test_the_hospital_factors_its_statistics_on_one_blas_thread_whatever_the_process_allows(monkeypatch):
    """A second BLAS thread adds CPU to the factor and no wall time; a many-core hospital would spin one per
    core. Inside the factor BLAS runs on one thread although the process allows two."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from secure_afl.split import gram_statement

    def blas_threads():
        return sorted({m["num_threads"] for m in threadpool_info() if m["user_api"] == "blas"})

    seen = []
    real_cholesky, real_gram = np.linalg.cholesky, gram_statement.exact_gram
    monkeypatch.setattr(np.linalg, "cholesky", lambda a: (seen.append(blas_threads()), real_cholesky(a))[1])
    monkeypatch.setattr(gram_statement, "exact_gram", lambda m: (seen.append(blas_threads()), real_gram(m))[1])
    sess = _session(16, 4, 40, field="field128")
    X, y = _embeddings(40, 16, 4, 3)
    v = Layout(16, 4).pack(local_statistics(X, y, 4, gamma=GAMMA))
    with threadpool_limits(2, user_api="blas"):
        assert blas_threads() == [2]  # what the process allows outside the factor
        assert _verdict(sess, *sess[1].circuit.prove("h1", v)) is None
        assert blas_threads() == [2]
    assert len(seen) >= 2 and all(s == [1] for s in seen), seen


def test_the_honest_prover_refuses_indefinite_statistics():
    sess = _session(6, 3, 200, max_norm=2.0)
    X, y = _embeddings(3, 6, 3, 0)
    honest = [local_statistics(X, y, 3)]
    bad = indefinite_statistics("half-plus-minus-H", honest, np.ones((6, 3)))
    v = Layout(6, 3).pack(SufficientStatistics(bad.gram + GAMMA * np.eye(6), bad.cross, bad.n, bad.class_counts,
                                               1.0, GAMMA))
    with pytest.raises(BoundsExceeded, match="positive semi-definite"):
        sess[1].circuit.prove("h1", v)


# -- a malicious hospital's indefinite statistics ---------------------------------------------------------------
def _attack_vector(name):
    from secure_afl_tools.attacks_validity import raw_statistics

    rng = np.random.default_rng(0)
    honest = raw_statistics(rng, k=2)
    target = rng.choice([-5.0, 5.0], size=(6, 3))
    raw = indefinite_statistics(name, honest, target)
    return Layout(6, 3).pack(SufficientStatistics(raw.gram + GAMMA * np.eye(6), raw.cross, raw.n, raw.class_counts,
                                                  1.0, GAMMA))


@pytest.fixture(scope="module", params=["goldilocks", "field128"])
def attack_sessions(request):
    # each attack over both fields: two Goldilocks lanes, or one exact Field128 word with the factor at f = F / 2
    return {g: _session(6, 3, 200, gram=g, max_norm=2.0, field=request.param) for g in (False, True)}


def _verdict_past_projection(sess, lanes, tries=20, **kw):
    """The verdict on the first upload whose l2 projection rows land in range: modified software computes those
    rows itself and re-draws its seed until they do (an attack vector near the l2 bound misses now and then)."""
    c = sess[1].circuit
    for _ in range(tries):
        verdict = _verdict(sess, *c.prove("h2", lanes=lanes, check=False, **kw), "h2")
        if verdict != "linear":
            return verdict
    return verdict


@pytest.mark.parametrize("name", INDEFINITE)
def test_each_indefinite_attack_is_refused_by_the_gram_statement_and_accepted_without_it(attack_sessions, name):
    v = _attack_vector(name)
    off, on = attack_sessions[False], attack_sessions[True]
    # without the Gram statement the upload proves: every entry, the trace and the counts are in bounds
    assert _verdict_past_projection(off, off[1].circuit.lanes(v)) is None
    c = on[1].circuit
    lanes = c.lanes(v)
    # with it: whatever factor the modified software sends, the upload is refused and the check named
    for kw in (gram_cheat(c, lanes, stand_in=_attack_vector_psd()), {}):
        assert _verdict_past_projection(on, lanes, **kw) == "gram"


def _attack_vector_psd():
    X, y = _embeddings(50, 6, 3, 1)
    return Layout(6, 3).pack(local_statistics(2.0 * X, y, 3, gamma=GAMMA))


def test_a_factor_over_the_field_satisfies_the_quadratic_identity_and_is_refused_by_its_range_rows(attack_sessions):
    # diag(a, ..., -b) with no cross terms or counts: L = diag(sqrt(a), ..., i sqrt(b)) over F_p (i^2 = -1 since
    # p = 1 mod 4), so L L^T = A holds mod p exactly; only the factor's range rows tell it is not a real factor
    on = attack_sessions[True]
    c = on[1].circuit
    d = 6
    diag = [float(k * k) for k in (9, 8, 7, 6, 5)] + [-16.0]
    counts = np.array([196.0, 4.0, 0.0])  # perfect squares: the counts block has an integer factor
    st = SufficientStatistics(np.diag(diag), np.zeros((d, 3)), 200.0, counts, 1.0, 0.0)
    lanes = c.lanes(Layout(d, 3).pack(st))
    kw = gram_cheat(c, lanes)
    assert kw and field_factor(c, lanes) is not None
    assert _verdict(on, *c.prove("h2", lanes=lanes, check=False, **kw), "h2") == "gram_range"
    # the same factor with honest statistics of the same shape (every pivot a square) is accepted
    pos = SufficientStatistics(np.diag([abs(x) for x in diag]), np.zeros((d, 3)), 200.0, counts, 1.0, 0.0)
    lanes = c.lanes(Layout(d, 3).pack(pos))
    assert _verdict(on, *c.prove("h2", lanes=lanes, check=False, **gram_cheat(c, lanes)), "h2") is None


def test_a_factor_of_other_statistics_is_refused_by_the_quadratic_identity(attack_sessions):
    # in range, with the right count slack, but L L^T is not the upload's A
    on = attack_sessions[True]
    c = on[1].circuit
    X, y = _embeddings(40, 6, 3, 2)
    v = Layout(6, 3).pack(local_statistics(2.0 * X, y, 3, gamma=GAMMA))
    w = v.copy()
    w[1] += 0.5  # C_01 moved: still a PSD-looking upload in every other respect
    assert _verdict(on, *c.prove("h2", lanes=c.lanes(w), check=False, factor=c.witness(v)[1]), "h2") == "gram"


def test_gram_statement_soundness_and_sizes():
    c = _session(64, 10, 100)[1].circuit
    d = split.describe(c)
    assert d["soundness_bits_q64"] >= 64.0 and d["gram"]["factor_words"] == 10 + 64 * 10 + 64 * 65 // 2
    assert split.describe(_session(64, 10, 100, gram=False)[1].circuit)["gram"] is None


def test_gram_proof_with_dp_builds_with_the_factor_on_half_the_noise_grid():
    from secure_afl.dp import DPSpec
    from secure_afl.backends.session_params import dp_session_params

    params = dp_session_params(DPSpec(epsilon=1.0, delta=1e-5, min_contributors=3), "split", "dp-gram",
                               Layout(6, 3), 1.0, Bounds(4.0, 100, 8), gram_proof=True, field="goldilocks")
    c = split.Circuit(params)
    # in Goldilocks, below GRAM_MIN_F, allowed under DP (docs/VALIDITY.md): the scale is the noise grid's half
    assert c.sizes["gram"]["f"] == c.f1 // 2 < split.sizes.GRAM_MIN_F and c.part("gram").noise
    # over Field128, the default, the word's scale f1 + f2: the factor at half of it, far finer than the grid
    params = dp_session_params(DPSpec(epsilon=1.0, delta=1e-5, min_contributors=3), "split", "dp-gram",
                               Layout(6, 3), 1.0, Bounds(4.0, 100, 8))
    c = split.Circuit(params)
    f1, f2 = (int(v) for v in params.backend_params["frac_bits"])
    assert c.sizes["gram"]["f"] == (f1 + f2) // 2 > f1 and c.part("gram").noise


# -- the release ---------------------------------------------------------------------------------------------
def _signed(**split_section):
    """``(session, release policy)`` of a signed split definition (h1..h3, d = 6, C = 3, n_max = 200), in
    Goldilocks unless ``split_section`` names a field (these tests forge Goldilocks lanes): the parameters as the
    key holder's keygen binds them, the policy as its release reads it."""
    from secure_afl.cohort import release_policy
    from secure_afl.session.definition import normalise
    from secure_afl.session.schema import parse

    definition = normalise(parse(_sections(split={"field": "goldilocks", **split_section})))
    params = definition.session_params()
    keys = split.generate_keys(params)
    params = split.bind_public_context(params, keys.public_context)
    return (params, get_backend(params), None, keys), release_policy(definition)


@pytest.fixture(scope="module")
def signed_sessions():
    return {g: _signed(gram_proof=g) for g in (False, True)}


def _masked(sess, vectors):
    """The server's masked sum and the key holder's share over uploads built without their proofs' checks
    (what a wrong share would decode to)."""
    params, be, _, keys = sess
    acc, manifest, statements, enrolled = be.combiner(), {"participants": []}, {}, {}
    for k, v in enumerate(vectors):
        h, ident = f"h{k}", Ed25519PrivateKey.generate()
        body, seed, com = be.circuit.prove(h, lanes=be.circuit.lanes(v), check=False)
        payload, st = be.seal_upload(body, seed, com, keys.public_context, h, ident)
        acc.add(payload)
        manifest["participants"].append({"hospital": h, "payload_sha256": hashlib.sha256(payload).hexdigest()})
        statements[h], enrolled[h] = st, ident.public_key()
    return acc.aggregate(), split.keyholder_share(params, keys.secret_context, manifest, statements, enrolled)


def _release(sess, policy, vectors, *, forge=None):
    """The key holder's release (:func:`form_release`) of ``vectors``' masked sum with its share, the share less
    ``forge`` (a float vector of the layout's length, encoded as the release decodes) when given."""
    from secure_afl.hazmat import fixedpoint
    from secure_afl.split_release import form_release

    params = sess[0]
    masked, share = _masked(sess, vectors)
    if forge is not None:
        share = flp.sub(share, np.asarray(fixedpoint.encode(forge, tuple(params.backend_params["frac_bits"])),
                                          dtype=np.uint64))
    return form_release(params, masked, share, len(vectors), policy)


def _forged_entry(layout, slot: str, value: float):
    out = np.zeros(layout.length)
    out[layout.slices[slot].start] = value
    return out


def test_an_indefinite_released_sum_is_refused_only_under_the_gram_statement(signed_sessions):
    vectors = [_attack_vector_psd(), _attack_vector("half-plus-minus-H")]
    off, on = signed_sessions[False], signed_sessions[True]
    assert np.all(np.isfinite(_release(*off, vectors).W))
    # decoding alone refuses nothing: the refusal is the signed policy's, in the release
    assert np.all(np.isfinite(split.collect(on[0][0], *_masked(on[0], vectors))))
    with pytest.raises(SanityCheckFailed, match="positive semi-definite") as info:
        _release(*on, vectors)
    assert info.value.reason == "psd"
    # an honest PSD sum under the statement is released (the tolerance covers the low lanes and the rounding)
    honest = [_attack_vector_psd(), _attack_vector_psd()]
    assert np.all(np.isfinite(_release(*on, honest).W))


def test_a_forged_share_that_makes_the_released_gram_indefinite_is_refused_under_the_gram_statement(
        signed_sessions):
    # Prepare: two honest, proven uploads; the key holder's share moved so that C[0, 0] decodes below zero
    honest = [_attack_vector_psd(), _attack_vector_psd()]
    layout = Layout(6, 3)
    c00 = float(sum(v[layout.slices["gram"].start] for v in honest))
    forge = _forged_entry(layout, "gram", c00 + 10.0)
    off, on = signed_sessions[False], signed_sessions[True]
    # Execute / Assert: within the aggregate bound, so the sum decodes; only the Gram statement's policy refuses it
    assert np.all(np.isfinite(_release(*off, honest, forge=forge).W))
    with pytest.raises(SanityCheckFailed, match="positive semi-definite") as info:
        _release(*on, honest, forge=forge)
    assert info.value.reason == "psd"


def test_max_share_refuses_a_release_too_small_for_the_cap():
    sess, policy = _signed(max_share=0.5)
    assert policy.max_share == 0.5
    small = _attack_vector_psd()  # 50 samples each, 100 released: one hospital could hold 200
    with pytest.raises(SanityCheckFailed, match="max_share") as info:
        _release(sess, policy, [small, small])
    assert info.value.reason == "share_cap"
    X, y = _embeddings(200, 6, 3, 5)
    big = Layout(6, 3).pack(local_statistics(2.0 * X, y, 3, gamma=GAMMA))
    assert np.all(np.isfinite(_release(sess, policy, [big, big]).W))  # 400 samples: n_max is half of them
    # a share forged to take 250 samples off the released count: 150 left, under the cap's 400
    with pytest.raises(SanityCheckFailed, match="max_share") as info:
        _release(sess, policy, [big, big], forge=_forged_entry(Layout(6, 3), "n", 250.0))
    assert info.value.reason == "share_cap"
    # 300 samples left: n_max = 200 is two thirds of them, past the cap of a half (and within twice the cap, so
    # the check's factor is what this case pins)
    with pytest.raises(SanityCheckFailed, match="max_share") as info:
        _release(sess, policy, [big, big], forge=_forged_entry(Layout(6, 3), "n", 100.0))
    assert info.value.reason == "share_cap"
    # without a cap the same release is formed: the refusal is the signed policy's
    uncapped, plain = _signed()
    assert plain.max_share == 1.0
    assert np.all(np.isfinite(_release(uncapped, plain, [small, small]).W))


# -- through the service ----------------------------------------------------------------------------------------
@pytest.mark.e2e
def test_an_indefinite_upload_is_refused_by_name_through_the_service_only_under_the_gram_statement():
    from secure_afl_tools.attacks_validity import attack_steer_indefinite_service

    # Execute: a real server per setting (the default split session, one signed gram_proof = false), two honest
    # hospitals, h2's rank-one cancellation and its exact control with a positive semi-definite C_k
    # (C_k = (n_max B^2 / d) I, Q_k = (C_h + C_k) W* - Q_h: A_k is indefinite)
    r = attack_steer_indefinite_service(backends=("split",), attacks=("rank-one-cancel-0.99", "psd-exact-control"),
                                        verbose=False)
    on, on_psd, off, off_psd = r["rows"]
    # Assert: released and W blown up, or set to W*, without the statement; h2 named and W the honest one with it
    assert off["session"] == "gram_proof = false" and not off["gram_proof"]
    assert off["released"] and not off["refused"] and off["norm_ratio"] > 4
    assert off_psd["released"] and not off_psd["refused"] and abs(off_psd["pull"] - 1.0) < 1e-6
    for row in (on, on_psd):
        assert row["session"] == "default" and row["gram_proof"] and row["field"] == "field128"
        assert row["released"] and row["refused"] == {"h2": "gram"}
        assert abs(row["norm_ratio"] - 1.0) < 1e-9  # the honest two, exact lanes: their statistics unsnapped


@pytest.mark.e2e
@pytest.mark.security
def test_attack_steer_on_the_default_split_session_refuses_every_exact_control_case_by_name():
    from secure_afl_tools.attacks_validity import INDEFINITE, SPLIT_SESSIONS, attack_steer_service

    # Execute: `attack steer --backend split`'s cases against the default session, each through a real server:
    # alpha I with alpha W* at the bound (wide and inside the Cauchy-Schwarz cone), and every indefinite case,
    # the PSD C_k with a chosen Q_k that sets W exactly included
    r = attack_steer_service(backends=("split",), alphas=(None,), indefinite=INDEFINITE, dp_residual=False,
                             verbose=False, split_sessions=SPLIT_SESSIONS[:1])
    # Assert: every exact-control case named (h2, the Gram statement), the release formed over the honest two
    rows = r["indefinite"]
    assert [row["attack"] for row in rows] == list(INDEFINITE) and r["default_refused_by_name"]
    for row in rows:
        assert row["session"] == "default" and row["refused"] == {"h2": "gram"} and row["released"], row
    # the within-bound steering uploads are no Gram matrix either: the client will not prove them, and sent
    # unchecked by modified software they are refused by name
    for row in r["rows"]:
        assert row["modified_software"] and row["refused"] == {"h2": "gram"} and not row["accepted"], row


# -- the signed session -----------------------------------------------------------------------------------------
def _sections(backend="split", **extra):
    base = {"session": {"id": "gram-session", "backend": backend, "dim": 6, "classes": 3,
                        "hospitals": ["h1", "h2", "h3"], "min_clients": 2},
            "bounds": {"max_norm": 2.0, "n_max": 200, "k_max": 8}}
    base.update(extra)
    return base


def test_a_definition_signed_without_split_keys_keeps_meaning_goldilocks_without_the_statement():
    # Prepare: the body `session sign` wrote for a default split session before it wrote [split] (none at all)
    from secure_afl.cohort import release_policy
    from secure_afl.session.definition import guarantee_lines, normalise
    from secure_afl.session.schema import parse
    from secure_afl.session.signed import from_body

    spelled = normalise(parse(_sections(split={"gram_proof": False, "field": "goldilocks"})))
    old_body = {**spelled.body, "split": None}
    # Execute: every party re-reads a signed body through from_body
    old = from_body(old_body, source="old signed session")
    # Assert: accepted as signed (canonical), and read as it was signed: Goldilocks lanes, no Gram statement, the
    # same parameters (digest) as the session that spells it out, the steering line and policy saying so
    assert old.body["split"] is None
    assert old.session_params().digest() == spelled.session_params().digest()
    assert not split.gram_enabled(old.session_params()) and not release_policy(old).gram_proof
    assert "Gram statement off (goldilocks)" in dict(guarantee_lines(old))["steering"]
    # and a party's own settings spelling that out are the same session
    assert old.comparable() == spelled.comparable()


def test_the_session_signs_gram_proof_into_the_parameters_with_or_without_dp_and_refuses_another_backend():
    from secure_afl.session.definition import normalise, share_line
    from secure_afl.session.schema import parse
    from secure_afl.exceptions import SecureAFLError

    on = normalise(parse(_sections(split={"gram_proof": True, "max_share": 0.5})))
    params = on.session_params()
    assert split.gram_enabled(params) and params.backend_params["max_share"] == 0.5
    off = normalise(parse(_sections(split={"gram_proof": False})))
    assert not split.gram_enabled(off.session_params()) and off.body["split"]["gram_proof"] is False
    assert params.digest() != off.session_params().digest()  # the setting is signed: the parameters differ
    # the default: on, in Field128, both written into the signed body (what is signed is what runs)
    default = normalise(parse(_sections()))
    assert default.body["split"] == {"gram_proof": True, "field": "field128", "max_share": 1.0}
    assert split.gram_enabled(default.session_params())
    with_dp = normalise(parse(_sections(split={"gram_proof": True}, dp={"epsilon": 1.0}))).session_params()
    assert split.gram_enabled(with_dp) and with_dp.dp is not None
    dp_default = normalise(parse(_sections(dp={"epsilon": 1.0})))
    assert dp_default.body["split"] == {"gram_proof": True, "field": "field128", "max_share": 1.0}
    with pytest.raises(SecureAFLError, match=r"\[split\] is for backend"):
        normalise(parse(_sections("ckks", split={"gram_proof": True})))
    line = share_line(on)
    assert "n_max = 200" in line and "max_share = 0.5" in line and "400 samples" in line
    assert "no cap" in share_line(off)


def test_square_sum_proof_matches_the_reference_and_the_vector():
    import json
    from pathlib import Path

    from support import flp_reference as ref

    vec = json.loads((Path(__file__).resolve().parent.parent / "vectors" / "flp.json").read_text())["square_sum_proof"]
    sq = SquareSumProof(vec["length"], vec["groups"], chunk=vec["chunk"])
    assert [int(x) for x in sq.prove(flp.to_field(vec["v"]), flp.to_field(vec["seeds"]))] == vec["proof"]
    rng = random.Random(29)
    for length, groups, chunk in ((1, 1, 1), (9, 3, 2), (40, 3, 7)):
        v = [rng.randrange(P) for _ in range(length * groups)]
        seeds = [rng.randrange(P) for _ in range(chunk)]
        got = SquareSumProof(length, groups, chunk=chunk).prove(flp.to_field(v), flp.to_field(seeds))
        assert [int(x) for x in got] == ref.square_sum_proof(v, length, groups, seeds, chunk)


@pytest.mark.e2e
def test_session_sign_prints_the_largest_share_and_signs_gram_proof_with_dp(tmp_path):
    import os
    import subprocess
    import sys

    from support import Consortium

    def sign(c):
        return subprocess.run([sys.executable, "-m", "secure_afl.cli", "session", "sign", str(c.config), "--pki",
                               str(c.pki_dir)], capture_output=True, text=True, timeout=180, env=dict(os.environ))

    # Prepare: a split session whose operator adds [split] by hand to session.toml
    c = Consortium(tmp_path / "a", backend="split", n_max=200, sign=False)
    c.config.write_text(c.config.read_text() + "\n[split]\ngram_proof = true\nmax_share = 0.5\n")
    # Execute / Assert: signed, with the share line naming n_max and the cap
    out = sign(c)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "one hospital may hold up to n_max = 200 samples" in out.stdout and "max_share = 0.5" in out.stdout
    # the same with [dp]: signed too (the noise share is proven beside the statistics)
    d = Consortium(tmp_path / "b", backend="split", n_max=200, sign=False)
    d.config.write_text(d.config.read_text() + "\n[split]\ngram_proof = true\n\n[dp]\nepsilon = 1.0\n")
    out = sign(d)
    assert out.returncode == 0, out.stdout + out.stderr
    assert list((d.pki_dir / "sessions").glob("*.json"))


def test_the_definiteness_check_refuses_just_past_the_proven_tolerance_and_takes_just_within(signed_sessions):
    from secure_afl.release_checks import check_release_policy
    from secure_afl.split import psd_tolerance
    from secure_afl.stats import SufficientStatistics

    # Prepare: a released Gram with one eigenvalue at a chosen multiple of the tolerance below zero
    sess, policy = signed_sessions[True]
    params = sess[0]
    d = params.layout.dim
    base = np.diag(np.r_[np.full(d - 1, 4.0), 0.0])
    tol = psd_tolerance(params, base)

    def stats(k):
        gram = base.copy()
        gram[-1, -1] = -k * tol
        return SufficientStatistics(gram, np.zeros((d, 3)), 400.0, np.array([200.0, 100.0, 100.0]), 2.0, GAMMA)

    # Execute / Assert: 3 tolerances below zero is refused, half of one is not (the tolerance moves by 2^-53 only)
    with pytest.raises(SanityCheckFailed, match="positive semi-definite") as info:
        check_release_policy(policy, params, stats(3.0))
    assert info.value.reason == "psd"
    check_release_policy(policy, params, stats(0.5))


# -- exact lanes over Field128: the residual witness and its slack -------------------------------------------
def _null_direction_upload(sess, lam_units: int):
    """An upload whose A has the eigenvalue -lam_units 2^-F: a hospital whose samples are all 0 in coordinate k
    (so e_k is a null vector of A), its diagonal C_kk lowered by lam_units, and the residual word of that entry
    raised by as much, so that A + R is still the honest 2^t (L L^T + D)."""
    params, be = sess[0], sess[1]
    c = be.circuit
    gram = c.part("gram")
    X, y = _embeddings(40, 6, 3, 5)
    X[:, 2] = 0.0
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    v = Layout(6, 3).pack(local_statistics(2.0 * X, y, 3, gamma=0.0))
    x, fw = c.witness(v)
    r, cc = np.triu_indices(6)
    slot = Layout(6, 3).slices["gram"].start + int(np.nonzero((r == 2) & (cc == 2))[0][0])
    j = gram.n_f + gram.n_z + int(np.nonzero(gram.i_a == slot)[0][0])
    F = c.F
    x[slot] = F.sub(x[slot], F.to_field([lam_units]))[0]
    fw[j] = F.add(fw[j], F.to_field([lam_units]))[0]
    A = Layout(6, 3).unpack(np.ldexp(F.decode_signed_float(x), -c.f1))
    return x, fw, float(np.linalg.eigvalsh(A.gram)[0])


@pytest.fixture(scope="module")
def exact_session():
    return _session(6, 3, 200, gamma=0.0, max_norm=2.0, field="field128")


def test_exact_lanes_leave_the_statistics_unsnapped_and_carry_the_residual(exact_session):
    c = exact_session[1].circuit
    g = c.sizes["gram"]
    assert c.part("gram").exact and c.main_len == c.L and g["n_r"] == g["n_f"]
    X, y = _embeddings(40, 6, 3, 3)
    v = Layout(6, 3).pack(local_statistics(2.0 * X, y, 3, gamma=0.0))
    x, fw = c.witness(v)
    # the lanes are the vector's own exact words (nothing snapped) and the upload proves
    assert np.array_equal(x, c.lanes(v))
    assert _verdict(exact_session, *c.prove("h1", v)) is None
    # the honest residual is within its proven bound, far inside it
    R = c.F.decode_signed(c.part("gram").residual(fw))
    assert max(abs(int(e)) for e in R) < c.part("gram").T_r


def test_a_negative_eigenvalue_within_the_residual_bound_passes_and_stays_above_the_stated_floor(exact_session):
    c = exact_session[1].circuit
    gram = c.part("gram")
    # lowered by half the residual's per-entry bound: the proof accepts, as the statement allows
    x, fw, least = _null_direction_upload(exact_session, gram.T_r // 2)
    assert least < 0
    assert _verdict(exact_session, *c.prove("h2", lanes=x, factor=fw, check=False), "h2") is None
    # and the eigenvalue it reaches is above the floor VALIDITY.md states, -m 2T_R 2^-F
    assert least >= -c.sizes["gram"]["slack"]


def test_a_residual_hiding_one_negative_eigenvalue_past_the_slack_is_refused_by_its_range_rows(exact_session):
    c = exact_session[1].circuit
    gram = c.part("gram")
    # past the per-entry bound: the residual's range rows refuse it, whatever seed the software draws
    x, fw, least = _null_direction_upload(exact_session, 4 * gram.T_r)
    assert least < -2 * gram.T_r * 2.0 ** -c.f1
    assert _verdict_past_projection(exact_session, x, factor=fw) == "gram_range"
    # and with the residual left out the identity is what refuses it
    fw0 = fw.copy()
    fw0[gram.n_f + gram.n_z:] = 0
    assert _verdict_past_projection(exact_session, x, factor=fw0) == "gram"


@pytest.mark.e2e
def test_sign_show_and_server_run_state_the_default_split_sessions_field_and_gram_statement(consortium, tmp_path):
    import json as _json
    import os
    import subprocess
    import sys

    from support import Consortium

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "secure_afl.cli", *map(str, args)], capture_output=True,
                              text=True, timeout=180, env=dict(os.environ))

    # Prepare: a split session.toml with no [split] (the default), and one that turns the statement off
    c = consortium(backend="split", sign=False)
    off = Consortium(tmp_path / "off", backend="split", split={"gram_proof": False}, sign=False)

    # Execute: the operator signs and shows each; the server runs the default one
    signed = cli("session", "sign", c.config, "--pki", c.pki_dir)
    shown = cli("session", "show", "--session", c.session_id, "--pki", c.pki_dir)
    signed_off = cli("session", "sign", off.config, "--pki", off.pki_dir)
    c.start()

    # Assert: the resolved values are written into the signed definition (what is signed is what runs), and
    # sign, show and the server's start say the Gram statement is on in Field128; off still signs, saying so
    on_line = "validity: Gram statement on (field128, exact lanes): every upload proves its statistics positive"
    assert signed.returncode == 0 and on_line in signed.stdout, signed.stdout + signed.stderr
    assert shown.returncode == 0 and on_line in shown.stderr, shown.stderr
    assert _json.loads(shown.stdout)["split"] == {"field": "field128", "gram_proof": True, "max_share": 1.0}
    assert on_line in (c.root / "server.log").read_text()
    assert signed_off.returncode == 0, signed_off.stderr
    assert "validity: Gram statement off (field128): one hospital that knows the others' sums can set W exactly" \
        in signed_off.stdout and "sign [split] gram_proof = true to refuse it" in signed_off.stdout


@pytest.mark.e2e
@pytest.mark.security
def test_cli_attack_steer_exits_seven_once_the_default_split_session_lets_an_exact_control_upload_through():
    import subprocess
    import sys

    # the command's scope narrowed to the one case (the PSD exact control, the default session only); its checks
    # and exit status are the command's own
    scope = ("import functools\nimport secure_afl_tools.attacks as A\nfrom secure_afl_tools.attacks_validity import "
             "SPLIT_SESSIONS, attack_steer_service\nA.ATTACKS['steer'] = functools.partial(attack_steer_service, "
             "alphas=(), indefinite=('psd-exact-control',), dp_residual=False, split_sessions=SPLIT_SESSIONS[:1])\n")
    # the regression: a verifier that no longer refuses on the Gram statement's verdict
    broken = ("from secure_afl.split.proof import Circuit\n_d = Circuit.decide\n"
              "Circuit.decide = lambda self, a, b: (lambda v: None if v == 'gram' else v)(_d(self, a, b))\n")

    def run(prelude):
        code = f"import sys\n{prelude}\nfrom secure_afl.cli import main\nsys.exit(main(['attack', 'steer', " \
               "'--backend', 'split']))\n"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)

    ok, bad = run(scope), run(scope + broken)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "psd-exact-control    h2 REFUSED by name (gram check)" in ok.stdout
    assert "1 of 1 exact-control cases refused by name" in ok.stdout
    assert bad.returncode == 7, bad.stdout + bad.stderr
    assert "psd-exact-control    released: pull 100.0%" in bad.stdout and "NOT every one" in bad.stdout
    assert "not refused by name on split's default session" in bad.stderr
