"""CKKS's flooded decryption: the key-error bounds, the flooding's size and its sampler (the analysis
behind :func:`secure_afl.hazmat.ckks.select_parameters`, whose module docstring carries the argument).
"""

from __future__ import annotations

import math
import os
import tempfile
from typing import Sequence

import numpy as np
import tenseal as ts  # noqa: F401 - the contexts flood_decrypt takes
import tenseal.sealapi as sealapi

from ..exceptions import InvalidContribution, InvalidKey, InvalidParameterError
from .seal_format import seal_ciphertext

#: Relative float64 error of encode + decode: MEASURED (std 1.5e-16, max 7.6e-16 ~ 2^-50.2 over 12k
#: slots), not proved; 2^-46 keeps a factor 16 over the largest value seen. It bounds only the accuracy of
#: the decode, which is post-processing of the flooded integers and needs no flooding of its own.
FLOAT_REL = 2.0 ** -46

#: Security of the flooded decryption: the KL divergence between the releases under any two keys whose key
#: errors obey the sizing's bound is at most 2^-KAPPA / 6 = 2^-32.6 for the whole release (FLOOD_QUERIES
#: decryptions), statistical distance <= sqrt(KL / 2) = 2^-16.8 (Pinsker). KAPPA bits is the key-recovery
#: convention of OpenFHE and Li, Micciancio, Schultz and Sorrell, not 30 bits of statistical distance.
KAPPA = 30
FLOOD_QUERIES = 1
#: Every flooded entry (and every flooding coefficient) is within its stated bound except w.p. 2^-TAIL_BITS.
TAIL_BITS = 40

# -- flooding the integer decryption ---------------------------------------------------------
#: How the key error E is bounded when the flooding is sized: "heuristic" (the default, the independence
#: heuristic of :func:`key_error_bound`) or "proved" (the worst case :func:`worst_key_error`).
KEY_ERROR_MODELS = ("heuristic", "proved")


def key_error_bound(params, n_clients: int, coefficients: int, *,
                    model: str = "heuristic") -> float:
    """Bound on every coefficient of the key-dependent decryption error E of a K-sum of honest
    encryptions, over ``coefficients`` coefficients at once.

    ``model="proved"``: the PROVED worst case ``||E||_inf <= K (N/2 + 1)`` of honest encryptions
    (module docstring, step 2; no probability, no independence heuristic; a crafted ciphertext's
    error is not bounded by it).

    ``model="heuristic"`` (default), except with probability 2^-TAIL_BITS UNDER A HEURISTIC (the
    independence heuristic OpenFHE's noise estimates also rest on, not a theorem about SEAL): the
    rounding errors r0, r1 of the division by P are independent, mean zero, in [-1/2, 1/2], and
    independent of the ternary key s, so E_j = sum_k (r0_k + r1_k s)_j is a sum of at most
    K (N + 1) such terms plus K (2N + 1) 19.2 / P < K 2^-20, with variance K (1 + 2N/3) / 12
    (r uniform: 1/12 each; s uniform ternary: 2/3 per coefficient); Hoeffding with a union bound
    over the coefficients gives
    ``e = sqrt(K (N + 1) / 2 * (ln(2 coefficients) + TAIL_BITS ln 2)) + K 2^-20``
    (about sqrt(K) instead of K: at K = 100, N = 4096, 67 times below the worst case). Measured on
    SEAL's honest encryptions (tests/test_ckks_flooding.py), the standard deviation is the model's
    and the largest coefficient several times below e."""
    if model == "proved":
        return worst_key_error(params, n_clients)
    check_key_error_model(model)
    return key_error_at(params.poly_modulus_degree, n_clients, coefficients)


def check_key_error_model(model: str) -> None:
    if model not in KEY_ERROR_MODELS:
        raise InvalidParameterError(f"the ckks flooding's key-error model must be one of "
                                    f"{', '.join(KEY_ERROR_MODELS)}, not {model!r}")


