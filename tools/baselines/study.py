"""``secure-afl compare --all``: the tuned comparison behind ``docs/COMPARISON.md``.

What it runs (every number in the report comes from here, seeds fixed):

1. Gradient baselines tuned per method and partition on the TUNING seed,
   which is never reported. Each seed draws its own train/test split of the
   data set (``train_test_split`` at that seed), its partition,
   initialisation, batches and validation hold-out. On the tuning seed each
   client keeps a fifth of its training samples as validation data; every
   grid point (learning rate, local epochs, FedProx mu) trains for
   ``rounds`` rounds on the other four fifths and is scored by the global
   model's accuracy on the pooled validation samples at the last round. No
   test set is used to choose (the choice reads ``val_acc`` only). The
   chosen point is then re-run on all of each client's training data for
   every REPORTED seed, on that seed's own split, so the spread over seeds
   includes the test set's sampling variance; its test accuracy is recorded
   after every round, and so is which test samples each model gets right
   (``correct``, ``correct_prior``), and each test sample's image id
   (``meta.test_ids``: the seeds' splits share images), for the report's
   bootstrap over seeds and images (``study_report.py``). A chosen value on the
   edge of its grid is reported in ``edges``.
2. Bytes on the wire per hospital: one real round of each method's vector
   through the secagg encoder and through ckks (what a hospital uploads), so
   "bytes to reach AFL" is rounds x measured bytes.
3. FedFac as its paper runs it: Adam locally, the factor analysis on the
   clients' updates after ``fa_epochs`` of local training, tau, kappa, the
   learning rate and the local epochs tuned on the clients' own validation
   data; dynamic mode tuned on its own grid; the factor-analysis split
   against a random split of the same size; dynamic mode's switching rate.
4. The client-side label prior (logits outside the client's own label
   support masked) for every per-client accuracy: AFL, the global baselines
   and each FedFac hospital's personal model alike.
5. Secure against plain for every method: a few rounds under plain, secagg
   and ckks (the key holder's flooding), each revealed sum checked against its
   proved tolerance, on the first reported seed.

Grids run in parallel worker processes (``workers``), each single-threaded.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from secure_afl.exceptions import BoundsExceeded, InvalidInputError
from .fl import FLConfig, client_label_mix, evaluate, run_fedavg, run_fedfac
from .heads import LinearHead, MLPHead
from .securesum import SecureSum
from .study_report import pack_bits
from .study_stats import image_ids

__all__ = ["GRIDS", "FEDFAC_GRID", "split_validation", "label_prior_accuracy", "rounds_to_reach", "run_study",
           "grid_edges", "write_study_report"]

from .grids import (DYNAMIC_GRID, FA_BOUND, FEDFAC_GRID, FEDFAC_PARTITIONS, GRIDS, HARD_LIMITS,  # noqa: E402
                    PARTITIONS)


def split_validation(clients, fraction: float = 0.2, seed: int = 0):
    """(fit clients, validation clients): each client holds out ``fraction`` of its own samples
    (at least one kept for fitting)."""
    fit, val = [], []
    for k, (X, y) in enumerate(clients):
        order = np.random.default_rng([seed, 11, k]).permutation(y.size)
        n_val = min(int(round(fraction * y.size)), y.size - 1)
        fit.append((X[order[n_val:]], y[order[n_val:]]))
        val.append((X[order[:n_val]], y[order[:n_val]]))
    return fit, val


def label_prior_accuracy(head, theta, test, mix) -> np.ndarray:
    """Per-client accuracy of a model whose logits are masked to the client's own label support.

    ``theta``: one global model, or a list with one personal model per client (FedFac).
    The support is the set of labels the client holds (mix > 0): information every
    client has locally for free, so every per-client method gets it alike."""
    Xte, yte = test
    C = mix.shape[1]
    out = np.zeros(mix.shape[0])
    shared = isinstance(theta, np.ndarray) and theta.ndim == 1
    glob = head.logits(theta, Xte) if shared else None
    for k in range(mix.shape[0]):
        logits = glob if shared else head.logits(theta[k], Xte)
        sup = mix[k] > 0
        pred = np.argmax(np.where(sup[None, :], logits, -np.inf), axis=1)
        acc = np.array([np.mean(pred[yte == c] == c) if np.any(yte == c) else 0.0 for c in range(C)])
        out[k] = mix[k] @ acc
    return out


def rounds_to_reach(history, target: float):
    """First round whose accuracy (history rows (round, global, per-client)) is >= target, or None."""
    for r, g, _ in history:
        if g >= target - 1e-12:
            return int(r)
    return None


def _head(kind, d, C, hidden):
    return LinearHead(d, C) if kind == "linear" else MLPHead(d, C, hidden)


def _clients(X, y, K, spec, seed):
    from secure_afl.partition import partition

    parts = [p for p in partition(y, K, spec, seed=seed) if p.size]
    return [(X[p], y[p]) for p in parts]


def _pooled(clients):
    return np.concatenate([X for X, _ in clients]), np.concatenate([y for _, y in clients])


_DATA = {}


def _data(name, seed):
    """(Xtr, ytr, Xte, yte, C) of seed ``seed``: the data set split at that seed (each seed its own test set)."""
    if (name, seed) not in _DATA:
        from ..demo import load_embedded

        _DATA[(name, seed)] = load_embedded(name, seed)
    return _DATA[(name, seed)]


def correctness(head, theta, test, mix) -> dict:
    """Which test samples each hospital's model gets right, without and with the label prior, and the hospitals'
    label mixes: what the report's paired tests resample. ``theta``: one global model or one per hospital."""
    Xte, yte = test
    shared = isinstance(theta, np.ndarray) and theta.ndim == 1
    models = [theta] if shared else list(theta)
    logits = [head.logits(m, Xte) for m in models]
    correct = [pack_bits(np.argmax(lg, axis=1) == yte) for lg in logits]
    prior = []
    for k in range(mix.shape[0]):
        lg = logits[0 if shared else k]
        prior.append(pack_bits(np.argmax(np.where((mix[k] > 0)[None, :], lg, -np.inf), axis=1) == yte))
    return {"correct": correct, "correct_prior": prior, "mix": mix.tolist(), "n_test": int(yte.size)}


