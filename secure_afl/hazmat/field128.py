"""Prio3's 128-bit prime field, ``p = 2^128 - 28 2^64 + 1``, as an object with vectorised arithmetic.

.. warning::

    This is a "Hazardous Materials" module. You should **ONLY** use it if
    you're 100% absolutely sure that you know what you're doing because this
    module is full of land mines, dragons, and dinosaurs with laser guns.

The group
---------
``p - 1 = 2^66 * 3 * 3491 * 440340496364689`` (each factor prime), so ``F_p^*``
has a subgroup of order ``2^k`` for every ``k <= 66`` and radix-2 NTTs of those
sizes exist. 7 generates the whole group: ``7^((p-1)/q) != 1`` for each prime
``q`` of ``p - 1``, which with ``7^(p-1) = 1`` is also Lucas's proof that p is
prime (tests/test_field128.py checks both, deterministically). Hence
``root_of_unity(n) = 7^((p-1)/n)`` has order exactly ``n``; for ``n = 2^66``
it is ``7^(3 * 3491 * 440340496364689)``, the generator of the 2-power subgroup.

Elements
--------
One numpy array element per field element, dtype ``[("lo", "<u8"), ("hi", "<u8")]``:
``x = hi 2^64 + lo``, so ``a.tobytes()`` is the 16-byte little-endian encoding of
each element. Canonical means ``x < p``, i.e. ``hi < 2^64 - 28`` or
``hi = 2^64 - 28`` and ``lo = 0``; a word on the wire that is not canonical is
:class:`MalformedPayload`, never reduced. Every arithmetic method takes and
returns canonical elements (the word functions in
:mod:`secure_afl.hazmat.field128_kernels`, one source for numpy arrays and
numba loops).

Multiplication
--------------
With 32-bit halves, ``x y`` of two words is four partial products below
``2^64``; the middle two are summed with their carry (``2^96``) moved up.
Four such word products give the 256-bit ``w0 + w1 2^64 + w2 2^128 + w3 2^192``.
Modulo p, ``2^128 = 28 2^64 - 1`` and ``2^192 = 2^64 (28 2^64 - 1) = 783 2^64 - 28``,
so the product is ``w0 + 2^64 x - y`` with ``x = w1 + 28 w2 + 783 w3 < 812 2^64``
and ``y = w2 + 28 w3 < 29 2^64`` (two words each; ``28 w`` and ``783 w`` are
formed from 32-bit halves, every partial product below ``2^42``). It is not
negative: if ``w2 = w3 = 0`` then ``y = 0``, else ``2^64 x >= 2^64 (28 w2 + 783 w3) > y``.
So ``r = w0 + 2^64 x - y`` is three words with ``r2 < 812``; folding ``r2 2^128``
as ``28 r2 2^64 - r2`` leaves ``(r0 - r2) + 2^64 (r1 + 28 r2)`` (the borrow of
``r0 - r2`` is taken from ``28 r2 >= 28`` when ``r2 > 0``). If the high word
carries, that ``2^128`` is ``28 2^64 - 1`` once more, and the high word is then
below ``28 2^15``, so adding 28 cannot carry again. The value is now below
``2^128 < 2p``: one conditional subtraction of p makes it canonical.

Addition and subtraction
------------------------
``a + b < 2p < 2^129``: the 128-bit sum and a carry; a carry is ``2^128 =
28 2^64 - 1``, after which the value ``a + b - 2^128 + 28 2^64 - 1 < 2p - p = p``
needs nothing more; without a carry one conditional subtraction of p. ``a - b``
is computed mod ``2^128``, and where it borrowed p is added (mod ``2^128``),
giving ``a - b + p`` in ``[0, p)``.

Sums and dot products
---------------------
numpy sums the four 32-bit limbs of the terms separately (each limb sum below
``n 2^32``, exact in uint64 for ``n < 2^32`` terms) and recombines them as
``sum_i s_i 2^(32 i)`` mod p; the compiled loop adds the 128-bit terms into a
192-bit accumulator (carries counted in a third word). A dot product is the sum
of the reduced products.

Signed values
-------------
``z`` with ``|z| <= HALF = (p-1)/2`` (about ``2^127``) travels as ``z mod p``
and reads back exactly through the centred representative; a larger magnitude
is :class:`BoundsExceeded`, never wrapped. An int64 always fits.

Field elements from a key (:meth:`Field128.expand_field`): the ChaCha20
keystream (nonce: four zero bytes and the 12-byte domain) read as 16-byte
little-endian words, words ``>= p`` dropped (rejection: exactly uniform; a word
is dropped with probability ``(28 2^64 - 1) / 2^128 < 2^-59``), in stream order.
"""

