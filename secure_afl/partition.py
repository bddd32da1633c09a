"""Partitioners used in the AFL paper's experiments.

* :func:`iid`        uniform random split into K nearly equal parts;
* :func:`dirichlet`  NIID-1: for every class, proportions p ~ Dir(alpha 1_K)
                     split that class's samples among the K clients;
* :func:`shards`     NIID-2: sort by label, cut into K*s equal shards, give each
                     client exactly s shards (s = shards per client).

All return a list of K index arrays that partition ``range(len(labels))``.

Clients with no sample: with small alpha many clients receive nothing (at
alpha = 0.005 most clients get one class or none). We do not redraw until
every client is non-empty (the reference code's loop can spin for ever); an
empty client is returned as an empty index array and simply does not take part
(a hospital with no data has no statistics to upload: the library refuses an
empty accumulator, see :class:`secure_afl.stats.StatisticsAccumulator`).
"""

from __future__ import annotations

import numpy as np

from ._validation import check_int, check_real
from .exceptions import InvalidInputError

__all__ = ["iid", "dirichlet", "shards", "partition", "parse_partition"]


def _labels(labels) -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1 or y.size == 0 or y.dtype.kind not in "iu":
        raise InvalidInputError("labels must be a non-empty 1-D integer array")
    return y


def iid(labels, n_clients: int, *, seed: int | None = 0) -> list[np.ndarray]:
    y = _labels(labels)
    check_int("n_clients", n_clients, "iid", low=1)
    rng = np.random.default_rng(seed)
    return [np.sort(p) for p in np.array_split(rng.permutation(y.size), n_clients)]


def _dirichlet_rows(rng: np.random.Generator, alpha: float, k: int, rows: int) -> np.ndarray:
    """Dir(alpha 1_k) draws, stable for tiny alpha.

    Gamma(alpha) underflows to 0 for alpha ~ 1e-3, so sample in log space:
    G = G' U^(1/alpha) with G' ~ Gamma(alpha + 1), U ~ U(0, 1) (Marsaglia-Tsang
    boosting), then normalise with log-sum-exp.
    """
    log_g = np.log(rng.gamma(alpha + 1.0, size=(rows, k))) + np.log(rng.random((rows, k))) / alpha
    log_g -= log_g.max(axis=1, keepdims=True)
    p = np.exp(log_g)
    return p / p.sum(axis=1, keepdims=True)


def dirichlet(labels, n_clients: int, alpha: float, *, seed: int | None = 0) -> list[np.ndarray]:
    """NIID-1 split. O(N log N); no rejection loop, so tiny alpha cannot hang."""
    y = _labels(labels)
    check_int("n_clients", n_clients, "dirichlet", low=1)
    alpha = check_real("alpha", alpha, "dirichlet", low=0.0, low_open=True)
    rng = np.random.default_rng(seed)
    classes = np.unique(y)
    props = _dirichlet_rows(rng, alpha, n_clients, classes.size)
    owner = np.empty(y.size, dtype=np.int64)
    for row, c in zip(props, classes):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        # Cut points from the cumulative proportions: client j gets
        # round(N_c * cumsum) boundaries, so every sample has exactly one owner.
        cuts = np.round(np.cumsum(row)[:-1] * idx.size).astype(np.int64)
        owner[idx] = np.repeat(np.arange(n_clients), np.diff(np.concatenate(([0], cuts, [idx.size]))))
    order = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[order], np.arange(n_clients + 1))
    return [np.sort(order[bounds[j]:bounds[j + 1]]) for j in range(n_clients)]


def shards(labels, n_clients: int, shards_per_client: int, *, seed: int | None = 0) -> list[np.ndarray]:
    """NIID-2 split: each client receives exactly ``shards_per_client`` shards."""
    y = _labels(labels)
    check_int("n_clients", n_clients, "shards", low=1)
    s = check_int("shards_per_client", shards_per_client, "shards", low=1)
    n_shards = n_clients * s
    if n_shards > y.size:
        raise InvalidInputError(
            f"n_clients * shards_per_client = {n_shards} exceeds the {y.size} samples; "
            "lower `shards_per_client` or the number of clients"
        )
    rng = np.random.default_rng(seed)
    # Shuffle first so ties within a class are split at random, then sort by label.
    perm = rng.permutation(y.size)
    by_label = perm[np.argsort(y[perm], kind="stable")]
    pieces = np.array_split(by_label, n_shards)
    assign = rng.permutation(n_shards).reshape(n_clients, s)
    return [np.sort(np.concatenate([pieces[i] for i in row])) for row in assign]


def parse_partition(spec: str) -> tuple[str, float | None]:
    """'iid' | 'dirichlet:A' | 'shards:S' -> (kind, argument)."""
    if spec == "iid":
        return "iid", None
    kind, _, arg = spec.partition(":")
    try:
        if kind == "dirichlet" and arg:
            return kind, float(arg)
        if kind == "shards" and arg:
            return kind, int(arg)
    except ValueError:
        pass
    raise InvalidInputError(f"partition must be iid, dirichlet:ALPHA or shards:S; got {spec!r}")


def partition(labels, n_clients: int, spec: str, *, seed: int | None = 0) -> list[np.ndarray]:
    kind, arg = parse_partition(spec)
    if kind == "iid":
        return iid(labels, n_clients, seed=seed)
    if kind == "dirichlet":
        return dirichlet(labels, n_clients, arg, seed=seed)
    return shards(labels, n_clients, int(arg), seed=seed)
