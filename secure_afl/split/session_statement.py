"""The session's statement, built from its signed parameters: the plain or DP statement, with the Gram part where
the session signs ``[split] gram_proof``. The proof system (:mod:`secure_afl.split.proof`) calls this and names
no statement itself.
"""

from __future__ import annotations

from ..params import SessionParams
from .gram_statement import GramStatement
from .statements import Composed, DPStatement, PlainStatement

__all__ = ["statement_for"]


def statement_for(params: SessionParams, sizes: dict, f1: int, L: int) -> Composed:
    """The session's statement: the plain or DP one, with the Gram part where the session signs it."""
    parts = [(DPStatement if params.dp is not None else PlainStatement)(params, sizes, f1)]
    if sizes["gram"] is not None:
        parts.append(GramStatement(params, sizes["gram"], L))
    return Composed(parts)
