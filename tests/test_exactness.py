"""Decryption equals plaintext, measured on ill-conditioned data (cond(C) ~ 1e9, d = 512).

Five uneven hospitals, three of them with fewer samples than dimensions. The
plaintext pipeline is run in several hospital orders; its spread is the yardstick
for the exact backends, and the ckks error is checked against its certified bound.
"""

from __future__ import annotations

import functools
import itertools
import operator

import numpy as np
import pytest

from secure_afl import split
from secure_afl.analytic import solve_from_sums
from secure_afl.backends.bfv import BFVBackend, new_bfv_session
from secure_afl.backends.ckks import CKKSBackend, new_ckks_session
from secure_afl.backends.secagg import secagg_session_params, simulate_round
from secure_afl.certify import certify_release, w_error_bound
from secure_afl.exceptions import InvalidInputError
from secure_afl.packing import Layout
from secure_afl.params import Bounds, SessionParams
from secure_afl.stats import local_statistics

D, C, GAMMA = 512, 10, 1.0
SIZES = (120, 300, 450, 900, 1700)  # N_k < d at three hospitals
LAYOUT = Layout(D, C)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(2024)
    n = sum(SIZES)
    # pooled X = U diag(s) V^T: one dominant direction (as the mean of real embeddings gives) and the
    # rest spread over three decades below it: cond(X^T X) = 1e9
    U, _ = np.linalg.qr(rng.standard_normal((n, D)))
    V, _ = np.linalg.qr(rng.standard_normal((D, D)))
    s = np.sqrt(0.8 * n) * np.concatenate(([1.0], np.logspace(-1.5, -4.5, D - 1)))
    X = (U * s) @ V.T
    X *= 1.0 / np.max(np.linalg.norm(X, axis=1))  # rows within the declared max_norm = 1
    y = rng.integers(0, C, n)
    cuts = np.cumsum((0,) + SIZES)
    vectors = [LAYOUT.pack(local_statistics(X[a:b], y[a:b], C, gamma=GAMMA)) for a, b in zip(cuts[:-1], cuts[1:])]
    bounds = Bounds(1.0, max(SIZES), len(SIZES))
    return vectors, bounds


def _W(vector):
    return solve_from_sums(LAYOUT.unpack(vector, gamma=GAMMA))


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def plaintext(data):
    vectors, _ = data
    W_plain = _W(functools.reduce(operator.add, vectors))
    # the plaintext pipeline's own variation over hospital orders
    spread = max(_rel(_W(functools.reduce(operator.add, [vectors[i] for i in order])), W_plain)
                 for order in itertools.islice(itertools.permutations(range(len(vectors))), 1, 25, 4))
    return W_plain, spread


@pytest.fixture(scope="module")
def secagg_result(data):
    vectors, bounds = data
    params = secagg_session_params("exact-secagg", LAYOUT, GAMMA, bounds)
    agg, exact, _, _ = simulate_round(params, vectors)
    assert exact
    return params, agg


@pytest.fixture(scope="module")
def bfv_result(data):
    vectors, bounds = data
    params, keys = new_bfv_session("exact-bfv", LAYOUT, GAMMA, bounds)
    be = BFVBackend(params)
    acc = be.combiner(public_context=keys.public_context)
    for v in vectors:
        acc.add(be.protect(v, public_context=keys.public_context))
    return params, be.reveal(acc.aggregate(), secret_context=keys.secret_context)


def test_the_data_is_ill_conditioned(data):
    # Prepare
    vectors, _ = data
    stats = LAYOUT.unpack(functools.reduce(operator.add, vectors), gamma=GAMMA)

    # Execute
    ev = np.linalg.eigvalsh(stats.gram - len(vectors) * GAMMA * np.eye(D))

    # Assert
    assert 3e8 < ev[-1] / ev[0] < 3e9


def test_secagg_w_within_the_plaintext_order_variation(secagg_result, plaintext):
    # Prepare
    _, agg = secagg_result
    W_plain, spread = plaintext

    # Execute
    err = _rel(_W(agg), W_plain)

    # Assert
    assert spread > 0
    assert err <= spread


def test_bfv_w_within_the_plaintext_order_variation_and_equal_to_secagg_bit_for_bit(bfv_result, secagg_result,
                                                                                    plaintext):
    # Prepare
    _, revealed = bfv_result
    _, agg = secagg_result
    W_plain, spread = plaintext

    # Execute
    W_bfv, W_secagg = _W(revealed), _W(agg)

    # Assert
    assert np.array_equal(revealed, agg)
    assert np.array_equal(W_bfv, W_secagg)
    assert _rel(W_bfv, W_plain) <= spread