#: The keys of a job that make up its setting (what a final run repeats on every seed).
_SETTING = ("dataset", "data_seed", "K", "rounds", "hidden", "method", "head", "partition", "lr", "local_epochs",
            "mu", "optimizer", "tau", "kappa", "fa_epochs", "dynamic", "split")


def _setting(row: dict) -> dict:
    return {k: row[k] for k in _SETTING if k in row}


#: What a job's result depends on, with the defaults ``_job`` applies: the key of the job cache.
_KEY_DEFAULTS = {"dataset": None, "data_seed": None, "seed": None, "K": None, "rounds": None, "hidden": None,
                 "stage": None, "method": None, "head": None, "partition": None, "lr": None, "local_epochs": None,
                 "mu": 0.0, "optimizer": "sgd", "tau": 0.5, "kappa": 0.8, "fa_epochs": 0, "dynamic": False,
                 "split": "fa"}


def job_key(job: dict) -> str:
    return json.dumps({k: job.get(k, v) for k, v in _KEY_DEFAULTS.items()}, sort_keys=True, default=float)


class JobCache:
    """Finished jobs, one JSON line each, keyed by :func:`job_key`: a stopped study resumes where it was and a
    re-run with a wider grid runs only the new points. Every run is deterministic in its key (seeded
    partition, initialisation, batches, validation hold-out), so a cached result is the result."""

    def __init__(self, path=None):
        self.path, self.rows = (Path(path) if path else None), {}
        if self.path and self.path.is_file():
            for line in self.path.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    self.rows[job_key(row)] = row

    def run(self, jobs, mapper):
        todo = [j for j in jobs if job_key(j) not in self.rows]
        fh = open(self.path, "a") if self.path else None
        try:
            for j, r in zip(todo, mapper(todo)):
                self.rows[job_key(j)] = r
                if fh:
                    fh.write(json.dumps(r, default=float) + "\n")
                    fh.flush()
        finally:
            if fh:
                fh.close()
        return [{**self.rows[job_key(j)], **j} for j in jobs]


