"""The Goldilocks field, its NTT, and a fully linear proof that a secret-shared vector is all bits.

.. warning::

    This is a "Hazardous Materials" module. You should **ONLY** use it if
    you're 100% absolutely sure that you know what you're doing because this
    module is full of land mines, dragons, and dinosaurs with laser guns.
    The recipe API is :mod:`secure_afl.split`.

Field
-----
``F_p`` with ``p = 2^64 - 2^32 + 1``. ``p - 1 = 2^32 * (2^32 - 1)``, so
``F_p^*`` has a subgroup of order ``2^k`` for every ``k <= 32`` (generator 7
gives them all) and radix-2 NTTs of those sizes exist. Elements travel as
little-endian uint64 words in ``[0, p)``; a word ``>= p`` is malformed, never
reduced silently. Vectorised arithmetic works on numpy uint64 arrays: a 64 x 64
bit product is formed from four 32 x 32 bit partial products and reduced with
``2^64 = 2^32 - 1`` and ``2^96 = -1 (mod p)``; every routine here is tested
against Python integers.

A signed integer ``z`` with ``|z| <= (p-1)/2`` is carried as ``z mod p`` and
read back through the centred representative, which is exact; an int64 past
that range is refused (:class:`BoundsExceeded`), never wrapped.

Field elements from a key (:func:`expand_field`): the ChaCha20 keystream read
as uint64 words, words ``>= p`` dropped (rejection, so exactly uniform; a word
is dropped with probability ``2^-32 - 2^-64``).

The proof (:class:`BitProof`)
-----------------------------
Statement: every entry of ``b in F_p^M`` is 0 or 1. The prover holds ``b``;
two verifiers each hold an additive share of ``b`` and of the proof, and the
proof is *fully linear*: each verifier's message is a linear function of its
shares (plus public constants the leader adds), and the sum of the two
messages decides, revealing nothing about ``b`` beyond the verdict (a
zero-knowledge FLP in the sense of Boneh, Boyle, Corrigan-Gibbs, Gilboa and
Ishai, CRYPTO 2019).

Circuit, for joint randomness ``r`` (known to the prover, fixed by a hash of
its committed input)::

    out(b) = sum_{i < M} r^(i+1) * b_i * (b_i - 1)

computed by ``G = ceil(M / c)`` calls of the gadget ``g(u, v) = sum_{j<c} u_j v_j``
(ParallelSum of c multiplications), call ``k`` taking ``u_j = r^(kc+j+1) b_(kc+j)``
and ``v_j = b_(kc+j) - 1`` (entries past ``M`` are 0, whose term is 0).

Proof: with ``N`` the least power of two ``> G`` and ``a`` a primitive N-th
root of unity, wire polynomial ``U_j`` (``V_j``) of degree ``< N`` takes a
random seed at ``a^0``, the value of wire ``j`` of call ``k`` at ``a^(k+1)``,
and 0 at the remaining points. The proof is the ``2c`` seeds and the ``2N - 1``
coefficients of ``P = sum_j U_j V_j`` (degree ``<= 2N - 2``).

Query at ``t`` with ``t^N != 1`` (chosen after the proof is fixed):
each verifier sends, from its shares, ``out = sum_{k<G} P(a^(k+1))``,
``U_j(t)``, ``V_j(t)`` (Lagrange interpolation through its wire shares) and
``P(t)``: ``2c + 2`` elements. Accept iff the sums satisfy ``out = 0`` and
``P(t) = sum_j U_j(t) V_j(t)``.

Soundness: if some ``b_i`` is not a bit, ``out(b)`` is a nonzero polynomial in
``r`` of degree ``<= M``, zero for at most ``M`` values of ``r``. Otherwise
``out != 0`` and an accepting ``out`` share forces ``P(a^(k+1)) != g(wires of
call k)`` for some k, so ``P != sum U_j V_j``, two distinct polynomials of
degree ``<= 2N - 2`` that agree at ``t`` for at most ``2N - 2`` of the
``p - N`` allowed ``t``. One proof: error ``<= M/p + (2N - 2)/(p - N)``, the
first term per choice of ``r`` (a prover that grinds ``q`` hash inputs gets
``q M / p``). Repetition with independent ``r`` and ``t`` multiplies.

Zero knowledge: ``t`` is off the domain, so every Lagrange basis polynomial is
nonzero at ``t`` and the uniform seed makes each ``U_j(t)``, ``V_j(t)``
uniform and independent of ``b``; ``P(t)`` is then fixed by them and ``out = 0``.
A verifier that asks at a domain point would read a wire value: :meth:`BitProof.query`
refuses such ``t``.
"""

