"""Ternary projections ``<r_j, x> mod p`` (the validity proof's hottest loop), compiled when numba is installed,
and the field product of the verifiers' queries beside them.

Each row ``r_j in {-1, 0, 1}^L`` comes as packed bytes, four entries per
byte (bit 2k: nonzero, bit 2k+1: negative), as
:meth:`secure_afl.split.projection.project` draws them. The
kernel adds the selected entries' 32-bit halves into two int64 accumulators
(each below ``L 2^32 < 2^62`` for ``L < 2^30``: exact) and reduces
``hi 2^32 + lo`` mod p once per row. Compiled with ``nogil``, so threads run
it side by side; measured against the numpy float32 path in
docs/BENCHMARKS.md ("Proof arithmetic"). Without numba, :data:`AVAILABLE` is
False and the caller keeps its numpy path; both give the same values
(tests/test_split.py checks them against the pure-Python reference).

Over Field128 (``p = 2^128 - 28 2^64 + 1``, words stored as ``hi 2^64 + lo``)
the same rows run over the word's four 32-bit limbs ``w = sum_k x_k 2^(32k)``
(:func:`project128`): four int64 accumulators, each a signed sum of at most
``L`` limbs below ``2^32``, so ``|s_k| <= L (2^32 - 1) < 2^62`` for
``L < 2^30``: no accumulator overflows, whatever the rows' signs. Then
``<r_j, w> = sum_k s_k 2^(32k)`` holds over the integers (each limb is
summed with the row's signs separately, and the sum is linear), and it is
reduced once mod p as a Python integer (``|value| < 2^62 2^97 < 2^160``:
130 rows, four terms each, microseconds). Exactness therefore does not
depend on the word being canonical either: the kernel projects the
integers the words hold.

Importing numba and loading the compiled kernel from its cache costs a
second or more per process, many times one projection at d = 512: a process
switches to the kernel only after :data:`WARM_CALLS` projections
(:func:`worth_it`), so a hospital's one-shot prove stays on numpy and a
verifier judging many uploads pays the start once.
"""

from __future__ import annotations

import numpy as np

from . import flp

import importlib.util

__all__ = ["AVAILABLE", "WARM_CALLS", "worth_it", "warm", "project", "project128", "product_kernel"]

#: numba is installed (an optional accelerator: the numpy path is the reference and the fallback)
AVAILABLE = importlib.util.find_spec("numba") is not None
#: projections a process makes on numpy before it loads the compiled kernel
WARM_CALLS = 3
_calls = 0


def _sums(raw, lo, hi):
    rows = raw.shape[0]
    n = lo.shape[0]
    out_lo = np.zeros(rows, dtype=np.int64)
    out_hi = np.zeros(rows, dtype=np.int64)
    for j in range(rows):
        a = np.int64(0)
        b = np.int64(0)
        r = raw[j]
        for i in range(n):
            t = np.int64((r[i >> 2] >> ((i & 3) * 2)) & 3)
            # branch-free: keep the entry where the trit is nonzero (mask), negate it where negative
            # ((v ^ -1) + 1 = -v); a third faster than branching on the trit (docs/BENCHMARKS.md)
            nz = -(t & 1)
            neg = -(t >> 1)
            a += ((lo[i] & nz) ^ neg) - neg
            b += ((hi[i] & nz) ^ neg) - neg
        out_lo[j] = a
        out_hi[j] = b
    return out_lo, out_hi


def _sums128(raw, x0, x1, x2, x3):
    """Per row, the four signed limb sums ``s_k = sum_i r_ji x_k[i]`` as (rows, 4) int64 (limbs below 2^32; the
    limb arrays padded with zeros to four entries per row byte).

    The loop of :func:`_sums` with four accumulators, a row byte at a time (its four entries unrolled: a
    quarter faster than one entry at a time; blocking the entries for the cache gained nothing measurable)."""
    rows = raw.shape[0]
    nb = x0.shape[0] >> 2
    out = np.zeros((rows, 4), dtype=np.int64)
    for j in range(rows):
        r = raw[j]
        s0 = np.int64(0)
        s1 = np.int64(0)
        s2 = np.int64(0)
        s3 = np.int64(0)
        for b in range(nb):
            byte = np.int64(r[b])
            for k in range(4):
                i = 4 * b + k
                t = (byte >> (2 * k)) & 3
                nz = -(t & 1)
                neg = -(t >> 1)
                s0 += ((x0[i] & nz) ^ neg) - neg
                s1 += ((x1[i] & nz) ^ neg) - neg
                s2 += ((x2[i] & nz) ^ neg) - neg
                s3 += ((x3[i] & nz) ^ neg) - neg
        out[j, 0] = s0
        out[j, 1] = s1
        out[j, 2] = s2
        out[j, 3] = s3
    return out


