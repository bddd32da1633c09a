"""FedAvg, FedProx and FedFac with every round's aggregation a secure sum.

Client k holds (X_k, y_k) with n_k > 0 samples. Each round it trains locally
(``local_epochs`` of mini-batch SGD, FedProx adds ``mu/2 ||theta - theta_global||^2``)
and contributes ``[n_k * delta_k, n_k]`` to the round's :class:`SecureSum`;
the server learns ``sum_k n_k delta_k`` and ``N`` and applies
``theta += server_lr * sum / N`` (McMahan et al.'s weighted average of updates).

FedFac (Wang, Tang and Li): hidden units of the MLP head are split by factor
analysis (:mod:`.fedfac`) into shared units, averaged as above, and
personalised units, which never leave the client (their entries of the
contribution are zero). Static: one split, from the clients' locally trained
models before the first round. Dynamic: a fresh split every round from the clients'
updates. The factor analysis runs on a second secure sum (per-client Grams), so
the server never sees a client's parameters either.

Evaluation. Global accuracy: the model on the pooled test set. Per-client
accuracy: client k's model on a test distribution with client k's label
mix, ``sum_c p_kc acc_c`` (acc_c the accuracy on test samples of class c),
as in FedFac's personalised evaluation; reported as the mean over clients.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from secure_afl.exceptions import InvalidInputError
from secure_afl_tools.baselines import fedfac as fa
from secure_afl_tools.baselines.heads import MLPHead
from secure_afl_tools.baselines.securesum import SecureSum

__all__ = ["FLConfig", "run_fedavg", "run_fedfac", "evaluate", "client_label_mix"]


@dataclass(frozen=True)
class FLConfig:
    rounds: int = 30
    local_epochs: int = 1
    batch_size: int = 32
    lr: float = 1.0
    server_lr: float = 1.0
    mu: float = 0.0                  # FedProx proximal weight; 0 is FedAvg
    backend: str = "plain"
    update_bound: float = 100.0      # declared bound on |delta| entries (and FedFac's unit blocks)
    personal_fraction: float = 0.5   # FedFac tau as a proportion of hidden units
    kappa: float = 0.8               # FedFac cumulative-variance threshold for the factor count
    seed: int = 0
    eval_every: int = 1
    optimizer: str = "sgd"           # local optimiser: 'sgd' or 'adam' (state reset every round)
    fa_epochs: int = 0               # FedFac static: local epochs before the split; > 0 splits on the updates
    split: str = "fa"                # FedFac: 'fa' (factor analysis) or 'random' (ablation, same size)
    fa_bound: float | None = None    # FedFac: declared bound on |unit-block entries| in the FA sum (None: update_bound)


def client_label_mix(clients, n_classes: int) -> np.ndarray:
    return np.array([np.bincount(y, minlength=n_classes) / y.size for _, y in clients])


def _per_class_acc(pred, yte, n_classes):
    acc = np.zeros(n_classes)
    for c in range(n_classes):
        m = yte == c
        acc[c] = np.mean(pred[m] == c) if m.any() else 0.0
    return acc


def evaluate(head, thetas, test, mix):
    """(global accuracy, mean per-client accuracy, per-client array).

    ``thetas`` is one vector (a global model) or one per client (personalised);
    a personalised run's global accuracy is the mean over clients of each
    personal model on the pooled test set.
    """
    Xte, yte = test
    C = mix.shape[1]
    if isinstance(thetas, np.ndarray) and thetas.ndim == 1:
        pred = head.predict(thetas, Xte)
        per = mix @ _per_class_acc(pred, yte, C)
        return float(np.mean(pred == yte)), float(per.mean()), per
    glob, per = [], []
    for k, th in enumerate(thetas):
        pred = head.predict(th, Xte)
        glob.append(np.mean(pred == yte))
        per.append(mix[k] @ _per_class_acc(pred, yte, C))
    per = np.array(per)
    return float(np.mean(glob)), float(per.mean()), per


def local_train(head, theta, X, y, cfg: FLConfig, rng, anchor=None, epochs: int | None = None):
    """``local_epochs`` of mini-batch SGD (or Adam) from ``theta``; FedProx pulls towards ``anchor``.

    Adam's moments start from zero every round: a client keeps no optimiser
    state between rounds, as in FedFac's reference setting."""
    theta = theta.copy()
    n = y.size
    bs = min(cfg.batch_size, n)
    adam = cfg.optimizer == "adam"
    if cfg.optimizer not in ("sgd", "adam"):
        raise InvalidInputError(f"optimizer must be 'sgd' or 'adam'; got {cfg.optimizer!r}")
    if adam:
        m1, m2, t = np.zeros_like(theta), np.zeros_like(theta), 0
    for _ in range(cfg.local_epochs if epochs is None else epochs):
        order = rng.permutation(n)
        for s in range(0, n, bs):
            idx = order[s:s + bs]
            _, g = head.loss_grad(theta, X[idx], y[idx])
            if cfg.mu > 0.0 and anchor is not None:
                g = g + cfg.mu * (theta - anchor)
            if adam:
                t += 1
                m1 = 0.9 * m1 + 0.1 * g
                m2 = 0.999 * m2 + 0.001 * g * g
                theta -= cfg.lr * (m1 / (1 - 0.9 ** t)) / (np.sqrt(m2 / (1 - 0.999 ** t)) + 1e-8)
            else:
                theta -= cfg.lr * g
    return theta