from __future__ import annotations

import functools

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from ..exceptions import BoundsExceeded, InvalidInputError, MalformedPayload
from . import field128_kernels as K
from .flp import bitrev  # the bit-reversal permutation depends on no field

__all__ = ["Field128", "FIELD128", "accept_words"]

P = (1 << 128) - 28 * (1 << 64) + 1
DTYPE = np.dtype([("lo", "<u8"), ("hi", "<u8")])
_M64 = (1 << 64) - 1
_P_LO, _P_HI = 1, (1 << 64) - 28
#: fewest elements worth a compiled loop when the kernels are loaded (below, the copies cost more)
_COMPILED_MIN = 64
#: elements per numpy pass: each word array of a chunk (128 KiB) stays in the cache through the word function
_CHUNK = 1 << 14


def _pack(lo, hi) -> np.ndarray:
    out = np.empty(np.shape(lo), dtype=DTYPE)
    out["lo"] = lo
    out["hi"] = hi
    return out


def _elements(a, what: str = "operand") -> np.ndarray:
    a = np.asarray(a)
    if a.dtype != DTYPE:
        raise InvalidInputError(f"the {what} is not an array of Field128 elements (dtype {a.dtype}); use to_field")
    return a


def _canonical(a) -> np.ndarray:
    """Bool array: which elements are below p."""
    return (a["hi"] < np.uint64(_P_HI)) | ((a["hi"] == np.uint64(_P_HI)) & (a["lo"] < np.uint64(_P_LO)))


def _words(a):
    """The (lo, hi) uint64 arrays of ``a``, at least 1-d (numpy scalars warn on the wrap-arounds relied on)."""
    a = np.atleast_1d(a)
    return a["lo"], a["hi"]


def _as_pairs(a) -> np.ndarray:
    """A C-contiguous ``(n, 2)`` uint64 view of ``a`` flattened, for the compiled loops."""
    return np.ascontiguousarray(a).reshape(-1).view("<u8").reshape(-1, 2)


def accept_words(buf: bytes) -> np.ndarray:
    """The rejection step of :meth:`Field128.expand_field`: the 16-byte little-endian words of ``buf`` that are
    below p, in order (a multiple of 16 bytes)."""
    if len(buf) % 16:
        raise InvalidInputError("a keystream to read as Field128 words is a multiple of 16 bytes")
    x = np.frombuffer(buf, dtype=DTYPE)
    keep = _canonical(x)
    return x.copy() if keep.all() else x[keep]