def test_exact_backends_certified_bound_holds_and_matches_plaintext_order(bfv_result, data, plaintext):
    # Prepare
    params, revealed = bfv_result
    vectors, _ = data
    W_plain, _ = plaintext
    stats = LAYOUT.unpack(revealed, gamma=GAMMA)
    W = _W(revealed)

    # Execute
    b = certify_release(params, stats, W, len(vectors))
    plain = certify_release(SessionParams("p", "plain", LAYOUT, GAMMA, params.bounds), stats, W_plain, len(vectors))

    # Assert
    assert b.applies and plain.applies
    assert np.linalg.norm(W - W_plain) <= b.abs_bound + plain.abs_bound
    assert b.data_rel_bound <= plain.data_rel_bound  # the exact sum is no worse than float64 summation


def test_ckks_measured_error_within_its_certified_bound(data, plaintext):
    # Prepare: a precision target tight enough for a bound at cond 1e9
    vectors, bounds = data
    W_plain, _ = plaintext
    params, keys = new_ckks_session("exact-ckks", LAYOUT, GAMMA, bounds, max_abs_error=1e-11)
    be = CKKSBackend(params)
    acc = be.combiner(public_context=keys.public_context)
    for v in vectors:
        acc.add(be.protect(v, public_context=keys.public_context))
    revealed = be.reveal(acc.aggregate(), secret_context=keys.secret_context)
    stats = LAYOUT.unpack(revealed, gamma=GAMMA)

    # Execute
    W = _W(revealed)
    b = certify_release(params, stats, W, len(vectors))
    plain = certify_release(SessionParams("p", "plain", LAYOUT, GAMMA, bounds),
                            LAYOUT.unpack(functools.reduce(operator.add, vectors), gamma=GAMMA), W_plain,
                            len(vectors))

    # Assert
    err = float(np.linalg.norm(W - W_plain))
    assert b.applies and plain.applies
    assert 0 < err <= b.abs_bound + plain.abs_bound
    assert b.warning is not None and "above the session's target" in b.warning  # cond(C) ~ 1e9 breaks 1e-6


def test_ckks_at_a_loose_precision_has_no_bound_at_this_conditioning(data):
    # Prepare
    vectors, bounds = data
    # a loose target for the flooded release: the smallest scale that meets it
    params, _ = new_ckks_session("loose-ckks", LAYOUT, GAMMA, bounds, max_abs_error=1.0)
    stats = LAYOUT.unpack(functools.reduce(operator.add, vectors), gamma=GAMMA)

    # Execute
    b = certify_release(params, stats, _W(functools.reduce(operator.add, vectors)), len(vectors))

    # Assert: the bare decryption's error at that scale can move lambda_min(C) ~ 1e-6 to zero: no certificate,
    # and it says so
    assert not b.applies and b.to_dict()["rel_bound"] is None
    assert "no W error bound" in b.warning


def test_w_error_bound_dominates_random_perturbations():
    # Prepare
    rng = np.random.default_rng(5)
    d, c = 40, 3
    X = rng.standard_normal((200, d)) @ np.diag(np.logspace(0, -3, d))
    A, Q = X.T @ X, X.T @ rng.standard_normal((200, c))
    W = np.linalg.solve(A, Q)
    eps = 1e-10

    # Execute / Assert: perturb every entry by up to eps (symmetric), the bound holds
    for _ in range(20):
        E = rng.uniform(-eps, eps, (d, d))
        E = np.triu(E) + np.triu(E, 1).T
        W2 = np.linalg.solve(A + E, Q + rng.uniform(-eps, eps, Q.shape))
        b = w_error_bound(A + E, Q, W2, eps_C=eps, eps_Q=eps)
        assert b.applies and _rel(W, W2) <= b.rel_bound  # W is the exact solution of the unperturbed system


def test_w_error_bound_certifies_a_sloppy_solve():
    # Prepare: exact data (eps = 0) but a W that is not the solution: only the a-posteriori solve term can see it
    rng = np.random.default_rng(6)
    X = rng.standard_normal((100, 20))
    A, Q = X.T @ X, X.T @ rng.standard_normal((100, 2))
    W = np.linalg.solve(A, Q)
    sloppy = W + 1e-6 * rng.standard_normal(W.shape)

    # Execute
    b = w_error_bound(A, Q, sloppy, eps_C=0.0, eps_Q=0.0)

    # Assert
    assert b.applies and _rel(sloppy, W) <= b.rel_bound <= 1e3 * _rel(sloppy, W)


