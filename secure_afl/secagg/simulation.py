"""In-process simulation of a whole secagg round (benchmark entry point)."""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .._validation import check_real, param_error
from ..exceptions import InvalidParameterError
from ..hazmat import fixedpoint
from ..params import SessionParams
from .backend import SecAggBackend
from .client import SecAggClient
from .messages import MaskedInput, decode_message
from .server import SecAggServerRound

__all__ = ["simulate_round", "identities"]


def identities(n: int) -> tuple[dict[int, Ed25519PrivateKey], dict]:
    """Fresh Ed25519 identity keys for ids ``1..n`` (private by id, public by id) for in-process rounds."""
    priv = {u: Ed25519PrivateKey.generate() for u in range(1, n + 1)}
    return priv, {u: k.public_key() for u, k in priv.items()}


def simulate_round(params: SessionParams, vectors: Sequence, dropout: float = 0.0, rng=None):
    """Run the whole protocol in-process for ``K = len(vectors)`` hospitals (ids 1..K).

    Parameters
    ----------
    params : SessionParams
        From :func:`secagg_session_params` with ``n_parties >= K``.
    vectors : sequence of K float64 vectors of length L
        Indexed lazily (``vectors[i]``), so a generator-backed sequence keeps
        memory at O(L).
    dropout : float in [0, 1)
        Fraction of hospitals (``round(dropout * K)``, chosen by ``rng``) that
        drop after SHARE_KEYS, before sending their masked input.
    rng : numpy Generator, int or None
        Chooses who drops.

    Returns
    -------
    aggregate : ndarray of float64
        Revealed sum of the survivors' vectors.
    exact : bool
        Revealed fixed-point sum == plaintext fixed-point sum of the survivors, bit for bit.
    timings : dict
        Seconds: ``setup``, ``advertise_keys``, ``share_keys``, ``protect_total``,
        ``protect_per_client`` (MASKED_INPUT stage of one hospital: decrypt shares,
        encode, masks, seal), ``combine`` (server streaming sum),
        ``unmask_clients``, ``reveal`` (reconstruction + mask removal), ``total``;
        plus ``survivors``: the 0-based indices of the summed vectors.
    bytes_per_client : int
        Mean bytes a surviving hospital uploads over all five stages.

    Raises
    ------
    InsufficientShares
        Dropout left some hospital with fewer than ``threshold`` surviving
        share holders: the round aborts and nothing is revealed.
    """
    backend = SecAggBackend(params)
    K = len(vectors)
    if not 2 <= K <= backend.cfg.n_parties:
        raise InvalidParameterError(
            f"simulate_round needs 2 <= K <= n_parties={backend.cfg.n_parties} vectors; got K={K}"
        )
    dropout = check_real("dropout", dropout, "simulate_round", low=0.0)
    if dropout >= 1.0:
        raise param_error("dropout", "simulate_round", "a float in the range [0, 1)", dropout)
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    ids = list(range(1, K + 1))
    n_drop = int(round(dropout * K))
    drops = set(int(i) for i in gen.choice(ids, size=n_drop, replace=False)) if n_drop else set()
    timings: dict[str, float] = {}
    up = {u: 0 for u in ids}
    t_start = time.perf_counter()

    priv, pub = identities(K)
    server = SecAggServerRound(params, participants=ids, identity_keys=pub)
    clients = {u: SecAggClient(params, u, priv[u], pub) for u in ids}

    def run_stage(name: str, answer) -> None:
        t0 = time.perf_counter()
        for u in sorted(server.active):
            resp = answer(u, server.request(u))
            if resp is None:
                continue
            data = resp.to_bytes()
            up[u] += len(data)
            server.receive(decode_message(data))
        server.close_stage()
        timings[name] = time.perf_counter() - t0

    run_stage("setup", lambda u, r: clients[u].setup(r))
    run_stage("advertise_keys", lambda u, r: clients[u].advertise_keys(r))
    run_stage("share_keys", lambda u, r: clients[u].share_keys(r))

    # Stage 3: survivors mask and upload; the server streams them into its sum.
    protect_s, combine_s = 0.0, 0.0
    reference = np.zeros(fixedpoint.n_words(params.layout.length), dtype=np.uint64)
    t0 = time.perf_counter()
    for u in sorted(server.active):
        req = server.request(u)
        if u in drops:
            continue
        vec = vectors[u - 1]
        a = time.perf_counter()
        payload = backend.protect(vec, client=clients[u], request=req)
        b = time.perf_counter()
        server.receive(MaskedInput.from_bytes(payload))
        c = time.perf_counter()
        protect_s += b - a
        combine_s += c - b
        up[u] += len(payload)
        np.add(reference, fixedpoint.encode(vec, backend.cfg.frac_bits), out=reference)
    a = time.perf_counter()
    server.close_stage()
    combine_s += time.perf_counter() - a
    timings["masked_input"] = time.perf_counter() - t0
    n_surv = len(server.survivors_)
    timings["protect_total"] = protect_s
    timings["protect_per_client"] = protect_s / max(n_surv, 1)
    timings["combine"] = combine_s

    t0 = time.perf_counter()
    for u in sorted(server.active):
        data = clients[u].sign_survivors(server.survivors_).to_bytes()
        up[u] += len(data)
        server.receive(decode_message(data))
    responses = []
    for u in sorted(server.active):
        data = clients[u].unmask(server.request(u)).to_bytes()
        up[u] += len(data)
        responses.append(data)
    timings["unmask_clients"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for data in responses:
        server.receive(decode_message(data))
    server.close_stage()
    timings["reveal"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start

    exact = bool(np.array_equal(server.fixed_point_sum_, reference))
    timings["survivors"] = [u - 1 for u in server.survivors_]  # 0-based indices into ``vectors``
    bytes_per_client = int(round(sum(up[u] for u in server.survivors_) / max(n_surv, 1)))
    return server.aggregate_vector_, exact, timings, bytes_per_client

