"""The ckks key holder's coefficient-domain flooding on real encryptions: the counts' own ciphertext decodes
to exact integers, the release stays within its proved bound on adversarial statistics, the noise is really
there at the stated size, and the bound follows the declared n_max as documented (keyholder/flooding.py)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from secure_afl.analytic import solve_from_sums
from secure_afl.backends.ckks import CKKSBackend, ckks_parameters, ckks_session_params, new_ckks_session
from secure_afl.certify import FLOOD_TAIL, certify_release
from secure_afl.hazmat import ckks as hz
from secure_afl.keyholder.flooding import (
    SECURITIES,
    SECURITY,
    check_counts_releasable,
    flood_plan,
    kl_log2,
    release_norms,
)
from secure_afl.keyholder.release import ridge_if_needed
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.release_checks import sanity_check
from support.ckks_release import flooded_release
from secure_afl.stats import SufficientStatistics, local_statistics

GAMMA = 1.0


def _vectors(lay, parts, gamma=GAMMA):
    vecs = []
    for X, y in parts:
        s = local_statistics(X, y, lay.n_classes)
        vecs.append(lay.pack(SufficientStatistics(s.gram + gamma * np.eye(lay.dim), s.cross, s.n, s.class_counts,
                                                  1.0, gamma)))
    return vecs, sum(vecs)


def test_count_ciphertext_decodes_to_exact_integers_at_a_once_refused_magnitude():
    """n_max 1e6, B = 4: the counts' chunk used to be flooded at the Gram's declared magnitude (moved by more
    than 1/2, refused at keygen). Now the counts block is a ciphertext of its own and comes out within
    count_tol < 1/2 of the true integers."""
    lay = Layout(6, 3)
    bounds = Bounds(4.0, 10 ** 6, 8)
    params, keys = new_ckks_session("counts", lay, GAMMA, bounds)
    check_counts_releasable(params)  # accepted at keygen
    rng = np.random.default_rng(0)
    parts = []
    for n in (40, 1, 77):
        X = rng.standard_normal((n, 6))
        X *= (3.9 / np.linalg.norm(X, axis=1))[:, None]
        parts.append((X, rng.integers(0, 3, n)))
    vecs, truth = _vectors(lay, parts)
    fl, plan, be = flooded_release(params, keys, vecs)

    assert be.spans[-1] == (lay.slices["n"].start, lay.length)  # the counts block's own ciphertext
    counts = np.r_[lay.slices["n"].start:lay.slices["tag"].start]
    assert fl.count_tol < 0.5
    assert np.max(np.abs(fl.vector[counts] - truth[counts])) <= fl.count_tol
    assert np.array_equal(np.round(fl.vector[counts]), truth[counts])
    stats = lay.unpack(fl.vector, gamma=GAMMA)
    assert round(stats.n) == 118 and round(stats.contributors) == 3


def _ill_conditioned(rng, n, d):
    return rng.standard_normal((n, d)) * np.logspace(0, -4.5, d) / math.sqrt(d)  # cond(C) ~ 1e9


def _tiny_diagonals(rng, n, d):
    X = np.abs(rng.standard_normal((n, d)))
    X[:, d // 2:] = X[:, [0]] * 10.0 ** rng.uniform(-4, -2, d - d // 2)
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def _one_sample_classes(rng, n, d):
    return rng.standard_normal((n, d)) / math.sqrt(d)


@pytest.mark.parametrize("kind", ["ill_conditioned", "tiny_diagonals", "one_sample_classes"])
def test_flooded_release_within_its_proved_bound_on_adversarial_statistics(kind):
    """Every released entry within the release's bound; the noise on C and Q within the norms the checks,
    the ridge and the certificate use; the certified W bound, where it applies, holds against the exact
    solve of the same system; and the noise is really there, at the stated standard deviation."""
    rng = np.random.default_rng(["ill_conditioned", "tiny_diagonals", "one_sample_classes"].index(kind))
    d, c = 24, 4
    lay = Layout(d, c)
    params, keys = new_ckks_session(f"adv-{kind}", lay, GAMMA, Bounds(1.0, 200, 4))
    make = {"ill_conditioned": _ill_conditioned, "tiny_diagonals": _tiny_diagonals,
            "one_sample_classes": _one_sample_classes}[kind]
    parts = []
    for n in (60, 3, 120):
        X = make(rng, n, d)
        y = rng.integers(1, c, n) if kind == "one_sample_classes" else rng.integers(0, c, n)
        parts.append((X, y))
    if kind == "one_sample_classes":  # class 0 holds exactly one sample, at one hospital
        parts[1][1][0] = 0
    vecs, truth = _vectors(lay, parts)
    K = len(vecs)
    fl, plan, _ = flooded_release(params, keys, vecs)

    err = fl.vector - truth
    assert np.max(np.abs(err)) <= fl.tol
    spectral, norms = release_norms(plan, fl, d, c, FLOOD_TAIL)
    noise = lay.unpack(err)
    assert np.linalg.norm(noise.gram, 2) <= spectral and np.linalg.norm(noise.cross) <= norms[1]
    # the flooding is there: the Gram and cross entries' error has the stated standard deviation
    g = np.r_[0:lay.slices["n"].start]
    assert 0.7 * fl.sigma <= float(np.std(err[g])) <= 1.3 * fl.sigma
    assert kl_log2(plan["coefficients"], plan["e_key"], plan["sigma"]) <= -(30 + math.log2(6)) + 1e-9

    stats = lay.unpack(fl.vector, gamma=GAMMA)
    rep = sanity_check(stats, params, K, abs_tol=fl.tol, count_tol=fl.count_tol, spectral_tol=spectral)
    assert all(rep.checks.values())
    stats = dataclasses.replace(stats, contributors=float(K), n=float(np.round(stats.n)),
                                class_counts=np.round(stats.class_counts))
    ridge = ridge_if_needed(stats, spectral)
    W = solve_from_sums(stats, lam=ridge)
    b = certify_release(params, stats, W, K, lam=ridge, flood_norms=norms)
    if b.applies:
        W_star = solve_from_sums(lay.unpack(truth, gamma=GAMMA), lam=ridge)
        assert np.linalg.norm(W - W_star) <= b.abs_bound


def test_held_out_style_session_max_norm_21_is_released():
    """Unnormalised embeddings (max_norm 21, n_max 611, k_max 7) at d = 512: refused at keygen before
    (imprecise_counts); now admitted, and a real flooded release is within its bound with exact counts."""
    lay = Layout(512, 4)
    params, keys = new_ckks_session("held-out", lay, GAMMA, Bounds(21.0, 611, 7))
    check_counts_releasable(params)
    rng = np.random.default_rng(2)
    parts = []
    for n in (30, 45):
        X = np.abs(rng.standard_normal((n, 512)))
        X *= (rng.uniform(5, 20.9, n) / np.linalg.norm(X, axis=1))[:, None]
        parts.append((X, rng.integers(0, 4, n)))
    vecs, truth = _vectors(lay, parts)
    fl, _, _ = flooded_release(params, keys, vecs)
    assert np.max(np.abs(fl.vector - truth)) <= fl.tol
    counts = np.r_[lay.slices["n"].start:lay.slices["tag"].start]
    assert np.array_equal(np.round(fl.vector[counts]), truth[counts])


def test_bound_grows_as_documented_with_the_declared_n_max():
    """Under fixed CKKS parameters the flooding noise does not depend on n_max at all; only the counts
    block's decode term FLOAT_REL x K x hospital_bound does, linearly. Sessions derived for larger n_max
    keep the value-independent bound within the target and pay in data bits (bytes), never in noise."""
    lay = Layout(16, 3)
    base = ckks_session_params("g", lay, GAMMA, Bounds(1.0, 100, 8))
    K = 5
    plans = {}
    for n_max in (100, 10 ** 4, 10 ** 6):
        p = dataclasses.replace(base, bounds=Bounds(1.0, n_max, 8))
        plans[n_max] = flood_plan(CKKSBackend(p), K) if n_max == 100 else _plan_unchecked(p, K)
    for n_max in (10 ** 4, 10 ** 6):
        assert plans[n_max]["sigma"] == plans[100]["sigma"]
        grow = hz.FLOAT_REL * K * (Bounds(1.0, n_max, 8).hospital_bound(GAMMA) - Bounds(1.0, 100, 8).hospital_bound(GAMMA))
        assert plans[n_max]["count_tol"] - plans[100]["count_tol"] == pytest.approx(grow, rel=1e-6)

    bits, target = [], 2e-2
    for n_max in (100, 10 ** 4, 10 ** 6, 10 ** 8):
        p = ckks_session_params("g", lay, GAMMA, Bounds(1.0, n_max, 8))
        be = CKKSBackend(p)
        tol0 = hz.flooded_tolerance(be.ckks_, 8, be.flooding(8)["coefficients"], lay.length, 0.0)[2]
        assert tol0 <= target
        bits.append(be.ckks_.data_bits)
    assert bits == sorted(bits) and bits[-1] > bits[0]


def _plan_unchecked(params, K):
    """flood_plan for parameters built for a smaller n_max (the backend would refuse them: (H) no longer
    holds); only the bound's arithmetic is compared here."""
    be = CKKSBackend.__new__(CKKSBackend)
    be.params, be.ckks_ = params, hz.CKKSParameters.from_dict(params.backend_params)
    return flood_plan(be, K)


