"""A curious server against every backend's upload (plain, ckks, secagg), two hospitals' subtraction of
the aggregate, and differencing of two releases (threat_model/THREAT_MODEL.md)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from secure_afl.backends import get_backend
from secure_afl.exceptions import PolicyViolation
from secure_afl.hazmat import fixedpoint
from secure_afl.secagg import SecAggBackend, secagg_session_params
from secure_afl.secagg import SecAggClient, SecAggServerRound, decode_message, identities

from .attack_common import CLASSES, DIM, GAMMA, attack_bounds, attack_layout, embeddings, packed_vector, plain_params, read_plain_payload, say, singleton_from_stats, workdir


# ---------------------------------------------------------------------------
# curious server vs plaintext statistics
# ---------------------------------------------------------------------------
def attack_plain_singleton(*, seed: int = 0, verbose: bool = True, **_) -> dict:
    """A hospital with n_k = 1 uploads plain statistics; the server reads x exactly."""

    rng = np.random.default_rng(seed)
    params = plain_params("attack-plain")
    X, y = embeddings(rng, 1)
    payload = get_backend(params).protect(packed_vector(X, y))

    stats = read_plain_payload(payload)  # the server's view
    label = int(np.argmax(stats.class_counts))
    x_hat = singleton_from_stats(stats, label)
    C = stats.gram - GAMMA * np.eye(DIM)
    err = float(np.max(np.abs(x_hat - X[0])))
    gram_err = float(np.max(np.abs(C - np.outer(x_hat, x_hat))))
    outcome = "recovered" if err < 1e-9 and label == int(y[0]) else "refused"
    say(verbose, f"[plain-singleton] {outcome.upper()}: x read with max error {err!r}; label {label} "
                  f"(true {int(y[0])}); C = x x^T holds to {gram_err:.1e}")
    return {"attack": "plain-singleton", "outcome": outcome, "max_error": err, "gram_error": gram_err,
            "label": label, "true_label": int(y[0])}


def attack_plain_singleton_class(*, seed: int = 0, verbose: bool = True, **_) -> dict:
    """A class with one sample inside a 40-sample hospital: x = Q[:, c] exactly."""
    from secure_afl.backends import get_backend

    rng = np.random.default_rng(seed)
    params = plain_params("attack-plain")
    labels = np.array([0] * 20 + [1] * 19 + [2])  # class 2 is one patient
    X, y = embeddings(rng, len(labels), labels)
    payload = get_backend(params).protect(packed_vector(X, y))

    stats = read_plain_payload(payload)
    singles = [int(c) for c in np.flatnonzero(stats.class_counts == 1)]
    recovered = {c: singleton_from_stats(stats, c) for c in singles}
    err = max(float(np.max(np.abs(recovered[c] - X[y == c][0]))) for c in singles)
    outcome = "recovered" if err < 1e-9 else "refused"
    say(verbose, f"[plain-singleton-class] {outcome.upper()}: x read with max error {err!r} (class {singles} has "
                  f"one sample among n_k = {int(stats.n)})")
    return {"attack": "plain-singleton-class", "outcome": outcome, "max_error": err,
            "singleton_classes": singles, "n": int(stats.n)}


def attack_k2_subtraction(*, seed: int = 0, verbose: bool = True, dp: float | None = None, **_) -> dict:
    """K = 2: hospital A subtracts its own statistics from the released aggregate.

    With ``dp=EPS`` the session declares distributed DP at that epsilon with
    min_contributors = 1 (any one hospital's share carries the full noise, so a
    curious partner that removes its own share still faces all of it); A then
    gets B's statistics plus B's noise share, and the attack reports the
    measured error against the noise the session declared.
    """
    from secure_afl.backends import get_backend
    from secure_afl.dp import DPSpec, add_noise_share
    from secure_afl.backends.session_params import dp_session_params

    rng = np.random.default_rng(seed)
    spec = None if dp is None else DPSpec(float(dp), 1e-5, 1)
    params = dp_session_params(spec, "plain", "attack-k2", attack_layout(), GAMMA, attack_bounds())
    backend = get_backend(params)
    XA, yA = embeddings(rng, 30)
    XB, yB = embeddings(rng, 12)
    vA, vB = packed_vector(XA, yA), packed_vector(XB, yB)
    # each hospital's own protect path: its packed statistics plus its noise share (none without DP)
    upA, upB = add_noise_share(params, vA), add_noise_share(params, vB)
    comb = backend.combiner()
    comb.add(backend.protect(upA))
    comb.add(backend.protect(upB))
    released = backend.reveal(comb.aggregate())  # what the key holder reveals

    lay = attack_layout()
    theirs = lay.unpack(released - upA, gamma=GAMMA)  # hospital A's computation (it knows its own share)
    truth = lay.unpack(vB, gamma=GAMMA)
    err = float(max(np.max(np.abs(theirs.gram - truth.gram)), np.max(np.abs(theirs.cross - truth.cross))))
    counts_err = float(np.max(np.abs(theirs.class_counts - truth.class_counts)))
    if dp is None:
        outcome = "recovered" if err < 1e-9 and counts_err < 1e-9 else "refused"
        say(verbose, f"[k2-subtraction] {outcome.upper()}: the other hospital's statistics C_B, Q_B with max error "
                      f"{err:.1e}; class counts {theirs.class_counts.astype(int).tolist()} (error {counts_err!r}); "
                      f"n_B = {int(theirs.n)}")
        return {"attack": "k2-subtraction", "outcome": outcome, "max_error": err, "counts_error": counts_err,
                "n_other": int(theirs.n)}
    iu = np.triu_indices(DIM)
    resid = np.concatenate([(theirs.gram - truth.gram)[iu], (theirs.cross - truth.cross).ravel(),
                            [theirs.n - truth.n], theirs.class_counts - truth.class_counts])
    rel = float(np.linalg.norm(theirs.gram - truth.gram) / np.linalg.norm(truth.gram - GAMMA * np.eye(DIM)))
    sigma = float(params.dp["sigma"])
    say(verbose, f"[k2-subtraction] NOISE (DP epsilon={dp:g}): A's estimate of C_B is off by "
                  f"{100 * rel:.0f}% (Frobenius); residual std {resid.std():.3g} vs the declared sigma "
                  f"{sigma:.3g}; n_B reads {theirs.n:.1f} (true {int(truth.n)})")
    return {"attack": "k2-subtraction", "outcome": "noise", "max_error": err, "counts_error": counts_err,
            "residual_std": float(resid.std()), "residual_mean": float(resid.mean()), "residual_entries": resid.size,
            "sigma": sigma, "gram_rel_error": rel, "epsilon": float(dp)}


def attack_differencing(*, seed: int = 0, verbose: bool = True, work=None, **_) -> dict:
    """Two releases, cohorts {A, B, C} and {A, B}: S1 - S2 = C's statistics.

    Then the same two aggregates are offered to the key holder's
    :class:`~secure_afl.release_checks.ReleaseLedger` under one key: the second is refused.
    """
    from secure_afl.backends import get_backend
    from secure_afl.release_checks import ReleaseLedger

    rng = np.random.default_rng(seed)
    params = plain_params("attack-diff")
    backend = get_backend(params)
    vecs = {h: packed_vector(*embeddings(rng, 10)) for h in ("A", "B", "C")}

    def release(cohort):
        comb = backend.combiner()
        for h in cohort:
            comb.add(backend.protect(vecs[h]))
        agg = comb.aggregate()
        return agg, backend.reveal(agg)

    agg1, s1 = release(("A", "B", "C"))
    agg2, s2 = release(("A", "B"))
    diff = s1 - s2
    err = float(np.max(np.abs(diff[:-1] - vecs["C"][:-1])))  # all but the contributor counter
    say(verbose, f"[differencing] RECOVERED hospital C from two releases: max error {err:.1e}")

    with workdir(work) as d:
        ledger = ReleaseLedger(Path(d) / "releases.sqlite3")
        try:
            ledger.check("key-1", "s1", ["A", "B", "C"], hashlib.sha256(agg1).hexdigest())
            ledger.record("key-1", "s1", ["A", "B", "C"], hashlib.sha256(agg1).hexdigest())
            try:
                ledger.check("key-1", "s2", ["A", "B"], hashlib.sha256(agg2).hexdigest())
                refusal = None
            except PolicyViolation as e:
                refusal = e
        finally:
            ledger.close()
    if refusal is None:
        say(verbose, "[differencing] NOT REFUSED: the ledger allowed the overlapping second release")
        return {"attack": "differencing", "outcome": "recovered", "max_error": err, "ledger_refused": False}
    say(verbose, f"[differencing] REFUSED by the key holder's ledger: {type(refusal).__name__}({refusal.reason})")
    return {"attack": "differencing", "outcome": "refused", "max_error": err, "ledger_refused": True,
            "error": type(refusal).__name__, "reason": refusal.reason}


# ---------------------------------------------------------------------------
# the same curious server against ckks and secagg
# ---------------------------------------------------------------------------
def attack_ckks_server(*, seed: int = 0, verbose: bool = True, **_) -> dict:
    """The singleton attack against a ckks upload: nothing to read.

    Each way the server could read the upload is tried; the verdict is
    RECOVERED when any of them returned the hospital's statistics (x within
    1e-3), whatever raised or not.
    """
    from secure_afl.backends.ckks import CKKSBackend, new_ckks_session
    from secure_afl.envelope import peek_header, seal

    rng = np.random.default_rng(seed)
    params, keys = new_ckks_session("attack-ckks", attack_layout(), GAMMA, attack_bounds())
    backend = CKKSBackend(params)
    X, y = embeddings(rng, 1)
    packed = packed_vector(X, y)
    payload = backend.protect(packed, public_context=keys.public_context)

    def as_aggregate_with_public_context():  # what the server holds
        agg = seal(params, "aggregate", peek_header(payload).body, contributors=1)
        return backend.reveal(agg, secret_context=keys.public_context)

    def contribution_through_reveal():  # even the secret key does not open a contribution through reveal()
        return backend.reveal(payload, secret_context=keys.secret_context)

    def server_holding_a_secret_context():  # a server that accepted a secret context decrypts with it
        backend.combiner(public_context=keys.secret_context)
        ctx = backend.keyholder_context(keys.secret_context)
        return backend.decrypt_raw(ctx, backend.load_contribution(ctx, payload))

    attempts = {"reveal with the public context": as_aggregate_with_public_context,
                "reveal of a contribution": contribution_through_reveal,
                "combiner given a secret context": server_holding_a_secret_context}
    results = {}
    for label, fn in attempts.items():
        try:
            v = np.asarray(fn(), dtype=np.float64)
            got = v.shape == packed.shape and float(np.max(np.abs(v - packed))) < 1e-3
            results[label] = {"outcome": "recovered" if got else "garbage"}
        except Exception as e:  # the refusal is the expected result; recorded below
            results[label] = {"outcome": "refused", "error": type(e).__name__, "reason": getattr(e, "reason", None)}
    # the ciphertext bytes read as if they were float64 statistics
    body = peek_header(payload).body
    n = (len(body) // 8) * 8
    raw = np.frombuffer(body[:n], dtype="<f8")
    finite = raw[np.isfinite(raw)]
    near = int(np.sum([np.any(np.abs(finite - xi) < 1e-9) for xi in X[0]]))
    results["ciphertext bytes"] = {"outcome": "recovered" if near == DIM else "refused", "coordinates_found": near}
    for label, r in results.items():
        say(verbose, f"[ckks-server] {r['outcome'].upper()}: {label}"
                      + (f" -> {r['error']}({r['reason']})" if "error" in r else "")
                      + (f" ({r['coordinates_found']}/{DIM} coordinates of x in the bytes)"
                         if "coordinates_found" in r else ""))
    recovered = any(r["outcome"] == "recovered" for r in results.values())
    return {"attack": "ckks-server", "outcome": "recovered" if recovered else "refused", "attempts": results,
            "coordinates_found_in_ciphertext": near}


def _secagg_round_upto_masked(params, vectors):
    """Run SETUP .. SHARE_KEYS for K hospitals; return (server, clients)."""

    ids = list(range(1, len(vectors) + 1))
    priv, pub = identities(len(ids))
    server = SecAggServerRound(params, participants=ids, identity_keys=pub)
    clients = {u: SecAggClient(params, u, priv[u], pub) for u in ids}
    for stage in ("setup", "advertise_keys", "share_keys"):
        for u in sorted(server.active):
            resp = getattr(clients[u], stage)(server.request(u))
            server.receive(decode_message(resp.to_bytes()))
        server.close_stage()
    return server, clients


def attack_secagg_server(*, seed: int = 0, verbose: bool = True, **_) -> dict:
    """The singleton attack against a secagg masked vector: uniform noise."""
    from scipy import stats as sstats


    rng = np.random.default_rng(seed)
    # a wider layout than the others so the statistics below have power
    from secure_afl.packing import Layout

    layout = Layout(60, CLASSES)
    params = secagg_session_params("attack-secagg", layout, GAMMA, attack_bounds(), n_parties=3)
    backend = SecAggBackend(params)
    X = rng.standard_normal((1, 60))
    X *= 1.5 / np.linalg.norm(X)
    from secure_afl.stats import SufficientStatistics, local_statistics

    s = local_statistics(X, np.array([1]), CLASSES)
    x_vec = layout.pack(SufficientStatistics(s.gram + GAMMA * np.eye(60), s.cross, s.n, s.class_counts, 1.0, GAMMA))
    server, clients = _secagg_round_upto_masked(params, [x_vec] * 3)
    payload = backend.protect(x_vec, client=clients[1], request=server.request(1))

    words = backend._decode_masked(payload)[1]  # the server's view of hospital 1
    enc = fixedpoint.encode(x_vec, params.backend_params["frac_bits"])
    # the singleton attack on the masked words: decode as if unmasked
    as_stats = layout.unpack(fixedpoint.decode(words, params.backend_params["frac_bits"]), gamma=GAMMA)
    x_hat = as_stats.cross[:, 1]
    err = float(np.max(np.abs(x_hat - X[0])))
    top = np.bincount((words >> np.uint64(56)).astype(np.int64), minlength=256)
    p_uniform = float(sstats.chisquare(top).pvalue)
    r = float(np.corrcoef(enc.view(np.int64).astype(float), words.view(np.int64).astype(float))[0, 1])
    uniform = p_uniform > 1e-4 and abs(r) < 5 / np.sqrt(words.size)
    outcome = "recovered" if err < 1e-3 else "refused" if uniform and err > 1.0 else "leak"
    say(verbose, f"[secagg-server] {outcome.upper()}: masked words "
                  f"{'uniform' if uniform else 'NOT uniform'} (chi-square p = {p_uniform:.3f}), correlation with the "
                  f"input {r:+.4f}; 'x = Q[:, y]' off by {err:.3g}")
    return {"attack": "secagg-server", "outcome": outcome, "p_uniform": p_uniform,
            "correlation": r, "max_error": err, "words": int(words.size)}


