"""Centralised == AA law (any order) == sum form; invariance; printed-formula check."""

import numpy as np
import pytest

from secure_afl.analytic import (
    aa_law_aggregate,
    aa_law_pair,
    aggregate_statistics,
    centralised_weights,
    local_weights,
    paper_printed_weighting_matrices,
    ri_restore_weights,
    solve_from_sums,
    solve_head,
    top1_accuracy,
)
from secure_afl.exceptions import InvalidInputError, InvalidParameterError
from secure_afl.partition import dirichlet, iid, shards
from secure_afl.stats import local_statistics


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def make_data(n=3000, d=40, c=7, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((c, d)) * 2
    y = rng.integers(0, c, n)
    X = centers[y] + rng.standard_normal((n, d))
    return X, y


def three_ways(X, y, parts, c, gamma, orders=3, seed=0):
    W_central = centralised_weights(X, y, c)
    stats = [local_statistics(X[p], y[p], c, gamma=gamma) for p in parts if len(p)]
    W_sum = solve_from_sums(aggregate_statistics(stats))
    rng = np.random.default_rng(seed)
    pairs = [(local_weights(s), s.gram) for s in stats]
    W_aa = []
    for _ in range(orders):
        W_r, C_r = aa_law_aggregate(pairs, rng.permutation(len(pairs)))
        W_aa.append(ri_restore_weights(W_r, C_r, len(pairs), gamma))
    return W_central, W_sum, W_aa


@pytest.mark.parametrize("K", [1, 2, 10, 50, 200])
def test_centralised_equals_aa_law_equals_sum_form(K):
    # Prepare: with K = 200 and N = 3000 every hospital has N_k = 15 < d = 40
    X, y = make_data()
    parts = iid(y, K, seed=K)
    # Execute
    W_central, W_sum, W_aa = three_ways(X, y, parts, 7, gamma=1.0)
    # Assert
    assert rel(W_sum, W_central) <= 1e-9
    for W in W_aa:
        assert rel(W, W_central) <= 1e-9


def test_hospitals_missing_classes_and_small_n():
    # Prepare: shards with 1 shard per client -> every hospital sees ~1 class
    X, y = make_data(n=1200, d=30, c=6, seed=3)
    parts = shards(y, 100, 1, seed=1)
    assert all(len(np.unique(y[p])) <= 2 for p in parts)
    # Execute
    W_central, W_sum, W_aa = three_ways(X, y, parts, 6, gamma=0.5)
    # Assert
    assert rel(W_sum, W_central) <= 1e-9
    assert all(rel(W, W_central) <= 1e-9 for W in W_aa)


def test_rank_deficient_pooled_gram_gives_minimum_norm_solution():
    # Prepare: N = 20 < d = 50 overall, so the pooled C is singular
    X, y = make_data(n=20, d=50, c=3, seed=4)
    parts = iid(y, 4, seed=0)
    stats = aggregate_statistics(local_statistics(X[p], y[p], 3, gamma=1.0) for p in parts)
    # Execute
    W = solve_from_sums(stats)
    W_ref = np.linalg.pinv(X) @ np.eye(3)[y]
    # Assert: equal to X^+ Y, and minimum norm (orthogonal to the null space of X)
    assert rel(W, W_ref) <= 1e-9
    _, _, Vt = np.linalg.svd(X)
    null = Vt[20:]
    assert np.abs(null @ W).max() <= 1e-9


def test_final_ridge_lambda():
    X, y = make_data(n=500, d=20, c=4, seed=5)
    stats = local_statistics(X, y, 4)
    W = solve_from_sums(stats, lam=2.0)
    W_ref = np.linalg.solve(X.T @ X + 2.0 * np.eye(20), X.T @ np.eye(4)[y])
    assert rel(W, W_ref) <= 1e-12
    with pytest.raises(InvalidParameterError):
        solve_from_sums(stats, lam=-1.0)


@pytest.mark.parametrize("spec", ["iid", "dir0.005", "dir0.1", "dir1", "shards"])
@pytest.mark.parametrize("K", [1, 10, 100])
def test_invariance_to_partition_and_client_count(spec, K):
    # Prepare
    X, y = make_data(n=2000, d=25, c=10, seed=6)
    if spec == "iid":
        parts = iid(y, K, seed=1)
    elif spec == "shards":
        parts = shards(y, K, 2, seed=1)
    else:
        parts = dirichlet(y, K, float(spec[3:]), seed=1)
    W_central = centralised_weights(X, y, 10)
    # Execute
    stats = [local_statistics(X[p], y[p], 10, gamma=1.0) for p in parts if len(p)]
    W = solve_from_sums(aggregate_statistics(stats))
    # Assert
    assert rel(W, W_central) <= 1e-9


def test_derived_weighting_matrices_satisfy_identity_and_printed_ones_do_not():
    # Prepare: two full-rank clients
    X, y = make_data(n=400, d=15, c=3, seed=7)
    su = local_statistics(X[:200], y[:200], 3)
    sv = local_statistics(X[200:], y[200:], 3)
    Wu, Wv = local_weights(su), local_weights(sv)
    target = np.linalg.solve(su.gram + sv.gram, su.cross + sv.cross)
    # Execute
    W_derived, _ = aa_law_pair(Wu, su.gram, Wv, sv.gram, explicit_inverse=True)
    A, B = paper_printed_weighting_matrices(su.gram, sv.gram)
    W_printed = A @ Wu + B @ Wv
    # Assert
    assert rel(W_derived, target) <= 1e-10
    assert rel(W_printed, target) > 1e-3


def test_solve_head_rejects_bad_input():
    with pytest.raises(InvalidInputError):
        solve_head(np.eye(3), np.ones((4, 2)))
    with pytest.raises(InvalidInputError):
        solve_head(np.full((2, 2), np.nan), np.ones((2, 1)))


def test_top1_accuracy():
    W = np.eye(3)
    X = np.array([[1.0, 0, 0], [0, 2.0, 0], [0, 0, 3.0], [5.0, 0, 0]])
    assert top1_accuracy(W, X, [0, 1, 2, 1]) == 0.75
