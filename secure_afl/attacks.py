"""``secure-afl attack``: runnable demonstrations of the threat model.

Each attack plays one adversary of ``threat_model/THREAT_MODEL.md`` against
the real library, in process (no mocks: the real envelopes, backends, key
holder, manifests and release ledger), prints what it obtained in one clear
line (``RECOVERED ...`` or ``REFUSED: ...``) and returns a result dict so the
tests (``tests/test_attacks.py``) can assert on it.

Attacks
-------
plain-singleton
    Curious server, ``plain`` backend: a hospital with n_k = 1 uploads
    C = x x^T + gamma I and Q = x e_y^T; the server reads x = Q[:, y] exactly.
plain-singleton-class
    Same, a class with one sample inside a larger hospital: x = Q[:, c].
k2-subtraction
    K = 2: each hospital subtracts its own statistics from the released
    aggregate and obtains the other's exactly (and its class counts from the
    key holder's published report).
differencing
    Two releases whose cohorts differ by one hospital give that hospital's
    statistics by subtraction; the key holder's ReleaseLedger refuses the
    second release under the same key.
ckks-server
    The singleton attack against a ``ckks`` payload: the server holds only the
    public context, decryption is refused with a typed error, and the raw
    ciphertext bytes carry no usable copy of x.
secagg-server
    The singleton attack against a ``secagg`` masked vector: the masked words
    are uniform and uncorrelated with the input.
forward-ciphertext
    Malicious server: forwards one hospital's ciphertext to the key holder as
    if it were the aggregate (several variants). Refused by the manifest /
    aggregate hash binding, the contributor counter, the sanity checks and the
    key holder's recomputation of the sum from the signed contributions.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

__all__ = ["ATTACKS", "run_attack", "register"]

DIM, CLASSES, GAMMA = 6, 3, 1.0


# ---------------------------------------------------------------------------
# shared set-up
# ---------------------------------------------------------------------------
def _bounds():
    from .params import Bounds

    return Bounds(max_norm=2.0, n_max=200, k_max=8)


def _layout():
    from .packing import Layout

    return Layout(DIM, CLASSES)


def _embeddings(rng: np.random.Generator, n: int, labels=None):
    """n rows of norm <= 1.5 (inside B = 2) and labels in [0, CLASSES)."""
    X = rng.standard_normal((n, DIM))
    X *= (rng.uniform(0.3, 1.5, n) / np.linalg.norm(X, axis=1))[:, None]
    y = rng.integers(0, CLASSES, n) if labels is None else np.asarray(labels, dtype=np.int64)
    return X, y


def _packed(X, y):
    """The hospital's packed vector exactly as HospitalClient.protect builds it."""
    from .stats import SufficientStatistics, local_statistics

    s = local_statistics(X, y, CLASSES)
    with_ri = SufficientStatistics(s.gram + GAMMA * np.eye(DIM), s.cross, s.n, s.class_counts, 1.0, GAMMA)
    return _layout().pack(with_ri)


def _plain_params(session_id: str):
    from .params import SessionParams

    return SessionParams(session_id, "plain", _layout(), GAMMA, _bounds())


def _read_plain_payload(payload: bytes):
    """What the curious server does with a plain upload: parse it (no key needed)."""
    from .envelope import peek_header

    v = np.frombuffer(peek_header(payload).body, dtype="<f8").astype(np.float64)
    return _layout().unpack(v, gamma=GAMMA)


def _singleton_from_stats(stats, cls: int):
    """x = Q[:, c] for a class with one sample; with n_k = 1 also C = x x^T."""
    return stats.cross[:, cls].copy()