def test_w_error_bound_refuses_bad_shapes():
    # Execute / Assert
    with pytest.raises(InvalidInputError):
        w_error_bound(np.eye(3), np.ones((2, 1)), np.ones((2, 1)), eps_C=0.0, eps_Q=0.0)


def _split_release(session_id, layout, bounds, vectors, field="goldilocks", gram=False):
    """split through its three roles in-process: hospitals protect, server sums, key holder's share, collect
    (over ``field``: two Goldilocks lanes per value, or one Field128 word)."""
    import hashlib

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from secure_afl import split
    from secure_afl.backends import get_backend

    params = split.split_session_params(session_id, layout, GAMMA, bounds, field=field, gram_proof=gram)
    keys = split.generate_keys(params)
    params = split.bind_public_context(params, keys.public_context)
    be = get_backend(params)
    acc, participants, statements, enrolled = be.combiner(), [], {}, {}
    for i, v in enumerate(vectors):
        h, key = f"h{i}", Ed25519PrivateKey.generate()
        payload, st = be.protect(v, public_context=keys.public_context, hospital=h, identity_key=key)
        acc.add(payload)
        participants.append({"hospital": h, "payload_sha256": hashlib.sha256(payload).hexdigest()})
        statements[h], enrolled[h] = st, key.public_key()
    share = split.keyholder_share(params, keys.secret_context, {"participants": participants}, statements, enrolled)
    return params, split.collect(params, acc.aggregate(), share)


@pytest.mark.parametrize("field", ["goldilocks", "field128"])
def test_split_equals_secagg_and_bfv_bit_for_bit_on_ill_conditioned_data(data, secagg_result, bfv_result,
                                                                         plaintext, field):
    # Prepare
    vectors, bounds = data
    _, agg = secagg_result
    _, revealed = bfv_result
    W_plain, spread = plaintext

    # Execute
    params, split_sum = _split_release("exact-split", LAYOUT, bounds, vectors, field)

    # Assert
    assert params.backend_params["field"] == field
    assert np.array_equal(split_sum, agg) and np.array_equal(split_sum, revealed)
    assert _rel(_W(split_sum), W_plain) <= spread


def test_split_field128_with_the_gram_statement_equals_secagg_and_bfv_bit_for_bit(data, secagg_result, bfv_result,
                                                                                  plaintext):
    # Prepare: the Gram statement over one exact Field128 word per value: the lanes are not snapped (the factor's
    # rounding travels as the residual witness), so the release is the exact sum
    vectors, bounds = data
    _, agg = secagg_result
    _, revealed = bfv_result
    W_plain, spread = plaintext

    # Execute
    params, split_sum = _split_release("exact-split-gram", LAYOUT, bounds, vectors, "field128", gram=True)

    # Assert
    assert split.gram_enabled(params) and params.backend_params["field"] == "field128"
    assert np.array_equal(split_sum, agg) and np.array_equal(split_sum, revealed)
    assert _rel(_W(split_sum), W_plain) <= spread


@pytest.mark.parametrize("field,gram", [("goldilocks", False), ("field128", False), ("field128", True)],
                         ids=["goldilocks", "field128", "field128-gram"])
def test_split_equals_secagg_bit_for_bit_at_d512_c100(field, gram):
    # Prepare: three hospitals' statistics at d = 512, C = 100
    layout = Layout(512, 100)
    rng = np.random.default_rng(11)
    vectors = []
    for n in (300, 700, 1100):
        X = rng.standard_normal((n, 512))
        X /= np.max(np.linalg.norm(X, axis=1))
        vectors.append(layout.pack(local_statistics(X, rng.integers(0, 100, n), 100, gamma=GAMMA)))
    bounds = Bounds(1.0, 1100, 3)
    params = secagg_session_params("exact-secagg-100", layout, GAMMA, bounds)
    secagg_sum, exact, _, _ = simulate_round(params, vectors)

    # Execute
    params, split_sum = _split_release("exact-split-100", layout, bounds, vectors, field, gram)

    # Assert: the same released float64 sum (with the Gram statement on too), and float64 summation is within its
    # rounding of it
    assert params.backend_params["field"] == field and split.gram_enabled(params) == gram
    assert exact and np.array_equal(split_sum, secagg_sum)
    plain = functools.reduce(operator.add, vectors)
    assert np.max(np.abs(split_sum - plain) / np.maximum(np.abs(plain), 1.0)) <= 1e-13
