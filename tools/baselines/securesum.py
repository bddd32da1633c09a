"""One secure sum per federated round, through the project's protection backends.

Gradient FL needs the server to learn ``sum_k v_k`` of the clients' (weighted)
model updates every round and nothing else: exactly what AFL needs once. This
module runs each round's sum through a real backend at library level (no
HTTP): every client calls ``protect``, the server streams the payloads into a
``combiner`` it cannot read, and only the aggregate is revealed.

* ``plain``: the reference path (the server reads every vector);
* ``ckks``: a fresh key pair per sum, as the service's key holder holds one
  per session and decrypts under it once; the raw decryption is flooded by the
  key holder's own release function
  (:func:`secure_afl.keyholder.flooding.flood_release`, every slot at the
  declared-magnitude bound) before anything reads it, so a ckks run here sees
  what a ckks release of the service would give, never the bare decryption;
* ``secagg``: a fresh SecAgg round per sum (fresh keys, masks and Shamir
  shares, SecAgg+ neighbour graph for many clients), via the backend's
  in-process round (:func:`~secure_afl.backends.secagg.simulate_round`).

A generic vector of length P is carried in the smallest statistics layout
whose packed length holds it (zero-padded): the backends size their
parameters from a layout and declared bounds, and the padding costs a few
values. The declared bound is enforced before protection: a client whose
vector has an entry above it gets :class:`~secure_afl.exceptions.BoundsExceeded`,
because a larger value could wrap the protected sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from secure_afl._validation import check_int, check_real
from secure_afl.backends import get_backend
from secure_afl.exceptions import InvalidInputError
from secure_afl.packing import Layout
from secure_afl.params import BACKENDS, Bounds, SessionParams
from secure_afl.backends.secagg import recommended_neighbours, secagg_session_params, simulate_round
from secure_afl.hazmat.fixedpoint import abs_error_bound, choose_frac_bits

__all__ = ["SecureSum", "carrier_layout"]


def carrier_layout(length: int) -> Layout:
    """The smallest ``Layout(d, 1)`` whose packed length holds ``length`` values."""
    check_int("length", length, "carrier_layout", low=1)
    d = max(1, int(math.isqrt(2 * length)) - 2)
    while Layout(d, 1).length < length:
        d += 1
    return Layout(d, 1)


@dataclass
class SecureSum:
    """Sums of K client vectors of a fixed length under one backend.

    Parameters
    ----------
    backend : 'plain' | 'ckks' | 'secagg'
    length : int
        Values per client vector (before padding).
    bound : float
        Declared bound on every |entry| of one client's vector (>= 1).
    max_clients : int
        Most clients in one sum (K_max of the declared bounds).
    session : str
        Prefix of the session ids (each round is its own session).

    Attributes
    ----------
    bytes_up : list of float
        Per sum, the mean bytes one client uploaded (secagg: all five stages).
    flood : list of (sigma, tol)
        ckks: per sum, the flooding's standard deviation and the per-entry bound
        that holds for every revealed entry (except with probability 2^-40).
    err_ratio : list of float
        Per sum, max |revealed - float64 sum| / :meth:`error_bound`: the sum
        is checked against its proved tolerance on every call (<= 1 expected).
    """

    backend: str
    length: int
    bound: float
    max_clients: int
    session: str = "fl"
    bytes_up: list = field(default_factory=list)
    flood: list = field(default_factory=list)
    err_ratio: list = field(default_factory=list)

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise InvalidInputError(f"backend must be one of {BACKENDS}; got {self.backend!r}")
        check_int("length", self.length, "SecureSum", low=1)
        check_real("bound", self.bound, "SecureSum", low=1.0)
        check_int("max_clients", self.max_clients, "SecureSum", low=2)
        self.layout = carrier_layout(self.length)
        # hospital_bound(0) = max(n B^2, n B, n, 1) with n = 1 is B^2 = bound.
        self.bounds = Bounds(max_norm=math.sqrt(float(self.bound)), n_max=1, k_max=int(self.max_clients))
        self._rounds = 0
        self._keys = None
        if self.backend == "ckks":
            from secure_afl.backends.ckks import new_ckks_session

            self.params, self._keys = new_ckks_session(f"{self.session}-ckks", self.layout, 0.0, self.bounds)
        else:
            self.params = SessionParams(f"{self.session}-plain", "plain", self.layout, 0.0, self.bounds)

    # -- one round ---------------------------------------------------------------
    def _pad(self, v) -> np.ndarray:
        v = np.asarray(v, dtype=np.float64)
        if v.shape != (self.length,):
            raise InvalidInputError(f"client vector has shape {v.shape}; this sum takes ({self.length},)")
        out = np.zeros(self.layout.length, dtype=np.float64)
        out[: self.length] = v
        return out

    def sum(self, vectors) -> np.ndarray:
        """Reveal ``sum(vectors)`` (float64, length ``self.length``); the server sees only payloads."""
        vectors = list(vectors)
        if not 1 <= len(vectors) <= self.max_clients:
            raise InvalidInputError(f"a sum takes 1..{self.max_clients} client vectors; got {len(vectors)}")
        self._rounds += 1
        padded = [self._pad(v) for v in vectors]
        if self.backend == "secagg":
            total, up = self._secagg(padded)
        elif self.backend == "ckks":
            total, up = self._ckks_flooded(padded)
        else:
            total, up = self._single_message(padded)
        self.bytes_up.append(float(up))
        exact = np.sum(padded, axis=0)
        mag = float(np.sum([np.max(np.abs(v)) for v in padded]))
        bound = self.error_bound(len(padded), magnitude=max(mag, 1e-300))
        self.err_ratio.append(float(np.max(np.abs(total - exact))) / bound if bound > 0 else 0.0)
        return total[: self.length].copy()

    def _ckks_flooded(self, padded):
        """Fresh key, protect, blind combine, one raw decryption flooded as the key holder floods."""
        from secure_afl.backends.ckks import new_ckks_session
        from secure_afl.envelope import open_envelope
        from secure_afl.keyholder.flooding import flood_decryption, flood_plan

        k = len(padded)
        params, keys = new_ckks_session(f"{self.session}-ckks-{self._rounds}", self.layout, 0.0, self.bounds)
        be = get_backend(params)
        comb = be.combiner(public_context=keys.public_context)
        sizes = []
        for v in padded:
            payload = be.protect(v, public_context=keys.public_context)  # client side
            sizes.append(len(payload))
            comb.add(payload)  # server side: blind
        ctx = be.keyholder_context(keys.secret_context)
        chunks = be.load_partial(ctx, open_envelope(params, comb.aggregate(), "aggregate").body)
        # flooded in the coefficient domain as the key holder floods: the noise does not depend on the values
        fl = flood_decryption(flood_plan(be, k), be, ctx, chunks)
        be.check_range(fl.vector, fl.tol)
        self.params = params
        self.flood.append((float(fl.sigma), float(fl.tol)))
        return fl.vector, np.mean(sizes)

    def _single_message(self, padded):
        be = get_backend(self.params)
        kw = {} if self._keys is None else {"public_context": self._keys.public_context}
        comb = be.combiner(**kw)
        sizes = []
        for v in padded:
            payload = be.protect(v, **kw)  # client side
            sizes.append(len(payload))
            comb.add(payload)  # server side: blind
        agg = comb.aggregate()
        if self._keys is None:
            return be.reveal(agg), np.mean(sizes)
        return be.reveal(agg, secret_context=self._keys.secret_context), np.mean(sizes)

    def _secagg(self, padded):

        k = len(padded)
        bounds = Bounds(self.bounds.max_norm, 1, k)
        nb = recommended_neighbours(k)
        params = secagg_session_params(f"{self.session}-secagg-{self._rounds}", self.layout, 0.0, bounds,
                                       neighbours=nb if nb is not None and nb < k - 1 else None)
        total, exact, _, up = simulate_round(params, padded)
        if not exact:  # pragma: no cover - the protocol's own bit-exactness check
            raise InvalidInputError("secagg round did not reveal the exact fixed-point sum")
        self.secagg_frac_bits = tuple(params.backend_params["frac_bits"])
        return total, up

    # -- error bound ----------------------------------------------------------------
    def error_bound(self, n_clients: int, magnitude: float | None = None) -> float:
        """Per-entry bound on |revealed - true sum| for ``n_clients`` vectors.

        plain: float64 summation rounding; secagg: fixed-point rounding
        (half a unit in the last place per client, the integer sum is exact);
        ckks: the flooded release's bound (the integer decryption flooded as the
        key holder floods it): the proved fixed part, z sigma of the flooding
        (z: every entry at once except with probability 2^-40) and the decode's
        float64 error at the declared magnitude.
        """
        m = n_clients * float(self.bound) if magnitude is None else float(magnitude)
        if self.backend == "ckks":
            from secure_afl.backends.ckks import CKKSBackend
            from secure_afl.hazmat.ckks import FLOAT_REL
            from secure_afl.keyholder.flooding import flood_plan

            plan = flood_plan(CKKSBackend(self.params), n_clients)
            zs = plan["z"] * plan["slot_sigma"]
            return plan["fixed"] + zs + FLOAT_REL * (m + zs) + n_clients * np.finfo(np.float64).eps * m
        if self.backend == "secagg":

            f = choose_frac_bits(Bounds(self.bounds.max_norm, 1, n_clients), 0.0)
            # the exact sum rounded once, against a float64 reference summed in some order
            return abs_error_bound(f, n_clients, m) + n_clients * np.finfo(np.float64).eps * m
        return n_clients * np.finfo(np.float64).eps * m
