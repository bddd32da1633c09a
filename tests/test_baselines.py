"""FedAvg / FedProx / FedFac baselines: correctness before comparison, secure = plain, FedFac split."""

from __future__ import annotations

import numpy as np
import pytest

from secure_afl.backends.ckks import expected_abs_error

from secure_afl_tools.baselines import FLConfig, LinearHead, MLPHead, SecureSum, run_fedavg, run_fedfac
from secure_afl_tools.baselines import fedfac as fa
from secure_afl_tools.baselines.compare import ri_ablation, run_afl, run_grid, write_report
from secure_afl_tools.baselines.fl import secure_split
from secure_afl.cli import main
from secure_afl_tools.demo import random_features
from secure_afl.exceptions import BoundsExceeded, InvalidInputError
from secure_afl.partition import dirichlet

D, C = 24, 4


@pytest.fixture(autouse=True)
def _one_blas_thread():
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # small matrices: threads only contend
        yield


@pytest.fixture(scope="module")
def data():
    """A small embedded problem: 4 Gaussian classes through the random feature map."""
    rng = np.random.default_rng(7)
    centres = rng.normal(0, 2.0, (C, 6))
    y = rng.integers(0, C, 400)
    F = random_features(centres[y] + rng.normal(0, 1.0, (400, 6)), dim=D, seed=3)
    Xtr, ytr, Xte, yte = F[:300], y[:300].astype(np.int64), F[300:], y[300:].astype(np.int64)
    parts = [p for p in dirichlet(ytr, 4, 0.3, seed=1) if p.size]
    return [(Xtr[p], ytr[p]) for p in parts], (Xte, yte), (Xtr, ytr)


def _centralised_gd(head, X, y, theta, lr, steps):
    for _ in range(steps):
        _, g = head.loss_grad(theta, X, y)
        theta = theta - lr * g
    return theta


