"""Field128 word arithmetic, written once for numpy arrays and for numba's scalar loops.

An element ``x = hi 2^64 + lo`` of ``F_p``, ``p = 2^128 - 28 2^64 + 1``, is a
pair of uint64 words. The functions :func:`mul_words`, :func:`add_words` and
:func:`sub_words` take and return such pairs using only uint64 operations
that wrap modulo 2^64 (``+ - * & >> <<``, comparisons turned into 0/1 with
``np.uint64``), so the same source runs elementwise on numpy arrays (the
reference path of :mod:`secure_afl.hazmat.field128`) and, once
:func:`load` has registered them with numba (inlined), inside the compiled loops below.
Every constant is an ``np.uint64``: a Python integer in numba code would
promote a uint64 expression to float64. The math of each step (why no
intermediate overflows) is in :mod:`secure_afl.hazmat.field128`'s docstring,
"Multiplication", "Addition and subtraction".

The compiled loops (:func:`load`) work on ``(n, 2)`` uint64 views of
C-contiguous element arrays (column 0 the low word, column 1 the high one):
products, sums, differences, the sum of products (a 192-bit accumulator, reduced
by the caller) and the radix-2 NTT's butterflies. Without numba, :data:`AVAILABLE`
is False and the numpy path is used; both give the same words (tests/test_field128.py).
"""

from __future__ import annotations

import importlib.util

import numpy as np

__all__ = ["AVAILABLE", "load", "loaded", "mul64", "small_mul", "mul_words", "add_words", "sub_words", "unload"]

#: numba is installed (an optional accelerator; numpy is the reference and the fallback)
AVAILABLE = importlib.util.find_spec("numba") is not None

M32 = np.uint64(0xFFFFFFFF)
S32 = np.uint64(32)
ONE = np.uint64(1)
K28 = np.uint64(28)
K783 = np.uint64(783)
#: p's high word, 2^64 - 28 (its low word is 1)
P_HI = np.uint64((1 << 64) - 28)


def mul64(x, y):
    """``(hi, lo)`` of the 128-bit product ``x y`` from four 32 x 32-bit partial products."""
    x0 = x & M32
    x1 = x >> S32
    y0 = y & M32
    y1 = y >> S32
    lo = x0 * y0
    hi = x1 * y1
    mid = x0 * y1
    mid2 = x1 * y0
    mid = mid + mid2
    hi = hi + (np.uint64(mid < mid2) << S32)  # the middle sum wrapped: its 2^64 is 2^96 of the product
    hi = hi + (mid >> S32)
    m = mid << S32
    lo = lo + m
    hi = hi + np.uint64(lo < m)
    return hi, lo


def small_mul(k, w):
    """``(hi, lo)`` of ``k w`` for ``k < 2^32``: ``k w_1 2^32 + k w_0`` with both partial products below 2^64."""
    a = k * (w >> S32)
    b = k * (w & M32)
    return (a + (b >> S32)) >> S32, k * w


def mul_words(a0, a1, b0, b1):
    """``(lo, hi)`` of ``a b mod p``, canonical, for canonical ``a = a1 2^64 + a0`` and ``b``."""
    h00, l00 = mul64(a0, b0)
    h01, l01 = mul64(a0, b1)
    h10, l10 = mul64(a1, b0)
    h11, l11 = mul64(a1, b1)
    # the 256-bit product w0 + w1 2^64 + w2 2^128 + w3 2^192
    w0 = l00
    s = h00 + l01
    c = np.uint64(s < l01)
    w1 = s + l10
    c = c + np.uint64(w1 < l10)
    t = h01 + h10
    c2 = np.uint64(t < h10)
    t = t + l11
    c2 = c2 + np.uint64(t < l11)
    w2 = t + c
    c2 = c2 + np.uint64(w2 < c)
    w3 = h11 + c2
    # 2^128 = 28 2^64 - 1 and 2^192 = 783 2^64 - 28: x = w1 + 28 w2 + 783 w3 (< 2^74), y = w2 + 28 w3 (< 2^69)
    m2h, m2l = small_mul(K28, w2)
    m3h, m3l = small_mul(K783, w3)
    xl = w1 + m2l
    xh = m2h + np.uint64(xl < m2l)
    xl = xl + m3l
    xh = xh + m3h + np.uint64(xl < m3l)
    n3h, n3l = small_mul(K28, w3)
    yl = w2 + n3l
    yh = n3h + np.uint64(yl < n3l)
    # r = w0 + x 2^64 - y >= 0 in three words, r2 < 812
    r0 = w0 - yl
    sub = yh + np.uint64(w0 < yl)
    r1 = xl - sub
    r2 = xh - np.uint64(xl < sub)
    # r2 2^128 = 28 r2 2^64 - r2
    lo = r0 - r2
    k = K28 * r2 - np.uint64(r0 < r2)
    hi = r1 + k
    c = np.uint64(hi < k)  # one more 2^128: + 28 2^64 - 1 (hi is then below 2^15)
    b = np.uint64(lo < c)
    lo = lo - c
    hi = hi + K28 * c - b
    return _below_p(lo, hi)


