"""The comparison study's test of a difference of accuracies: a paired bootstrap over the reported seeds and
the distinct test images, and the paired t-test over the seeds as its cross-check.

Why both factors: a seed trains both models (initialisation, partition, batches) and draws its own test
split, so the seeds carry the training variance; the splits are drawn from one data set, so they share
images (the report prints how many predictions are how many distinct images), and an image that two splits
hold is one piece of evidence, not two. A test on the pooled predictions (McNemar,
a bootstrap over samples) has neither.
"""

from __future__ import annotations

import numpy as np

__all__ = ["BOOT", "image_ids", "seed_image_bootstrap", "seeds_t_test"]

#: Bootstrap replicates of every test, fixed (p resolves to 2 / BOOT; each p is printed with its Monte Carlo
#: standard error, at most 0.0031 near p = 0.05).
BOOT = 10_000
#: Replicates drawn at once (bounds the memory of the image weights: _CHUNK x distinct images).
_CHUNK = 500


def _weighted(corr, y, mix, w):
    """The accuracy metric of ``corr`` (models x samples) under sample weights ``w`` (replicates x samples):
    ``mix`` None: the mean over models of each model's accuracy; else each hospital k's accuracy on a test
    distribution with its label mix, sum_c mix[k, c] acc_k(c), averaged over hospitals (a single model row
    serves every hospital)."""
    if mix is None:
        return ((w @ corr.T.astype(float)) / w.sum(axis=1)[:, None]).mean(axis=1)
    mix = np.asarray(mix, dtype=float)
    out = np.zeros(w.shape[0])
    for c in range(mix.shape[1]):
        m = y == c
        if not m.any():
            continue
        den = w[:, m].sum(axis=1)
        acc = (w[:, m] @ corr[:, m].T.astype(float)) / np.where(den > 0, den, 1.0)[:, None]
        acc[den == 0] = 0.0
        out += (acc * mix[None, :, c]).mean(axis=1) if corr.shape[0] == mix.shape[0] else \
            acc[:, 0] * mix[:, c].mean()
    return out


def image_ids(test_sets) -> list:
    """One integer id per test sample of each seed, equal across seeds exactly when the samples are the same
    image (the SHA-256 of its feature row): the seeds' test splits are drawn from one data set, so they share
    images, and the bootstrap resamples an image once for every seed that tests on it."""
    import hashlib

    seen: dict = {}
    out = []
    for X in test_sets:
        X = np.ascontiguousarray(np.asarray(X, dtype=np.float64))
        out.append([seen.setdefault(hashlib.sha256(row.tobytes()).digest(), len(seen)) for row in X])
    return out


def seed_image_bootstrap(pairs, ids, *, boot: int = BOOT, seed: int = 0) -> dict:
    """Two-stage bootstrap of a difference of accuracies over the reported seeds and the distinct test images.

    ``pairs``: one (corr_a, corr_b, y, mix) per seed, corr_* (models x samples) booleans, mix as in
    :func:`_weighted` (None: plain accuracy); ``ids``: each seed's image ids (:func:`image_ids`). The estimate
    is the mean over seeds of the per-seed difference D_s. The seeds and the images are two crossed random
    factors (a seed trains both models and draws a test split; a split shares images with the others), so a
    replicate draws both at once, independently (the pigeonhole bootstrap): seed counts a ~ Multinomial(S,
    1/S), image counts v ~ Multinomial(M, 1/M) over the M distinct images of all splits; seed s scores its
    samples with weights v[id] (an image drawn twice counts twice in every split that holds it, the same
    draw for both models: paired), and the replicate is sum_s a_s D_s(v) / S. Resampling the seeds carries
    the training variance (initialisation, partition, batches) and the split's; clustering by image keeps a
    shared image from counting as independent evidence in every split that holds it.

    Returns the difference, the 95 % percentile interval of the replicates and the two-sided p of its
    inversion, p = min(1, 2 q), q = min(P*(d <= 0), P*(d >= 0)), with its Monte Carlo standard error
    ``p_se`` = 2 sqrt(q (1 - q) / boot) (a binomial proportion over ``boot`` fixed replicates).

    It leans conservative: D_s already holds its split's image noise, and the seed stage counts it again.
    Where the seeds add no variance of their own and share no image, the replicates' variance is
    E[sum_s a_s^2] / S^2 sigma^2 = (2 - 1/S) sigma^2 / S instead of sigma^2 / S (1.8 times at S = 5);
    :func:`seeds_t_test` leans the other way and is reported beside it."""
    S = len(pairs)
    if S == 0 or len(ids) != S:
        raise ValueError("one image-id vector per seed is needed")
    flat = np.concatenate([np.asarray(i, dtype=np.int64) for i in ids])
    uniq, inv = np.unique(flat, return_inverse=True)
    local = np.split(inv, np.cumsum([len(i) for i in ids])[:-1])
    for (ca, _, y, _), loc in zip(pairs, local):
        if loc.size != y.size or ca.shape[1] != y.size:
            raise ValueError("image ids and predictions differ in length")

    def diffs(w_of):  # per-seed differences under image weights, replicates x seeds
        return np.stack([_weighted(ca, y, mix, w_of(loc)) - _weighted(cb, y, mix, w_of(loc))
                         for (ca, cb, y, mix), loc in zip(pairs, local)], axis=1)

    per_seed = diffs(lambda loc: np.ones((1, loc.size)))[0]
    est = float(per_seed.mean())
    rng = np.random.default_rng(seed)
    M, reps = uniq.size, np.empty(boot)
    for lo in range(0, boot, _CHUNK):
        n = min(_CHUNK, boot - lo)
        a = rng.multinomial(S, np.full(S, 1.0 / S), size=n).astype(float)
        v = rng.multinomial(M, np.full(M, 1.0 / M), size=n).astype(float)
        reps[lo:lo + n] = (a * diffs(lambda loc: v[:, loc])).sum(axis=1) / S
    q = float(min(np.mean(reps <= 0), np.mean(reps >= 0)))
    p, p_se = min(1.0, 2.0 * q), min(1.0, 2.0 * np.sqrt(q * (1.0 - q) / boot))
    if np.all(reps == 0):
        p, p_se = 1.0, 0.0
    return {"diff": est, "lo": float(np.quantile(reps, 0.025)), "hi": float(np.quantile(reps, 0.975)), "p": p,
            "se": float(reps.std(ddof=1)), "p_se": float(p_se), "boot": boot, "seeds": S, "images": int(M),
            "samples": int(flat.size), "per_seed": per_seed.tolist()}


def seeds_t_test(per_seed) -> float:
    """Two-sided p of the paired t-test over the seeds' differences (df = S - 1): the cross-check of
    :func:`seed_image_bootstrap`. It carries the training variance and each split's test sampling, but takes
    the seeds as independent although their splits share images, so it leans optimistic where the bootstrap
    leans conservative (its image stage counts the test sampling a seed's difference already holds again)."""
    from scipy import stats

    d = np.asarray(per_seed, dtype=float)
    if d.size < 2:
        return float("nan")
    if np.all(d == d[0]):
        return 1.0 if d[0] == 0 else 0.0
    return float(stats.ttest_1samp(d, 0.0).pvalue)
