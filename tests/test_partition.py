import time

import numpy as np
import pytest

from secure_afl.exceptions import InvalidInputError, InvalidParameterError
from secure_afl.partition import dirichlet, iid, parse_partition, partition, shards


def is_partition(parts, n):
    allidx = np.concatenate(parts)
    return allidx.size == n and np.array_equal(np.sort(allidx), np.arange(n))


def test_iid():
    y = np.arange(103) % 5
    parts = iid(y, 10)
    assert is_partition(parts, 103) and {len(p) for p in parts} == {10, 11}


@pytest.mark.parametrize("alpha", [0.005, 0.1, 1.0, 100.0])
def test_dirichlet_is_partition_and_skews_with_alpha(alpha):
    y = np.random.default_rng(0).integers(0, 10, 5000)
    parts = dirichlet(y, 20, alpha, seed=1)
    assert is_partition(parts, 5000)
    classes_per_client = np.mean([len(np.unique(y[p])) for p in parts if len(p)])
    if alpha <= 0.005:
        assert classes_per_client < 2.5
    if alpha >= 100:
        assert classes_per_client == 10


def test_dirichlet_tiny_alpha_many_clients_is_fast():
    y = np.random.default_rng(0).integers(0, 100, 50_000)
    t0 = time.perf_counter()
    parts = dirichlet(y, 1000, 0.005, seed=0)
    elapsed = time.perf_counter() - t0
    assert is_partition(parts, 50_000)
    assert elapsed < 10.0  # the reference redraw loop can hang here for ever


@pytest.mark.parametrize("s", [1, 2, 5])
def test_shards_gives_exactly_s_shards(s):
    y = np.repeat(np.arange(10), 100)
    parts = shards(y, 20, s, seed=0)
    assert is_partition(parts, 1000)
    assert all(len(p) == 1000 // (20 * s) * s for p in parts)
    # a shard of 1000/(20 s) sorted samples spans at most 2 classes, so <= 2s classes per client
    assert all(len(np.unique(y[p])) <= 2 * s for p in parts)
    if s == 1:
        assert np.mean([len(np.unique(y[p])) for p in parts]) <= 1.5


def test_partition_errors():
    with pytest.raises(InvalidInputError):
        shards(np.arange(10) % 2, 6, 2)
    with pytest.raises(InvalidParameterError):
        dirichlet(np.arange(10) % 2, 2, 0.0)
    with pytest.raises(InvalidInputError):
        parse_partition("dirichlet:")
    with pytest.raises(InvalidInputError):
        iid(np.array([0.5, 1.5]), 2)
    assert parse_partition("shards:3") == ("shards", 3)
    assert len(partition(np.arange(50) % 5, 5, "dirichlet:0.5")) == 5
