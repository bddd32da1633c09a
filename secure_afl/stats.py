"""Local sufficient statistics of a hospital (AFL local stage).

A hospital k with embeddings X_k (N_k x d) and one-hot labels Y_k (N_k x C)
needs only

    C_k = X_k^T X_k,   Q_k = X_k^T Y_k,   n_k = N_k,   counts_k[c] = #{i: y_i = c}

(paper, eq. (3)-(4) with the RI intermediary of eq. (13): the uploaded Gram is
C_k^r = C_k + gamma I). Everything is accumulated in float64, batch by batch,
so X_k never has to be held in memory at once.

Runs on: the hospital. Sees: its own embeddings only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._validation import check_embeddings, check_int, check_labels, check_real
from .exceptions import BoundsExceeded, InvalidInputError, RoundAlreadyClosed

__all__ = ["SufficientStatistics", "StatisticsAccumulator", "local_statistics"]


@dataclass
class SufficientStatistics:
    """C (d x d, symmetric), Q (d x C), n, class counts, and contributors.

    ``gram`` holds X^T X + (contributors * gamma) I when ``gamma`` > 0 was
    added (the RI intermediary); :func:`secure_afl.analytic.ri_restore` removes it.
    ``contributors`` is 1 for one hospital and K for a sum of K. ``tag`` is the
    aggregate check value (:mod:`secure_afl.tagging`); None means zero.
    """

    gram: np.ndarray
    cross: np.ndarray
    n: float
    class_counts: np.ndarray
    contributors: float = 1.0
    gamma: float = 0.0
    tag: np.ndarray | None = None

    @property
    def dim(self) -> int:
        return int(self.gram.shape[0])

    @property
    def n_classes(self) -> int:
        return int(self.cross.shape[1])

    def __add__(self, other: "SufficientStatistics") -> "SufficientStatistics":
        if self.gram.shape != other.gram.shape or self.cross.shape != other.cross.shape:
            raise InvalidInputError("cannot add statistics of different shapes")
        if self.gamma != other.gamma:
            raise InvalidInputError("cannot add statistics with different gamma")
        return SufficientStatistics(
            self.gram + other.gram,
            self.cross + other.cross,
            self.n + other.n,
            self.class_counts + other.class_counts,
            self.contributors + other.contributors,
            self.gamma,
            None if self.tag is None and other.tag is None else _tag(self) + _tag(other),
        )


def _tag(s: SufficientStatistics) -> np.ndarray:
    from .packing import TAG_SLOTS

    return np.zeros(TAG_SLOTS) if s.tag is None else np.asarray(s.tag, dtype=np.float64)


@dataclass
class StatisticsAccumulator:
    """Streaming accumulator of (C_k, Q_k, n_k, counts) in float64.

    Parameters
    ----------
    dim, n_classes : int
        Embedding dimension d and number of classes C.
    max_norm : float, optional
        Declared embedding-norm bound B. A row with ||x||_2 > B raises
        :class:`BoundsExceeded` before it is accumulated, because the
        protection parameters were sized for B.
    """

    dim: int
    n_classes: int
    max_norm: float | None = None
    _gram: np.ndarray = field(init=False, repr=False)
    _cross: np.ndarray = field(init=False, repr=False)
    _counts: np.ndarray = field(init=False, repr=False)
    _closed: bool = field(init=False, default=False, repr=False)

    def __post_init__(self):
        check_int("dim", self.dim, "StatisticsAccumulator", low=1)
        check_int("n_classes", self.n_classes, "StatisticsAccumulator", low=1)
        if self.max_norm is not None:
            check_real("max_norm", self.max_norm, "StatisticsAccumulator", low=0.0, low_open=True)
        self._gram = np.zeros((self.dim, self.dim), dtype=np.float64)
        self._cross = np.zeros((self.dim, self.n_classes), dtype=np.float64)
        self._counts = np.zeros(self.n_classes, dtype=np.float64)

    @property
    def n(self) -> int:
        return int(self._counts.sum())

    def update(self, X, y) -> "StatisticsAccumulator":
        """Add one batch: C += X^T X, Q += X^T onehot(y), counts += bincount(y)."""
        if self._closed:
            raise RoundAlreadyClosed("accumulator already finalised")
        X = check_embeddings(X, dim=self.dim)
        y = check_labels(y, n=X.shape[0], n_classes=self.n_classes)
        if self.max_norm is not None:
            norms = np.sqrt(np.einsum("ij,ij->i", X, X))
            if norms.max() > self.max_norm:
                raise BoundsExceeded(
                    f"embedding norm {norms.max():.6g} exceeds the declared bound B={self.max_norm}; "
                    "raise B for the session or normalise the embeddings"
                )
        self._gram += X.T @ X
        # X^T onehot(y) without building the one-hot matrix: per-class sums.
        np.add.at(self._cross.T, y, X)
        self._counts += np.bincount(y, minlength=self.n_classes)
        return self

    def finalize(self, *, gamma: float = 0.0) -> SufficientStatistics:
        """Return C_k^r = C_k + gamma I, Q_k, n_k, counts. Refuses an empty accumulator."""
        gamma = check_real("gamma", gamma, "StatisticsAccumulator.finalize", low=0.0)
        if self.n == 0:
            raise InvalidInputError("no samples were accumulated; a hospital needs at least one")
        self._closed = True
        gram = self._gram.copy()
        gram[np.diag_indices(self.dim)] += gamma
        gram = 0.5 * (gram + gram.T)  # exact symmetry for packing the upper triangle
        return SufficientStatistics(gram, self._cross.copy(), float(self.n), self._counts.copy(), 1.0, gamma)


def local_statistics(X, y, n_classes: int, *, gamma: float = 0.0, batch_size: int = 4096,
                     max_norm: float | None = None) -> SufficientStatistics:
    """Convenience wrapper: accumulate (X, y) in batches and finalise."""
    X = check_embeddings(X)
    acc = StatisticsAccumulator(X.shape[1], n_classes, max_norm=max_norm)
    y = np.asarray(y)
    if y.ndim != 1 or y.shape[0] != X.shape[0]:
        raise InvalidInputError(f"y must be 1-D with {X.shape[0]} labels; got shape {y.shape}.")
    for s in range(0, X.shape[0], batch_size):
        acc.update(X[s:s + batch_size], y[s:s + batch_size])
    return acc.finalize(gamma=gamma)
