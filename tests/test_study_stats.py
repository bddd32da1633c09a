"""The comparison study's tests of a difference: the bootstrap over seeds and test images, on data whose answer is
known (no hypothesis: p large, and rarely below 0.05; a clear gap: p at its floor), its Monte Carlo error, and
the clustering of shared test images. No figure of the study itself is asserted."""

from __future__ import annotations

import numpy as np
import pytest

from secure_afl.exceptions import InvalidInputError
from secure_afl_tools.baselines.study_report import secure_finding, compare_rows, pack_bits
from secure_afl_tools.baselines.study_stats import image_ids, seed_image_bootstrap, seeds_t_test


def _seeds(rng, S, n, acc_a, acc_b, *, seed_sd=0.0, classes=4):
    """S seeds of n test samples each, two models' correctness drawn independently per sample; each seed's
    accuracies move by a shared N(0, seed_sd) (training variance) and by its own N(0, seed_sd) per model."""
    pairs = []
    for _ in range(S):
        y = rng.integers(0, classes, n)
        shift = rng.normal(0, seed_sd)
        pa = np.clip(acc_a + shift + rng.normal(0, seed_sd), 0, 1)
        pb = np.clip(acc_b + shift + rng.normal(0, seed_sd), 0, 1)
        pairs.append(((rng.random(n) < pa)[None], (rng.random(n) < pb)[None], y, None))
    return pairs


def _disjoint(S, n):
    return [list(range(s * n, (s + 1) * n)) for s in range(S)]


def test_identical_models_give_p_one_and_a_clear_gap_gives_p_at_its_floor():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(4), 100)
    base = rng.random(y.size) < 0.7
    ids = _disjoint(3, y.size)
    same = seed_image_bootstrap([(base[None], base[None], y, None)] * 3, ids, boot=500)
    assert same["diff"] == 0.0 and same["lo"] == same["hi"] == 0.0 and same["p"] == 1.0 and same["p_se"] == 0.0
    # b loses 40 of a's correct samples on every seed: a 10-point gap no seed or image draw closes
    worse = base.copy()
    worse[np.flatnonzero(base)[:40]] = False
    big = seed_image_bootstrap([(base[None], worse[None], y, None)] * 3, ids, boot=500)
    assert big["diff"] == pytest.approx(0.1) and big["lo"] > 0.05 and big["p"] == 0.0
    # the per-hospital form: a hospital holding class 0 only sees class-0 accuracy, and the gap sits there
    mix = np.array([[1.0, 0, 0, 0], [0, 0.5, 0.5, 0]])
    a = np.ones((2, y.size), dtype=bool)
    b = a.copy()
    b[0, y == 0] = False
    r = seed_image_bootstrap([(a, b, y, mix)], [ids[0]], boot=300)
    assert r["diff"] == pytest.approx(0.5) and r["p"] == 0.0


def test_without_a_difference_p_is_rarely_below_alpha_and_with_one_it_mostly_is():
    # 200 studies of 5 seeds with training variance: under the null the test must not reject more often than
    # its level (it leans conservative); a 10-point gap must be found in nearly all
    rng = np.random.default_rng(1)
    null = [seed_image_bootstrap(_seeds(rng, 5, 120, 0.8, 0.8, seed_sd=0.02), _disjoint(5, 120), boot=400,
                                 seed=i)["p"] for i in range(200)]
    assert np.mean(np.asarray(null) < 0.05) <= 0.08
    assert np.mean(null) > 0.4  # not degenerate at 1: p spreads over (0, 1]
    alt = [seed_image_bootstrap(_seeds(rng, 5, 200, 0.9, 0.8, seed_sd=0.01), _disjoint(5, 200), boot=400,
                                seed=i)["p"] for i in range(60)]
    assert np.mean(np.asarray(alt) < 0.05) >= 0.9


def test_training_variance_widens_the_interval_the_pooled_samples_alone_would_give():
    # the same per-sample noise with and without seed-to-seed variance: resampling the seeds carries it
    quiet = seed_image_bootstrap(_seeds(np.random.default_rng(2), 5, 300, 0.8, 0.8), _disjoint(5, 300), boot=2000)
    loud = seed_image_bootstrap(_seeds(np.random.default_rng(2), 5, 300, 0.8, 0.8, seed_sd=0.05),
                                _disjoint(5, 300), boot=2000)
    assert loud["se"] > 1.5 * quiet["se"]


def test_the_monte_carlo_error_matches_the_spread_of_p_over_bootstrap_seeds():
    # a difference of middling strength (p near 0.1 to 0.4), tested 40 times with the bootstrap's own seed moved
    pairs = _seeds(np.random.default_rng(3), 5, 200, 0.82, 0.8)
    ids = _disjoint(5, 200)
    runs = [seed_image_bootstrap(pairs, ids, boot=1000, seed=i) for i in range(40)]
    ps, ses = np.array([r["p"] for r in runs]), np.array([r["p_se"] for r in runs])
    assert 0.02 < ps.mean() < 0.8
    assert 0.6 < ps.std(ddof=1) / ses.mean() < 1.6
    # four times the replicates, half the error
    more = seed_image_bootstrap(pairs, ids, boot=4000, seed=0)
    assert more["p_se"] == pytest.approx(ses.mean() / 2, rel=0.25)