def key_error_at(n: int, n_clients: int, coefficients: int, model: str = "heuristic") -> float:
    k = max(int(n_clients), 1)
    if model == "proved":
        return k * (n / 2.0 + 1.0)
    tail = math.log(2.0 * max(int(coefficients), 1)) + TAIL_BITS * math.log(2.0)
    return math.sqrt(k * (n + 1) / 2.0 * tail) + k * 2.0 ** -20


def worst_key_error(params, n_clients: int) -> float:
    """The PROVED worst case ``K (N/2 + 1)`` of :func:`key_error_bound` (no heuristic, no tail)."""
    return key_error_at(params.poly_modulus_degree, n_clients, 1, "proved")


def flood_coefficient_sigma(params, n_clients: int, coefficients: int, *,
                            kappa: int = KAPPA, queries: int = FLOOD_QUERIES, model: str = "heuristic") -> float:
    """(F): the standard deviation of the Gaussian added to each of ``coefficients`` decrypted
    coefficients so that the whole release is within KL 2^-kappa / 6 under any two keys whose key
    errors obey the ``model``'s bound (:func:`key_error_bound`)."""
    return flood_sigma_for(key_error_bound(params, n_clients, coefficients, model=model), coefficients, kappa,
                        queries)


def flood_sigma_for(e: float, coefficients: int, kappa: int = KAPPA, queries: int = FLOOD_QUERIES) -> float:
    return math.sqrt(12.0 * queries * max(int(coefficients), 1)) * 2.0 ** (kappa / 2.0) * e


def slot_sigma(params, sigma: float) -> float:
    """Standard deviation of the real part of a decoded slot when every coefficient gets N(0, sigma^2):
    ``sigma sqrt(N/2) / 2^s`` (the real parts of the N/2 slots are independent)."""
    return float(sigma) * math.sqrt(params.poly_modulus_degree / 2.0) / params.scale


def fixed_slot_error(params, n_clients: int) -> float:
    """PROVED bound on the non-Gaussian part of a flooded slot's error: the key error E, the K encoding
    roundings u_k and the flooding polynomial's own rounding, each coefficient-wise bounded, through
    ``|Re tau(p)_i| <= ||p||_1 <= N ||p||_inf``: ``N (K (N/2 + 1) + K/2 + 1/2) / 2^s``."""
    return fixed_error_at(params.poly_modulus_degree, n_clients, params.scale)


def fixed_error_at(n: int, n_clients: int, scale: float) -> float:
    k = max(int(n_clients), 1)
    return n * (k * (n / 2.0 + 1.0) + k / 2.0 + 0.5) / scale


def tail_z(entries: int, *, bits: int = TAIL_BITS) -> float:
    """z with P(any of ``entries`` N(0, 1) draws exceeds z in absolute value) <= 2^-bits: union bound
    over P(|N(0,1)| > z) <= exp(-z^2 / 2), so z = sqrt(2 (ln entries + bits ln 2))."""
    return math.sqrt(2.0 * (math.log(max(int(entries), 1)) + bits * math.log(2.0)))


def flood_coefficient_bound(params, sigma: float, coefficients: int) -> float:
    """Bound on every coefficient of the flooding polynomials (w.p. 1 - 2^-TAIL_BITS): it must fit in
    condition (H) beside the message (:meth:`CKKSParameters.max_aggregate`)."""
    return tail_z(coefficients) * float(sigma) + 1.0


def gaussian_integers(count: int, sigma: float) -> np.ndarray:
    """``count`` rounded Gaussians round(N(0, sigma^2)) as int64, from the OS CSPRNG (os.urandom).

    Box-Muller on 53-bit uniforms in float64: the one approximation of the sampler (a float64
    Gaussian is not exactly one); everything after it is exact integer arithmetic. Rounding is
    post-processing, so an integer shift of round(Y) is within the KL of the same shift of Y."""
    count = int(count)
    if not (math.isfinite(sigma) and 0 < sigma < 2.0 ** 55):
        raise InvalidParameterError(f"flooding sigma must be in (0, 2^55); got {sigma!r}")
    half = (count + 1) // 2
    raw = np.frombuffer(os.urandom(16 * half), dtype=np.uint64).reshape(half, 2) >> np.uint64(11)
    u1 = (raw[:, 0].astype(np.float64) + 1.0) * 2.0 ** -53  # (0, 1]
    u2 = raw[:, 1].astype(np.float64) * 2.0 ** -53
    r = np.sqrt(-2.0 * np.log(u1))
    z = np.concatenate([r * np.cos(2.0 * np.pi * u2), r * np.sin(2.0 * np.pi * u2)])[:count]
    return np.rint(sigma * z).astype(np.int64)


