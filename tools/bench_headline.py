"""The AFL paper's headline timing, CIFAR-100 shaped, end to end through the real service.

    python -m secure_afl_tools.bench_headline                        # 50,000 images, 100 classes, 100 hospitals
    python -m secure_afl_tools.bench_headline --images 5000 --input-size 32   # a CPU-sized run
    python -m secure_afl_tools.bench_headline --compare plain        # split and plain, both ratios

What runs, in order, each phase timed on its own:

* ``synthesis``   (not in the total) 32x32x3 uint8 images: a per-class smooth pattern plus
                  noise, so random-init features still carry the label; 100 classes;
                  a Dirichlet(alpha) split over the hospitals (``secure_afl.partition``);
* ``extraction``  resnet18 (torchvision, random init or ``--weights FILE``) without its
                  classifier over every image, through the hospitals' own extraction code
                  (:func:`secure_afl.clients.embed.extract`: cuda with channels_last and bf16
                  autocast when a GPU is there, float32 on CPU), rows scaled to norm 1;
* ``statistics``  every hospital's C_k, Q_k, counts in float64 from its rows;
* ``setup``       (not in the total) consortium PKI, server process start, key holder keys;
* ``protect_upload`` every hospital fetches the signed parameters, protects and uploads
                  over mTLS: the hospitals in ``--hospital-processes`` worker processes
                  started during setup (each hospital is its own machine in a deployment;
                  one interpreter's GIL would serialise their proving), each process
                  taking hospitals one after another; split: the key holder judges the
                  uploads as they arrive, as ``secure-afl keyholder judge`` does;
* ``release``     the key holder closes the round and releases (split: what was not judged
                  yet, then its share of the masks; the key holder solves on the server-signed masked sum), W;
* ``solve``       the solve alone, re-timed on the released statistics (it is inside
                  ``release`` too, so it is not added to the total again).

The total is extraction + statistics + protect_upload + release. With
``--compare plain`` the same features and statistics also go through a plain
session, and both runs are printed side by side with two ratios: end to end
(the totals, whose extraction and statistics are the same for both) and
protection only (protect_upload + release). The last line printed is one JSON
object with every figure (the compared run under ``compare``). Needs only the project's
dependencies and torch/torchvision (the ``embed`` extra); no download.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np

__all__ = ["run_headline", "synthetic_images", "main"]


def synthetic_images(n: int, classes: int, seed: int = 0):
    """(images (n, 32, 32, 3) uint8, labels (n,)): a smooth per-class pattern plus pixel noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n).astype(np.int64)
    # a coarse 8x8x3 pattern per class, upsampled to 32x32: low-frequency structure a conv net keeps
    protos = rng.uniform(40, 215, (classes, 8, 8, 3)).astype(np.float32)
    protos = protos.repeat(4, axis=1).repeat(4, axis=2)
    out = np.empty((n, 32, 32, 3), dtype=np.uint8)
    step = 4096
    for s in range(0, n, step):
        noise = rng.normal(0.0, 30.0, (min(step, n - s), 32, 32, 3)).astype(np.float32)
        out[s:s + step] = np.clip(protos[y[s:s + step]] + noise, 0, 255).astype(np.uint8)
    return out, y


def _extract(images, labels, classes, *, device, batch_size, input_size, weights, seed):
    from secure_afl.clients import embed as E
    from secure_afl.clients.backbones import PAPER_MEAN, PAPER_STD, Preprocessing

    prep = E.resolve_preprocessing("paper") if input_size == 224 else \
        Preprocessing(f"native{input_size}", input_size, input_size, PAPER_MEAN, PAPER_STD)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", E.RandomWeightsWarning)
        bb = E.load_backbone("resnet18", weights or "random", input_size=prep.crop, seed=seed)
    src = E.array_source(images, labels, classes)
    res = E.extract(src, bb, prep, device=device, batch_size=batch_size, workers=0, keep_embeddings=True,
                    n_classes=classes, dtype="float32", progress=False, l2_radius=1.0)
    return res


def _statistics(X, y, parts, classes):
    from secure_afl.stats import StatisticsAccumulator

    out = []
    for p in parts:
        acc = StatisticsAccumulator(X.shape[1], classes, max_norm=1.0)
        acc.update(X[p].astype(np.float64), y[p])
        out.append(acc.finalize(gamma=0.0))
    return out


