"""The proofs' interpolation domain (secure_afl.hazmat.flp_domain) against Python-integer polynomials, over both
fields a session may name."""

from __future__ import annotations

import numpy as np
import pytest

from secure_afl.exceptions import InvalidInputError
from secure_afl.hazmat.field128 import FIELD128
from secure_afl.hazmat.flp import GOLDILOCKS
from secure_afl.hazmat.flp_domain import batch_inv, lagrange_basis, power_sums, query_point


def _horner(coeffs: list[int], x: int, p: int) -> int:
    acc = 0
    for c in reversed(coeffs):
        acc = (acc * x + c) % p
    return acc


@pytest.mark.parametrize("F", [GOLDILOCKS, FIELD128], ids=lambda F: F.name)
@pytest.mark.parametrize("n", [2, 8, 32])
def test_the_lagrange_basis_interpolates_and_power_sums_sum_a_polynomial(F, n):
    p, rng = F.P, np.random.default_rng(n)
    alpha = F.root_of_unity(n)
    coeffs = [int.from_bytes(rng.bytes(16), "little") % p for _ in range(n)]  # degree < N
    t = int.from_bytes(rng.bytes(16), "little") % p

    lag = [int(v) for v in F.to_ints(lagrange_basis(F, n, alpha, query_point(F, n, t)))]
    # a polynomial of degree < N is its values on the domain, weighted by the basis at t
    assert sum(lag[m] * _horner(coeffs, pow(alpha, m, p), p) for m in range(n)) % p == _horner(coeffs, t, p)

    pts = [pow(alpha, k + 1, p) for k in range(n - 1)]
    w = [int(v) for v in F.to_ints(power_sums(F, F.to_field(pts), 2 * n - 1))]
    wide = [int.from_bytes(rng.bytes(16), "little") % p for _ in range(2 * n - 1)]
    assert sum(c * e for c, e in zip(wide, w)) % p == sum(_horner(wide, x, p) for x in pts) % p


@pytest.mark.parametrize("F", [GOLDILOCKS, FIELD128], ids=lambda F: F.name)
def test_a_query_point_on_the_domain_is_refused_and_zero_has_no_inverse(F):
    n = 8
    alpha = F.root_of_unity(n)
    for m in range(n):
        with pytest.raises(InvalidInputError, match="interpolation domain"):
            query_point(F, n, pow(alpha, m, F.P) + F.P)  # reduced before the check
    assert query_point(F, n, F.P + 3) == 3
    assert batch_inv([2, 3, F.P - 1], F.P) == [pow(x, F.P - 2, F.P) for x in (2, 3, F.P - 1)]
    with pytest.raises(InvalidInputError, match="zero has no inverse"):
        batch_inv([2, 0, 5], F.P)
