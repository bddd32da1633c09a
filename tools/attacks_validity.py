"""``secure-afl attack veto`` and ``attack steer``: one malicious hospital against each backend.

veto
    The hospital uploads a well-formed, correctly signed contribution whose
    statistics are impossible (n and one class count of x.5: no entry is
    larger than the declared bounds allow, so every backend's upload checks
    pass). plain, ckks, bfv and secagg see it only after the sum is revealed: the key
    holder's checks fail and nothing is released (the session is lost, and the
    sum does not say who did it). split checks each upload's validity proof on
    the two shares: the upload is refused by name and the others are released.
    Verdict per backend: VETOED (attack succeeded) or REFUSED.
steer
    (then the indefinite attacks: exact rows, +-H, rank-one eigenvalue cancellation, with split also under
    the Gram statement, which refuses them by name)
    Within the bounds a hospital may send any statistics: C_k = alpha I,
    Q_k = alpha W* pulls the released W towards its target W*. Every backend
    (split's proof included) accepts the upload; the figure is how far W moves,
    ``||W - W_honest|| / ||W* - W_honest||``, for alpha up to the largest the
    bounds allow (trace(C_k) = alpha d <= n_max B^2). Outside split a large
    target trips the key holder's per-class Cauchy-Schwarz check on the sum (no
    release, nobody named); the last row shrinks the target inside that check.

The commands (:func:`attack_veto_service`, :func:`attack_steer_service`) run each
backend as a deployment would: a throw-away PKI and signed session, a real
``secure-afl server run`` process, the key holder's keys published and its
release made over HTTPS, honest hospitals submitting real statistics with the
ordinary client, and the malicious hospital's upload built through the
backend's own protect path with the client-side checks skipped (split: the
proof made with ``check=False``). :func:`attack_veto` and :func:`attack_steer`
are the same attacks on the library's protocol functions in process (real
keys, envelopes, signatures, verifier messages and verdicts), kept as fast
unit-level checks.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from .harness import make_pki, secagg_quorum, server_section, sign_session, start_server, write_session

__all__ = ["attack_veto", "attack_steer", "attack_veto_service", "attack_steer_service", "BACKENDS",
           "SERVICE_BACKENDS"]

BACKENDS = ("split", "ckks", "bfv", "secagg")
#: the indefinite steering attacks (:func:`indefinite_statistics`)
INDEFINITE = ("diag-exact-rows", "half-plus-minus-H", "rank-one-cancel-0.9", "rank-one-cancel-0.99",
              "psd-exact-control")
#: the split sessions the steering attacks run against: the default one (no [split] section: the Gram statement
#: in Field128), and the one that signs the statement off
SPLIT_SESSIONS = (("default", None), ("gram_proof = false", {"gram_proof": False}))
DIM, CLASSES, GAMMA = 6, 3, 1.0


def _bounds():
    from secure_afl.params import Bounds

    return Bounds(max_norm=2.0, n_max=200, k_max=8)


def _layout():
    from secure_afl.packing import Layout

    return Layout(DIM, CLASSES)


def _honest_vectors(rng, k=3, n=60):
    from secure_afl.stats import local_statistics

    out = []
    for _ in range(k):
        X = rng.standard_normal((n, DIM))
        X *= (rng.uniform(0.3, 1.5, n) / np.linalg.norm(X, axis=1))[:, None]
        out.append(_layout().pack(local_statistics(X, rng.integers(0, CLASSES, n), CLASSES, gamma=GAMMA)))
    return out


def _impossible(v):
    """n and class 0 each + 1/2: every entry inside the bounds, the counts still sum to n, not integers."""
    lay = _layout()
    out = v.copy()
    out[lay.slices["n"].start] += 0.5
    out[lay.slices["counts"].start] += 0.5
    return out


def _steering(alpha: float, target: np.ndarray):
    """C_k = alpha I (+ gamma I), Q_k = alpha W*, a valid count vector at n_max."""
    from secure_afl.stats import SufficientStatistics

    b = _bounds()
    counts = np.full(CLASSES, b.n_max // CLASSES, dtype=np.float64)
    counts[0] += b.n_max - counts.sum()
    s = SufficientStatistics((alpha + GAMMA) * np.eye(DIM), alpha * target, float(b.n_max), counts, 1.0, GAMMA)
    return _layout().pack(s)


# -- split: the server's and the key holder's real protocol functions, in process ------------------------------
def _split_release(vectors, cheat: dict, **session) -> dict:
    """Hospitals h0..h(k-1); ``cheat``: hospital index -> vector sent without a valid proof (modified software);
    ``session``: the split session's keywords (:func:`secure_afl.split.split_session_params`; none: the default)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from secure_afl.analytic import solve_from_sums
    from secure_afl import split
    from secure_afl.backends import get_backend
    from secure_afl.release_checks import sanity_check

    params = split.split_session_params("attack-split", _layout(), GAMMA, _bounds(), **session)
    keys = split.generate_keys(params)
    params = split.bind_public_context(params, keys.public_context)
    be = get_backend(params)
    server_key = Ed25519PrivateKey.generate()
    acc, uploads, enrolled, participants = be.combiner(), {}, {}, []
    for i, v in enumerate(vectors):
        h, key = f"h{i}", Ed25519PrivateKey.generate()
        if i in cheat:
            body, seed, com = be.circuit.prove(h, lanes=be.circuit.lanes(cheat[i]), check=False)
            payload, st = be.seal_upload(body, seed, com, keys.public_context, h, key)
        else:
            payload, st = be.protect(v, public_context=keys.public_context, hospital=h, identity_key=key)
        split.check_upload(be.circuit, payload, st)  # the server's upload check: it passes (well-formed)
        acc.add(payload)
        uploads[h], enrolled[h] = (payload, st), key.public_key()
        participants.append({"hospital": h, "payload_sha256": hashlib.sha256(payload).hexdigest()})
    manifest = {"participants": participants}
    statements = {h: u[1] for h, u in uploads.items()}
    qkey = split.query_key(keys.secret_context)
    items, qseeds = [], {}
    for p in participants:
        h, sha = p["hospital"], p["payload_sha256"]
        qs = qseeds[h] = split.query_seed(qkey, params, h, sha, statements[h]["validity"])
        msg = split.leader_message(be.circuit, h, *uploads[h], server_key, qs)
        _, leader = split.verify_leader_message(msg, server_key.public_key(), be.circuit, h, sha, qs)
        seed = split.open_statement_seed(params, keys.secret_context, statements, enrolled, h, sha)
        items.append((h, seed, statements[h]["validity"], qs, leader))
    verdicts, _ = split.keyholder_verdicts(params, items)
    refused = {h: v for h, v in verdicts.items() if v}
    share = split.keyholder_share(params, keys.secret_context, manifest, statements, enrolled, refused=refused,
                                  query_seeds=qseeds)
    k = len(vectors) - len(refused)
    masked = split.cohort_masked_sum(params, acc.aggregate(), [uploads[h][0] for h in refused], k,
                                     [(uploads[h][0], qseeds[h]) for h in uploads if h not in refused])
    vec = split.collect(params, masked, share)
    stats = _layout().unpack(vec, gamma=GAMMA)
    sanity_check(stats, params, k, abs_tol=split.expected_abs_error(params, k),
                 advisory=split.ADVISORY_CHECKS)
    return {"refused": refused, "W": solve_from_sums(stats), "contributors": k}


