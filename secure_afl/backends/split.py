"""The ``split`` backend behind the one interface; the protocol lives in :mod:`secure_afl.split`.

This adapter is the hospital software's side of the pure roles: it draws each proving try's randomness
(``os.urandom``) and retries while the projection is unlucky; the server's running sum is a
:class:`~secure_afl.protection.Combiner` over the uploads' lane words.
"""

from __future__ import annotations

import os

import numpy as np

from ..envelope import seal
from ..exceptions import BoundsExceeded, MalformedPayload
from ..hazmat import fixedpoint
from ..params import SessionParams
from ..split import roles
from ..split.proof import Circuit
from ..split.sizes import RETRIES, noise_beside
from ..dp.noise import noise_share
from ..split.statements import Unlucky
from ..protection import Combiner, ProtectionBackend

__all__ = ["SplitBackend", "noise_beside"]


class _SplitCombiner(Combiner):
    """``Y = sum y_k mod p`` in the session's field (O(L) memory); the server cannot read any y_k or Y."""

    def __init__(self, backend: "SplitBackend"):
        super().__init__()
        self._b = backend
        self._F = backend.circuit.F
        self._sum = self._F.zeros(backend.circuit.main_len)

    def _add(self, payload) -> None:
        # the server's upload check opens the envelope and hands its words here (an array), not the bytes again
        words = payload[:self._b.circuit.main_len] if isinstance(payload, np.ndarray) else \
            self._b.masked_words(payload)
        self._sum = self._F.add(self._sum, words)

    def _partial(self) -> bytes:
        return self._F.to_bytes(self._sum)

    def _merge(self, body: bytes) -> None:
        if len(body) != self._F.ENCODED_SIZE * self._sum.shape[0]:
            raise MalformedPayload("split partial sum has the wrong length")
        self._sum = self._F.add(self._sum, self._F.from_bytes(body, what="split partial sum"))

    def _aggregate(self) -> bytes:
        return seal(self._b.params, "aggregate", self._partial(), contributors=self.count)


class SplitBackend(ProtectionBackend):
    """``split`` behind the common interface (:mod:`secure_afl.split` for the protocol).

    * hospital: ``protect(vector, public_context=T_pub, hospital=name, identity_key=k)`` -> ``(payload,
      signed seed statement)``
    * server:   ``combiner()``; collector: ``reveal`` (:func:`secure_afl.split.roles.collect`)
    * key holder: :func:`secure_afl.split.roles.keyholder_share`, :func:`secure_afl.split.signed_messages.sign_share`
    """

    name = "split"

    def __init__(self, params: SessionParams):
        super().__init__(params)
        fixedpoint.check_frac_bits(params.backend_params.get("frac_bits"), params.bounds, params.gamma)
        self.circuit = Circuit(params)

    @property
    def frac_bits(self) -> tuple:
        return tuple(self.params.backend_params["frac_bits"])

    def protect(self, vector, *, public_context: bytes, hospital: str, identity_key, seed: bytes | None = None,
                noise=None, **kw) -> tuple[bytes, dict]:
        """Hospital: :func:`secure_afl.split.roles.shard` with fresh randomness per try.

        Under DP with the Gram statement (:func:`noise_beside`) ``vector`` is the statistics before the noise:
        the hospital's noise share is drawn here (``noise``: a given one, for tests) and proven beside them.
        ``seed`` is for tests of fixed vectors only (the mask seed; the proofs' blinding stays fresh)."""
        if noise_beside(self.params) and noise is None:
            noise = noise_share(self.params)
        size = self.circuit.rand_size
        for _ in range(RETRIES):
            rand = os.urandom(size) if seed is None else bytes(seed) + os.urandom(size - len(seed))
            try:
                return roles.shard(self.circuit, vector, hospital=hospital, public_context=public_context,
                                   identity_key=identity_key, rand=rand, noise=noise)
            except Unlucky:
                if seed is not None:
                    raise
        raise BoundsExceeded(f"{RETRIES} fresh seeds all drew projection rows outside the honest range: "
                             "the vector is not within the declared l2 bound")

    def seal_upload(self, body, seed: bytes, commitment, public_context: bytes, hospital: str,
                    identity_key) -> tuple[bytes, dict]:
        """:func:`secure_afl.split.roles.seal_upload` under this session."""
        return roles.seal_upload(self.params, body, seed, commitment, public_context, hospital, identity_key)

    def upload_share(self, payload: bytes) -> np.ndarray:
        """The server's share of an upload: every word (main vector, bits, proofs), each a field element."""
        return self.circuit.upload_share(payload)

    def masked_words(self, payload: bytes) -> np.ndarray:
        """The masked main vector (``lanes_per_value * L`` field elements), the part that is summed."""
        return self.upload_share(payload)[:self.circuit.main_len]

    def admit(self, payload: bytes, tag, *, hospital: str, identity_pub, payload_sha256: str):
        """The signed seed statement of this payload, then its validity commitment against the payload's words
        (the envelope opened once: the running sum takes the words returned)."""
        from ..split.signed_messages import verify_seed_statement

        if not isinstance(tag, dict):
            raise MalformedPayload("a split upload needs its signed seed statement")
        verify_seed_statement(tag, identity_pub, self.params, hospital, payload_sha256)
        return roles.check_upload(self.circuit, payload, tag)

    def combiner(self, **kw) -> Combiner:
        return _SplitCombiner(self)

    def reveal(self, aggregate: bytes, *, share: np.ndarray, **kw) -> np.ndarray:
        """Collector: the float64 sum from the masked aggregate and the key holder's (verified) share."""
        return roles.collect(self.params, aggregate, share)

    def psd_tolerance(self, gram: np.ndarray) -> float:
        """:func:`secure_afl.split.sizes.psd_tolerance`: what the low lanes, the rounding and, under DP, the
        proven noise shares can move the smallest eigenvalue of a released Gram sum by."""
        from ..split.sizes import psd_tolerance

        return psd_tolerance(self.params, gram)
