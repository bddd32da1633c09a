"""AFL's own runs for the comparison: the closed-form head, plain or through a secure backend, and under
ckks through the key holder's flooded release (the path the service takes)."""

from __future__ import annotations

import time

import numpy as np

from secure_afl.analytic import solve_head
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.stats import local_statistics
from secure_afl_tools.baselines.fl import client_label_mix, evaluate
from secure_afl_tools.baselines.heads import LinearHead
from secure_afl_tools.baselines.securesum import SecureSum

__all__ = ["run_afl", "afl_ckks_release"]


def run_afl(clients, test, n_classes: int, *, backend: str = "plain", gamma: float = 1.0, session: str = "afl"):
    """AFL: one secure sum of the packed (C_k^r, Q_k, n_k, counts), RI restoration, solve."""
    t0 = time.perf_counter()
    d = clients[0][0].shape[1]
    layout = Layout(d, n_classes)
    B = max(float(np.max(np.linalg.norm(X, axis=1))) for X, _ in clients)
    bounds = Bounds(B * (1 + 1e-9), max(y.size for _, y in clients), len(clients))
    extra = {}
    if backend == "ckks":
        W, up, extra = afl_ckks_release(clients, n_classes, layout, bounds, gamma, session)
        bytes_up = [up]
    else:
        ss = SecureSum(backend, layout.length, bounds.hospital_bound(gamma), len(clients), session=session)
        total = ss.sum([layout.pack(local_statistics(X, y, n_classes, gamma=gamma)) for X, y in clients])
        agg = layout.unpack(total, gamma=gamma)
        C = agg.gram.copy()
        C[np.diag_indices(d)] -= round(agg.contributors) * gamma  # RI restoration, K from the aggregate itself
        W = solve_head(C, agg.cross)
        bytes_up = ss.bytes_up
    head = LinearHead(d, n_classes)
    theta = np.concatenate([W.ravel(), np.zeros(n_classes)])
    g, p, per = evaluate(head, theta, test, client_label_mix(clients, n_classes))
    return {"theta": theta, "history": [(1, g, p)], "global_acc": g, "client_acc": p, "per_client": per,
            "rounds": 1, "bytes_per_round": float(np.mean(bytes_up)), "seconds": time.perf_counter() - t0, **extra}


def afl_ckks_release(clients, n_classes: int, layout: Layout, bounds: Bounds, gamma: float, session: str):
    """AFL under ckks as the service's key holder releases it: (W, bytes per hospital, report).

    A fresh session key; every hospital encrypts its packed statistics; the
    server adds ciphertexts blind; the key holder decrypts once and floods the
    raw decryption with its own two-stage plan (``keyholder/flooding.py``)
    before anything reads it; the statistics checks run at the flooding's
    proved tolerance; the ridge is added only where the key holder adds it
    (the released C's smallest eigenvalue within twice the noise's spectral
    bound); W = solve of the restored, rounded-count statistics.
    """
    import dataclasses

    from secure_afl.analytic import solve_from_sums
    from secure_afl.backends import get_backend
    from secure_afl.backends.ckks import new_ckks_session
    from secure_afl.envelope import open_envelope
    from secure_afl.keyholder.flooding import flood_decryption, flood_plan, release_norms
    from secure_afl.certify import FLOOD_TAIL
    from secure_afl.keyholder.release import ridge_if_needed
    from secure_afl.release_checks import sanity_check

    K = len(clients)
    params, keys = new_ckks_session(f"{session}-ckks", layout, gamma, bounds)
    be = get_backend(params)
    comb = be.combiner(public_context=keys.public_context)
    sizes = []
    for X, y in clients:
        payload = be.protect(layout.pack(local_statistics(X, y, n_classes, gamma=gamma)),
                             public_context=keys.public_context)
        sizes.append(len(payload))
        comb.add(payload)
    ctx = be.keyholder_context(keys.secret_context)
    chunks = be.load_partial(ctx, open_envelope(params, comb.aggregate(), "aggregate").body)
    plan = flood_plan(be, K)
    fl = flood_decryption(plan, be, ctx, chunks)
    be.check_range(fl.vector, fl.tol)
    spectral, _ = release_norms(plan, fl, layout.dim, layout.n_classes, FLOOD_TAIL)
    stats = layout.unpack(fl.vector, gamma=gamma)
    sanity_check(stats, params, K, abs_tol=fl.tol, count_tol=fl.count_tol, spectral_tol=spectral)
    stats = dataclasses.replace(stats, contributors=float(K), n=float(np.round(stats.n)),
                                class_counts=np.round(stats.class_counts))
    ridge = ridge_if_needed(stats, spectral)
    W = solve_from_sums(stats, lam=ridge)
    return W, float(np.mean(sizes)), {"flood_sigma": float(fl.sigma), "flood_tol": float(fl.tol),
                                      "flood_kl_log2": float(fl.kl_log2), "ridge": float(ridge)}