# -- ckks and bfv: the key holder's real finalize ----------------------------------------------------------------
def _he_release(backend: str, vectors, work: Path) -> dict:
    from .attack_parties import MaliciousServer, signed_participant, tagged_upload
    from secure_afl.backends import get_backend
    from secure_afl.backends.bfv import bfv_session_params
    from secure_afl.backends.ckks import ckks_session_params
    from secure_afl.keyholder import KeyHolder

    sid = f"attack-veto-{backend}"
    pki_dir = work / "pki"
    names = [f"h{i}" for i in range(len(vectors))]
    server, parties = make_pki(pki_dir, names, name="attack consortium")
    b = _bounds()
    sign_session(pki_dir, {
        "session": {"id": sid, "backend": backend, "dim": DIM, "classes": CLASSES, "gamma": GAMMA,
                    "min_clients": 2, "hospitals": names},
        "bounds": {"max_norm": b.max_norm, "n_max": b.n_max, "k_max": b.k_max}})
    kh = KeyHolder(pki_dir, "keyholder", work / "keys", passphrase=os.urandom(16).hex().encode())
    make = ckks_session_params if backend == "ckks" else bfv_session_params
    public = kh.keygen(make(sid, _layout(), GAMMA, b))
    params = kh.params(sid)
    be = get_backend(params)
    ups = {h: tagged_upload(parties[h], params, be, public, v) for h, v in zip(names, vectors)}
    relay = MaliciousServer(server, params, [signed_participant(parties[h], params, ups[h][0]) for h in names],
                             {h: u[0] for h, u in ups.items()}, {h: u[1] for h, u in ups.items()}, min_clients=2)
    res = kh.finalize(relay, min_clients=2)
    return {"refused": {}, "W": res.W, "contributors": len(names)}


def _secagg_release(vectors) -> dict:
    from secure_afl.analytic import solve_from_sums
    from secure_afl.backends.secagg import secagg_session_params
    from secure_afl.hazmat.fixedpoint import abs_error_bound
    from secure_afl.release_checks import sanity_check
    from secure_afl.secagg.simulation import simulate_round

    params = secagg_session_params("attack-veto-secagg", _layout(), GAMMA, _bounds(), n_parties=len(vectors),
                                   threshold=2, min_clients=2)
    total = simulate_round(params, vectors)[0]
    stats = _layout().unpack(total, gamma=GAMMA)
    k = len(vectors)
    tol = abs_error_bound(tuple(params.backend_params["frac_bits"]), k, params.bounds.aggregate_bound(GAMMA))
    sanity_check(stats, params, k, abs_tol=tol)  # the key holder's release checks (reveal_and_solve)
    return {"refused": {}, "W": solve_from_sums(stats), "contributors": k}


def _release(backend: str, vectors, cheat: dict, work: Path) -> dict:
    if backend == "split":
        return _split_release(vectors, cheat)
    sent = [cheat.get(i, v) for i, v in enumerate(vectors)]
    if backend == "secagg":
        return _secagg_release(sent)
    return _he_release(backend, sent, work)


def _workdir():
    import tempfile

    return tempfile.TemporaryDirectory(prefix="secure-afl-attack-")


def attack_veto(*, seed: int = 0, verbose: bool = True, backends=BACKENDS, **_) -> dict:
    """One hospital's impossible (in-bounds) upload against each backend: vetoed or refused by name."""
    from secure_afl.exceptions import SecureAFLError

    rng = np.random.default_rng(seed)
    vectors = _honest_vectors(rng)
    cheat = {2: _impossible(vectors[2])}
    table = {}
    for backend in backends:
        with _workdir() as d:
            try:
                r = _release(backend, vectors, cheat, Path(d))
                outcome = "refused" if r["refused"] == {"h2": r["refused"].get("h2")} and r["refused"] else "vetoed"
                line = (f"REFUSED: h2's upload refused ({r['refused']['h2']} check), released over "
                        f"{r['contributors']} hospitals") if outcome == "refused" else \
                    "VETOED: the impossible upload was released unnoticed"
            except SecureAFLError as e:
                outcome, line = "vetoed", f"VETOED: no release ({type(e).__name__}: {str(e)[:120]}); nobody named"
        table[backend] = outcome
        if verbose:
            print(f"[veto] {backend:6s} {line}")
    vetoed_split = table.get("split") == "vetoed"
    return {"attack": "veto", "outcome": "recovered" if vetoed_split else "refused", "table": table}


def attack_steer(*, seed: int = 0, verbose: bool = True, alphas=(0.1, 1.0, 10.0, None), **_) -> dict:
    """Within the bounds: C_k = alpha I, Q_k = alpha W*; how far W moves towards W* (split signed with
    ``gram_proof = false``, proof checked: what the statement leaves open; :func:`attack_steer_service` runs the
    default session too)."""
    rng = np.random.default_rng(seed)
    vectors = _honest_vectors(rng)
    target = rng.choice([-5.0, 5.0], size=(DIM, CLASSES))
    b = _bounds()
    a_max = b.n_max * b.max_norm ** 2 / DIM  # trace(C_k) = alpha d <= n_max B^2
    W0 = _split_release(vectors[:2], {}, gram_proof=False)["W"]
    rows = []
    for a in alphas:
        alpha = a_max if a is None else float(a)
        r = _split_release(vectors[:2] + [_steering(alpha, target)], {}, gram_proof=False)
        moved = float(np.linalg.norm(r["W"] - W0) / np.linalg.norm(target - W0))
        rows.append({"alpha": alpha, "accepted": not r["refused"], "moved": moved})
        if verbose:
            print(f"[steer] alpha {alpha:9.4g}{' (bound)' if a is None else ''}: upload "
                  f"{'ACCEPTED' if not r['refused'] else 'refused'}, W moved {100 * moved:5.1f}% of the way to W*")
    return {"attack": "steer", "outcome": "leak" if any(r["accepted"] and r["moved"] > 0.5 for r in rows)
            else "refused", "rows": rows, "alpha_max": a_max}


