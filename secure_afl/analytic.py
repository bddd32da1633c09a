"""AFL closed form: the AA law, RI restoration and the solve.

Notation follows the paper (AFL, He et al.): for hospital k,
C_k = X_k^T X_k, Q_k = X_k^T Y_k, and with the RI intermediary gamma
(eq. (13)) C_k^r = C_k + gamma I, W_k^r = (C_k^r)^-1 Q_k.

Three computations that must agree:

1. :func:`centralised_weights`  W = X^+ Y on the pooled data;
2. :func:`aa_law_aggregate` then :func:`ri_restore_weights`: the paper's
   pairwise Absolute Aggregation law over (W_k^r, C_k^r), eq. (9), (16);
3. :func:`solve_from_sums`: sum C_k^r and Q_k, remove K gamma I (RI
   restoration of the Gram, eq. (16)) and solve.

Derivation of the AA-law weighting matrices
-------------------------------------------
For two disjoint parts u, v of the data with invertible C_u, C_v the normal
equations of the pooled least-squares problem are

    (C_u + C_v) W = X_u^T Y_u + X_v^T Y_v = C_u W_u + C_v W_v,

because Q_u = C_u W_u. Hence W = 𝒲_u W_u + 𝒲_v W_v with

    𝒲_u = (C_u + C_v)^-1 C_u = I - (C_u + C_v)^-1 C_v,
    𝒲_v = (C_u + C_v)^-1 C_v = I - (C_u + C_v)^-1 C_u,

and 𝒲_u + 𝒲_v = I. With R_u = C_u^-1 and the identity
(C_u + C_v)^-1 = R_u - R_u C_v (C_u + C_v)^-1 this is

    𝒲_u = I - R_u C_v + R_u C_v (C_u + C_v)^-1 C_v.

The printed eq. (8) drops the ``- R_u C_v`` term and eq. (10) has the sign of
the last term flipped (``I - R_u C_v (I + C^-1 C_v)``); both fail the identity
above numerically (see :func:`paper_printed_weighting_matrices` and
tests/test_analytic.py), so this module implements the derived form, using
solves instead of explicit inverses.

RI restoration (eq. (16)): after K clients, C_agg^r = C_agg + K gamma I and
W = (C_agg^r - K gamma I)^-1 C_agg^r W_agg^r.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import scipy.linalg

from ._blas import one_blas_thread
from ._validation import check_embeddings, check_int, check_labels, check_real
from .exceptions import InvalidInputError
from .stats import SufficientStatistics

__all__ = [
    "solve_head",
    "solve_from_sums",
    "ri_restore_gram",
    "centralised_weights",
    "local_weights",
    "aa_law_pair",
    "aa_law_aggregate",
    "ri_restore_weights",
    "paper_printed_weighting_matrices",
    "aggregate_statistics",
    "predict",
    "top1_accuracy",
    "eigen_cutoff",
]


def eigen_cutoff(eigvals: np.ndarray, dim: int) -> float:
    """Eigenvalues of the pooled Gram at or below this are treated as zero.

    cutoff = dim * eps(float64) * max(|lambda|), the same rule as
    ``numpy.linalg.matrix_rank`` / LAPACK's default for a symmetric PSD matrix:
    an eigenvalue of C = X^T X below it is indistinguishable from rounding
    error of the Gram itself.
    """
    top = float(np.max(np.abs(eigvals))) if eigvals.size else 0.0
    return dim * np.finfo(np.float64).eps * top


def solve_head(C: np.ndarray, Q: np.ndarray, *, lam: float = 0.0) -> np.ndarray:
    """Return W = (C + lam I)^+ Q for a symmetric PSD C.

    lam > 0: Cholesky solve of the ridge system. lam = 0: a Cholesky solve
    when C is numerically full rank (relative to :func:`eigen_cutoff`),
    otherwise the minimum-norm solution C^+ Q from an eigendecomposition,
    which equals X^+ Y of the pooled data (range(Q) lies in range(C)).
    No undeclared ridge is ever added. BLAS runs on one thread inside, so W is
    the same bytes for the same (C, Q, lam) on one install, whatever the
    process's thread settings.
    """
    lam = check_real("lam", lam, "solve_head", low=0.0)
    C = np.asarray(C, dtype=np.float64)
    Q = np.asarray(Q, dtype=np.float64)
    if C.ndim != 2 or C.shape[0] != C.shape[1] or Q.ndim != 2 or Q.shape[0] != C.shape[0]:
        raise InvalidInputError(f"shapes C {C.shape} and Q {Q.shape} do not form C W = Q")
    if not (np.all(np.isfinite(C)) and np.all(np.isfinite(Q))):
        raise InvalidInputError("C or Q contains NaN or inf")
    with one_blas_thread():  # W a function of (C, Q) alone, whatever the thread count (secure_afl/_blas.py)
        return _solve_psd(C, Q, lam)


def _solve_psd(C: np.ndarray, Q: np.ndarray, lam: float) -> np.ndarray:
    d = C.shape[0]
    A = 0.5 * (C + C.T)
    if lam > 0:
        A = A + lam * np.eye(d)
    evals, evecs = np.linalg.eigh(A)
    cut = eigen_cutoff(evals, d)
    if evals[0] > cut * 1e3:
        # Well above the cutoff: a Cholesky solve is faster and as accurate.
        try:
            return scipy.linalg.cho_solve(scipy.linalg.cho_factor(A, lower=False, check_finite=False), Q,
                                          check_finite=False)
        except np.linalg.LinAlgError:  # pragma: no cover - guarded by the eigenvalue test
            pass
    keep = evals > cut
    inv = np.zeros_like(evals)
    inv[keep] = 1.0 / evals[keep]
    return evecs @ (inv[:, None] * (evecs.T @ Q))


def ri_restore_gram(gram_r: np.ndarray, contributors: float, gamma: float) -> np.ndarray:
    """RI restoration of the Gram: C = C^r - K gamma I (eq. (16))."""
    C = np.array(gram_r, dtype=np.float64, copy=True)
    C[np.diag_indices(C.shape[0])] -= contributors * gamma
    return C


def solve_from_sums(stats: SufficientStatistics, *, lam: float = 0.0) -> np.ndarray:
    """W from aggregated statistics: restore RI then solve (computation 3).

    The contributor count K is an integer; a revealed one (decrypted, flooded)
    is rounded first, since an error delta in it would move every diagonal
    entry of C by delta gamma, far beyond the statistics' own error for a large gamma.
    """
    C = ri_restore_gram(stats.gram, round(stats.contributors), stats.gamma)
    return solve_head(C, stats.cross, lam=lam)


def aggregate_statistics(parts: Iterable[SufficientStatistics]) -> SufficientStatistics:
    parts = list(parts)
    if not parts:
        raise InvalidInputError("no statistics to aggregate")
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


def centralised_weights(X, y, n_classes: int) -> np.ndarray:
    """Reference W = X^+ Y on the pooled data (computation 1), via LAPACK gelsd."""
    X = check_embeddings(X)
    y = check_labels(y, n=X.shape[0], n_classes=n_classes)
    Y = np.zeros((X.shape[0], n_classes))
    Y[np.arange(X.shape[0]), y] = 1.0
    W, *_ = scipy.linalg.lstsq(X, Y, lapack_driver="gelsd")
    return W


def local_weights(stats: SufficientStatistics, *, explicit_inverse: bool = False) -> np.ndarray:
    """W_k^r = (C_k^r)^-1 Q_k, the paper's local stage (eq. (14)).

    ``explicit_inverse=True`` reproduces the reference implementation (an
    explicit inverse); with gamma = 0 and N_k < d that inverse is of a
    singular matrix, which is what makes the no-RI column of Table A.1 explode.
    """
    if explicit_inverse:
        return np.linalg.inv(stats.gram) @ stats.cross
    return np.linalg.solve(stats.gram, stats.cross)


def aa_law_pair(W_u, C_u, W_v, C_v, *, explicit_inverse: bool = False):
    """Aggregate two (W, C^r) pairs: W = 𝒲_u W_u + 𝒲_v W_v (derived eq. (7)).

    Returns (W, C_u + C_v). See the module docstring for the derivation.
    """
    C = C_u + C_v
    if explicit_inverse:
        Cinv = np.linalg.inv(C)
        I = np.eye(C.shape[0])
        Wu = I - Cinv @ C_v
        Wv = I - Cinv @ C_u
        return Wu @ W_u + Wv @ W_v, C
    return np.linalg.solve(C, C_u @ W_u + C_v @ W_v), C


def aa_law_aggregate(pairs: Sequence[tuple[np.ndarray, np.ndarray]], order: Sequence[int] | None = None, *,
                     explicit_inverse: bool = False):
    """Pairwise AA-law recursion (eq. (9)) over (W_k^r, C_k^r) in ``order``.

    Returns (W_agg^r, C_agg^r). Any order gives the same result up to rounding.
    """
    if not pairs:
        raise InvalidInputError("no client weights to aggregate")
    idx = list(range(len(pairs))) if order is None else list(order)
    if sorted(idx) != list(range(len(pairs))):
        raise InvalidInputError("order must be a permutation of the client indices")
    W, C = pairs[idx[0]]
    for k in idx[1:]:
        W, C = aa_law_pair(W, C, pairs[k][0], pairs[k][1], explicit_inverse=explicit_inverse)
    return W, C


def ri_restore_weights(W_r: np.ndarray, C_r: np.ndarray, K: int, gamma: float, *,
                       explicit_inverse: bool = False) -> np.ndarray:
    """Eq. (16): W = (C^r - K gamma I)^-1 C^r W^r."""
    check_int("K", K, "ri_restore_weights", low=1)
    gamma = check_real("gamma", gamma, "ri_restore_weights", low=0.0)
    C = ri_restore_gram(C_r, K, gamma)
    if explicit_inverse:
        return np.linalg.inv(C) @ (C_r @ W_r)
    return solve_head(C, C_r @ W_r)


def paper_printed_weighting_matrices(C_u: np.ndarray, C_v: np.ndarray):
    """The weighting matrices exactly as printed in eq. (10) of the paper.

    Kept only so the tests can show they do not satisfy
    W = (C_u + C_v)^-1 (C_u W_u + C_v W_v); never used for aggregation.
    """
    C = C_u + C_v
    I = np.eye(C.shape[0])
    Cinv = np.linalg.inv(C)
    W_agg = I - np.linalg.inv(C_u) @ C_v @ (I + Cinv @ C_v)
    W_k = I - np.linalg.inv(C_v) @ C_u @ (I + Cinv @ C_u)
    return W_agg, W_k


def predict(W: np.ndarray, X) -> np.ndarray:
    X = check_embeddings(X, dim=np.asarray(W).shape[0])
    return np.argmax(X @ W, axis=1)


def top1_accuracy(W: np.ndarray, X, y) -> float:
    """Fraction of samples whose arg-max score is the true label."""
    pred = predict(W, X)
    y = np.asarray(y)
    if y.shape != pred.shape:
        raise InvalidInputError("y does not match X")
    return float(np.mean(pred == y))