def _below_p(lo, hi):
    """Subtract p once from a value below 2^128 < 2p if it is >= p (in 128-bit arithmetic mod 2^128)."""
    ge = np.uint64(hi > P_HI) | (np.uint64(hi == P_HI) & np.uint64(lo >= ONE))
    b = np.uint64(lo < ge)
    return lo - ge, hi - ge * P_HI - b


def add_words(a0, a1, b0, b1):
    """``(lo, hi)`` of ``a + b mod p``: the 129-bit sum, its carry folded as ``28 2^64 - 1``, then below p."""
    lo = a0 + b0
    c = np.uint64(lo < b0)
    hi = a1 + b1
    c2 = np.uint64(hi < b1)
    hi = hi + c
    c2 = c2 + np.uint64(hi < c)
    b = np.uint64(lo < c2)
    lo = lo - c2
    hi = hi + K28 * c2 - b
    return _below_p(lo, hi)


def sub_words(a0, a1, b0, b1):
    """``(lo, hi)`` of ``a - b mod p``: the difference mod 2^128, plus p where it borrowed."""
    lo = a0 - b0
    bw = np.uint64(a0 < b0)
    t = a1 - b1
    bb = np.uint64(a1 < b1)
    hi = t - bw
    bb = bb + np.uint64(t < bw)
    lo2 = lo + bb
    return lo2, hi + bb * P_HI + np.uint64(lo2 < lo)


# -- the compiled loops (numba compiles them after registering the word functions) -----------------------
# The elements arrive interleaved (lo, hi, lo, hi, ...); LLVM vectorises the word functions only over separate
# low-word and high-word arrays, so each loop copies a block into such arrays (in the cache), computes, and
# copies back: about twice as fast as working on the interleaved words (docs/BENCHMARKS_HISTORY.md, "Field128
# against Goldilocks").
BLOCK = 512


def _block_op(a, b, out, op):
    n = out.shape[0]
    a0 = np.empty(BLOCK, dtype=np.uint64)
    a1 = np.empty(BLOCK, dtype=np.uint64)
    b0 = np.empty(BLOCK, dtype=np.uint64)
    b1 = np.empty(BLOCK, dtype=np.uint64)
    o0 = np.empty(BLOCK, dtype=np.uint64)
    o1 = np.empty(BLOCK, dtype=np.uint64)
    for s in range(0, n, BLOCK):
        m = min(BLOCK, n - s)
        for i in range(m):
            a0[i] = a[s + i, 0]
            a1[i] = a[s + i, 1]
            b0[i] = b[s + i, 0]
            b1[i] = b[s + i, 1]
        if op == 0:
            for i in range(m):
                o0[i], o1[i] = mul_words(a0[i], a1[i], b0[i], b1[i])
        elif op == 1:
            for i in range(m):
                o0[i], o1[i] = add_words(a0[i], a1[i], b0[i], b1[i])
        else:
            for i in range(m):
                o0[i], o1[i] = sub_words(a0[i], a1[i], b0[i], b1[i])
        for i in range(m):
            out[s + i, 0] = o0[i]
            out[s + i, 1] = o1[i]


def mul_loop(a, b, out):
    _block_op(a, b, out, 0)


def add_loop(a, b, out):
    _block_op(a, b, out, 1)


def sub_loop(a, b, out):
    _block_op(a, b, out, 2)


def _accumulate(lo, hi, top, pl, ph):
    """``(lo, hi, top) + (pl, ph)`` in 192 bits."""
    lo = lo + pl
    c = np.uint64(lo < pl)
    hi = hi + ph
    top = top + np.uint64(hi < ph)
    hi = hi + c
    top = top + np.uint64(hi < c)
    return lo, hi, top