# -- through the real service: a `secure-afl server run` process per backend ------------------------------------
SERVICE_BACKENDS = ("split", "ckks", "bfv", "secagg", "plain")


def raw_statistics(rng, k=3, n=60):
    """Each honest hospital's own C_k, Q_k, counts (gamma 0: the client adds the session's gamma)."""
    from secure_afl.stats import local_statistics

    out = []
    for _ in range(k):
        X = rng.standard_normal((n, DIM))
        X *= (rng.uniform(0.3, 1.5, n) / np.linalg.norm(X, axis=1))[:, None]
        out.append(local_statistics(X, rng.integers(0, CLASSES, n), CLASSES))
    return out


def _raw_steering(alpha: float, target: np.ndarray):
    """C_k = alpha I, Q_k = alpha W*, n_max rows with a valid count vector: what an honest client sends unchanged."""
    from secure_afl.stats import SufficientStatistics

    b = _bounds()
    counts = np.full(CLASSES, b.n_max // CLASSES, dtype=np.float64)
    counts[0] += b.n_max - counts.sum()
    return SufficientStatistics(alpha * np.eye(DIM), alpha * target, float(b.n_max), counts, 1.0, 0.0)


class _Consortium:
    """A throw-away consortium: PKI, signed session, a real server process, the key holder's keys published."""

    def __init__(self, backend: str, names, work: Path, split: dict | None = None):
        """``split``: the [split] section signed as given (None: none, the session default)."""
        self.backend, self.names, self.work, self.split = backend, list(names), work, split
        self.server = self.conn = None

    def __enter__(self):
        from secure_afl.keyholder import KeyHolder
        from secure_afl.session.signed import load_signed

        w, b, K = self.work, _bounds(), len(self.names)
        self.pki_dir = pki_dir = w / "pki"
        make_pki(pki_dir, self.names, name="attack consortium", roster=True)
        self.session_id = sid = f"attack-{self.backend}"
        cfg = {"session": {"id": sid, "backend": self.backend, "dim": DIM, "classes": CLASSES, "gamma": GAMMA,
                           "min_clients": 2, "min_class_count": 1, "deadline_s": 3600, "hospitals": self.names},
               "bounds": {"max_norm": b.max_norm, "n_max": b.n_max, "k_max": b.k_max},
               "server": server_section(w, pki_dir)}
        if self.split is not None:
            cfg["split"] = dict(self.split)
        if self.backend == "secagg":
            cfg["secagg"] = {"stage_timeout_s": 120.0}
            cfg["session"]["min_clients"] = secagg_quorum(K)
        else:  # room for the one refusal the veto and steer attacks provoke: with no colluder bound the quorum
            # is min_clients = 2 of the 3, so the cohort left after naming the cheater is still released
            cfg["session"]["max_refusals"] = 1
            cfg["session"]["colluders"] = 0
        self.min_clients = cfg["session"]["min_clients"]
        write_session(w / "session.toml", pki_dir, cfg)
        self.url = f"https://127.0.0.1:{cfg['server']['port']}"
        self.kh = KeyHolder(pki_dir, "keyholder", w / "keyholder", passphrase=os.urandom(16).hex().encode())
        self.server = start_server(w / "session.toml", w / "server.log", self.url, self.kh.party)
        try:  # a failed start must not leave the server process behind (__exit__ does not run)
            self.conn = self.kh.connect(self.url, sid)
            if self.backend in ("ckks", "bfv", "split"):
                # the parameters `keyholder keygen` derives from the signed definition
                self.kh.keygen(load_signed(pki_dir, sid).session_params())
                self.kh.publish(self.conn)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        if self.conn is not None:
            self.conn.close()
        if self.server is not None:
            self.server.stop()

    def hospital(self, name: str, cls=None):
        from secure_afl import pki
        from secure_afl.clients.hospital import HospitalClient

        return (cls or HospitalClient)(self.url, self.session_id, pki.load_party(self.pki_dir, "hospital", name),
                                       timeout=120, receipts_dir=self.work / "receipts" / name)

    def audit_text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in (self.work / "server").rglob("*audit*") if p.is_file())


def _malicious_client_class():
    """A hospital whose modified software sends a chosen packed vector through the backend's protect path,
    every client-side check skipped (the statistics and, for split, the proof's own check)."""
    import hashlib as _h

    from secure_afl.backends import get_backend
    from secure_afl.clients.hospital import HospitalClient
    from secure_afl.keyholder_params import check_published_keys
    from secure_afl.packing import Layout
    from secure_afl.tagging import new_tag, seal_tag, sign_tag

    class MaliciousHospital(HospitalClient):
        vector: np.ndarray

        def protect_vector(self, params, stats, *, tag=None):  # secagg's participant packs through this
            return self.vector.copy()

        def send(self) -> dict:
            params = self.fetch_params()
            if params.backend == "secagg":
                from secure_afl.clients.secagg_client import run_secagg

                return run_secagg(self, params, None, timeout=120)
            be = get_backend(params)
            if params.backend == "plain":
                return self.upload(params, be.protect(self.vector))
            ctx = self.conn.request("GET", self.conn.path("/context"), signed=False).content
            if params.backend == "split":
                from .attacks_validity import gram_cheat

                lanes = be.circuit.lanes(self.vector)
                body, seed, com = be.circuit.prove(self.name, lanes=lanes, check=False,
                                                   **gram_cheat(be.circuit, lanes))
                payload, st = be.seal_upload(body, seed, com, ctx, self.name, self.party.identity_key())
                return self.upload(params, payload, tag=st)
            check_published_keys(params, ctx)
            lay = Layout(params.layout.dim, params.layout.n_classes)
            tag = new_tag(params)
            v = self.vector.copy()
            v[lay.slices["tag"]] = tag
            payload = be.protect(v, public_context=ctx)
            st = sign_tag(self.party.identity_key(), params, self.name, _h.sha256(payload).hexdigest(),
                          seal_tag(params, self.name, tag))
            return self.upload(params, payload, tag=st)

    return MaliciousHospital


