"""The key holder's release, one module per path: ``he`` (ckks, bfv), ``split_share`` (split),
``reveal`` (plain, secagg), over ``common`` (trust, policy, audit countersignature, solve, model file);
``finalize`` dispatches on the signed session's backend."""

from secure_afl.model_file import read_model, write_model

from .common import FinalResult, HTTPSource
from .finalize import KeyHolder
from .he import ridge_if_needed

__all__ = ["KeyHolder", "FinalResult", "HTTPSource", "write_model", "read_model", "ridge_if_needed"]