def _warm(_):
    """A worker's first task, during setup: the imports a hospital's upload needs."""
    from secure_afl.clients.hospital import HospitalClient  # noqa: F401
    from secure_afl import split  # noqa: F401

    return os.getpid()


def _hospital(job: dict, name: str, stats) -> int:
    """One hospital in a worker process: fetch the parameters, protect, sign, upload; its bytes uploaded."""
    from secure_afl import pki
    from secure_afl.clients.hospital import HospitalClient

    c = HospitalClient(job["url"], job["session_id"], pki.load_party(job["pki_dir"], "hospital", name), timeout=600)
    try:
        c.submit(stats)
        return c.bytes_uploaded
    finally:
        c.close()


def run_headline(*, images: int = 50_000, test_images: int = 10_000, classes: int = 100, hospitals: int = 100,
                 alpha: float = 0.1, backend: str = "split", device: str = "auto", batch_size: int = 512,
                 input_size: int = 224, weights: str | None = None, upload_threads: int = 32,
                 hospital_processes: int | None = None, seed: int = 0, workdir: str | None = None,
                 compare: str | None = None, log=print) -> dict:
    """One headline run; with ``compare`` (a second backend, e.g. "plain") the same extracted features and
    statistics also go through a session of that backend, and ``out["compare"]`` holds its figures and both
    ratios: end to end (extraction and statistics included, identical for both) and protection only
    (protect_upload + release, the phases the backend changes)."""
    import torch

    phases = {}

    def timed(name, fn):
        t = time.perf_counter()
        out = fn()
        phases[name] = time.perf_counter() - t
        log(f"{name:<15} {phases[name]:9.2f} s")
        return out

    imgs, labels = timed("synthesis", lambda: synthetic_images(images + test_images, classes, seed))
    from secure_afl.partition import partition

    parts = [p for p in partition(labels[:images], hospitals, f"dirichlet:{alpha}", seed=seed) if p.size]
    ext = timed("extraction", lambda: _extract(imgs[:images], labels[:images], classes, device=device,
                                               batch_size=batch_size, input_size=input_size, weights=weights,
                                               seed=seed))
    X = ext.X
    test = _extract(imgs[images:], labels[images:], classes, device=device, batch_size=batch_size,
                    input_size=input_size, weights=weights, seed=seed) if test_images else None
    stats = timed("statistics", lambda: _statistics(X, labels[:images], parts, classes))
    shared = dict(phases)
    runs = {}
    for b in [backend] + ([compare] if compare else []):
        if compare:
            log(f"-- {b}")
        phases = dict(shared)
        sub = None if not workdir else str(Path(workdir) / b) if compare else workdir
        runs[b] = _service_run(b, stats, parts, X.shape[1], classes, phases, timed, upload_threads=upload_threads,
                               hospital_processes=hospital_processes, workdir=sub, log=log)
    cuda = torch.cuda.is_available() and device != "cpu"
    outs = {}
    for b, r in runs.items():
        acc = None
        if test is not None:
            acc = float(np.mean(np.argmax(test.X.astype(np.float64) @ r["W"], axis=1) == labels[images:]))
        outs[b] = {"benchmark": "headline", "backend": b, "images": images, "test_images": test_images,
                   "classes": classes, "hospitals": r["K"], "hospitals_requested": hospitals, "alpha": alpha,
                   "dim": X.shape[1], "input_size": input_size, "weights": weights or "random",
                   "device": ext.metadata.get("device"),
                   "device_name": torch.cuda.get_device_name(0) if cuda else f"cpu ({torch.get_num_threads()} threads)",
                   **{k: v for k, v in r.items() if k not in ("W", "K")}, "test_accuracy": acc,
                   "cpus": os.cpu_count()}
    out = outs[backend]
    if compare:
        other = outs[compare]
        out["compare"] = {"backend": compare, "total_s": other["total_s"], "protection_s": other["protection_s"],
                          "phases_s": other["phases_s"], "bytes_up_per_hospital": other["bytes_up_per_hospital"],
                          "test_accuracy": other["test_accuracy"],
                          "w_rel_error_vs_plain": other["w_rel_error_vs_plain"],
                          "ratio_end_to_end": out["total_s"] / other["total_s"],
                          "ratio_protection": out["protection_s"] / other["protection_s"]}
        log(format_comparison(out))
    return out