def _service_round(backend: str, honest, work: Path, *, bad=None, steer=None, split: dict | None = None) -> dict:
    """Honest hospitals h0..h(k-1) submit ``honest``; then either h(k) uploads the packed vector
    ``bad(packed_honest)`` with modified software, or submits ``steer`` (raw statistics) with the honest
    client; the key holder's ordinary release. Returns refused (hospital -> check), W, contributors, or
    ``error`` when nothing was released."""
    from concurrent.futures import ThreadPoolExecutor

    from secure_afl.clients.hospital import protect_vector
    from secure_afl.exceptions import SecureAFLError

    names = [f"h{i}" for i in range(len(honest) + (bad is not None or steer is not None))]
    with _Consortium(backend, names, work, split=split) as c:
        jobs = []
        for h, s in zip(names, honest):
            jobs.append((h, c.hospital(h), s))
        extra = names[-1] if len(names) > len(honest) else None
        cheat = None
        if bad is not None:
            cheat = c.hospital(extra, _malicious_client_class())
            params = cheat.fetch_params()
            cheat.vector = bad(protect_vector(params, raw_statistics(np.random.default_rng(99), k=1)[0]))
        elif steer is not None:
            jobs.append((extra, c.hospital(extra), steer))

        def one(job):
            name, client, stats = job
            try:
                return client.send() if stats is None else client.submit(stats)
            finally:
                client.close()

        if cheat is not None:
            jobs.append((extra, cheat, None))
        # secagg's stages need every hospital at once; the others upload independently
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            receipts = list(pool.map(one, jobs))
        try:
            res = c.kh.finalize(c.conn, min_clients=c.min_clients)
        except SecureAFLError as e:
            return {"refused": {}, "W": None, "contributors": 0, "error": f"{type(e).__name__}: {e}",
                    "receipts": receipts, "audit": c.audit_text()}
        refused = dict(res.report.get("refused") or {})
        return {"refused": refused, "W": res.W, "contributors": len(res.report.get("participants") or
                                                                     res.manifest.get("participants") or []),
                "receipts": receipts, "audit": c.audit_text()}


def attack_veto_service(*, seed: int = 0, verbose: bool = True, backends=SERVICE_BACKENDS, **_) -> dict:
    """One hospital's impossible (in-bounds) upload, through a real server process per backend."""
    rng = np.random.default_rng(seed)
    honest = raw_statistics(rng, k=2)
    table, details = {}, {}
    for backend in backends:
        with _workdir() as d:
            r = _service_round(backend, honest, Path(d), bad=_impossible)
        named = r["refused"].get("h2")
        if r.get("error"):
            outcome, line = "vetoed", f"VETOED: no release ({r['error'][:140]}); nobody named"
        elif named and set(r["refused"]) == {"h2"}:
            audited = "split_validity" in r["audit"] and "hospital:h2" in r["audit"]
            outcome = "refused"
            line = (f"REFUSED: h2's upload refused by name ({named} check; "
                    f"{'server audit record split_validity names hospital:h2' if audited else 'no audit record'}),"
                    f" released over {r['contributors']} hospitals")
        else:
            outcome, line = "vetoed", "VETOED: the impossible upload was released unnoticed"
        table[backend], details[backend] = outcome, line
        if verbose:
            print(f"[veto] {backend:6s} {line}", flush=True)
    vetoed_split = table.get("split") == "vetoed"
    return {"attack": "veto", "outcome": "recovered" if vetoed_split else "refused", "table": table,
            "details": details}


def attack_steer_service(*, seed: int = 0, verbose: bool = True, backends=SERVICE_BACKENDS,
                         alphas=(0.1, 1.0, 10.0, None), indefinite=INDEFINITE, dp_residual: bool = True,
                         split_sessions=SPLIT_SESSIONS, **_) -> dict:
    """Within the bounds: C_k = alpha I, Q_k = alpha W* submitted by an unmodified client, through a real
    server process per backend; how far the released W moves towards W*. Then the indefinite attacks
    (:data:`INDEFINITE`, :func:`attack_steer_indefinite_service`; split on its default session, which refuses
    every one by name, and signed ``gram_proof = false``), in ``result["indefinite"]`` (and
    ``result["default_refused_by_name"]``); and the DP Q residual (:func:`attack_dp_q_residual`, in process) in
    ``result["dp_q_residual"]``."""
    from secure_afl.analytic import solve_from_sums
    from secure_afl.stats import SufficientStatistics

    rng = np.random.default_rng(seed)
    honest = raw_statistics(rng, k=2)
    target = rng.choice([-5.0, 5.0], size=(DIM, CLASSES))
    b = _bounds()
    a_max = b.n_max * b.max_norm ** 2 / DIM  # trace(C_k) = alpha d <= n_max B^2
    s = honest[0] + honest[1]
    # the honest release over the same two hospitals (each adds gamma I), the reference W moves from
    W0 = solve_from_sums(SufficientStatistics(s.gram + 2 * GAMMA * np.eye(DIM), s.cross, s.n, s.class_counts,
                                              1.0, 2 * GAMMA))
    # the same attacker, careful: at the bound, its target shrunk into the per-class Cauchy-Schwarz cone of its
    # own upload (alpha |W*_jc| <= sqrt(alpha n_c), with a margin) so that the sum passes the key holder's check
    n_c = float(_raw_steering(a_max, target).class_counts.min())
    cone = target * min(1.0, 0.9 * np.sqrt(n_c / a_max) / float(np.max(np.abs(target))))
    plan = [(a, target, "+-5") for a in alphas] + [(None, cone, "cone")]
    from secure_afl.exceptions import BoundsExceeded

    rows = []
    for backend in backends:
        for a, goal, kind in plan:
            alpha = a_max if a is None else float(a)
            raw, modified = _raw_steering(alpha, goal), False
            with _workdir() as d:
                try:
                    r = _service_round(backend, honest, Path(d), steer=raw)
                except BoundsExceeded:
                    # split's default session: the honest client will not prove statistics that are no Gram
                    # matrix; modified software sends them unchecked, and the servers' proof check judges them
                    if backend != "split":
                        raise
                    modified = True
            if modified:
                with _workdir() as d:
                    r = _service_round(backend, honest, Path(d), bad=lambda _p, raw=raw: _packed_with_gamma(raw))
            accepted = not r.get("error") and not r["refused"]
            moved = float(np.linalg.norm(r["W"] - W0) / np.linalg.norm(goal - W0)) if accepted else 0.0
            rows.append({"backend": backend, "session": "default" if backend == "split" else None, "alpha": alpha,
                         "target": kind, "accepted": accepted, "moved": moved, "error": r.get("error"),
                         "refused": r["refused"], "modified_software": modified})
            if verbose:
                if accepted:
                    what = f"released, W moved {100 * moved:5.1f}% of the way to W*"
                elif r["refused"]:
                    what = (f"h2 REFUSED by name ({r['refused']}"
                            f"{'; sent by modified software: the client will not prove it' if modified else ''})")
                else:  # receipted, then the key holder's release checks fail on the sum: a veto, not a steer
                    what = f"NO RELEASE, nobody named ({r['error'][:110]})"
                label = " (bound)" if a is None else ""
                if kind == "cone":
                    label = f" (bound, W* entries +-{float(np.max(np.abs(cone))):.3g}: inside Cauchy-Schwarz)"
                print(f"[steer] {backend:6s} alpha {alpha:9.4g}{label}: {what}", flush=True)
    out = {"attack": "steer", "outcome": "leak" if any(r["accepted"] and r["moved"] > 0.5 for r in rows)
           else "refused", "rows": rows, "alpha_max": a_max}
    if indefinite:
        ind = attack_steer_indefinite_service(seed=seed, verbose=verbose, backends=backends,
                                              attacks=tuple(indefinite), split_sessions=split_sessions)
        out["indefinite"] = ind["rows"]
        if "default_refused_by_name" in ind:
            out["default_refused_by_name"] = ind["default_refused_by_name"]
    if dp_residual and "split" in backends:
        # in process (the cheater's upload proven and judged by the session's real circuit, the release formed
        # from the decoded lanes): split with DP and the Gram statement is the one setting that bounds it
        if verbose:
            print("[steer] split dp + gram_proof, a Q residual hidden in the noise share (in process):", flush=True)
        out["dp_q_residual"] = attack_dp_q_residual(seed=seed, verbose=verbose)
    return out


