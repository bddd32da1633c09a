"""Protection backends behind one interface: ``plain``, ``ckks``, ``secagg``.

Use :func:`get_backend` with a :class:`~secure_afl.params.SessionParams`.
"""

from __future__ import annotations

from ..params import SessionParams
from .base import Combiner, ProtectionBackend, check_vector

__all__ = ["get_backend", "ProtectionBackend", "Combiner", "check_vector"]


def get_backend(params: SessionParams) -> ProtectionBackend:
    if params.backend == "plain":
        from .plain import PlainBackend

        return PlainBackend(params)
    if params.backend == "ckks":
        from .ckks import CKKSBackend

        return CKKSBackend(params)
    if params.backend == "secagg":
        from .secagg import SecAggBackend

        return SecAggBackend(params)
    raise ValueError(f"unknown backend {params.backend!r}")
