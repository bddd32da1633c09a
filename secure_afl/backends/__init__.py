"""Protection backends behind one interface: ``plain``, ``ckks``, ``bfv``, ``secagg``, ``split``.

Use :func:`get_backend` with a :class:`~secure_afl.params.SessionParams`.
"""

from __future__ import annotations

from ..params import HE_BACKENDS, SessionParams
from ..protection import Combiner, ProtectionBackend, check_vector

__all__ = ["get_backend", "ProtectionBackend", "Combiner", "check_vector", "HE_BACKENDS", "he_module"]


def get_backend(params: SessionParams) -> ProtectionBackend:
    if params.backend == "plain":
        from .plain import PlainBackend

        return PlainBackend(params)
    if params.backend == "ckks":
        from .ckks import CKKSBackend

        return CKKSBackend(params)
    if params.backend == "bfv":
        from .bfv import BFVBackend

        return BFVBackend(params)
    if params.backend == "secagg":
        from .secagg import SecAggBackend

        return SecAggBackend(params)
    if params.backend == "split":
        from .split import SplitBackend

        return SplitBackend(params)
    raise ValueError(f"unknown backend {params.backend!r}")


def he_module(backend: str):
    """The recipe module of a homomorphic backend: ``session_params``, ``generate_keys``,
    ``bind_public_context``, ``expected_abs_error`` under common names."""
    if backend == "ckks":
        from . import ckks as m

        return m
    if backend == "bfv":
        from . import bfv as m

        return m
    if backend == "split":  # not homomorphic, but keyed the same way: a per-session key the key holder signs
        from .. import split as m

        return m
    raise ValueError(f"{backend!r} is not a homomorphic backend ({HE_BACKENDS})")
