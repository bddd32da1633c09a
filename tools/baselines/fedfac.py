"""FedFac's split of hidden units into shared and personalised ones.

The factor model of a layer with h hidden units is K_l = A_l F_l + e_l. The
server stacks every client's (d+1) x h block Z_k of the layer's parameters (or
updates) into Z = [Z_1; ...; Z_K], standardises each column, and factor-analyses
the h x h correlation R of the columns. Unit j's communality
nu_j = sum_m a_jm^2 says how much of it the G common factors explain; units
with the lowest communalities are personalised.

Secure FedFac: Z itself is never needed. With n = K (d+1) rows,

    Z^T Z = sum_k Z_k^T Z_k,   1^T Z = sum_k 1^T Z_k,

so client k contributes the vector ``[triu(Z_k^T Z_k), 1^T Z_k, rows_k]``
(:func:`gram_contribution`) to a secure sum, and the server rebuilds R from
the sum alone (:func:`correlation_from_sums`): it learns the pooled Gram of the
hidden units, never one client's block.
"""

from __future__ import annotations

import numpy as np

from secure_afl.exceptions import InvalidInputError

__all__ = ["gram_contribution", "correlation_from_sums", "principal_factor_loadings", "communalities",
           "factor_split", "gram_length"]


def gram_length(h: int) -> int:
    return h * (h + 1) // 2 + h + 1


def gram_contribution(Z: np.ndarray) -> np.ndarray:
    """Client k's summand ``[triu(Z_k^T Z_k), 1^T Z_k, rows_k]``."""
    Z = np.asarray(Z, dtype=np.float64)
    if Z.ndim != 2:
        raise InvalidInputError("Z must be a 2-D (rows x units) array")
    iu = np.triu_indices(Z.shape[1])
    return np.concatenate([(Z.T @ Z)[iu], Z.sum(axis=0), [float(Z.shape[0])]])


def correlation_from_sums(total: np.ndarray, h: int) -> np.ndarray:
    """The h x h correlation of the stacked columns from the summed contributions."""
    total = np.asarray(total, dtype=np.float64)
    if total.shape != (gram_length(h),):
        raise InvalidInputError(f"summed Gram vector has shape {total.shape}; h={h} needs ({gram_length(h)},)")
    g = h * (h + 1) // 2
    G = np.zeros((h, h))
    iu = np.triu_indices(h)
    G[iu] = total[:g]
    G.T[iu] = total[:g]
    n = total[-1]
    if not n >= 2:
        raise InvalidInputError("the summed Gram covers fewer than two rows")
    mu = total[g:g + h] / n
    cov = G / n - np.outer(mu, mu)
    var = np.clip(np.diag(cov), 0.0, None)
    # A unit whose column is constant across every client has no variance for
    # common factors to explain: its row of R stays zero, diagonal included, so
    # its communality is 0 and it is personalised (a 1 on the diagonal would
    # let it be a factor of its own).
    sd = np.sqrt(var)
    live = sd > 1e-12 * max(1.0, float(sd.max(initial=0.0)))
    R = np.zeros((h, h))
    R[np.ix_(live, live)] = cov[np.ix_(live, live)] / np.outer(sd[live], sd[live])
    R[np.flatnonzero(live), np.flatnonzero(live)] = 1.0
    return 0.5 * (R + R.T)


def principal_factor_loadings(R: np.ndarray, kappa: float = 0.8, *, max_iter: int = 200,
                              tol: float = 1e-10) -> np.ndarray:
    """Loadings A (h x G) by the iterated principal-factor method.

    G is the smallest m whose top-m eigenvalues of R explain at least
    ``kappa`` of the total; then R* = R - Sigma_e (the diagonal replaced by
    the communalities) is re-factored until Sigma_e settles.
    """
    if not 0.0 < kappa <= 1.0:
        raise InvalidInputError("kappa must be in (0, 1]")
    evals, evecs = np.linalg.eigh(R)
    evals, evecs = evals[::-1], evecs[:, ::-1]
    pos = np.clip(evals, 0.0, None)
    share = np.cumsum(pos) / pos.sum()
    G = int(np.searchsorted(share, kappa - 1e-12) + 1)
    A = evecs[:, :G] * np.sqrt(pos[:G])
    psi = np.clip(1.0 - (A * A).sum(axis=1), 0.0, 1.0)
    for _ in range(max_iter):
        Rs = R.copy()
        np.fill_diagonal(Rs, 1.0 - psi)
        ev, vec = np.linalg.eigh(Rs)
        ev, vec = ev[::-1][:G], vec[:, ::-1][:, :G]
        A = vec * np.sqrt(np.clip(ev, 0.0, None))
        new = np.clip(1.0 - (A * A).sum(axis=1), 0.0, 1.0)
        done = float(np.max(np.abs(new - psi))) < tol
        psi = new
        if done:
            break
    return A


def communalities(A: np.ndarray) -> np.ndarray:
    return (A * A).sum(axis=1)


def factor_split(R: np.ndarray, *, personal_fraction: float = 0.5, kappa: float = 0.8):
    """(shared units, personalised units) as sorted index arrays.

    The ``personal_fraction`` of units with the lowest communality nu_j are
    personalised (the paper's threshold tau_l, given as a proportion as in its
    experiments); ties are broken by unit index so the split is a function of R. 1.0 is the paper's
    tau = inf: every hidden unit personalised, only the output layer shared.
    """
    if not 0.0 <= personal_fraction <= 1.0:
        raise InvalidInputError("personal_fraction must be in [0, 1]")
    nu = communalities(principal_factor_loadings(R, kappa))
    h = R.shape[0]
    n_personal = int(round(personal_fraction * h))
    order = np.lexsort((np.arange(h), nu))  # lowest communality first
    personal = np.sort(order[:n_personal])
    shared = np.sort(order[n_personal:])
    return shared, personal
