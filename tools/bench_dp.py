"""``secure-afl bench dp``: test accuracy against epsilon on the embedded data sets.

Library level (no HTTP): each hospital packs its statistics and adds its noise
share exactly as its protect path does (:func:`secure_afl.dp.add_noise_share`),
the shares and statistics are summed, and the key holder's DP solve runs on the
sum; epsilon = inf is today's path (RI restoration, minimum-norm solve). The
noise is the ckks/plain Gaussian; secagg's Skellam noise has the same variance.
Prints a table, writes a PNG (and JSON).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.partition import partition
from secure_afl.stats import StatisticsAccumulator, SufficientStatistics
from secure_afl_tools.demo import load_embedded

__all__ = ["run_bench", "register"]

EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0, math.inf)


def _accuracy(dataset: str, K: int, eps: float, seed: int, *, alpha: float, delta: float) -> float:
    from secure_afl.analytic import solve_from_sums, top1_accuracy
    from secure_afl.dp import DPSpec, add_noise_share, dp_solve
    from secure_afl.backends.session_params import dp_session_params

    Xtr, ytr, Xte, yte, C = load_embedded(dataset, seed)
    parts = [p for p in partition(ytr, K, f"dirichlet:{alpha}", seed=seed) if len(p)]
    lay = Layout(Xtr.shape[1], C)
    bounds = Bounds(math.sqrt(2.0), max(len(p) for p in parts), max(len(parts), 2))
    spec = None if math.isinf(eps) else DPSpec(eps, delta, len(parts))
    params = dp_session_params(spec, "plain", "bench-dp", lay, 1.0, bounds)
    rng = np.random.default_rng(seed + 1000)
    total = np.zeros(lay.length)
    for p in parts:
        acc = StatisticsAccumulator(lay.dim, C, max_norm=bounds.max_norm)
        acc.update(Xtr[p], ytr[p])
        s = acc.finalize(gamma=0.0)
        with_ri = SufficientStatistics(s.gram + np.eye(lay.dim), s.cross, s.n, s.class_counts, 1.0, 1.0)
        total += add_noise_share(params, lay.pack(with_ri), rng)
    stats = lay.unpack(total, gamma=1.0)
    W = solve_from_sums(stats) if spec is None else dp_solve(stats, params, len(parts))[0]
    return top1_accuracy(W, Xte, yte)


def run_bench(*, datasets=("digits", "breast-cancer"), clients=(5, 50), epsilons=EPSILONS, seeds=3,
              alpha: float = 0.1, delta: float = 1e-5, png: str | None = "dp_accuracy.png",
              json_path: str | None = None) -> dict:
    t0 = time.perf_counter()
    rows = []
    for ds in datasets:
        for K in clients:
            for eps in epsilons:
                accs = [_accuracy(ds, K, eps, s, alpha=alpha, delta=delta) for s in range(seeds)]
                rows.append({"dataset": ds, "clients": K, "epsilon": eps, "accuracy_mean": float(np.mean(accs)),
                             "accuracy_std": float(np.std(accs)), "runs": seeds})
    out = {"rows": rows, "delta": delta, "partition": f"dirichlet:{alpha}", "seconds": time.perf_counter() - t0}
    _print(out)
    if png:
        _plot(rows, png)
        out["png"] = png
    if json_path:
        Path(json_path).write_text(json.dumps(out, indent=2, default=str))
    return out


def _print(out: dict) -> None:
    rows = out["rows"]
    eps = sorted({r["epsilon"] for r in rows})
    print(f"test accuracy (mean +- std over {rows[0]['runs']} splits), {out['partition']}, delta={out['delta']:g}")
    print("| data set | K | " + " | ".join(f"eps={e:g}" for e in eps) + " |")
    print("|---|---|" + "---|" * len(eps))
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        for K in dict.fromkeys(r["clients"] for r in rows):
            cells = [next(r for r in rows if r["dataset"] == ds and r["clients"] == K and r["epsilon"] == e)
                     for e in eps]
            print(f"| {ds} | {K} | " + " | ".join(f"{c['accuracy_mean']:.3f} +- {c['accuracy_std']:.3f}"
                                                 for c in cells) + " |")


def _plot(rows: list[dict], path: str) -> None:
    """Accuracy against epsilon. Without DP (epsilon = inf) is not a point of the curve: it stands apart,
    right of an axis break, unjoined, as the ceiling the curve approaches."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    finite = sorted({r["epsilon"] for r in rows if not math.isinf(r["epsilon"])})
    with plt.rc_context({"font.size": 11, "legend.fontsize": 10}):
        fig, (ax, ax_inf) = plt.subplots(1, 2, figsize=(8.4, 5.0), sharey=True, layout="constrained",
                                         gridspec_kw={"width_ratios": [5, 1]})
        series = [(ds, K) for ds in dict.fromkeys(r["dataset"] for r in rows)
                  for K in dict.fromkeys(r["clients"] for r in rows)]
        for i, (ds, K) in enumerate(series):
            sel = sorted((r for r in rows if r["dataset"] == ds and r["clients"] == K), key=lambda r: r["epsilon"])
            dp = [r for r in sel if not math.isinf(r["epsilon"])]
            colour, marker = f"C{i % 10}", "osD^v"[i % 5]
            if dp:
                ax.errorbar([r["epsilon"] for r in dp], [r["accuracy_mean"] for r in dp],
                            yerr=[r["accuracy_std"] for r in dp], marker=marker, capsize=3, color=colour,
                            label=f"{ds}, K = {K}")
            for r in sel:
                if math.isinf(r["epsilon"]):
                    # nudged sideways so the series do not hide one another
                    ax_inf.errorbar([i - (len(series) - 1) / 2], [r["accuracy_mean"]], yerr=[r["accuracy_std"]],
                                    marker=marker, capsize=3, color=colour, ls="none")
        ax.set_xscale("log", base=2)
        ax.set_xticks(finite, [f"{e:g}" for e in finite])
        ax.set_xlabel("epsilon (delta = 1e-5, one release)")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
        ax_inf.set_xlim(-len(series) / 2 - 0.5, len(series) / 2 + 0.5)
        ax_inf.set_xticks([0], ["no DP"])
        ax_inf.grid(axis="y", alpha=0.3)
        for a, side in ((ax, "right"), (ax_inf, "left")):
            a.spines[side].set_visible(False)
        ax_inf.tick_params(left=False)
        fig.suptitle("Distributed DP on the sufficient statistics, Dirichlet(0.1)")
        fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=2, frameon=False)
        fig.savefig(path, dpi=110)
        plt.close(fig)


def _cmd(args) -> int:
    eps = tuple(math.inf if e.lower() == "inf" else float(e) for e in args.epsilons.split(","))
    run_bench(datasets=tuple(args.datasets.split(",")), clients=tuple(int(k) for k in args.clients.split(",")),
              epsilons=eps, seeds=args.seeds, alpha=args.alpha, delta=args.delta, png=args.png,
              json_path=args.json)
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--datasets", default="digits,breast-cancer")
    parser.add_argument("--clients", default="5,50", help="comma-separated K values")
    parser.add_argument("--epsilons", default="0.5,1,2,4,8,inf")
    parser.add_argument("--seeds", type=int, default=3, help="train/test splits and partitions per cell")
    parser.add_argument("--alpha", type=float, default=0.1, help="Dirichlet concentration of the label split")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--png", default="dp_accuracy.png", help="plot path")
    parser.add_argument("--json", help="also write the figures as JSON here")
    parser.set_defaults(func=_cmd)
