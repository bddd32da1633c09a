"""Fixed-point encoding of float64 statistics into the ring Z_(2^64).

.. warning::

    This is a "Hazardous Materials" module. You should **ONLY** use it if
    you're 100% absolutely sure that you know what you're doing because this
    module is full of land mines, dragons, and dinosaurs with laser guns.
    The recipe API is :mod:`secure_afl.backends.secagg`.

Runs on: hospitals (encode) and the revealing server (decode of the sum).

Encoding with ``f`` fractional bits::

    enc(v) = round(v * 2^f) mod 2^64                (uint64, two's complement)
    dec(s) = signed(s) / 2^f,   signed(s) = s - 2^64 if s >= 2^63 else s

No-wrap condition. For |v| <= H (the declared per-hospital bound,
:meth:`~secure_afl.params.Bounds.hospital_bound`), ``|round(v 2^f)| <= H 2^f + 1/2``,
so the *integer* sum of K <= K_max encodings satisfies::

    |sum_k round(v_k 2^f)| <= K_max (H 2^f + 1/2) < 2^63

and therefore the mod-2^64 sum, read as a signed 64-bit integer, *is* the
integer sum: decoding the ring sum is bit-for-bit the plaintext fixed-point
sum. :func:`choose_frac_bits` returns the largest ``f`` for which the strict
inequality holds (checked in exact rational arithmetic, not in floats).

Precision: each entry is rounded once, so the decoded sum differs from the
float sum by at most ``K / 2^(f+1)`` per entry (plus the float64 rounding of
the final division, relative 2^-53).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from .._validation import check_int, check_real, param_error
from ..exceptions import BoundsExceeded, InvalidInputError, InvalidParameterError
from ..params import Bounds

__all__ = [
    "MIN_FRAC_BITS",
    "MAX_FRAC_BITS",
    "choose_frac_bits",
    "max_safe_frac_bits",
    "check_frac_bits",
    "encode",
    "decode",
    "decode_signed",
    "fixed_point_sum",
]

#: Refuse sessions whose bounds leave fewer fractional bits than this.
MIN_FRAC_BITS = 16
#: Never use more: 2^-52 is below float64 resolution for |v| >= 1 anyway.
MAX_FRAC_BITS = 52

_TWO63 = 1 << 63


def _fits(bound: Fraction, k_max: int, f: int) -> bool:
    """Exact test of ``k_max * (bound * 2^f + 1/2) < 2^63``."""
    return k_max * (bound * (Fraction(2) ** f) + Fraction(1, 2)) < _TWO63


def max_safe_frac_bits(hospital_bound: float, k_max: int) -> int:
    """Largest f (may be negative) with ``k_max (hospital_bound 2^f + 1/2) < 2^63``."""
    check_real("hospital_bound", hospital_bound, "max_safe_frac_bits", low=0.0, low_open=True)
    check_int("k_max", k_max, "max_safe_frac_bits", low=1)
    b = Fraction(hospital_bound)
    if k_max * Fraction(1, 2) >= _TWO63:
        raise InvalidParameterError(f"k_max={k_max} is too large for a 64-bit ring; lower `k_max`")
    f = 62
    while f > -1100 and not _fits(b, k_max, f):
        f -= 1
    return f


def choose_frac_bits(bounds: Bounds, gamma: float, *, min_frac_bits: int = MIN_FRAC_BITS) -> int:
    """Choose the number of fractional bits ``f`` for a session.

    Parameters
    ----------
    bounds : Bounds
        Declared bounds; ``H = bounds.hospital_bound(gamma)``, ``K = bounds.k_max``.
    gamma : float
        RI intermediary added to the Gram diagonal.
    min_frac_bits : int, default=16
        Refuse the session if fewer fractional bits would remain.

    Returns
    -------
    f : int
        ``min(52, max{f : K (H 2^f + 1/2) < 2^63})``.

    Raises
    ------
    InvalidParameterError
        If ``f < min_frac_bits``; the message names the fix.
    """
    if not isinstance(bounds, Bounds):
        raise param_error("bounds", "choose_frac_bits", "a Bounds", bounds)
    check_real("gamma", gamma, "choose_frac_bits", low=0.0)
    check_int("min_frac_bits", min_frac_bits, "choose_frac_bits", low=0, high=MAX_FRAC_BITS)
    h = bounds.hospital_bound(gamma)
    f = min(MAX_FRAC_BITS, max_safe_frac_bits(h, bounds.k_max))
    if f < min_frac_bits:
        raise InvalidParameterError(
            f"the declared bounds (per-hospital bound {h:.6g}, k_max={bounds.k_max}) leave only "
            f"{f} fractional bits in Z_(2^64), below the minimum {min_frac_bits}; lower `max_norm` "
            "(normalise embeddings), `n_max` or `k_max`, or use the ckks backend"
        )
    return f


def check_frac_bits(frac_bits: int, bounds: Bounds, gamma: float) -> int:
    """Validate an explicit ``frac_bits`` against the no-wrap condition."""
    check_int("frac_bits", frac_bits, "check_frac_bits", low=0, high=MAX_FRAC_BITS)
    h = bounds.hospital_bound(gamma)
    if not _fits(Fraction(h), bounds.k_max, frac_bits):
        safe = max_safe_frac_bits(h, bounds.k_max)
        raise InvalidParameterError(
            f"frac_bits={frac_bits} lets a sum of k_max={bounds.k_max} hospitals with |entry| <= {h:.6g} "
            f"wrap modulo 2^64; use frac_bits <= {safe} or lower the declared bounds"
        )
    return int(frac_bits)


def encode(values, frac_bits: int, *, bound: float | None = None) -> np.ndarray:
    """``round(v * 2^f) mod 2^64`` as uint64 (round half to even).

    Raises :class:`BoundsExceeded` if ``|v| > bound`` (when given) or if
    ``v * 2^f`` does not fit a signed 64-bit integer.
    """
    check_int("frac_bits", frac_bits, "encode", low=0, high=MAX_FRAC_BITS)
    v = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(v)):
        raise InvalidInputError("cannot encode NaN or inf")
    if bound is not None and v.size and float(np.max(np.abs(v))) > bound:
        raise BoundsExceeded(f"|entry| exceeds the declared bound {bound:.6g}")
    scaled = np.rint(np.ldexp(v, frac_bits))  # exact scaling by a power of two
    if scaled.size and float(np.max(np.abs(scaled))) >= 2.0**63:
        raise BoundsExceeded("an entry times 2^frac_bits does not fit in 64 bits")
    return scaled.astype(np.int64).view(np.uint64)


def decode_signed(words) -> np.ndarray:
    """Two's-complement reading of uint64 words as int64 (exact)."""
    w = np.asarray(words)
    if w.dtype != np.uint64:
        raise InvalidInputError(f"expected uint64 words, got {w.dtype}")
    return w.view(np.int64)


def decode(words, frac_bits: int) -> np.ndarray:
    """``signed(s) / 2^f`` as float64 (the only rounding is int64 -> float64)."""
    check_int("frac_bits", frac_bits, "decode", low=0, high=MAX_FRAC_BITS)
    return np.ldexp(decode_signed(words).astype(np.float64), -frac_bits)


def fixed_point_sum(vectors, frac_bits: int) -> np.ndarray:
    """Plaintext reference: ``sum_k enc(v_k) mod 2^64`` (uint64)."""
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