def dot_loop(a, b):
    """``sum_i a_i b_i`` (each product reduced) as three words ``(lo, hi, top)``, exact below 2^192."""
    n = a.shape[0]
    prod = np.empty((min(n, 1 << 14), 2), dtype=np.uint64)
    lo = np.uint64(0)
    hi = np.uint64(0)
    top = np.uint64(0)
    for s in range(0, n, prod.shape[0]):
        m = min(prod.shape[0], n - s)
        _block_op(a[s:s + m], b[s:s + m], prod[:m], 0)
        for i in range(m):
            lo, hi, top = _accumulate(lo, hi, top, prod[i, 0], prod[i, 1])
    return lo, hi, top


def sum_loop(a):
    """``sum_i a_i`` as three words ``(lo, hi, top)``, exact below 2^192."""
    lo = np.uint64(0)
    hi = np.uint64(0)
    top = np.uint64(0)
    for i in range(a.shape[0]):
        lo, hi, top = _accumulate(lo, hi, top, a[i, 0], a[i, 1])
    return lo, hi, top


def ntt_loop(x, tw):
    """In-place radix-2 NTT of each row of ``x`` ((rows, n, 2), rows already in bit-reversed order).

    ``tw`` ((2, n - 1): low words, high words) holds each stage's twiddles in a row: stage ``length`` (half
    ``h = length / 2``) at ``[h - 1, 2h - 1)``, ``root^(j n / length)``. Each row is worked on as separate
    low-word and high-word arrays (vectorised butterflies), copied in and out once."""
    n = x.shape[1]
    xl = np.empty(n, dtype=np.uint64)
    xh = np.empty(n, dtype=np.uint64)
    for r in range(x.shape[0]):
        for i in range(n):
            xl[i] = x[r, i, 0]
            xh[i] = x[r, i, 1]
        h = 1
        while h < n:
            tl = tw[0, h - 1:2 * h - 1]
            th = tw[1, h - 1:2 * h - 1]
            for start in range(0, n, 2 * h):
                ul = xl[start:start + h]
                uh = xh[start:start + h]
                vl = xl[start + h:start + 2 * h]
                vh = xh[start + h:start + 2 * h]
                for j in range(h):
                    p0, p1 = mul_words(vl[j], vh[j], tl[j], th[j])
                    u0 = ul[j]
                    u1 = uh[j]
                    s0, s1 = add_words(u0, u1, p0, p1)
                    d0, d1 = sub_words(u0, u1, p0, p1)
                    ul[j] = s0
                    uh[j] = s1
                    vl[j] = d0
                    vh[j] = d1
            h *= 2
        for i in range(n):
            x[r, i, 0] = xl[i]
            x[r, i, 1] = xh[i]


class _Kernels:
    __slots__ = ("mul", "add", "sub", "dot", "sum", "ntt")


_compiled = None  # built once per process
_active = False


def loaded():
    """The compiled loops if :func:`load` switched them on in this process, else None."""
    return _compiled if _active else None


def load():
    """Compile (or load from numba's cache) the loops, once per process, and switch them on; returns them
    (None without numba).

    Importing numba costs about a second per process: a caller that makes a few products stays on numpy."""
    global _compiled, _active
    if not AVAILABLE:
        return None
    if _compiled is None:
        _compiled = _build()
    _active = True
    return _compiled


def _build():
    import numba
    from numba.extending import register_jitable

    for fn in (mul64, small_mul, mul_words, _below_p, add_words, sub_words, _block_op, _accumulate):
        register_jitable(inline="always")(fn)  # callable from compiled code, unchanged for numpy

    from .ternary import compile_kernel as jit  # one way to compile (cached where writable) for every kernel

    one = np.zeros((1, 2), dtype=np.uint64)
    k = _Kernels()
    k.mul = jit(mul_loop, one, one, one.copy())
    k.add = jit(add_loop, one, one, one.copy())
    k.sub = jit(sub_loop, one, one, one.copy())
    k.dot = jit(dot_loop, one, one)
    k.sum = jit(sum_loop, one)
    k.ntt = jit(ntt_loop, np.zeros((1, 2, 2), dtype=np.uint64), np.zeros((2, 1), dtype=np.uint64))
    return k


def unload() -> None:
    """Back to the numpy path in this process (the benchmark compares both; the tests check both agree)."""
    global _active
    _active = False