def _job(job: dict) -> dict:
    """One run (a worker process): grid point on the fit/validation split, or a final run on all data."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        Xtr, ytr, Xte, yte, C = _data(job["dataset"], job["data_seed"])
        cl = _clients(Xtr, ytr, job["K"], job["partition"], job["seed"])
        fit, val = split_validation(cl, seed=job["seed"])
        train = fit if job["stage"] == "grid" else cl
        head = _head(job["head"], Xtr.shape[1], C, job["hidden"])
        cfg = FLConfig(rounds=job["rounds"], lr=job["lr"], local_epochs=job["local_epochs"], mu=job["mu"],
                       seed=job["seed"], backend="plain", optimizer=job.get("optimizer", "sgd"),
                       personal_fraction=job.get("tau", 0.5), kappa=job.get("kappa", 0.8),
                       fa_epochs=job.get("fa_epochs", 0), split=job.get("split", "fa"), fa_bound=FA_BOUND,
                       eval_every=1 if job["stage"] == "final" else job["rounds"])
        # a grid point is scored on validation data only; the test set is evaluated for finals alone
        test = (Xte, yte)
        out = {k: v for k, v in job.items()}
        try:
            return _job_run(job, out, head, train, val, test, cfg, cl, C)
        except (BoundsExceeded, InvalidInputError) as e:
            # an update beyond the declared bound (or not finite): the run diverged; the secure sum refuses it
            out.update({"refused": str(e)[:120], "val_acc": -1.0, "global_acc": float("nan"),
                        "client_acc": float("nan"), "client_acc_prior": float("nan"), "history": [],
                        "seconds": float("nan"), "diverged": True})
            return out


def _job_run(job, out, head, train, val, test, cfg, cl, C):
    fac = job["method"].startswith("FedFac")
    if fac:
        res = run_fedfac(head, train, test, cfg, dynamic=job.get("dynamic", False))
        # the clients' own validation samples, each on its personal model
        vacc = float(np.mean([np.mean(head.predict(m, Xv) == yv) for m, (Xv, yv) in zip(res["models"], val)]))
    else:
        res = run_fedavg(head, train, test, cfg)
        Xv, yv = _pooled(val)
        vacc = float(np.mean(head.predict(res["theta"], Xv) == yv))
    out["val_acc"] = vacc
    if job["stage"] != "final":
        return out  # a grid point reports its validation score and nothing measured on the test set
    out.update({"global_acc": res["global_acc"], "client_acc": res["client_acc"],
                "history": [list(map(float, h)) for h in res["history"]], "seconds": res["seconds"]})
    mix = client_label_mix(cl, C)
    out["client_acc_prior"] = float(np.mean(label_prior_accuracy(head, res["models"] if fac else res["theta"],
                                                                 test, mix)))
    out.update(correctness(head, res["models"] if fac else res["theta"], test, mix))
    if fac:
        out.update({"switching": res["switching"], "r_offdiag": res["r_offdiag"],
                    "personal": [int(v) for v in res["splits"][-1][1]]})
    return out


def _grid_jobs(method, spec, base, grids):
    g = grids[method]
    return [{**base, "stage": "grid", "method": method, "head": g["head"], "partition": spec, "lr": lr,
             "local_epochs": E, "mu": mu} for lr in g["lr"] for E in g["local_epochs"] for mu in g["mu"]]


def _fedfac_jobs_a(spec, base, fg, method, dynamic):
    return [{**base, "stage": "grid", "method": method, "head": "mlp", "partition": spec, "lr": lr,
             "local_epochs": E, "mu": 0.0, "optimizer": "adam", "tau": 0.5, "kappa": 0.8, "dynamic": dynamic}
            for lr in fg["lr"] for E in fg["local_epochs"]]


def _fedfac_jobs_b(a, fg):
    """Stage B at stage A's best ``a``: every (tau, kappa) but A's own; tau 1.0 (no split) once."""
    pts = [(t, k) for t in fg["tau"] if t < 1.0 for k in fg["kappa"]]
    if 1.0 in fg["tau"]:
        pts.append((1.0, a["kappa"]))
    return [{**_setting(a), "seed": a["seed"], "stage": "grid", "tau": t, "kappa": k}
            for t, k in pts if (t, k) != (a["tau"], a["kappa"])]


def _axes(grid: dict) -> dict:
    return {k: tuple(v) for k, v in grid.items() if k in ("lr", "local_epochs", "mu", "tau", "kappa")}


def _on_edge(row, axes) -> list:
    """(axis, 'low' | 'high') for each multi-valued axis whose extreme the row's value is."""
    out = []
    for ax, vals in axes.items():
        if len(vals) > 1 and ax in row:
            if row[ax] == min(vals):
                out.append((ax, "low"))
            elif row[ax] == max(vals):
                out.append((ax, "high"))
    return out


