"""Small boundary checks (pyca ``_check_bytes`` style, scikit-learn wording)."""

from __future__ import annotations

import numbers

import numpy as np

from .exceptions import InvalidInputError, InvalidParameterError


def param_error(name: str, caller: str, constraint: str, value) -> InvalidParameterError:
    return InvalidParameterError(
        f"The {name!r} parameter of {caller} must be {constraint}. Got {value!r} instead."
    )


def check_int(name: str, value, caller: str, *, low: int | None = None, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise param_error(name, caller, "an int", value)
    if (low is not None and value < low) or (high is not None and value > high):
        rng = f"an int in the range [{low if low is not None else '-inf'}, {high if high is not None else 'inf'}]"
        raise param_error(name, caller, rng, value)
    return int(value)


def check_real(name: str, value, caller: str, *, low: float | None = None, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value):
        raise param_error(name, caller, "a finite real number", value)
    if low is not None and (value < low or (low_open and value == low)):
        bracket = "(" if low_open else "["
        raise param_error(name, caller, f"a float in the range {bracket}{low}, inf)", value)
    return float(value)


def check_embeddings(X, *, dim: int | None = None, name: str = "X") -> np.ndarray:
    """Return X as a 2-D float64 array or raise InvalidInputError."""
    if isinstance(X, (str, bytes)) or X is None:
        raise InvalidInputError(f"{name} must be a 2-D numeric array; got {type(X).__name__}.")
    arr = np.asarray(X)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise InvalidInputError(f"{name} must be numeric; got dtype {arr.dtype}.")
    if arr.ndim != 2:
        raise InvalidInputError(f"{name} must be 2-D (samples x dim); got shape {arr.shape}.")
    if arr.shape[0] == 0:
        raise InvalidInputError(f"{name} is empty (0 samples).")
    if dim is not None and arr.shape[1] != dim:
        raise InvalidInputError(f"{name} has dim {arr.shape[1]}, expected {dim}.")
    arr = arr.astype(np.float64, copy=False)
    if not np.all(np.isfinite(arr)):
        raise InvalidInputError(f"{name} contains NaN or inf.")
    return arr


def check_labels(y, *, n: int, n_classes: int, name: str = "y") -> np.ndarray:
    arr = np.asarray(y)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise InvalidInputError(f"{name} must be 1-D with {n} labels; got shape {arr.shape}.")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise InvalidInputError(f"{name} must hold integer class labels.")
    elif arr.dtype.kind not in "iu":
        raise InvalidInputError(f"{name} must hold integer class labels; got dtype {arr.dtype}.")
    arr = arr.astype(np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= n_classes):
        raise InvalidInputError(
            f"{name} has labels outside [0, {n_classes}): min {arr.min()}, max {arr.max()}."
        )
    return arr
