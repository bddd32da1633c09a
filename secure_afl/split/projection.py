"""split's random projections: ``ROWS`` rows in ``{-1, 0, 1}^n`` drawn from a hash of the committed upload,
applied to field words exactly (docs/VALIDITY.md, "The projection").

Exact in float32: the words are cut into their 8 bytes and summed over at most ``_PROJ_CHUNK`` entries at a
time, so every partial sum is an integer of magnitude at most ``255 * 2^16 < 2^24`` whatever order the BLAS
adds in; chunk sums are then added as int64 and the bytes recombined mod p. The compiled kernels
(:mod:`secure_afl.hazmat.ternary`, numba) draw the same rows from the same stream and sum 32-bit limbs in
int64 instead; the tests hold both paths to Python integers.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from ..hazmat import field128_kernels, ternary
from ..hazmat.field128 import FIELD128
from ..hazmat.fields import GOLDILOCKS
from .sizes import ROWS

__all__ = ["project", "exact_gram"]


def _trit_table() -> np.ndarray:
    """Byte -> its four trits, two bits each (low bit: nonzero, high bit: sign): 0 w.p. 1/2, +-1 w.p. 1/4.

    Stored as one 16-byte item per byte value (four float32 viewed as a complex128) so that a row block is a
    single 1-D ``take``, several times faster than indexing a (256, 4) table."""
    t = np.zeros((256, 4), dtype=np.float32)
    for byte in range(256):
        for k in range(4):
            nz, sg = (byte >> (2 * k)) & 1, (byte >> (2 * k + 1)) & 1
            t[byte, k] = 0.0 if not nz else (-1.0 if sg else 1.0)
    return t.view(np.complex128).ravel()


_TRITS = _trit_table()
#: entries summed per float32 product: 255 * 2^16 < 2^24 keeps every partial sum exact
_PROJ_CHUNK = 1 << 16
#: project with the compiled kernel when numba is installed and this process projects often enough to pay for
#: loading it (:mod:`secure_afl.hazmat.ternary`); else float32 BLAS
_COMPILED = True


def _one_blas_thread():
    """BLAS on one thread while any projection runs: each product is 16 x 65536 by 65536 x 8, too small to
    share (:func:`secure_afl._blas.one_blas_thread`)."""
    from .._blas import one_blas_thread

    return one_blas_thread()


def project(words, key: bytes, domain: bytes, *, compiled: bool = False, field=None) -> np.ndarray:
    """``<r_j, words>`` mod p for the ROWS rows of the ChaCha20 stream under ``key`` and ``domain``, shape
    (ROWS,), over ``field`` (Goldilocks when None). ``compiled``: the compiled kernel may sum them (the same
    rows, a loop that releases the GIL): Goldilocks once this process has projected often enough
    (:func:`ternary.worth_it`), Field128 once its compiled loops are loaded (:func:`ternary.project128`, four
    32-bit limbs in int64, one reduction per row). The rows do not depend on the field: a word's bytes are its
    little-endian encoding, ``ENCODED_SIZE`` of them."""
    F = GOLDILOCKS if field is None else field
    words = np.asarray(words, dtype=F.dtype)
    n = words.shape[0]
    row_bytes = -(-n // 4)
    enc = Cipher(algorithms.ChaCha20(key, b"\x00\x00\x00\x00" + domain), mode=None).encryptor()
    if compiled and _COMPILED and F is GOLDILOCKS and ternary.worth_it():
        raw = np.frombuffer(enc.update(bytes(ROWS * row_bytes)), dtype=np.uint8).reshape(ROWS, row_bytes)
        return ternary.project(raw, words)
    if compiled and _COMPILED and F is FIELD128 and field128_kernels.loaded() is not None:
        # a Field128 session's process has loaded numba already (its circuit does): no start to amortise
        raw = np.frombuffer(enc.update(bytes(ROWS * row_bytes)), dtype=np.uint8).reshape(ROWS, row_bytes)
        return F.to_field(ternary.project128(raw, words))
    size = F.ENCODED_SIZE
    limbs = np.frombuffer(F.to_bytes(words), dtype=np.uint8).reshape(n, size).T.astype(np.float32)
    sums = np.zeros((ROWS, size), dtype=np.int64)
    block = 16
    with _one_blas_thread():
        for j0 in range(0, ROWS, block):
            nb = min(block, ROWS - j0)
            raw = np.frombuffer(enc.update(bytes(nb * row_bytes)), dtype=np.uint8).reshape(nb, row_bytes)
            R = np.take(_TRITS, raw).view(np.float32).reshape(nb, 4 * row_bytes)
            for c0 in range(0, n, _PROJ_CHUNK):
                c1 = min(n, c0 + _PROJ_CHUNK)
                sums[j0:j0 + nb] += (R[:, c0:c1] @ limbs[:, c0:c1].T).astype(np.int64)
    out = F.zeros(ROWS)
    for i in range(size):
        out = F.add(out, F.scale(F.encode_signed(sums[:, i]), 1 << (8 * i)))
    return out


def exact_gram(m: np.ndarray) -> np.ndarray:
    """``m m^T`` of an int64 matrix, exactly, through float64 BLAS: entries cut into 2^h limbs so every product
    sum of limbs stays below 2^53; a result below 2^62 is recombined in int64, a wider one (a Field128
    session's factor at f near 48) as Python integers (object array) from more limbs."""
    from ..exceptions import InvalidParameterError

    width = max(1, int(np.max(np.abs(m))).bit_length()) if m.size else 1
    cols = max(1, m.shape[1]).bit_length()
    if 2 * width + cols > 62:
        return _exact_gram_wide(m, width, cols)
    h = -(-width // 2)
    if 2 * h + cols > 53:  # pragma: no cover - the session's sizes keep it below
        raise InvalidParameterError("the Gram factor's entries are too wide for an exact product")
    hi, lo = np.divmod(m, np.int64(1 << h))
    a, b = hi.astype(np.float64), lo.astype(np.float64)
    aa, bb = (a @ a.T).astype(np.int64), (b @ b.T).astype(np.int64)
    ab = (a @ b.T).astype(np.int64)
    return (aa << (2 * h)) + ((ab + ab.T) << h) + bb


def _exact_gram_wide(m: np.ndarray, width: int, cols: int) -> np.ndarray:
    """:func:`exact_gram` past int64: limbs of h bits with ``2h + cols <= 53`` (each limb product sum exact in
    float64, and below 2^53 in int64), recombined as Python integers."""
    from ..exceptions import InvalidParameterError

    h = (53 - cols) // 2
    if h < 8:  # pragma: no cover - the session's sizes keep the factor's rows far shorter
        raise InvalidParameterError("the Gram factor has too many columns for an exact product")
    m = np.asarray(m, dtype=np.int64)
    sign = np.where(m < 0, -1, 1).astype(np.int64)
    mag = np.abs(m)
    limbs = []
    for _ in range(-(-width // h)):
        limbs.append((sign * (mag & np.int64((1 << h) - 1))).astype(np.float64))
        mag = mag >> np.int64(h)
    out = np.zeros((m.shape[0], m.shape[0]), dtype=object)
    for i, a in enumerate(limbs):
        for j, b in enumerate(limbs):
            out += (a @ b.T).astype(np.int64).astype(object) * (1 << (h * (i + j)))
    return out
