"""Session parameters shared by every role, and their binding digest.

A session fixes the layout (d, C), the RI intermediary gamma, the declared
bounds and the backend's own parameters. :meth:`SessionParams.digest` is the
SHA-256 of the canonical JSON of all of them; every payload header carries it,
and a payload for other parameters is refused (:class:`ParameterMismatch`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from .encoding import canonical_json
from ._validation import check_int, check_real, param_error
from .packing import Layout

__all__ = ["Bounds", "SessionParams", "BACKENDS", "HE_BACKENDS", "KEYED_BACKENDS"]

BACKENDS = ("plain", "ckks", "secagg", "bfv", "split")
#: Backends whose key holder holds a secret key and decrypts the aggregate.
HE_BACKENDS = ("ckks", "bfv")
#: Backends that open only once the key holder published a signed per-session key (HE context, split seed key).
KEYED_BACKENDS = HE_BACKENDS + ("split",)
_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Bounds:
    """Declared bounds that size the protection parameters.

    Parameters
    ----------
    max_norm : float
        B, an upper bound on ||x||_2 of every embedding a hospital contributes.
    n_max : int
        Upper bound on the samples one hospital contributes (n_k <= n_max).
    k_max : int
        Upper bound on the number of hospitals summed (K <= K_max).

    Notes
    -----
    By Cauchy-Schwarz |(X^T X)_ij| <= sum_n |x_ni||x_nj| <= n_k B^2 and
    |(X^T Y)_ic| <= n_k B, so every entry of one hospital's packed vector is at
    most ``hospital_bound(gamma) = max(n_max B^2 + gamma, n_max B, n_max, 1)``
    in absolute value and every entry of a K-sum at most ``k_max`` times that.
    """

    max_norm: float
    n_max: int
    k_max: int

    def __post_init__(self):
        check_real("max_norm", self.max_norm, "Bounds", low=0.0, low_open=True)
        check_int("n_max", self.n_max, "Bounds", low=1)
        check_int("k_max", self.k_max, "Bounds", low=1)

    def hospital_bound(self, gamma: float) -> float:
        B, n = float(self.max_norm), float(self.n_max)
        return max(n * B * B + gamma, n * B, n, 1.0)

    def aggregate_bound(self, gamma: float) -> float:
        return self.k_max * self.hospital_bound(gamma)

    def to_dict(self) -> dict:
        return {"max_norm": float(self.max_norm), "n_max": int(self.n_max), "k_max": int(self.k_max)}


@dataclass(frozen=True)
class SessionParams:
    """Everything a payload is bound to. Immutable; validated when built."""

    session_id: str
    backend: str
    layout: Layout
    gamma: float
    bounds: Bounds
    backend_params: Mapping[str, Any] = field(default_factory=dict)
    #: distributed differential privacy (:mod:`secure_afl.dp`); None = off, and then absent from the digest
    dp: Mapping[str, Any] | None = None
    # the session's feature extractor (secure_afl.extractor), part of the digest when declared
    extractor: Mapping[str, Any] | None = None

    def __post_init__(self):
        if not isinstance(self.session_id, str) or not _SESSION_ID.match(self.session_id):
            raise param_error("session_id", "SessionParams", "1-64 characters of [A-Za-z0-9._-]", self.session_id)
        if self.backend not in BACKENDS:
            raise param_error("backend", "SessionParams", f"one of {BACKENDS}", self.backend)
        check_real("gamma", self.gamma, "SessionParams", low=0.0)
        if not isinstance(self.layout, Layout):
            raise param_error("layout", "SessionParams", "a Layout", self.layout)
        if not isinstance(self.bounds, Bounds):
            raise param_error("bounds", "SessionParams", "a Bounds", self.bounds)
        if self.dp is not None and not isinstance(self.dp, Mapping):
            raise param_error("dp", "SessionParams", "a mapping or None", self.dp)

    def to_dict(self) -> dict:
        d = {
            "session_id": self.session_id,
            "backend": self.backend,
            "layout": {"dim": self.layout.dim, "n_classes": self.layout.n_classes, "version": self.layout.version},
            "gamma": float(self.gamma),
            "bounds": self.bounds.to_dict(),
            "backend_params": dict(self.backend_params),
            **({"extractor": dict(self.extractor)} if self.extractor is not None else {}),
        }
        if self.dp is not None:
            d["dp"] = dict(self.dp)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SessionParams":
        lay = d["layout"]
        return cls(
            session_id=d["session_id"],
            backend=d["backend"],
            layout=Layout(int(lay["dim"]), int(lay["n_classes"]), int(lay.get("version", 1))),
            gamma=float(d["gamma"]),
            bounds=Bounds(float(d["bounds"]["max_norm"]), int(d["bounds"]["n_max"]), int(d["bounds"]["k_max"])),
            backend_params=dict(d.get("backend_params", {})),
            dp=dict(d["dp"]) if d.get("dp") is not None else None,
            extractor=dict(d["extractor"]) if d.get("extractor") is not None else None,
        )

    def canonical_json(self) -> bytes:
        return canonical_json(self.to_dict())

    def digest(self) -> bytes:
        return hashlib.sha256(self.canonical_json()).digest()

    def with_backend_params(self, **kw) -> "SessionParams":
        bp = dict(self.backend_params)
        bp.update(kw)
        return SessionParams(self.session_id, self.backend, self.layout, self.gamma, self.bounds, bp, self.dp,
                             self.extractor)

    def with_dp(self, dp: Mapping[str, Any] | None) -> "SessionParams":
        return SessionParams(self.session_id, self.backend, self.layout, self.gamma, self.bounds,
                             dict(self.backend_params), None if dp is None else dict(dp), self.extractor)

    def with_extractor(self, extractor: Mapping[str, Any] | None) -> "SessionParams":
        """The same parameters bound to a declared feature extractor (its dict form)."""
        return SessionParams(self.session_id, self.backend, self.layout, self.gamma, self.bounds,
                             dict(self.backend_params), self.dp, None if extractor is None else dict(extractor))