def _check_clients(clients):
    clients = [(np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.int64)) for X, y in clients]
    if any(y.size == 0 for _, y in clients):
        raise InvalidInputError("every client passed to a run must hold at least one sample")
    if len(clients) < 2:
        raise InvalidInputError("a federated run needs at least two clients with data")
    return clients


def _weighted(delta, n):
    return np.concatenate([n * delta, [float(n)]])


def _rng(cfg, r, k):
    return np.random.default_rng([cfg.seed, r, k])


def run_fedavg(head, clients, test, cfg: FLConfig, *, session: str = "fedavg"):
    """FedAvg (``cfg.mu == 0``) or FedProx. Returns a result dict (model, history, bytes, seconds)."""
    clients = _check_clients(clients)
    t0 = time.perf_counter()
    mix = client_label_mix(clients, head.n_classes)
    n_max = max(y.size for _, y in clients)
    ss = SecureSum(cfg.backend, head.size + 1, max(1.0, n_max * cfg.update_bound), len(clients), session=session)
    theta = head.init(np.random.default_rng(cfg.seed))
    history = []
    for r in range(1, cfg.rounds + 1):
        contrib = []
        for k, (X, y) in enumerate(clients):
            local = local_train(head, theta, X, y, cfg, _rng(cfg, r, k), anchor=theta)
            contrib.append(_weighted(local - theta, y.size))
        total = ss.sum(contrib)
        theta = theta + cfg.server_lr * total[:-1] / total[-1]
        if r % cfg.eval_every == 0 or r == cfg.rounds:
            g, p, _ = evaluate(head, theta, test, mix)
            history.append((r, g, p))
    g, p, per = evaluate(head, theta, test, mix)
    return {"theta": theta, "history": history, "global_acc": g, "client_acc": p, "per_client": per,
            "rounds": cfg.rounds, "bytes_per_round": float(np.mean(ss.bytes_up)),
            "err_ratio": float(max(ss.err_ratio)), "seconds": time.perf_counter() - t0}


def secure_split(head: MLPHead, blocks, ss: SecureSum, cfg: FLConfig, rng=None):
    """(shared, personalised, R) from the clients' (d+1) x h blocks through one secure sum.

    ``cfg.split == 'random'`` (the ablation) personalises a uniformly random set of
    the same size instead, drawn from ``rng``; R is still computed, for the report."""
    R = fa.correlation_from_sums(ss.sum([fa.gram_contribution(Z) for Z in blocks]), head.hidden)
    if cfg.split == "random":
        h = head.hidden
        n_personal = int(round(cfg.personal_fraction * h))
        perm = (rng if rng is not None else np.random.default_rng(cfg.seed)).permutation(h)
        return np.sort(perm[n_personal:]), np.sort(perm[:n_personal]), R
    if cfg.split != "fa":
        raise InvalidInputError(f"split must be 'fa' or 'random'; got {cfg.split!r}")
    shared, personal = fa.factor_split(R, personal_fraction=cfg.personal_fraction, kappa=cfg.kappa)
    return shared, personal, R


def offdiag_mean_abs(R: np.ndarray) -> float:
    """Mean |R_ij| over i != j: 0 for a correlation matrix that is the identity."""
    h = R.shape[0]
    return float((np.abs(R).sum() - np.abs(np.diag(R)).sum()) / max(h * (h - 1), 1))


