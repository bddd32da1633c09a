"""``secure-afl bench``: benchmarks that print figures (and write JSON).

Subcommands live in :data:`_SUBCOMMANDS` as ``(name, help, target)`` where
``target`` is either a function ``register(parser)`` or the dotted name of a
module exposing ``register(parser)`` (imported when the ``bench`` group is
built; torch itself is imported only when ``bench extract`` runs).

``bench protect`` runs one aggregation round in-process: K hospitals compute
real statistics (random embeddings with ||x|| <= B through
:func:`secure_afl.stats.local_statistics` and :meth:`Layout.pack`), protect
them (timed per client), the server combines the survivors' payloads (timed),
the revealing party reveals (timed), and the result is compared with the
plaintext sum of the same vectors.

``exact`` in the output means: plain, the revealed sum equals the plaintext
sum bit for bit; bfv and split, ``max_abs_error`` is within the backend's
stated per-entry bound for the actual K and magnitudes; ckks, the revealed
sum is what the key holder releases: the raw decryption flooded by its plan
(``keyholder/flooding.py``), and ``max_abs_error`` is within the flooding's
proved bound (``error_bound`` = its ``tol``); the bare decryption's error is
reported apart as ``max_abs_error_unflooded`` because it never leaves the key
holder; secagg, what
``simulate_round`` reports (bit-exact fixed-point equality). ``w_bound`` is the
certified bound on ``||W - W*|| / ||W*||`` of the W solved from the revealed
sums (:mod:`secure_afl.certify`).

With no ``--backend`` and several ``--clients``, every backend runs at every
K in one go and one table is printed (the figures in docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import tempfile
import time

import numpy as np
from secure_afl.backends import get_backend
from secure_afl.backends import he_module
from secure_afl import split
from secure_afl.certify import certify_release
from secure_afl.packing import Layout
from secure_afl.params import Bounds, SessionParams
from secure_afl.secagg import default_threshold, recommended_neighbours, secagg_session_params, simulate_round
from secure_afl.stats import local_statistics

__all__ = ["register", "run_protect"]

BACKENDS = ("plain", "ckks", "bfv", "secagg", "split")


# -- the subcommand registry ------------------------------------------------------------
def _register_protect(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=BACKENDS, nargs="+", default=list(BACKENDS),
                        help="backends to run (default: all)")
    parser.add_argument("--dim", type=int, default=512, help="embedding dimension d (default 512)")
    parser.add_argument("--classes", type=int, default=100, help="number of classes C (default 100)")
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100],
                        help="numbers of hospitals K (default 10 100)")
    parser.add_argument("--dropout", type=float, default=0.0, help="fraction of hospitals that never upload")
    parser.add_argument("--samples", type=int, default=256, help="samples per hospital (n_k = n_max)")
    parser.add_argument("--max-norm", type=float, default=1.0, help="embedding norm bound B")
    parser.add_argument("--gamma", type=float, default=1.0, help="RI intermediary gamma")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--protect-repeats", type=int, default=1, metavar="R",
                        help="protect each hospital's vector R times and keep the fastest (on a shared machine the "
                             "other jobs' load then drops out of the per-hospital figure)")
    parser.add_argument("--ckks-flooding", choices=["heuristic", "proved"], default="heuristic",
                        help="ckks: size the key holder's flooding with the heuristic key-error bound (default) or "
                             "the honest-encryption worst case (the session's signed [ckks] flooding)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON here")
    parser.set_defaults(func=_cmd_protect)


_SUBCOMMANDS: list = [
    ("protect", "time protect / combine / reveal of one round and check the sum", _register_protect),
    ("extract", "time embedding extraction on this machine", "secure_afl_tools.bench_embed"),
    ("dp", "test accuracy against epsilon (distributed DP), table and PNG", "secure_afl_tools.bench_dp"),
    ("dp-audit", "empirical epsilon lower bound (canary test) next to the accounted one", "secure_afl_tools.bench_dp_audit"),
    ("service", "one session through the real server, key holder and K HTTPS hospitals, per phase",
     "secure_afl_tools.bench_service"),
    ("combine", "the server's running sum of ckks/bfv uploads with 1 and W summing processes",
     "secure_afl_tools.bench_combine"),
    ("upload-cost", "the server's CPU per upload against its floor (TLS + SHA-256 + fsync) and where it goes",
     "secure_afl_tools.bench_upload"),
    ("field", "Field128 against the Goldilocks field, numpy and compiled: mul, add, dot, NTT, expansion",
     "secure_afl_tools.bench_field"),
]


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    for name, help_, target in _SUBCOMMANDS:
        if isinstance(target, str):
            target = importlib.import_module(target).register
        target(sub.add_parser(name, help=help_, description=help_))


# -- bench protect ----------------------------------------------------------------------
def _hospital_vector(layout, rng, samples: int, max_norm: float, gamma: float) -> np.ndarray:

    X = rng.standard_normal((samples, layout.dim))
    X *= (max_norm * rng.uniform(0.5, 1.0, samples) / np.linalg.norm(X, axis=1))[:, None]
    y = rng.integers(0, layout.n_classes, samples)
    return layout.pack(local_statistics(X, y, layout.n_classes, gamma=gamma, max_norm=max_norm))


def run_protect(backend: str, dim: int, classes: int, clients: int, *, dropout: float = 0.0, seed: int = 0,
                samples: int = 256, max_norm: float = 1.0, gamma: float = 1.0, protect_repeats: int = 1,
                ckks_flooding: str = "heuristic") -> dict:
    """One in-process round; returns the figures (see module docstring)."""

    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1); got {dropout!r}")
    layout = Layout(dim, classes)
    bounds = Bounds(max_norm, samples, clients)
    rng = np.random.default_rng(seed)
    n_drop = int(round(dropout * clients))
    if clients - n_drop < 1:
        raise ValueError("dropout leaves no hospital")
    dropped = set(int(i) for i in rng.choice(clients, n_drop, replace=False))
    session_id = f"bench-{backend}-{seed}"
    out = {"backend": backend, "dim": dim, "classes": classes, "clients": clients, "dropout": dropout,
           "length": layout.length, "samples": samples, "max_norm": max_norm, "gamma": gamma, "seed": seed}

    if backend == "secagg":
        return _run_secagg(out, layout, bounds, gamma, session_id, rng, samples, max_norm, dropout)


    t = time.perf_counter()
    if backend in ("ckks", "bfv"):

        he = he_module(backend)
        params = he.session_params(session_id, layout, gamma, bounds,
                                   **({"flooding": ckks_flooding} if backend == "ckks" else {}))
        keys = he.generate_keys(params)
        params = he.bind_public_context(params, keys.public_context)
        expected_abs_error = he.expected_abs_error
        protect_kw = combine_kw = {"public_context": keys.public_context}
        reveal_kw = {"secret_context": keys.secret_context}
    elif backend == "plain":
        params = SessionParams(session_id, "plain", layout, gamma, bounds)
        protect_kw, combine_kw, reveal_kw = {}, {}, {}
    elif backend == "split":
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


        params = split.split_session_params(session_id, layout, gamma, bounds)
        keys = split.generate_keys(params)
        params = split.bind_public_context(params, keys.public_context)
        expected_abs_error = split.expected_abs_error
        hospital_key = Ed25519PrivateKey.generate()  # one identity for all: signing is not what is measured
        protect_kw = {"public_context": keys.public_context, "identity_key": hospital_key}
        combine_kw, reveal_kw = {}, {}
        seeds: dict = {"participants": [], "statements": {}}
        server_key = Ed25519PrivateKey.generate()
        payload_dir = tempfile.TemporaryDirectory(prefix="bench-split-")  # the server's payload files
        stored = []
    else:
        raise ValueError(f"unknown backend {backend!r}")
    out["keygen_s"] = time.perf_counter() - t
    be = get_backend(params)
    acc = be.combiner(**combine_kw)
    ref = np.zeros(layout.length)
    magnitude = 0.0
    protect_s, combine_s, sizes = [], 0.0, []
    for k in range(clients):
        v = _hospital_vector(layout, np.random.default_rng([seed, k]), samples, max_norm, gamma)
        if k in dropped:
            continue  # this hospital never uploads
        if protect_repeats > 1:  # the extra calls are discarded: only the fastest time is kept
            protect_s.append(_fastest_protect(be, v, backend, k, protect_kw, protect_repeats - 1))
        t = time.perf_counter()
        if backend == "split":
            payload, st = be.protect(v, hospital=f"h{k}", **protect_kw)
            protect_s.append(time.perf_counter() - t)
            seeds["participants"].append({"hospital": f"h{k}", "payload_sha256": st["payload_sha256"]})
            seeds["statements"][f"h{k}"] = st
            sizes.append(len(payload) + len(json.dumps(st)))  # the signed sealed seed travels in a header
        else:
            payload = be.protect(v, **protect_kw)
            protect_s.append(time.perf_counter() - t)
            sizes.append(len(payload))
        if protect_repeats > 1:
            protect_s[-2:] = [min(protect_s[-2:])]
        t = time.perf_counter()
        acc.add(payload)
        combine_s += time.perf_counter() - t
        if backend == "split":  # kept as the server keeps it, for its verifier messages at the release
            path = os.path.join(payload_dir.name, st["payload_sha256"])
            with open(path, "wb") as f:
                f.write(payload)
            stored.append((f"h{k}", path, st["payload_sha256"], st))
        del payload
        ref += v
        magnitude += float(np.max(np.abs(v)))
    t = time.perf_counter()
    aggregate = acc.aggregate()
    combine_s += time.perf_counter() - t
    if backend == "ckks":  # what leaves the key holder is the flooded decryption, never the bare one
        return _ckks_flooded(out, be, params, keys, aggregate, ref, magnitude, layout, protect_s, combine_s,
                             sizes)
    t = time.perf_counter()
    if backend == "split":
        enrolled = {p["hospital"]: hospital_key.public_key() for p in seeds["participants"]}
        qkey = split.query_key(keys.secret_context)  # the key holder's query seed for each upload
        stored = [(h, path, sha, st, split.query_seed(qkey, params, h, sha, st["validity"]))
                  for h, path, sha, st in stored]
        verifiers = split.pool.verifier_pool()  # one per verifier in the service; here one serves both
        verifiers.start()  # started before the clock, as a session's are before its release
        t = time.perf_counter()  # the server's verifier messages
        messages = split.leader_messages(params, stored, server_key, pool=verifiers)
        out["server_verify_s"] = time.perf_counter() - t
        payload_dir.cleanup()
        out["mask_stream_s"] = _mask_stream_floor(layout.length)
        out["keyholder_release_s"], refused = _split_keyholder_release(be, params, keys, seeds, enrolled,
                                                                      messages, server_key.public_key(), verifiers)
        if refused:  # pragma: no cover - every bench hospital is honest
            raise RuntimeError(f"the key holder refused honest uploads: {refused}")
        t = time.perf_counter()  # the key holder's share alone (open, expand, sum every seed): its floor
        sum_masks = split.pool.lane_masks(params, verifiers)
        reveal_kw = {"share": split.keyholder_share(params, keys.secret_context, seeds, seeds["statements"],
                                                    enrolled, sum_masks=sum_masks)}
        out["keyholder_share_s"] = time.perf_counter() - t
        verifiers.close()
    revealed = be.reveal(aggregate, **reveal_kw)
    reveal_s = time.perf_counter() - t
    err = float(np.max(np.abs(revealed - ref)))
    bound = 0.0 if backend == "plain" else expected_abs_error(params, len(sizes), magnitude=magnitude)
    out.update({
        "protect_s_per_client": float(np.mean(protect_s)),
        "combine_s": combine_s,
        "reveal_s": reveal_s,
        "bytes_per_client": float(np.mean(sizes)),
        "bytes_per_value": float(np.mean(sizes)) / layout.length,
        "max_abs_error": err,
        "error_bound": bound,
        "exact": bool(err <= bound),
        "survivors": len(sizes),
        "backend_params": {k: v for k, v in params.backend_params.items()},
    })
    out["w_bound"] = _w_bound(params, layout, revealed, len(sizes))
    out["w_rel_error"] = _w_rel_error(params, layout, None, ref, revealed)
    if backend == "split":  # what each upload carries beyond its lanes (docs/VALIDITY.md)
        # every word after the lanes (the statement's witness words, the bits, the proofs), in the session's field
        c = be.circuit
        out["validity_proof_bytes"] = (c.total - c.main_len) * c.F.ENCODED_SIZE
    return out


def _ckks_flooded(out, be, params, keys, aggregate, ref, magnitude, layout, protect_s, combine_s, sizes) -> dict:
    """ckks: decrypt once and flood as the key holder's release does (``keyholder/flooding.py``).

    The error columns are those of the flooded vector against the float64 sum, checked against
    the flooding's proved bound ``fl.tol``; the bare decryption's error is kept apart
    (``max_abs_error_unflooded``, against the backend's ``expected_abs_error``) because no party
    ever sees it. The W bound is certified with the flooding's noise norms, after the ridge the
    key holder would add, as the service computes it.
    """
    import dataclasses

    from secure_afl.analytic import solve_from_sums
    from secure_afl.backends.ckks import expected_abs_error
    from secure_afl.certify import FLOOD_TAIL
    from secure_afl.envelope import open_envelope
    from secure_afl.keyholder.flooding import flood_decryption, flood_plan, release_norms
    from secure_afl.keyholder.release import ridge_if_needed

    K = len(sizes)
    t = time.perf_counter()
    ctx = be.keyholder_context(keys.secret_context)
    chunks = be.load_partial(ctx, open_envelope(params, aggregate, "aggregate").body)
    # the bare decryption never leaves the key holder; measured here (a tool) only to show what it would be
    bare = float(np.max(np.abs(be.decrypt_raw(ctx, chunks) - ref)))
    decrypt_s = time.perf_counter() - t
    t = time.perf_counter()
    plan = flood_plan(be, K)
    fl = flood_decryption(plan, be, ctx, chunks)
    be.check_range(fl.vector, fl.tol)
    flood_s = time.perf_counter() - t
    err = float(np.max(np.abs(fl.vector - ref)))
    spectral, norms = release_norms(plan, fl, layout.dim, layout.n_classes, FLOOD_TAIL)
    stats = layout.unpack(fl.vector, gamma=params.gamma)
    stats = dataclasses.replace(stats, contributors=float(K), n=float(np.round(stats.n)),
                                class_counts=np.round(stats.class_counts))
    ridge = ridge_if_needed(stats, spectral)
    W = solve_from_sums(stats, lam=ridge)
    wb = certify_release(params, stats, W, K, lam=ridge, flood_norms=norms)
    out.update({
        "protect_s_per_client": float(np.mean(protect_s)),
        "combine_s": combine_s,
        "reveal_s": decrypt_s + flood_s,
        "flood_s": flood_s,
        "bytes_per_client": float(np.mean(sizes)),
        "bytes_per_value": float(np.mean(sizes)) / layout.length,
        "max_abs_error": err,
        "error_bound": float(fl.tol),
        "exact": bool(err <= fl.tol),
        "flooded": True,
        "flood_sigma": float(fl.sigma),
        "flood_sigma_coefficients": float(fl.sigma_coefficients),
        "flood_security": fl.to_report()["flood_security"],
        "flood_kl_log2": fl.kl_log2,
        "flood_kl_log2_proved": fl.kl_log2_proved,
        "flood_ridge": float(ridge),
        "max_abs_error_unflooded": bare,
        "error_bound_unflooded": float(expected_abs_error(params, K, magnitude=magnitude)),
        "survivors": K,
        "backend_params": {k: v for k, v in params.backend_params.items()},
        "w_bound": wb.rel_bound if wb.applies else None,
        "w_rel_error": _w_rel_error(params, layout, W, ref),
    })
    return out


def _mask_stream_floor(length: int, repeats: int = 5) -> float:
    """The fastest of ``repeats`` expansions of one mask over the 2L lanes: what any masking backend's
    protect must at least spend (split's own protect also encodes, proves, hashes and seals)."""
    from secure_afl.hazmat import flp

    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        flp.expand_field(os.urandom(32), 2 * length, split.DOMAIN_SHARE)
        best = min(best, time.perf_counter() - t)
    return best


def _split_keyholder_release(be, params, keys, seeds, enrolled, messages, server_pub, pool) -> tuple[float, dict]:
    """The key holder's split release as the service runs it (``keyholder/release/split_share.py``): check each of the
    server's signed verifier messages, open each seed, judge the upload on its own share and sum the
    accepted masks, on every core. Returns (seconds, refused)."""
    t = time.perf_counter()
    qkey = split.query_key(keys.secret_context)
    items = []
    for p in seeds["participants"]:
        h, sha = p["hospital"], p["payload_sha256"]
        st = seeds["statements"][h]
        qs = split.query_seed(qkey, params, h, sha, st["validity"])
        _, msg = split.verify_leader_message(messages[h], server_pub, be.circuit, h, sha, qs)
        seed = split.open_statement_seed(params, keys.secret_context, seeds["statements"], enrolled, h, sha)
        items.append((h, seed, st["validity"], qs, msg))
    verdicts, _ = split.keyholder_verdicts(params, items, pool=pool)
    return time.perf_counter() - t, {h: v for h, v in verdicts.items() if v}


def _fastest_protect(be, v, backend: str, k: int, protect_kw: dict, n: int) -> float:
    """The fastest of ``n`` protect calls of one hospital's vector (their payloads are dropped)."""
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        be.protect(v, hospital=f"h{k}", **protect_kw) if backend == "split" else be.protect(v, **protect_kw)
        best = min(best, time.perf_counter() - t)
    return best


def _w_rel_error(params, layout, W, ref, revealed=None) -> float:
    """||W - W_plain|| / ||W_plain||: the released W (``W``, or solved from ``revealed``) against the
    unregularised solve of the float64 sum of the same hospitals' statistics."""
    from secure_afl.analytic import solve_from_sums

    if W is None:
        W = solve_from_sums(layout.unpack(np.asarray(revealed, dtype=np.float64), gamma=params.gamma))
    W0 = solve_from_sums(layout.unpack(np.asarray(ref, dtype=np.float64), gamma=params.gamma))
    return float(np.linalg.norm(W - W0) / np.linalg.norm(W0))


def _w_bound(params, layout, revealed, n_clients: int) -> float | None:
    """Certified ||W - W*|| / ||W*|| of the W solved from the revealed sums (None: no bound applies)."""
    from secure_afl.analytic import solve_from_sums

    stats = layout.unpack(np.asarray(revealed, dtype=np.float64), gamma=params.gamma)
    b = certify_release(params, stats, solve_from_sums(stats), n_clients)
    return b.rel_bound if b.applies else None


def _run_secagg(out, layout, bounds, gamma, session_id, rng, samples, max_norm, dropout) -> dict:
    """The whole SecAgg protocol in-process (:func:`secure_afl.secagg.simulate_round`)."""

    # SecAgg+ neighbour graph of degree 2 ceil(1.5 log2 K) once that is smaller than K - 1; the threshold
    # is lowered where the consistency quorum (n + t - 1) / 2 + 1 would not fit in the survivors
    n = bounds.k_max
    k = recommended_neighbours(max(n, 2))
    t = default_threshold((n - 1 if k is None else k) + 1)
    t = max(2, min(t, int((1 - 2 * dropout) * n) - 1))
    params = secagg_session_params(session_id, layout, gamma, bounds, neighbours=k, threshold=t)
    vectors = [_hospital_vector(layout, np.random.default_rng([out["seed"], k]), samples, max_norm, gamma)
               for k in range(out["clients"])]
    aggregate, exact, timings, bytes_per_client = simulate_round(params, vectors, dropout, rng)
    survivors = timings["survivors"]
    ref = np.sum([vectors[i] for i in survivors], axis=0)
    err = float(np.max(np.abs(np.asarray(aggregate, dtype=np.float64) - ref)))

    def timing(*names):
        for n in names:
            if n in timings:
                return float(timings[n])
        return float("nan")

    out.update({
        "protect_s_per_client": timing("protect_s_per_client", "protect_per_client"),
        "combine_s": timing("combine_s", "combine"),
        "reveal_s": timing("reveal_s", "reveal"),
        "secagg_timings": {k: v for k, v in timings.items() if isinstance(v, (int, float))},
        "bytes_per_client": float(bytes_per_client),
        "bytes_per_value": float(bytes_per_client) / layout.length,
        "max_abs_error": err,
        "exact": bool(exact),
        "survivors": len(survivors),
        "backend_params": dict(params.backend_params),
    })
    out["w_bound"] = _w_bound(params, layout, aggregate, len(survivors))
    return out


_ROWS = [
    ("backend", "{}"), ("dim", "{}"), ("classes", "{}"), ("clients", "{}"), ("dropout", "{:g}"),
    ("survivors", "{}"), ("length", "{}"), ("keygen_s", "{:.4f}"), ("protect_s_per_client", "{:.4f}"),
    ("combine_s", "{:.4f}"), ("reveal_s", "{:.4f}"), ("bytes_per_client", "{:,.0f}"),
    ("bytes_per_value", "{:.2f}"), ("max_abs_error", "{:.3e}"), ("error_bound", "{:.3e}"), ("exact", "{}"),
    ("flood_sigma", "{:.3e}"), ("flood_ridge", "{:.3e}"), ("max_abs_error_unflooded", "{:.3e}"),
    ("error_bound_unflooded", "{:.3e}"), ("w_bound", "{:.3e}"), ("server_verify_s", "{:.4f}"),
    ("keyholder_release_s", "{:.4f}"), ("keyholder_share_s", "{:.4f}"), ("validity_proof_bytes", "{:,}"),
    ("mask_stream_s", "{:.4f}"),
]
_COLUMNS = [
    ("backend", "{}"), ("clients", "{}"), ("protect_s_per_client", "{:.4f}"), ("combine_s", "{:.4f}"),
    ("reveal_s", "{:.4f}"), ("bytes_per_value", "{:.2f}"), ("bytes_per_client", "{:,.0f}"),
    ("max_abs_error", "{:.3e}"), ("max_abs_error_unflooded", "{:.3e}"), ("w_bound", "{:.3e}"),
    ("w_rel_error", "{:.3e}"), ("flood_sigma", "{:.3e}"),
]


def format_rows(results: list) -> str:
    """One line per run: the figures side by side."""
    head = ["backend", "K", "protect s/hosp", "combine s", "reveal s", "B/value", "bytes/hosp",
            "max error (released)", "bare decryption error (ckks, never released)", "certified W bound",
            "W rel. error vs plaintext", "flood sigma per entry"]
    cells = [[("n/a" if r.get(k) is None else f.format(r[k])) for k, f in _COLUMNS] for r in results]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def format_table(res: dict) -> str:
    lines = []
    for key, fmt in _ROWS:
        if key in res and res[key] is not None:
            lines.append(f"{key:<22} {fmt.format(res[key])}")
    return "\n".join(lines)


def _cmd_protect(args) -> int:
    machine = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
    results = []
    for k in args.clients:
        for backend in args.backend:
            res = run_protect(backend, args.dim, args.classes, k, dropout=args.dropout, seed=args.seed,
                              samples=args.samples, max_norm=args.max_norm, gamma=args.gamma,
                              protect_repeats=max(1, args.protect_repeats), ckks_flooding=args.ckks_flooding)
            res["machine"] = machine
            results.append(res)
            print(f"[{backend}, K = {k}] done", flush=True)
    if len(results) == 1:
        print(format_table(results[0]))
    print(format_rows(results))
    for r in results:
        if r["backend"] == "split":  # the release's parts: proofs checked by both verifiers, then the share
            print(f"split, K = {r['survivors']}: server verifier messages {r['server_verify_s']:.3f} s, "
                  f"key holder release {r['keyholder_release_s']:.3f} s (verdicts and share; both on "
                  f"{os.cpu_count()} cores), of which the share alone (seeds opened, expanded, summed) "
                  f"{r['keyholder_share_s']:.3f} s; validity proof {r['validity_proof_bytes']:,} B per upload "
                  f"({r['validity_proof_bytes'] / (r['bytes_per_client'] - r['validity_proof_bytes']):.1%} "
                  f"of the rest); the mask's keystream alone {1e3 * r['mask_stream_s']:.1f} ms per hospital")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results[0] if len(results) == 1 else results, f, indent=2, sort_keys=True)
            f.write("\n")
    return 0
