"""Cost of split's validity proof per hospital: bytes and seconds beside the same upload without a proof.

    python -m secure_afl_tools.bench_validity --dim 512 --classes 100 [--scaling]

For one hospital with real statistics (n rows of norm <= B), in one run:

* ``plain``: the lanes masked with a ChaCha20 field stream, no proof (what a
  split upload would be without validity): seconds and bytes;
* ``prove``: :meth:`split.Circuit.prove` (lanes, bits, Fiat-Shamir
  projections, REPS bit proofs, masking of the whole body);
* ``server``: the upload check and the server's signed verifier message;
* ``keyholder``: opening nothing (the seed is given), expanding its share,
  its own message and the decision.

``--dp`` runs each row under ``[dp]`` (epsilon 1, delta 1e-5, three contributors): the hospital's noise share
is drawn before the clock starts; with ``--gram`` too, the share is proven beside the statistics.

``--projections blas,compiled`` runs each row with the projections on float32 BLAS and then compiled (numba),
in one run: the compiled kernels' gain as a ratio.

``--scaling`` repeats at smaller d to show how the cost grows with L. ``--round K`` also runs one whole
round of K hospitals in memory (:func:`secure_afl.split.run_split`: every role, no transport) and prints the
seconds of each role.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

import numpy as np

__all__ = ["run", "main"]


def _stats(dim: int, classes: int, n: int, seed: int):
    from secure_afl.packing import Layout
    from secure_afl.stats import local_statistics

    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, dim))
    X /= np.max(np.linalg.norm(X, axis=1))
    return Layout(dim, classes).pack(local_statistics(X, rng.integers(0, classes, n), classes, gamma=1.0))


def run(dim: int, classes: int, *, n: int = 1000, seed: int = 0, gram: bool = False, dp: bool = False,
        field: str | None = None, projection: str = "compiled") -> dict:
    """One upload's figures; ``projection="blas"`` keeps every projection on the float32 BLAS path (the
    compiled kernels switched off), ``"compiled"`` lets them run as a verifier's process runs them."""
    from secure_afl.split import projection as proj_module

    saved = proj_module._COMPILED
    proj_module._COMPILED = projection == "compiled"
    try:
        return {**_run(dim, classes, n=n, seed=seed, gram=gram, dp=dp, field=field), "projection": projection}
    finally:
        proj_module._COMPILED = saved


def _run(dim: int, classes: int, *, n: int, seed: int, gram: bool, dp: bool, field: str | None) -> dict:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from secure_afl import split
    from secure_afl.backends import get_backend
    from secure_afl.packing import Layout
    from secure_afl.params import Bounds

    layout = Layout(dim, classes)
    if dp:
        from secure_afl.backends.session_params import dp_session_params
        from secure_afl.dp import DPSpec

        params = dp_session_params(DPSpec(1.0, 1e-5, 3), "split", f"bench-validity-{dim}", layout, 1.0,
                                   Bounds(1.0, n, 10), gram_proof=gram, field=field or "goldilocks")
    else:
        # signed over the field: Field128 carries one exact word per value at secagg's scale
        params = split.split_session_params(f"bench-validity-{dim}", layout, 1.0, Bounds(1.0, n, 10),
                                            gram_proof=gram, field=field or "goldilocks")
    keys = split.generate_keys(params)
    params = split.bind_public_context(params, keys.public_context)
    be = get_backend(params)
    c = be.circuit
    F = c.F
    v = _stats(dim, classes, n, seed)
    noise = None
    if dp:
        from secure_afl.dp import add_noise_share, noise_share

        if split.noise_beside(params):
            noise = noise_share(params)
        else:
            v = add_noise_share(params, v)
    hkey, skey = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()

    t = time.perf_counter()  # the same upload without a proof: lanes + mask
    seed_bytes = os.urandom(32)
    plain = F.add(c.lanes(v), F.expand_field(seed_bytes, c.main_len, split.DOMAIN_SHARE))
    plain_bytes = len(F.to_bytes(plain))
    plain_s = time.perf_counter() - t

    t = time.perf_counter()
    body, s, com = c.prove("h1", v, noise=noise)
    prove_s = time.perf_counter() - t
    payload, st = be.seal_upload(body, s, com, keys.public_context, "h1", hkey)

    sha = hashlib.sha256(payload).hexdigest()
    expected = split.query_seed(split.query_key(keys.secret_context), params, "h1", sha,
                                         st["validity"])
    t = time.perf_counter()
    split.check_upload(be.circuit, payload, st)
    msg = split.leader_message(be.circuit, "h1", payload, st, skey, expected)
    server_s = time.perf_counter() - t

    t = time.perf_counter()
    qs, leader = split.verify_leader_message(msg, skey.public_key(), c, "h1", sha, expected)
    verdict = split.helper_verdict(c, "h1", s, st, qs, leader)
    keyholder_s = time.perf_counter() - t

    proof_bytes = F.ENCODED_SIZE * (c.n_f + c.n_bits + c.proof_len)  # the Gram statement's factor words included
    return {"field": F.name, "gram_proof": gram, "dp": dp, "upload_bytes": c.upload_bytes(), "dim": dim, "classes": classes, "L": c.L, "plain_upload_bytes": plain_bytes, "proof_bytes": proof_bytes,
            "proof_fraction": proof_bytes / plain_bytes, "aux_bits": c.n_bits, "flp_words": c.proof_len,
            "verifier_message_bytes": F.ENCODED_SIZE * c.verifier_len, "plain_s": plain_s, "prove_s": prove_s,
            "server_verify_s": server_s, "keyholder_verify_s": keyholder_s,
            "prove_plus_verify_s": prove_s + server_s + keyholder_s, "accepted": verdict is None,
            "soundness_bits_q64": split.soundness_bits(c)}