def run_fedfac(head: MLPHead, clients, test, cfg: FLConfig, *, dynamic: bool = False, session: str = "fedfac"):
    """FedFac on the one-hidden-layer head; personalised models, one per client."""
    if not isinstance(head, MLPHead):
        raise InvalidInputError("FedFac splits hidden units: it needs the MLP head")
    clients = _check_clients(clients)
    t0 = time.perf_counter()
    mix = client_label_mix(clients, head.n_classes)
    n_max = max(y.size for _, y in clients)
    K = len(clients)
    ss = SecureSum(cfg.backend, head.size + 1, max(1.0, n_max * cfg.update_bound), K, session=session)
    rows = head.dim + 1
    # ckks floods at the declared magnitude, and the Gram squares it: a loose bound on the unit blocks
    # buries R in noise, so the FA sum takes its own (tighter) declared bound
    fa_bound = cfg.update_bound if cfg.fa_bound is None else cfg.fa_bound
    gs = SecureSum(cfg.backend, fa.gram_length(head.hidden), rows * max(fa_bound ** 2, fa_bound, 1.0), K,
                   session=session + "-gram")
    theta = head.init(np.random.default_rng(cfg.seed))
    # Initialisation: local models from the common start, split from their hidden-unit blocks.
    # After a single epoch the weights are still almost their random initialisation, whose columns are
    # uncorrelated, so R is close to I and the split is arbitrary; with fa_epochs > 0 the clients train
    # that long and the split is computed on their updates (theta_k - theta_0), which carry only what
    # was learned.
    split_rng = np.random.default_rng([cfg.seed, 7])
    if cfg.fa_epochs > 0:
        local = [local_train(head, theta, X, y, cfg, _rng(cfg, 0, k), epochs=cfg.fa_epochs)
                 for k, (X, y) in enumerate(clients)]
        blocks = [head.unit_block(t - theta) for t in local]
    else:
        local = [local_train(head, theta, X, y, cfg, _rng(cfg, 0, k)) for k, (X, y) in enumerate(clients)]
        blocks = [head.unit_block(t) for t in local]
    shared, personal, R0 = secure_split(head, blocks, gs, cfg, split_rng)
    splits = [(shared, personal)]
    r_offdiag = [offdiag_mean_abs(R0)]
    switching = []
    own = [theta.copy() for _ in clients]  # each client's copy; only its personalised entries are used
    history = []
    for r in range(1, cfg.rounds + 1):
        pmask = head.unit_mask(personal)
        starts = [np.where(pmask, own[k], theta) for k in range(K)]
        new = [local_train(head, starts[k], X, y, cfg, _rng(cfg, r, k)) for k, (X, y) in enumerate(clients)]
        if dynamic:
            before = set(personal.tolist())
            shared, personal, R = secure_split(head, [head.unit_block(new[k] - starts[k]) for k in range(K)], gs,
                                               cfg, split_rng)
            splits.append((shared, personal))
            r_offdiag.append(offdiag_mean_abs(R))
            switching.append(len(before ^ set(personal.tolist())) / head.hidden)  # share of units that changed side
            pmask = head.unit_mask(personal)
        # A shared unit's update is taken against the global model, not the client's start: a unit that was
        # personal last round started from the client's own copy, and adding (new - own) to the global entry
        # (frozen since the unit went personal) would set it to a stale value plus a small step. Against
        # theta, the server's sum is the n-weighted mean of the clients' new values, FedAvg on that unit.
        # For a unit that stays shared, starts[k] == theta there, so static FedFac is unchanged.
        contrib = [_weighted(np.where(pmask, 0.0, new[k] - theta), clients[k][1].size) for k in range(K)]
        total = ss.sum(contrib)
        theta = theta + cfg.server_lr * total[:-1] / total[-1]  # personalised entries summed zeros
        own = new
        if r % cfg.eval_every == 0 or r == cfg.rounds:
            g, p, _ = evaluate(head, [np.where(pmask, own[k], theta) for k in range(K)], test, mix)
            history.append((r, g, p))
    pmask = head.unit_mask(personal)
    models = [np.where(pmask, own[k], theta) for k in range(K)]
    g, p, per = evaluate(head, models, test, mix)
    per_round = np.mean(ss.bytes_up) + (np.mean(gs.bytes_up) * len(gs.bytes_up) / cfg.rounds)
    return {"theta": theta, "models": models, "history": history, "global_acc": g, "client_acc": p,
            "per_client": per, "rounds": cfg.rounds, "bytes_per_round": float(per_round), "splits": splits,
            "switching": switching, "r_offdiag": r_offdiag, "err_ratio": float(max(ss.err_ratio + gs.err_ratio)),
            "seconds": time.perf_counter() - t0}