@contextmanager
def _workdir(work):
    if work is not None:
        Path(work).mkdir(parents=True, exist_ok=True)
        yield Path(work)
        return
    d = Path(tempfile.mkdtemp(prefix="secure-afl-attack-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _say(verbose: bool, line: str) -> None:
    if verbose:
        print(line)


# ---------------------------------------------------------------------------
# curious server vs plaintext statistics
# ---------------------------------------------------------------------------
def attack_plain_singleton(*, seed: int = 0, verbose: bool = True, **_) -> dict:
    """A hospital with n_k = 1 uploads plain statistics; the server reads x exactly."""
    from .backends import get_backend

    rng = np.random.default_rng(seed)
    params = _plain_params("attack-plain")
    X, y = _embeddings(rng, 1)
    payload = get_backend(params).protect(_packed(X, y))

    stats = _read_plain_payload(payload)  # the server's view
    label = int(np.argmax(stats.class_counts))
    x_hat = _singleton_from_stats(stats, label)
    C = stats.gram - GAMMA * np.eye(DIM)
    err = float(np.max(np.abs(x_hat - X[0])))
    gram_err = float(np.max(np.abs(C - np.outer(x_hat, x_hat))))
    _say(verbose, f"[plain-singleton] RECOVERED x exactly: max error {err!r}; label {label} "
                  f"(true {int(y[0])}); C = x x^T holds to {gram_err:.1e}")
    return {"attack": "plain-singleton", "outcome": "recovered", "max_error": err, "gram_error": gram_err,
            "label": label, "true_label": int(y[0])}


def attack_plain_singleton_class(*, seed: int = 0, verbose: bool = True, **_) -> dict:
    """A class with one sample inside a 40-sample hospital: x = Q[:, c] exactly."""
    from .backends import get_backend

    rng = np.random.default_rng(seed)
    params = _plain_params("attack-plain")
    labels = np.array([0] * 20 + [1] * 19 + [2])  # class 2 is one patient
    X, y = _embeddings(rng, len(labels), labels)
    payload = get_backend(params).protect(_packed(X, y))

    stats = _read_plain_payload(payload)
    singles = [int(c) for c in np.flatnonzero(stats.class_counts == 1)]
    recovered = {c: _singleton_from_stats(stats, c) for c in singles}
    err = max(float(np.max(np.abs(recovered[c] - X[y == c][0]))) for c in singles)
    _say(verbose, f"[plain-singleton-class] RECOVERED x exactly: max error {err!r} (class {singles} has one "
                  f"sample among n_k = {int(stats.n)})")
    return {"attack": "plain-singleton-class", "outcome": "recovered", "max_error": err,
            "singleton_classes": singles, "n": int(stats.n)}


def attack_k2_subtraction(*, seed: int = 0, verbose: bool = True, **_) -> dict:
    """K = 2: hospital A subtracts its own statistics from the released aggregate."""
    from .backends import get_backend

    rng = np.random.default_rng(seed)
    params = _plain_params("attack-k2")
    backend = get_backend(params)
    XA, yA = _embeddings(rng, 30)
    XB, yB = _embeddings(rng, 12)
    vA, vB = _packed(XA, yA), _packed(XB, yB)
    comb = backend.combiner()
    comb.add(backend.protect(vA))
    comb.add(backend.protect(vB))
    released = backend.reveal(comb.aggregate())  # what the key holder reveals

    lay = _layout()
    theirs = lay.unpack(released - vA, gamma=GAMMA)  # hospital A's computation
    truth = lay.unpack(vB, gamma=GAMMA)
    err = float(max(np.max(np.abs(theirs.gram - truth.gram)), np.max(np.abs(theirs.cross - truth.cross))))
    counts_err = float(np.max(np.abs(theirs.class_counts - truth.class_counts)))
    _say(verbose, f"[k2-subtraction] RECOVERED the other hospital's statistics: C_B, Q_B max error {err:.1e}; "
                  f"class counts {theirs.class_counts.astype(int).tolist()} (error {counts_err!r}); "
                  f"n_B = {int(theirs.n)}")
    return {"attack": "k2-subtraction", "outcome": "recovered", "max_error": err, "counts_error": counts_err,
            "n_other": int(theirs.n)}


def attack_differencing(*, seed: int = 0, verbose: bool = True, work=None, **_) -> dict:
    """Two releases, cohorts {A, B, C} and {A, B}: S1 - S2 = C's statistics.

    Then the same two aggregates are offered to the key holder's
    :class:`~secure_afl.release.ReleaseLedger` under one key: the second is refused.
    """
    from .backends import get_backend
    from .exceptions import PolicyViolation
    from .release import ReleaseLedger

    rng = np.random.default_rng(seed)
    params = _plain_params("attack-diff")
    backend = get_backend(params)
    vecs = {h: _packed(*_embeddings(rng, 10)) for h in ("A", "B", "C")}

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
    _say(verbose, f"[differencing] RECOVERED hospital C from two releases: max error {err:.1e}")

    with _workdir(work) as d:
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
        _say(verbose, "[differencing] NOT REFUSED: the ledger allowed the overlapping second release")
        return {"attack": "differencing", "outcome": "recovered", "max_error": err, "ledger_refused": False}
    _say(verbose, f"[differencing] REFUSED by the key holder's ledger: {type(refusal).__name__}({refusal.reason})")
    return {"attack": "differencing", "outcome": "refused", "max_error": err, "ledger_refused": True,
            "error": type(refusal).__name__, "reason": refusal.reason}


# ---------------------------------------------------------------------------
# the same curious server against ckks and secagg
# ---------------------------------------------------------------------------
def attack_ckks_server(*, seed: int = 0, verbose: bool = True, **_) -> dict:
    """The singleton attack against a ckks upload: nothing to read."""
    from .backends.ckks import CKKSBackend, new_ckks_session
    from .envelope import peek_header, seal
    from .exceptions import InvalidKey, MalformedPayload, SecretKeyNotAllowed

    rng = np.random.default_rng(seed)
    params, keys = new_ckks_session("attack-ckks", _layout(), GAMMA, _bounds())
    backend = CKKSBackend(params)
    X, y = _embeddings(rng, 1)
    payload = backend.protect(_packed(X, y), public_context=keys.public_context)

    refusals = []
    try:  # 1. re-seal the upload as an "aggregate" and decrypt with what the server holds
        as_aggregate = seal(params, "aggregate", peek_header(payload).body, contributors=1)
        backend.reveal(as_aggregate, secret_context=keys.public_context)
    except Exception as e:  # recorded and asserted on below
        refusals.append(e)
    try:  # 2. even the secret key does not open a single contribution through reveal()
        backend.reveal(payload, secret_context=keys.secret_context)
    except Exception as e:
        refusals.append(e)
    try:  # 3. the server is offered a secret context: it must refuse to hold it
        backend.combiner(public_context=keys.secret_context)
    except Exception as e:
        refusals.append(e)
    # 4. read the ciphertext bytes as if they were float64 statistics
    body = peek_header(payload).body
    n = (len(body) // 8) * 8
    raw = np.frombuffer(body[:n], dtype="<f8")
    finite = raw[np.isfinite(raw)]
    near = int(np.sum([np.any(np.abs(finite - xi) < 1e-9) for xi in X[0]]))
    first = refusals[0]
    ok_types = (len(refusals) == 3 and isinstance(first, InvalidKey) and isinstance(refusals[1], MalformedPayload)
                and isinstance(refusals[2], SecretKeyNotAllowed))
    _say(verbose, f"[ckks-server] REFUSED: {type(first).__name__}({first.reason}): {first}")
    _say(verbose, f"[ckks-server] REFUSED: reveal() of a single contribution, even with the secret key -> "
                  f"{type(refusals[1]).__name__}({refusals[1].reason})")
    _say(verbose, f"[ckks-server] REFUSED: server offered a secret context -> {type(refusals[-1]).__name__}"
                  f"({refusals[-1].reason}); raw ciphertext bytes contain {near}/{DIM} coordinates of x")
    return {"attack": "ckks-server", "outcome": "refused" if ok_types and near == 0 else "recovered",
            "error": type(first).__name__, "reason": first.reason,
            "secret_context_error": type(refusals[-1]).__name__, "coordinates_found_in_ciphertext": near}


def _secagg_round_upto_masked(params, vectors):
    """Run SETUP .. SHARE_KEYS for K hospitals; return (server, clients)."""
    from .secagg import SecAggClient, SecAggServerRound, decode_message, identities

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

    from .secagg import SecAggBackend, secagg_session_params
    from .hazmat import fixedpoint

    rng = np.random.default_rng(seed)
    # a wider layout than the others so the statistics below have power
    from .packing import Layout

    layout = Layout(60, CLASSES)
    params = secagg_session_params("attack-secagg", layout, GAMMA, _bounds(), n_parties=3)
    backend = SecAggBackend(params)
    X = rng.standard_normal((1, 60))
    X *= 1.5 / np.linalg.norm(X)
    from .stats import SufficientStatistics, local_statistics

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
    ok = p_uniform > 1e-4 and abs(r) < 5 / np.sqrt(words.size) and err > 1.0
    _say(verbose, f"[secagg-server] REFUSED (nothing to read): masked words uniform (chi-square p = "
                  f"{p_uniform:.3f}), correlation with the input {r:+.4f}; 'x = Q[:, y]' off by {err:.3g}")
    return {"attack": "secagg-server", "outcome": "refused" if ok else "recovered", "p_uniform": p_uniform,
            "correlation": r, "max_error": err, "words": int(words.size)}


# ---------------------------------------------------------------------------
# malicious server vs the key holder
# ---------------------------------------------------------------------------
def _ckks_consortium(d: Path, hospitals=("hosp-a", "hosp-b", "hosp-c")):
    from . import pki
    from .backends.ckks import bind_public_context, ckks_session_params
    from .server.keyholder import KeyHolder

    pki_dir = d / "pki"
    pki.init_ca(pki_dir, name="attack consortium")
    server = pki.issue(pki_dir, "server", "aggregator")
    pki.issue(pki_dir, "keyholder", "keyholder")
    parties = {h: pki.issue(pki_dir, "hospital", h) for h in hospitals}
    kh = KeyHolder(pki_dir, "keyholder", d / "keys", passphrase=os.urandom(16).hex().encode())
    params0 = ckks_session_params("attack-forward", _layout(), GAMMA, _bounds())
    public = kh.keygen(params0)
    tag_key = (d / "keys" / "attack-forward.tag.pub").read_text().strip()
    params = bind_public_context(params0, public).with_backend_params(tag_public_key=tag_key)
    return pki_dir, server, parties, kh, params, public


def _tagged_upload(party, params, backend, public, vector):
    """What an honest ckks hospital sends: the payload (tag inside) and the signed, sealed tag."""
    from .tagging import new_tag, seal_tag, sign_tag

    lay = _layout()
    tag = new_tag(params)
    v = vector.copy()
    v[lay.slices["tag"]] = tag
    payload = backend.protect(v, public_context=public)
    statement = sign_tag(party.identity_key(), params, party.name, hashlib.sha256(payload).hexdigest(),
                         seal_tag(params, party.name, tag))
    return payload, statement


def _signed_participant(party, params, payload: bytes) -> dict:
    from . import pki
    from .signing import sign_upload

    st = sign_upload(party.identity_key(), params.session_id, params.digest(), hashlib.sha256(payload).digest(),
                     party.name)
    return {**st, "identity_pub": pki.public_key_hex(party.identity_pub())}


def _manifest(server_party, params, participants, aggregate: bytes, min_clients: int) -> dict:
    from .signing import build_manifest

    return build_manifest(server_party.identity_key(), params.session_id, params.digest(), participants,
                          hashlib.sha256(aggregate).digest(), min_clients)


def attack_forward_ciphertext(*, seed: int = 0, verbose: bool = True, work=None, **_) -> dict:
    """A malicious server tries to have one hospital's ciphertext decrypted."""
    from .backends.ckks import CKKSBackend
    from .envelope import peek_header, seal
    from .exceptions import SecureAFLError
    from .server.keyholder import KeyHolder

    rng = np.random.default_rng(seed)
    with _workdir(work) as d:
        pki_dir, server_party, parties, kh, params, public = _ckks_consortium(Path(d))
        backend = CKKSBackend(params)
        names = sorted(parties)
        vecs = {h: _packed(*_embeddings(rng, 15)) for h in names}
        uploads = {h: _tagged_upload(parties[h], params, backend, public, vecs[h]) for h in names}
        payloads = {h: uploads[h][0] for h in names}
        tags = {h: uploads[h][1] for h in names}  # the server holds these and hands them over
        participants = [_signed_participant(parties[h], params, payloads[h]) for h in names]
        K = len(names)
        victim = payloads[names[0]]
        body = peek_header(victim).body

        def forged_aggregate(contributors: int, extra: list[bytes] = ()) -> bytes:
            comb = backend.combiner(public_context=public)
            comb.add(victim)
            for p in extra:
                comb.add(p)
            return seal(params, "aggregate", peek_header(comb.aggregate()).body, contributors=contributors)

        # the server can encrypt anything under the public key: a fix-up that makes the
        # victim's vector look like a K-sum (contributor counter K, K gamma on the Gram diagonal)
        lay = _layout()
        fix = np.zeros(lay.length)
        fix[lay.slices["contributors"]] = K - 1
        iu = np.triu_indices(DIM)
        fix[lay.slices["gram"]] = np.where(iu[0] == iu[1], (K - 1) * GAMMA, 0.0)
        fixup = backend.protect(fix, public_context=public)

        honest = forged_aggregate(K, [payloads[h] for h in names[1:]])

        def fresh_keyholder(label: str) -> KeyHolder:
            # each try runs on a copy of the key holder's state, so no ledger entry (or block
            # after a detected forgery) from one try hides the guard another try meets
            copy = Path(d) / f"keys-{label}"
            shutil.copytree(kh.keys_dir, copy)
            return KeyHolder(pki_dir, "keyholder", copy, passphrase=kh.passphrase)
        variants = [
            ("victim's contribution sent as is (kind 'contribution')", victim, participants, K),
            ("re-sealed as an aggregate, header says 1 contributor", seal(params, "aggregate", body, contributors=1),
             participants, K),
            ("re-sealed, header forged to K contributors", forged_aggregate(K), participants, K),
            ("manifest listing only the victim", forged_aggregate(1), participants[:1], 1),
            ("manifest signed for the honest sum, victim's ciphertext sent", forged_aggregate(K), participants, K,
             honest),
            ("counter and RI fixed up homomorphically (Enc(x_A) + Enc(fix))", forged_aggregate(K, [fixup]),
             participants, K),
        ]
        results = []
        for i, v in enumerate(variants):
            label, aggregate, parts, mc = v[:4]
            signed_for = v[4] if len(v) > 4 else aggregate
            try:
                manifest = _manifest(server_party, params, parts, signed_for, mc)
                res = fresh_keyholder(str(i)).reveal_and_solve(params, aggregate, manifest, min_clients=2,
                                                               tags=tags)
                err = float(np.max(np.abs(res.stats.cross - lay.unpack(vecs[names[0]]).cross)))
                out = {"variant": label, "outcome": "released", "max_error": err,
                       "released_samples": res.report["samples"], "victim_samples": 15}
                _say(verbose, f"[forward-ciphertext] NOT REFUSED ({label}): the key holder released a model of "
                              f"the victim alone ({res.report['samples']} samples, Q max error {err:.1e})")
            except SecureAFLError as e:
                cause = e.__cause__ if isinstance(e.__cause__, SecureAFLError) else None
                out = {"variant": label, "outcome": "refused", "error": type(e).__name__, "reason": e.reason,
                       "cause": type(cause).__name__ if cause else None}
                _say(verbose, f"[forward-ciphertext] REFUSED ({label}): {type(e).__name__}({e.reason})"
                              + (f" <- {type(cause).__name__}" if cause else "") + f": {str(e)[:110]}")
            results.append(out)
        # and the honest aggregate still goes through (the guards do not refuse everything)
        manifest = _manifest(server_party, params, participants, honest, 2)
        res = fresh_keyholder("control").reveal_and_solve(params, honest, manifest, min_clients=2, tags=tags)
        _say(verbose, f"[forward-ciphertext] honest aggregate of {res.report['contributors']} hospitals released "
                      f"(control)")
    refused = all(r["outcome"] == "refused" for r in results)
    return {"attack": "forward-ciphertext", "outcome": "refused" if refused else "recovered",
            "variants": results, "homomorphic_fixup": results[-1]["outcome"],
            "honest_released": res.report["contributors"] == K}


ATTACKS = {
    "plain-singleton": attack_plain_singleton,
    "plain-singleton-class": attack_plain_singleton_class,
    "k2-subtraction": attack_k2_subtraction,
    "differencing": attack_differencing,
    "ckks-server": attack_ckks_server,
    "secagg-server": attack_secagg_server,
    "forward-ciphertext": attack_forward_ciphertext,
}


def run_attack(name: str, **kw) -> dict:
    """Run one attack by name; returns its result dict."""
    if name not in ATTACKS:
        raise ValueError(f"unknown attack {name!r}; choose from {sorted(ATTACKS)}")
    return ATTACKS[name](**kw)


def _cmd_attack(args) -> int:
    if args.name == "list":
        for name, fn in ATTACKS.items():
            print(f"{name:24s} {fn.__doc__.strip().splitlines()[0]}")
        return 0
    names = list(ATTACKS) if args.name == "all" else [args.name]
    for n in names:
        run_attack(n, seed=args.seed)
    return 0


def register(parser) -> None:
    parser.add_argument("name", choices=["list", "all", *ATTACKS], help="attack to run ('all' runs every one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=_cmd_attack)
