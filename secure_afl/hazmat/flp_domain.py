"""The N-point domain both fully linear proofs interpolate on, over any field object.

.. warning::

    Hazardous material, like :mod:`secure_afl.hazmat.flp`. The recipe API is :mod:`secure_afl.split`.

The domain is ``a^0, ..., a^(N-1)`` for a primitive N-th root of unity ``a``. A wire polynomial of
:class:`~secure_afl.hazmat.flp.BitProof` or :class:`~secure_afl.hazmat.flp_square.SquareSumProof` takes its
seed at ``a^0`` and call k's wire at ``a^(k+1)``. A verifier evaluates it at a query point ``t`` off the
domain through the Lagrange basis ``L_m(t) = (t^N - 1) a^m / (N (t - a^m))``, and sums the proof
polynomial ``P`` over call points ``x_k`` from its coefficients: ``sum_k P(x_k) = sum_e coef_e w_e`` with
``w_e = sum_k x_k^e``.
"""

from __future__ import annotations

import numpy as np

from ..exceptions import InvalidInputError

__all__ = ["batch_inv", "query_point", "lagrange_basis", "power_sums"]


def batch_inv(xs: list[int], p: int) -> list[int]:
    """Inverses mod the prime ``p`` of nonzero elements with one exponentiation (prefix products, then
    unwound)."""
    prefix, acc = [], 1
    for x in xs:
        prefix.append(acc)
        acc = acc * x % p
    if acc == 0:
        raise InvalidInputError("zero has no inverse")
    acc = pow(acc, p - 2, p)
    out = [0] * len(xs)
    for i in range(len(xs) - 1, -1, -1):
        out[i] = acc * prefix[i] % p
        acc = acc * xs[i] % p
    return out


def query_point(F, n: int, t) -> int:
    """``t`` reduced mod p; :class:`InvalidInputError` for a point of the N-point domain, where a verifier's
    answer would be a wire value."""
    t = int(t) % F.P
    if pow(t, n, F.P) == 1:
        raise InvalidInputError("a query point on the interpolation domain would reveal wire values")
    return t


def lagrange_basis(F, n: int, alpha: int, t: int) -> np.ndarray:
    """``L_m(t)`` for ``m < N`` on the domain of the N-th root ``alpha``: ``(t^N - 1) a^m / (N (t - a^m))``."""
    p = F.P
    pts = [pow(alpha, m, p) for m in range(n)]
    z = (pow(t, n, p) - 1) * F.inv(n) % p
    dens = batch_inv([(t - x) % p for x in pts], p)
    return F.to_field([z * pts[m] % p * dens[m] % p for m in range(n)])


def power_sums(F, pts: np.ndarray, length: int) -> np.ndarray:
    """``w_e = sum_k pts[k]^e`` for ``e < length``: ``<w, coefficients>`` is a polynomial's sum over ``pts``."""
    w = F.zeros(length)
    cur = F.ones(len(pts))
    for e in range(length):
        w[e] = F.to_field([F.sum_mod(cur)])[0]
        cur = F.mul(cur, pts)
    return w
