"""Hospital-side files: embeddings (.npz) and local statistics (.npz).

Runs on: the hospital. Sees: its own embeddings and statistics only. Nothing
here needs torch, so ``secure-afl client submit`` can read either file on a
machine without the backbone stack.

Two file kinds, both plain ``.npz`` archives readable with
``numpy.load(path, allow_pickle=False)``:

* embeddings file (``client embed --out FILE``)::

      X        (N, d) float32 or float64   penultimate-layer embeddings
      y        (N,)   int64                class index into ``classes``
      classes  (C,)   str                  class names, index order
      format   "secure-afl/embeddings/v1"  + metadata (backbone, weights, ...)

* statistics file (``client embed --stats-only FILE``)::

      gram     (d, d) float64   C_k = X_k^T X_k   (never includes gamma)
      cross    (d, C) float64   Q_k = X_k^T Y_k   (Y_k one-hot)
      counts   (C,)   float64   samples per class
      n        ()     int64     N_k = counts.sum()
      classes  (C,)   str
      gamma    ()     float64   RI intermediary requested at extraction time
                                (metadata only: it is NOT added to ``gram``)
      format   "secure-afl/statistics/v1"  + metadata, among it
      max_row_norm  ()  float64  max_i ||x_i||_2, to check the declared bound B

:func:`load_statistics_file` accepts either kind and returns the statistics
(``gamma`` = 0) and the class names, checked against the session's class
count and norm bound B; it is the only reader of either kind (``client
submit``, the Flower client app and the library all call it).
Files are written atomically (temporary file in the same directory, fsync,
``os.replace``) so a failed run never leaves a partial file that looks complete.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from secure_afl import domains
from secure_afl.exceptions import BoundsExceeded, InvalidInputError
from secure_afl.stats import StatisticsAccumulator, SufficientStatistics, enforce_norm_bound

__all__ = [
    "EMBEDDINGS_FORMAT",
    "STATISTICS_FORMAT",
    "StatisticsFileError",
    "atomic_savez",
    "check_readable",
    "write_embeddings_file",
    "write_statistics_file",
    "load_statistics_file",
    "load_embeddings_file",
    "read_metadata",
]

EMBEDDINGS_FORMAT = domains.EMBEDDINGS_FORMAT
STATISTICS_FORMAT = domains.STATISTICS_FORMAT

_ARRAY_KEYS = {"X", "y", "classes", "gram", "cross", "counts", "n"}


class StatisticsFileError(InvalidInputError):
    """An embeddings / statistics file is missing, unreadable or inconsistent."""

    reason = "bad_statistics_file"


def atomic_savez(path, **arrays) -> Path:
    """``np.savez`` to a temp file next to ``path``, fsync, then ``os.replace``.

    On any failure the temporary file is removed and ``path`` is untouched.
    The file is written exactly at ``path`` (no ``.npz`` suffix is appended).
    """
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def _meta_arrays(metadata: dict | None) -> dict:
    out = {}
    for key, value in (metadata or {}).items():
        if key in _ARRAY_KEYS or key == "format":
            raise ValueError(f"metadata key {key!r} is reserved")
        out[key] = np.asarray("" if value is None else value)
    return out


def _classes_array(classes) -> np.ndarray:
    names = [str(c) for c in classes]
    if not names:
        raise InvalidInputError("at least one class name is required")
    return np.asarray(names, dtype=np.str_)


def write_embeddings_file(path, X, y, classes, metadata: dict | None = None) -> Path:
    """Write the embeddings file (X, y, classes, metadata) atomically."""
    X = np.asarray(X)
    y = np.asarray(y, dtype=np.int64)
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise InvalidInputError(f"X must be (N, d) and y (N,); got {X.shape} and {y.shape}")
    return atomic_savez(path, X=X, y=y, classes=_classes_array(classes),
                        format=np.asarray(EMBEDDINGS_FORMAT), **_meta_arrays(metadata))


def write_statistics_file(path, stats: SufficientStatistics, classes, metadata: dict | None = None) -> Path:
    """Write C_k, Q_k, counts, n and classes atomically.

    ``stats`` must not carry gamma (``stats.gamma == 0``): the file holds the
    raw X^T X; the RI intermediary is added at submission time.
    """
    if stats.gamma != 0:
        raise InvalidInputError("the statistics file stores X^T X without gamma; pass stats with gamma=0")
    classes = _classes_array(classes)
    if classes.shape[0] != stats.n_classes:
        raise InvalidInputError(f"{classes.shape[0]} class names for {stats.n_classes} classes")
    return atomic_savez(
        path,
        gram=np.asarray(stats.gram, dtype=np.float64),
        cross=np.asarray(stats.cross, dtype=np.float64),
        counts=np.asarray(stats.class_counts, dtype=np.float64),
        n=np.asarray(int(round(stats.n)), dtype=np.int64),
        classes=classes,
        format=np.asarray(STATISTICS_FORMAT),
        **_meta_arrays(metadata),
    )


def check_readable(path) -> Path:
    """``path`` if it is an ``.npz`` archive; else :class:`StatisticsFileError` saying what it is not.

    Cheap (the zip directory only), so a command can refuse a wrong path before it contacts anyone.
    """
    path = Path(path)
    if not path.is_file():
        raise StatisticsFileError(f"{path}: no such file (expected the statistics file written by "
                                  "`secure-afl client embed --stats-only`)")
    if not zipfile.is_zipfile(path):
        # np.load would try it as a pickle and answer with advice about allow_pickle, which is never wanted
        raise StatisticsFileError(f"{path} is not a statistics or embeddings file (not an .npz archive); "
                                  "use the file written by `secure-afl client embed`")
    return path


def _open(path):
    path = check_readable(path)
    try:
        return np.load(path, allow_pickle=False)
    except Exception:  # zipfile.BadZipFile, OSError ...
        raise StatisticsFileError(f"{path} is not a statistics or embeddings file (a damaged .npz archive)") \
            from None


def _array(z, key: str, path):
    """``z[key]``, refusing arrays of Python objects (they would need unpickling)."""
    try:
        return z[key]
    except (ValueError, OSError, zipfile.BadZipFile):
        raise StatisticsFileError(f"{path} is not a statistics or embeddings file ({key!r} is not a numeric "
                                  "or text array)") from None


def read_metadata(path) -> dict:
    """All 0-d entries of an embeddings / statistics file as Python scalars/str."""
    with _open(path) as z:
        meta = {k: _array(z, k, path) for k in z.files if k not in _ARRAY_KEYS}
        return {k: v.item() for k, v in meta.items() if v.ndim == 0}


def recorded_extractor(path) -> dict | None:
    """The feature-extractor fingerprint ``client embed`` recorded in the file, or None."""
    raw = read_metadata(path).get("extractor")
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        raise StatisticsFileError(f"{path}: the recorded extractor is not JSON") from None
    if not isinstance(value, dict):
        raise StatisticsFileError(f"{path}: the recorded extractor is not an object")
    return value


def load_embeddings_file(path, *, n_classes: int | None = None):
    """Return ``(X, y, classes)`` of an embeddings file, validated.

    A bare ``X``/``y`` archive (no ``classes``) is accepted when the caller
    knows the class count (``n_classes``); its classes are named "0".."C-1".
    """
    with _open(path) as z:
        missing = {"X", "y"} - set(z.files)
        if missing:
            raise StatisticsFileError(f"{path}: not an embeddings file (missing {sorted(missing)})")
        if "classes" in z.files:
            classes = [str(c) for c in _array(z, "classes", path)]
        elif n_classes is not None:
            classes = [str(i) for i in range(n_classes)]
        else:
            raise StatisticsFileError(f"{path}: not an embeddings file (missing ['classes'])")
        X, y = _array(z, "X", path), _array(z, "y", path)
    _check_class_count(path, len(classes), n_classes)
    if X.ndim != 2 or X.shape[0] == 0 or y.shape != (X.shape[0],) or y.dtype.kind not in "iu":
        raise StatisticsFileError(f"{path}: X must be (N>0, d) and y (N,) integers; got {X.shape}, {y.shape}")
    if X.dtype.kind not in "fiu":
        raise StatisticsFileError(f"{path}: X must be numeric; got dtype {X.dtype}")
    if y.min() < 0 or y.max() >= len(classes):
        raise StatisticsFileError(f"{path}: labels outside [0, {len(classes)})")
    if not np.all(np.isfinite(X)):
        raise StatisticsFileError(f"{path}: X contains NaN or inf")
    return X, y.astype(np.int64), classes


def load_statistics_file(path, *, n_classes: int | None = None, max_norm: float | None = None,
                         batch_size: int = 8192) -> tuple[SufficientStatistics, list[str]]:
    """Load a statistics file **or** an embeddings file: the one reader of both.

    Returns ``(stats, class_names)`` with ``stats.gamma == 0`` and
    ``stats.gram == X^T X`` (float64). For an embeddings file the statistics
    are accumulated here in float64, batch by batch.

    ``n_classes``: the session's class count; another count is refused.
    ``max_norm``: the session's bound B, enforced by
    :func:`secure_afl.stats.enforce_norm_bound` on every row of an embeddings
    file, or on the largest row norm a statistics file records (a file that
    records none cannot show it respects B and is refused).
    """
    with _open(path) as z:
        files = set(z.files)
        if "gram" not in files:
            kind = None
        else:
            kind = "stats"
            missing = {"gram", "cross", "counts", "n", "classes"} - files
            if missing:
                raise StatisticsFileError(f"{path}: incomplete statistics file (missing {sorted(missing)})")
            gram, cross, counts, n = (_array(z, k, path) for k in ("gram", "cross", "counts", "n"))
            classes = [str(c) for c in _array(z, "classes", path)]
            peak = _array(z, "max_row_norm", path) if "max_row_norm" in files else None
    if kind is None:
        X, y, classes = load_embeddings_file(path, n_classes=n_classes)
        acc = StatisticsAccumulator(X.shape[1], len(classes), max_norm=max_norm)
        for s in range(0, X.shape[0], batch_size):
            acc.update(X[s:s + batch_size], y[s:s + batch_size])
        return acc.finalize(gamma=0.0), classes

    d = gram.shape[0] if gram.ndim == 2 else -1
    C = len(classes)
    if gram.shape != (d, d) or d < 1 or cross.shape != (d, C) or counts.shape != (C,) or n.shape != ():
        raise StatisticsFileError(
            f"{path}: inconsistent shapes gram {gram.shape}, cross {cross.shape}, counts {counts.shape}, "
            f"{C} classes")
    _check_class_count(path, C, n_classes)
    try:
        gram, cross, counts = (a.astype(np.float64) for a in (gram, cross, counts))
        n = int(n)
        peak = None if peak is None else float(peak)
    except (TypeError, ValueError):
        raise StatisticsFileError(f"{path}: statistics are not numeric") from None
    if not (np.all(np.isfinite(gram)) and np.all(np.isfinite(cross)) and np.all(np.isfinite(counts))):
        raise StatisticsFileError(f"{path}: statistics contain NaN or inf")
    if not np.allclose(gram, gram.T, rtol=0, atol=1e-9 * max(1.0, float(np.abs(gram).max()))):
        raise StatisticsFileError(f"{path}: gram is not symmetric")
    if np.any(counts < 0) or np.any(counts != np.round(counts)) or counts.sum() != n or n < 1:
        raise StatisticsFileError(f"{path}: class counts do not add up to n={n}")
    if peak is not None and not np.trace(gram) <= n * peak * peak * (1 + 1e-9):
        # trace(X^T X) = sum_i ||x_i||^2 <= n max_i ||x_i||^2: the recorded norm cannot be the real one
        raise StatisticsFileError(f"{path}: gram's trace is larger than n * max_row_norm^2")
    if max_norm is not None:
        if peak is None:
            raise BoundsExceeded(f"{path} records no largest embedding norm, so it cannot show the session's "
                                 f"declared bound B={max_norm} holds; re-extract with `client embed`")
        enforce_norm_bound(peak, max_norm, where=f"{path}: largest embedding")
    stats = SufficientStatistics(0.5 * (gram + gram.T), cross, float(n), counts, 1.0, 0.0)
    return stats, classes


def _check_class_count(path, found: int, n_classes: int | None) -> None:
    if n_classes is not None and found != n_classes:
        # a session mismatch rather than a damaged file
        raise InvalidInputError(f"{path} has {found} classes; the session has {n_classes}")
