"""Shamir t-of-n secret sharing of short byte strings over GF(2^521 - 1).

.. warning::

    This is a "Hazardous Materials" module. You should **ONLY** use it if
    you're 100% absolutely sure that you know what you're doing because this
    module is full of land mines, dragons, and dinosaurs with laser guns.
    The recipe API is :mod:`secure_afl.secagg`.

Runs on: hospitals (create shares of their own secrets, hold peers' shares)
and the server (combines at least ``threshold`` shares it was sent).

A secret of 1..64 bytes is read as a big-endian integer ``s < 2^512 < p`` with
``p = 2^521 - 1`` (a Mersenne prime). With coefficients ``a_1..a_{t-1}``
uniform in ``[0, p)`` (drawn with :func:`secrets.randbelow`)::

    P(x) = s + a_1 x + ... + a_{t-1} x^{t-1}  (mod p),   share_i = (x_i, P(x_i))

for distinct non-zero indices ``x_i`` (default ``1..n``). Any ``t`` shares
give ``s = sum_i y_i prod_{j != i} x_j / (x_j - x_i)``; any ``t - 1`` shares
are independent of ``s`` (perfect secrecy). Each share records the threshold
and the secret length so that too few shares raise :class:`InsufficientShares`
instead of silently interpolating a wrong secret. When more than ``t``
shares are given, the extra ones must lie on the same polynomial, or
:class:`InvalidContribution` is raised.
"""

from __future__ import annotations

import secrets
import struct
from dataclasses import dataclass
from typing import Iterable, Sequence

from .._validation import check_int, param_error
from ..exceptions import InsufficientShares, InvalidContribution, InvalidInputError, MalformedPayload

__all__ = ["PRIME", "MAX_SECRET_BYTES", "MAX_INDEX", "Share", "create_shares", "create_shares_from_parts", "combine_shares", "deal",
           "random_polynomial", "evaluate"]

PRIME = (1 << 521) - 1
MAX_SECRET_BYTES = 64
MAX_INDEX = 0xFFFF
_VALUE_BYTES = 66
_HEAD = struct.Struct(">HHB")  # index, threshold, secret length
SHARE_BYTES = _HEAD.size + _VALUE_BYTES


@dataclass(frozen=True)
class Share:
    """One point ``(index, P(index))`` plus the sharing's threshold and secret length."""

    index: int
    value: int
    threshold: int
    length: int

    def __post_init__(self):
        for name, val, lo, hi in (
            ("index", self.index, 1, MAX_INDEX),
            ("threshold", self.threshold, 1, MAX_INDEX),
            ("length", self.length, 1, MAX_SECRET_BYTES),
            ("value", self.value, 0, PRIME - 1),
        ):
            if isinstance(val, bool) or not isinstance(val, int) or not lo <= val <= hi:
                raise MalformedPayload(f"share {name} out of range")

    def to_bytes(self) -> bytes:
        return _HEAD.pack(self.index, self.threshold, self.length) + self.value.to_bytes(_VALUE_BYTES, "big")

    @classmethod
    def from_bytes(cls, data: bytes) -> "Share":
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError("share must be bytes")
        data = bytes(data)
        if len(data) != SHARE_BYTES:
            raise MalformedPayload(f"a share is {SHARE_BYTES} bytes, got {len(data)}")
        index, threshold, length = _HEAD.unpack_from(data)
        return cls(index, int.from_bytes(data[_HEAD.size:], "big"), threshold, length)


def _check_sharing(secret, threshold, n, indices, caller: str) -> tuple[bytes, list[int]]:
    if not isinstance(secret, (bytes, bytearray, memoryview)):
        raise TypeError("secret must be bytes")
    secret = bytes(secret)
    if not 1 <= len(secret) <= MAX_SECRET_BYTES:
        raise param_error("secret", caller, f"1 to {MAX_SECRET_BYTES} bytes", f"{len(secret)} bytes")
    n = check_int("n", n, caller, low=2, high=MAX_INDEX)
    threshold = check_int("threshold", threshold, caller, low=2)
    if threshold > n:
        raise param_error("threshold", caller, f"at most n={n} (lower `threshold` or add share holders)", threshold)
    idx = list(range(1, n + 1)) if indices is None else [int(i) for i in indices]
    if len(idx) != n or len(set(idx)) != n or any(not 1 <= i <= MAX_INDEX for i in idx):
        raise param_error("indices", caller, f"{n} distinct ints in [1, {MAX_INDEX}]", indices)
    return secret, idx


def _eval(coefficients: Sequence[int], x: int) -> int:
    acc = 0
    for a in reversed(coefficients):  # Horner
        acc = (acc * x + a) % PRIME
    return acc


def create_shares_from_parts(
    secret: bytes, threshold: int, n: int, coefficients: Sequence[int], *, indices: Iterable[int] | None = None
) -> list[Share]:
    """Deterministic seam for known-answer vectors: ``coefficients = [a_1..a_{t-1}]``."""
    secret, idx = _check_sharing(secret, threshold, n, indices, "create_shares")
    if len(coefficients) != threshold - 1 or any(not 0 <= int(a) < PRIME for a in coefficients):
        raise param_error("coefficients", "create_shares", f"{threshold - 1} ints in [0, p)", coefficients)
    poly = [int.from_bytes(secret, "big")] + [int(a) for a in coefficients]
    return [Share(i, _eval(poly, i), threshold, len(secret)) for i in idx]


