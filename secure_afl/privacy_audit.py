"""Empirical privacy audit: a lower bound on epsilon from many runs of the mechanism.

The strongest adversary of the DP definition knows every record but one
canary and must tell whether the canary was in (D') or out (D). The audit
plays it at library level: every run, each hospital adds its noise share to its
packed statistics with the very function its protect path calls
(:func:`secure_afl.dp.add_noise_share`), the shares of the surviving hospitals
are summed, and the adversary scores the release with the optimal linear test,
the projection of (release - sum of the statistics without the canary) on the
canary's contribution. From ``runs`` releases of D and of D' it picks the best
threshold on half of them and measures the false positive / negative rates on
the other half; with Clopper-Pearson upper bounds at ``confidence`` each,

    eps_lb = max( ln((1 - delta - FNR_hi) / FPR_hi), ln((1 - delta - FPR_hi) / FNR_hi) )

is, with that confidence, a lower bound on the epsilon the mechanism really
has (Jagielski, Ullman and Oprea, 2020). It must stay below the accounted
epsilon; a mechanism that adds less noise than it accounts for shows up as
``eps_lb > epsilon``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as st

from secure_afl.packing import Layout
from secure_afl.params import Bounds, SessionParams
from secure_afl.stats import SufficientStatistics, local_statistics
from secure_afl.dp.noise import add_noise_share
from secure_afl.backends.session_params import dp_session_params

__all__ = ["AuditResult", "audit_session", "epsilon_lower_bound", "audit_params"]


@dataclass
class AuditResult:
    epsilon_lower_bound: float
    epsilon_accounted: float
    runs: int
    fpr: float
    fnr: float
    threshold: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _cp_upper(k: int, n: int, conf: float) -> float:
    return 1.0 if k >= n else float(st.beta.ppf(conf, k + 1, n - k))


def epsilon_lower_bound(out_scores, in_scores, delta: float, *, confidence: float = 0.95):
    """(eps_lb, fpr, fnr, threshold): threshold chosen on the first half, rates measured on the second."""
    out_scores, in_scores = np.asarray(out_scores), np.asarray(in_scores)
    h0, h1 = len(out_scores) // 2, len(in_scores) // 2
    cand = np.quantile(np.concatenate([out_scores[:h0], in_scores[:h1]]), np.linspace(0.5, 0.9999, 200))

    def bound(o, i, thr):
        fp, fn = int(np.sum(o > thr)), int(np.sum(i <= thr))
        fpr_hi, fnr_hi = _cp_upper(fp, len(o), confidence), _cp_upper(fn, len(i), confidence)
        vals = [(1 - delta - fnr_hi) / fpr_hi, (1 - delta - fpr_hi) / fnr_hi]
        return max(math.log(v) if v > 0 else -math.inf for v in vals), fp / len(o), fn / len(i)

    best = max(cand, key=lambda thr: bound(out_scores[:h0], in_scores[:h1], thr)[0])
    eps, fpr, fnr = bound(out_scores[h0:], in_scores[h1:], best)
    return max(eps, 0.0), fpr, fnr, float(best)


def audit_params(spec, backend: str = "plain", *, dim: int = 8, classes: int = 3, max_norm: float = 1.0,
                 n_max: int = 200, k_max: int = 8, **kw) -> SessionParams:

    return dp_session_params(spec, backend, "dp-audit", Layout(dim, classes), 1.0, Bounds(max_norm, n_max, k_max),
                             **kw)


def audit_session(params: SessionParams, *, hospitals: int = 4, survivors: int | None = None, runs: int = 2000,
                  seed: int = 0, confidence: float = 0.95, accounted: float | None = None) -> AuditResult:
    """Run the canary game ``runs`` times per world; returns the empirical epsilon lower bound."""
    from secure_afl.dp.mechanism import release_epsilon

    lay, B = params.layout, float(params.bounds.max_norm)
    rng = np.random.default_rng(seed)
    survivors = hospitals if survivors is None else survivors
    # D: every hospital's data, norms within B; D': the canary (norm exactly B) added at hospital 0
    base = []
    for _ in range(hospitals):
        X = rng.standard_normal((20, lay.dim))
        X *= (rng.uniform(0.2, 1.0, 20) * B / np.linalg.norm(X, axis=1))[:, None]
        base.append(local_statistics(X, rng.integers(0, lay.n_classes, 20), lay.n_classes))
    canary = rng.standard_normal((1, lay.dim))
    canary *= B / np.linalg.norm(canary)
    c_stats = local_statistics(canary, np.array([0]), lay.n_classes)

    def packed(s: SufficientStatistics) -> np.ndarray:
        return lay.pack(SufficientStatistics(s.gram + params.gamma * np.eye(lay.dim), s.cross, s.n,
                                             s.class_counts, 1.0, params.gamma))

    world_out = [packed(s) for s in base[:survivors]]
    world_in = [packed(base[0] + c_stats)] + world_out[1:]
    clean_out = np.sum(world_out, axis=0)
    direction = np.sum(world_in, axis=0) - clean_out
    direction /= np.linalg.norm(direction)

    def scores(world):
        return np.array([float((np.sum([add_noise_share(params, v, rng) for v in world], axis=0)
                                - clean_out) @ direction) for _ in range(runs)])

    s_out, s_in = scores(world_out), scores(world_in)
    delta = float(params.dp["delta"])
    eps_lb, fpr, fnr, thr = epsilon_lower_bound(s_out, s_in, delta, confidence=confidence)
    acc = release_epsilon(params, survivors) if accounted is None else accounted
    return AuditResult(eps_lb, acc, runs, fpr, fnr, thr)