def _best(rows, axes=None):
    """The grid point with the highest validation score. Ties (the pooled validation set is a few hundred
    samples, so equal scores are common) go to fewer grid edges, then fewer local epochs, then the smaller
    step: among equally good points, the one the grid brackets."""
    axes = axes or {}
    return max(rows, key=lambda r: (r["val_acc"], -len([e for e in _on_edge(r, axes) if e not in HARD_LIMITS]),
                                    -r["local_epochs"], -r["lr"]))


def grid_edges(chosen: dict, axes_of) -> list:
    """Every chosen setting whose value sits on an edge of its grid (hard limits marked, not hidden)."""
    out = []
    for (method, spec), row in chosen.items():
        axes = axes_of(method)
        for ax, side in _on_edge(row, axes):
            out.append({"method": method, "partition": spec, "axis": ax, "value": row[ax], "side": side,
                        "grid": list(axes[ax]), "hard_limit": (ax, side) in HARD_LIMITS})
    return out


def measure_bytes(d: int, C: int, K: int, hidden: int) -> dict:
    """Bytes one hospital uploads per aggregation, by method family and backend, from one real round."""
    from .fedfac import gram_length

    rng = np.random.default_rng(0)
    out = {}
    lengths = {"linear": LinearHead(d, C).size + 1, "mlp": MLPHead(d, C, hidden).size + 1,
               "fa_gram": gram_length(hidden)}
    for name, n in lengths.items():
        for backend in ("secagg", "ckks"):
            ss = SecureSum(backend, n, 1000.0, K, session=f"bytes-{name}")
            ss.sum([rng.uniform(-1, 1, n) for _ in range(K)])
            out[(name, backend)] = float(ss.bytes_up[-1])
    return out


