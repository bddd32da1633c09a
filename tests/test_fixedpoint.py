"""Fixed-point encoding in Z_(2^64): no-wrap choice of f, exact decoding of sums."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secure_afl.exceptions import BoundsExceeded, InvalidParameterError
from secure_afl.hazmat.fixedpoint import (
    MIN_FRAC_BITS,
    check_frac_bits,
    choose_frac_bits,
    decode,
    decode_signed,
    encode,
    fixed_point_sum,
    max_safe_frac_bits,
)
from secure_afl.params import Bounds


@pytest.mark.parametrize(
    "bounds, gamma",
    [(Bounds(1.0, 100, 20), 1.0), (Bounds(1.0, 100_000, 1000), 1.0), (Bounds(30.0, 10_000, 200), 0.5),
     (Bounds(1.0, 1, 1), 0.0)],
)
def test_chosen_frac_bits_is_the_largest_that_cannot_wrap(bounds, gamma):
    # Prepare
    h = Fraction(bounds.hospital_bound(gamma))
    k = bounds.k_max

    # Execute
    f = choose_frac_bits(bounds, gamma)
    safe = max_safe_frac_bits(bounds.hospital_bound(gamma), k)

    # Assert: K (H 2^f + 1/2) < 2^63 holds at f and fails at the next f (unless capped at 52).
    assert k * (h * 2**f + Fraction(1, 2)) < 2**63
    assert k * (h * 2**(safe + 1) + Fraction(1, 2)) >= 2**63
    assert f == min(52, safe)


def test_bounds_too_loose_refused_with_the_fix_named():
    # Prepare
    loose = Bounds(1000.0, 10**9, 10**4)

    # Execute / Assert
    with pytest.raises(InvalidParameterError, match="lower `max_norm`"):
        choose_frac_bits(loose, 1.0)


def test_explicit_frac_bits_checked():
    # Prepare
    b = Bounds(1.0, 100_000, 1000)
    f = choose_frac_bits(b, 1.0)

    # Execute / Assert
    assert check_frac_bits(f, b, 1.0) == f
    assert check_frac_bits(MIN_FRAC_BITS, b, 1.0) == MIN_FRAC_BITS
    with pytest.raises(InvalidParameterError, match="wrap"):
        check_frac_bits(f + 1, b, 1.0)


@pytest.mark.security
def test_worst_case_sum_at_the_edge_decodes_exactly():
    # Prepare: K_max hospitals all at +H (and all at -H), f chosen for these bounds.
    b = Bounds(1.0, 100_000, 1000)
    gamma = 1.0
    f = choose_frac_bits(b, gamma)
    h = b.hospital_bound(gamma)
    top = np.array([h, -h, h / 3, -h / 7, 0.0])

    # Execute
    total = fixed_point_sum([top] * b.k_max, f)

    # Assert: the ring sum read signed is the integer sum, no wrap.
    exact = [b.k_max * int(np.rint(np.ldexp(x, f))) for x in top]
    assert decode_signed(total).tolist() == exact
    assert np.allclose(decode(total, f), top * b.k_max, rtol=1e-12, atol=b.k_max * 2.0**-f)


@pytest.mark.security
def test_two_more_fractional_bits_overflow_int64_at_the_edge():
    # Prepare: the bound is tight: with f + 2 the K_max-sum at +H leaves int64.
    b = Bounds(1.0, 100_000, 1000)
    f = max_safe_frac_bits(b.hospital_bound(1.0), b.k_max)
    h = b.hospital_bound(1.0)

    # Execute
    total_int = b.k_max * int(np.rint(np.ldexp(h, f + 2)))

    # Assert
    assert total_int >= 2**63


@settings(max_examples=50, deadline=None)
@given(
    rows=st.lists(
        st.lists(st.floats(min_value=-1e5, max_value=1e5, allow_nan=False), min_size=6, max_size=6),
        min_size=1, max_size=20,
    )
)
def test_property_ring_sum_equals_integer_sum(rows):
    # Prepare
    b = Bounds(1.0, 100_000, 20)
    f = choose_frac_bits(b, 0.0)
    data = np.array(rows)

    # Execute
    total = fixed_point_sum(data, f)

    # Assert
    ints = [[int(np.rint(np.ldexp(x, f))) for x in r] for r in rows]
    assert decode_signed(total).tolist() == [sum(col) for col in zip(*ints)]
    assert np.allclose(decode(total, f), data.sum(axis=0), rtol=0, atol=len(rows) * 2.0 ** -f + 1e-9 * np.abs(data).sum(axis=0).max())


def test_encode_refuses_out_of_bound_and_non_finite():
    # Execute / Assert
    with pytest.raises(BoundsExceeded):
        encode(np.array([2.0]), 10, bound=1.0)
    with pytest.raises(BoundsExceeded):
        encode(np.array([2.0**60]), 10)
    with pytest.raises(ValueError):
        encode(np.array([np.nan]), 10)


def test_negative_values_are_twos_complement():
    # Execute
    w = encode(np.array([-1.0, 1.0, -0.5]), 4)

    # Assert
    assert w.dtype == np.uint64
    assert w.tolist() == [2**64 - 16, 16, 2**64 - 8]
    assert decode(w, 4).tolist() == [-1.0, 1.0, -0.5]
