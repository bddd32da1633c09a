"""A pilot's check of a released model against plaintext: the hospitals' own statistics files, summed here and
solved, against the W the key holder released (``secure-afl audit compare``).

The files must be the release's: as many as its participants, the same classes, and summing to its samples and
class counts; otherwise the comparison says what differs and does not compare W. With them, the relative W error
against the plaintext solve is judged against the certified bound the key holder wrote into the model file, or,
where the release has none (C singular, so the minimum-norm solve has no perturbation bound), against the
plaintext's own variation: the same files summed in two other orders and solved again. That second verdict is
weaker and is printed as such, with its tolerance; a noisy release (ckks, DP) without a bound gets no verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .analytic import solve_from_sums
from .stats import SufficientStatistics

__all__ = ["Comparison", "compare_with_plaintext"]


@dataclass
class Comparison:
    """What :func:`compare_with_plaintext` found. ``mismatches``: how the files differ from the release (counts,
    n, classes, files); empty when they are its statistics. ``w_rel_error``: ``||W - W_plain||_F / ||W_plain||_F``;
    ``bound``: the certified bound (None: none); ``order_variation``: the largest same ratio between the
    plaintext solved from the files summed in the given order and in another; ``stats_order_diff``: the largest
    entry of the summed C and Q that differs between two such orders. ``noisy``: the release added noise
    (ckks flooding, DP), so without a certified bound no tolerance applies to it.

    One rule decides: ``w_rel_error <= tolerance``, where the tolerance is the certified bound when there is
    one, else (an exact release of a singular C) ``max(4 * order_variation, 256 eps)``: four times the
    plaintext's own spread over summation orders, with a floor of a few hundred float64 roundings for orders
    that agree bit for bit."""

    mismatches: list = field(default_factory=list)
    w_rel_error: float | None = None
    bound: float | None = None
    order_variation: float | None = None
    stats_order_diff: float | None = None
    noisy: bool = False

    @property
    def tolerance(self) -> float | None:
        if self.bound is not None:
            return float(self.bound)
        if self.noisy or self.order_variation is None:
            return None
        return max(4.0 * float(self.order_variation), 256 * np.finfo(np.float64).eps)

    def tolerance_text(self) -> str:
        if self.bound is not None:
            return f"{self.bound:.3g} (the certified bound the key holder wrote into the model file)"
        if self.tolerance is None:
            return "none (the release added noise and C is singular at it: no certified bound)"
        return (f"{self.tolerance:.3g} (no certified bound, C is singular: 4 x the plaintext's own "
                f"summation-order variation in W, {self.order_variation:.3g}, at least 256 float64 roundings)")

    @property
    def checked(self) -> bool:
        return not self.mismatches and self.w_rel_error is not None and self.tolerance is not None

    @property
    def equal(self) -> bool:
        return self.checked and self.w_rel_error <= self.tolerance

    def verdict(self) -> str:
        if self.mismatches:
            return "DIFFERS: the statistics files are not the release's: " + "; ".join(self.mismatches)
        if self.tolerance is None:
            return (f"NO VERDICT: an approximate release without a certified bound: its W differs from the "
                    f"plaintext solve by {self.w_rel_error:.3g}, which the release's noise may explain; a "
                    "--lambda ridge at finalize gives a bound")
        rel = "<=" if self.equal else ">"
        word = "equal" if self.equal else "NOT EQUAL"
        return f"{word}: W relative error {self.w_rel_error:.3g} {rel} tolerance {self.tolerance:.3g}"


def _total(parts: list[SufficientStatistics]) -> tuple[np.ndarray, np.ndarray]:
    C = np.zeros_like(parts[0].gram)
    Q = np.zeros_like(parts[0].cross)
    for p in parts:
        C = C + p.gram
        Q = Q + p.cross
    return C, Q


def compare_with_plaintext(W, *, participants, classes: int, lam: float, samples: int | None,
                           class_counts, bound: float | None, files: list, noisy: bool = False) -> Comparison:
    """``files``: ``(name, statistics (gamma 0, as ``client embed --stats-only`` writes them), class names)`` per
    hospital. The release's side comes from the model file: W, its participants, classes, lambda, samples,
    class counts and certified bound (gamma is not needed: RI restoration takes the per-hospital ridge out
    of the released W, and the files never had it)."""
    out = Comparison(bound=bound, noisy=noisy)
    W = np.asarray(W, dtype=np.float64)
    if len(files) != len(participants):
        out.mismatches.append(f"{len(files)} statistics files for the release's {len(participants)} participants "
                              f"({', '.join(participants)})")
    for name, s, names in files:
        if len(names) != classes or s.cross.shape[1] != classes:
            out.mismatches.append(f"{name}: {len(names)} classes, the release has {classes}")
        if s.gram.shape[0] != W.shape[0]:
            out.mismatches.append(f"{name}: {s.gram.shape[0]} features, the release's W has {W.shape[0]}")
    if out.mismatches or not files:
        return out
    stats = [s for _, s, _ in files]
    n = int(round(sum(float(s.n) for s in stats)))
    counts = np.sum([s.class_counts for s in stats], axis=0)
    if samples is not None and n != int(samples):
        out.mismatches.append(f"the files hold n = {n} samples, the release {samples}")
    if class_counts is not None and [int(round(c)) for c in counts] != [int(c) for c in class_counts]:
        out.mismatches.append(f"the files' class counts are {[int(round(c)) for c in counts]}, the release's "
                              f"{[int(c) for c in class_counts]}")
    if out.mismatches:
        return out

    def solve(C, Q):
        # the files carry X^T X (gamma 0): the plaintext solve is the release's with the ridge restoration undone
        return solve_from_sums(SufficientStatistics(C, Q, float(n), counts, float(len(stats)), 0.0), lam=lam)

    C1, Q1 = _total(stats)
    W1 = solve(C1, Q1)
    norm = float(np.linalg.norm(W1)) or 1.0
    out.w_rel_error = float(np.linalg.norm(W - W1)) / norm
    out.order_variation = out.stats_order_diff = 0.0
    for order in _orders(len(stats)):
        C2, Q2 = _total([stats[i] for i in order])
        out.order_variation = max(out.order_variation, float(np.linalg.norm(solve(C2, Q2) - W1)) / norm)
        out.stats_order_diff = max(out.stats_order_diff, float(np.max(np.abs(C1 - C2))),
                                   float(np.max(np.abs(Q1 - Q2))))
    return out


def _orders(k: int) -> list:
    """Other summation orders of ``k`` files than the given one: the reverse and one rotation (each costs a
    solve, seconds at d = 512; two show the rounding spread without a solve per permutation)."""
    if k < 2:
        return []
    orders = [list(range(k))[::-1]]
    if k > 2:
        orders.append(list(range(1, k)) + [0])
    return orders