class Field128:
    """``F_p`` with ``p = 2^128 - 28 2^64 + 1`` (module docstring). Frozen: one instance, :data:`FIELD128`."""

    __slots__ = ()
    name = "field128"
    P = P
    ENCODED_SIZE = 16
    GENERATOR = 7
    TWO_ADICITY = 66
    HALF = (P - 1) // 2
    dtype = DTYPE

    def __repr__(self) -> str:
        return "FIELD128"

    # -- construction and conversion ----------------------------------------------------------------------
    def zeros(self, shape) -> np.ndarray:
        return np.zeros(shape, dtype=DTYPE)

    def ones(self, shape) -> np.ndarray:
        out = np.zeros(shape, dtype=DTYPE)
        out["lo"] = 1
        return out

    def to_field(self, ints) -> np.ndarray:
        """Python ints of any sign or size (same shape) -> canonical elements, reduced mod p: the one reducing
        constructor, for public constants."""
        v = np.asarray(ints, dtype=object)
        flat = [int(x) % P for x in v.reshape(-1)]
        lo = np.array([x & _M64 for x in flat], dtype=np.uint64)
        hi = np.array([x >> 64 for x in flat], dtype=np.uint64)
        return _pack(lo, hi).reshape(v.shape)

    def to_ints(self, a) -> np.ndarray:
        """Elements -> an object array of Python ints in ``[0, p)``, same shape."""
        a = _elements(a)
        return np.asarray(a["hi"].astype(object) * (1 << 64) + a["lo"].astype(object), dtype=object)

    def encode_signed(self, z) -> np.ndarray:
        """int64 values, or Python ints with ``|z| <= HALF``, -> ``z mod p`` (past HALF: :class:`BoundsExceeded`)."""
        z = np.asarray(z)
        if z.dtype == object or z.dtype.kind == "u":
            if any(int(x) > self.HALF or int(x) < -self.HALF for x in z.reshape(-1)):
                raise BoundsExceeded("a signed value leaves [-(p-1)/2, (p-1)/2] and would wrap in the field")
            return self.to_field(z)
        if z.dtype.kind != "i":
            raise InvalidInputError(f"signed values to encode are integers, not {z.dtype}")
        shape = z.shape
        z = np.atleast_1d(z.astype(np.int64)).reshape(-1)  # |z| <= 2^63 < HALF: every int64 fits
        neg = z < 0
        mag = np.where(neg, np.uint64(0) - z.view(np.uint64), z.view(np.uint64))  # |z|, -2^63 included
        zero = np.zeros_like(mag)
        slo, shi = K.sub_words(zero, zero, mag, zero)
        return _pack(np.where(neg, slo, mag), np.where(neg, shi, zero)).reshape(shape)

    def _check(self, a, what: str) -> np.ndarray:
        a = _elements(a, what)
        if a.size and not _canonical(a).all():
            raise MalformedPayload(f"{what} holds a word that is not a field element (>= p)")
        return a

    def decode_signed(self, a) -> np.ndarray:
        """Centred representatives in ``[-HALF, HALF]`` as Python ints (object array, same shape)."""
        x = self.to_ints(self._check(a, "a vector to decode"))
        return np.where(x > self.HALF, x - P, x)

    def decode_signed_float(self, a) -> np.ndarray:
        """The centred integers correctly rounded to float64 (round half to even), as ``float(int)`` would.

        With ``m = mh 2^64 + ml`` the magnitude (``mh < 2^63``) and ``k`` the bit length of ``mh`` or one more
        (the float exponent of ``mh``, which may round up): ``m = t 2^k + rem`` with ``t < 2^64`` holding at least
        63 significant bits. Converting ``t | (rem != 0)`` rounds as ``m / 2^k`` does: the sticky bit sits at
        least nine bits below the rounding position, so it only breaks a tie that ``rem`` breaks; scaling by
        ``2^k`` is exact."""
        a = self._check(a, "a vector to decode")
        shape, a = a.shape, np.atleast_1d(a).reshape(-1)
        lo, hi = np.ascontiguousarray(a["lo"]), np.ascontiguousarray(a["hi"])
        neg = ~((hi < np.uint64(self.HALF >> 64)) | ((hi == np.uint64(self.HALF >> 64)) & (lo <= np.uint64(0))))
        zero = np.zeros_like(lo)
        # p - x for the negative ones (x < p: no borrow)
        nl, nh = K.sub_words(np.where(neg, np.uint64(_P_LO), zero), np.where(neg, np.uint64(_P_HI), zero),
                             np.where(neg, lo, zero), np.where(neg, hi, zero))
        ml, mh = np.where(neg, nl, lo), np.where(neg, nh, hi)
        k = np.frexp(mh.astype(np.float64))[1].astype(np.uint64)  # mh's bit length, or one more (mh < 2^63)
        big = k > 0
        kk = np.where(big, k, np.uint64(1))
        top = (mh << (np.uint64(64) - kk)) | ((ml >> (kk - np.uint64(1))) >> np.uint64(1))
        top |= ((ml << (np.uint64(64) - kk)) != 0).astype(np.uint64)
        mag = np.where(big, np.ldexp(top.astype(np.float64), kk.astype(np.int64)), ml.astype(np.float64))
        return np.where(neg, -mag, mag).reshape(shape)

    # -- elementwise arithmetic ---------------------------------------------------------------------------
    def _binary(self, a, b, words_fn, loop: str) -> np.ndarray:
        a, b = _elements(a), _elements(b)
        shape = np.broadcast_shapes(a.shape, b.shape)
        kern = K.loaded()
        if kern is not None and int(np.prod(shape)) >= _COMPILED_MIN:
            out = np.empty(shape, dtype=DTYPE)
            getattr(kern, loop)(_as_pairs(np.broadcast_to(a, shape)), _as_pairs(np.broadcast_to(b, shape)),
                                out.reshape(-1).view("<u8").reshape(-1, 2))
            return out
        if len(shape) <= 1 and a.size + b.size <= _CHUNK:
            (a0, a1), (b0, b1) = _words(a), _words(b)
            lo, hi = words_fn(a0, a1, b0, b1)
            return _pack(lo, hi).reshape(shape)
        # a hundred passes over the words: in chunks that stay in the cache they run several times faster
        # (docs/BENCHMARKS_HISTORY.md, "Field128 against Goldilocks"); a one-element side is broadcast in each
        af, bf = (x.reshape(-1) if x.size == 1 or x.shape == shape else np.broadcast_to(x, shape).reshape(-1)
                  for x in (a, b))
        out = np.empty(int(np.prod(shape)), dtype=DTYPE)
        for i in range(0, out.size, _CHUNK):
            j = i + _CHUNK
            ac = af if af.size == 1 else af[i:j]
            bc = bf if bf.size == 1 else bf[i:j]
            out["lo"][i:j], out["hi"][i:j] = words_fn(*(np.ascontiguousarray(c[f]) for c in (ac, bc)
                                                         for f in ("lo", "hi")))
        return out.reshape(shape)

    def add(self, a, b) -> np.ndarray:
        return self._binary(a, b, K.add_words, "add")

    def sub(self, a, b) -> np.ndarray:
        return self._binary(a, b, K.sub_words, "sub")

    def neg(self, a) -> np.ndarray:
        a = _elements(a)
        return self.sub(np.zeros(a.shape, dtype=DTYPE), a)

    def mul(self, a, b) -> np.ndarray:
        return self._binary(a, b, K.mul_words, "mul")

    def scale(self, a, k: int) -> np.ndarray:
        return self.mul(a, self.to_field(int(k)))

    def sum_mod(self, a, axis=None):
        """Sum mod p: a Python int (``axis=None``) or elements (the reduced shape)."""
        a = _elements(a)
        want_int = axis is None
        if want_int:
            kern = K.loaded()
            if kern is not None and a.size >= _COMPILED_MIN:
                lo, hi, top = kern.sum(_as_pairs(a))
                return ((int(top) << 128) + (int(hi) << 64) + int(lo)) % P
            a = a.reshape(-1)
            axis = 0
        if a.shape and a.shape[axis] >= 1 << 32:
            raise InvalidInputError("too many terms for one exact sum")
        lo, hi = a["lo"], a["hi"]
        m32, s32 = np.uint64(0xFFFFFFFF), np.uint64(32)
        limbs = [(lo & m32).sum(axis=axis, dtype=np.uint64), (lo >> s32).sum(axis=axis, dtype=np.uint64),
                 (hi & m32).sum(axis=axis, dtype=np.uint64), (hi >> s32).sum(axis=axis, dtype=np.uint64)]
        if want_int:
            return sum(int(s) << (32 * i) for i, s in enumerate(limbs)) % P
        out_shape = np.shape(limbs[0])
        limbs = [np.atleast_1d(s) for s in limbs]
        total = _pack(limbs[0], np.zeros_like(limbs[0]))  # each limb sum is below 2^64 < p: an element as it is
        for i in (1, 2, 3):
            total = self.add(total, self.mul(_pack(limbs[i], np.zeros_like(limbs[i])), self.to_field(1 << (32 * i))))
        return total.reshape(out_shape)

    def dot(self, a, b) -> int:
        a, b = _elements(a), _elements(b)
        kern = K.loaded()
        if kern is not None and a.shape == b.shape and a.size >= _COMPILED_MIN:
            lo, hi, top = kern.dot(_as_pairs(a), _as_pairs(b))
            return ((int(top) << 128) + (int(hi) << 64) + int(lo)) % P
        return self.sum_mod(self.mul(a, b))

    def powers(self, x: int, n: int, start: int = 0) -> np.ndarray:
        """``[x^start, ..., x^(start+n-1)]`` by doubling (O(log n) vector products)."""
        out = np.empty(n, dtype=DTYPE)
        if n == 0:
            return out
        x = int(x) % P
        out[0] = self.to_field(pow(x, start, P))
        filled, step = 1, x
        while filled < n:
            m = min(filled, n - filled)
            out[filled:filled + m] = self.mul(out[:m], self.to_field(step))
            filled += m
            step = step * step % P
        return out

    def root_of_unity(self, n: int) -> int:
        """A primitive ``n``-th root of unity, ``n`` a power of two ``<= 2^66``."""
        if not isinstance(n, (int, np.integer)) or n < 1 or n & (n - 1) or n > 1 << self.TWO_ADICITY:
            raise InvalidInputError(f"no radix-2 root of unity of order {n} in Field128")
        return pow(self.GENERATOR, (P - 1) // int(n), P)

    def inv(self, x: int) -> int:
        x = int(x) % P
        if x == 0:
            raise InvalidInputError("zero has no inverse")
        return pow(x, P - 2, P)

    # -- NTT ------------------------------------------------------------------------------------------------
    def ntt(self, a, root: int | None = None) -> np.ndarray:
        """``A[i] = sum_j a[j] root^(ij)`` along the last axis (a power-of-two length); ``root`` defaults to
        :meth:`root_of_unity` of that length."""
        a = _elements(a)
        n = a.shape[-1] if a.ndim else 0
        if n < 1 or n & (n - 1):
            raise InvalidInputError(f"an NTT runs over a power-of-two length, not {n}")
        w = self.root_of_unity(n) if root is None else int(root) % P
        tw = _twiddles(w, n)
        a = a[..., bitrev(n)]
        kern = K.loaded()
        if kern is not None and a.size >= _COMPILED_MIN:
            x = np.ascontiguousarray(a)
            kern.ntt(x.reshape(-1).view("<u8").reshape(-1, n, 2), _stage_twiddles(w, n))
            return x
        length = 2
        while length <= n:
            half = length // 2
            blocks = a.reshape(a.shape[:-1] + (n // length, length))
            u = blocks[..., :half]
            v = self.mul(blocks[..., half:], tw[::n // length])
            a = np.concatenate([self.add(u, v), self.sub(u, v)], axis=-1).reshape(a.shape)
            length *= 2
        return a

    def intt(self, a) -> np.ndarray:
        """Inverse of :meth:`ntt` (default root): values at the n-th roots -> coefficients."""
        a = _elements(a)
        n = a.shape[-1]
        return self.scale(self.ntt(a, self.inv(self.root_of_unity(n))), self.inv(n))

    def poly_eval(self, coeffs, x: int) -> int:
        """``sum_i coeffs[i] x^i``: Horner in Python integers when short, else a dot product with the powers."""
        c = _elements(coeffs).reshape(-1)
        x = int(x) % P
        if c.size <= 64:
            acc = 0
            for v in reversed(self.to_ints(c).tolist()):
                acc = (acc * x + v) % P
            return acc
        return self.dot(c, self.powers(x, c.size))

    # -- bytes and key expansion ----------------------------------------------------------------------------
    def to_bytes(self, a) -> bytes:
        return np.ascontiguousarray(_elements(a)).tobytes()

    def from_bytes(self, body: bytes, n: int | None = None, *, what: str = "field vector") -> np.ndarray:
        """16-byte little-endian words -> elements; :class:`MalformedPayload` on a bad length or a word ``>= p``."""
        if len(body) % 16 or (n is not None and len(body) != 16 * n):
            raise MalformedPayload(f"{what} has the wrong length")
        x = np.frombuffer(body, dtype=DTYPE).copy()
        if x.size and not _canonical(x).all():
            raise MalformedPayload(f"{what} holds a word that is not a field element")
        return x

    def expand_field(self, key: bytes, n: int, domain: bytes) -> np.ndarray:
        """``n`` uniform elements from a 32-byte key: ChaCha20 16-byte words below p, in stream order."""
        if not isinstance(key, (bytes, bytearray)) or len(key) != 32:
            raise InvalidInputError("a field expansion key is 32 bytes")
        if not isinstance(domain, bytes) or len(domain) != 12:
            raise InvalidInputError("a field expansion domain is 12 bytes")
        enc = Cipher(algorithms.ChaCha20(bytes(key), b"\x00\x00\x00\x00" + domain), mode=None).encryptor()
        # the keystream is written straight into the array's own buffer (no copy of 16 n bytes); a rejection is
        # rare (< 2^-59 per word), so one pass almost always suffices
        parts, have, want = [], 0, n + 2
        while have < n:
            buf = bytearray(16 * want)
            enc.update_into(bytes(16 * want), buf)
            x = np.frombuffer(buf, dtype=DTYPE)
            if not (x["hi"] < np.uint64(_P_HI)).all():  # only then can a word be >= p
                x = accept_words(bytes(buf))
            parts.append(x)
            have += x.size
            want = max(2, n - have + 2)
        if len(parts) == 1:
            return parts[0][:n]
        return np.concatenate(parts or [np.zeros(0, dtype=DTYPE)])[:n]


FIELD128 = Field128()


@functools.lru_cache(maxsize=16)
def _twiddles(w: int, n: int) -> np.ndarray:
    """``w^j`` for ``j < n / 2`` (read-only, shared); stage ``length`` takes every ``n / length``-th."""
    tw = FIELD128.powers(w, max(n // 2, 1))
    tw.setflags(write=False)
    return tw


@functools.lru_cache(maxsize=16)
def _stage_twiddles(w: int, n: int) -> np.ndarray:
    """The compiled NTT's twiddles: stage by stage in one row per word, ``(2, n - 1)`` (lo, then hi)."""
    tw = _twiddles(w, n)
    parts = [tw[::n // (2 * h)][:h] for h in (1 << i for i in range(n.bit_length() - 1))]
    cat = np.concatenate(parts) if parts else np.zeros(0, dtype=DTYPE)
    out = np.stack([cat["lo"], cat["hi"]])
    out.setflags(write=False)
    return out