from __future__ import annotations

import functools

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from ..exceptions import BoundsExceeded, InvalidInputError, MalformedPayload
from .flp_domain import lagrange_basis, power_sums, query_point

__all__ = [
    "P", "HALF", "GENERATOR", "TWO_ADICITY", "root_of_unity", "inv", "to_field", "encode_signed", "decode_signed",
    "add", "sub", "neg", "mul", "scale", "dot", "sum_mod", "powers", "ntt", "intt", "poly_eval",
    "to_bytes", "from_bytes", "expand_field", "Goldilocks", "GOLDILOCKS", "BitProof",
]

P = (1 << 64) - (1 << 32) + 1
GENERATOR = 7
TWO_ADICITY = 32
_EPS = np.uint64((1 << 32) - 1)  # 2^64 mod p
_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_PU = np.uint64(P)
_CARRY = np.uint64(1 << 32)  # a carry out of the middle partial products, in the high word


def root_of_unity(n: int) -> int:
    """A primitive ``n``-th root of unity, ``n`` a power of two ``<= 2^32``."""
    if n < 1 or n & (n - 1) or n > 1 << TWO_ADICITY:
        raise InvalidInputError(f"no radix-2 root of unity of order {n} in the Goldilocks field")
    return pow(GENERATOR, (P - 1) // n, P)


def inv(x: int) -> int:
    x %= P
    if x == 0:
        raise InvalidInputError("zero has no inverse")
    return pow(x, P - 2, P)


# -- vectorised arithmetic on uint64 arrays of canonical elements ----------------------------------------
def to_field(x) -> np.ndarray:
    """Python ints (any sign or size) -> canonical uint64 elements."""
    return np.array([int(v) % P for v in np.asarray(x, dtype=object).reshape(-1)], dtype=np.uint64)


#: the largest magnitude a signed value carried as ``z mod p`` reads back exactly: ``(p - 1) / 2 = 2^63 - 2^31``
HALF = (P - 1) // 2
_HALF_I = np.int64(HALF)


def encode_signed(z) -> np.ndarray:
    """int64 values with ``|z| <= (p-1)/2`` -> ``z mod p``.

    An int64 can exceed ``(p-1)/2`` (by up to ``2^31``): such a value would come back from
    :func:`decode_signed` as ``z - p`` or ``z + p``, so it raises :class:`BoundsExceeded` instead of wrapping.
    """
    z = np.asarray(z, dtype=np.int64)
    if z.size and (int(z.max()) > HALF or int(z.min()) < -HALF):
        raise BoundsExceeded("a signed value leaves [-(p-1)/2, (p-1)/2] and would wrap in the field")
    u = z.view(np.uint64) if z.flags.c_contiguous else np.ascontiguousarray(z).view(np.uint64)
    # negative z: 2^64 + z as uint64; z mod p = that - 2^64 + p = that - EPS
    return np.where(z < 0, u - _EPS, u).astype(np.uint64)


def decode_signed(x) -> np.ndarray:
    """Centred representatives in ``[-(p-1)/2, (p-1)/2]`` as int64 (always representable).

    A word ``>= p`` is no field element: :class:`MalformedPayload`, never reduced.
    """
    x = np.asarray(x, dtype=np.uint64)
    if x.size and int(x.max()) >= P:
        raise MalformedPayload("a word to decode is not a field element (>= p)")
    neg_part = x > np.uint64(HALF)
    mag = np.where(neg_part, _PU - x, x).astype(np.int64)
    return np.where(neg_part, -mag, mag)


def add(a, b) -> np.ndarray:
    a = np.asarray(a, dtype=np.uint64)
    b = np.asarray(b, dtype=np.uint64)
    s = a + b
    s = s + (s < a).astype(np.uint64) * _EPS  # wrapped: 2^64 = EPS (mod p); cannot wrap again
    return np.where(s >= _PU, s - _PU, s)


def sub(a, b) -> np.ndarray:
    a = np.asarray(a, dtype=np.uint64)
    b = np.asarray(b, dtype=np.uint64)
    d = a - b
    return d - (a < b).astype(np.uint64) * _EPS  # borrowed: a - b + 2^64 - EPS = a - b + p


def neg(a) -> np.ndarray:
    a = np.asarray(a, dtype=np.uint64)
    return np.where(a == 0, a, _PU - a)


def _reduce128(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """``hi 2^64 + lo mod p`` with 2^64 = 2^32 - 1 and 2^96 = -1."""
    hh = hi >> _S32
    t1 = hi & _M32
    t1 = (t1 << _S32) - t1
    r = lo - hh
    r -= (lo < hh) * _EPS
    r += t1
    r += (r < t1) * _EPS
    r -= (r >= _PU) * _PU
    return r


#: the compiled elementwise product (:func:`mul_into`, compiled by :mod:`secure_afl.hazmat.ternary` when a
#: process loads its kernels); None: numpy
_compiled_mul = None
#: fewest products worth the compiled loop (below, the broadcast copies cost more than they save)
_COMPILED_MIN = 256


def mul_into(a, b, out) -> None:
    """``out[i] = a[i] b[i] mod p`` over 1-D uint64 arrays, one element at a time: the same partial products
    and reduction as :func:`mul`, written as a scalar loop for a compiler (every constant uint64, so no
    operation leaves the unsigned 64-bit ring). Interpreted it is slow; it is the source numba compiles."""
    for i in range(a.shape[0]):
        x = a[i]
        y = b[i]
        x0 = x & _M32
        x1 = x >> _S32
        y0 = y & _M32
        y1 = y >> _S32
        lo = x0 * y0
        hi = x1 * y1
        mid = x0 * y1
        mid2 = x1 * y0
        mid += mid2
        hi += np.uint64(mid < mid2) << _S32
        hi += mid >> _S32
        m = mid << _S32
        lo += m
        hi += np.uint64(lo < m)
        hh = hi >> _S32
        t1 = hi & _M32
        t1 = (t1 << _S32) - t1
        r = lo - hh
        r -= np.uint64(lo < hh) * _EPS
        r += t1
        r += np.uint64(r < t1) * _EPS
        r -= np.uint64(r >= _PU) * _PU
        out[i] = r


def mul(a, b) -> np.ndarray:
    """Elementwise product (broadcasting) of canonical elements."""
    a = np.asarray(a, dtype=np.uint64)
    b = np.asarray(b, dtype=np.uint64)
    if a.ndim == 0 and b.ndim == 0:  # numpy scalars warn on the wrap-arounds the array path relies on
        return np.uint64(int(a) * int(b) % P)
    if _compiled_mul is not None and max(a.size, b.size) >= _COMPILED_MIN:
        # a verifier's queries make many products of a few thousand elements: numpy's fourteen temporaries
        # per product cost ten times the loop (docs/BENCHMARKS.md, "Proof arithmetic")
        a, b = np.broadcast_arrays(a, b)
        out = np.empty(a.shape, dtype=np.uint64)
        _compiled_mul(np.ascontiguousarray(a).reshape(-1), np.ascontiguousarray(b).reshape(-1), out.reshape(-1))
        return out
    a0, a1 = a & _M32, a >> _S32
    b0, b1 = b & _M32, b >> _S32
    # every product below has the broadcast shape, so the in-place steps (fewer temporaries) are safe
    lo = a0 * b0
    hi = a1 * b1
    mid = a0 * b1
    mid2 = a1 * b0
    mid += mid2
    hi += (mid < mid2) * _CARRY  # the middle sum wrapped: 2^64 of it is 2^96 of the product
    hi += mid >> _S32
    mid <<= _S32
    lo += mid
    hi += lo < mid  # the low word wrapped
    return _reduce128(hi, lo)


def scale(a, k: int) -> np.ndarray:
    return mul(a, np.uint64(int(k) % P))


def sum_mod(a, axis=None):
    """Sum of canonical elements mod p (exact: the 32-bit halves are summed separately)."""
    a = np.asarray(a, dtype=np.uint64)
    if a.shape and a.shape[axis if axis is not None else 0] >= 1 << 31:
        raise InvalidInputError("too many terms for one exact sum")
    lo = (a & _M32).sum(axis=axis, dtype=np.uint64)
    hi = (a >> _S32).sum(axis=axis, dtype=np.uint64)
    if axis is None:
        return (int(hi) * (1 << 32) + int(lo)) % P
    if np.ndim(lo) == 0:  # a 1-D sum: numpy scalars would warn on the wrap-arounds below
        return np.uint64((int(hi) * (1 << 32) + int(lo)) % P)
    # hi * 2^32 + lo, reduced: hi < 2^63, so reduce hi first
    return add(_reduce128(hi >> _S32, (hi & _M32) << _S32), _reduce128(np.zeros_like(lo), lo))


def dot(a, b) -> int:
    return sum_mod(mul(a, b))


def powers(x: int, n: int, start: int = 0) -> np.ndarray:
    """``[x^start, x^(start+1), ..., x^(start+n-1)]`` by doubling (O(log n) vector products)."""
    out = np.empty(n, dtype=np.uint64)
    if n == 0:
        return out
    out[0] = pow(int(x) % P, start, P)
    filled, step = 1, int(x) % P
    while filled < n:
        m = min(filled, n - filled)
        out[filled:filled + m] = mul(out[:m], np.uint64(step))
        filled += m
        step = step * step % P
    return out


# -- NTT ------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=32)
def bitrev(n: int) -> np.ndarray:
    bits = n.bit_length() - 1
    idx = np.arange(n)
    rev = np.zeros(n, dtype=np.int64)
    for b in range(bits):
        rev |= ((idx >> b) & 1) << (bits - 1 - b)
    rev.setflags(write=False)
    return rev


@functools.lru_cache(maxsize=256)
def _twiddles(w: int, n: int, length: int) -> np.ndarray:
    """The first ``length / 2`` powers of ``w^(n / length)``, one butterfly stage's (read-only, shared)."""
    tw = powers(pow(w, n // length, P), length // 2)
    tw.setflags(write=False)
    return tw


def ntt(a, root: int | None = None) -> np.ndarray:
    """``A[i] = sum_j a[j] root^(ij)`` along the last axis (length a power of two); ``root`` defaults
    to :func:`root_of_unity` of that length."""
    a = np.asarray(a, dtype=np.uint64)
    n = a.shape[-1]
    w = root_of_unity(n) if root is None else int(root)
    a = a[..., bitrev(n)].copy()
    length = 2
    while length <= n:
        half = length // 2
        tw = _twiddles(w, n, length)
        blocks = a.reshape(a.shape[:-1] + (n // length, length))
        u = blocks[..., :half]
        v = mul(blocks[..., half:], tw)
        blocks = np.concatenate([add(u, v), sub(u, v)], axis=-1)
        a = blocks.reshape(a.shape)
        length *= 2
    return a


def intt(a) -> np.ndarray:
    """Inverse of :func:`ntt` (default root): values at the n-th roots -> coefficients."""
    a = np.asarray(a, dtype=np.uint64)
    n = a.shape[-1]
    return scale(ntt(a, inv(root_of_unity(n))), inv(n))


def poly_eval(coeffs, x: int) -> int:
    """Horner in Python integers (short polynomials)."""
    acc = 0
    for c in reversed([int(v) for v in np.asarray(coeffs).reshape(-1)]):
        acc = (acc * x + c) % P
    return acc


# -- bytes and key expansion ----------------------------------------------------------------------------
def to_bytes(a) -> bytes:
    return np.asarray(a, dtype=np.uint64).astype("<u8", copy=False).tobytes()


def from_bytes(body: bytes, n: int | None = None, *, what: str = "field vector") -> np.ndarray:
    """Little-endian words -> elements; :class:`MalformedPayload` on a bad length or a word ``>= p``."""
    if len(body) % 8 or (n is not None and len(body) != 8 * n):
        raise MalformedPayload(f"{what} has the wrong length")
    x = np.frombuffer(body, dtype="<u8").astype(np.uint64)
    if x.size and int(x.max()) >= P:
        raise MalformedPayload(f"{what} holds a word that is not a field element")
    return x


def expand_field(key: bytes, n: int, domain: bytes) -> np.ndarray:
    """``n`` uniform elements from a 32-byte key: ChaCha20 words below p, in stream order."""
    if not isinstance(key, (bytes, bytearray)) or len(key) != 32:
        raise InvalidInputError("a field expansion key is 32 bytes")
    if not isinstance(domain, bytes) or len(domain) != 12:
        raise InvalidInputError("a field expansion domain is 12 bytes")
    enc = Cipher(algorithms.ChaCha20(bytes(key), b"\x00\x00\x00\x00" + domain), mode=None).encryptor()
    out = np.empty(0, dtype=np.uint64)
    want = n + 8 + n // (1 << 20)  # a rejection is rare (2^-32): one pass almost always suffices
    while out.size < n:
        words = np.frombuffer(enc.update(bytes(8 * want)), dtype="<u8").astype(np.uint64)
        out = np.concatenate([out, words[words < _PU]])
        want = max(8, n - out.size + 8)
    return out[:n]


# -- the field as an object (secure_afl.hazmat.fields names every field a session may sign) ---------------
class Goldilocks:
    """The Goldilocks field (``p = 2^64 - 2^32 + 1``, :mod:`secure_afl.hazmat.flp`'s arithmetic) as a field
    object. Elements are uint64 arrays; ``name`` is what the signed parameters and the joint randomness carry."""

    name = "goldilocks"
    P = P
    HALF = HALF
    GENERATOR = GENERATOR
    TWO_ADICITY = TWO_ADICITY
    ENCODED_SIZE = 8
    dtype = np.dtype(np.uint64)

    def __setattr__(self, key, value):
        raise AttributeError("a field object is immutable")

    def __repr__(self) -> str:
        return "GOLDILOCKS"

    def zeros(self, shape) -> np.ndarray:
        return np.zeros(shape, dtype=np.uint64)

    def ones(self, shape) -> np.ndarray:
        return np.ones(shape, dtype=np.uint64)

    def to_ints(self, a) -> np.ndarray:
        a = np.asarray(a, dtype=np.uint64)
        out = np.empty(a.shape, dtype=object)
        out.reshape(-1)[:] = [int(v) for v in a.reshape(-1)]
        return out

    def decode_signed_float(self, a) -> np.ndarray:
        return decode_signed(a).astype(np.float64)  # |z| < 2^63: int64 -> float64 rounds half to even

    def canonical(self, a, what: str = "field vector") -> np.ndarray:
        """``a`` as this field's array; :class:`MalformedPayload` if an element is not in ``[0, p)``."""
        a = np.asarray(a, dtype=np.uint64)
        if a.size and int(a.max()) >= P:
            raise MalformedPayload(f"{what} holds a word that is not a field element")
        return a



for _name in ("root_of_unity", "inv", "to_field", "encode_signed", "decode_signed", "add", "sub", "neg", "mul",
              "scale", "sum_mod", "dot", "powers", "ntt", "intt", "poly_eval", "to_bytes", "from_bytes",
              "expand_field"):
    setattr(Goldilocks, _name, staticmethod(globals()[_name]))
del _name

GOLDILOCKS = Goldilocks()


# -- the bit proof --------------------------------------------------------------------------------------
class BitProof:
    """FLP that a length-``length`` shared vector is all bits (module docstring), over ``field`` (a field object:
    :data:`GOLDILOCKS` or :data:`secure_afl.hazmat.field128.FIELD128`; the soundness terms divide by its p).

    Shapes: proof ``proof_len = 2c + 2N - 1`` elements; verifier message ``verifier_len = 2c + 2``.
    ``chunk`` (c) defaults to the one that minimises the proof for this length.
    """

    def __init__(self, length: int, chunk: int | None = None, field=None):
        if not isinstance(length, int) or length < 1:
            raise InvalidInputError("a bit proof covers at least one entry")
        if chunk is None:
            best = None
            for log_n in range(1, 21):
                n = 1 << log_n
                c = -(-length // (n - 1))
                size = 2 * c + 2 * n - 1
                if best is None or size < best[0]:
                    best = (size, c)
            chunk = best[1]
        if not isinstance(chunk, int) or chunk < 1:
            raise InvalidInputError("the gadget's arity is a positive integer")
        self.F = GOLDILOCKS if field is None else field
        self.length = length
        self.chunk = chunk
        self.calls = -(-length // chunk)
        n = 2
        while n <= self.calls:
            n *= 2
        self.n = n
        self.proof_len = 2 * chunk + 2 * n - 1
        self.verifier_len = 2 * chunk + 2
        self._alpha = self.F.root_of_unity(n)
        # out = sum_{k<G} P(alpha^(k+1)) = sum_e coef_e * w_e with w_e = sum_{k=1..G} alpha^(k e)
        self._out_weights = None

    # layout of the gadget inputs: (G, c) matrices of u (= r^(i+1) b_i) and v (= b_i - 1)
    def _wires(self, bits: np.ndarray, joint_rand: int, leader: bool) -> tuple[np.ndarray, np.ndarray]:
        F = self.F
        padded = F.zeros(self.calls * self.chunk)
        padded[:self.length] = bits
        u = F.mul(padded, F.powers(joint_rand, padded.size, start=1))
        v = F.sub(padded, F.ones(1)) if leader else padded
        return u.reshape(self.calls, self.chunk), v.reshape(self.calls, self.chunk)

    def _check(self, x, n: int, what: str) -> np.ndarray:
        x = np.asarray(x, dtype=self.F.dtype).reshape(-1)
        if x.shape[0] != n:
            raise MalformedPayload(f"{what} has {x.shape[0]} elements, expected {n}")
        if x.dtype == np.uint64:
            if x.size and int(x.max()) >= self.F.P:
                raise MalformedPayload(f"{what} holds a word that is not a field element")
            return x
        return self.F.from_bytes(self.F.to_bytes(x), what=what)  # refuses an element >= p

    def prove(self, bits, joint_rand: int, seeds) -> np.ndarray:
        """The proof for ``bits`` (the whole vector, not a share); ``seeds``: 2c uniform elements."""
        return self.prove_reps(bits, [joint_rand], [seeds])[0]

    def prove_reps(self, bits, joint_rands, seeds_list) -> list[np.ndarray]:
        """One proof of the same ``bits`` per joint randomness (independent repetitions), each equal to
        :meth:`prove` with its seeds.

        P = sum_j U_j V_j has degree <= 2N - 2: its values on the 2N-th roots b^i (b^2 = a) determine it.
        The even ones are the wires themselves (b^(2m) = a^m); the odd ones, at b a^m, are one N-point NTT
        of each wire polynomial's coefficients scaled by b^e / N (evaluation on the coset), half the work
        of a 2N-point transform. The V wires (b - 1) do not depend on the joint randomness and their seed
        enters linearly, so their coset values are computed once for every repetition."""
        F = self.F
        bits = self._check(bits, self.length, "the bit vector")
        seeds_list = [self._check(s, 2 * self.chunk, "the proof seeds") for s in seeds_list]
        if len(seeds_list) != len(joint_rands):
            raise InvalidInputError("one seed vector per joint randomness")
        c, n, G = self.chunk, self.n, self.calls
        coset = F.scale(F.powers(F.root_of_unity(2 * n), n), F.inv(n))
        inv_alpha = F.inv(self._alpha)

        def odd(values: np.ndarray) -> np.ndarray:
            return F.ntt(F.mul(F.ntt(values, inv_alpha), coset))

        padded = F.zeros(G * c)
        padded[:self.length] = bits
        v = F.sub(padded, F.ones(1)).reshape(G, c)
        v_even = F.zeros((c, n))  # the seed column (index 0) is added per repetition
        v_even[:, 1:G + 1] = v.T
        v_odd0 = odd(v_even)
        delta = F.zeros((1, n))
        delta[0, 0] = F.ones(1)[0]
        delta_odd = odd(delta)[0]
        proofs = []
        for joint_rand, seeds in zip(joint_rands, seeds_list):
            u, _ = self._wires(bits, joint_rand, leader=True)
            u_even = F.zeros((c, n))
            u_even[:, 0] = seeds[:c]
            u_even[:, 1:G + 1] = u.T
            v_even[:, 0] = seeds[c:]
            v_odd = F.add(v_odd0, F.mul(seeds[c:].reshape(-1, 1), delta_odd))
            prod = F.zeros(2 * n)
            prod[0::2] = F.sum_mod(F.mul(u_even, v_even), axis=0)
            prod[1::2] = F.sum_mod(F.mul(odd(u_even), v_odd), axis=0)
            p_coeffs = F.intt(prod)
            if int(F.to_ints(p_coeffs[-1:])[0]) != 0:  # pragma: no cover - degree <= 2N - 2 by construction
                raise AssertionError("gadget polynomial degree")
            proofs.append(np.concatenate([seeds, p_coeffs[:-1]]))
        return proofs

    def out_weights(self) -> np.ndarray:
        if self._out_weights is None:  # the call points alpha^(k+1), k < G
            self._out_weights = power_sums(self.F, self.F.powers(self._alpha, self.calls, start=1), 2 * self.n - 1)
        return self._out_weights

    def query(self, bits_share, proof_share, joint_rand: int, t: int, *, leader: bool) -> np.ndarray:
        """One verifier's message (linear in its shares); the leader adds the constants."""
        F = self.F
        bits_share = self._check(bits_share, self.length, "the bit vector share")
        proof_share = self._check(proof_share, self.proof_len, "the proof share")
        t = query_point(F, self.n, t)
        c = self.chunk
        u, v = self._wires(bits_share, joint_rand, leader)
        lag = lagrange_basis(F, self.n, self._alpha, t)
        seeds, p_coeffs = proof_share[:2 * c], proof_share[2 * c:]
        lam_calls = lag[1:self.calls + 1].reshape(-1, 1)
        u_t = F.add(F.mul(seeds[:c], lag[0:1]), F.sum_mod(F.mul(u, lam_calls), axis=0))
        v_t = F.add(F.mul(seeds[c:], lag[0:1]), F.sum_mod(F.mul(v, lam_calls), axis=0))
        out = F.dot(p_coeffs, self.out_weights())
        return np.concatenate([F.to_field([out]), u_t, v_t, F.to_field([F.poly_eval(p_coeffs, t)])])

    def decide(self, verifier) -> bool:
        """Accept iff ``out = 0`` and ``P(t) = sum_j U_j(t) V_j(t)``; ``verifier`` is the SUM of both messages."""
        F = self.F
        verifier = self._check(verifier, self.verifier_len, "the verifier message")
        c = self.chunk
        ends = F.to_ints(verifier[[0, -1]])
        if int(ends[0]) != 0:
            return False
        return F.dot(verifier[1:1 + c], verifier[1 + c:1 + 2 * c]) == int(ends[1])
