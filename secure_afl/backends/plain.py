"""``plain``: no protection. The reference path for verification and tests.

Whoever holds a plain payload reads the hospital's statistics; use it only to
produce the plaintext reference that the protected backends are checked against.
"""

from __future__ import annotations

import numpy as np

from ..envelope import open_envelope, seal
from ..exceptions import MalformedPayload
from ..protection import Combiner, ProtectionBackend, check_vector

__all__ = ["PlainBackend"]


class _PlainCombiner(Combiner):
    def __init__(self, backend: "PlainBackend"):
        super().__init__()
        self._b = backend
        self._sum = np.zeros(backend.params.layout.length, dtype=np.float64)

    def _add(self, payload: bytes) -> None:
        # The server can see plain contributions, so it enforces the declared bounds too.
        self._sum += check_vector(self._b.params, self._b._decode(payload, "contribution"))

    def _partial(self) -> bytes:
        return self._sum.astype("<f8").tobytes()

    def _merge(self, body: bytes) -> None:
        if len(body) != 8 * self._sum.shape[0]:
            raise MalformedPayload("plain partial sum has the wrong length")
        part = np.frombuffer(body, dtype="<f8")
        if not np.all(np.isfinite(part)):
            raise MalformedPayload("plain partial sum holds NaN or inf")
        self._sum += part

    def _aggregate(self) -> bytes:
        return seal(self._b.params, "aggregate", self._sum.astype("<f8").tobytes(), contributors=self.count)


class PlainBackend(ProtectionBackend):
    name = "plain"

    def protect(self, vector, **kw) -> bytes:
        v = check_vector(self.params, vector)
        return seal(self.params, "contribution", v.astype("<f8").tobytes())

    def combiner(self, **kw) -> Combiner:
        return _PlainCombiner(self)

    def reveal(self, aggregate: bytes, **kw) -> np.ndarray:
        return self._decode(aggregate, "aggregate")

    def _decode(self, payload: bytes, kind: str) -> np.ndarray:
        env = open_envelope(self.params, payload, kind)
        if len(env.body) != 8 * self.params.layout.length:
            raise MalformedPayload("plain body has the wrong length")
        v = np.frombuffer(env.body, dtype="<f8").astype(np.float64)
        if not np.all(np.isfinite(v)):
            raise MalformedPayload("plain body holds NaN or inf")
        return v