def round_timings(dim: int, classes: int, hospitals: int, *, n: int = 1000, gram: bool = False) -> dict:
    """Seconds per role of one in-memory round of ``hospitals`` honest uploads, and whether it released the
    sum (within the fixed point's bound)."""
    from secure_afl import split
    from secure_afl.packing import Layout
    from secure_afl.params import Bounds

    params = split.split_session_params(f"bench-round-{dim}", Layout(dim, classes), 1.0, Bounds(1.0, n, 10),
                                        gram_proof=gram)
    keys = split.generate_keys(params)
    params = split.bind_public_context(params, keys.public_context)
    vectors = [_stats(dim, classes, n, k) for k in range(hospitals)]
    run = split.run_split(params, keys, vectors)
    err = float(np.max(np.abs(run.vector - np.sum(vectors, axis=0))))
    return {"dim": dim, "hospitals": hospitals, **{f"{k}_s": v for k, v in run.timings.items()},
            "released": err <= split.expected_abs_error(params, hospitals)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--scaling", action="store_true", help="also run at d = 64, 128, 256")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--gram", action="store_true", help="each d also under the Gram statement ([split] gram_proof)")
    ap.add_argument("--dp", action="store_true", help="every row under [dp] (the noise share drawn off the clock)")
    ap.add_argument("--fields", default="goldilocks", metavar="NAMES",
                    help="comma-separated fields to run each row over (goldilocks, field128), in one run")
    ap.add_argument("--projections", default="compiled", metavar="NAMES",
                    help="comma-separated projection paths to run each row under (blas, compiled), in one run")
    ap.add_argument("--round", type=int, default=0, metavar="K",
                    help="also run one round of K hospitals through every role in memory (run_split)")
    args = ap.parse_args(argv)
    dims = ([64, 128, 256] if args.scaling else []) + [args.dim]
    from secure_afl.exceptions import InvalidParameterError

    rows, refused = [], []
    for d in dims:
        for f in args.fields.split(","):
            for g, pr in ((g, pr) for g in ((False, True) if args.gram else (False,))
                          for pr in args.projections.split(",")):
                try:
                    rows.append(run(d, args.classes, n=args.n, gram=g, dp=args.dp, field=f, projection=pr))
                except InvalidParameterError as e:  # a combination the session signing refuses: say so
                    refused.append(f"{f} dp {'on' if args.dp else 'off'} gram {'on' if g else 'off'} d = {d}: {e}")
    rounds = [round_timings(args.dim, args.classes, args.round, n=args.n, gram=g)
              for g in ((False, True) if args.gram else (False,))] if args.round else []
    if args.json:
        print(json.dumps(rows if not rounds else {"uploads": rows, "rounds": rounds}, indent=1))
        return 0
    print(f"{'field':>10} {'proj':>8} {'dp':>3} {'gram':>4} {'d':>5} {'L':>7} {'upload MB':>9} {'proof MB':>8} {'proof/up':>8} {'plain s':>7} {'prove s':>7} "
          f"{'server s':>8} {'kh s':>6} {'p+v s':>6} {'ok':>3} {'sound':>6} {'whole MB':>8}")
    for r in rows:
        print(f"{r['field']:>10} {r['projection']:>8} {'on' if r['dp'] else 'off':>3} {'on' if r['gram_proof'] else 'off':>4} {r['dim']:5d} {r['L']:7d} {r['plain_upload_bytes'] / 1e6:9.3f} {r['proof_bytes'] / 1e6:8.3f} "
              f"{100 * r['proof_fraction']:7.1f}% {r['plain_s']:7.3f} {r['prove_s']:7.3f} {r['server_verify_s']:8.3f} "
              f"{r['keyholder_verify_s']:6.3f} {r['prove_plus_verify_s']:6.3f} {'yes' if r['accepted'] else 'NO':>3} "
              f"{r['soundness_bits_q64']:6.1f} {r['upload_bytes'] / 1e6:8.3f}")
    for line in refused:
        print(f"not signable: {line}")
    for r in rounds:
        print(f"round of {r['hospitals']} at d = {r['dim']}: " + ", ".join(
            f"{k[:-2]} {v:.3f} s" for k, v in r.items() if k.endswith("_s")) +
            f"; released {'yes' if r['released'] else 'NO'}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
