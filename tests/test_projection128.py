"""split's projection over Field128: the compiled kernel (secure_afl.hazmat.ternary.project128, four 32-bit limbs
in int64) against the float32 BLAS path and against Python integers, on random and adversarial words (every
word p - 1 or 2^128 - 1, lengths that are no multiple of 4, a single entry, lengths around the kernel's and the
BLAS path's chunk boundaries), and a known answer."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest

from secure_afl.hazmat import field128_kernels, ternary
from secure_afl.hazmat.field128 import FIELD128 as F
from secure_afl.split import projection
from secure_afl.split.sizes import ROWS
from support.flp_reference import ternary_rows

P = 2 ** 128 - 28 * 2 ** 64 + 1
DOMAIN = b"saflVALIDrow"
#: the known answer of test_known_answer, from :func:`reference` (computed once, written here)
KAT_FIRST = [10934754077568706817310561849573356, 351751491503129779015509695537348723,
             416551254885596409561218169989759287]
KAT_DIGEST = "6190ca933532088fe6e5ff7d388cff1c55de91db9200a188e437c1c430e20491"
needs_numba = pytest.mark.skipif(not ternary.AVAILABLE, reason="numba is not installed")


def reference(words: list[int], key: bytes, domain: bytes, rows: int) -> list[int]:
    """The first ``rows`` projections mod p from the definition (the independent reference's trit decoding)."""
    return ternary_rows(words, key, domain, rows, P)


def _words(ints: list[int]) -> np.ndarray:
    """Field128 words holding ``ints`` as they are (below 2^128; not reduced, so non-canonical words too)."""
    a = F.zeros(len(ints))
    a["lo"] = [x & (2 ** 64 - 1) for x in ints]
    a["hi"] = [x >> 64 for x in ints]
    return a


def _both(words: np.ndarray, key: bytes) -> tuple[list[int], list[int]]:
    """(BLAS path, compiled kernel) projections of ``words`` as Python ints."""
    field128_kernels.unload()
    blas = [int(v) for v in F.to_ints(projection.project(words, key, DOMAIN, compiled=True, field=F))]
    field128_kernels.load()
    try:
        compiled = [int(v) for v in F.to_ints(projection.project(words, key, DOMAIN, compiled=True, field=F))]
    finally:
        field128_kernels.unload()
    return blas, compiled


@needs_numba
@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 64, 255, 1001])
def test_compiled_equals_blas_and_python_ints_on_random_and_extreme_words(n):
    rng = random.Random(n)
    for ints in ([rng.randrange(P) for _ in range(n)], [P - 1] * n, [2 ** 128 - 1] * n,
                 [rng.choice([0, 1, P - 1, 2 ** 64 - 1, 2 ** 127, 2 ** 96 - 1, (P - 1) // 2]) for _ in range(n)]):
        key = bytes(rng.randrange(256) for _ in range(32))
        blas, compiled = _both(_words(ints), key)
        assert compiled == blas
        assert compiled[:8] == reference(ints, key, DOMAIN, 8)


@needs_numba
@pytest.mark.parametrize("n", [4095, 4096, 4097, 65535, 65536, 65537])
def test_compiled_equals_blas_around_the_chunk_boundaries(n):
    # 2^16: where the BLAS path cuts its float32 sums; the first rows again against Python integers
    rng = np.random.default_rng(n)
    words = F.zeros(n)
    words["lo"] = rng.integers(0, 2 ** 64, n, dtype=np.uint64)
    words["hi"] = rng.integers(0, 2 ** 64 - 28, n, dtype=np.uint64)
    words[: n // 3] = _words([P - 1])[0]
    key = hashlib.sha256(b"chunk %d" % n).digest()
    blas, compiled = _both(words, key)
    assert compiled == blas
    assert compiled[:1] == reference([int(v) for v in F.to_ints(words)], key, DOMAIN, 1)


@needs_numba
def test_the_limb_sums_hold_at_their_extremes():
    # every limb 2^32 - 1 under rows of all +1 and all -1: each accumulator at n (2^32 - 1) in magnitude
    n = 10_001
    top = np.zeros(4 * -(-n // 4), dtype=np.int64)  # the kernel's limbs come padded to four per row byte
    top[:n] = 2 ** 32 - 1
    raw = np.array([[0b01010101] * -(-n // 4), [0xFF] * -(-n // 4), [0] * -(-n // 4)], dtype=np.uint8)
    ternary.project128(raw[:1], _words([1]))  # compiles
    sums = ternary._compiled128(raw, top, top, top, top)
    assert sums.tolist() == [[n * (2 ** 32 - 1)] * 4, [-n * (2 ** 32 - 1)] * 4, [0] * 4]
    assert ternary.project128(raw, _words([2 ** 128 - 1] * n)) == [n * (2 ** 128 - 1), -n * (2 ** 128 - 1), 0]


@needs_numba
def test_the_kernel_releases_the_gil_and_refuses_rows_shorter_than_the_vector():
    ternary.project128(np.zeros((1, 1), dtype=np.uint8), _words([5]))
    assert ternary._compiled128.targetoptions.get("nogil") is True
    with pytest.raises(ValueError, match="do not match"):
        ternary.project128(np.zeros((2, 2), dtype=np.uint8), _words([1] * 9))


def test_known_answer():
    # words i^3 * 2^100 + i mod p (i < 50) under the key SHA-256("projection128 kat"): the digest of the 130
    # rows' 16-byte encodings, and the first three rows in full (both from the reference above)
    ints = [(i ** 3 * 2 ** 100 + i) % P for i in range(50)]
    key = hashlib.sha256(b"projection128 kat").digest()
    assert reference(ints, key, DOMAIN, 3) == KAT_FIRST
    paths = [False] + ([True] if ternary.AVAILABLE else [])
    for compiled in paths:
        if compiled:
            field128_kernels.load()
        try:
            got = projection.project(_words(ints), key, DOMAIN, compiled=True, field=F)
        finally:
            field128_kernels.unload()
        assert [int(v) for v in F.to_ints(got[:3])] == KAT_FIRST
        assert hashlib.sha256(F.to_bytes(got)).hexdigest() == KAT_DIGEST
    assert len(got) == ROWS