# -- indefinite statistics: what the Gram statement (split, [split] gram_proof) closes ---------------------------
def field_sqrt(a: int, P: int | None = None) -> int | None:
    """A square root of ``a`` in F_P (Tonelli-Shanks; Goldilocks when P is None), or None for a non-residue."""
    if P is None:
        from secure_afl.hazmat.flp import P
    a %= P
    if a == 0:
        return 0
    if pow(a, (P - 1) // 2, P) != 1:
        return None
    q, s = P - 1, 0
    while q % 2 == 0:
        q, s = q // 2, s + 1
    z = 2
    while pow(z, (P - 1) // 2, P) != P - 1:  # the least non-residue
        z += 1
    m, c, t, r = s, pow(z, q, P), pow(a, q, P), pow(a, (q + 1) // 2, P)
    while t != 1:
        i, t2 = 0, t
        while t2 != 1:
            t2, i = t2 * t2 % P, i + 1
        b = pow(c, 1 << (m - i - 1), P)
        m, c, t, r = i, b * b % P, t * b * b % P, r * b % P
    return r


def field_factor(circuit, lanes):
    """Modified software's best factor for statistics that are not a Gram matrix: the Cholesky factor of
    ``A / 2^t`` over F_p (square roots of negative pivots exist there), so that ``L L^T = A`` holds mod p with
    no slack. None if a pivot has no square root. Its entries are field elements far beyond any honest bound:
    the factor's range rows are what refuses it."""
    F = circuit.F
    P = F.P
    g, d, C = circuit.sizes["gram"], circuit.d, circuit.C
    sl = circuit.params.layout.slices
    hi = [int(v) for v in F.decode_signed(np.asarray(lanes, dtype=F.dtype)[:circuit.L])]
    m = d + C
    A = [[0] * m for _ in range(m)]
    for c in range(C):
        A[c][c] = hi[sl["counts"].start + c]
    for k, (i, j) in enumerate(zip(*np.triu_indices(d))):
        A[C + i][C + j] = A[C + j][C + i] = hi[sl["gram"].start + k]
    for i in range(d):
        for c in range(C):
            A[C + i][c] = A[c][C + i] = hi[sl["cross"].start + i * C + c]
    inv_t = pow(1 << g["t"], P - 2, P)
    A = [[a * inv_t % P for a in row] for row in A]
    L = [[0] * m for _ in range(m)]
    for j in range(m):
        piv = (A[j][j] - sum(L[j][k] * L[j][k] for k in range(j))) % P
        r = field_sqrt(piv, P)
        if r is None:
            return None
        L[j][j] = r
        if r == 0:
            continue
        ri = pow(r, P - 2, P)
        for i in range(j + 1, m):
            L[i][j] = (A[i][j] - sum(L[i][k] * L[j][k] for k in range(j))) * ri % P
    words = [L[c][c] for c in range(C)] + [L[C + i][c] for i in range(d) for c in range(C)] + \
        [L[C + i][C + j] for i, j in zip(*np.tril_indices(d))]
    # under DP: noise words 0, all of A in L; with exact Field128 lanes: residual words 0 (L L^T = A mod p)
    gram = circuit.part("gram")
    return F.to_field(words + [0] * (gram.n_z + gram.n_r))


def _zero_noise(circuit):
    return np.zeros(circuit.L) if circuit.part("gram").noise else None


def gram_cheat(circuit, lanes, *, stand_in=None) -> dict:
    """``prove`` keywords for an upload that is not a Gram matrix under the Gram statement: the field factor
    with zero count slack (the quadratic identity holds mod p; the range rows refuse it), or, with
    ``stand_in`` (a packed vector that is a Gram matrix), that vector's honest factor beside the cheater's
    lanes (in range; the quadratic identity refuses it)."""
    if circuit.sizes["gram"] is None:
        return {}
    if stand_in is not None:  # under DP its noise words are zero: the lanes' noise is left in the statistics
        return {"factor": circuit.witness(stand_in, noise=_zero_noise(circuit))[1]}
    fw = field_factor(circuit, lanes)
    if fw is None:
        return {}

    def aux(c, x, fs):
        bits = c.aux_bits(x, fs, factor=fw)
        off, cnt, width = c.offsets["gram_slack"]
        bits[off:off + cnt * width] = 0
        return bits

    return {"factor": fw, "aux_override": aux}




def indefinite_statistics(name: str, honest, target: np.ndarray):
    """The attacker's raw statistics (gamma 0), given the honest hospitals' (it is assumed to know their sum):

    * diag-exact-rows: C_k = diag(a, ..., a, tr - (d - 1) a) with tr = n_max B^2 and the last entry cancelling
      the honest sum's last diagonal, Q_k = C_k W*: every row but the last is dictated;
    * half-plus-minus-H: C_k = diag(+H on the first half, -H on the second), trace 0, Q_k = C_k W*, H ten
      times the honest sum's largest eigenvalue;
    * rank-one-cancel-beta: C_k = -beta lambda_1 v_1 v_1^T (the honest sum's top eigenpair), Q_k = 0: the
      released Gram loses that share of its top eigenvalue and W grows;
    * psd-exact-control: C_k = (n_max B^2 / d) I, positive semi-definite, and Q_k = (C_h + C_k) W* - Q_h, so the
      released W is exactly W* (take ``target`` from :func:`psd_exact_target`, which keeps every entry of Q_k
      inside the declared per-hospital bound); what is indefinite is A_k = [[diag(counts), Q_k^T], [Q_k, C_k]].
    Every entry is inside the proven per-entry bound, the trace inside n_max B^2, n = n_max with valid counts."""
    from secure_afl.stats import SufficientStatistics

    b = _bounds()
    d = DIM
    counts = np.full(CLASSES, b.n_max // CLASSES, dtype=np.float64)
    counts[0] += b.n_max - counts.sum()
    Ch = sum(s.gram for s in honest)
    if name == "diag-exact-rows":
        tr = b.n_max * b.max_norm ** 2
        last = -float(Ch[-1, -1]) + 0.05
        a = (tr - last) / (d - 1)
        Ck = np.diag([a] * (d - 1) + [last])
        Qk = Ck @ target
    elif name == "half-plus-minus-H":
        H = 10.0 * float(np.linalg.eigvalsh(Ch)[-1])
        Ck = np.diag([H] * (d // 2) + [-H] * (d - d // 2))
        Qk = Ck @ target
    elif name == "psd-exact-control":
        Ck = b.n_max * b.max_norm ** 2 / d * np.eye(d)
        Qk = (Ch + Ck) @ target - sum(s.cross for s in honest)
    else:
        beta = float(name.rsplit("-", 1)[1])
        w, V = np.linalg.eigh(Ch)
        Ck = -beta * w[-1] * np.outer(V[:, -1], V[:, -1])
        Qk = np.zeros((d, CLASSES))
    return SufficientStatistics(Ck, Qk, float(b.n_max), counts, 1.0, 0.0)


def psd_exact_target(honest, target: np.ndarray) -> np.ndarray:
    """``s target`` with the largest ``s <= 1`` that keeps every entry of psd-exact-control's Q_k within 0.9 of the
    declared per-hospital bound (so that plain, ckks and bfv take the upload too)."""
    b = _bounds()
    limit = 0.9 * b.hospital_bound(GAMMA)
    M = (sum(s.gram for s in honest) + b.n_max * b.max_norm ** 2 / DIM * np.eye(DIM)) @ target
    Qh = sum(s.cross for s in honest)
    top = 1.0
    for m, q in zip(M.ravel(), Qh.ravel()):  # |s m - q| <= limit, s >= 0
        if m != 0:
            top = min(top, max((q + limit) / m, (q - limit) / m))
    return max(top, 0.0) * target


def _indefinite_row(name, W, W0, target, released) -> dict:
    if not released:
        return {"pull": None, "norm_ratio": None, "rows_at_target": None}
    moved = float(np.linalg.norm(W - W0) / np.linalg.norm(target - W0))
    rows = int(sum(np.linalg.norm(W[i] - target[i]) <= 0.1 * np.linalg.norm(target[i]) for i in range(DIM)))
    return {"pull": moved, "norm_ratio": float(np.linalg.norm(W) / np.linalg.norm(W0)), "rows_at_target": rows}


def attack_steer_indefinite_service(*, seed: int = 0, verbose: bool = True, backends=SERVICE_BACKENDS,
                                    attacks=INDEFINITE, split_sessions=SPLIT_SESSIONS, **_) -> dict:
    """The indefinite attacks through a real server process: split on each of ``split_sessions`` (the default
    session, with the Gram statement in Field128, and one signed ``gram_proof = false``), and each other backend
    named; per row the pull towards W*, ||W|| against the honest release, and whether anything was released (and
    who was refused). ``default_refused_by_name``: every case refused by name on the default split session."""
    from secure_afl.analytic import solve_from_sums
    from secure_afl.stats import SufficientStatistics

    rng = np.random.default_rng(seed)
    honest = raw_statistics(rng, k=2)
    target = rng.choice([-5.0, 5.0], size=(DIM, CLASSES))
    s = honest[0] + honest[1]
    W0 = solve_from_sums(SufficientStatistics(s.gram + 2 * GAMMA * np.eye(DIM), s.cross, s.n, s.class_counts,
                                              1.0, 2 * GAMMA))
    rows = []
    for backend in backends:
        for session, section in (split_sessions if backend == "split" else ((None, None),)):
            gram, field = split_session_settings(section) if backend == "split" else (False, None)
            label = f"split {session}" if backend == "split" else backend
            for name in attacks:
                goal = psd_exact_target(honest, target) if name == "psd-exact-control" else target
                raw = indefinite_statistics(name, honest, goal)

                def bad(_packed, raw=raw):
                    return _packed_with_gamma(raw)

                from secure_afl.exceptions import BoundsExceeded, InsufficientShares

                base = {"backend": backend, "session": session, "gram_proof": gram, "field": field, "attack": name}
                try:
                    with _workdir() as d:
                        r = _service_round(backend, honest, Path(d), bad=bad, split=section)
                except InsufficientShares as e:  # secagg: the hospital's own software refuses to mask it, so
                    # the round loses it as a dropout and, with three hospitals, aborts: nothing revealed
                    rows.append({**base, "released": False,
                                 "refused": {}, "error": f"{type(e).__name__}: {e}", "pull": None,
                                 "norm_ratio": None, "rows_at_target": None})
                    if verbose:
                        print(f"[steer] {label:24s} {name:20s} NO RELEASE, nobody named ({str(e)[:90]})",
                              flush=True)
                    continue
                except BoundsExceeded as e:  # plain, ckks, bfv: an entry beyond the declared per-hospital bound
                    rows.append({**base, "released": False,
                                 "refused": {}, "error": f"refused before upload: {e}", "pull": None,
                                 "norm_ratio": None, "rows_at_target": None, "before_upload": True})
                    if verbose:
                        print(f"[steer] {label:24s} {name:20s} REFUSED before upload ({str(e)[:90]})", flush=True)
                    continue
                released = not r.get("error")
                row = {**base, "released": released,
                       "refused": r["refused"], "error": r.get("error"),
                       **_indefinite_row(name, r["W"], W0, goal, released and "h2" not in r["refused"])}
                if released and "h2" in r["refused"]:
                    row.update(pull=0.0, norm_ratio=float(np.linalg.norm(r["W"]) / np.linalg.norm(W0)))
                rows.append(row)
                if verbose:
                    if backend == "split":
                        label = f"split {session} ({field}, Gram statement {'on' if gram else 'off'})"
                    if not released:
                        what = f"NO RELEASE, nobody named ({(r['error'] or '')[:100]})"
                    elif r["refused"]:
                        what = (f"h2 REFUSED by name ({r['refused']['h2']} check); released over the others, "
                                f"||W|| {row['norm_ratio']:.2f} x honest")
                    else:
                        what = (f"released: pull {100 * row['pull']:5.1f}%, {row['rows_at_target']} of {DIM} rows "
                                f"within 10% of W*, ||W|| {row['norm_ratio']:.2f} x honest")
                    print(f"[steer] {label:24s} {name:20s} {what}", flush=True)
    accepted = [r for r in rows if r["backend"] == "split" and r["gram_proof"] and r["released"]
                and "h2" not in r["refused"]]
    default = [r for r in rows if r["backend"] == "split" and r["session"] == "default"]
    out = {"attack": "steer-indefinite", "outcome": "leak" if accepted else "refused", "rows": rows}
    if default:
        named = [r for r in default if r["refused"].get("h2")]
        out["default_refused_by_name"] = len(named) == len(default)
        if verbose:
            print(f"[steer] split default session: {len(named)} of {len(default)} exact-control cases refused by "
                  f"name{'' if len(named) == len(default) else ' (NOT every one)'}", flush=True)
    return out


def split_session_settings(section: dict | None) -> tuple[bool, str]:
    """(gram_proof, field) a split session signs with ``section`` as its [split] (None: the default)."""
    from secure_afl.split.sizes import FIELD_KEY, GRAM_KEY, split_choice

    chosen = split_choice((section or {}).get("field"), (section or {}).get("gram_proof"))
    return chosen[GRAM_KEY], chosen[FIELD_KEY]


def _packed_with_gamma(raw):
    """Raw statistics packed as the client packs them, the session's gamma I added (what modified software
    sends unchecked)."""
    from secure_afl.stats import SufficientStatistics

    return _layout().pack(SufficientStatistics(raw.gram + GAMMA * np.eye(DIM), raw.cross, raw.n, raw.class_counts,
                                               1.0, GAMMA))



def digits_gaussian(rng, hospitals: int, n: int):
    """A Gaussian fit of sklearn's digits (d = 64, C = 10: each class's mean and covariance), ``n`` samples per
    hospital drawn from it, every row scaled by the digits' largest row norm and clipped to norm 1; the real
    digits, scaled alike, held out as the test set."""
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    scale = np.max(np.linalg.norm(X, axis=1))
    fits = [(X[y == c].mean(axis=0), np.cov(X[y == c], rowvar=False)) for c in range(10)]

    def draw(k):
        yy = np.sort(rng.integers(0, 10, k))
        Z = np.concatenate([rng.multivariate_normal(*fits[c], size=int(np.sum(yy == c))) for c in range(10)]) / scale
        return Z / np.maximum(1.0, np.linalg.norm(Z, axis=1, keepdims=True)), yy

    return [draw(n) for _ in range(hospitals)], (X / scale, y)


def release_accuracy(stats, X, y, lam: float = 0.0):
    """The key holder's solve of a release (RI restored, W = (C + lam I)^+ Q over the eigenvalues above the
    cutoff)."""
    from secure_afl.analytic import solve_from_sums

    W = solve_from_sums(stats, lam=lam)
    return float(np.mean(np.argmax(X @ W, axis=1) == y))


def residual_words(D, gs, offset: int) -> np.ndarray:
    """The cheater's noise words (``gs.n_z``, grid units): an integer residual along ``D`` placed from ``offset``,
    as large as the session's noise statement lets it keep: every entry inside the proven per-entry range (the
    bits' ``[-(T_z - 1), T_z - 1]`` in Goldilocks, ``2^z_log2`` in Field128), every group's squared norm below its
    bound ``2^m_g`` and the whole at most ``l2_z`` (entries clipped, then the scale found by bisection)."""
    u = D.ravel() / np.linalg.norm(D)
    cap = (gs.T_z - 1) if not gs.noise_rows else (1 << gs.g["z_log2"]) - 1
    z_len, g_max = gs.g["z_len"], (1 << gs.g["m_g"]) - 1

    def at(s):
        z = np.zeros(gs.n_z, dtype=np.int64)
        z[offset:offset + u.size] = np.clip(np.trunc(s * u), -cap, cap).astype(np.int64)
        return z

    def fits(z):
        sq = [int(v) * int(v) for v in z]
        groups = [sum(sq[i:i + z_len]) for i in range(0, len(sq), z_len)]
        return sum(sq) <= gs.l2_z and max(groups) <= g_max

    lo, hi = 0.0, float(np.sqrt(gs.l2_z)) * 64.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if fits(at(mid)) else (lo, mid)
    return at(lo)


def noisy_zero_upload(circuit, z) -> tuple[np.ndarray, np.ndarray]:
    """``(lanes, factor words)`` of zero statistics (gamma I, no samples) carrying the noise words ``z`` (grid
    units) in the session's field: the lanes hold ``2^z_shift z`` at the noised entries, the words ``z``."""
    from secure_afl.stats import SufficientStatistics

    lay, gamma, gs, F = circuit.params.layout, float(circuit.params.gamma), circuit.part("gram"), circuit.F
    d, C = lay.dim, lay.n_classes
    zero = lay.pack(SufficientStatistics(gamma * np.eye(d), np.zeros((d, C)), 0.0, np.zeros(C), 1.0, gamma))
    x0, fw0 = circuit.witness(zero, noise=np.zeros(circuit.L))
    hi = F.decode_signed(x0[:circuit.L]).astype(object)
    hi[gs.i_noise] += np.asarray(z, dtype=np.int64).astype(object) * gs.z_scale
    return np.concatenate([F.encode_signed(hi), x0[circuit.L:]]), \
        np.concatenate([fw0[:gs.n_f], F.encode_signed(np.asarray(z, dtype=np.int64))])


def field_decode(params, words) -> np.ndarray:
    """split's lanes are centred integers carried in F_p, in the session's field: two Goldilocks lanes back to
    two's complement and the fixed point, or one Field128 word scaled by 2^-(f1 + f2) (as the collector reads)."""
    from secure_afl.hazmat import fixedpoint, flp
    from secure_afl.split.sizes import field_of

    F, fb = field_of(params), tuple(int(f) for f in params.backend_params["frac_bits"])
    if F is flp.GOLDILOCKS:
        return fixedpoint.decode(flp.decode_signed(words).view(np.uint64), fb)
    return np.ldexp(F.decode_signed_float(words), -(fb[0] + fb[1]))


def attack_dp_q_residual(*, seed: int = 0, verbose: bool = True, hospitals: int = 10, trials: int = 3,
                         n: int = 1000, lam: float | None = None, **_) -> dict:
    """A DP + Gram split session (d = 64, C = 10, a Gaussian fit of digits, epsilon = 1, n_max = 1000, three noise
    shares): the last of ``hospitals`` uploads zero statistics and puts a structured residual in Q through its
    noise words, as large as the session lets it (every entry inside the per-entry range, ``|z|^2 <= l2_z``), in
    the direction that hurts most of those tried (every class pushed onto the test mean, the honest Q shrunk, the
    honest W's classes permuted; the attacker knows the honest sums). Its upload is proven and judged by the
    session's real circuit; the release is the honest hospitals' noisy statistics plus the cheater's decoded lanes
    when accepted, solved with the ridge ``lam`` (default twice the operator norm the honest shares' sum
    typically has, ``4 sqrt(d) sd sqrt(hospitals - 1)``: the noisy Gram is indefinite, and an unridged solve of it
    is erratic). Returns the accuracies of the honest hospitals' release alone and of the release with the
    cheater, and the verdicts."""
    from secure_afl import split
    from secure_afl.backends.session_params import dp_session_params
    from secure_afl.dp import DPSpec, add_noise_share
    from secure_afl.packing import Layout
    from secure_afl.params import Bounds
    from secure_afl.stats import SufficientStatistics, local_statistics

    d, C, gamma = 64, 10, 1.0
    lay = Layout(d, C)
    params = dp_session_params(DPSpec(1.0, 1e-5, 3), "split", "dp-q-residual", lay, gamma, Bounds(1.0, n, 10),
                               gram_proof=True)
    circuit = split.Circuit(params)
    gs = circuit.part("gram")
    if lam is None:
        lam = 4.0 * np.sqrt(d) * split.sizes.dp_share_std(params) * np.sqrt(hospitals - 1)
    rng = np.random.default_rng(seed)
    out = {"lam": float(lam), "honest_alone": [], "with_cheater": [], "verdicts": [], "residual_fro": []}
    cross = np.arange(lay.slices["cross"].start, lay.slices["cross"].stop) - gs.i_noise[0]
    for trial in range(trials):
        shares, (Xt, yt) = digits_gaussian(rng, hospitals - 1, n)
        noisy = [lay.unpack(add_noise_share(params, lay.pack(local_statistics(X, yy, C, gamma=gamma)),
                                            rng=np.random.default_rng(1000 * seed + 100 * trial + h)))
                 for h, (X, yy) in enumerate(shares)]
        honest = noisy[0]
        for s in noisy[1:]:
            honest = honest + s
        out["honest_alone"].append(release_accuracy(honest, Xt, yt, lam))
        from secure_afl.analytic import solve_from_sums

        W_h = solve_from_sums(honest, lam=lam)
        dirs = [np.outer(Xt.mean(axis=0), np.eye(C)[c]) for c in range(C)] + \
            [-honest.cross, honest.gram @ W_h[:, np.roll(np.arange(C), 1)] - honest.cross]
        worst = None
        grid = 2.0 ** -int(params.backend_params["frac_bits"][0])
        for D in dirs:
            zq = residual_words(D, gs, int(cross[0]))[cross].reshape(d, C) * grid
            acc = release_accuracy(SufficientStatistics(honest.gram + gamma * np.eye(d), honest.cross + zq, honest.n,
                                                 honest.class_counts, honest.contributors + 1, gamma), Xt, yt, lam)
            if worst is None or acc < worst[0]:
                worst = (acc, D)
        # the cheater's upload: zero statistics (gamma I, no samples), the residual in its Q noise words
        lanes, fw = noisy_zero_upload(circuit, residual_words(worst[1], gs, int(cross[0])))
        body, seed_b, com = circuit.prove("cheater", lanes=lanes, factor=fw)
        qs = os.urandom(32)
        verdict = circuit.decide(circuit.query(circuit.leader_share(body), com, "cheater", qs, leader=True),
                                 circuit.query(circuit.helper_share(seed_b), com, "cheater", qs, leader=False))
        cheat = lay.unpack(field_decode(params, lanes))
        out["verdicts"].append(verdict)
        out["residual_fro"].append(float(np.linalg.norm(cheat.cross)))
        out["with_cheater"].append(release_accuracy(honest + cheat if verdict is None else honest, Xt, yt, lam))
    if verbose:
        v = out["verdicts"]
        print(f"DP + Gram split, d = {d}, C = {C}, Gaussian fit of digits, {hospitals - 1} honest hospitals of {n} "
              f"and one cheater (zero statistics, a Q residual of Frobenius norm {max(out['residual_fro']):.1f}, "
              f"sqrt(l2_z) = {np.sqrt(gs.l2_z) * 2.0 ** -int(params.backend_params['frac_bits'][0]):.1f}): "
              f"{'RELEASED' if all(x is None for x in v) else 'REFUSED by name ' + str(v)}; accuracy "
              f"{np.mean(out['honest_alone']):.3f} (honest alone) -> {np.mean(out['with_cheater']):.3f} "
              f"(with the cheater), mean of {trials}, ridge {lam:.0f}")
    return out
