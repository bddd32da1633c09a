"""``secure-afl compare --all``: the tuned comparison behind ``docs/COMPARISON.md``.

What it runs (every number in the report comes from here, seeds fixed):

1. Gradient baselines tuned per method and partition. Each client keeps a
   fifth of its samples as validation data; every grid point (learning rate,
   local epochs, FedProx mu) trains for ``rounds`` rounds on the other four
   fifths and is scored by the global model's accuracy on the pooled
   validation samples at the last round. The test set is never used to
   choose. The chosen point is then re-run on all of each client's data and
   its test accuracy is recorded after every round.
2. Bytes on the wire per hospital: one real round of each method's vector
   through the secagg encoder and through ckks (what a hospital uploads), so
   "bytes to reach AFL" is rounds x measured bytes.
3. FedFac as its paper runs it: Adam locally, the factor analysis on the
   clients' updates after ``fa_epochs`` of local training, tau, kappa, the
   learning rate and the local epochs tuned on the clients' own validation
   data; the factor-analysis split against a random split of the same size;
   dynamic mode's switching rate per round.
4. AFL with a client-side label prior (logits outside the client's own label
   support masked), next to every per-client accuracy.
5. Secure against plain for every method: a few rounds under plain, secagg
   and ckks (the key holder's flooding), each revealed sum checked against its
   proved tolerance.

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

__all__ = ["GRIDS", "FEDFAC_GRID", "split_validation", "label_prior_accuracy", "rounds_to_reach", "run_study",
           "write_study_report"]

from .grids import FA_BOUND, FEDFAC_GRID, FEDFAC_PARTITIONS, GRIDS, PARTITIONS  # noqa: E402  (re-exported)


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
    """Per-client accuracy of a global model whose logits are masked to the client's own label support.

    The support is the set of labels the client holds (mix > 0): information every
    client has locally for free, and what a personalised model learns implicitly."""
    Xte, yte = test
    logits = head.logits(theta, Xte)
    C = mix.shape[1]
    out = np.zeros(mix.shape[0])
    for k in range(mix.shape[0]):
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
    if (name, seed) not in _DATA:
        from ..demo import load_embedded

        _DATA[(name, seed)] = load_embedded(name, seed)
    return _DATA[(name, seed)]


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
        test = (Xte, yte)
        out = {k: v for k, v in job.items()}
        try:
            return _job_run(job, out, head, train, val, test, cfg, cl, C)
        except (BoundsExceeded, InvalidInputError) as e:
            # an update beyond the declared bound (or not finite): the run diverged; the secure sum refuses it
            out.update({"refused": str(e)[:120], "val_acc": -1.0, "global_acc": float("nan"), "client_acc": float("nan"), "history": [],
                        "seconds": float("nan"), "diverged": True})
            return out


def _job_run(job, out, head, train, val, test, cfg, cl, C):
    if job["method"].startswith("FedFac"):
        res = run_fedfac(head, train, test, cfg, dynamic=job.get("dynamic", False))
        # the clients' own validation samples, each on its personal model
        vacc = float(np.mean([np.mean(head.predict(m, Xv) == yv) for m, (Xv, yv) in zip(res["models"], val)]))
    else:
        res = run_fedavg(head, train, test, cfg)
        Xv, yv = _pooled(val)
        vacc = float(np.mean(head.predict(res["theta"], Xv) == yv))
    out.update({"val_acc": vacc, "global_acc": res["global_acc"], "client_acc": res["client_acc"],
                "history": [list(map(float, h)) for h in res["history"]], "seconds": res["seconds"]})
    if job["method"].startswith("FedFac"):
        out.update({"switching": res["switching"], "r_offdiag": res["r_offdiag"],
                    "personal": [int(v) for v in res["splits"][-1][1]]})
    elif job["stage"] == "final":
        mix = client_label_mix(cl, C)
        out["client_acc_prior"] = float(np.mean(label_prior_accuracy(head, res["theta"], test, mix)))
    return out


def _grid_jobs(method, spec, base, grids):
    g = grids[method]
    return [{**base, "stage": "grid", "method": method, "head": g["head"], "partition": spec, "lr": lr,
             "local_epochs": E, "mu": mu} for lr in g["lr"] for E in g["local_epochs"] for mu in g["mu"]]


def _fedfac_jobs_a(spec, base, fg):
    return [{**base, "stage": "grid", "method": "FedFac-static", "head": "mlp", "partition": spec, "lr": lr,
             "local_epochs": E, "mu": 0.0, "optimizer": "adam", "tau": 0.5, "kappa": 0.8}
            for lr in fg["lr"] for E in fg["local_epochs"]]


def _best(rows):
    return max(rows, key=lambda r: (r["val_acc"], -r["local_epochs"], -r["lr"]))


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


def run_study(*, dataset="digits", data_seed=0, seed=0, K=10, rounds=200, hidden=64, partitions=PARTITIONS,
              fedfac_partitions=FEDFAC_PARTITIONS, fa_epochs=20, workers=2, verify_rounds=3, grids=None,
              fedfac_grid=None, log=print) -> dict:
    """The whole study (module docstring); ``grids`` / ``fedfac_grid`` replace :data:`GRIDS` /
    :data:`FEDFAC_GRID` (smaller runs)."""
    from .afl import run_afl

    grids = GRIDS if grids is None else grids
    fg = FEDFAC_GRID if fedfac_grid is None else fedfac_grid
    t0 = time.perf_counter()
    Xtr, ytr, Xte, yte, C = _data(dataset, data_seed)
    d = Xtr.shape[1]
    base = {"dataset": dataset, "data_seed": data_seed, "seed": seed, "K": K, "rounds": rounds, "hidden": hidden}
    pool = ProcessPoolExecutor(max_workers=workers) if workers > 1 else None
    run = (lambda jobs: list(pool.map(_job, jobs))) if pool else (lambda jobs: [_job(j) for j in jobs])
    try:
        # 1. gradient baselines: grid on validation, then the chosen point on all data
        grid = run([j for spec in partitions for m in grids for j in _grid_jobs(m, spec, base, grids)])
        for r in grid:
            log(f"grid {r['method']:<15} {r['partition']:<16} lr={r['lr']:<6g} E={r['local_epochs']} "
                f"mu={r['mu']:<5g} val={r['val_acc']:.4f}")
        chosen = {}
        for spec in partitions:
            for m in grids:
                chosen[(m, spec)] = _best([r for r in grid if r["method"] == m and r["partition"] == spec])
        finals = run([{**c, "stage": "final"} for c in chosen.values()])
        # 3. FedFac: stage A, stage B, then FA static / random static / FA dynamic on all data
        fa_base = {**base, "fa_epochs": fa_epochs}
        ffa = run([j for spec in fedfac_partitions for j in _fedfac_jobs_a(spec, fa_base, fg)])
        fac_grid = list(ffa)
        stage_b = []
        for spec in fedfac_partitions:
            a = _best([r for r in ffa if r["partition"] == spec])
            stage_b += [{**a, "stage": "grid", "tau": t, "kappa": k, "history": None}
                        for t in fg["tau"] for k in fg["kappa"] if (t, k) != (0.5, 0.8)]
        stage_b = [{k: v for k, v in j.items() if k not in ("history", "val_acc", "global_acc", "client_acc",
                                                              "seconds", "switching", "r_offdiag", "personal")}
                   for j in stage_b]
        fac_grid += run(stage_b)
        fac_final_jobs = []
        for spec in fedfac_partitions:
            b = _best([r for r in fac_grid if r["partition"] == spec])
            b = {k: v for k, v in b.items() if k in base or k in ("method", "head", "partition", "lr", "local_epochs",
                                                                  "mu", "optimizer", "tau", "kappa", "fa_epochs")}
            fac_final_jobs += [{**b, "stage": "final", "method": "FedFac-static"},
                               {**b, "stage": "final", "method": "FedFac-static random split", "split": "random"},
                               {**b, "stage": "final", "method": "FedFac-dynamic", "dynamic": True},
                               {**b, "stage": "final", "method": "FedFac-static 1 epoch (R near I)",
                                "fa_epochs": 0}]
        fac_finals = run(fac_final_jobs)
    finally:
        if pool:
            pool.shutdown()
    for r in fac_grid:
        log(f"fedfac grid {r['partition']:<16} lr={r['lr']:g} E={r['local_epochs']} tau={r['tau']} "
            f"kappa={r['kappa']} val={r['val_acc']:.4f}")
    # 4. AFL (plain, secagg, ckks through the key holder's flooding) and its label prior
    afl = {}
    for spec in sorted(set(partitions) | set(fedfac_partitions)):
        cl = _clients(Xtr, ytr, K, spec, seed)
        mix = client_label_mix(cl, C)
        row = {}
        for b in ("plain", "secagg", "ckks"):
            res = run_afl(cl, (Xte, yte), C, backend=b)
            row[b] = {"global_acc": res["global_acc"], "client_acc": res["client_acc"],
                      "client_acc_prior": float(np.mean(label_prior_accuracy(LinearHead(d, C), res["theta"],
                                                                             (Xte, yte), mix))),
                      "bytes": res["bytes_per_round"], "flood_sigma": res.get("flood_sigma"),
                      "ridge": res.get("ridge"), "margin_bits": res.get("flood_kl_log2")}
        afl[spec] = row
        log(f"AFL {spec:<16} {row['plain']['global_acc']:.4f} prior {row['plain']['client_acc_prior']:.4f} "
            f"ckks {row['ckks']['global_acc']:.4f}")
    # 2. bytes
    nbytes = measure_bytes(d, C, K, hidden)
    # 5. secure against plain, the chosen point of each method at the first non-IID partition
    verify = verify_methods(chosen, fac_final_jobs, (Xtr, ytr, Xte, yte, C), K=K, seed=seed, rounds=verify_rounds,
                            log=log)
    return {"grids": {m: {k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for m, g in grids.items()},
            "grid": grid, "finals": finals, "fac_grid": fac_grid, "fac_finals": fac_finals, "afl": afl,
            "bytes": {f"{k[0]}|{k[1]}": v for k, v in nbytes.items()}, "verify": verify,
            "meta": {"dataset": dataset, "data_seed": data_seed, "seed": seed, "K": K, "rounds": rounds,
                     "hidden": hidden, "fa_epochs": fa_epochs, "train": int(Xtr.shape[0]), "test": int(Xte.shape[0]),
                     "dim": int(d), "classes": int(C), "seconds": time.perf_counter() - t0}}


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
