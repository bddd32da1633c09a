"""Cost of the key holder's finalize (verify every signed upload, re-sum, decrypt once, flood, check,
solve) next to the server's streaming sum of the same uploads, and what flooding does to W.

    python -m secure_afl_tools.bench_keyholder --dim 512 --classes 100 --hospitals 10 100 [--workers 1 2]

Runs the key holder's real release path (:meth:`KeyHolder.release_he`, what
``finalize`` runs after the audit countersignature) on what an honest server
stores (:class:`_StoredUploads`): the signed uploads, the tag statements and
its signed manifest. To keep memory
flat at large K, ``--distinct`` payloads are encrypted and signed by each
hospital in turn (the key holder checks signatures and hashes per hospital,
not payload uniqueness), so every hospital still costs one full verification.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from secure_afl import pki
from secure_afl.keyholder.verify import resum_signed_contributions
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.signing import build_manifest, sign_upload
from secure_afl.stats import SufficientStatistics, local_statistics
from secure_afl.tagging import new_tag, seal_tag, sign_tag

__all__ = ["main"]


class _StoredUploads:
    """What an honest server stores, from memory: its signed manifest, the signed uploads, the tags."""

    def __init__(self, manifest: dict, payload_of: dict, tags: dict):
        self._manifest, self._payload_of, self._tags = manifest, payload_of, tags

    def manifest(self) -> dict:
        return self._manifest

    def contribution(self, hospital: str) -> bytes:
        return self._payload_of[hospital]

    def tags(self) -> dict:
        return self._tags


def run(dim: int, classes: int, k: int, *, distinct: int = 4, n_per_hospital: int = 200, seed: int = 0,
        workers: tuple[int, ...] = ()) -> dict:
    from secure_afl.analytic import solve_from_sums
    from secure_afl.backends.ckks import CKKSBackend, ckks_session_params

    from secure_afl.keyholder.release import KeyHolder

    rng = np.random.default_rng(seed)
    gamma, lay = 1.0, Layout(dim, classes)
    work = Path(tempfile.mkdtemp(prefix="safl-khbench-"))
    try:
        pki_dir = work / "pki"
        pki.init_ca(pki_dir)
        server = pki.issue(pki_dir, "server", "aggregator")
        pki.issue(pki_dir, "keyholder", "keyholder")
        names = [f"h{i:03d}" for i in range(k)]
        parties = {h: pki.issue(pki_dir, "hospital", h) for h in names}
        kh = KeyHolder(pki_dir, "keyholder", work / "keys", passphrase=os.urandom(16).hex().encode())
        sid = f"bench-{dim}-{classes}-{k}"
        # the operator's signed definition: the key holder takes its release policy from nothing else
        from .harness import sign_session

        sign_session(pki_dir, {"session": {"id": sid, "backend": "ckks", "dim": dim, "classes": classes,
                                           "gamma": gamma, "min_clients": min(k, 3), "hospitals": names},
                               "bounds": {"max_norm": 1.0, "n_max": n_per_hospital, "k_max": max(k, 2)}})
        public = kh.keygen(ckks_session_params(sid, lay, gamma, Bounds(1.0, n_per_hospital, max(k, 2))))
        params = kh.params(sid)
        backend = CKKSBackend(params)
        stats, payloads, tag_values = [], [], []
        t = time.perf_counter()
        for _ in range(min(distinct, k)):
            X = rng.standard_normal((n_per_hospital, dim))
            X /= np.linalg.norm(X, axis=1, keepdims=True)
            s = local_statistics(X, rng.integers(0, classes, n_per_hospital), classes)
            tag = new_tag(params)
            v = lay.pack(SufficientStatistics(s.gram + gamma * np.eye(dim), s.cross, s.n, s.class_counts, 1.0,
                                              gamma, tag))
            stats.append(s)
            payloads.append(backend.protect(v, public_context=public))
            tag_values.append(tag)
        encrypt_s = (time.perf_counter() - t) / len(payloads)
        payload_of, tags, participants = {}, {}, []
        for i, h in enumerate(names):
            j = i % len(payloads)
            sha = hashlib.sha256(payloads[j]).digest()
            payload_of[h] = payloads[j]
            st = sign_upload(parties[h].identity_key(), sid, params.digest(), sha, h)
            participants.append({**st, "identity_pub": pki.public_key_hex(parties[h].identity_pub())})
            tags[h] = sign_tag(parties[h].identity_key(), params, h, sha.hex(), seal_tag(params, h, tag_values[j]))
        # the server's side: its streaming sum of the same K uploads
        t = time.perf_counter()
        comb = backend.combiner(public_context=public)
        for h in names:
            comb.add(payload_of[h])
        aggregate = comb.aggregate()
        server_s = time.perf_counter() - t
        manifest = build_manifest(server.identity_key(), sid, params.digest(), participants,
                                  hashlib.sha256(aggregate).digest(), k)
        resum_s, sums = {}, set()
        for w in workers:  # the verify + re-sum alone, with w processes (finalize may decrypt only once)
            ctx = backend.keyholder_context(kh.secret_context(sid))
            t = time.perf_counter()
            chunks, _ = resum_signed_contributions(params, backend, ctx, manifest, payload_of.__getitem__,
                                                   workers=w)
            resum_s[w] = time.perf_counter() - t
            sums.add(hashlib.sha256(backend.scheme.dump_chunks(chunks, lay.length)).hexdigest())
        t = time.perf_counter()
        res = kh.release_he(params.session_id, _StoredUploads(manifest, payload_of, tags), min_clients=k)
        finalize_s = time.perf_counter() - t
        total = stats[0]
        for i in range(1, k):
            total = total + stats[i % len(stats)]
        exact = solve_from_sums(total)  # no noise, no ridge
        rel = float(np.linalg.norm(res.W - exact) / np.linalg.norm(exact))
        return {"dim": dim, "classes": classes, "hospitals": k, "bytes_per_upload": len(payloads[0]),
                "encrypt_s_per_hospital": encrypt_s, "server_sum_s": server_s,
                "keyholder_verify_resum_s": res.report["verify_and_resum_seconds"],
                "keyholder_finalize_s": finalize_s, "flood_sigma": res.report["flood_sigma"],
                "flood_security": res.report["flood_security"],
                "decryption_error_bound": res.report["decryption_error_bound"],
                "error_bound_per_entry": res.report["error_bound_per_entry"], "flood_ridge": res.report["flood_ridge"],
                "W_rel_error_vs_exact": rel, "resum_s_by_workers": resum_s,
                "resums_identical": len(sums) <= 1}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--hospitals", type=int, nargs="+", default=[10, 100])
    ap.add_argument("--distinct", type=int, default=4, help="distinct encrypted payloads (memory)")
    ap.add_argument("--workers", type=int, nargs="*", default=[],
                    help="also time the verify + re-sum alone with each of these process counts")
    args = ap.parse_args(argv)
    for k in args.hospitals:
        r = run(args.dim, args.classes, k, distinct=args.distinct, workers=tuple(args.workers))
        for w, sec in r["resum_s_by_workers"].items():
            print(f"d={r['dim']} C={r['classes']} K={r['hospitals']}: key holder verify + re-sum with {w} "
                  f"process(es): {sec:.2f} s")
        if len(r["resum_s_by_workers"]) > 1:
            print(f"  re-sums bit for bit identical across process counts: {r['resums_identical']}")
        print(f"d={r['dim']} C={r['classes']} K={r['hospitals']}: upload {r['bytes_per_upload'] / 1e6:.1f} MB; "
              f"server sum {r['server_sum_s']:.2f} s; key holder verify+re-sum {r['keyholder_verify_resum_s']:.2f} s "
              f"(whole finalize {r['keyholder_finalize_s']:.2f} s); flood sigma {r['flood_sigma']:.2e}, "
              f"{r['flood_security']} over the release "
              f"(decryption bound {r['decryption_error_bound']:.2e}, released bound {r['error_bound_per_entry']:.2e}, "
              f"ridge {r['flood_ridge']:.2e}); ||W - W_exact|| / ||W_exact|| = {r['W_rel_error_vs_exact']:.2e}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