def test_clustering_by_image_id_counts_a_shared_image_once():
    # four seeds testing the SAME 400 images with the same predictions: one seed's evidence, not four; the
    # spread is the single-seed paired standard error. With the images distinct per seed the same predictions
    # are four times the samples, and the spread narrows by sqrt(S) less the seed stage's re-count of the
    # image noise: the seed weights a ~ Multinomial(S, 1/S) have E[sum a_s^2] / S^2 = (2 - 1/S) / S, so the
    # variance is (2 - 1/S) sigma^2 / S, not sigma^2 / S (the bootstrap's conservative lean, exactly)
    rng = np.random.default_rng(4)
    n, S = 400, 4
    y = rng.integers(0, 4, n)
    a, b = rng.random(n) < 0.8, rng.random(n) < 0.75
    pairs = [(a[None], b[None], y, None)] * S
    shared = seed_image_bootstrap(pairs, [list(range(n))] * S, boot=4000)
    distinct = seed_image_bootstrap(pairs, _disjoint(S, n), boot=4000)
    assert shared["images"] == n and distinct["images"] == S * n and shared["samples"] == distinct["samples"]
    d = a.astype(float) - b.astype(float)
    assert shared["se"] == pytest.approx(d.std() / np.sqrt(n), rel=0.1)
    assert shared["se"] / distinct["se"] == pytest.approx(np.sqrt(S / (2 - 1 / S)), rel=0.1)


def test_image_ids_name_the_same_row_alike_across_seeds_and_refuse_a_length_mismatch():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(30, 6))
    ids = image_ids([X[[0, 1, 2, 3]], X[[2, 9, 0]], X[[9]]])
    assert ids[0][0] == ids[1][2] and ids[0][2] == ids[1][0] and ids[1][1] == ids[2][0]
    assert len({*ids[0], *ids[1], *ids[2]}) == 5
    y = np.zeros(4, dtype=np.int64)
    c = np.ones((1, 4), dtype=bool)
    with pytest.raises(ValueError, match="differ in length"):
        seed_image_bootstrap([(c, c, y, None)], [[0, 1, 2]])


def test_a_study_without_image_ids_is_refused_by_name():
    row = {"seed": 1, "correct": [pack_bits(np.ones(8, dtype=bool))], "mix": [[1.0]]}
    study = {"meta": {"test_labels": {"1": "0" * 8}}}
    with pytest.raises(InvalidInputError, match="test image ids"):
        compare_rows(study, [row], [dict(row)], "global")
    study["meta"]["test_ids"] = {"1": list(range(8))}
    assert compare_rows(study, [row], [dict(row)], "global")["p"] == 1.0


def test_the_t_test_over_seeds_on_known_cases():
    assert seeds_t_test([0.0, 0.0, 0.0]) == 1.0 and seeds_t_test([0.01] * 5) == 0.0
    # t = mean / (sd / sqrt(5)) = 0.02 / (0.01 / sqrt 5) = 4.47, df 4: two-sided p = 0.0111
    assert seeds_t_test([0.01, 0.02, 0.03, 0.01, 0.03]) == pytest.approx(0.01106, abs=2e-4)
    assert np.isnan(seeds_t_test([0.1]))


def _verify_row(method, backend, diff, acc, *, rounds=3, split=None, agreement=1.0):
    return {"method": method, "backend": backend, "rounds": rounds, "max_abs_diff": diff, "agreement": agreement,
            "acc_secure": 0.9 + acc, "acc_plain": 0.9, "splits_equal": split, "err_ratio": 0.5}


def test_secure_finding_counts_the_solve_and_keeps_a_split_flip_apart_from_drift():
    # AFL's solve differs most under secagg and must be the figure quoted; a FedFac run whose split flipped
    # carries the largest accuracy difference under ckks and must not be quoted as the flooding's drift
    ver = [_verify_row("FedAvg-linear", "secagg", 4e-15, 0.0), _verify_row("FedAvg-linear", "ckks", 1e-5, 0.001),
           _verify_row("FedFac-static", "secagg", 0.7, 0.015, split=False, agreement=0.88),
           _verify_row("FedFac-static", "ckks", 0.7, 0.024, split=False, agreement=0.87),
           _verify_row("AFL", "secagg", 1.5e-13, 0.0, rounds=1), _verify_row("AFL", "ckks", 1e-2, 0.0, rounds=1)]
    txt = secure_finding({}, ver)
    secagg, ckks = txt.split("Under ckks")
    assert "to 1.5e-13 (AFL, 1 round)" in secagg and "gradient methods to 4.0e-15" in secagg
    assert "at most 0.0010" in ckks and "0.0240" not in ckks.split("FedFac's split")[0]
    assert "accuracy difference +0.0240" in ckks.split("FedFac's split")[1]


def test_under_training_variance_the_pooled_test_is_optimistic_and_the_bootstrap_is_not():
    # study-shaped null data whose seeds move both models' accuracy (no image preference): a test on the pooled
    # predictions takes that training variance for a difference; the bootstrap over seeds and images does not
    from secure_afl_tools.baselines.calibrate import null_rejections

    rates = null_rejections(sims=120, seeds=5, n=200, pool=800, image_sd=0.0, seed_sd=0.3, boot=400)
    assert rates["pooled McNemar"] > 0.15
    assert rates["bootstrap over seeds and images"] <= 0.1
