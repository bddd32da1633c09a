"""The one small interface every protection backend implements.

Seen from the three roles:

* hospital:  ``backend.protect(vector, ...) -> bytes``   (a sealed contribution)
* server:    ``backend.admit(payload, tag, ...)`` at the door (the upload checked for this session), then
             ``acc = backend.combiner(); acc.add(payload); acc.aggregate() -> bytes``
             (blind, streaming: memory O(L), never K payloads at once; ``partial``/``merge``
             let several processes share one sum, :mod:`secure_afl.parallel`)
* revealer:  ``backend.reveal(aggregate, ...) -> np.ndarray``  (float64, length L)

Backend-specific key material is passed as keyword arguments (the CKKS public
or secret context, the SecAgg client state / unmasking material).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from .exceptions import BoundsExceeded, InvalidInputError, LayoutMismatch, RoundAlreadyClosed
from .params import SessionParams

__all__ = ["ProtectionBackend", "Combiner", "check_vector"]


def check_vector(params: SessionParams, vector, *, bound: float | None = None) -> np.ndarray:
    """Validate a packed hospital vector: shape, finiteness and declared bounds."""
    v = np.asarray(vector)
    if v.dtype == object or not np.issubdtype(v.dtype, np.number):
        raise TypeError("vector must be a numeric array")
    v = v.astype(np.float64, copy=False)
    if v.ndim != 1 or v.shape[0] != params.layout.length:
        raise LayoutMismatch(f"vector has shape {v.shape}; {params.layout.layout_id} needs ({params.layout.length},)")
    if not np.all(np.isfinite(v)):
        raise InvalidInputError("vector contains NaN or inf")
    limit = params.bounds.hospital_bound(params.gamma) if bound is None else bound
    peak = float(np.max(np.abs(v))) if v.size else 0.0
    if peak > limit:
        raise BoundsExceeded(
            f"largest |entry| {peak:.6g} exceeds the declared per-hospital bound {limit:.6g}; "
            "it could wrap the protected sum, so it is refused before protection"
        )
    return v


class Combiner(ABC):
    """Server-side running sum of protected contributions."""

    def __init__(self):
        self.count = 0
        self._closed = False

    def add(self, payload: bytes) -> None:
        if self._closed:
            raise RoundAlreadyClosed("combiner already produced its aggregate")
        self._add(payload)
        self.count += 1

    def partial(self) -> bytes:
        """The running sum, unsealed, for a combiner of the same session to :meth:`merge`
        (the parallel sum's workers hand their shares back this way); empty when nothing was added."""
        return self._partial() if self.count else b""

    def merge(self, body: bytes, count: int) -> None:
        """Add another combiner's :meth:`partial` of ``count`` contributions (checked like an upload)."""
        if self._closed:
            raise RoundAlreadyClosed("combiner already produced its aggregate")
        if count:
            self._merge(body)
            self.count += count

    def aggregate(self) -> bytes:
        if self.count == 0:
            raise InvalidInputError("no contributions to combine")
        self._closed = True
        return self._aggregate()

    @abstractmethod
    def _add(self, payload: bytes) -> None: ...

    @abstractmethod
    def _aggregate(self) -> bytes: ...

    def _partial(self) -> bytes:
        raise NotImplementedError(f"{type(self).__name__} does not split its sum")

    def _merge(self, body: bytes) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not split its sum")


class ProtectionBackend(ABC):
    name: ClassVar[str]

    def __init__(self, params: SessionParams):
        if params.backend != self.name:
            raise ValueError(f"{type(self).__name__} needs backend={self.name!r}, got {params.backend!r}")
        self.params = params

    @abstractmethod
    def protect(self, vector: np.ndarray, **kw) -> bytes:
        """Hospital: protect one packed statistics vector."""

    def admit(self, payload: bytes, tag, *, hospital: str, identity_pub, payload_sha256: str):
        """Server, at the door: check an upload of this backend for this session before anything stores it.

        ``tag`` is what the hospital signed beside the payload (ckks and bfv: the aggregate tag; split: the
        seed statement; the others: nothing). Raises a :class:`~secure_afl.exceptions.SecureAFLError` naming
        what is wrong; returns what the running sum may take instead of ``payload`` (the words the check has
        already opened), or None. This default: no tag, and the envelope opens for this session."""
        from .envelope import open_envelope
        from .exceptions import MalformedPayload

        if tag is not None:
            raise MalformedPayload(f"a {self.name} upload carries no tag (only ckks, bfv and split uploads do)")
        open_envelope(self.params, payload, "contribution")
        return None

    @abstractmethod
    def combiner(self, **kw) -> Combiner:
        """Server: a fresh streaming combiner that cannot read what it sums."""

    @abstractmethod
    def reveal(self, aggregate: bytes, **kw) -> np.ndarray:
        """Allowed party: the float64 aggregate vector from the combined payload."""

    def psd_tolerance(self, gram: np.ndarray) -> float | None:
        """How far below 0 the smallest eigenvalue of a released Gram sum may be computed when every upload
        proved its statistics a Gram matrix; None: this backend proves no such statement (so the signed policy's
        definiteness check does not apply). Only split proves one."""
        return None