def run_study(*, dataset="digits", seeds=(1, 2, 3, 4, 5), tune_seed=0, K=10, rounds=200, hidden=64,
              partitions=PARTITIONS, fedfac_partitions=FEDFAC_PARTITIONS, fa_epochs=20, workers=2, verify_rounds=3,
              grids=None, fedfac_grid=None, dynamic_grid=None, secure=True, data=None, cache=None, log=print) -> dict:
    """The whole study (module docstring). Grids are searched on ``tune_seed`` alone (its own split, partition
    and validation hold-out), which is never reported; every chosen setting is then run on every seed of
    ``seeds``, each on its own train/test split. ``grids`` / ``fedfac_grid`` / ``dynamic_grid`` replace the
    defaults (smaller runs); ``data`` replaces the data set (single process): a callable ``seed -> (Xtr, ytr,
    Xte, yte, C)`` or one such tuple for every seed; ``secure=False`` skips the secagg / ckks runs (bytes, AFL
    under ckks, secure against plain); ``cache`` is a :class:`JobCache` path."""
    from .afl import run_afl

    grids = GRIDS if grids is None else grids
    fg = FEDFAC_GRID if fedfac_grid is None else fedfac_grid
    dg = DYNAMIC_GRID if dynamic_grid is None else dynamic_grid
    seeds, tune = tuple(int(s) for s in seeds), int(tune_seed)
    if tune in seeds or not seeds or len(set(seeds)) != len(seeds):
        raise InvalidInputError(f"the tuning seed {tune} must not be reported, and the reported seeds {seeds} must "
                                "be distinct and at least one")
    if data is not None:
        dataset, workers = "given", 1
        for s in (tune,) + seeds:
            _DATA[(dataset, s)] = data(s) if callable(data) else data
    t0 = time.perf_counter()
    Xtr, ytr, Xte, yte, C = _data(dataset, tune)
    d = Xtr.shape[1]
    base = {"dataset": dataset, "data_seed": tune, "seed": tune, "K": K, "rounds": rounds, "hidden": hidden}
    pool = ProcessPoolExecutor(max_workers=workers) if workers > 1 else None
    jc = JobCache(cache)

    def run(jobs):
        return jc.run(jobs, (lambda js: pool.map(_job, js)) if pool else (lambda js: map(_job, js)))

    def finals_of(rows):  # each reported seed on its own split: the tuning seed's data never enter a cell
        return run([{**_setting(c), "data_seed": s, "seed": s, "stage": "final"} for c in rows for s in seeds])
    fac_axes = {"FedFac-static": _axes(fg), "FedFac-dynamic": _axes(dg)}
    try:
        # 1. gradient baselines: grid on validation (tuning seed), then the chosen point on all data, every seed
        grid = run([j for spec in partitions for m in grids for j in _grid_jobs(m, spec, base, grids)])
        for r in grid:
            log(f"grid {r['method']:<15} {r['partition']:<16} lr={r['lr']:<6g} E={r['local_epochs']} "
                f"mu={r['mu']:<5g} val={r['val_acc']:.4f}")
        chosen = {(m, spec): _best([r for r in grid if r["method"] == m and r["partition"] == spec],
                                   _axes(grids[m]))
                  for spec in partitions for m in grids}
        finals = finals_of(chosen.values())
        # 3. FedFac, static and dynamic each tuned on its own: stage A (step, epochs), stage B (tau, kappa)
        fa_base = {**base, "fa_epochs": fa_epochs}
        fac_grid = []
        for method, g, dyn in (("FedFac-static", fg, False), ("FedFac-dynamic", dg, True)):
            ga = run([j for spec in fedfac_partitions for j in _fedfac_jobs_a(spec, fa_base, g, method, dyn)])
            gb = run([j for spec in fedfac_partitions
                      for j in _fedfac_jobs_b(_best([r for r in ga if r["partition"] == spec], _axes(g)), g)])
            fac_grid += ga + gb
            for spec in fedfac_partitions:
                chosen[(method, spec)] = _best([r for r in ga + gb if r["partition"] == spec], fac_axes[method])
        for r in fac_grid:
            log(f"fedfac grid {r['method']:<15} {r['partition']:<16} lr={r['lr']:g} E={r['local_epochs']} "
                f"tau={r['tau']} kappa={r['kappa']} val={r['val_acc']:.4f}")
        fac_chosen = []
        for spec in fedfac_partitions:
            st, dy = chosen[("FedFac-static", spec)], chosen[("FedFac-dynamic", spec)]
            fac_chosen += [st, dy]
            # the split ablations need a split: at tau 1.0 every unit is personal and FA, random and raw agree,
            # so they run at the best static point with tau < 1 (the chosen one where it has tau < 1)
            split_rows = [r for r in fac_grid if r["partition"] == spec and r["method"] == "FedFac-static"
                          and r["tau"] < 1.0]
            ab = _best(split_rows, fac_axes["FedFac-static"]) if split_rows else st
            if ab is not st:
                fac_chosen.append({**_setting(ab), "method": "FedFac-static, best tau < 1"})
            fac_chosen += [{**_setting(ab), "method": "FedFac-static random split", "split": "random"},
                           {**_setting(ab), "method": "FedFac-static 1 epoch (R near I)", "fa_epochs": 0}]
        fac_finals = finals_of(fac_chosen)
    finally:
        if pool:
            pool.shutdown()
    edges = grid_edges(chosen, lambda m: fac_axes[m] if m in fac_axes else _axes(grids[m]))
    for e in edges:
        log(f"WARNING: {e['method']} on {e['partition']} chose {e['axis']} = {e['value']:g}, the {e['side']} edge "
            f"of {e['grid']}" + (" (a hard limit)" if e["hard_limit"] else ""))
    # 4. AFL on every reported seed (plain; secagg and ckks through the key holder's flooding on the first)
    afl = {}
    first = seeds[0]
    for spec in sorted(set(partitions) | set(fedfac_partitions)):
        row = {"seeds": []}
        for s in seeds:
            Xs, ys, Xts, yts, _ = _data(dataset, s)
            cl = _clients(Xs, ys, K, spec, s)
            mix = client_label_mix(cl, C)
            for b in (("plain", "secagg", "ckks") if secure and s == first else ("plain",)):
                res = run_afl(cl, (Xts, yts), C, backend=b)
                r = {"seed": s, "global_acc": res["global_acc"], "client_acc": res["client_acc"],
                     "client_acc_prior": float(np.mean(label_prior_accuracy(LinearHead(d, C), res["theta"],
                                                                            (Xts, yts), mix))),
                     "bytes": res["bytes_per_round"], "flood_sigma": res.get("flood_sigma"),
                     "ridge": res.get("ridge"), "margin_bits": res.get("flood_kl_log2")}
                if b == "plain":
                    row["seeds"].append({**r, **correctness(LinearHead(d, C), res["theta"], (Xts, yts), mix)})
                if s == first:
                    row[b] = r
        afl[spec] = row
        log(f"AFL {spec:<16} {row['plain']['global_acc']:.4f} prior "
            f"{np.mean([r['client_acc_prior'] for r in row['seeds']]):.4f}")
    # 2. bytes; 5. secure against plain, the chosen point of each method at the first non-IID partition
    nbytes = measure_bytes(d, C, K, hidden) if secure else {}
    verify = verify_methods({k: v for k, v in chosen.items() if k[0] in grids},
                            [{**_setting(c), "seed": first} for c in fac_chosen if c["method"] in fac_axes],
                            _data(dataset, first), K=K, seed=first, rounds=verify_rounds, log=log) \
        if secure and verify_rounds > 0 else []
    out_grids = {m: {k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for m, g in grids.items()}
    return {"grids": out_grids, "fedfac_grids": {"FedFac-static": {k: list(v) for k, v in fg.items()},
                                                 "FedFac-dynamic": {k: list(v) for k, v in dg.items()}},
            "grid": grid, "chosen": [{**_setting(c), "seed": tune, "val_acc": c["val_acc"]}
                                     for c in chosen.values()],
            "edges": edges, "finals": finals, "fac_grid": fac_grid, "fac_finals": fac_finals, "afl": afl,
            "bytes": {f"{k[0]}|{k[1]}": v for k, v in nbytes.items()}, "verify": verify,
            "meta": {"dataset": dataset, "seeds": list(seeds), "tune_seed": tune, "secure_seed": first,
                     "split": "per seed (train_test_split at the seed, stratified)", "K": K,
                     "rounds": rounds, "hidden": hidden, "fa_epochs": fa_epochs, "train": int(Xtr.shape[0]),
                     "test": int(Xte.shape[0]), "dim": int(d), "classes": int(C),
                     "test_labels": {str(s): "".join(map(str, _data(dataset, s)[3].tolist())) for s in seeds},
                     "test_ids": dict(zip(map(str, seeds), image_ids([_data(dataset, s)[2] for s in seeds]))),
                     "seconds": time.perf_counter() - t0}}


def verify_methods(chosen, fac_jobs, data, *, K, seed, rounds, log=print):
    """Each method at its chosen point under plain, secagg and ckks for ``rounds`` rounds."""
    from .afl import run_afl

    Xtr, ytr, Xte, yte, C = data
    d = Xtr.shape[1]
    spec = "dirichlet:0.1"
    cl = _clients(Xtr, ytr, K, spec, seed)
    test = (Xte, yte)
    out = []
    runners = []
    for (m, s), c in chosen.items():
        if s != spec:
            continue
        head = _head(c["head"], d, C, c["hidden"])
        cfg = FLConfig(rounds=rounds, lr=c["lr"], local_epochs=c["local_epochs"], mu=c["mu"], seed=seed)
        runners.append((m, head, cfg, False))
    for j in fac_jobs:
        if j["partition"] == spec and j["method"] in ("FedFac-static", "FedFac-dynamic"):
            cfg = FLConfig(rounds=rounds, lr=j["lr"], local_epochs=j["local_epochs"], seed=seed, optimizer="adam",
                           personal_fraction=j["tau"], kappa=j["kappa"], fa_epochs=j["fa_epochs"], fa_bound=FA_BOUND)
            runners.append((j["method"], MLPHead(d, C, j["hidden"]), cfg, j.get("dynamic", False)))
    for m, head, cfg, dyn in runners:
        res = {}
        for b in ("plain", "secagg", "ckks"):
            c = FLConfig(**{**cfg.__dict__, "backend": b})
            r = run_fedfac(head, cl, test, c, dynamic=dyn) if m.startswith("FedFac") else run_fedavg(head, cl, test, c)
            res[b] = r
        for b in ("secagg", "ckks"):
            ms, mp = res[b].get("models", [res[b]["theta"]]), res["plain"].get("models", [res["plain"]["theta"]])
            row = {"method": m, "backend": b, "rounds": rounds,
                   "max_abs_diff": max(float(np.max(np.abs(a - p))) for a, p in zip(ms, mp)),
                   "agreement": float(np.mean([np.mean(head.predict(a, Xte) == head.predict(p, Xte))
                                               for a, p in zip(ms, mp)])),
                   "acc_secure": res[b]["client_acc"], "acc_plain": res["plain"]["client_acc"],
                   "splits_equal": (None if "splits" not in res[b] else
                                    [list(map(list, s)) for s in res[b]["splits"]] ==
                                    [list(map(list, s)) for s in res["plain"]["splits"]]),
                   "bytes_per_round": res[b]["bytes_per_round"], "err_ratio": res[b]["err_ratio"]}
            out.append(row)
            log(f"verify {b:<6} {m:<15} max|diff|={row['max_abs_diff']:.2e} agreement={row['agreement']:.4f}")
    for b in ("secagg", "ckks"):
        pl, se = run_afl(cl, test, C, backend="plain"), run_afl(cl, test, C, backend=b)
        out.append({"method": "AFL", "backend": b, "rounds": 1,
                    "max_abs_diff": float(np.max(np.abs(pl["theta"] - se["theta"]))),
                    "agreement": float(np.mean(LinearHead(d, C).predict(pl["theta"], Xte) ==
                                               LinearHead(d, C).predict(se["theta"], Xte))),
                    "acc_secure": se["global_acc"], "acc_plain": pl["global_acc"], "splits_equal": None,
                    "bytes_per_round": se["bytes_per_round"], "err_ratio": None,
                    "ridge": se.get("ridge"), "flood_sigma": se.get("flood_sigma")})
    return out


def write_study_report(study: dict, out_dir, *, command: str, ablation=None) -> Path:
    from .study_report import render

    return render(study, Path(out_dir), command=command, ablation=ablation)


def save(study: dict, path) -> None:
    Path(path).write_text(json.dumps(study, default=float))
