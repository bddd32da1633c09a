"""``secure-afl compare``: AFL against FedAvg, FedProx and FedFac.

All methods see the same frozen embeddings (the embedded data set's feature
map), the same partitions (IID, Dirichlet alpha, label shards) and the same
seeds; every aggregation, AFL's single one included, is a :class:`SecureSum`
through the chosen backend. Writes ``COMPARISON.md`` (tables) and PNG plots
(accuracy vs alpha, accuracy vs rounds), plus the RI ablation (the AFL
paper's Table 3: gamma grid, with and without RI restoration, AA-law path
and sum form).
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import numpy as np

from secure_afl.analytic import aa_law_aggregate, local_weights, ri_restore_weights, solve_head
from secure_afl.exceptions import BoundsExceeded
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.partition import partition
from secure_afl.stats import local_statistics
from secure_afl_tools.baselines.fl import FLConfig, client_label_mix, evaluate, run_fedavg, run_fedfac
from secure_afl_tools.baselines.heads import LinearHead, MLPHead
from secure_afl_tools.baselines.securesum import SecureSum
from secure_afl_tools.baselines.afl import afl_ckks_release, run_afl
from secure_afl_tools.baselines.features import mean_std, partition_order
from secure_afl_tools.demo import load_embedded

__all__ = ["run_afl", "run_grid", "ri_ablation", "write_report", "register"]


def methods(dim: int, n_classes: int, hidden: int, mus, *, lr_linear: float = 3.0, lr_mlp: float = 1.0):
    """(name, runner) pairs; runner(clients, test, cfg) -> result dict.

    The linear head takes a larger step than the MLP: the embeddings have
    small entries (||x|| <= sqrt(2) over d = 256), and a step that suits the
    linear head makes the MLP diverge.
    """
    lin, mlp = LinearHead(dim, n_classes), MLPHead(dim, n_classes, hidden)
    L = {"lr": float(lr_linear)}
    M = {"lr": float(lr_mlp)}
    out = [("AFL", lambda cl, te, cfg: run_afl(cl, te, n_classes, backend=cfg.backend))]
    out.append(("FedAvg-linear", lambda cl, te, cfg: run_fedavg(lin, cl, te, _with(cfg, **L))))
    out.append(("FedAvg-mlp", lambda cl, te, cfg: run_fedavg(mlp, cl, te, _with(cfg, **M))))
    for mu in mus:
        out.append((f"FedProx-linear mu={mu:g}",
                    lambda cl, te, cfg, mu=mu: run_fedavg(lin, cl, te, _with(cfg, mu=float(mu), **L))))
        out.append((f"FedProx-mlp mu={mu:g}",
                    lambda cl, te, cfg, mu=mu: run_fedavg(mlp, cl, te, _with(cfg, mu=float(mu), **M))))
    out.append(("FedFac-static", lambda cl, te, cfg: run_fedfac(mlp, cl, te, _with(cfg, **M))))
    out.append(("FedFac-dynamic", lambda cl, te, cfg: run_fedfac(mlp, cl, te, _with(cfg, **M), dynamic=True)))
    return out


def _with(cfg: FLConfig, **kw) -> FLConfig:
    return FLConfig(**{**cfg.__dict__, **kw})


def _clients(X, y, n_clients, spec, seed):
    parts = [p for p in partition(y, n_clients, spec, seed=seed) if p.size]
    return [(X[p], y[p]) for p in parts]


def run_grid(data, *, clients=(10,), partitions=("iid",), seeds=(0,), cfg: FLConfig = FLConfig(),
             hidden: int = 64, mus=(0.01, 0.1), lrs=(3.0, 1.0), only=None, log=print, sink=None):
    """Every method on every (K, partition, seed). Returns a list of result rows; ``sink(row)`` sees each."""
    Xtr, ytr, Xte, yte, C = data
    rows = []
    for K in clients:
        for seed in seeds:  # seed outermost: a stopped run still holds whole seeds
            for spec in partitions:
                cl = _clients(Xtr, ytr, K, spec, seed)
                run_cfg = FLConfig(**{**cfg.__dict__, "seed": int(seed)})
                for name, fn in methods(Xtr.shape[1], C, hidden, mus, lr_linear=lrs[0], lr_mlp=lrs[1]):
                    if only and not any(name.startswith(o) for o in only):
                        continue
                    try:
                        res = fn(cl, (Xte, yte), run_cfg)
                    except BoundsExceeded as e:
                        # A diverging run is refused by the bound check before protection;
                        # it is reported as refused, not dropped from the table.
                        log(f"K={K:<4} {spec:<16} seed={seed} {name:<24} refused: {e}")
                        res = {"global_acc": float("nan"), "client_acc": float("nan"), "per_client": [],
                               "rounds": run_cfg.rounds, "bytes_per_round": float("nan"), "seconds": float("nan"),
                               "history": []}
                    rows.append({"method": name, "K": K, "active": len(cl), "partition": spec, "seed": int(seed),
                                 "global_acc": res["global_acc"], "client_acc": res["client_acc"],
                                 "per_client": [float(v) for v in res["per_client"]],
                                 "rounds": res["rounds"], "bytes_per_round": res["bytes_per_round"],
                                 "seconds": res["seconds"], "history": res["history"]})
                    if sink is not None:
                        sink(rows[-1])
                    log(f"K={K:<4} {spec:<16} seed={seed} {name:<24} global={res['global_acc']:.4f} "
                        f"client={res['client_acc']:.4f} bytes/round={res['bytes_per_round']:.0f} "
                        f"{res['seconds']:.1f}s")
    return rows


def ri_ablation(data, *, clients=(10, 100), gammas=(0.0, 0.1, 1.0, 10.0, 100.0), alpha: float = 0.1, seed: int = 0):
    """Accuracy with and without RI restoration, AA-law path and sum form (None: the path fails)."""
    Xtr, ytr, Xte, yte, C = data
    d = Xtr.shape[1]
    out = []
    for K in clients:
        cl = _clients(Xtr, ytr, K, f"dirichlet:{alpha}", seed)
        for g in gammas:
            stats = [local_statistics(X, y, C, gamma=g) for X, y in cl]
            k = len(stats)
            C_r = sum(s.gram for s in stats)
            Q = sum(s.cross for s in stats)
            row = {"K": K, "active": k, "gamma": g}

            def acc(W):
                if W is None or not np.all(np.isfinite(W)):
                    return None
                return float(np.mean(np.argmax(Xte @ W, axis=1) == yte))

            row["sum_without_ri"] = acc(solve_head(C_r, Q))
            C_plain = C_r.copy()
            C_plain[np.diag_indices(d)] -= k * g
            row["sum_with_ri"] = acc(solve_head(C_plain, Q))
            try:
                with np.errstate(all="ignore"):
                    W_r, Cagg = aa_law_aggregate([(local_weights(s), s.gram) for s in stats])
                    row["aa_without_ri"] = acc(W_r)
                    row["aa_with_ri"] = acc(ri_restore_weights(W_r, Cagg, k, g)) if g > 0 else acc(W_r)
            except np.linalg.LinAlgError:
                row["aa_without_ri"] = row["aa_with_ri"] = None
            out.append(row)
    return out


# -- report -------------------------------------------------------------------------
_ORDER = {"iid": 0}


def _group(rows, *keys):
    out = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out


def _fmt(v):
    return "N/A" if v is None else f"{v:.4f}"


_HOW_TO_READ = [
    "How to read it:", "",
    "* Every method trains on the same frozen embeddings, partitions and seeds. AFL is the closed-form "
    "linear head (one secure sum of C_k^r, Q_k and counts, RI restoration, minimum-norm solve). FedAvg and "
    "FedProx (mu grid) train a linear softmax head and a one-hidden-layer head with local mini-batch SGD; "
    "FedFac trains the one-hidden-layer head with hidden units split into shared and personalised ones by "
    "factor analysis (static: one split before the first round; dynamic: a new split every round).",
    "* Every aggregation is a secure sum: each client protects its vector with the backend, the server "
    "combines payloads it cannot read, only the sum is revealed. FedFac's factor analysis uses a second "
    "secure sum per split (per-client Grams of the hidden units' parameters), so the server never sees "
    "a client's parameters either.",
    "* Global accuracy: the model on the pooled test set (FedFac: the mean over clients of each personalised "
    "model on the pooled test set). Per-client accuracy: each client's model on a test distribution with "
    "that client's label mix, averaged over clients; a global model (AFL, FedAvg, FedProx) is evaluated "
    "the same way.",
    "* Bytes per hospital per round: what one client uploads for one aggregation (secagg: all five stages; "
    "ckks: the ciphertexts); FedFac-dynamic uploads two secure sums per round.",
    "* Empty clients (Dirichlet with small alpha leaves many) do not take part; K is the number of clients "
    "the data were split into.", "",
]


def write_report(rows, ablation, out_dir, *, meta: dict, verify=None) -> Path:
    """COMPARISON.md and PNGs under ``out_dir``; returns the Markdown path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    method_names = list(dict.fromkeys(r["method"] for r in rows))
    specs = sorted({r["partition"] for r in rows}, key=partition_order)
    Ks = sorted({r["K"] for r in rows})
    by = _group(rows, "method", "K", "partition")
    lines = ["# AFL against FedAvg, FedProx and FedFac", ""]
    lines += [meta.get("intro", ""), "", "```", meta.get("command", ""), "```", ""]
    lines += _HOW_TO_READ
    for K in Ks:
        lines += [f"## K = {K}: accuracy, global / per-client (mean ± std over seeds)", ""]
        lines.append("| method | " + " | ".join(specs) + " |")
        lines.append("|---|" + "---|" * len(specs))
        for m in method_names:
            if not any((m, K, s) in by for s in specs):
                continue  # not run at this K
            cells = []
            for s in specs:
                rs = by.get((m, K, s), [])
                cells.append(f"{mean_std([r['global_acc'] for r in rs])} / {mean_std([r['client_acc'] for r in rs])}"
                             if rs else "")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
        lines += [f"## K = {K}: cost per method (mean over partitions and seeds)", ""]
        lines.append("| method | rounds | bytes / hospital / round | bytes / hospital in all | wall time (s) |")
        lines.append("|---|---|---|---|---|")
        for m in method_names:
            ran = [r for r in rows if r["method"] == m and r["K"] == K]
            rs = [r for r in ran if not np.isnan(r["seconds"])]
            if not rs:
                if ran:
                    lines.append(f"| {m} | refused | | | |")
                continue
            bpr = np.mean([r["bytes_per_round"] for r in rs])
            lines.append(f"| {m} | {rs[0]['rounds']} | {bpr:,.0f} | {bpr * rs[0]['rounds']:,.0f} | "
                         f"{np.mean([r['seconds'] for r in rs]):.2f} |")
        lines.append("")
        # Where a personalised model beats AFL on its own client's label mix.
        afl = {(r["partition"], r["seed"]): r for r in rows if r["method"] == "AFL" and r["K"] == K}
        fac = [r for r in rows if r["method"].startswith("FedFac") and r["K"] == K]
        if afl and fac:
            lines += [f"## K = {K}: clients where FedFac beats AFL (own label mix)", ""]
            lines.append("| method | partition | clients better / all (mean over seeds) | mean gain where better |")
            lines.append("|---|---|---|---|")
            for (m, s), rs in sorted(_group(fac, "method", "partition").items(),
                                     key=lambda x: (x[0][0], partition_order(x[0][1]))):
                wins, gains, n = [], [], []
                for r in rs:
                    a = afl.get((s, r["seed"]))
                    if a is None or not r["per_client"]:
                        continue
                    diff = np.asarray(r["per_client"]) - np.asarray(a["per_client"])
                    wins.append(int((diff > 1e-12).sum()))
                    n.append(diff.size)
                    gains.extend(diff[diff > 1e-12].tolist())
                if n:
                    g = f"{np.mean(gains):+.3f}" if gains else "-"
                    lines.append(f"| {m} | {s} | {np.mean(wins):.1f} / {np.mean(n):.1f} | {g} |")
            lines.append("")
    if verify:
        lines += ["## Secure sums: secure run against the plain run", "",
                  "| backend | method | K | partition | rounds | max abs parameter difference | "
                  "prediction agreement | accuracy (secure / plain) | bytes / hospital / round | wall time (s) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for v in verify:
            lines.append(f"| {v['backend']} | {v['method']} | {v['K']} | {v['partition']} | {v['rounds']} | "
                         f"{v['max_abs_diff']:.2e} | {v['agreement']:.4f} | {v['acc_secure']:.4f} / "
                         f"{v['acc_plain']:.4f} | {v['bytes_per_round']:,.0f} | {v['seconds']:.2f} |")
        lines.append("")
    if ablation:
        lines += ["## RI ablation (AFL paper, Table 3): accuracy, Dirichlet alpha = 0.1", "",
                  "| K | gamma | AA law w/o RI | AA law w/ RI | sum form w/o RI | sum form w/ RI |",
                  "|---|---|---|---|---|---|"]
        for a in ablation:
            lines.append(f"| {a['K']} | {a['gamma']:g} | {_fmt(a['aa_without_ri'])} | {_fmt(a['aa_with_ri'])} | "
                         f"{_fmt(a['sum_without_ri'])} | {_fmt(a['sum_with_ri'])} |")
        lines.append("")
    lines += _plots(rows, out, method_names, specs, Ks)
    md = out / "COMPARISON.md"
    md.write_text("\n".join(lines) + "\n")
    return md


def _plots(rows, out: Path, method_names, specs, Ks):
    """Two PNGs sized to be read as saved (about 1300 px wide, 10-12 pt text at 100 dpi).

    Partitions are categories, not a scale: each method is a point with its
    seed spread, nudged sideways so methods do not hide one another, and
    nothing joins two partitions. Legends sit beside or below the data.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    style = {"font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11, "legend.fontsize": 10,
             "xtick.labelsize": 10, "ytick.labelsize": 10}
    by = _group(rows, "method", "K", "partition")
    colours = {m: f"C{i % 10}" for i, m in enumerate(method_names)}
    markers = "osD^v<>ph*"
    x = np.arange(len(specs))
    spread = 0.8 / max(len(method_names), 1)
    with plt.rc_context(style):
        fig, axes = plt.subplots(2, len(Ks), figsize=(5.2 * len(Ks) + 3.2, 8.4), squeeze=False, sharey=True)
        for j, K in enumerate(Ks):
            for i, (key, label) in enumerate((("global_acc", "global accuracy"),
                                              ("client_acc", "per-client accuracy"))):
                ax = axes[i, j]
                for k, m in enumerate(method_names):
                    vals = [[r[key] for r in by.get((m, K, s), [])] or [np.nan] for s in specs]
                    with np.errstate(all="ignore"), warnings.catch_warnings():
                        warnings.simplefilter("ignore", RuntimeWarning)
                        mean = np.array([np.nanmean(v) for v in vals])
                        std = np.array([np.nanstd(v) for v in vals])
                    ax.errorbar(x + (k - (len(method_names) - 1) / 2) * spread, mean, yerr=std, ls="none",
                                marker=markers[k % len(markers)], ms=6, capsize=2, color=colours[m], label=m)
                for edge in x[:-1] + 0.5:  # one column per partition
                    ax.axvline(edge, color="0.85", lw=0.8)
                ax.set_xticks(x, specs)
                ax.set_xlim(-0.5, len(specs) - 0.5)
                ax.set_title(f"K = {K}: {label}")
                ax.set_ylim(0, 1.02)
                ax.grid(axis="y", alpha=0.3)
            axes[-1, j].set_xlabel("partition (Dirichlet: the smaller alpha, the more label skew)")
        for i in range(2):
            axes[i, 0].set_ylabel("accuracy")
        handles, labels = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(0.995, 0.5), frameon=False,
                   title="method (mean ± std over seeds)")
        fig.tight_layout()
        fig.savefig(out / "comparison_accuracy_vs_alpha.png", dpi=100, bbox_inches="tight")
        plt.close(fig)

        K0 = Ks[0]
        cols = min(3, len(specs))
        nrows = -(-(len(specs) + 1) // cols)  # one more cell for the legend
        fig, axes = plt.subplots(nrows, cols, figsize=(4.4 * cols, 3.6 * nrows), squeeze=False,
                                 sharex=True, sharey=True)
        for j, s in enumerate(specs):
            ax = axes.flat[j]
            for m in method_names:
                rs = [r for r in by.get((m, K0, s), []) if r["history"]]
                if not rs:
                    continue
                hist = np.array([[h[2] for h in r["history"]] for r in rs])
                rounds = [h[0] for h in rs[0]["history"]]
                if m == "AFL":
                    ax.axhline(hist.mean(), color=colours[m], ls="--", lw=2, label="AFL (one round)")
                else:
                    ax.plot(rounds, hist.mean(axis=0), color=colours[m], lw=1.6, label=m)
            ax.set_title(f"K = {K0}, {s}")
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
        for c in range(cols):  # the lowest plotted panel of each column carries the round axis
            low = axes[(len(specs) - 1 - c) // cols if c < len(specs) else 0, c]
            low.tick_params(labelbottom=True)
            low.set_xlabel("round")
        for ax in axes[:, 0]:
            ax.set_ylabel("per-client accuracy")
        handles, labels = {}, {}
        for ax in axes.flat[:len(specs)]:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(lab, h)
        spare = axes.flat[len(specs):]
        for ax in spare:
            ax.axis("off")
        if handles and len(spare):
            spare[0].legend(list(handles.values()), list(handles), loc="center", frameon=False,
                            title=f"mean over seeds, K = {K0}")
        fig.tight_layout()
        fig.savefig(out / "comparison_accuracy_vs_rounds.png", dpi=100)
        plt.close(fig)
    return ["## Plots", "", "![accuracy vs alpha](comparison_accuracy_vs_alpha.png)", "",
            f"![accuracy vs rounds, K = {K0}](comparison_accuracy_vs_rounds.png)", ""]


def verify_secure(data, backends, *, K: int = 10, spec: str = "dirichlet:0.1", seed: int = 0,
                  cfg: FLConfig = FLConfig(), hidden: int = 64, mus=(0.01,), lrs=(3.0, 1.0), only=None, log=print):
    """Each method under each secure backend against the same run under ``plain``."""
    Xtr, ytr, Xte, yte, C = data
    cl = _clients(Xtr, ytr, K, spec, seed)
    base = FLConfig(**{**cfg.__dict__, "seed": int(seed), "backend": "plain"})
    out = []
    for name, fn in methods(Xtr.shape[1], C, hidden, mus, lr_linear=lrs[0], lr_mlp=lrs[1]):
        if only and not any(name.startswith(o) for o in only):
            continue
        plain = fn(cl, (Xte, yte), base)
        for b in backends:
            sec = fn(cl, (Xte, yte), FLConfig(**{**base.__dict__, "backend": b}))
            ms = sec.get("models", [sec["theta"]])
            mp = plain.get("models", [plain["theta"]])
            diff = max(float(np.max(np.abs(a - p))) for a, p in zip(ms, mp))
            head = LinearHead(Xtr.shape[1], C) if len(ms[0]) == LinearHead(Xtr.shape[1], C).size else \
                MLPHead(Xtr.shape[1], C, hidden)
            agree = float(np.mean([np.mean(head.predict(a, Xte) == head.predict(p, Xte)) for a, p in zip(ms, mp)]))
            row = {"backend": b, "method": name, "K": K, "partition": spec, "rounds": sec["rounds"],
                   "max_abs_diff": diff, "agreement": agree, "acc_secure": sec["client_acc"],
                   "acc_plain": plain["client_acc"], "bytes_per_round": sec["bytes_per_round"],
                   "seconds": sec["seconds"]}
            out.append(row)
            log(f"verify {b:<7} {name:<24} max|diff|={diff:.2e} agreement={agree:.4f} "
                f"bytes/round={row['bytes_per_round']:.0f} {row['seconds']:.1f}s")
    return out


# -- command line ------------------------------------------------------------------------
def _list(s, conv=str):
    return tuple(conv(v) for v in s.split(",") if v)


def _command_line(args) -> str:
    flags = []
    for k, v in sorted(vars(args).items()):
        if k in ("func", "command", "out", "json", "rows", "report_from") or v is None or v is False:
            continue
        if v is True:  # a store_true flag: written bare, so the line runs as printed
            flags.append(f"--{k.replace('_', '-')}")
            continue
        flags.append(f"--{k.replace('_', '-')} {v if v != '' else chr(39) * 2}")
    return "secure-afl compare " + " ".join(flags)


def _load_rows(paths):
    rows = []
    for p in paths:
        for line in Path(p).read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
    return rows


def _cmd(args) -> int:
    from threadpoolctl import threadpool_limits

    # The heads' matrices are small (d = 256, h = 64): a multi-threaded BLAS
    # spends more time synchronising than computing (measured: 7x slower on 2 cores).
    with threadpool_limits(1):
        return _run(args)


def _run_all(args) -> int:
    """The tuned study (``study.py``) and the RI ablation: everything in COMPARISON.md, one command."""
    from . import study as st

    path = Path(args.study_json or Path(args.out) / "comparison_study.json")
    command = f"secure-afl compare --all --out {args.out} --workers {args.workers} --seeds {args.seeds}" + (
        f" --methods {args.methods}" if args.methods else "") + (
        f" --cache {args.cache}" if args.cache else "") + ("" if args.verify else " --verify ''")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.render_only:
        blob = json.loads(path.read_text())
    else:
        # seed 0 tunes and is never reported; seeds 1..S are reported, each on its own train/test split
        seeds = tuple(range(1, args.seeds + 1))
        only = _list(args.methods)
        grids = {m: g for m, g in st.GRIDS.items() if not only or any(m.startswith(p) for p in only)}
        if not grids:
            raise SystemExit(f"compare --all: no gradient baseline starts with {args.methods!r}")
        study = st.run_study(workers=args.workers, seeds=seeds, tune_seed=0, cache=args.cache,
                             verify_rounds=3 if args.verify else 0, grids=grids)
        ablation = [{**row, "seed": s} for s in seeds
                    for row in ri_ablation(_data_for_ablation(s), clients=(10, 100, 500),
                                           gammas=(0.0, 0.1, 1.0, 10.0, 100.0), seed=s)]
        blob = {"study": study, "ablation": ablation, "command": command}
        path.write_text(json.dumps(blob, default=float))
        print(f"wrote {path}")
    md = st.write_study_report(blob["study"], args.out, command=blob["command"], ablation=blob["ablation"])
    print(f"wrote {md}")
    return 0


def _data_for_ablation(seed):
    from ..demo import load_embedded

    return load_embedded("digits", seed)


def _run(args) -> int:

    if getattr(args, "all", False):
        if args.features or args.embed_digits:
            raise SystemExit("compare: --all is the digits study; run --features / --embed-digits without --all")
        return _run_all(args)

    if args.report_from:
        # A .jsonl is a --rows progress file (a run stopped early): rows only.
        blobs = [{"rows": _load_rows([p])} if p.endswith(".jsonl") else json.loads(Path(p).read_text())
                 for p in args.report_from]
        rows = [r for b in blobs for r in b["rows"]]
        verify = [v for b in blobs for v in (b.get("verify") or [])] or None
        ablation = [a for b in blobs for a in (b.get("ablation") or [])] or None
        intro = "\n\n".join(b.get("intro", "") for b in blobs)
        command = "\n".join(b.get("command", "") for b in blobs)
        md = write_report(rows, ablation, args.out, verify=verify, meta={"intro": intro, "command": command})
        print(f"wrote {md}")
        return 0
    t0 = time.perf_counter()
    features = bool(args.embed_digits or args.features)
    if features:
        from .features import embed_digits, load_features

        path = args.features
        if args.embed_digits:
            res = embed_digits(args.embed_digits, size=args.embed_size, seed=args.embed_seed,
                               per_class=args.embed_per_class)
            print(f"embedded {len(res.y)} digit images at {args.embed_size} px, d = {res.dim}, "
                  f"{res.seconds:.0f} s -> {args.embed_digits}")
            path = args.embed_digits
        data = load_features(path, args.data_seed)
        source = (f"embeddings file `{Path(path).name}` (`secure-afl client embed` format"
                  + (f"; sklearn digits rendered at {args.embed_size} px, random-init resnet18 seed "
                     f"{args.embed_seed}, l2-normalised" if args.embed_digits else "")
                  + f"; scaled to max norm 1, d = {data[0].shape[1]}")
    else:
        data = load_embedded(args.dataset, args.data_seed)
        source = f"Data set `{args.dataset}` (fixed random Fourier features, d = {data[0].shape[1]}"
    cfg = FLConfig(rounds=args.rounds, local_epochs=args.local_epochs, batch_size=args.batch_size,
                   backend=args.backend, personal_fraction=args.personal_fraction)
    lrs = (args.lr_linear, args.lr_mlp)
    sink = None
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.rows:
        fh = open(args.rows, "a")

        def sink(row):
            fh.write(json.dumps(row, default=float) + "\n")
            fh.flush()
    rows = run_grid(data, clients=_list(args.clients, int), partitions=_list(args.partitions),
                    seeds=tuple(range(args.seeds)), cfg=cfg, hidden=args.hidden, mus=_list(args.mu, float),
                    lrs=lrs, only=_list(args.methods) or None, sink=sink)
    verify = None
    if args.verify:
        verify = verify_secure(data, _list(args.verify), K=args.verify_clients, cfg=FLConfig(
            **{**cfg.__dict__, "rounds": args.verify_rounds}), hidden=args.hidden, mus=_list(args.mu, float)[:1], lrs=lrs,
            only=_list(args.verify_methods) or None)
    ablation = ri_ablation(data, clients=_list(args.ri_clients, int), gammas=_list(args.gammas, float)) \
        if args.ri_clients else None
    elapsed = time.perf_counter() - t0
    intro = (f"{source}, "
             f"{data[4]} classes, {data[0].shape[0]} training / {data[2].shape[0]} test samples); "
             f"every aggregation through the `{args.backend}` backend; {args.seeds} seed(s); "
             f"{args.rounds} rounds, {args.local_epochs} local epoch(s), batch {args.batch_size}, "
             f"lr {args.lr_linear} (linear) / {args.lr_mlp} (MLP), "
             f"hidden units {args.hidden}; {elapsed:.0f} s in all.")
    blob = {"rows": rows, "verify": verify, "ablation": ablation, "intro": intro, "command": _command_line(args)}
    if features:
        return _write_features(args, blob, data, rows, ablation, verify, intro)
    md = write_report(rows, ablation, args.out, verify=verify,
                      meta={"intro": intro, "command": _command_line(args)})
    if args.json:
        Path(args.json).write_text(json.dumps(blob, default=float))
    print(f"wrote {md}")
    return 0


def _write_features(args, blob, data, rows, ablation, verify, intro) -> int:
    """A features run: its JSON as OUT/comparison_features.json; where OUT holds the study (``--all``),
    the study's COMPARISON.md re-rendered with the features section in it, else a report of its own."""
    from secure_afl.analytic import centralised_weights, top1_accuracy

    from . import study as st
    from .study_report import FEATURES_JSON

    Xtr, ytr, Xte, yte, C = data
    blob["command"] += f" --out {args.out}"  # where this run's files went is part of what reproduces them
    blob["closed_form_acc"] = top1_accuracy(centralised_weights(Xtr, ytr, C), Xte, yte)
    blob["config"] = {k: getattr(args, k) for k in ("rounds", "local_epochs", "batch_size", "lr_linear", "lr_mlp",
                                                      "backend", "hidden", "seeds", "data_seed", "embed_seed")}
    out = Path(args.out)
    text = json.dumps(blob, default=float)
    (out / FEATURES_JSON).write_text(text)
    if args.json:
        Path(args.json).write_text(text)
    study = out / "comparison_study.json"
    if study.is_file():
        saved = json.loads(study.read_text())
        md = st.write_study_report(saved["study"], out, command=saved["command"], ablation=saved["ablation"])
        print(f"wrote {md} (the study with the features section)")
    else:
        md = write_report(rows, ablation, out, verify=verify, meta={"intro": intro, "command": blob["command"]})
        print(f"wrote {md}")
    return 0


def register(parser) -> None:
    parser.add_argument("--dataset", choices=["digits", "breast-cancer"], default="digits")
    parser.add_argument("--clients", default="10,100", help="comma-separated K values")
    parser.add_argument("--partitions", default="iid,dirichlet:1,dirichlet:0.1,dirichlet:0.005,shards:2")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..S-1 (partition, initialisation, batches)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr-linear", type=float, default=3.0, help="local SGD step, linear head")
    parser.add_argument("--lr-mlp", type=float, default=1.0, help="local SGD step, one-hidden-layer head")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--mu", default="0.01,0.1", help="FedProx mu grid")
    parser.add_argument("--personal-fraction", type=float, default=0.5, help="FedFac: share of personalised units")
    parser.add_argument("--backend", choices=["plain", "ckks", "secagg"], default="secagg",
                        help="protection of every round's sum in the grid")
    parser.add_argument("--methods", default="", help="comma-separated name prefixes to run (default: all; with "
                                                       "--all: the gradient baselines, FedFac always runs)")
    parser.add_argument("--verify", default="secagg,ckks",
                        help="backends whose runs are compared with plain runs (empty: skip)")
    parser.add_argument("--verify-methods", default="", help="comma-separated name prefixes to verify (default: all)")
    parser.add_argument("--verify-clients", type=int, default=10)
    parser.add_argument("--verify-rounds", type=int, default=5)
    parser.add_argument("--ri-clients", default="10,100,500", help="K values of the RI ablation (empty: skip)")
    parser.add_argument("--gammas", default="0,0.1,1,10,100")
    parser.add_argument("--data-seed", type=int, default=0)
    feats = parser.add_mutually_exclusive_group()
    feats.add_argument("--features", metavar="NPZ",
                       help="run on an embeddings file written by `secure-afl client embed --out` instead of "
                            "--dataset (stratified split by --data-seed; X scaled to max norm 1)")
    feats.add_argument("--embed-digits", metavar="NPZ",
                       help="render sklearn digits as an ImageFolder, embed them with the clients' extraction "
                            "(random-init resnet18, CPU, no download), write NPZ, run on it")
    parser.add_argument("--embed-size", type=int, default=64, help="--embed-digits: image side in pixels")
    parser.add_argument("--embed-seed", type=int, default=0, help="--embed-digits: seed of the random backbone")
    parser.add_argument("--embed-per-class", type=int, default=None, help="--embed-digits: first N images per class")
    parser.add_argument("--out", default="docs", help="directory for COMPARISON.md and the PNGs (--features, "
                                                       "--embed-digits: also OUT/comparison_features.json; where OUT "
                                                       "holds the study, its COMPARISON.md gains the features section)")
    parser.add_argument("--json", metavar="PATH", help="also write every run as JSON")
    parser.add_argument("--rows", metavar="PATH", help="append each finished run as one JSON line (progress)")
    parser.add_argument("--report-from", nargs="+", metavar="JSON",
                        help="only write the report from earlier --json outputs (several runs merged)")
    parser.add_argument("--all", action="store_true",
                        help="the tuned study behind docs/COMPARISON.md (grids on validation splits, FedFac "
                             "ablations, secure against plain, RI ablation); digits, K = 10; grids searched on "
                             "seed 0, which is not reported; every chosen setting run on seeds 1..S (--seeds), "
                             "each on its own train/test split")
    parser.add_argument("--workers", type=int, default=2, help="--all: parallel worker processes")
    parser.add_argument("--study-json", metavar="PATH", help="--all: where the raw results go "
                                                              "(default OUT/comparison_study.json)")
    parser.add_argument("--render-only", action="store_true", help="--all: re-render from --study-json")
    parser.add_argument("--cache", metavar="JSONL", help="--all: finished runs, one per line; a re-run reuses "
                                                         "them and appends the new ones (resume, widen a grid)")
    parser.set_defaults(func=_cmd)