_compiled = None
_compiled_product = None
_compiled128 = None


def worth_it() -> bool:
    """Count one projection; True once this process has made more than :data:`WARM_CALLS` (numba installed)."""
    global _calls
    _calls += 1
    return AVAILABLE and _calls > WARM_CALLS


def warm() -> None:
    """For a process that projects many uploads (a verifier's worker): load the kernel now, and use it from
    the first projection on."""
    global _calls
    if AVAILABLE:
        _kernel()
        _calls = max(_calls, WARM_CALLS)


def compile_kernel(fn, *probe):
    import numba

    try:  # cached beside the module, or in numba's user cache where the install is read-only
        compiled = numba.njit(nogil=True, cache=True)(fn)
        compiled(*probe)
    except RuntimeError:  # no writable cache anywhere: compile in memory, once per process
        compiled = numba.njit(nogil=True)(fn)
    return compiled


def product_kernel():
    """:func:`flp.mul_into`, compiled (once per process)."""
    global _compiled_product
    if _compiled_product is None:
        one = np.zeros(1, dtype=np.uint64)
        _compiled_product = compile_kernel(flp.mul_into, one, one, one.copy())
    return _compiled_product


def _kernel():
    """The projection kernel; loading it also hands :mod:`flp` its compiled product, which the same verifier's
    queries use."""
    global _compiled
    if _compiled is None:
        _compiled = compile_kernel(_sums, np.zeros((1, 1), dtype=np.uint8), np.zeros(1, dtype=np.int64),
                             np.zeros(1, dtype=np.int64))
    flp._compiled_mul = product_kernel()
    return _compiled


def project(raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``<r_j, x> mod p`` for each row of ``raw`` (uint8, (rows, ceil(L / 4))) over ``x`` (L field elements)."""
    if not AVAILABLE:  # pragma: no cover
        raise RuntimeError("numba is not installed: use the numpy projection")
    x = np.ascontiguousarray(x, dtype=np.uint64)
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if x.shape[0] >= 1 << 30 or raw.ndim != 2 or raw.shape[1] * 4 < x.shape[0]:
        raise ValueError("rows and vector do not match (or the vector is too long for exact int64 sums)")
    lo, hi = _kernel()(raw, (x & np.uint64(0xFFFFFFFF)).astype(np.int64), (x >> np.uint64(32)).astype(np.int64))
    return flp.add(flp.scale(flp.encode_signed(hi), 1 << 32), flp.encode_signed(lo))


def project128(raw: np.ndarray, words: np.ndarray) -> list[int]:
    """``<r_j, w>`` over the integers (not reduced) for each row of ``raw`` (uint8, (rows, ceil(L / 4))) and the
    Field128 words ``words`` (L elements, ``hi 2^64 + lo``): Python ints, |value| < 2^160 (module docstring)."""
    global _compiled128
    if not AVAILABLE:  # pragma: no cover
        raise RuntimeError("numba is not installed: use the numpy projection")
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    limbs = np.ascontiguousarray(words).reshape(-1).view("<u4").reshape(-1, 4)  # little-endian: limb k at 2^32k
    if limbs.shape[0] >= 1 << 30 or raw.ndim != 2 or raw.shape[1] * 4 < limbs.shape[0]:
        raise ValueError("rows and vector do not match (or the vector is too long for exact int64 sums)")
    if _compiled128 is None:
        one = np.zeros(1, dtype=np.int64)
        _compiled128 = compile_kernel(_sums128, np.zeros((1, 1), dtype=np.uint8), one, one, one, one)
    padded = np.zeros((4, 4 * raw.shape[1]), dtype=np.int64)  # entries past the vector count zero
    padded[:, :limbs.shape[0]] = limbs.T
    sums = _compiled128(raw, *padded)
    return [sum(int(v) << (32 * k) for k, v in enumerate(row)) for row in sums.tolist()]
