"""``secure-afl bench combine``: the server's running sum (:class:`~secure_afl.parallel.ParallelCombiner`) with 1
and W summing processes, on the machine it runs on.

Uploads are real ckks (or bfv) contributions of the session's layout, encrypted once (``--distinct`` of them,
reused in turn: adding costs the same whatever the values) and added from ``--threads`` request threads, as the
server's request handlers add them. Prints the seconds per upload for each worker count and checks that every
count gives the same aggregate ciphertext, bit for bit.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from secure_afl.backends import get_backend
from secure_afl.packing import Layout
from secure_afl.parallel import ParallelCombiner
from secure_afl.params import Bounds

__all__ = ["run_combine_bench", "register"]


def run_combine_bench(backend: str = "ckks", *, dim: int = 512, classes: int = 100, uploads: int = 100,
                      k_max: int = 1000, workers=(1, 2), threads: int = 4, distinct: int = 4,
                      seed: int = 0) -> dict:
    from secure_afl.backends.bfv import new_bfv_session
    from secure_afl.backends.ckks import new_ckks_session

    make = new_ckks_session if backend == "ckks" else new_bfv_session
    params, keys = make(f"bench-combine-{backend}", Layout(dim, classes), 1.0, Bounds(1.0, 32, k_max))
    be = get_backend(params)
    rng = np.random.default_rng(seed)
    h = params.bounds.hospital_bound(params.gamma)
    pool = [be.protect(rng.uniform(-h, h, params.layout.length) * 1e-3, public_context=keys.public_context)
            for _ in range(max(1, distinct))]
    payloads = [pool[i % len(pool)] for i in range(uploads)]
    seconds, sums = {}, set()
    for w in workers:
        comb = ParallelCombiner(params, public_context=keys.public_context, workers=w)
        comb.add(payloads[0])  # the workers are started and warm before the clock
        t = time.perf_counter()
        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(comb.add, payloads[1:]))
        seconds[w] = time.perf_counter() - t
        sums.add(comb.aggregate())
    return {"backend": backend, "dim": dim, "classes": classes, "uploads": uploads, "k_max": k_max,
            "upload_bytes": len(pool[0]), "threads": threads, "cpus": os.cpu_count(),
            "seconds_by_workers": seconds, "same_aggregate": len(sums) == 1}


def format_report(r: dict) -> str:
    lines = [f"bench combine: {r['backend']}, d = {r['dim']}, C = {r['classes']}, k_max = {r['k_max']}, "
             f"{r['upload_bytes'] / 1e6:.2f} MB per upload, {r['uploads'] - 1} uploads from {r['threads']} threads, "
             f"{r['cpus']} CPUs"]
    base = r["seconds_by_workers"][min(r["seconds_by_workers"])]
    for w, sec in sorted(r["seconds_by_workers"].items()):
        lines.append(f"  {w} summing process(es): {sec:.2f} s, {sec / (r['uploads'] - 1) * 1e3:.1f} ms per upload, "
                     f"{base / sec:.2f}x")
    lines.append(f"same aggregate ciphertext for every count: {r['same_aggregate']}")
    return "\n".join(lines)


def _cmd(args) -> int:
    r = run_combine_bench(args.backend, dim=args.dim, classes=args.classes, uploads=args.uploads, k_max=args.k_max,
                          workers=tuple(args.workers), threads=args.threads, distinct=args.distinct, seed=args.seed)
    print(format_report(r))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2, sort_keys=True) + "\n")
    return 0 if r["same_aggregate"] else 1


def register(parser) -> None:
    parser.add_argument("--backend", choices=["ckks", "bfv"], default="ckks")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--uploads", type=int, default=100)
    parser.add_argument("--k-max", type=int, default=1000, help="declared k_max (chooses the modulus chain)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    parser.add_argument("--threads", type=int, default=4, help="request threads adding at once")
    parser.add_argument("--distinct", type=int, default=4, help="distinct encrypted uploads, reused in turn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH")
    parser.set_defaults(func=_cmd)