@pytest.mark.parametrize("head", [LinearHead(D, C), MLPHead(D, C, 8)], ids=["linear", "mlp"])
def test_fedavg_one_full_batch_step_is_centralised_gradient_descent(data, head):
    clients, test, (Xtr, ytr) = data
    assert len({y.size for _, y in clients}) > 1  # unequal n_k: the n_k weighting matters
    cfg = FLConfig(rounds=4, local_epochs=1, batch_size=10_000, lr=0.7, backend="plain", seed=2)
    res = run_fedavg(head, clients, test, cfg)
    X = np.concatenate([X for X, _ in clients])
    y = np.concatenate([y for _, y in clients])
    ref = _centralised_gd(head, X, y, head.init(np.random.default_rng(2)), 0.7, 4)
    np.testing.assert_allclose(res["theta"], ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", ["secagg", "ckks"])
def test_secure_sum_within_backend_error_bound(backend):
    rng = np.random.default_rng(0)
    vectors = [rng.uniform(-50, 50, 300) for _ in range(5)]
    ss = SecureSum(backend, 300, 50.0, 5, session="t")
    got = ss.sum(vectors)
    err = float(np.max(np.abs(got - np.sum(vectors, axis=0))))
    assert err <= ss.error_bound(5, magnitude=5 * 50.0)
    assert ss.bytes_up[-1] > 8 * 300  # a protected payload, not nothing


def test_secure_sum_refuses_wrong_length_and_out_of_bound_entries():
    ss = SecureSum("plain", 10, 2.0, 3)
    with pytest.raises(InvalidInputError):
        ss.sum([np.zeros(9), np.zeros(9)])
    with pytest.raises(BoundsExceeded):
        ss.sum([np.zeros(10), np.full(10, 3.0)])


def test_diverging_client_update_is_refused_before_protection(data):
    clients, test, _ = data
    with pytest.raises(BoundsExceeded):
        run_fedavg(LinearHead(D, C), clients, test, FLConfig(rounds=1, lr=50.0, update_bound=1e-6))


def _max_diff(a, b):
    ma, mb = a.get("models", [a["theta"]]), b.get("models", [b["theta"]])
    return max(float(np.max(np.abs(x - y))) for x, y in zip(ma, mb))


@pytest.mark.parametrize("backend", ["secagg", "ckks"])
def test_secure_and_plain_runs_give_the_same_model(data, backend):
    clients, test, _ = data
    n = sum(y.size for _, y in clients)
    lin, mlp = LinearHead(D, C), MLPHead(D, C, 8)
    runs = {
        "fedavg": lambda cfg: run_fedavg(lin, clients, test, cfg),
        "fedprox": lambda cfg: run_fedavg(mlp, clients, test, FLConfig(**{**cfg.__dict__, "mu": 0.1})),
        "fedfac-static": lambda cfg: run_fedfac(mlp, clients, test, cfg),
        "fedfac-dynamic": lambda cfg: run_fedfac(mlp, clients, test, cfg, dynamic=True),
    }
    rounds = 2
    for name, run in runs.items():
        plain = run(FLConfig(rounds=rounds, backend="plain", fa_bound=1.0))
        secure = run(FLConfig(rounds=rounds, backend=backend, fa_bound=1.0))
        # every revealed sum of the run lies within its proved per-entry bound (ckks: flooding included)
        assert 0.0 <= secure["err_ratio"] <= 1.0, name
        if name.startswith("fedfac"):
            if backend == "secagg":  # exact sums: the same R, the same split
                assert [tuple(map(tuple, s)) for s in plain["splits"]] == \
                    [tuple(map(tuple, s)) for s in secure["splits"]]
            continue  # ckks: a flooded R may order near-equal communalities differently; the sums are bounded
        # Per round the revealed weighted update is off by at most eb / N per entry.
        n_max = max(y.size for _, y in clients)
        eb = SecureSum(backend, 10, n_max * 100.0, len(clients)).error_bound(len(clients)) / n
        assert _max_diff(plain, secure) <= 10 * rounds * eb, name
    a_plain = run_afl(clients, test, C, backend="plain")
    a_sec = run_afl(clients, test, C, backend=backend)
    if backend == "secagg":
        assert _max_diff(a_plain, a_sec) <= 1e-9
    else:  # the key holder's flooded release (plus its ridge where C needs one): same predictions, almost
        Xte, _ = test
        agree = np.mean(LinearHead(D, C).predict(a_plain["theta"], Xte) == LinearHead(D, C).predict(a_sec["theta"], Xte))
        assert agree >= 0.9 and a_sec["flood_sigma"] > 0


def test_ckks_sum_is_flooded_with_a_fresh_key_per_sum():
    rng = np.random.default_rng(0)
    vectors = [rng.uniform(-1, 1, 200) for _ in range(4)]
    ss = SecureSum("ckks", 200, 1.0, 4, session="flood")
    exact = np.sum(vectors, axis=0)
    errs, keys = [], []
    for _ in range(2):
        got = ss.sum(vectors)
        errs.append(float(np.max(np.abs(got - exact))))
        keys.append(ss.params.backend_params["public_context_sha256"])
    # the bare decryption is within its own bound; the key holder's flooding moves entries far more, within
    # the flooded bound
    assert min(errs) > 1e3 * expected_abs_error(ss.params, 4)
    assert max(errs) <= ss.error_bound(4)
    assert keys[0] != keys[1]  # a key decrypts once, as in the service
    assert len(ss.flood) == 2 and all(s > 0 for s, _ in ss.flood)


def test_tuned_fedavg_reaches_afl_within_two_points_on_iid_digits():
    from secure_afl_tools.baselines.study import split_validation
    from secure_afl_tools.demo import load_embedded
    from secure_afl.partition import partition

    Xtr, ytr, Xte, yte, n_classes = load_embedded("digits", 0)
    cl = [(Xtr[p], ytr[p]) for p in partition(ytr, 10, "iid", seed=0)]
    afl = run_afl(cl, (Xte, yte), n_classes)["global_acc"]
    fit, val = split_validation(cl, seed=0)
    Xv, yv = np.concatenate([X for X, _ in val]), np.concatenate([y for _, y in val])
    head = LinearHead(Xtr.shape[1], n_classes)
    scores = {}
    for lr in (3.0, 30.0):  # chosen on the hospitals' validation samples, never on the test set
        r = run_fedavg(head, fit, (Xte, yte), FLConfig(rounds=200, lr=lr, eval_every=200))
        scores[lr] = float(np.mean(head.predict(r["theta"], Xv) == yv))
    best = max(scores, key=scores.get)
    res = run_fedavg(head, cl, (Xte, yte), FLConfig(rounds=200, lr=best, eval_every=200))
    assert res["global_acc"] >= afl - 0.02


def test_factor_analysis_split_differs_from_random_split_on_planted_structure():
    # units 0-5 load on two common factors, units 6-11 are independent: FA personalises 6-11
    rng = np.random.default_rng(8)
    h, rows = 12, 100
    head = MLPHead(rows - 1, 3, h)
    loadings = rng.normal(size=(2, 6))
    blocks = []
    for _ in range(4):
        F = rng.normal(size=(rows, 2))
        shared = F @ loadings + 0.1 * rng.normal(size=(rows, 6))
        blocks.append(np.hstack([shared, rng.normal(size=(rows, 6))]))
    gs = SecureSum("plain", fa.gram_length(h), rows * 100.0, 4)
    planted = {6, 7, 8, 9, 10, 11}
    _, p_fa, R = secure_split(head, blocks, gs, FLConfig(personal_fraction=0.5, kappa=0.6))
    assert set(p_fa.tolist()) == planted
    randoms = [set(secure_split(head, blocks, gs, FLConfig(personal_fraction=0.5, split="random"),
                                np.random.default_rng(s))[1].tolist()) for s in range(5)]
    assert all(len(r) == 6 for r in randoms) and any(r != planted for r in randoms)


def test_label_prior_never_lowers_a_clients_accuracy(data):
    from secure_afl_tools.baselines.fl import client_label_mix, evaluate
    from secure_afl_tools.baselines.study import label_prior_accuracy

    clients, test, _ = data
    res = run_afl(clients, test, C)
    head = LinearHead(D, C)
    mix = client_label_mix(clients, C)
    _, _, per = evaluate(head, res["theta"], test, mix)
    prior = label_prior_accuracy(head, res["theta"], test, mix)
    assert np.all(prior >= per - 1e-12)
    assert np.any(prior > per + 1e-12)  # some client lacks a label, and masking it helps there
    full = np.full((1, C), 1.0 / C)  # a client holding every label: the prior masks nothing
    np.testing.assert_allclose(label_prior_accuracy(head, res["theta"], test, full),
                               evaluate(head, res["theta"], test, full)[2], atol=1e-12)


def test_dynamic_fedfac_reports_switching_rate_and_random_split_keeps_size(data):
    clients, test, _ = data
    head = MLPHead(D, C, 8)
    dyn = run_fedfac(head, clients, test, FLConfig(rounds=3, seed=1, optimizer="adam", lr=1e-2, fa_epochs=3),
                     dynamic=True)
    assert len(dyn["switching"]) == 3 and all(0.0 <= v <= 1.0 for v in dyn["switching"])
    moved = [len(set(a[1].tolist()) ^ set(b[1].tolist())) / 8 for a, b in zip(dyn["splits"], dyn["splits"][1:])]
    assert dyn["switching"] == moved
    rnd = run_fedfac(head, clients, test, FLConfig(rounds=1, seed=1, split="random", personal_fraction=0.25))
    assert len(rnd["splits"][0][1]) == 2


def test_correlation_from_summed_grams_equals_pooled_correlation():
    rng = np.random.default_rng(3)
    blocks = [rng.normal(size=(7, 5)) + rng.normal(size=5) for _ in range(4)]
    total = np.sum([fa.gram_contribution(Z) for Z in blocks], axis=0)
    R = fa.correlation_from_sums(total, 5)
    np.testing.assert_allclose(R, np.corrcoef(np.vstack(blocks), rowvar=False), atol=1e-12)


def test_dead_hidden_unit_is_personalised_not_a_nan():
    rng = np.random.default_rng(4)
    blocks = [rng.normal(size=(6, 4)) for _ in range(3)]
    for Z in blocks:
        Z[:, 2] = 0.5  # a unit whose parameters are the same constant everywhere
    R = fa.correlation_from_sums(np.sum([fa.gram_contribution(Z) for Z in blocks], axis=0), 4)
    assert np.all(np.isfinite(R))
    _, personal = fa.factor_split(R, personal_fraction=0.25)
    assert personal.tolist() == [2]


def test_fedfac_server_never_moves_personalised_units(data):
    clients, test, _ = data
    head = MLPHead(D, C, 8)
    cfg = FLConfig(rounds=2, backend="plain", seed=3)
    res = run_fedfac(head, clients, test, cfg)
    pmask = head.unit_mask(res["splits"][-1][1])
    init = head.init(np.random.default_rng(3))
    assert pmask.any()
    np.testing.assert_array_equal(res["theta"][pmask], init[pmask])
    assert not np.array_equal(res["theta"][~pmask], init[~pmask])


def test_refused_run_is_reported_as_refused(data, tmp_path):
    clients, test, (Xtr, ytr) = data
    rows = run_grid((Xtr, ytr, test[0], test[1], C), clients=(3,), partitions=("iid",), seeds=(0,),
                    cfg=FLConfig(rounds=1, update_bound=1e-6), lrs=(1e3, 1.0), only=("FedAvg-linear",), log=lambda m: 0)
    assert len(rows) == 1 and np.isnan(rows[0]["global_acc"])
    md = write_report(rows, None, tmp_path, meta={}).read_text()
    assert "| FedAvg-linear | refused / refused |" in md


def test_factor_analysis_recovers_planted_shared_units():
    # 6 units driven by two common factors, 6 units of independent noise.
    rng = np.random.default_rng(5)
    F = rng.normal(size=(400, 2))
    shared = F @ rng.normal(size=(2, 6)) + 0.2 * rng.normal(size=(400, 6))
    noise = rng.normal(size=(400, 6))
    Z = np.hstack([noise[:, :3], shared[:, :3], noise[:, 3:], shared[:, 3:]])
    R = np.corrcoef(Z, rowvar=False)
    s, p = fa.factor_split(R, personal_fraction=0.5, kappa=0.6)
    assert set(p.tolist()) == {0, 1, 2, 6, 7, 8}
    assert set(s.tolist()) == {3, 4, 5, 9, 10, 11}


@pytest.mark.parametrize("backend", ["secagg", "ckks"])
def test_secure_fedfac_split_equals_plaintext_split(data, backend):
    clients, test, _ = data
    head = MLPHead(D, C, 12)
    rng = np.random.default_rng(1)
    # units 0-5 share two factors, 6-11 are independent: well separated communalities, entries below 1
    loadings = rng.normal(size=(2, 6))
    blocks = []
    for _ in clients:
        shared = rng.normal(size=(D + 1, 2)) @ loadings + 0.1 * rng.normal(size=(D + 1, 6))
        blocks.append(0.1 * np.hstack([shared, rng.normal(size=(D + 1, 6))]))
    cfg = FLConfig(backend=backend, kappa=0.6)
    # the declared bound on the unit blocks (1): ckks floods at the declared magnitude
    gs = SecureSum(backend, fa.gram_length(12), (D + 1) * 1.0, len(clients))
    s_sec, p_sec, _ = secure_split(head, blocks, gs, cfg)
    # Plaintext FedFac: the server stacks the clients' blocks itself.
    s_pl, p_pl = fa.factor_split(np.corrcoef(np.vstack(blocks), rowvar=False), personal_fraction=cfg.personal_fraction,
                                 kappa=cfg.kappa)
    assert p_sec.tolist() == p_pl.tolist() and s_sec.tolist() == s_pl.tolist()
    assert 0 < len(p_sec) < 12


def test_ri_ablation_restored_accuracy_does_not_depend_on_gamma(data):
    clients, test, (Xtr, ytr) = data
    Xte, yte = test
    rows = ri_ablation((Xtr, ytr, Xte, yte, C), clients=(6,), gammas=(0.0, 1.0, 100.0), alpha=0.3)
    restored = {r["sum_with_ri"] for r in rows}
    assert len(restored) == 1 and None not in restored


def test_compare_cli_writes_tables_and_plots(tmp_path, capsys):
    out = tmp_path / "docs"
    rc = main(["compare", "--clients", "3", "--partitions", "iid,dirichlet:0.1", "--seeds", "2", "--rounds", "2",
               "--hidden", "8", "--mu", "0.1", "--verify", "secagg", "--verify-clients", "3", "--verify-rounds", "1",
               "--ri-clients", "3", "--gammas", "0,1", "--out", str(out)])
    assert rc == 0
    md = (out / "COMPARISON.md").read_text()
    for name in ("AFL", "FedAvg-linear", "FedAvg-mlp", "FedProx-linear mu=0.1", "FedProx-mlp mu=0.1",
                 "FedFac-static", "FedFac-dynamic"):
        assert f"| {name} |" in md
    assert "| secagg | FedFac-dynamic | 3 |" in md
    assert "RI ablation" in md and "bytes / hospital / round" in md
    for png in ("comparison_accuracy_vs_alpha.png", "comparison_accuracy_vs_rounds.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # about 30 s on two shared cores: torch start-up and the resnet18 forward
def test_compare_on_client_embedded_images_runs_and_afl_is_the_pooled_closed_form(tmp_path):
    import json

    from secure_afl.analytic import centralised_weights, top1_accuracy
    from secure_afl.clients.statsfile import recorded_extractor
    from secure_afl_tools.baselines.features import embed_digits, load_features

    # Prepare: a few rendered digits through the clients' extraction (random resnet18, CPU)
    npz = tmp_path / "emb.npz"
    res = embed_digits(npz, size=32, seed=0, per_class=6)
    assert res.X.shape == (60, 512) and recorded_extractor(npz)["backbone"] == "resnet18"

    # Execute: the comparison on that file, AFL also through secagg against plain
    out, js = tmp_path / "docs", tmp_path / "rows.json"
    rc = main(["compare", "--features", str(npz), "--clients", "3", "--partitions", "iid", "--seeds", "1",
               "--rounds", "2", "--hidden", "8", "--mu", "0.1", "--methods", "AFL,FedAvg-linear",
               "--verify", "secagg", "--verify-methods", "AFL", "--verify-clients", "3", "--verify-rounds", "1",
               "--ri-clients", "", "--out", str(out), "--json", str(js)])

    # Assert: the report names the features; AFL's accuracy is that of X^+ Y on the pooled training
    # features, and its secure run gives the plain run's head
    assert rc == 0
    md = (out / "COMPARISON.md").read_text()
    assert "| AFL |" in md and "| FedAvg-linear |" in md and "emb.npz" in md and "d = 512" in md
    blob = json.loads(js.read_text())
    assert json.loads((out / "comparison_features.json").read_text()) == blob
    Xtr, ytr, Xte, yte, n_classes = load_features(npz, 0)
    W = centralised_weights(Xtr, ytr, n_classes)
    afl = next(r for r in blob["rows"] if r["method"] == "AFL")
    assert afl["global_acc"] == top1_accuracy(W, Xte, yte)
    afl_head = run_afl([(Xtr[i::3], ytr[i::3]) for i in range(3)], (Xte, yte), n_classes, backend="secagg")
    W_afl = afl_head["theta"][: W.size].reshape(W.shape)
    assert np.allclose(Xte @ W_afl, Xte @ W, rtol=1e-6, atol=1e-6 * np.abs(Xte @ W).max())
    (v,) = blob["verify"]
    assert v["method"] == "AFL" and v["agreement"] == 1.0 and v["max_abs_diff"] <= 1e-6 * np.abs(W).max()


def test_features_file_of_zero_embeddings_is_refused_with_a_reason(tmp_path):
    from secure_afl.clients.statsfile import write_embeddings_file
    from secure_afl_tools.baselines.features import load_features

    # Prepare: an embeddings file in the client's format whose rows are all zero
    path = write_embeddings_file(tmp_path / "zero.npz", np.zeros((20, 4)), np.arange(20) % 2, ["a", "b"])

    # Execute / Assert
    with pytest.raises(InvalidInputError, match="zero"):
        load_features(path, 0)
    with pytest.raises(SystemExit, match="--all"):
        main(["compare", "--all", "--features", str(path), "--out", str(tmp_path)])


def _tiny_study(fixture, **kw):
    from secure_afl_tools.baselines.study import run_study

    grids = {"FedAvg-linear": {"head": "linear", "lr": (0.3, 3.0, 30.0), "local_epochs": (1,), "mu": (0.0,)}}
    fg = {"lr": (1e-3, 1e-2), "local_epochs": (1,), "tau": (0.5, 1.0), "kappa": (0.8,)}
    args = dict(data=_per_seed(fixture), seeds=(1, 2), tune_seed=0, K=4, rounds=3, hidden=8,
                partitions=("dirichlet:0.5",), fedfac_partitions=("dirichlet:0.5",), fa_epochs=2, grids=grids,
                fedfac_grid=fg, dynamic_grid=fg, secure=False, log=lambda *a: None)
    return run_study(**{**args, **kw})


def _per_seed(data, poison=lambda seed, y: y):
    """seed -> that seed's own train/test split of the pooled samples (as the study draws one per seed);
    ``poison(seed, y_test)`` replaces a seed's test labels."""
    _, (Xte, yte), (Xtr, ytr) = data
    X, y = np.concatenate([Xtr, Xte]), np.concatenate([ytr, yte])

    def split(seed):
        order = np.random.default_rng([seed, 5]).permutation(y.size)
        te, tr = order[:yte.size], order[yte.size:]
        return X[tr], y[tr], X[te], poison(seed, y[te].copy()), C
    return split


def _choice(study):
    return sorted((c["method"], c["partition"], c["lr"], c["local_epochs"], c["mu"], c.get("tau"), c.get("kappa"))
                  for c in study["chosen"])


def _reported(study):
    return ([(r["method"], r["seed"], r["global_acc"], r["client_acc_prior"], r["correct"])
             for r in study["finals"] + study["fac_finals"]],
            {s: [(r["seed"], r["global_acc"], r["correct"]) for r in a["seeds"]] for s, a in study["afl"].items()})


def test_study_choice_does_not_move_when_the_test_labels_are_poisoned(data):
    # The choice must come from the tuning seed's validation samples alone: relabelling every seed's test
    # samples (the tuning seed's included) changes every test accuracy and must change no chosen setting.
    clean = _tiny_study(data)
    poisoned = _tiny_study(data, data=_per_seed(data, lambda seed, y: (y + 1) % C))
    assert _choice(clean) == _choice(poisoned)
    assert [r["global_acc"] for r in clean["finals"]] != [r["global_acc"] for r in poisoned["finals"]]


def test_tuning_seed_never_enters_a_reported_cell(data):
    # Poisoning the tuning seed's own test split moves neither the choice nor any reported figure (finals,
    # AFL, which test samples each model gets right); the reported cells are the reported seeds' alone, each
    # on its own test split, and a study that would report its tuning seed is refused.
    clean = _tiny_study(data)
    poisoned = _tiny_study(data, data=_per_seed(data, lambda seed, y: (y + 1) % C if seed == 0 else y))
    assert _choice(clean) == _choice(poisoned)
    assert _reported(clean) == _reported(poisoned)
    assert {r["seed"] for r in clean["finals"] + clean["fac_finals"]} == {1, 2}
    assert all(r["data_seed"] == r["seed"] for r in clean["finals"] + clean["fac_finals"])
    assert clean["meta"]["tune_seed"] == 0 and clean["meta"]["seeds"] == [1, 2]
    assert clean["meta"]["test_labels"]["1"] != clean["meta"]["test_labels"]["2"]  # a test split per seed
    with pytest.raises(InvalidInputError, match="must not be reported"):
        _tiny_study(data, seeds=(0, 1), tune_seed=0)


def test_study_reports_a_chosen_setting_on_the_edge_of_its_grid(data):
    from secure_afl_tools.baselines.study import grid_edges

    # a two-point step grid: whichever step wins sits on an edge, and the study's own output says so
    study = _tiny_study(data, grids={"FedAvg-linear": {"head": "linear", "lr": (1e-4, 1e-3), "local_epochs": (1,),
                                                       "mu": (0.0,)}})
    lr = next(c["lr"] for c in study["chosen"] if c["method"] == "FedAvg-linear")
    edge = [e for e in study["edges"] if e["method"] == "FedAvg-linear"]
    assert edge == [{"method": "FedAvg-linear", "partition": "dirichlet:0.5", "axis": "lr", "value": lr,
                     "side": "low" if lr == 1e-4 else "high", "grid": [1e-4, 1e-3], "hard_limit": False}]
    # the three-point grid of the other tests brackets its choice there: nothing reported for it
    bracketed = _tiny_study(data)
    lr3 = next(c["lr"] for c in bracketed["chosen"] if c["method"] == "FedAvg-linear")
    assert lr3 == 3.0 and not [e for e in bracketed["edges"] if e["method"] == "FedAvg-linear"]
    # an interior choice is not reported; one local epoch is a hard limit, reported as such
    axes = {"lr": (1.0, 3.0, 10.0), "local_epochs": (1, 5)}
    got = grid_edges({("m", "p"): {"lr": 3.0, "local_epochs": 1}}, lambda m: axes)
    assert got == [{"method": "m", "partition": "p", "axis": "local_epochs", "value": 1, "side": "low",
                    "grid": [1, 5], "hard_limit": True}]


def test_label_prior_is_applied_to_each_personal_model(data):
    from secure_afl_tools.baselines.fl import client_label_mix
    from secure_afl_tools.baselines.study import label_prior_accuracy

    clients, test, _ = data
    head = MLPHead(D, C, 8)
    res = run_fedfac(head, clients, test, FLConfig(rounds=2, seed=0, optimizer="adam", lr=1e-2))
    mix = client_label_mix(clients, C)
    per_model = label_prior_accuracy(head, res["models"], test, mix)
    # hospital k's prior accuracy is that of its own model, not of anyone else's
    for k, m in enumerate(res["models"]):
        assert per_model[k] == pytest.approx(label_prior_accuracy(head, m, test, mix)[k], abs=1e-12)
    assert np.all(per_model >= res["per_client"] - 1e-12)


def test_paired_tests_read_the_same_accuracies_the_tables_print(data):
    # what the tests resample is what was measured: at the full sample (no resampling) each paired test's
    # difference is the difference of the reported means, for global models and for FedFac's personal ones
    from secure_afl_tools.baselines.study_report import compare_rows

    study = _tiny_study(data)
    afl = study["afl"]["dirichlet:0.5"]["seeds"]
    for method, rows in (("FedAvg-linear", study["finals"]), ("FedFac-static", study["fac_finals"])):
        rs = [r for r in rows if r["method"] == method]
        for kind, key in (("global", "global_acc"), ("client", "client_acc"), ("prior", "client_acc_prior")):
            got = compare_rows(study, afl, rs, kind)
            want = np.mean([r[key] for r in afl]) - np.mean([r[key] for r in rs])
            assert got["diff"] == pytest.approx(want, abs=1e-12), (method, kind)
        got = compare_rows(study, afl, rs, "global")
        assert got["test"] == "bootstrap over seeds and images"
        # the study's two seeds split one pool of samples: the test images they share count once
        assert got["samples"] == sum(len(v) for v in study["meta"]["test_ids"].values()) > got["images"]
    # the stored ids name the pooled sample each test row is, whatever seed drew it (``_per_seed``'s split)
    n_test = data[1][1].size
    te = {s: np.random.default_rng([s, 5]).permutation(400)[:n_test] for s in (1, 2)}
    ids = study["meta"]["test_ids"]
    same_id = np.equal.outer(np.asarray(ids["1"]), np.asarray(ids["2"]))
    assert np.array_equal(same_id, np.equal.outer(te[1], te[2])) and same_id.any()
