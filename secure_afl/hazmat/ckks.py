"""CKKS primitives for additive aggregation, on TenSEAL 0.3.18 (Microsoft SEAL).

.. danger::

   This is a "Hazardous Materials" module. You should **ONLY** use it if you're
   100% absolutely sure that you know what you're doing because this module is
   full of land mines, dragons, and dinosaurs with laser guns. The recipe that
   the server, the key holder and the hospitals use is
   :mod:`secure_afl.backends.ckks`; it checks bounds, binds every payload to
   its session and refuses secret keys where they do not belong. Nothing here
   does.

What this module provides
-------------------------
* :class:`CKKSParameters` and :func:`select_parameters`: ``(N, coeff bits,
  scale)`` chosen from the declared aggregate bound so the K-client sum
  provably cannot wrap, and :func:`expected_abs_error`, the precision bound.
* :func:`generate_context`, :func:`serialize_public`, :func:`serialize_secret`,
  :func:`load_context`: fresh asymmetric keys; a public context holds the
  public key only (no secret, relinearisation or Galois keys: sums need none).
* :func:`encrypt_vector`, :func:`load_chunks`, :func:`add_chunks`,
  :func:`dump_chunks`, :func:`decrypt_chunks`: a float64 vector of length L is
  cut into chunks of at most N/2 values (a new chunk at every break the caller
  names: the backend puts the counts in a chunk of their own), one CKKS
  ciphertext (``CKKSVector``) each, serialised length-prefixed in the compact
  wire form of :func:`pack_chunk` (residues at their primes' bit width).
* :func:`flood_decrypt` and its sizing (:func:`key_error_bound`,
  :func:`flood_coefficient_sigma`, :func:`flooded_tolerance`): the key
  holder's ONE decryption, flooded in the coefficient domain before decoding
  (the proof is in ``keyholder/flooding.py``).
* a secret context at rest is sealed with :mod:`secure_afl.hazmat.at_rest`
  at rest (scrypt or a raw 32-byte key, AES-256-GCM).

Every TenSEAL/SEAL exception is caught here and re-raised as a typed
:mod:`secure_afl.exceptions` error; no C++ exception text leaves this module.

Notation
--------
N      ring degree (``poly_modulus_degree``); n = N/2 slots per ciphertext.
q_i    the coefficient primes; the LAST one (P) is SEAL's special prime, used
       only during encryption (and key switching, which sums never need).
Q      = prod of the data primes q_0 .. q_{l-1}; a fresh ciphertext lives
       mod Q and, since we never rescale, so does every sum of them.
D      = sum of the data primes' bit sizes; l = number of data primes.
Delta  = 2^s, the global scale.
A      the declared aggregate bound, ``Bounds.aggregate_bound(gamma)`` =
       K_max * max(n_max B^2 + gamma, n_max B, n_max, 1).

Headroom: why a K-client sum cannot wrap
----------------------------------------
1. Encoding. A real vector z (n slots) becomes m = round(Delta * tau^{-1}(z)),
   with tau^{-1}(z)_j = (1/N) sum_i z_i zeta_i^{-j} over the N primitive 2N-th
   roots (z extended by conjugates). Each term has modulus |z_i|, so
   ``|m_j| <= Delta * ||z||_inf + 1/2``.
2. Encryption with the public key (b, a) = (-a s + e, a): SEAL encrypts at the
   key level Q*P and divides by P with rounding, so
   ``c0 + c1 s = m + e_fresh (mod Q)`` with
   e_fresh = r0 + r1 s + (v e + e0 + e1 s)/P, |r0|,|r1| <= 1/2, s, v ternary,
   Gaussians clipped at 6 sigma = 19.2, so
   ``||e_fresh||_inf <= 1/2 + N/2 + (2N + 1) 19.2 / P <= N/2 + 1``
   (P >= 2^39, N <= 2^15).
3. Addition is coefficient-wise mod Q: the sum of K ciphertexts decrypts to
   ``M + E (mod Q)`` with M = sum_k m_k, E = sum_k e_fresh_k. Decoding reads
   the centred representative, which equals M + E exactly iff
   ||M + E||_inf < Q/2. Otherwise the result is GARBAGE AND NO ERROR IS
   RAISED (tests/test_ckks.py::test_raw_tenseal_wraps_silently).
4. Because sum_k ||z_k||_inf <= A and K <= K_max, a sufficient condition is
   ``Delta * A + K_max * (N + 2) < Q / 2``.
   The primes are the ones SEAL's ``CoeffModulus::Create(N, bits)`` picks
   (deterministic), so Q is known exactly; we keep MARGIN_BITS in reserve
   and require::

       Delta * A + K_max * (N + 2) <= Q / 2^(1 + MARGIN_BITS)             (H)

   i.e. ``A <= max_aggregate = (Q / 2^(1 + MARGIN_BITS) - K_max (N + 2)) / 2^s``.
   E.g. N = 4096, one 60-bit data prime, s = 38: max_aggregate ~ 2^20.
   (H) also keeps every single encoding below SEAL's own "encoded values are
   too large" limit.

Precision: the error bound
--------------------------
The decoded slot i of a K-sum is sum_k z_k,i + Re(tau(E)_i)/Delta + float64
rounding, E = sum_k (u_k + r0_k + r1_k s) (u_k: encoding rounding; the /P
terms are < 2^-20 and dropped). Coefficients of u, r0, r1 are independent and
roughly uniform on [-1/2, 1/2] (variance 1/12); tau(r1 s)_i = tau(r1)_i tau(s)_i.
Given the key s, the real part of slot i therefore has variance::

    v_i = K * (N/24) * (2 + |tau(s)_i|^2) / Delta^2

|tau(s)_i|^2 is about exponential with mean 2N/3 (s ternary, variance 2/3), so
except with probability 2^-30 per key, max_i |tau(s)_i|^2 <= (2N/3) t with
t = ln(N/2) + 30 ln 2. A Gaussian tail of z = sqrt(2 ln 2^41) ~ 7.55
standard deviations fails with probability <= 2^-40 per slot, so::

    noise_bound(K) = 7.55 * sqrt(K * (N/24) * (2 + (2N/3) t)) / Delta

(N = 8192, s = 40: 5.1e-8 at K = 1, 1.6e-7 at K = 10, 5.1e-7 at K = 100).
The heavy tail of the product term is why the bound is ~40 times the average
standard deviation sqrt(K N (2 + 2N/3) / 24) / Delta (1.2e-9 at K = 1, which
matches the measured 1.24e-9; measured maxima over 12k slots are 7-9 standard
deviations, not the ~4 a Gaussian would give).

Encoding and decoding run an FFT in float64, which adds a relative error:
measured std 1.5e-16 and max 7.6e-16 times the magnitude of the values in the
ciphertext. We bound it by FLOAT_REL * M with FLOAT_REL = 2^-46 and M the sum
over clients of their largest |entry| (<= A). In total::

    expected_abs_error = noise_bound(K) + 2^-46 * M                       (E)

The first term depends only on (N, s, K). The second is a float64 property
of any pipeline that handles values of magnitude M; FLOAT_REL is MEASURED, not
proved. (E) is the bare decryption's error, which never leaves the key holder.

The flooded release
-------------------
What the key holder releases is the decode of M + E + G, G a fresh rounded
Gaussian of standard deviation sigma on every coefficient of every chunk
(:func:`flood_decrypt`). Slot i then carries Re tau(G)_i / Delta, Gaussian
with standard deviation ``sigma sqrt(N/2) / Delta`` (:func:`slot_sigma`),
plus at most ``N (K (N/2 + 1) + K/2 + 1/2) / Delta`` from E, the encodings'
rounding and G's (:func:`fixed_slot_error`, proved), plus the decode's
FLOAT_REL times the magnitude. sigma is sized by (F) in
``keyholder/flooding.py`` from :func:`key_error_bound`; with it
:func:`select_parameters` meets ``max_abs_error`` for the flooded release
and keeps G's coefficients inside (H).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import tenseal.sealapi as sealapi

from ..exceptions import InvalidParameterError
from ._tenseal import add_chunks, context_sha256, serialize_public, serialize_secret
from .ckks_flooding import (FLOAT_REL, FLOOD_QUERIES, KAPPA, KEY_ERROR_MODELS, TAIL_BITS, check_key_error_model,
                            fixed_error_at, fixed_slot_error, flood_coefficient_bound, flood_coefficient_sigma,
                            flood_decrypt, flood_sigma_for, flooded_tolerance, gaussian_integers, key_error_at,
                            key_error_bound, slot_sigma, tail_z, worst_key_error)
from .seal_format import (ciphertext_words, decrypt_chunks, dump_chunks, encrypt_vector, generate_context,
                          load_chunks, load_context, pack_chunk, primes_of, seal_ciphertext, unpack_chunk)

__all__ = [
    "CKKSParameters",
    "RING_DEGREES",
    "SEAL_MAX_COEFF_BITS",
    "MARGIN_BITS",
    "FLOAT_REL",
    "select_parameters",
    "noise_bound",
    "expected_abs_error",
    "generate_context",
    "serialize_public",
    "serialize_secret",
    "load_context",
    "context_sha256",
    "encrypt_vector",
    "load_chunks",
    "add_chunks",
    "dump_chunks",
    "decrypt_chunks",
    "KAPPA",
    "FLOOD_QUERIES",
    "TAIL_BITS",
    "KEY_ERROR_MODELS",
    "key_error_bound",
    "worst_key_error",
    "flood_coefficient_sigma",
    "slot_sigma",
    "fixed_slot_error",
    "tail_z",
    "flood_decrypt",
    "gaussian_integers",
    "flood_coefficient_bound",
    "flooded_tolerance",
    "ciphertext_words",
    "pack_chunk",
    "unpack_chunk",
    "primes_of",
    "seal_ciphertext",
]

#: SEAL's largest total coefficient-modulus bit count for 128-bit classical
#: security (HomomorphicEncryption.org standard, ternary secret), per N.
SEAL_MAX_COEFF_BITS = {4096: 109, 8192: 218, 16384: 438, 32768: 881}

#: Bits held in reserve below the provable Q/2 lower bound (factor 4).
MARGIN_BITS = 1

#: Largest scale: the flooding grows with K, and a larger scale (spread over several primes) buys it back.
MAX_SCALE_BITS = 90

# Gaussian tail (<= 2^-40 per slot) and key tail (<= 2^-30 per key) constants.
_Z_SLOT = math.sqrt(2.0 * 41.0 * math.log(2.0))
_T_KEY_EXTRA = 30.0 * math.log(2.0)


@dataclass(frozen=True)
class CKKSParameters:
    """One CKKS parameter set for rescale-free sums.

    Parameters
    ----------
    poly_modulus_degree : int
        N; a ciphertext holds N/2 values.
    coeff_mod_bit_sizes : tuple of int
        Bit sizes of the coefficient primes; the last is SEAL's special prime.
    scale_bits : int
        s, the global scale is 2^s.
    """

    poly_modulus_degree: int
    coeff_mod_bit_sizes: tuple
    scale_bits: int

    def __post_init__(self):
        n = self.poly_modulus_degree
        bits = tuple(self.coeff_mod_bit_sizes)
        object.__setattr__(self, "coeff_mod_bit_sizes", bits)
        caller = "CKKSParameters"
        if isinstance(n, bool) or not isinstance(n, int) or n not in SEAL_MAX_COEFF_BITS:
            raise InvalidParameterError(
                f"The 'poly_modulus_degree' parameter of {caller} must be one of "
                f"{sorted(SEAL_MAX_COEFF_BITS)}. Got {n!r} instead."
            )
        if len(bits) < 2 or any(isinstance(b, bool) or not isinstance(b, int) or not 20 <= b <= 60 for b in bits):
            raise InvalidParameterError(
                f"The 'coeff_mod_bit_sizes' parameter of {caller} must be at least two ints in "
                f"[20, 60]. Got {list(bits)!r} instead."
            )
        if sum(bits) > SEAL_MAX_COEFF_BITS[n]:
            raise InvalidParameterError(
                f"coeff_mod_bit_sizes={list(bits)} total {sum(bits)} bits, above the 128-bit security "
                f"limit {SEAL_MAX_COEFF_BITS[n]} for poly_modulus_degree={n}; use fewer or smaller primes "
                "or a larger poly_modulus_degree."
            )
        s = self.scale_bits
        if isinstance(s, bool) or not isinstance(s, int) or not 20 <= s <= MAX_SCALE_BITS:
            raise InvalidParameterError(
                f"The 'scale_bits' parameter of {caller} must be an int in the range [20, {MAX_SCALE_BITS}]. "
                f"Got {s!r} instead."
            )
        if bits[-1] < 39:
            # the encryption noise bound (module docstring, step 2) needs P >= 2^39
            raise InvalidParameterError(
                f"the special (last) prime of coeff_mod_bit_sizes={list(bits)} must have at least 39 bits."
            )
        if self.headroom_bits <= s:
            raise InvalidParameterError(
                f"scale_bits={s} leaves no headroom in a {self.data_bits}-bit data modulus; "
                "lower scale_bits or add data primes."
            )

    # -- geometry ------------------------------------------------------------
    @property
    def slots(self) -> int:
        return self.poly_modulus_degree // 2

    @property
    def data_bits(self) -> int:
        """D: bits of the data modulus Q (all primes but the special one)."""
        return sum(self.coeff_mod_bit_sizes[:-1])

    @property
    def n_data_primes(self) -> int:
        return len(self.coeff_mod_bit_sizes) - 1

    @property
    def scale(self) -> float:
        return float(2 ** self.scale_bits)

    @property
    def data_modulus(self) -> int:
        """Q, the product of the data primes SEAL picks for these bit sizes."""
        return _data_modulus(self.poly_modulus_degree, self.coeff_mod_bit_sizes)

    @property
    def headroom_bits(self) -> float:
        """log2 of the usable coefficient bound Q / 2^(1 + MARGIN_BITS) (condition (H))."""
        return math.log2(self.data_modulus) - 1 - MARGIN_BITS

    def n_chunks(self, length: int, breaks: Sequence[int] = ()) -> int:
        return len(self.spans(length, breaks))

    def spans(self, length: int, breaks: Sequence[int] = ()) -> list:
        """``[(start, stop), ...]``: the values of each ciphertext chunk. A new chunk starts at every
        multiple of N/2 counted from the previous break and at every break (0 < break < length), so a
        block that starts at a break (the counts) never shares a ciphertext with what precedes it."""
        length = int(length)
        cuts = sorted({0, length, *(int(b) for b in breaks if 0 < int(b) < length)})
        out = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            out += [(x, min(x + self.slots, b)) for x in range(a, b, self.slots)]
        return out or [(0, 0)]

    def max_aggregate(self, n_clients: int, flood: float = 0.0) -> float:
        """Largest sum_k ||z_k||_inf that condition (H) admits for ``n_clients`` ciphertexts, leaving
        ``flood`` (a bound on the flooding polynomial's coefficients, :func:`flood_decrypt`) on top."""
        room = (self.data_modulus / 2.0 ** (1 + MARGIN_BITS) - float(n_clients) * (self.poly_modulus_degree + 2)
                - float(flood))
        return max(room, 0.0) / self.scale

    def approx_bytes_per_value(self) -> float:
        """Serialized ciphertext bytes per packed value: 2 polys x N coeffs x D bits / (N/2) slots."""
        return self.data_bits / 2.0

    # -- dict form (goes into SessionParams.backend_params) --------------------
    def to_dict(self) -> dict:
        return {
            "poly_modulus_degree": int(self.poly_modulus_degree),
            "coeff_mod_bit_sizes": [int(b) for b in self.coeff_mod_bit_sizes],
            "scale_bits": int(self.scale_bits),
        }

    @classmethod
    def from_dict(cls, d) -> "CKKSParameters":
        try:
            return cls(
                d["poly_modulus_degree"], tuple(d["coeff_mod_bit_sizes"]), d["scale_bits"]
            )
        except (KeyError, TypeError):
            raise InvalidParameterError(
                "ckks backend_params must hold 'poly_modulus_degree', 'coeff_mod_bit_sizes' and "
                f"'scale_bits'. Got {dict(d) if hasattr(d, 'keys') else d!r} instead."
            ) from None


#: Ring degrees tried, smallest first (all give 128-bit security within SEAL_MAX_COEFF_BITS).
RING_DEGREES: tuple = (4096, 8192, 16384, 32768)
#: Bit size of SEAL's special prime when the security budget allows it (>= 39 always).
SPECIAL_PRIME_BITS = 60


def noise_bound(params: CKKSParameters, n_clients: int) -> float:
    """High-probability bound on the value-independent error of a K-sum (first term of (E))."""
    return _noise(params.poly_modulus_degree, n_clients, params.scale)


def _noise(n: int, n_clients: int, scale: float) -> float:
    n = float(n)
    k = max(int(n_clients), 1)
    t = math.log(n / 2.0) + _T_KEY_EXTRA
    var = k * (n / 24.0) * (2.0 + (2.0 * n / 3.0) * t)
    return _Z_SLOT * math.sqrt(var) / scale


def expected_abs_error(params: CKKSParameters, n_clients: int, magnitude: float) -> float:
    """Bound (E) on |decrypted sum - true sum| per entry.

    Parameters
    ----------
    params : CKKSParameters
    n_clients : int
        K, ciphertexts summed.
    magnitude : float
        M = sum over clients of max |entry| (the declared aggregate bound A is
        always a valid choice; the actual value gives a tighter bound).
    """
    return noise_bound(params, n_clients) + FLOAT_REL * float(magnitude)


def select_parameters(aggregate_bound: float, k_max: int, *, max_abs_error: float = 1e-6,
                      max_poly_modulus_degree: int = 16384, length: int | None = None,
                      breaks: Sequence[int] = (), key_error: str = "heuristic") -> CKKSParameters:
    """The smallest modulus chain that holds ``aggregate_bound`` for ``k_max`` clients at ``max_abs_error``.

    Sums need no multiplication, so the chain is data primes + SEAL's special
    prime with no spare level (SEAL, through TenSEAL, needs the special prime:
    a one-prime chain is refused, "keyswitching is not supported"). For each
    ring degree N and number of data primes l:

    1. the scale 2^s is the smallest whose error meets ``max_abs_error`` at K = k_max: without
       ``length``, the bare decryption's ``noise_bound``; with ``length`` (the values of one
       release, cut into chunks at ``breaks``), the value-independent part of the FLOODED
       release's bound (:func:`flooded_tolerance` at magnitude 0, all chunks' coefficients
       flooded at once, the key error bounded by the ``key_error`` model of :func:`key_error_bound`);
    2. the data primes get the fewest bits b with condition (H):
       ``2^s A + K (N + 2) + G <= Q / 2^(1 + MARGIN_BITS)`` with Q the product of
       the l primes SEAL picks (b <= 60) and G the flooding polynomial's coefficient bound;
    3. the special prime has ``min(60, budget - l b)`` bits, at least 39, where
       the budget is the HomomorphicEncryption.org 128-bit limit for N
       (:data:`SEAL_MAX_COEFF_BITS`);
    4. the scale is then raised as far as those primes allow: the bytes are the same, the
       flooded error halves with every bit.

    Among the sets that qualify, the one with the fewest data bits (bytes on
    the wire ~ l b / 2 per value) wins, then the smaller N (whose flooding is smaller: the slot
    noise grows like N at a fixed number of values).

    Raises
    ------
    InvalidParameterError
        When no set qualifies at 128-bit security; the message names the fix.
    """
    if not (isinstance(aggregate_bound, (int, float)) and math.isfinite(aggregate_bound) and aggregate_bound > 0):
        raise InvalidParameterError(
            f"The 'aggregate_bound' parameter of select_parameters must be a finite float > 0. "
            f"Got {aggregate_bound!r} instead."
        )
    if not (isinstance(max_abs_error, (int, float)) and math.isfinite(max_abs_error) and max_abs_error > 0):
        raise InvalidParameterError(
            f"The 'max_abs_error' parameter of select_parameters must be a finite float > 0. "
            f"Got {max_abs_error!r} instead."
        )
    check_key_error_model(key_error)
    best, reasons = None, []
    for n in RING_DEGREES:
        if n > max_poly_modulus_degree:
            continue
        budget = SEAL_MAX_COEFF_BITS[n]
        if length is None:
            g_bound, s = 0.0, _smallest_scale(n, k_max, max_abs_error)
        else:
            probe = _Geometry(n)
            coeffs = n * probe.n_chunks(length, breaks)
            sigma = flood_sigma_for(key_error_at(n, k_max, coeffs, key_error), coeffs)
            g_bound = tail_z(coeffs) * sigma + 1.0
            s = _smallest_flooded_scale(n, k_max, sigma, int(length), max_abs_error)
        if s is None:
            reasons.append(f"N={n}: the {'flooded ' if length else ''}error exceeds max_abs_error even at "
                           f"scale 2^{MAX_SCALE_BITS}")
            continue
        need = s + math.log2(aggregate_bound + (k_max * (n + 2) + g_bound) / 2.0 ** s)
        found = False
        for n_data in range(1, (budget - 39) // 20 + 1):
            # primes are a bit below 2^b: start at the lower-bound estimate, step up at most twice
            bits = max(20, math.ceil((need + 1 + MARGIN_BITS) / n_data))
            p = None
            for b in range(bits, min(bits + 2, 60) + 1):
                special = min(SPECIAL_PRIME_BITS, budget - n_data * b)
                if special < 39:
                    break
                try:
                    cand = CKKSParameters(n, (b,) * n_data + (special,), s)
                except InvalidParameterError:
                    continue
                if aggregate_bound <= cand.max_aggregate(k_max, g_bound):
                    p = cand
                    break
            if p is not None:
                found = True
                if length is not None:  # the same bytes buy a larger scale: take all of it
                    for s_up in range(p.scale_bits + 1, MAX_SCALE_BITS + 1):
                        try:
                            up = CKKSParameters(n, p.coeff_mod_bit_sizes, s_up)
                        except InvalidParameterError:
                            break
                        if aggregate_bound > up.max_aggregate(k_max, g_bound):
                            break
                        p = up
                if best is None or (p.data_bits, n) < (best.data_bits, best.poly_modulus_degree):
                    best = p
                break
        if not found:
            reasons.append(f"N={n}: (H) needs {need + 1 + MARGIN_BITS:.0f}+ data bits at scale 2^{s}, "
                           f"more than the 128-bit budget of {budget} bits allows")
    if best is None:
        raise InvalidParameterError(
            f"No CKKS parameter set at 128-bit security (HomomorphicEncryption.org table, poly_modulus_degree "
            f"<= {max_poly_modulus_degree}) holds the declared aggregate bound {aggregate_bound:.4g} = k_max * "
            f"max(n_max*max_norm^2 + gamma, n_max*max_norm, n_max) for k_max={k_max} with error <= "
            f"max_abs_error={max_abs_error:g} ({'; '.join(reasons)}). Lower n_max, max_norm or k_max, or allow "
            "a larger max_abs_error."
        )
    return best


class _Geometry:
    """Chunk geometry of ring degree N without a parameter set (for :func:`select_parameters`)."""

    def __init__(self, n: int):
        self.slots = n // 2

    spans = CKKSParameters.spans
    n_chunks = CKKSParameters.n_chunks


def _smallest_flooded_scale(n: int, k_max: int, sigma: float, length: int, max_abs_error: float) -> int | None:
    # the float64 decode error (FLOAT_REL times the magnitude) is left out, as in noise_bound: it is a
    # property of any float64 pipeline, and the declared magnitude is far above what honest data reach
    zs = tail_z(length) * sigma * math.sqrt(n / 2.0)
    for s in range(20, MAX_SCALE_BITS + 1):
        scale = 2.0 ** s
        if fixed_error_at(n, k_max, scale) + zs / scale <= max_abs_error:
            return s
    return None


@functools.lru_cache(maxsize=64)
def _data_modulus(n: int, bits: tuple) -> int:
    try:
        primes = [m.value() for m in sealapi.CoeffModulus.Create(n, list(bits))]
    except Exception:
        raise InvalidParameterError(f"SEAL has no primes of {list(bits)} bits for poly_modulus_degree={n}") from None
    return math.prod(primes[:-1])


def _smallest_scale(n: int, k_max: int, max_abs_error: float) -> int | None:
    for s in range(20, MAX_SCALE_BITS + 1):
        if _noise(n, k_max, 2.0 ** s) <= max_abs_error:
            return s
    return None
