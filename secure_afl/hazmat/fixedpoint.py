"""Two-lane fixed-point encoding of float64 statistics, summed in Z_(2^64) per lane.

.. warning::

    This is a "Hazardous Materials" module. You should **ONLY** use it if
    you're 100% absolutely sure that you know what you're doing because this
    module is full of land mines, dragons, and dinosaurs with laser guns.
    The recipe APIs are :mod:`secure_afl.backends.secagg` and
    :mod:`secure_afl.backends.bfv`.

Runs on: hospitals (encode) and the party that reveals the sum (decode).

Why two lanes
-------------
One 64-bit word leaves ``f ~ 63 - log2(K_max H)`` fractional bits (about 30
for d = 512 statistics), so each entry is rounded at 2^-f before summation and
a solve with cond(C) ~ 1e9 multiplies that rounding into W. Two lanes give
every entry about twice the bits without any carry between words, so each lane
is still an independent sum of integers that can be masked (secagg) or
encrypted (bfv) on its own.

Encoding with ``frac_bits = (f1, f2)``::

    x     = v * 2^f1                      (exact: scaling by a power of two)
    hi    = round(x)                      (round half to even)
    r     = x - hi                        (exact, |r| <= 1/2)
    lo    = round(r * 2^f2)
    words = [hi mod 2^64 for each entry] ++ [lo mod 2^64 for each entry]

so a vector of length L becomes 2L uint64 words and
``v = (hi * 2^f2 + lo) / 2^(f1+f2) + e`` with ``|e| <= 2^-(f1+f2+1)``.

No-wrap proof
-------------
Let H be the declared per-hospital bound
(:meth:`~secure_afl.params.Bounds.hospital_bound`), K <= K_max the number of
summands and ``LANE_BOUND = 2^58``. For |v| <= H:

* ``|hi| <= H 2^f1 + 1/2``;
* ``|r| <= 1/2`` so ``|r 2^f2| <= 2^(f2-1)``, an integer when f2 >= 1, hence
  ``|lo| <= 2^(f2-1)`` (rounding cannot leave an interval whose ends are
  integers).

:func:`choose_frac_bits` picks the largest f1 with
``K_max (H 2^f1 + 1/2) < LANE_BOUND`` and the largest f2 with
``K_max 2^(f2-1) < LANE_BOUND`` (both tested in exact rational arithmetic), so
each lane's *integer* sum over any K <= K_max hospitals lies in
(-2^58, 2^58). Therefore:

* in Z_(2^64) the lane sum read as a signed 64-bit integer *is* the integer
  sum (2^58 < 2^63), whatever masks were added and removed;
* modulo a plaintext prime t > 2^59 (the bfv backend) the centred residue is
  the integer sum too (2^58 < t/2).

Both backends therefore recover the same two integers ``S_hi, S_lo`` per entry.

Decoding and exactness
----------------------
:func:`decode` forms the integer ``S = S_hi 2^f2 + S_lo`` exactly (Python
integers) and returns ``S / 2^(f1+f2)`` rounded ONCE to float64 (correctly
rounded int -> float conversion; the power-of-two scaling is exact). With
``e_k`` the per-hospital encoding errors::

    |decode - sum_k v_k| <= K 2^-(f1+f2+1)  +  half an ulp of the result

The first term is far below float64 resolution of the declared bound
(f1 + f2 ~ 116 - 2 log2 K_max - log2 H), so the decoded sum is the exact sum
of the hospitals' float64 values rounded once, up to that term: at least as
accurate as float64 summation in any order, and independent of the order and
of the backend (secagg and bfv decode bit for bit the same float64).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from .._validation import check_int, check_real, param_error
from ..exceptions import BoundsExceeded, InvalidInputError, InvalidParameterError

__all__ = [
    "LANES",
    "LANE_BOUND_BITS",
    "MIN_FRAC_BITS",
    "choose_frac_bits",
    "check_frac_bits",
    "n_words",
    "encode",
    "lane_sums",
    "decode",
    "decode_lanes",
    "fixed_point_sum",
    "abs_error_bound",
]

#: Words per entry.
LANES = 2
#: Every lane's integer sum stays inside (-2^LANE_BOUND_BITS, 2^LANE_BOUND_BITS):
#: below 2^63 (signed Z_(2^64)) and below t/2 for a plaintext prime t > 2^59.
LANE_BOUND_BITS = 58
#: Refuse sessions whose bounds leave fewer total fractional bits than this.
MIN_FRAC_BITS = 53

_LANE_BOUND = 1 << LANE_BOUND_BITS


def _hi_fits(bound: Fraction, k_max: int, f1: int) -> bool:
    """Exact test of ``k_max * (bound * 2^f1 + 1/2) < 2^58``."""
    return k_max * (bound * (Fraction(2) ** f1) + Fraction(1, 2)) < _LANE_BOUND


def _lo_fits(k_max: int, f2: int) -> bool:
    """Exact test of ``k_max * 2^(f2 - 1) < 2^58`` (f2 >= 1)."""
    return f2 >= 1 and k_max * (Fraction(2) ** (f2 - 1)) < _LANE_BOUND


def _max_f1(h: Fraction, k_max: int) -> int:
    f = LANE_BOUND_BITS
    while f > -1100 and not _hi_fits(h, k_max, f):
        f -= 1
    return f


def _max_f2(k_max: int) -> int:
    f = LANE_BOUND_BITS
    while f >= 1 and not _lo_fits(k_max, f):
        f -= 1
    return f


def choose_frac_bits(bounds, gamma: float, *, min_frac_bits: int = MIN_FRAC_BITS) -> tuple[int, int]:
    """Choose ``(f1, f2)`` for a session (module docstring, no-wrap proof).

    Parameters
    ----------
    bounds : Bounds
        ``H = bounds.hospital_bound(gamma)``, ``K = bounds.k_max``.
    gamma : float
        RI intermediary added to the Gram diagonal.
    min_frac_bits : int, default=53
        Refuse the session if ``f1 + f2`` is smaller.

    Raises
    ------
    InvalidParameterError
        If the bounds leave too few fractional bits; the message names the fix.
    """
    # duck-typed so the primitive needs nothing above it: secure_afl.params.Bounds has both
    if not callable(getattr(bounds, "hospital_bound", None)) or not hasattr(bounds, "k_max"):
        raise param_error("bounds", "choose_frac_bits", "a Bounds", bounds)
    check_real("gamma", gamma, "choose_frac_bits", low=0.0)
    check_int("min_frac_bits", min_frac_bits, "choose_frac_bits", low=0)
    h = bounds.hospital_bound(gamma)
    k = bounds.k_max
    if not _lo_fits(k, 1):
        raise InvalidParameterError(f"k_max={k} is too large for 58-bit lanes; lower `k_max`")
    f1, f2 = _max_f1(Fraction(h), k), _max_f2(k)
    if f1 + f2 < min_frac_bits:
        raise InvalidParameterError(
            f"the declared bounds (per-hospital bound {h:.6g}, k_max={k}) leave only {f1 + f2} fractional "
            f"bits in two 58-bit lanes, below the minimum {min_frac_bits}; lower `max_norm` (normalise "
            "embeddings), `n_max` or `k_max`"
        )
    return int(f1), int(f2)


def check_frac_bits(frac_bits, bounds, gamma: float) -> tuple[int, int]:
    """Validate an explicit ``(f1, f2)`` against the no-wrap condition."""
    try:
        f1, f2 = (int(x) for x in frac_bits)
        if any(isinstance(x, bool) for x in frac_bits):
            raise TypeError
    except (TypeError, ValueError):
        raise param_error("frac_bits", "check_frac_bits", "a pair of ints (f1, f2)", frac_bits) from None
    h = bounds.hospital_bound(gamma)
    if not (_hi_fits(Fraction(h), bounds.k_max, f1) and _lo_fits(bounds.k_max, f2)):
        raise InvalidParameterError(
            f"frac_bits={[f1, f2]} lets a lane sum of k_max={bounds.k_max} hospitals with |entry| <= {h:.6g} "
            f"leave (-2^58, 2^58); use frac_bits <= {list(choose_frac_bits(bounds, gamma, min_frac_bits=0))} "
            "or lower the declared bounds"
        )
    return f1, f2


def n_words(length: int) -> int:
    """uint64 words that carry a vector of ``length`` entries."""
    return LANES * int(length)


def _pair(frac_bits) -> tuple[int, int]:
    try:
        f1, f2 = frac_bits
    except (TypeError, ValueError):
        raise param_error("frac_bits", "fixedpoint", "a pair of ints (f1, f2)", frac_bits) from None
    check_int("f1", f1, "fixedpoint", low=-1100, high=LANE_BOUND_BITS)
    check_int("f2", f2, "fixedpoint", low=1, high=LANE_BOUND_BITS)
    return int(f1), int(f2)


def encode(values, frac_bits, *, bound: float | None = None) -> np.ndarray:
    """The 2L words ``[hi mod 2^64] ++ [lo mod 2^64]`` of a float64 vector (module docstring).

    Raises :class:`BoundsExceeded` if ``|v| > bound`` (when given) or if a
    lane does not fit a 58-bit signed integer.
    """
    f1, f2 = _pair(frac_bits)
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    # min and max need no temporary (a NaN propagates into both, an inf shows in one): at L ~ 2e5 the
    # hospital's encoding was dominated by fresh full-length arrays, so every step below reuses ``x``
    peak = max(-float(np.min(v)), float(np.max(v))) if v.size else 0.0
    if not np.isfinite(peak):
        raise InvalidInputError("cannot encode NaN or inf")
    if bound is not None and peak > bound:
        raise BoundsExceeded(f"|entry| exceeds the declared bound {bound:.6g}")
    if float(np.ldexp(peak, f1)) >= 2.0 ** LANE_BOUND_BITS:  # scaling by 2^f1 is monotone: the peak of x
        raise BoundsExceeded("an entry times 2^f1 does not fit a 58-bit lane")
    out = np.empty(2 * v.size, dtype=np.int64)
    hi, lo = out[:v.size], out[v.size:]
    x = lo.view(np.float64)  # the lo half holds x until lo itself is written over it, element for element
    np.ldexp(v, f1, out=x)
    np.rint(x, out=hi, casting="unsafe")  # integral floats below 2^58: the cast is exact
    np.subtract(x, hi, out=x)  # exact (hi converts back to the float it came from)
    np.ldexp(x, f2, out=x)
    np.rint(x, out=lo, casting="unsafe")
    return out.view(np.uint64)


def lane_sums(words) -> tuple[np.ndarray, np.ndarray]:
    """Signed (int64) readings ``S_hi, S_lo`` of 2L summed words (two's complement, exact)."""
    w = np.asarray(words)
    if w.dtype != np.uint64 or w.ndim != 1 or w.shape[0] % LANES:
        raise InvalidInputError(f"expected an even number of uint64 words, got {w.dtype} {w.shape}")
    s = w.view(np.int64)
    half = w.shape[0] // LANES
    return s[:half], s[half:]


def decode_lanes(s_hi, s_lo, frac_bits) -> np.ndarray:
    """``(S_hi 2^f2 + S_lo) / 2^(f1+f2)``, formed exactly and rounded once to float64."""
    f1, f2 = _pair(frac_bits)
    hi = np.asarray(s_hi).astype(object)
    lo = np.asarray(s_lo).astype(object)
    if hi.shape != lo.shape:
        raise InvalidInputError("lane sums differ in length")
    exact = hi * (1 << f2) + lo  # Python ints: no rounding
    # float(int) is correctly rounded; scaling by 2^-(f1+f2) is exact (no underflow at these sizes).
    return np.ldexp(exact.astype(np.float64), -(f1 + f2)) if exact.size else np.zeros(0)


def decode(words, frac_bits) -> np.ndarray:
    """Float64 vector (length L) of 2L summed words."""
    return decode_lanes(*lane_sums(words), frac_bits)


def fixed_point_sum(vectors, frac_bits) -> np.ndarray:
    """Plaintext reference: ``sum_k encode(v_k) mod 2^64`` (2L uint64 words)."""
    total = None
    for v in vectors:
        e = encode(v, frac_bits)
        if total is None:
            total = e.copy()
        else:
            np.add(total, e, out=total)
    if total is None:
        raise InvalidInputError("no vectors to sum")
    return total


def abs_error_bound(frac_bits, n_clients: int, magnitude: float) -> float:
    """Per-entry bound on ``|decode - sum of the float64 values|`` for ``n_clients`` summands.

    ``magnitude`` bounds the |sum| (the declared aggregate bound is always
    valid); the second term is the single final rounding to float64.
    """
    f1, f2 = _pair(frac_bits)
    return float(n_clients) * 2.0 ** -(f1 + f2 + 1) + float(magnitude) * 2.0 ** -53