def deal(secret: bytes, threshold: int, n: int, *, indices: Iterable[int] | None = None) -> tuple[list[Share], list[int]]:
    """:func:`create_shares`, also returning the polynomial ``[s, a_1, .., a_{t-1}]`` (for a verifiable dealing)."""
    _check_sharing(secret, threshold, n, indices, "create_shares")
    coefficients = [secrets.randbelow(PRIME) for _ in range(threshold - 1)]
    shares = create_shares_from_parts(secret, threshold, n, coefficients, indices=indices)
    return shares, [int.from_bytes(bytes(secret), "big")] + coefficients


def random_polynomial(threshold: int) -> list[int]:
    """``threshold`` coefficients uniform in [0, p): a blinding polynomial whose value at 0 is uniform too."""
    threshold = check_int("threshold", threshold, "random_polynomial", low=1, high=MAX_INDEX)
    return [secrets.randbelow(PRIME) for _ in range(threshold)]


def evaluate(coefficients: Sequence[int], x: int) -> int:
    """``P(x) = sum_k c_k x^k mod p``."""
    return _eval(coefficients, x)


def create_shares(secret: bytes, threshold: int, n: int, *, indices: Iterable[int] | None = None) -> list[Share]:
    """Split ``secret`` into ``n`` shares, any ``threshold`` of which recover it.

    Parameters
    ----------
    secret : bytes
        1 to 64 bytes (X25519 private keys and mask seeds are 32).
    threshold : int
        ``2 <= threshold <= n``.
    n : int
        Number of shares.
    indices : iterable of int, optional
        Distinct x-coordinates in ``[1, 65535]`` (default ``1..n``); secagg uses
        the holders' client ids.

    Notes
    -----
    Higher ``threshold`` means more holders must collude to learn the secret
    (better privacy) but fewer may go missing before it is lost (less dropout
    tolerance).
    """
    _check_sharing(secret, threshold, n, indices, "create_shares")
    coefficients = [secrets.randbelow(PRIME) for _ in range(threshold - 1)]
    return create_shares_from_parts(secret, threshold, n, coefficients, indices=indices)


class _Interpolator:
    """Barycentric Lagrange form through fixed points: ``P(x) = sum_i y_i w_i prod_{j != i} (x - x_j)``
    with ``w_i = 1 / prod_{j != i} (x_i - x_j)`` (t inversions once, then 3t products per evaluation)."""

    def __init__(self, points: Sequence[tuple[int, int]]):
        self.xs = [x for x, _ in points]
        self.wy = []
        for i, (xi, yi) in enumerate(points):
            den = 1
            for j, xj in enumerate(self.xs):
                if i != j:
                    den = den * (xi - xj) % PRIME
            self.wy.append(yi * pow(den, -1, PRIME) % PRIME)

    def __call__(self, x: int) -> int:
        diffs = [(x - xj) % PRIME for xj in self.xs]
        n = len(diffs)
        suffix = [1] * (n + 1)
        for k in range(n - 1, -1, -1):
            suffix[k] = suffix[k + 1] * diffs[k] % PRIME
        total, prefix = 0, 1
        for k in range(n):
            total = (total + self.wy[k] * prefix % PRIME * suffix[k + 1]) % PRIME
            prefix = prefix * diffs[k] % PRIME
        return total


def _lagrange_at(points: Sequence[tuple[int, int]], x: int) -> int:
    """``P(x)`` from the points, ``sum_i y_i prod_{j!=i} (x - x_j)/(x_i - x_j)`` mod p."""
    return _Interpolator(points)(x)


def combine_shares(shares: Iterable[Share]) -> bytes:
    """Recover the secret from at least ``threshold`` shares of one sharing.

    Raises
    ------
    InsufficientShares
        Fewer shares than the threshold they carry (nothing is computed).
    InvalidInputError
        Empty input, duplicate indices, or shares of different sharings
        (mismatched threshold / secret length).
    InvalidContribution
        Extra shares beyond the threshold do not lie on the interpolated
        polynomial, or the secret does not fit its declared length.
    """
    shares = list(shares)
    if not shares:
        raise InsufficientShares("no shares given")
    if not all(isinstance(s, Share) for s in shares):
        raise TypeError("shares must be Share objects")
    t, length = shares[0].threshold, shares[0].length
    if any(s.threshold != t or s.length != length for s in shares):
        raise InvalidInputError("shares come from different sharings (threshold or length differ)")
    if len({s.index for s in shares}) != len(shares):
        raise InvalidInputError("duplicate share indices")
    if len(shares) < t:
        raise InsufficientShares(f"{len(shares)} shares given, threshold is {t}")
    shares.sort(key=lambda s: s.index)
    poly = _Interpolator([(s.index, s.value) for s in shares[:t]])
    for extra in shares[t:]:
        if poly(extra.index) != extra.value:
            raise InvalidContribution() from None
    secret = poly(0)
    if secret >> (8 * length):
        raise InvalidContribution() from None
    return secret.to_bytes(length, "big")
