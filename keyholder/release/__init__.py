"""The key holder's release: ``session_release`` (one :class:`SessionRelease` per release: the signed policy, the
trust set and the opened key, read before any effect), one module per path over it: ``he`` (ckks, bfv),
``split_share`` (split), ``reveal`` (plain, secagg), sharing ``common`` (solve and privacy record, report,
checks, the server's stored uploads); ``finalize`` holds :class:`KeyHolder` (custody, split judges, online
stages) and dispatches on the signed session's backend."""

from secure_afl.model_file import read_model, write_model

from .common import FinalResult, HTTPSource
from .finalize import KeyHolder
from .he import ridge_if_needed
from .session_release import SessionRelease

__all__ = ["KeyHolder", "SessionRelease", "FinalResult", "HTTPSource", "write_model", "read_model",
           "ridge_if_needed"]
