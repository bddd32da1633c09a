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

__all__ = ["AVAILABLE", "WARM_CALLS", "worth_it", "warm", "project", "product_kernel"]

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


_compiled = None
_compiled_product = None


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
