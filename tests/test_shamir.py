"""Shamir t-of-n sharing over GF(2^521 - 1): vectors, subsets, properties, refusals."""

from __future__ import annotations

import secrets
from fractions import Fraction
from itertools import combinations

import pytest
from support import json_parametrize
from hypothesis import given, settings
from hypothesis import strategies as st

from secure_afl.exceptions import InsufficientShares, InvalidContribution, InvalidInputError, InvalidParameterError, MalformedPayload
from secure_afl.hazmat.shamir import PRIME, Share, create_shares_from_parts, combine_shares, create_shares


def fraction_lagrange_at_zero(points, p=PRIME):
    """Independent reference: exact rational Lagrange interpolation at 0, reduced mod p at the end."""
    total = Fraction(0)
    for i, (xi, yi) in enumerate(points):
        term = Fraction(yi)
        for j, (xj, _) in enumerate(points):
            if i != j:
                term *= Fraction(-xj, xi - xj)
        total += term
    return total.numerator * pow(total.denominator, -1, p) % p


@json_parametrize(("secret", "threshold", "n", "indices", "coefficients", "shares"), "shamir.json")
def test_known_answer_vectors(secret, threshold, n, indices, coefficients, shares):
    # Prepare
    secret = bytes.fromhex(secret)
    coeffs = [int(c, 16) for c in coefficients]
    expected = [(s["index"], int(s["value"], 16)) for s in shares]

    # Execute
    got = create_shares_from_parts(secret, threshold, n, coeffs, indices=indices)

    # Assert
    assert [(s.index, s.value) for s in got] == expected
    for subset in combinations(got, threshold):
        assert combine_shares(subset) == secret
        assert fraction_lagrange_at_zero([(s.index, s.value) for s in subset]) == int.from_bytes(secret, "big")


@json_parametrize(("name", "hex"), "shamir_invalid.json")
def test_invalid_serialised_shares_refused(name, hex):
    # Prepare
    data = bytes.fromhex(hex)

    # Execute / Assert
    with pytest.raises(MalformedPayload):
        Share.from_bytes(data)


@pytest.mark.security
def test_every_threshold_subset_recovers_and_fewer_refuse():
    # Prepare
    secret = secrets.token_bytes(32)
    shares = create_shares(secret, 3, 6)

    # Execute / Assert
    for subset in combinations(shares, 3):
        assert combine_shares(subset) == secret
    for subset in combinations(shares, 2):
        with pytest.raises(InsufficientShares):
            combine_shares(subset)


@settings(max_examples=40, deadline=None)
@given(
    secret=st.binary(min_size=1, max_size=64),
    n=st.integers(min_value=2, max_value=9),
    data=st.data(),
)
def test_property_round_trip_any_order(secret, n, data):
    # Prepare
    t = data.draw(st.integers(min_value=2, max_value=n))
    shares = create_shares(secret, t, n)
    order = data.draw(st.permutations(shares))
    chosen = order[: data.draw(st.integers(min_value=t, max_value=n))]

    # Execute
    out = combine_shares(chosen)

    # Assert
    assert out == secret
    assert all(Share.from_bytes(s.to_bytes()) == s for s in shares)


@settings(max_examples=25, deadline=None)
@given(secret=st.binary(min_size=32, max_size=32), data=st.data())
def test_property_matches_fraction_reference(secret, data):
    # Prepare
    n = data.draw(st.integers(min_value=2, max_value=7))
    t = data.draw(st.integers(min_value=2, max_value=n))
    coeffs = [data.draw(st.integers(min_value=0, max_value=PRIME - 1)) for _ in range(t - 1)]
    shares = create_shares_from_parts(secret, t, n, coeffs)

    # Execute
    ref = fraction_lagrange_at_zero([(s.index, s.value) for s in shares[:t]])

    # Assert
    assert ref == int.from_bytes(secret, "big")


@pytest.mark.security
def test_fewer_than_threshold_shares_are_independent_of_the_secret():
    # Prepare: with t-1 shares fixed, every secret has exactly one consistent polynomial.
    t, n = 3, 5
    coeffs = [12345, 67890]
    shares = create_shares_from_parts(b"\x01" * 32, t, n, coeffs)[: t - 1]
    other = b"\x02" * 32

    # Execute: solve for coefficients that give the same t-1 shares for another secret
    # (a_1, a_2 from the two linear equations y_i - s' = a_1 x_i + a_2 x_i^2).
    (x1, y1), (x2, y2) = [(s.index, s.value) for s in shares]
    s2 = int.from_bytes(other, "big")
    r1, r2 = (y1 - s2) % PRIME, (y2 - s2) % PRIME
    det = (x1 * x2 * x2 - x2 * x1 * x1) % PRIME
    a1 = (r1 * x2 * x2 - r2 * x1 * x1) * pow(det, -1, PRIME) % PRIME
    a2 = (x1 * r2 - x2 * r1) * pow(det, -1, PRIME) % PRIME
    alt = create_shares_from_parts(other, t, n, [a1, a2])[: t - 1]

    # Assert
    assert [(s.index, s.value) for s in alt] == [(s.index, s.value) for s in shares]


def test_duplicates_and_mixed_sharings_refused():
    # Prepare
    a = create_shares(b"a" * 32, 2, 3)
    b = create_shares(b"b" * 32, 3, 4)
    c = create_shares(b"c" * 16, 2, 3)

    # Execute / Assert
    with pytest.raises(InvalidInputError):
        combine_shares([a[0], a[0]])
    with pytest.raises(InvalidInputError):
        combine_shares([a[0], Share(1, (a[0].value + 1) % PRIME, 2, 32)])
    with pytest.raises(InvalidInputError):
        combine_shares([a[0], b[1], b[2]])
    with pytest.raises(InvalidInputError):
        combine_shares([a[0], c[1]])
    with pytest.raises(InsufficientShares):
        combine_shares([])


@pytest.mark.security
def test_inconsistent_extra_share_detected():
    # Prepare
    shares = create_shares(b"k" * 32, 2, 4)
    bad = Share(shares[3].index, (shares[3].value + 1) % PRIME, 2, 32)

    # Execute / Assert
    with pytest.raises(InvalidContribution):
        combine_shares(shares[:3] + [bad])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"secret": b"", "threshold": 2, "n": 3},
        {"secret": b"x" * 65, "threshold": 2, "n": 3},
        {"secret": b"x", "threshold": 1, "n": 3},
        {"secret": b"x", "threshold": 4, "n": 3},
        {"secret": b"x", "threshold": 2, "n": 1},
        {"secret": b"x", "threshold": 2, "n": 3, "indices": [1, 1, 2]},
        {"secret": b"x", "threshold": 2, "n": 3, "indices": [0, 1, 2]},
        {"secret": b"x", "threshold": 2, "n": 3, "indices": [1, 2]},
    ],
)
def test_invalid_parameters_refused(kwargs):
    # Execute / Assert
    with pytest.raises(InvalidParameterError):
        create_shares(**kwargs)


def test_secret_must_be_bytes():
    with pytest.raises(TypeError):
        create_shares("secret", 2, 3)
