"""Two-lane fixed point: no-wrap choice of (f1, f2), exact decoding of lane sums."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secure_afl.exceptions import BoundsExceeded, InvalidParameterError
from secure_afl.hazmat.fixedpoint import (
    LANE_BOUND_BITS,
    check_frac_bits,
    choose_frac_bits,
    decode,
    encode,
    fixed_point_sum,
    lane_sums,
    n_words,
)
from secure_afl.params import Bounds


@pytest.mark.parametrize(
    "bounds, gamma",
    [(Bounds(1.0, 100, 20), 1.0), (Bounds(1.0, 100_000, 1000), 1.0), (Bounds(30.0, 10_000, 200), 0.5),
     (Bounds(1.0, 1, 1), 0.0)],
)
def test_chosen_frac_bits_are_the_largest_that_cannot_leave_the_lane(bounds, gamma):
    # Prepare
    h = Fraction(bounds.hospital_bound(gamma))
    k = bounds.k_max
    lane = 2**LANE_BOUND_BITS

    # Execute
    f1, f2 = choose_frac_bits(bounds, gamma)

    # Assert: K (H 2^f1 + 1/2) < 2^58 and K 2^(f2-1) < 2^58 hold, and fail one bit further.
    assert k * (h * 2**f1 + Fraction(1, 2)) < lane <= k * (h * 2**(f1 + 1) + Fraction(1, 2))
    assert k * Fraction(2) ** (f2 - 1) < lane <= k * Fraction(2) ** f2


def test_bounds_too_loose_refused_with_the_fix_named():
    # Prepare
    loose = Bounds(1e6, 10**9, 10**4)

    # Execute / Assert
    with pytest.raises(InvalidParameterError, match="lower `max_norm`"):
        choose_frac_bits(loose, 1.0)


def test_explicit_frac_bits_checked():
    # Prepare
    b = Bounds(1.0, 100_000, 1000)
    f1, f2 = choose_frac_bits(b, 1.0)

    # Execute / Assert
    assert check_frac_bits([f1, f2], b, 1.0) == (f1, f2)
    with pytest.raises(InvalidParameterError, match="leave"):
        check_frac_bits([f1 + 1, f2], b, 1.0)
    with pytest.raises(InvalidParameterError, match="leave"):
        check_frac_bits([f1, f2 + 1], b, 1.0)


@pytest.mark.security
def test_worst_case_sum_at_the_edge_decodes_exactly():
    # Prepare: K_max hospitals all at +H (and -H), and residuals of exactly +-1/2 in the high lane.
    b = Bounds(1.0, 100_000, 1000)
    fb = choose_frac_bits(b, 1.0)
    h = b.hospital_bound(1.0)
    top = np.array([h, -h, h / 3, -h / 7, 0.0, math.ldexp(1.5, -fb[0]), -math.ldexp(2.5, -fb[0])])

    # Execute
    total = fixed_point_sum([top] * b.k_max, fb)

    # Assert: each lane's ring sum read signed is the integer sum (no wrap), and decoding is the
    # exact K * value rounded once.
    s_hi, s_lo = lane_sums(total)
    assert np.max(np.abs(s_hi)) < 2**LANE_BOUND_BITS and np.max(np.abs(s_lo)) < 2**LANE_BOUND_BITS
    exact = [float(Fraction(x) * b.k_max) for x in top]
    got = decode(total, fb)
    assert np.max(np.abs(got - exact)) <= b.k_max * 2.0 ** -(sum(fb) + 1) + 2.0**-52 * np.abs(exact).max()


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.lists(st.floats(min_value=-1e5, max_value=1e5, allow_nan=False, allow_subnormal=False),
                 min_size=6, max_size=6),
        min_size=1, max_size=20,
    )
)
def test_property_decoded_sum_is_the_exact_sum_rounded_once(rows):
    # Prepare
    b = Bounds(1.0, 100_000, 20)
    fb = choose_frac_bits(b, 0.0)
    data = np.array(rows)

    # Execute
    got = decode(fixed_point_sum(data, fb), fb)

    # Assert: within K 2^-(f1+f2+1) of the exact rational sum, then one rounding.
    for j, col in enumerate(zip(*rows)):
        exact = sum(Fraction(x) for x in col)
        slack = len(rows) * Fraction(1, 2 ** (sum(fb) + 1))
        assert abs(Fraction(got[j]) - exact) <= slack + abs(exact) * Fraction(1, 2**53)


def test_decoded_sum_matches_fsum_bit_for_bit_across_magnitudes():
    # Prepare: entries from 1e-6 to 1e5, 50 hospitals.
    rng = np.random.default_rng(7)
    b = Bounds(10.0, 1000, 50)
    fb = choose_frac_bits(b, 1.0)
    vs = [rng.standard_normal(2000) * 10.0 ** rng.uniform(-6, 5, 2000) for _ in range(50)]

    # Execute
    got = decode(fixed_point_sum(vs, fb), fb)

    # Assert
    want = np.array([math.fsum(c) for c in zip(*vs)])
    assert np.array_equal(got, want)


def test_encode_refuses_out_of_bound_and_non_finite():
    # Execute / Assert
    with pytest.raises(BoundsExceeded):
        encode(np.array([2.0]), (10, 20), bound=1.0)
    with pytest.raises(BoundsExceeded):
        encode(np.array([2.0**50]), (10, 20))
    with pytest.raises(ValueError):
        encode(np.array([np.nan]), (10, 20))


def test_negative_values_are_twos_complement_in_both_lanes():
    # Execute
    w = encode(np.array([-1.0, 1.0, -0.5, 0.25 + 2.0**-10]), (2, 12))

    # Assert
    assert w.dtype == np.uint64 and w.shape == (n_words(4),)
    assert w[:4].tolist() == [2**64 - 4, 4, 2**64 - 2, 1]
    assert w[4:].tolist() == [0, 0, 0, 2**4]
    assert decode(w, (2, 12)).tolist() == [-1.0, 1.0, -0.5, 0.25 + 2.0**-10]


def test_encode_of_a_long_vector_matches_the_per_entry_definition():
    # Prepare: longer than numpy's casting buffers, so every block of the in-place conversion is exercised;
    # half-way cases in both lanes, negatives, zeros and the lane edge.
    rng = np.random.default_rng(11)
    fb = (24, 30)
    v = rng.uniform(-3.0, 3.0, 50_000) * 10.0 ** rng.uniform(-9, 0, 50_000)
    v[:6] = [0.0, -0.0, 2.5 * 2.0**-24, -3.5 * 2.0**-24, (1 + 2.0**-31) * 2.0**-24, 2.0**33 - 1]

    # Execute
    words = encode(v, fb)

    # Assert: hi = round-half-even(v 2^f1), lo = round-half-even((v 2^f1 - hi) 2^f2), both mod 2^64.
    for i in list(range(6)) + list(rng.integers(0, v.size, 2000)):
        x = Fraction(v[i]) * 2 ** fb[0]
        hi = round(x)
        lo = round((x - hi) * 2 ** fb[1])
        assert int(words[i]) == hi % 2**64 and int(words[v.size + i]) == lo % 2**64
