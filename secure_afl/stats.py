"""Local sufficient statistics of a hospital (AFL local stage).

A hospital k with embeddings X_k (N_k x d) and one-hot labels Y_k (N_k x C)
needs only

    C_k = X_k^T X_k,   Q_k = X_k^T Y_k,   n_k = N_k,   counts_k[c] = #{i: y_i = c}

(paper, eq. (3)-(4) with the RI intermediary of eq. (13): the uploaded Gram is
C_k^r = C_k + gamma I). Everything is accumulated in float64, batch by batch,
so X_k never has to be held in memory at once; batches may be numpy arrays or
torch tensors (then the sums stay on the tensor's device). The declared
per-row bound B is enforced by :func:`enforce_norm_bound` only.

Runs on: the hospital. Sees: its own embeddings only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._validation import check_embeddings, check_int, check_labels, check_real
from .exceptions import BoundsExceeded, InvalidInputError, RoundAlreadyClosed

__all__ = ["SufficientStatistics", "StatisticsAccumulator", "enforce_norm_bound", "local_statistics", "TAG_SLOTS"]

# values of the aggregate tag each contribution carries (secure_afl.tagging); the packed layout reserves them
TAG_SLOTS = 4


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
    return np.zeros(TAG_SLOTS) if s.tag is None else np.asarray(s.tag, dtype=np.float64)


def enforce_norm_bound(peak: float, max_norm: float | None, *, where: str = "embedding") -> None:
    """Refuse a largest row norm above the declared bound B (None: no bound declared).

    The single place the per-row bound ||x_i||_2 <= B is enforced: the
    accumulator calls it on every batch before adding it, the statistics-file
    loader on the norm the file records. The protection parameters (fixed-point
    scale, CKKS noise budget, DP sensitivity) were sized for B, so a larger row
    would silently overflow or void the privacy guarantee.
    """
    if max_norm is None:
        return
    if not peak <= max_norm:  # also refuses a NaN peak
        raise BoundsExceeded(
            f"{where} norm {peak:.6g} exceeds the declared bound B={max_norm}; "
            "raise B for the session or normalise the embeddings"
        )


def _is_torch(a) -> bool:
    # decided by type, so torch is imported only when a tensor is actually given
    return type(a).__module__.split(".", 1)[0] == "torch"


class StatisticsAccumulator:
    """Streaming accumulator of (C_k, Q_k, n_k, counts) in float64, numpy or torch.

    Parameters
    ----------
    dim, n_classes : int
        Embedding dimension d and number of classes C.
    max_norm : float, optional
        Declared embedding-norm bound B. A batch with a row ||x||_2 > B raises
        :class:`BoundsExceeded` before it is accumulated, because the
        protection parameters were sized for B.

    The first batch fixes where the sums live: numpy arrays on the host, or a
    torch tensor's device (C += X^T X as a float64 ``addmm_`` there, so GPU
    extraction never copies embeddings back). Later batches of the other kind
    are moved to it. torch is imported only when a tensor is given.
    ``max_row_norm`` is the largest ||x_i||_2 seen so far.
    """

    def __init__(self, dim: int, n_classes: int, max_norm: float | None = None):
        self.dim = check_int("dim", dim, "StatisticsAccumulator", low=1)
        self.n_classes = check_int("n_classes", n_classes, "StatisticsAccumulator", low=1)
        self.max_norm = (None if max_norm is None else
                         check_real("max_norm", max_norm, "StatisticsAccumulator", low=0.0, low_open=True))
        self._device = None  # None: numpy; else the torch device of the sums
        self._gram = np.zeros((self.dim, self.dim), dtype=np.float64)
        self._cross_t = np.zeros((self.n_classes, self.dim), dtype=np.float64)  # Q^T: one row per class
        self._counts = np.zeros(self.n_classes, dtype=np.int64)
        self._peak = 0.0
        self._started = False
        self._closed = False

    @property
    def n(self) -> int:
        return int(self._counts.sum())

    @property
    def max_row_norm(self) -> float:
        """max_i ||x_i||_2 over every accumulated row (0 before the first batch)."""
        return self._peak

    def update(self, X, y) -> "StatisticsAccumulator":
        """Add one batch: C += X^T X, Q += X^T onehot(y), counts += bincount(y)."""
        if self._closed:
            raise RoundAlreadyClosed("accumulator already finalised")
        if not self._started and (_is_torch(X) or _is_torch(y)):
            self._to_torch(X if _is_torch(X) else y)
        self._started = True
        if self._device is None:
            X, y, peak = self._numpy_batch(X, y)
        else:
            X, y, peak = self._torch_batch(X, y)
        enforce_norm_bound(peak, self.max_norm)
        self._peak = max(self._peak, peak)
        if self._device is None:
            with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused by finalize
                self._gram += X.T @ X
                np.add.at(self._cross_t, y, X)  # X^T onehot(y) without building the one-hot matrix
            self._counts += np.bincount(y, minlength=self.n_classes)
        else:
            self._gram.addmm_(X.T, X)
            self._cross_t.index_add_(0, y, X)
            self._counts += self._bincount(y)
        return self

    def _numpy_batch(self, X, y):
        if _is_torch(X):
            X = X.detach().cpu().numpy()
        if _is_torch(y):
            y = y.detach().cpu().numpy()
        X = check_embeddings(X, dim=self.dim)
        y = check_labels(y, n=X.shape[0], n_classes=self.n_classes)
        with np.errstate(over="ignore"):  # an overflowing norm is inf, which any bound refuses
            return X, y, float(np.sqrt(np.einsum("ij,ij->i", X, X).max()))

    def _to_torch(self, like) -> None:
        import torch

        self._device = like.device
        self._gram = torch.zeros(self.dim, self.dim, dtype=torch.float64, device=self._device)
        self._cross_t = torch.zeros(self.n_classes, self.dim, dtype=torch.float64, device=self._device)
        self._counts = torch.zeros(self.n_classes, dtype=torch.int64, device=self._device)

    def _bincount(self, y):
        import torch

        return torch.bincount(y, minlength=self.n_classes)

    def _torch_batch(self, X, y):
        """The checks of :func:`check_embeddings` / :func:`check_labels` on the device, one sync per batch."""
        import torch

        # detached: statistics are data, never part of a caller's autograd graph
        X = torch.as_tensor(X, device=self._device).detach()
        y = torch.as_tensor(y, device=self._device).detach()
        if X.is_complex():
            raise InvalidInputError(f"X must be real numeric; got dtype {X.dtype}.")
        if X.ndim != 2:
            raise InvalidInputError(f"X must be 2-D (samples x dim); got shape {tuple(X.shape)}.")
        if X.shape[0] == 0:
            raise InvalidInputError("X is empty (0 samples).")
        if X.shape[1] != self.dim:
            raise InvalidInputError(f"X has dim {X.shape[1]}, expected {self.dim}.")
        if y.ndim != 1 or y.shape[0] != X.shape[0]:
            raise InvalidInputError(f"y must be 1-D with {X.shape[0]} labels; got shape {tuple(y.shape)}.")
        if y.dtype == torch.bool or y.is_complex():
            raise InvalidInputError(f"y must hold integer class labels; got dtype {y.dtype}.")
        X = X.to(torch.float64)
        yf = y.to(torch.float64)
        # one host round trip for every value check: GPU extraction stays pipelined
        peak_sq, finite, integral, lo, hi = torch.stack([
            (X * X).sum(dim=1).max(), torch.isfinite(X).all().to(torch.float64),
            ((yf == yf.round()) & torch.isfinite(yf)).all().to(torch.float64), yf.min(), yf.max()]).tolist()
        if not finite:
            raise InvalidInputError("X contains NaN or inf.")
        if not integral:
            raise InvalidInputError("y must hold integer class labels.")
        if lo < 0 or hi >= self.n_classes:
            raise InvalidInputError(f"y has labels outside [0, {self.n_classes}): min {lo:g}, max {hi:g}.")
        return X, y.to(torch.int64), float(np.sqrt(peak_sq))

    def finalize(self, *, gamma: float = 0.0) -> SufficientStatistics:
        """Return C_k^r = C_k + gamma I, Q_k, n_k, counts. Refuses an empty accumulator."""
        gamma = check_real("gamma", gamma, "StatisticsAccumulator.finalize", low=0.0)
        if self.n == 0:
            raise InvalidInputError("no samples were accumulated; a hospital needs at least one")
        if self._device is None:
            gram, cross, counts = self._gram.copy(), self._cross_t.T.copy(), self._counts
        else:
            gram, cross = self._gram.cpu().numpy(), self._cross_t.T.cpu().numpy().copy()
            counts = self._counts.cpu().numpy()
        if not (np.all(np.isfinite(gram)) and np.all(np.isfinite(cross))):
            # finite rows whose products overflow float64: refuse rather than upload inf
            raise BoundsExceeded("the statistics overflowed float64; normalise the embeddings")
        self._closed = True
        gram[np.diag_indices(self.dim)] += gamma
        gram = 0.5 * (gram + gram.T)  # exact symmetry for packing the upper triangle
        counts = counts.astype(np.float64)
        return SufficientStatistics(gram, cross, float(counts.sum()), counts, 1.0, gamma)


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
