"""The fields split's proof runs over, as objects: one interface (:class:`Goldilocks` shows it), so that
:class:`~secure_afl.hazmat.flp.BitProof`, :mod:`secure_afl.hazmat.flp_square` and :mod:`secure_afl.split` run
over whichever field a session's signed parameters name.

.. warning::

    Hazardous material, like :mod:`secure_afl.hazmat.flp`. The recipe API is :mod:`secure_afl.split`.

Element arrays are numpy arrays with one array element per field element (``dtype`` says which), so slicing,
indexing, concatenation and reshaping work the same in every field; ``to_bytes`` is the wire encoding
(``ENCODED_SIZE`` little-endian bytes per element), and a non-canonical element on the wire is
:class:`MalformedPayload`, never reduced.
"""

from __future__ import annotations

import numpy as np

from ..exceptions import InvalidParameterError
from .flp import GOLDILOCKS, Goldilocks

__all__ = ["Goldilocks", "GOLDILOCKS", "FIELD_NAMES", "field_named", "small", "canonical"]


#: the fields a session may name (its signed ``[split]`` parameters' ``field``)
FIELD_NAMES = ("goldilocks", "field128")


def field_named(name):
    """The field object a session's signed parameters name; :class:`InvalidParameterError` naming anything
    else (a session signed before the field was part of its parameters names none)."""
    if name == GOLDILOCKS.name:
        return GOLDILOCKS
    if name == "field128":
        from .field128 import FIELD128

        return FIELD128
    if name is None:
        raise InvalidParameterError("the session's parameters name no proof field: it was signed before the "
                                    "field was bound into the proof; sign the session again")
    raise InvalidParameterError(f"unknown proof field {name!r}; expected one of {', '.join(FIELD_NAMES)}")


def small(F, u: np.ndarray) -> np.ndarray:
    """Non-negative uint64 values below ``2^64`` (and below p) as elements of field ``F``, without a Python
    integer per entry: Goldilocks takes them as they are, a field with a two-word element puts them in its low
    word."""
    u = np.asarray(u, dtype=np.uint64)
    if F.dtype == np.dtype(np.uint64):
        return u
    out = F.zeros(u.shape)
    out["lo"] = u
    return out


def canonical(F, a, what: str = "field vector") -> np.ndarray:
    """``a`` as an array of field ``F``'s elements; :class:`MalformedPayload` if one is not in ``[0, p)``
    (through the field's own check, or its byte decoding, which refuses such an element)."""
    check = getattr(F, "canonical", None)
    if check is not None:
        return check(a, what)
    a = np.asarray(a, dtype=F.dtype)
    return F.from_bytes(F.to_bytes(a), what=what).reshape(a.shape)