def test_security_is_stated_as_key_recovery_security_with_its_kl_and_distance():
    """The sentence is computed from KAPPA: KL 2^-kappa / 6, statistical distance sqrt(KL / 2) (Pinsker)."""
    kl_bits = hz.KAPPA + math.log2(6)
    assert f"KL 2^-{kl_bits:.1f} under the independence heuristic" in SECURITY
    assert f"statistical distance <= 2^-{(kl_bits + 1) / 2:.1f}" in SECURITY
    assert SECURITY.startswith(f"{hz.KAPPA}-bit security against key recovery (OpenFHE / LMSS convention")
    # "proved" is proved for honest encryptions with a float64 sampler, and says so
    assert SECURITIES["proved"] != SECURITY and "against the honest-encryption worst case, float64 sampler" in \
        SECURITIES["proved"]


def _key_error_of_honest_sum(params, K: int, chunks: int) -> np.ndarray:
    """E = sum of K honest SEAL encryptions of zero, decrypted exactly: the integer polynomial c0 + c1 s mod
    q_0, centred (no decode). SEAL's decryption returns it in NTT form; it is taken out of NTT form by loading
    it as the first polynomial of a ciphertext (the second a copy, SEAL refuses a transparent one)."""
    import os
    import tempfile

    import tenseal.sealapi as sealapi

    ctx = hz.generate_context(params)
    n = params.poly_modulus_degree
    length = chunks * (n // 2)  # zero encodes to the zero polynomial exactly: what is left is the key error
    acc = None
    for _ in range(K):
        acc = hz.add_chunks(acc, hz.load_chunks(ctx, params, hz.encrypt_vector(ctx, params, np.zeros(length)),
                                                length))
    sc = ctx.seal_context().data
    dec, ev = sealapi.Decryptor(sc, ctx.secret_key().data), sealapi.Evaluator(sc)
    primes = [m.value() for m in sc.first_context_data().parms().coeff_modulus()]
    levels, out = len(primes), []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ct")
        for vec in acc:
            ct, plain = vec.ciphertext()[0], sealapi.Plaintext()
            dec.decrypt(ct, plain)
            words = np.array([plain.data(i) for i in range(levels * n)], dtype=np.uint64)
            with open(path, "wb") as f:
                f.write(hz.seal_ciphertext(ct.parms_id(), True, n, levels, ct.scale, np.concatenate([words, words])))
            c = sealapi.Ciphertext()
            c.load(sc, path)
            ev.transform_from_ntt_inplace(c)
            per_prime = []
            for j, q in enumerate(primes):
                r = np.array([c[j * n + i] for i in range(n)], dtype=np.uint64).astype(object)
                per_prime.append(np.array([int(x) - q if int(x) > q // 2 else int(x) for x in r], dtype=np.float64))
            assert all(np.array_equal(per_prime[0], x) for x in per_prime[1:])  # small: the same in every prime
            out.append(per_prime[0])
    return np.concatenate(out)


def test_seal_key_error_of_honest_encryptions_follows_the_independence_heuristic():
    """The heuristic the default flooding rests on, measured on SEAL (TenSEAL) itself: the key error of a sum
    of K honest public-key encryptions has the standard deviation the model of key_error_bound gives,
    sqrt(K (1 + 2N/3) / 12) (r0, r1 uniform on [-1/2, 1/2], s uniform ternary), and its largest coefficient is
    below the heuristic bound the flooding is sized with (itself far below the proved K (N/2 + 1))."""
    params = ckks_parameters(ckks_session_params("keyerr", Layout(4, 2), GAMMA, Bounds(1.0, 10, 8)))
    n, K, chunks = params.poly_modulus_degree, 8, 6
    assert n == 4096  # the smallest ring: the measurement stays quick
    e = _key_error_of_honest_sum(params, K, chunks)
    model = math.sqrt(K * (1.0 + 2.0 * n / 3.0) / 12.0)
    # over 6 x 4096 coefficients the sample sd is within ~0.5 % of the truth; the key's own weight moves
    # the truth by ~0.6 %: 3 % is several standard errors, and a model off by a factor (sqrt(2) if s were
    # binary, or K instead of sqrt(K)) is far outside it
    assert e.std() == pytest.approx(model, rel=0.03)
    assert abs(e.mean()) < 5.0 * model / math.sqrt(e.size)
    bound = hz.key_error_bound(params, K, e.size)
    assert np.max(np.abs(e)) < bound < hz.worst_key_error(params, K)


def test_a_chunk_residue_not_below_its_prime_is_refused():
    """The wire form sends residues at their primes' width: a value >= q (which SEAL would reduce or
    reject) is an invalid contribution, refused before it touches the running sum."""
    from secure_afl.envelope import open_envelope, seal
    from secure_afl.exceptions import InvalidContribution

    lay = Layout(6, 3)
    params, keys = new_ckks_session("wire", lay, GAMMA, Bounds(1.0, 10, 4))
    be = CKKSBackend(params)
    body = bytearray(open_envelope(params, be.protect(np.zeros(lay.length), public_context=keys.public_context),
                                   "contribution").body)
    first = 16 + 8 + 4  # body header (magic, count, length), the chunk's length, its value count
    bits = hz.primes_of(be.keyholder_context(keys.secret_context))[0].bit_length()
    for i in range(bits):  # the first residue of c0 becomes 2^bits - 1 > q
        body[first + i // 8] |= 1 << (i % 8)
    comb = be.combiner(public_context=keys.public_context)
    with pytest.raises(InvalidContribution):
        comb.add(seal(params, "contribution", bytes(body)))
    assert comb.count == 0


def test_headroom_leaves_room_for_the_flooding_polynomial():
    """Condition (H) must hold with the flooding's coefficients on top: bounds that fit the modulus without
    them but not with them are refused at session set-up (a wrap would decrypt to garbage)."""
    from secure_afl.exceptions import InvalidParameterError
    from secure_afl.params import SessionParams

    lay = Layout(6, 3)
    params = ckks_session_params("h", lay, 0.0, Bounds(1.0, 10, 4))
    be = CKKSBackend(params)
    g = be.flooding(4)["coefficient_bound"]
    lo, hi = be.ckks_.max_aggregate(4, g), be.ckks_.max_aggregate(4, 0.0)
    assert lo < hi
    a = (lo + hi) / 2.0  # fits without the flooding, not with it
    squeezed = SessionParams("h", "ckks", lay, 0.0, Bounds(math.sqrt(a / 4.0), 1, 4), dict(params.backend_params))
    assert squeezed.bounds.aggregate_bound(0.0) == pytest.approx(a, rel=1e-12)
    with pytest.raises(InvalidParameterError, match="flooding"):
        CKKSBackend(squeezed)


def _ckks_sections(**ckks):
    sec = {"session": {"id": "fl", "backend": "ckks", "dim": 6, "classes": 3, "hospitals": ["a", "b", "c"]},
           "bounds": {"max_norm": 1.0, "n_max": 50, "k_max": 3}}
    if ckks:
        sec["ckks"] = ckks
    return sec


def test_signed_proved_flooding_sizes_the_noise_against_the_proved_bound():
    """[ckks] flooding = "proved": the signed parameters say so (a different digest, so every upload is bound
    to it), the key holder's plan bounds the key error by the worst case K (N/2 + 1), and a release of real
    encryptions is within KL 2^-32.6 against that bound, within its stated error. The default (heuristic)
    release is only about 2^-24 against the proved bound, and reports it."""
    from secure_afl.backends.ckks import bind_public_context, generate_keys
    from secure_afl.session.definition import normalise
    from secure_afl.session.schema import parse

    lay = Layout(6, 3)
    rng = np.random.default_rng(3)
    parts = []
    for n in (30, 20, 45):
        X = rng.standard_normal((n, 6))
        X *= (0.9 / np.linalg.norm(X, axis=1))[:, None]
        parts.append((X, rng.integers(0, 3, n)))
    vecs, truth = _vectors(lay, parts)
    released = {}
    for mode in ("heuristic", "proved"):
        params = normalise(parse(_ckks_sections(flooding=mode))).session_params()
        keys = generate_keys(params)
        params = bind_public_context(params, keys.public_context)
        fl, plan, be = flooded_release(params, keys, vecs)
        assert be.key_error_model == mode and fl.to_report()["flood_key_error_model"] == mode
        assert np.max(np.abs(fl.vector - truth)) <= fl.tol
        released[mode] = (params, fl, plan, be)
    p_h, fl_h, plan_h, be_h = released["heuristic"]
    p_p, fl_p, plan_p, be_p = released["proved"]
    assert p_p.backend_params["flooding"] == "proved" and p_h.digest() != p_p.digest()
    assert plan_p["e_key"] == hz.worst_key_error(be_p.ckks_, 3)
    assert fl_p.kl_log2 == pytest.approx(-(hz.KAPPA + math.log2(6))) and fl_p.kl_log2_proved == fl_p.kl_log2
    assert fl_h.kl_log2 == pytest.approx(-(hz.KAPPA + math.log2(6))) and fl_h.kl_log2_proved > fl_h.kl_log2 + 5
    assert fl_p.to_report()["flood_security"] == SECURITIES["proved"]
    # the noise per coefficient against each one's own key-error bound: the proved one is many times larger
    assert fl_p.sigma_coefficients / plan_p["e_key"] == pytest.approx(fl_h.sigma_coefficients / plan_h["e_key"],
                                                                      rel=1e-9)
    assert fl_p.sigma_coefficients > 10 * fl_h.sigma_coefficients


def test_default_session_signs_no_ckks_section_and_a_bad_model_is_refused():
    """The default is today's sizing and a session without [ckks] signs exactly what it signed before;
    an unknown model, or [ckks] on another backend, is refused at load, named."""
    from secure_afl.exceptions import InvalidParameterError
    from secure_afl.session.definition import normalise
    from secure_afl.session.schema import parse

    from secure_afl.session.signed import from_body

    proved = normalise(parse(_ckks_sections(flooding="proved")))
    assert from_body(proved.body, source="signed").body == proved.body  # what the parties re-check on load
    plain_default = normalise(parse(_ckks_sections()))
    assert "ckks" not in plain_default.body and "flooding" not in plain_default.session_params().backend_params
    explicit = normalise(parse(_ckks_sections(flooding="heuristic"))).session_params()
    assert explicit.digest() == plain_default.session_params().digest()
    with pytest.raises(InvalidParameterError, match="heuristic, proved"):
        normalise(parse(_ckks_sections(flooding="proven")))
    other = _ckks_sections(flooding="proved")
    other["session"]["backend"] = "bfv"
    with pytest.raises(InvalidParameterError, match=r"\[ckks\] is for backend"):
        normalise(parse(other))
