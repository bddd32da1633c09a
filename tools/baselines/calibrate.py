"""How often each test of the comparison study calls a difference that is not there: study-shaped data under
the null, rejection rates at 0.05 printed (``python -m secure_afl_tools.baselines.calibrate [--sims N]``).

The data: S seeds each test ``n`` of ``pool`` images (the seeds' splits overlap as the study's do); two
models of equal expected accuracy; per image, a difficulty both share and a preference for one model over the
other (mean zero over images: the "image" random effect a shared split repeats); per seed and model, a
training shift (the "seed" random effect). Compared: McNemar's exact test on the pooled predictions (blind to
both effects), the bootstrap over seeds and images (:func:`seed_image_bootstrap`) and the t-test over the
seeds (:func:`seeds_t_test`). A well-calibrated test rejects about 5 % of the time; more is optimistic, less
conservative.
"""

from __future__ import annotations

import argparse

import numpy as np

from .study_stats import seed_image_bootstrap, seeds_t_test


def pooled_mcnemar(a, b) -> float:
    """Two-sided exact McNemar p on pooled predictions (what a pooled-sample test reports)."""
    from scipy.stats import binomtest

    n_ab, n_ba = int(np.sum(a & ~b)), int(np.sum(~a & b))
    return 1.0 if n_ab + n_ba == 0 else float(binomtest(n_ab, n_ab + n_ba, 0.5).pvalue)


def null_rejections(*, sims=200, seeds=5, n=450, pool=1797, image_sd=1.0, seed_sd=0.15, boot=1000,
                    alpha=0.05, rng_seed=0) -> dict:
    """Share of ``sims`` null studies in which each test gives p < ``alpha``."""
    rng = np.random.default_rng(rng_seed)
    hits = {"pooled McNemar": 0, "bootstrap over seeds and images": 0, "t-test over seeds": 0}
    for k in range(sims):
        base, pref = rng.normal(3.0, 1.5, pool), rng.normal(0.0, image_sd, pool)
        pairs, ids = [], []
        for _ in range(seeds):
            te = rng.choice(pool, n, replace=False)
            ta, tb = rng.normal(0.0, seed_sd, 2)
            ca = rng.random(n) < 1 / (1 + np.exp(-(base[te] + pref[te] / 2 + ta)))
            cb = rng.random(n) < 1 / (1 + np.exp(-(base[te] - pref[te] / 2 + tb)))
            pairs.append((ca[None], cb[None], np.zeros(n, dtype=np.int64), None))
            ids.append(te.tolist())
        res = seed_image_bootstrap(pairs, ids, boot=boot, seed=k)
        hits["bootstrap over seeds and images"] += res["p"] < alpha
        hits["t-test over seeds"] += seeds_t_test(res["per_seed"]) < alpha
        hits["pooled McNemar"] += pooled_mcnemar(np.concatenate([p[0][0] for p in pairs]),
                                                 np.concatenate([p[1][0] for p in pairs])) < alpha
    return {name: h / sims for name, h in hits.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=200)
    ap.add_argument("--image-sd", type=float, default=1.0, help="spread of the per-image preference (logit)")
    ap.add_argument("--seed-sd", type=float, default=0.15, help="spread of the per-seed training shift (logit)")
    args = ap.parse_args(argv)
    rates = null_rejections(sims=args.sims, image_sd=args.image_sd, seed_sd=args.seed_sd)
    print(f"null rejection rate at 0.05 over {args.sims} study-shaped simulations (image sd {args.image_sd}, "
          f"seed sd {args.seed_sd}):")
    for name, r in rates.items():
        se = np.sqrt(r * (1 - r) / args.sims)
        print(f"  {name:<34} {r:.3f} ± {se:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
