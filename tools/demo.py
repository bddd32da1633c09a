"""``secure-afl demo``: the whole protocol on 127.0.0.1, then the release checked against plaintext.

Stages (each timed and printed):

0. data      embedded dataset (scikit-learn digits or breast cancer) through a
             fixed random-feature map, or your own *.npz files with --data;
1. pki       consortium CA, server, key holder and K hospital certificates;
2. server    a real ``secure-afl server run`` process (uvicorn, mTLS);
3. keys      (ckks, bfv) the key holder's fresh keys, public context published;
4. hospitals K hospital clients compute, protect, sign and upload;
5. release   the key holder verifies the manifest, reveals only the aggregate,
             sanity-checks it, restores RI and solves W;
6. verify    W_secure vs the plaintext sum and the centralised X^+ Y, on the
             same data. One verdict (:mod:`secure_afl.certify`): "within
             certified bound" (the gap to the plaintext solve of the same
             system, ridge included, is within both pipelines' certified
             bounds), "no bound (C singular at this noise)" (no certificate
             exists; the statistics are still within their per-entry
             bound), or "exceeds bound" (a bug: exit code 1). The audit
             log and every receipt are verified.

The random-feature map (random Fourier features of the standardised pixels,
fixed seed) stands in for a pretrained backbone, which cannot be downloaded
here; ``client embed`` is the real backbone path.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import operator
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from secure_afl import pki
from secure_afl.audit_verify import load_receipts
from secure_afl.audit_verify import verify_log
from secure_afl.certify import EXCEEDS, NO_BOUND, WITHIN, certify_release, session_w_target
from secure_afl.certify import entry_error_bounds
from secure_afl.certify import verdict_text
from secure_afl.exceptions import InvalidParameterError
from secure_afl.packing import Layout
from secure_afl.params import Bounds, SessionParams
from secure_afl.params import KEYED_BACKENDS
from secure_afl.partition import partition
from secure_afl.secagg import default_threshold, max_min_clients, recommended_neighbours
from secure_afl.server.config import load_config
from secure_afl.stats import StatisticsAccumulator

from .harness import make_pki, server_section, start_server, write_session

__all__ = ["run_demo", "register", "load_embedded", "random_features"]

FEATURE_DIM = 256


def random_features(X: np.ndarray, dim: int = FEATURE_DIM, seed: int = 1234) -> np.ndarray:
    """Random Fourier features sqrt(2/D) cos(Z R + b) of standardised inputs.

    Every row has ||phi(x)||_2 <= sqrt(2), a bound that holds by construction,
    so the session's declared norm bound B = sqrt(2) is exact, not estimated.
    """
    rng = np.random.default_rng(seed)
    Z = (X - X.mean(axis=0)) / (X.std(axis=0) + 1e-9)
    bandwidth = np.sqrt(Z.shape[1])
    R = rng.standard_normal((Z.shape[1], dim)) / bandwidth
    b = rng.uniform(0, 2 * np.pi, dim)
    return np.sqrt(2.0 / dim) * np.cos(Z @ R + b)


def load_embedded(name: str, seed: int):
    from sklearn.datasets import load_breast_cancer, load_digits
    from sklearn.model_selection import train_test_split

    loader = {"digits": load_digits, "breast-cancer": load_breast_cancer}[name]
    ds = loader()
    F = random_features(ds.data.astype(np.float64))
    Xtr, Xte, ytr, yte = train_test_split(F, ds.target, test_size=0.25, random_state=seed, stratify=ds.target)
    return Xtr, ytr.astype(np.int64), Xte, yte.astype(np.int64), int(ds.target.max() + 1)


def _hospital_data(args, seed):
    """[(name, X, y)], (X_test, y_test), n_classes, description."""

    if args.data:
        files = sorted(p for p in Path(args.data).glob("*.npz") if p.name != "test.npz")
        if not files:
            raise SystemExit(f"--data {args.data}: no hospital *.npz files")
        hospitals, classes = [], 0
        for p in files:
            with np.load(p, allow_pickle=False) as z:
                X, y = np.asarray(z["X"], dtype=np.float64), np.asarray(z["y"]).astype(np.int64)
            hospitals.append((p.stem, X, y))
            classes = max(classes, int(y.max()) + 1)
        test = None
        if (Path(args.data) / "test.npz").exists():
            with np.load(Path(args.data) / "test.npz", allow_pickle=False) as z:
                test = (np.asarray(z["X"], dtype=np.float64), np.asarray(z["y"]).astype(np.int64))
                classes = max(classes, int(test[1].max()) + 1)
        return hospitals, test, classes, f"{len(files)} hospital files from {args.data}"
    Xtr, ytr, Xte, yte, classes = load_embedded(args.dataset, seed)
    parts = partition(ytr, args.hospitals, args.partition, seed=seed)
    hospitals = [(f"hospital-{i + 1:02d}", Xtr[p], ytr[p]) for i, p in enumerate(parts) if len(p)]
    skipped = sum(1 for p in parts if not len(p))
    desc = (f"scikit-learn {args.dataset}: {len(ytr)} train / {len(yte)} test, {classes} classes; features: fixed "
            f"random Fourier map to {FEATURE_DIM} dims (stand-in for a pretrained backbone, which cannot be "
            f"downloaded here); partition {args.partition}")
    if skipped:
        desc += f"; {skipped} hospital(s) received no sample and do not take part"
    return hospitals, (Xte, yte), classes, desc


def run_demo(args, verbose: bool = True) -> dict:
    from secure_afl.analytic import centralised_weights, predict, solve_from_sums, top1_accuracy
    from secure_afl.clients.hospital import HospitalClient
    from secure_afl.keyholder import KeyHolder, write_model
    from secure_afl.model_file import model_metadata

    say = print if verbose else (lambda *a, **k: None)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    seed = args.seed
    hospitals, test, n_classes, desc = _hospital_data(args, seed)
    dim = hospitals[0][1].shape[1]
    K = len(hospitals)
    say(f"[Stage 0] data: {desc}")
    timings["data"] = time.perf_counter() - t

    # absolute: session.toml's relative paths are read relative to session.toml's own directory
    work = Path(args.workdir).resolve() if args.workdir else Path(tempfile.mkdtemp(prefix="secure-afl-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    pki_dir = work / "pki"
    t = time.perf_counter()
    make_pki(pki_dir, [name for name, *_ in hospitals], name="secure-afl demo consortium")
    timings["pki"] = time.perf_counter() - t
    say(f"[Stage 1] pki: CA + server + key holder + {K} hospital identities in {pki_dir}")

    max_norm = float(np.sqrt(2.0)) if not args.data else float(
        np.ceil(max(np.linalg.norm(X, axis=1).max() for _, X, _ in hospitals)))
    n_max = int(max(len(y) for *_, y in hospitals))
    server_cfg = server_section(work, pki_dir)
    port = server_cfg["port"]
    session_id = f"demo-{args.backend}-{seed}"
    cfg = {
        "session": {"id": session_id, "backend": args.backend, "dim": dim, "classes": n_classes, "gamma": 1.0,
                    "min_clients": min(K, max(2, args.min_clients or K)), "deadline_s": 3600,
                    "hospitals": [h[0] for h in hospitals]},
        "bounds": {"max_norm": max_norm, "n_max": n_max, "k_max": max(K, 2)},
        "server": server_cfg,
    }
    if args.backend == "secagg":  # a [secagg] section in another backend's session is refused
        cfg["secagg"] = {"stage_timeout_s": 30.0}
        # the threshold follows each hospital's share holders (the server's default); the consistency
        # quorum then caps how many hospitals a release may require

        k = recommended_neighbours(max(K, 2))
        t = default_threshold((K - 1 if k is None else k) + 1)
        cfg["session"]["min_clients"] = min(cfg["session"]["min_clients"], max_min_clients(K, t))
    if args.backend == "ckks" and getattr(args, "ckks_flooding", None):
        cfg["ckks"] = {"flooding": args.ckks_flooding}
    if args.dp is not None:
        # any min_clients hospitals' shares add up to the full noise
        cfg["dp"] = {"epsilon": float(args.dp), "delta": 1e-5, "min_contributors": cfg["session"]["min_clients"]}
    write_session(work / "session.toml", pki_dir, cfg)  # the operator's signature every party pins
    url = f"https://127.0.0.1:{port}"
    kh = KeyHolder(pki_dir, "keyholder", work / "keyholder", passphrase=os.urandom(16).hex().encode())
    t = time.perf_counter()
    server = start_server(work / "session.toml", work / "server.log", url, kh.party, timeout=60)
    try:
        timings["server_start"] = time.perf_counter() - t
        say(f"[Stage 2] server: {url} (pid {server.proc.pid}, mTLS on), session {session_id}")

        conn = kh.connect(url, session_id)
        if args.backend in KEYED_BACKENDS:
            t = time.perf_counter()
            # the one derivation `secure-afl keyholder keygen` makes, signed sections ([dp], [ckks]) included
            params0 = load_config(work / "session.toml").definition.session_params()
            kh.keygen(params0)
            kh.publish(conn)
            timings["keys"] = time.perf_counter() - t
            what = "HPKE (ML-KEM-768 + X25519) seed key" if args.backend == "split" else f"{args.backend.upper()} context"
            say(f"[Stage 3] keys: fresh {what}; public part published, secret stays with the key holder")

        # Stage 4: hospitals (real HTTPS clients, concurrently)
        t = time.perf_counter()
        receipts_dir = work / "receipts"
        results, errors = {}, {}

        def run_hospital(name, X, y):
            client = HospitalClient(url, session_id, pki.load_party(pki_dir, "hospital", name),
                                    receipts_dir=receipts_dir)
            try:
                acc = StatisticsAccumulator(dim, n_classes, max_norm=max_norm)
                for s in range(0, len(y), 512):
                    acc.update(X[s:s + 512], y[s:s + 512])
                client.submit(acc.finalize(gamma=0.0))
                results[name] = client.bytes_uploaded
            except Exception as e:  # reported below; the demo fails verification
                errors[name] = f"{type(e).__name__}: {e}"
            finally:
                client.close()

        threads = [threading.Thread(target=run_hospital, args=h, daemon=True) for h in hospitals]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=600)
        timings["hospitals"] = time.perf_counter() - t
        if errors:
            raise RuntimeError(f"hospital failures: {errors}")
        per = np.array(list(results.values()))
        say(f"[Stage 4] hospitals: {K} uploads accepted, {per.mean() / 1e6:.2f} MB each")

        t = time.perf_counter()
        res = kh.finalize(conn, min_clients=cfg["session"]["min_clients"])
        conn.close()
        timings["release"] = time.perf_counter() - t
        say(f"[Stage 5] release: manifest of {res.report['contributors']} verified; aggregate revealed, "
              f"sanity checks passed; " + ("DP solve (PSD repair, calibrated ridge, no RI restoration)"
                                           if res.report.get("dp") else "RI restored") + f" and W {res.W.shape} solved")
    finally:
        server.stop()

    # Stage 6: verification on the same data
    t = time.perf_counter()
    lay = Layout(dim, n_classes)
    parts = []
    for _, X, y in hospitals:
        acc = StatisticsAccumulator(dim, n_classes)
        acc.update(X, y)
        parts.append(acc.finalize(gamma=1.0))
    plain_sum = functools.reduce(operator.add, parts)
    W_plain = solve_from_sums(plain_sum)
    # the plaintext pipeline's own variation: the same hospitals summed in the reverse order
    W_plain_rev = solve_from_sums(functools.reduce(operator.add, parts[::-1]))
    order_var = float(np.linalg.norm(W_plain_rev - W_plain) / np.linalg.norm(W_plain))
    secure_bound = res.report["w_error_bound"]
    plain_bound = certify_release(dataclasses.replace(res.params, backend="plain", backend_params={}),
                                  plain_sum, W_plain, K)
    X_all = np.concatenate([h[1] for h in hospitals])
    y_all = np.concatenate([h[2] for h in hospitals])
    W_joint = centralised_weights(X_all, y_all, n_classes)
    W = res.W
    # the tag slots hold the hospitals' random check values (checked by the key holder), not statistics
    released, plain_packed = lay.pack(dataclasses.replace(res.stats, tag=None)), lay.pack(plain_sum)
    diff = np.abs(released - plain_packed)
    stats_err = float(np.max(diff))
    # the same error in units in the last place of the entry's scale (the sum of the hospitals' magnitudes,
    # what a float64 sum of them rounds at): what "exact" means for float64 sums, 0 or 1 where the plaintext's
    # own additions rounded differently; an entry that cancels to near zero has no smaller ulp than its terms
    scale = functools.reduce(np.add, (np.abs(lay.pack(p)) for p in parts))
    stats_ulps = float(np.max(np.where(diff == 0, 0.0, diff / np.spacing(scale))))
    rel_plain = float(np.linalg.norm(W - W_plain) / np.linalg.norm(W_plain))
    rel_joint = float(np.linalg.norm(W - W_joint) / np.linalg.norm(W_joint))
    Xe, ye = test if test is not None else (X_all, y_all)
    agreement = float(np.mean(predict(W, Xe) == predict(W_plain, Xe)))
    acc_secure, acc_plain = top1_accuracy(W, Xe, ye), top1_accuracy(W_plain, Xe, ye)
    target = session_w_target(res.params)
    privacy = res.report.get("dp")
    head = json.loads((work / "server" / session_id / "audit-head.json").read_text())
    audit = verify_log(work / "server" / session_id / "audit.jsonl",
                       server_pub=pki.load_party(pki_dir, "server", "aggregator").identity_pub(),
                       head=head, countersign=head["countersign"],
                       keyholder_pub=pki.load_party(pki_dir, "keyholder", "keyholder").identity_pub(),
                       receipts=_receipts(receipts_dir))
    noise_bound = allowed = None
    lam_total = float(res.report.get("lambda_total") or 0.0)
    # the same system on the plaintext side: the certificate bounds the distance to (C + lam I)^-1 Q
    # of the exact sums, so the plaintext reference solves with the same lam
    W_ref = W_plain if lam_total == 0 else solve_from_sums(plain_sum, lam=lam_total)
    ref_bound = plain_bound if lam_total == 0 else certify_release(
        dataclasses.replace(res.params, backend="plain", backend_params={}), plain_sum, W_ref, K, lam=lam_total)
    rel_ref = float(np.linalg.norm(W - W_ref) / np.linalg.norm(W_ref))
    ridge_bias = float(np.linalg.norm(W_ref - W_plain) / np.linalg.norm(W_plain)) if lam_total else 0.0
    stats_ok = True
    if privacy is not None:
        # the noise is the point: pass when the release is accounted within the declared epsilon and the
        # statistics are off by no more than the noise bound the key holder checks
        from secure_afl.dp.mechanism import TAIL

        noise_bound = TAIL * privacy["solve"]["noise_std"]
        passed = bool(privacy["epsilon"] <= float(args.dp) and stats_err <= noise_bound)
        verdict = WITHIN if passed else EXCEEDS
    else:
        # every statistic within the key holder's per-entry bound (exact backends: their rounding bound,
        # never a fixed target), and W within the sum of both pipelines' certified bounds when C has one
        stats_ok = stats_err <= res.report["error_bound_per_entry"] + plain_entry_bound(plain_sum, K)
        if secure_bound["applies"] and ref_bound.applies:
            allowed = (secure_bound["abs_bound"] + ref_bound.abs_bound) / float(np.linalg.norm(W_ref))
            verdict = WITHIN if stats_ok and rel_ref <= allowed else EXCEEDS
        else:
            verdict = NO_BOUND if stats_ok else EXCEEDS
        passed = verdict != EXCEEDS
    timings["verify"] = time.perf_counter() - t
    report = {
        "backend": args.backend,
        "hospitals": K,
        "samples": int(len(y_all)),
        "dim": dim,
        "classes": n_classes,
        "verification": {
            "stats_max_abs_error": stats_err,
            "stats_max_ulps": stats_ulps,
            "weights_rel_error_vs_plaintext": rel_plain,
            "weights_rel_error_vs_joint": rel_joint,
            "prediction_agreement": agreement,
            "target_rel_error": target,
            "plaintext_order_variation": order_var,
            "certified_bound_secure": secure_bound,
            "certified_bound_plaintext": plain_bound.to_dict(),
            "allowed_rel_error": allowed,
            "weights_rel_error_vs_same_system": rel_ref,
            "ridge_bias_rel": ridge_bias,
            "statistics_within_bound": bool(stats_ok),
            "dp_noise_bound": noise_bound,
            "verdict": verdict,
            "passed": passed,
        },
        "accuracy": {"secure": acc_secure, "plaintext": acc_plain},
        "flooding": {k: res.report.get(k) for k in ("flood_sigma", "flood_security", "flood_ridge",
                                                    "error_bound_per_entry")},
        "dp": privacy,
        "bytes_uploaded": int(sum(results.values())),
        "bytes_per_hospital": float(np.mean(list(results.values()))),
        "timings_s": timings,
        "audit": {"records": audit.n_records, "accepted": audit.n_accepted, "refused": audit.n_refused,
                  "receipts_verified": audit.n_receipts},
        "session_id": session_id,
        "workdir": str(work),
    }
    say(f"[Stage 6] verify: audit log OK ({audit.n_records} records, {audit.n_receipts} receipts verified)")
    if verbose:
        _print_report(report)
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=2))
    if args.model_out:
        write_model(args.model_out, W, model_metadata(res.params, res.report, 0.0))
    if not args.workdir and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return report


def plain_entry_bound(stats, K: int) -> float:
    """Per-entry bound of the plaintext reference sums (float64 summation in some order)."""
    from secure_afl.packing import Layout

    p = SessionParams("reference", "plain", Layout(stats.dim, stats.cross.shape[1]), stats.gamma, Bounds(1.0, 1, 1))
    eps_C, eps_Q = entry_error_bounds(p, K, stats)
    return max(eps_C, eps_Q, float(np.finfo(np.float64).eps) * K * float(max(abs(stats.n), 1.0)))


def _receipts(directory: Path) -> list[dict]:

    return load_receipts(directory) if directory.exists() else []


def _print_report(r: dict) -> None:
    v = r["verification"]
    rows = [
        ("backend", r["backend"]),
        ("hospitals / samples", f"{r['hospitals']} / {r['samples']}"),
        ("dim x classes", f"{r['dim']} x {r['classes']}"),
        ("bytes per hospital", f"{r['bytes_per_hospital'] / 1e6:.3f} MB"),
        ("stats max |secure - plaintext|", f"{v['stats_max_abs_error']:.3e}"),
        ("||W_secure - W_plain|| / ||W_plain||", f"{v['weights_rel_error_vs_plaintext']:.3e}" + (
            f" (ridge {r['flooding']['flood_ridge']:.2e}: its bias alone {v['ridge_bias_rel']:.2e})"
            if v["ridge_bias_rel"] else "")),
        ("flooding", f"sigma {r['flooding']['flood_sigma']:.2e} per entry, {r['flooding']['flood_security']}"
         if r["flooding"].get("flood_sigma")
         else "none (exact decryption)"),
        ("W error vs the same system / certified", f"{v['weights_rel_error_vs_same_system']:.3e} / "
         + (f"{v['allowed_rel_error']:.3e} (secure + plaintext bounds)" if v["allowed_rel_error"] is not None
            else "n/a")),
        ("certified bound: secure / plaintext", _fmt_bound(v["certified_bound_secure"]) + " / "
                                                + _fmt_bound(v["certified_bound_plaintext"])),
        ("plaintext order variation", f"{v['plaintext_order_variation']:.3e}"),
        ("cond(C)", f"{v['certified_bound_secure']['condition_number'] or float('inf'):.3g}"),
        ("||W_secure - X^+Y|| / ||X^+Y||", f"{v['weights_rel_error_vs_joint']:.3e}"),
        ("top-1 prediction agreement", f"{v['prediction_agreement']:.4f}"),
        ("accuracy secure / plaintext", f"{r['accuracy']['secure']:.4f} / {r['accuracy']['plaintext']:.4f}"),
        ("time per phase (s)", ", ".join(f"{k} {x:.2f}" for k, x in r["timings_s"].items())),
    ]
    if r.get("dp"):
        p = r["dp"]
        rows[4] = ("stats max |secure - plaintext|", f"{v['stats_max_abs_error']:.3e} (DP noise, bound "
                                                     f"{v['dp_noise_bound']:.3e})")
        rows[5] = ("||W_secure - W_plain|| / ||W_plain||", f"{v['weights_rel_error_vs_plaintext']:.3e} (DP)")
        rows.insert(5, ("DP epsilon (delta) this release / composed",
                        f"{p['epsilon']:.3f} ({p['delta']:g}) / {p['epsilon_composed']:.3f}; {p['mechanism']}, "
                        f"sigma {p['sigma']:.3g}, ridge {p['solve']['calibrated_ridge']:.3g}"))
    width = max(len(a) for a, _ in rows)
    print("\nVerification: " + ("noisy release within the DP noise bound, accounted" if r.get("dp") else
                                 "flooded release against plaintext" if r["flooding"].get("flood_sigma") else
                                 "release against plaintext"))
    print("-" * (width + 40))
    for a, b in rows:
        print(f"{a:<{width}}  {b}")
    print("-" * (width + 40))

    for b in (v["certified_bound_secure"], v["certified_bound_plaintext"]):
        if b["warning"] and b["applies"]:
            print(f"note: {b['warning']}")
    if not v.get("statistics_within_bound", True):
        print("the revealed statistics are NOT within their per-entry bound")
    print(f"W: {verdict_text(v['verdict'], r['backend'])}" + (
        f" (W* = {v['certified_bound_secure']['solution']})" if v["verdict"] == "within certified bound" else ""))


def _fmt_bound(b: dict) -> str:
    return f"{b['rel_bound']:.3e}" if b["applies"] else "n/a"



#: every backend, the recommended one first: split is exact and needs no homomorphic key holder
ALL_BACKENDS = ("split", "secagg", "bfv", "plain", "ckks")
_EXACT = {"plain": "exact (no protection)", "split": "exact", "secagg": "exact", "bfv": "exact",
          "ckks": "approximate (flooded)"}


def _quiet_waits(run):
    """The demo runs every hospital in this process and prints its own stages: the hospitals' per-stage wait
    lines (meant for one hospital's terminal) would bury them."""
    import logging

    @functools.wraps(run)
    def quiet(*a, **kw):
        waits = logging.getLogger("secure_afl.client.wait")
        before = waits.level
        waits.setLevel(logging.ERROR)
        try:
            return run(*a, **kw)
        finally:
            waits.setLevel(before)

    return quiet


run_demo = _quiet_waits(run_demo)


def run_all(args) -> list[dict]:
    """The recommended backend with every stage printed, then each other backend on the same data, and one
    table of all of them side by side."""
    reports = []
    for i, backend in enumerate(ALL_BACKENDS):
        one = argparse.Namespace(**{**vars(args), "backend": backend, "report": None, "model_out": None,
                                    "workdir": str(Path(args.workdir) / backend) if args.workdir else None})
        if i == 1:
            print("\nThe same hospitals and data through every other backend:")
        if i:
            print(f"  {backend} ...", flush=True)
        reports.append(run_demo(one, verbose=(i == 0)))
    print_comparison(reports)
    return reports


def comparison_rows(reports: list[dict]) -> list[tuple[str, ...]]:
    """One row per backend: what it guarantees, W against the plaintext solve, its certified bound, the bytes
    one hospital uploads, the whole session's time, and the verdict."""
    rows = [("backend", "result", "stats vs plaintext", "W error vs plaintext", "plaintext order var.",
             "certified bound", "bytes / hospital", "session (s)", "accuracy", "verdict")]
    for r in reports:
        v = r["verification"]
        b = v["certified_bound_secure"]
        noisy = bool(r["flooding"].get("flood_sigma") or r.get("dp"))
        bound = f"{b['rel_bound']:.1e}" if b["applies"] else ("none (noise added)" if noisy else "none (C singular)")
        rows.append((r["backend"], _EXACT.get(r["backend"], ""), _stats_error(v),
                     f"{v['weights_rel_error_vs_plaintext']:.1e}", f"{v['plaintext_order_variation']:.1e}", bound,
                     f"{r['bytes_per_hospital'] / 1e6:.2f} MB", f"{_session_seconds(r):.1f}",
                     f"{r['accuracy']['secure']:.4f}", v["verdict"]))
    return rows


def _stats_error(v: dict) -> str:
    """The released statistics against the plaintext sums: in ulps where they are that close (an exact
    backend: at most what K float64 additions round off), else the largest absolute difference (noise added)."""
    ulps = v.get("stats_max_ulps")
    if ulps is not None and ulps < 16:
        return f"{ulps:.0f} ulp"
    return f"{v['stats_max_abs_error']:.1e} abs"


def _session_seconds(r: dict) -> float:
    """Server start to the released W: what the parties wait for (not the demo's data or its checks)."""
    return sum(v for k, v in r["timings_s"].items() if k not in ("data", "verify"))


def print_comparison(reports: list[dict]) -> None:
    rows = comparison_rows(reports)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    r0 = reports[0]
    print(f"\nEvery backend on the same {r0['hospitals']} hospitals ({r0['samples']} samples, d = {r0['dim']}, "
          f"{r0['classes']} classes); plaintext accuracy {r0['accuracy']['plaintext']:.4f}")
    for k, row in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if k == 0:
            print("  ".join("-" * w for w in widths))
    print("stats vs plaintext: the released C and Q against the plaintext sums of the same data, largest entry "
          "error\nin units in the last place of the entry's scale (exact: a few ulp, no more than the plaintext's own "
          "float64 additions round off) or absolute;"
          "\nW error vs plaintext: ||W - W_plain|| / ||W_plain||, W_plain solved from those plaintext sums; "
          "plaintext order var.:\nthe same for W_plain summed in the reverse order (the plaintext pipeline's own "
          "variation);\ncertified bound: the key holder's proved bound on the W error (none: it has no bound); "
          "session: server start to the released W.")


def _cmd_demo(args) -> int:
    if args.all:
        if args.report or args.model_out:
            raise InvalidParameterError("--report and --model-out name one backend's files: use them with "
                                        "--backend, not --all", reason="invalid_arguments")
        reports = run_all(args)
        return 0 if all(r["verification"]["passed"] for r in reports) else 1
    report = run_demo(args)
    return 0 if report["verification"]["passed"] else 1


def register(parser) -> None:
    parser.add_argument("--backend", choices=["plain", "ckks", "bfv", "secagg", "split"], default="split",
                        help="the backend to run (default split, the recommended one)")
    parser.add_argument("--all", action="store_true", help="split with every stage printed, then every other "
                        "backend on the same data, and all of them side by side (what `make demo` runs)")
    parser.add_argument("--hospitals", type=int, default=5, help="K hospitals (embedded data)")
    parser.add_argument("--partition", default="dirichlet:0.5", help="iid | dirichlet:A | shards:S")
    parser.add_argument("--dataset", choices=["digits", "breast-cancer"], default="digits")
    parser.add_argument("--data", help="directory of hospital *.npz files (X, y); test.npz is the evaluation set")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-clients", type=int, help="release threshold (default: all hospitals)")
    parser.add_argument("--dp", type=float, metavar="EPS", help="distributed differential privacy at epsilon EPS "
                        "(delta 1e-5): hospitals add noise shares, the key holder accounts and solves with a ridge")
    parser.add_argument("--ckks-flooding", choices=["heuristic", "proved"],
                        help="ckks: sign [ckks] flooding (default: no section, the heuristic sizing)")
    parser.add_argument("--report", help="write the report JSON here")
    parser.add_argument("--model-out", help="write the model (safetensors) here")
    parser.add_argument("--workdir", help="keep PKI, server state and logs here (default: a temp dir, removed)")
    parser.add_argument("--keep", action="store_true", help="keep the temp work dir")
    parser.set_defaults(func=_cmd_demo)