def flood_decrypt(ctx: "ts.Context", params, chunks: Sequence, sigma: float,
                  length: int) -> np.ndarray:
    """Decrypt each summed chunk ONCE after adding a fresh rounded Gaussian polynomial G (standard
    deviation ``sigma`` per coefficient) to it, and decode: a float64 vector of ``length``.

    What is added is exact: the ciphertext is taken out of NTT form (SEAL's evaluator), G is added
    to c0 coefficient by coefficient modulo each data prime in uint64, and SEAL's NTT brings it back,
    so c0 + G + c1 s = m + E + G (mod Q). Nothing unflooded is decrypted; decoding (float64 FFT) is
    post-processing of the flooded integers. SEAL exposes no writable coefficient buffer to Python,
    so the flooded ciphertext is rebuilt from its uncompressed serialisation and loaded back.
    """
    try:
        sc = ctx.seal_context().data
        dec = sealapi.Decryptor(sc, ctx.secret_key().data)
    except Exception:
        raise InvalidKey("this operation needs the secret context; a public context cannot decrypt") from None
    ev, enc = sealapi.Evaluator(sc), sealapi.CKKSEncoder(sc)
    primes = [m.value() for m in sc.first_context_data().parms().coeff_modulus()]
    n, levels = params.poly_modulus_degree, len(primes)
    words = 2 * levels * n
    parts = []
    with tempfile.TemporaryDirectory(prefix="safl-flood-") as tmp:
        path = os.path.join(tmp, "ct")
        for vec in chunks:
            try:
                ct = vec.ciphertext()[0]
                if ct.size() != 2 or ct.coeff_modulus_size() != levels or ct.poly_modulus_degree() != n:
                    raise InvalidContribution()
                ev.transform_from_ntt_inplace(ct)
                data = np.fromiter(map(ct.__getitem__, range(words)), dtype=np.uint64, count=words)
                ev.transform_to_ntt_inplace(ct)  # leave the caller's chunk as it was
                g = gaussian_integers(n, sigma)
                for j, q in enumerate(primes):
                    seg = data[j * n:(j + 1) * n]
                    seg[:] = (seg + np.mod(g, np.int64(q)).astype(np.uint64)) % np.uint64(q)
                with open(path, "wb") as f:
                    f.write(seal_ciphertext(ct.parms_id(), False, n, levels, ct.scale, data))
                flooded = sealapi.Ciphertext()
                flooded.load(sc, path)
                ev.transform_to_ntt_inplace(flooded)
                plain = sealapi.Plaintext()
                dec.decrypt(flooded, plain)
                parts.append(np.asarray(enc.decode_double(plain), dtype=np.float64)[:vec.size()])
            except InvalidContribution:
                raise
            except Exception:
                raise InvalidContribution() from None
    v = np.concatenate(parts) if parts else np.zeros(0)
    if v.shape != (int(length),):
        raise InvalidContribution()
    return v


def flooded_tolerance(params, n_clients: int, coefficients: int, entries: int,
                      magnitude: float, *, model: str = "heuristic") -> tuple:
    """``(sigma, slot sigma, tol)``: the flooding of ``coefficients`` decrypted coefficients for K =
    ``n_clients`` and the bound every one of ``entries`` decoded values then satisfies (w.p. 1 -
    2^-TAIL_BITS), for values of magnitude ``magnitude``: the proved fixed part, z slot sigma, and the
    measured float64 decode error FLOAT_REL (magnitude + z slot sigma)."""
    sigma = flood_coefficient_sigma(params, n_clients, coefficients, model=model)
    ss = slot_sigma(params, sigma)
    zs = tail_z(entries) * ss
    return sigma, ss, fixed_slot_error(params, n_clients) + zs + FLOAT_REL * (float(magnitude) + zs)
