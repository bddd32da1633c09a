"""``bfv``: exact homomorphic sums (BFV through TenSEAL) of the two-lane fixed point.

Same roles, envelope, key binding, key storage and checks as
:mod:`secure_afl.backends.ckks` (the backend class shares that code); what
differs is what is encrypted and what decryption returns:

* hospital: the packed vector is encoded into 2L signed 58-bit lane words
  (:mod:`secure_afl.hazmat.fixedpoint`, the same encoding as secagg) and the
  words are encrypted, N per ciphertext, under the key holder's public key.
* server: adds ciphertexts it cannot read (one running sum, O(L) memory).
* key holder: checks SEAL's invariant noise budget of the sum (refuses one
  with none left), decrypts the exact integer lane sums and decodes them.

Exactness: decrypted lane sums are exact integers, so the revealed aggregate
is the exact sum of the hospitals' float64 values rounded once (up to
K 2^-(f1+f2+1)) -- bit for bit what secagg reveals on the same data -- and
decryption leaks no noise, so no noise flooding is needed
(:mod:`secure_afl.hazmat.bfv` explains why and what remains).

Differential privacy: as for secagg, each hospital rounds its noised entries
to the grid 2^-f1 and adds its Skellam integer share there before encoding
(:func:`secure_afl.dp.add_noise_share`); the exact lane sums then carry the
summed Skellam noise exactly, and the key holder accounts it like secagg's.
"""

from __future__ import annotations

import numpy as np

from ..envelope import open_envelope, seal
from ..exceptions import InvalidParameterError, SanityCheckFailed
from ..hazmat import bfv as hzb
from ..hazmat import fixedpoint
from ..packing import Layout
from ..params import Bounds, SessionParams
from ..protection import check_vector
from .ckks import CKKSBackend, he_key_functions

__all__ = ["BFVBackend", "bfv_session_params", "bfv_parameters", "generate_keys", "bind_public_context",
           "new_bfv_session", "expected_abs_error"]


def bfv_session_params(session_id: str, layout: Layout, gamma: float, bounds: Bounds, *,
                       max_poly_modulus_degree: int = 32768, frac_bits: tuple | None = None) -> SessionParams:
    """Session parameters: lane bits from the bounds, BFV chain from ``k_max``; not yet bound to a key.

    ``frac_bits``: explicit ``(f1, f2)``, checked against the no-wrap condition; DP sessions put the
    high lane on their Skellam noise grid
    (:func:`secure_afl.backends.session_params.dp_session_params`), as secagg does.
    """
    if frac_bits is None:
        fb = fixedpoint.choose_frac_bits(bounds, gamma)
    else:
        fb = fixedpoint.check_frac_bits(frac_bits, bounds, gamma)
    chosen = hzb.select_parameters(bounds.k_max, max_poly_modulus_degree=max_poly_modulus_degree)
    return SessionParams(session_id, "bfv", layout, gamma, bounds).with_backend_params(
        frac_bits=[int(f) for f in fb], **chosen.to_dict())


def bfv_parameters(params: SessionParams) -> hzb.BFVParameters:
    if params.backend != "bfv":
        raise InvalidParameterError(f"session backend is {params.backend!r}, not 'bfv'")
    return hzb.BFVParameters.from_dict(params.backend_params)


#: Common name for :func:`bfv_session_params` (see :func:`secure_afl.backends.he_module`).
session_params = bfv_session_params

#: The key holder's BFV keys, defined once for both HE schemes (:func:`.ckks.he_key_functions`).
generate_keys, bind_public_context, new_bfv_session = he_key_functions(hzb, bfv_parameters, bfv_session_params)


def expected_abs_error(params: SessionParams, n_clients: int | None = None, *,
                       magnitude: float | None = None) -> float:
    """Per-entry bound on |revealed - exact sum|: the lane rounding plus one final rounding."""
    k = params.bounds.k_max if n_clients is None else int(n_clients)
    m = params.bounds.aggregate_bound(params.gamma) if magnitude is None else float(magnitude)
    return fixedpoint.abs_error_bound(tuple(params.backend_params["frac_bits"]), k, m)


class BFVBackend(CKKSBackend):
    """BFV protection; ``params`` from :func:`bfv_session_params`, bound to a key for use."""

    name = "bfv"
    _hz = hzb

    def _scheme_parameters(self, params: SessionParams):
        return bfv_parameters(params)

    def _n_items(self) -> int:
        return fixedpoint.n_words(self.params.layout.length)

    def _check_holds_bounds(self) -> None:
        p = self.params
        fixedpoint.check_frac_bits(p.backend_params.get("frac_bits"), p.bounds, p.gamma)
        if not self.ckks_.holds(p.bounds.k_max):
            raise InvalidParameterError(
                f"BFV parameters {self.ckks_.to_dict()} leave less than {hzb.MARGIN_BITS} bits of noise budget "
                f"after k_max={p.bounds.k_max} additions; create the session with bfv_session_params")

    @property
    def frac_bits(self) -> tuple:
        return tuple(self.params.backend_params["frac_bits"])

    def protect(self, vector, *, public_context: bytes, **kw) -> bytes:
        """Hospital: check bounds, encode two lanes, encrypt, seal a "contribution"."""
        v = check_vector(self.params, vector)
        ctx = self._public_context(public_context)
        words = fixedpoint.encode(v, self.frac_bits)
        return seal(self.params, "contribution", hzb.encrypt_words(ctx, self.ckks_, words))

    def reveal(self, aggregate: bytes, *, secret_context: bytes, **kw) -> np.ndarray:
        """Decrypt a sealed aggregate (tests and tools; the key holder re-sums contributions itself)."""
        env = open_envelope(self.params, aggregate, "aggregate")
        ctx = self.keyholder_context(secret_context)
        return self.decrypt_sum(ctx, hzb.load_chunks(ctx, self.ckks_, env.body, self._n_items()))

    def decrypt_sum(self, ctx, chunks: list) -> np.ndarray:
        """Refuse a sum without noise budget, decrypt the exact lane sums, decode."""
        if hzb.noise_budget(ctx, chunks) <= 0:
            raise SanityCheckFailed(
                "the aggregate has no noise budget left: its decryption could be wrong, so it is not decrypted "
                "(more contributions than the parameters hold, or ciphertexts not made by the recipe)")
        n = self._n_items()
        words = hzb.decrypt_chunks(ctx, chunks, n)
        half = n // 2
        v = fixedpoint.decode_lanes(words[:half], words[half:], self.frac_bits)
        limit = self.params.bounds.aggregate_bound(self.params.gamma) * (1 + 2.0 ** -50)
        if float(np.max(np.abs(v))) > limit:
            raise SanityCheckFailed(
                "decrypted aggregate leaves the declared aggregate bound: it was not formed from "
                "in-bound contributions of this session")
        return v
