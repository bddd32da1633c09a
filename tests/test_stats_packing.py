"""Streaming statistics, packing round trips and bad-input refusals."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from secure_afl.exceptions import (
    BoundsExceeded,
    InvalidInputError,
    InvalidParameterError,
    LayoutMismatch,
    MalformedPayload,
    RoundAlreadyClosed,
)
from secure_afl.packing import Layout
from secure_afl.stats import StatisticsAccumulator, local_statistics


def test_streaming_equals_batch():
    # Prepare
    rng = np.random.default_rng(0)
    X = rng.standard_normal((1000, 12))
    y = rng.integers(0, 4, 1000)
    # Execute
    acc = StatisticsAccumulator(12, 4)
    for s in range(0, 1000, 37):
        acc.update(X[s:s + 37], y[s:s + 37])
    st_ = acc.finalize(gamma=0.25)
    # Assert
    Y = np.eye(4)[y]
    np.testing.assert_allclose(st_.gram, X.T @ X + 0.25 * np.eye(12), rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(st_.cross, X.T @ Y, rtol=1e-12, atol=1e-10)
    assert st_.n == 1000 and st_.class_counts.tolist() == np.bincount(y, minlength=4).tolist()
    assert st_.gram.dtype == np.float64
    with pytest.raises(RoundAlreadyClosed):
        acc.update(X[:2], y[:2])


@pytest.mark.parametrize(
    "X, y, err",
    [
        (np.array([[np.nan, 1.0]]), [0], InvalidInputError),
        (np.array([[np.inf, 1.0]]), [0], InvalidInputError),
        (np.ones((2, 2)), [0, 3], InvalidInputError),
        (np.ones((2, 2)), [0, -1], InvalidInputError),
        (np.ones((2, 3)), [0, 1], InvalidInputError),
        (np.ones((0, 2)), [], InvalidInputError),
        (np.ones((2, 2)), [0], InvalidInputError),
        (np.ones((2, 2)), [0.5, 1], InvalidInputError),
        (np.array([["a", "b"]]), [0], InvalidInputError),
    ],
)
def test_bad_input_raises_typed_errors(X, y, err):
    acc = StatisticsAccumulator(2, 3)
    with pytest.raises(err):
        acc.update(X, y)


def test_bad_parameters():
    with pytest.raises(InvalidParameterError, match="'gamma' parameter"):
        local_statistics(np.ones((3, 2)), [0, 1, 0], 2, gamma=-1.0)
    with pytest.raises(InvalidInputError):
        StatisticsAccumulator(2, 2).finalize()
    with pytest.raises(InvalidParameterError):
        StatisticsAccumulator(0, 2)


def test_norm_bound_refused_before_accumulation():
    acc = StatisticsAccumulator(2, 2, max_norm=1.0)
    acc.update(np.array([[0.6, 0.8]]), [0])
    with pytest.raises(BoundsExceeded):
        acc.update(np.array([[1.0, 0.1]]), [1])
    assert acc.n == 1


@settings(max_examples=40, deadline=None)
@given(d=st.integers(1, 9), c=st.integers(1, 6), n=st.integers(1, 30), seed=st.integers(0, 2**32 - 1),
       gamma=st.floats(0, 10))
def test_packing_round_trips_exactly(d, c, n, seed, gamma):
    rng = np.random.default_rng(seed)
    stats = local_statistics(rng.standard_normal((n, d)) * 1e3, rng.integers(0, c, n), c, gamma=gamma)
    lay = Layout(d, c)
    v = lay.pack(stats)
    assert v.shape == (lay.length,) and lay.length == d * (d + 1) // 2 + d * c + c + 2 + 4
    back = lay.unpack(lay.from_bytes(lay.to_bytes(v)), gamma=gamma)
    assert np.array_equal(back.gram, stats.gram)
    assert np.array_equal(back.cross, stats.cross)
    assert back.n == stats.n and np.array_equal(back.class_counts, stats.class_counts)
    assert back.contributors == 1.0


def test_layout_mismatch_refused():
    stats = local_statistics(np.ones((2, 3)), [0, 1], 2)
    blob = Layout(3, 2).to_bytes(Layout(3, 2).pack(stats))
    with pytest.raises(LayoutMismatch):
        Layout(3, 3).from_bytes(blob)
    with pytest.raises(LayoutMismatch):
        Layout(4, 2).pack(stats)
    with pytest.raises(LayoutMismatch):
        Layout(3, 2).unpack(np.zeros(5))
    with pytest.raises(MalformedPayload):
        Layout(3, 2).from_bytes(blob[:-1])
    with pytest.raises(MalformedPayload):
        Layout(3, 2).from_bytes(b"XXXXXXXX" + blob[8:])
    with pytest.raises(LayoutMismatch):
        Layout(3, 2, version=2)
