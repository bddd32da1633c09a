"""BFV primitives for exact additive aggregation, on TenSEAL 0.3.18 (Microsoft SEAL).

.. danger::

   This is a "Hazardous Materials" module. You should **ONLY** use it if you're
   100% absolutely sure that you know what you're doing because this module is
   full of land mines, dragons, and dinosaurs with laser guns. The recipe is
   :mod:`secure_afl.backends.bfv`; nothing here checks bounds or sessions.

What is encrypted
-----------------
The two-lane fixed-point words of :mod:`secure_afl.hazmat.fixedpoint` (2L
signed integers, each lane bounded so that any K <= K_max sum stays inside
(-2^58, 2^58)). BFV with batching packs N integers modulo the plaintext prime
t per ciphertext; t is SEAL's 60-bit batching prime (t = 1 mod 2N, t > 2^59),
so the centred residue of a lane sum modulo t *is* the integer lane sum. No
CRT over several plaintext primes is needed: one 60-bit prime already holds a
58-bit lane sum.

Exactness and what decryption leaks
-----------------------------------
BFV decryption rounds the noise away: while the invariant noise of the summed
ciphertext is below Delta/2 (Delta = floor(Q/t)) the decrypted plaintext is the
exact sum modulo t, independent of the noise. The key holder therefore
reveals exactly the integer lane sums, which are a function of the
hospitals' inputs alone; no noise-dependent value leaves the key holder and
no noise flooding is needed (unlike CKKS, whose decrypted values carry the
encryption noise and so leak information about it and the key).

What remains is a decryption failure: if the noise of the sum reached Delta/2
the plaintext would be wrong (and a malicious party could try to provoke that
to learn about the key). Two guards: the parameters leave at least
:data:`MARGIN_BITS` of noise budget after K_max fresh additions (noise grows
additively by at most log2 K_max bits; a fresh ciphertext's budget is
``log2(Q) - log2(t) - log2(N) + 5`` bits in SEAL's public-key encryption,
measured), and the key holder measures SEAL's invariant noise budget of every
aggregate ciphertext and refuses to decrypt one without budget left
(:func:`noise_budget`). Ciphertexts are checked on arrival (size 2, first data
level, not NTT form, expected slot count), as for CKKS.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import tenseal as ts
import tenseal.sealapi as sealapi

from .. import domains
from ..exceptions import InvalidParameterError, ParameterMismatch
from ._tenseal import add_chunks, check_chunks, context_sha256, first_parms_id, frame, parse_context, split_body
from ._tenseal import decrypt_chunks as _decrypt_chunks
from ._tenseal import dump_chunks as _dump_chunks
from ._tenseal import serialize_public, serialize_secret
from .ckks import SEAL_MAX_COEFF_BITS

__all__ = [
    "BFVParameters",
    "select_parameters",
    "generate_context",
    "serialize_public",
    "serialize_secret",
    "load_context",
    "context_sha256",
    "encrypt_words",
    "load_chunks",
    "add_chunks",
    "dump_chunks",
    "decrypt_chunks",
    "noise_budget",
    "MARGIN_BITS",
    "PLAIN_BITS",
]

_BODY_MAGIC = domains.BFV_BODY_MAGIC
#: Bits of the plaintext prime t (SEAL's batching prime; must exceed 59 bits).
PLAIN_BITS = 60
#: Noise budget (bits) the parameters keep after K_max additions.
MARGIN_BITS = 10
#: Fresh public-key encryption budget is log2 Q - log2 t - log2 N + _FRESH_EXTRA (measured: 22 bits at
#: N = 8192, Q = 2 x 45 bits; 12 at 2 x 40; 32 at 2 x 50).
_FRESH_EXTRA = 5
_SPECIAL_BITS = 60


@functools.lru_cache(maxsize=8)
def _plain_prime(n: int) -> int:
    return int(sealapi.PlainModulus.Batching(n, PLAIN_BITS).value())


@dataclass(frozen=True)
class BFVParameters:
    """One BFV parameter set for exact sums of 58-bit lanes."""

    poly_modulus_degree: int
    coeff_mod_bit_sizes: tuple

    def __post_init__(self):
        n, bits = self.poly_modulus_degree, tuple(self.coeff_mod_bit_sizes)
        object.__setattr__(self, "coeff_mod_bit_sizes", bits)
        if isinstance(n, bool) or not isinstance(n, int) or n not in SEAL_MAX_COEFF_BITS:
            raise InvalidParameterError(
                f"The 'poly_modulus_degree' parameter of BFVParameters must be one of {sorted(SEAL_MAX_COEFF_BITS)}. "
                f"Got {n!r} instead.")
        if len(bits) < 2 or any(isinstance(b, bool) or not isinstance(b, int) or not 20 <= b <= 60 for b in bits):
            raise InvalidParameterError(
                f"The 'coeff_mod_bit_sizes' parameter of BFVParameters must be at least two ints in [20, 60]. "
                f"Got {list(bits)!r} instead.")
        if sum(bits) > SEAL_MAX_COEFF_BITS[n]:
            raise InvalidParameterError(
                f"coeff_mod_bit_sizes={list(bits)} total {sum(bits)} bits, above the 128-bit security limit "
                f"{SEAL_MAX_COEFF_BITS[n]} for poly_modulus_degree={n}")
        if self.plain_modulus in _coeff_primes(n, bits):
            raise InvalidParameterError("the plaintext prime coincides with a coefficient prime; use other bit sizes")

    @property
    def slots(self) -> int:
        return self.poly_modulus_degree

    @property
    def plain_modulus(self) -> int:
        return _plain_prime(self.poly_modulus_degree)

    @property
    def data_bits(self) -> int:
        return sum(self.coeff_mod_bit_sizes[:-1])

    def fresh_budget_bits(self) -> float:
        q = math.prod(_coeff_primes(self.poly_modulus_degree, self.coeff_mod_bit_sizes)[:-1])
        return math.log2(q) - math.log2(self.plain_modulus) - math.log2(self.poly_modulus_degree) + _FRESH_EXTRA

    def holds(self, n_clients: int) -> bool:
        return self.fresh_budget_bits() - math.log2(max(int(n_clients), 1)) >= MARGIN_BITS

    def n_chunks(self, n_words: int) -> int:
        return max(1, -(-int(n_words) // self.slots))

    def approx_bytes_per_word(self) -> float:
        return 2 * self.data_bits / 8.0

    def to_dict(self) -> dict:
        return {"poly_modulus_degree": int(self.poly_modulus_degree),
                "coeff_mod_bit_sizes": [int(b) for b in self.coeff_mod_bit_sizes],
                "plain_modulus": int(self.plain_modulus)}

    @classmethod
    def from_dict(cls, d) -> "BFVParameters":
        try:
            p = cls(d["poly_modulus_degree"], tuple(d["coeff_mod_bit_sizes"]))
            t = d["plain_modulus"]
        except (KeyError, TypeError):
            raise InvalidParameterError(
                "bfv backend_params must hold 'poly_modulus_degree', 'coeff_mod_bit_sizes' and 'plain_modulus'"
            ) from None
        if t != p.plain_modulus:
            raise InvalidParameterError(f"plain_modulus {t!r} is not SEAL's {PLAIN_BITS}-bit batching prime for N")
        return p


@functools.lru_cache(maxsize=64)
def _coeff_primes(n: int, bits: tuple) -> tuple:
    try:
        return tuple(int(m.value()) for m in sealapi.CoeffModulus.Create(n, list(bits)))
    except Exception:
        raise InvalidParameterError(f"SEAL has no primes of {list(bits)} bits for poly_modulus_degree={n}") from None


def select_parameters(k_max: int, *, max_poly_modulus_degree: int = 32768) -> BFVParameters:
    """The smallest chain (two or more equal data primes + a special prime) that keeps
    :data:`MARGIN_BITS` of noise budget after ``k_max`` additions, at 128-bit security."""
    best = None
    for n in (4096, 8192, 16384, 32768):
        if n > max_poly_modulus_degree:
            continue
        budget = SEAL_MAX_COEFF_BITS[n]
        need = PLAIN_BITS + math.log2(n) - _FRESH_EXTRA + math.log2(max(k_max, 1)) + MARGIN_BITS
        for n_data in range(1, 8):
            b = max(20, math.ceil(need / n_data))
            special = min(_SPECIAL_BITS, budget - n_data * b)
            if b > 60:
                continue
            if special < 30:
                break
            found = None
            for bb in range(b, min(b + 2, 60) + 1):
                try:
                    cand = BFVParameters(n, (bb,) * n_data + (max(special - (bb - b) * n_data, 30),))
                except InvalidParameterError:
                    continue
                if cand.holds(k_max):
                    found = cand
                    break
            if found is not None:
                if best is None or (found.data_bits, n) < (best.data_bits, best.poly_modulus_degree):
                    best = found
                break
    if best is None:
        raise InvalidParameterError(
            f"no BFV parameter set at 128-bit security keeps {MARGIN_BITS} bits of noise budget for "
            f"k_max={k_max} additions; lower `k_max`")
    return best


# -- contexts ------------------------------------------------------------------
def generate_context(params: BFVParameters) -> "ts.Context":
    ctx = ts.context(ts.SCHEME_TYPE.BFV, poly_modulus_degree=params.poly_modulus_degree,
                     plain_modulus=params.plain_modulus, coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes))
    _check_context(ctx, params)
    return ctx


def load_context(data: bytes, params: BFVParameters, *, secret: bool):
    """Parse and check a serialized BFV context (same refusals as the CKKS one)."""
    ctx = parse_context(data, secret=secret)
    _check_context(ctx, params)
    return ctx


def _check_context(ctx, params: BFVParameters) -> None:
    try:
        sc = ctx.seal_context().data
        key = sc.key_context_data().parms()
        # the scheme enums of the two bindings do not compare equal; their names do
        is_bfv = str(key.scheme()) == str(sealapi.SCHEME_TYPE.BFV)
        got = (is_bfv, key.poly_modulus_degree(), key.plain_modulus().value(),
               tuple(int(m.value()) for m in key.coeff_modulus()))
    except Exception:
        raise ParameterMismatch("context does not carry BFV parameters") from None
    want = (True, params.poly_modulus_degree, params.plain_modulus,
            _coeff_primes(params.poly_modulus_degree, params.coeff_mod_bit_sizes))
    if got != want:
        raise ParameterMismatch(f"context parameters do not match the session's BFV parameters {params.to_dict()}")


# -- ciphertext chunks -------------------------------------------------------------
def encrypt_words(ctx, params: BFVParameters, words: np.ndarray) -> bytes:
    """Encrypt signed 58-bit lane words (int64 view) chunk by chunk of N slots."""
    w = np.ascontiguousarray(words).view(np.int64)
    blobs = []
    for start in range(0, max(w.shape[0], 1), params.slots):
        try:
            blobs.append(ts.bfv_vector(ctx, w[start:start + params.slots].tolist()).serialize())
        except Exception:
            raise InvalidParameterError("TenSEAL refused to encrypt the words under this context") from None
    return _raw_body(blobs, w.shape[0])


def _raw_body(blobs: list, length: int) -> bytes:
    return frame(_BODY_MAGIC, blobs, length)


def load_chunks(ctx, params: BFVParameters, body: bytes, n_words: int) -> list:
    """Parse and check every chunk (fresh: 2 polynomials, first data level, coefficient form)."""
    blobs = split_body(body, _BODY_MAGIC, params.n_chunks(n_words), n_words, "bfv")
    first_id = first_parms_id(ctx, "BFV")

    def fresh(ct) -> bool:
        return (ct.size() == 2 and not ct.is_ntt_form() and list(ct.parms_id()) == first_id
                and ct.poly_modulus_degree() == params.poly_modulus_degree)

    return check_chunks(blobs, params.slots, n_words, lambda b: ts.bfv_vector_from(ctx, b), fresh)


def dump_chunks(chunks, n_words: int) -> bytes:
    return _dump_chunks(_BODY_MAGIC, chunks, n_words)


def noise_budget(ctx, chunks: Iterable) -> int:
    """Smallest invariant noise budget (bits) of the chunks under the secret context."""
    dec = sealapi.Decryptor(ctx.seal_context().data, ctx.secret_key().data)
    return min(int(dec.invariant_noise_budget(c.ciphertext()[0])) for c in chunks)


def decrypt_chunks(ctx, chunks: Iterable, n_words: int) -> np.ndarray:
    """Centred residues modulo t, concatenated (int64, length ``n_words``)."""
    return _decrypt_chunks(chunks, n_words, np.int64)
