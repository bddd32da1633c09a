"""``secure-afl bench dp-audit``: the empirical epsilon lower bound (canary test) next to the accounted one, per
backend and epsilon (:mod:`secure_afl.privacy_audit` computes it; this is its command line)."""

from __future__ import annotations

from secure_afl.privacy_audit import audit_params, audit_session

__all__ = ["register"]


def _cmd(args) -> int:
    from secure_afl.dp.mechanism import DPSpec

    print("| backend (noise) | epsilon declared | z | epsilon accounted | epsilon empirical lower bound | FPR / FNR |")
    print("|---|---|---|---|---|---|")
    for backend in args.backends.split(","):
        for eps in (float(e) for e in args.epsilons.split(",")):
            kw = {"n_parties": args.hospitals} if backend == "secagg" else {}
            p = audit_params(DPSpec(eps, args.delta, args.survivors), backend, **kw)
            r = audit_session(p, hospitals=args.hospitals, survivors=args.survivors, runs=args.runs, seed=args.seed)
            print(f"| {backend} ({p.dp['mechanism']}) | {eps:g} | {p.dp['noise_multiplier']:.3f} | "
                  f"{r.epsilon_accounted:.3f} | {r.epsilon_lower_bound:.3f} | {r.fpr:.4f} / {r.fnr:.4f} |", flush=True)
    return 0


def register(parser) -> None:
    parser.add_argument("--backends", default="plain,secagg", help="plain (Gaussian) and/or secagg (Skellam)")
    parser.add_argument("--epsilons", default="1,2,8")
    parser.add_argument("--runs", type=int, default=20000, help="releases per world (with and without the canary)")
    parser.add_argument("--hospitals", type=int, default=5)
    parser.add_argument("--survivors", type=int, default=4, help="hospitals whose shares are summed (= t)")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=_cmd)