def format_comparison(out: dict) -> str:
    """The two runs side by side: every phase, the end-to-end total and the protection's own phases."""
    c = out["compare"]
    a, b = out["backend"], c["backend"]
    rows = [f"{'phase':<22} {a:>12} {b:>12} {'ratio':>8}"]
    for name in ("extraction", "statistics", "protect_upload", "release"):
        x, y = out["phases_s"][name], c["phases_s"][name]
        rows.append(f"{name:<22} {x:>11.2f}s {y:>11.2f}s {x / y if y > 0 else float('nan'):>7.2f}x")
    rows.append(f"{'end to end (total)':<22} {out['total_s']:>11.2f}s {c['total_s']:>11.2f}s "
                f"{c['ratio_end_to_end']:>7.2f}x")
    rows.append(f"{'protection only':<22} {out['protection_s']:>11.2f}s {c['protection_s']:>11.2f}s "
                f"{c['ratio_protection']:>7.2f}x  (protect_upload + release)")
    return "\n".join(rows)


def _service_run(backend, stats, parts, d, classes, phases, timed, *, upload_threads, hospital_processes,
                 workdir, log) -> dict:
    """One session of ``backend`` through the real service for the hospitals' ``stats``: setup (not timed in
    the total), protect_upload, release, the solve re-timed; the phases are added to ``phases``."""
    from secure_afl.analytic import solve_from_sums
    from .harness import (Judging, behind_the_parties, make_pki, secagg_quorum, server_section, start_server,
                          write_session)
    from secure_afl.backends.session_params import dp_session_params
    from secure_afl.keyholder import KeyHolder
    from secure_afl.packing import Layout
    from secure_afl.params import Bounds
    from secure_afl.server.config import load_config

    names = [f"h{i:03d}" for i in range(len(parts))]
    K = len(parts)
    n_max = int(max(p.size for p in parts))
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="secure-afl-headline-"))
    work.mkdir(parents=True, exist_ok=True)
    pki_dir = work / "pki"
    server = None
    t_setup = time.perf_counter()
    make_pki(pki_dir, names, name="secure-afl headline consortium", roster=True)
    session_id = f"headline-{backend}-{K}"
    cfg = {"session": {"id": session_id, "backend": backend, "dim": d, "classes": classes, "gamma": 1.0,
                       "min_clients": K, "min_class_count": 1, "deadline_s": 86400, "hospitals": names},
           "bounds": {"max_norm": 1.0, "n_max": n_max, "k_max": K},
           "server": server_section(work, pki_dir)}
    if backend == "secagg":
        cfg["secagg"] = {"stage_timeout_s": 600.0}
        cfg["session"]["min_clients"] = secagg_quorum(K)
    write_session(work / "session.toml", pki_dir, cfg)
    url = f"https://127.0.0.1:{cfg['server']['port']}"
    kh = KeyHolder(pki_dir, "keyholder", work / "keyholder", passphrase=os.urandom(16).hex().encode())
    try:
        server = start_server(work / "session.toml", work / "server.log", url, kh.party)
        conn = kh.connect(url, session_id)
        if backend in ("ckks", "bfv", "split"):
            params0 = dp_session_params(load_config(work / "session.toml").dp, backend, session_id,
                                        Layout(d, classes), 1.0, Bounds(1.0, n_max, K))
            kh.keygen(params0)
            kh.publish(conn)
        n_proc = 1 if backend == "secagg" else max(1, min(K, hospital_processes or os.cpu_count() or 1))
        if n_proc > 1:  # started (and their imports done) before the timed phase, as the hospitals' machines are
            procs = ProcessPoolExecutor(max_workers=n_proc, mp_context=mp.get_context("spawn"),
                                        initializer=behind_the_parties)
            list(procs.map(_warm, range(n_proc)))
        phases["setup"] = time.perf_counter() - t_setup
        log(f"{'setup':<15} {phases['setup']:9.2f} s  (PKI for {K} hospitals, server start, keys, "
            f"{n_proc} hospital process(es); not in the total)")
        uploaded = {}
        job = {"url": url, "session_id": session_id, "pki_dir": str(pki_dir)}

        def one(i):
            uploaded[names[i]] = _hospital(job, names[i], stats[i])

        def upload_all():
            if n_proc > 1:
                uploaded.update(zip(names, procs.map(_hospital, [job] * K, names, stats)))
                return
            # secagg's stages wait for every hospital: all of them in flight at once, as threads
            width = K if backend == "secagg" else min(K, upload_threads)
            with ThreadPoolExecutor(max_workers=width) as pool:
                list(pool.map(one, range(K)))

        try:
            with Judging(kh, url, session_id, enabled=backend == "split", interval_s=0.2) as judging:
                timed("protect_upload", upload_all)
        finally:
            if n_proc > 1:
                procs.shutdown()
        res = timed("release", lambda: kh.finalize(conn, min_clients=cfg["session"]["min_clients"]))
        if backend == "split":
            log(f"{'':<15} {judging.uploads} of {K} uploads judged while the session was open")
        conn.close()
    finally:
        if server is not None:
            server.stop()
        if not workdir:  # keys, uploads and PKI of a throw-away consortium
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    t = time.perf_counter()
    W_again = solve_from_sums(res.stats)
    phases["solve"] = time.perf_counter() - t
    log(f"{'solve':<15} {phases['solve']:9.2f} s  (inside release; re-timed alone)")
    total = sum(phases[k] for k in ("extraction", "statistics", "protect_upload", "release"))
    plain = stats[0]
    for s in stats[1:]:
        plain = plain + s
    from secure_afl.stats import SufficientStatistics

    plain = SufficientStatistics(plain.gram + K * np.eye(d), plain.cross, plain.n, plain.class_counts, 1.0,
                                 float(K), None)
    W_plain = solve_from_sums(plain)
    w_err = float(np.linalg.norm(res.W - W_plain) / max(np.linalg.norm(W_plain), 1e-300))
    return {"W": res.W, "K": K, "phases_s": {k: round(v, 4) for k, v in phases.items()},
            "total_s": round(total, 4), "protection_s": round(phases["protect_upload"] + phases["release"], 4),
            "bytes_up_per_hospital": float(np.mean(list(uploaded.values()))) if uploaded else None,
            "w_rel_error_vs_plain": w_err, "w_solve_repeat_diff": float(np.max(np.abs(W_again - res.W))),
            "n_max": n_max, "hospital_processes": n_proc,
            "judged_while_open": judging.uploads if backend == "split" else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m secure_afl_tools.bench_headline", description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=50_000)
    p.add_argument("--test-images", type=int, default=10_000, help="held-out images for the accuracy (not timed "
                                                                    "in the total)")
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--hospitals", type=int, default=100)
    p.add_argument("--alpha", type=float, default=0.1, help="Dirichlet concentration of the label split")
    p.add_argument("--backend", choices=["split", "secagg", "plain", "ckks", "bfv"], default="split")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--input-size", type=int, default=224, help="224: the paper's Resize(224); 32: native size")
    p.add_argument("--weights", help="a local resnet18 state-dict file (default: random init)")
    p.add_argument("--upload-threads", type=int, default=32, help="hospitals in flight at once when they run "
                                                                  "as threads (--hospital-processes 1, secagg)")
    p.add_argument("--hospital-processes", type=int, help="worker processes running the hospitals (default: "
                                                          "the cores; 1: threads in this process)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir")
    p.add_argument("--compare", choices=["plain", "split", "secagg", "ckks", "bfv"],
                   help="also run this backend on the same features and statistics and print both runs side by "
                        "side: the end-to-end ratio and the protection-only ratio (protect_upload + release)")
    args = p.parse_args(argv)
    if args.compare == args.backend:
        p.error("--compare names the backend already run")
    from threadpoolctl import threadpool_limits  # noqa: F401  (a project dependency; keeps BLAS defaults)

    res = run_headline(images=args.images, test_images=args.test_images, classes=args.classes,
                       hospitals=args.hospitals, alpha=args.alpha, backend=args.backend, device=args.device,
                       batch_size=args.batch_size, input_size=args.input_size, weights=args.weights,
                       upload_threads=args.upload_threads, hospital_processes=args.hospital_processes,
                       seed=args.seed, workdir=args.workdir, compare=args.compare,
                       log=lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
