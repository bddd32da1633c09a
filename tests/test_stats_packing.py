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


# ----------------------------------------------------------------------------- numpy and torch batches

def _random_batches(seed: int, d: int, c: int, sizes):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((m, d)) * rng.uniform(0.1, 3.0), rng.integers(0, c, m)) for m in sizes]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 12), c=st.integers(1, 5),
       sizes=st.lists(st.integers(1, 40), min_size=1, max_size=6), gamma=st.floats(0, 4))
def test_numpy_and_torch_batches_accumulate_the_same_statistics(seed, d, c, sizes, gamma):
    torch = pytest.importorskip("torch")
    # Prepare: batches of different sizes, float32 tensors as a backbone hands them over
    batches = _random_batches(seed, d, c, sizes)
    ref, dev = StatisticsAccumulator(d, c), StatisticsAccumulator(d, c)
    # Execute
    for X, y in batches:
        ref.update(X, y)
        dev.update(torch.from_numpy(X), torch.from_numpy(y))
    a, b = ref.finalize(gamma=gamma), dev.finalize(gamma=gamma)
    # Assert: float64 sums on both paths, equal up to summation order; same peak norm
    X = np.concatenate([x for x, _ in batches])
    y = np.concatenate([t for _, t in batches])
    assert b.gram.dtype == b.cross.dtype == np.float64
    np.testing.assert_allclose(b.gram, a.gram, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(a.gram).max()))
    np.testing.assert_allclose(b.cross, a.cross, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(a.cross).max()))
    np.testing.assert_allclose(a.gram, X.T @ X + gamma * np.eye(d), rtol=1e-10, atol=1e-9)
    assert a.n == b.n == len(y) and np.array_equal(a.class_counts, b.class_counts)
    assert np.array_equal(a.class_counts, np.bincount(y, minlength=c))
    assert ref.max_row_norm == pytest.approx(dev.max_row_norm, rel=1e-12)
    assert ref.max_row_norm == pytest.approx(np.linalg.norm(X, axis=1).max(), rel=1e-12)


def test_torch_float32_batches_are_summed_in_float64():
    torch = pytest.importorskip("torch")
    # Prepare: values whose float32 Gram would lose the +1 (2^25 + 1 is not a float32)
    X = torch.tensor([[4096.0], [1.0]], dtype=torch.float32)
    acc = StatisticsAccumulator(1, 1)
    # Execute
    st_ = acc.update(X[:1], torch.tensor([0])).update(X[1:], torch.tensor([0])).finalize()
    # Assert
    assert st_.gram[0, 0] == 4096.0 ** 2 + 1.0


@pytest.mark.parametrize("as_torch", [False, True])
def test_norm_bound_refused_before_accumulation_on_both_paths(as_torch):
    # Prepare
    wrap = (lambda a: a) if not as_torch else pytest.importorskip("torch").as_tensor
    acc = StatisticsAccumulator(2, 2, max_norm=1.0)
    acc.update(wrap(np.array([[0.6, 0.8]])), wrap(np.array([0])))
    # Execute / Assert: the batch with the long row is refused whole, nothing of it is added
    with pytest.raises(BoundsExceeded, match="B=1.0"):
        acc.update(wrap(np.array([[0.1, 0.1], [1.0, 0.1]])), wrap(np.array([1, 1])))
    assert acc.n == 1 and acc.max_row_norm == pytest.approx(1.0)
    st_ = acc.finalize()
    np.testing.assert_allclose(st_.gram, [[0.36, 0.48], [0.48, 0.64]], rtol=1e-12)


@pytest.mark.parametrize(
    "X, y",
    [
        (np.array([[np.nan, 1.0]]), [0]),
        (np.array([[np.inf, 1.0]]), [0]),
        (np.ones((2, 2)), [0, 3]),
        (np.ones((2, 2)), [0, -1]),
        (np.ones((2, 3)), [0, 1]),
        (np.ones((0, 2)), []),
        (np.ones((2, 2)), [0]),
        (np.ones((2, 2)), [0.5, 1]),
        (np.ones((2,)), [0]),
    ],
)
def test_bad_torch_batches_raise_typed_errors(X, y):
    torch = pytest.importorskip("torch")
    acc = StatisticsAccumulator(2, 3)
    with pytest.raises(InvalidInputError):
        acc.update(torch.as_tensor(X), torch.as_tensor(np.asarray(y)))
    assert acc.n == 0


def test_products_that_overflow_float64_are_refused():
    acc = StatisticsAccumulator(1, 1).update(np.array([[1e200]]), [0])
    with pytest.raises(BoundsExceeded, match="overflow"):
        acc.finalize()


@pytest.mark.e2e
def test_library_imports_and_accumulates_without_torch():
    # Execute: a fresh interpreter in which torch cannot be imported
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None\n"
            "import numpy as np\n"
            "from secure_afl.stats import StatisticsAccumulator\n"
            "s = StatisticsAccumulator(2, 2, max_norm=2.0).update(np.eye(2), [0, 1]).finalize()\n"
            "print(s.n)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    # Assert
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2.0"


def test_tensors_that_require_grad_are_accumulated_as_data():
    torch = pytest.importorskip("torch")
    X = torch.ones((3, 2), dtype=torch.float64, requires_grad=True)
    st_ = StatisticsAccumulator(2, 2).update(X * 2, torch.tensor([0, 1, 1])).finalize()
    np.testing.assert_array_equal(st_.gram, np.full((2, 2), 12.0))
