"""split: the server and the key holder, each alone, a server that narrows the cohort with colluders; and a
secagg server that re-runs a completed round without the victim."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
from secure_afl import pki
from secure_afl.session.signed import load_signed
from secure_afl.backends import get_backend
from secure_afl.envelope import seal
from secure_afl.exceptions import SecureAFLError
from secure_afl.stats import local_statistics

from .attack_parties import ForgingSplitSource, forge_verifier, subset_manifest
from .harness import make_pki, server_section, write_session
from .attacks_validity import field_decode
from .attack_common import fresh_keyholder, CLASSES, DIM, GAMMA, attack_bounds, attack_layout, embeddings, packed_vector, say, workdir
from secure_afl.server import aggregator, closing, intake, split_round


# ---------------------------------------------------------------------------
# split: the server and the key holder, each alone
# ---------------------------------------------------------------------------
def _split_service(d: Path, hospitals=("hosp-a", "hosp-b", "hosp-c"), min_clients: int = 2, seed: int = 0,
                   extra_session: dict | None = None):
    """A real split session in process: PKI, signed session, the server role (SQLite, payload files, audit),
    the key holder's keygen and publication, and every hospital's signed upload. Returns
    (server, key holder, pki_dir, {hospital: packed vector})."""
    from secure_afl import pki
    from secure_afl.session.signed import load_signed
    from secure_afl.clients.hospital import protect_contribution
    from secure_afl.keyholder import KeyHolder
    from secure_afl.server.aggregator import open_server
    from secure_afl.server.config import load_config
    from secure_afl.signing import sign_upload
    from secure_afl.stats import local_statistics

    pki_dir = d / "pki"
    make_pki(pki_dir, hospitals, name="attack consortium")
    b, sid = attack_bounds(), "attack-split"
    # the server role runs in process: the port is never bound
    config = write_session(d / "session.toml", pki_dir, {
        "session": {"id": sid, "backend": "split", "dim": DIM, "classes": CLASSES, "gamma": GAMMA,
                    "min_clients": min_clients, "min_class_count": 1, "hospitals": list(hospitals),
                    **(extra_session or {})},
        "bounds": {"max_norm": b.max_norm, "n_max": b.n_max, "k_max": b.k_max},
        "server": server_section(d, pki_dir, port=8443)})
    srv = open_server(load_config(config))
    kh = KeyHolder(pki_dir, "keyholder", d / "keys", passphrase=os.urandom(16).hex().encode())
    kh.keygen(load_signed(pki_dir, sid).session_params())
    aggregator.publish_context(srv, "keyholder:keyholder", kh.publication_body(sid))
    rng = np.random.default_rng(seed)
    vectors = {}
    for i, h in enumerate(hospitals):
        party = pki.load_party(pki_dir, "hospital", h)
        X, y = embeddings(rng, 1 if i == 0 else 20, labels=[1] if i == 0 else None)
        stats = local_statistics(X, y, CLASSES)
        payload, tag = protect_contribution(party, srv.params, stats, public_context=srv.public_context)
        st = sign_upload(party.identity_key(), sid, srv.params.digest(), hashlib.sha256(payload).digest(), h)
        intake.submit(srv, h, st, payload, tag)
        vectors[h] = (packed_vector(X, y), X[0])
    closing.close(srv, "keyholder:keyholder")
    return srv, kh, pki_dir, vectors


def _field(params):
    from secure_afl.split.sizes import field_of

    return field_of(params)


class _InProcessSource:
    """What the server hands the key holder for a split release (the manifest and the signed seed statements)."""

    def __init__(self, srv, manifest=None):
        self._srv, self._manifest = srv, manifest

    def manifest(self) -> dict:
        return self._manifest if self._manifest is not None else closing.released(self._srv)[1]

    def tags(self) -> dict:
        return closing.tags(self._srv)

    def split_queries(self, queries: dict) -> dict:
        """The server's signed verifier messages at the key holder's query seeds, as ``POST /split/queries``
        forms them."""
        from secure_afl.encoding import canonical_json

        return split_round.form_verifier_messages(self._srv, "keyholder:keyholder", canonical_json(queries))


def attack_split_server(*, seed: int = 0, verbose: bool = True, work=None, **_) -> dict:
    """The singleton attack against a split masked vector, by the server that stores it: uniform words."""
    from scipy import stats as sstats

    from secure_afl.backends import get_backend

    with workdir(work) as d:
        srv, kh, _, vectors = _split_service(d, seed=seed)
        try:
            victim = sorted(vectors)[0]
            payload = srv.store.get_blob(next(r["payload_sha256"] for r in srv.store.uploads()
                                              if r["hospital"] == victim))
            words = get_backend(srv.params).masked_words(payload)
            x_hat = attack_layout().unpack(field_decode(srv.params, words), gamma=GAMMA).cross[:, 1]
        finally:
            aggregator.shutdown(srv)
    err = float(np.max(np.abs(x_hat - vectors[victim][1])))
    # 16 bins of the top 4 bits: a few hundred words fill them enough for the chi-square approximation
    high = words["hi"] if words.dtype.names else words  # a Field128 word's high half
    top = np.bincount((high >> np.uint64(60)).astype(np.int64), minlength=16)
    p_uniform = float(sstats.chisquare(top).pvalue)
    uniform = p_uniform > 1e-4
    outcome = "recovered" if err < 1e-3 else "refused" if uniform and err > 1.0 else "leak"
    say(verbose, f"[split-server] {outcome.upper()}: the stored masked vector's words are "
                  f"{'uniform' if uniform else 'NOT uniform'} (chi-square p = {p_uniform:.3f}); "
                  f"'x = Q[:, y]' off by {err:.3g}")
    return {"attack": "split-server", "outcome": outcome, "p_uniform": p_uniform, "max_error": err}


def attack_split_keyholder(*, seed: int = 0, verbose: bool = True, work=None, **_) -> dict:
    """A curious split key holder: it opens the victim's seed (as every release does) and asks the server's
    every route for a masked vector to unmask with it."""
    from secure_afl import split
    from secure_afl.backends import get_backend
    from secure_afl.exceptions import SecureAFLError

    with workdir(work) as d:
        srv, kh, _, vectors = _split_service(d, seed=seed)
        try:
            victim = sorted(vectors)[0]
            params = kh.params(srv.config.session_id)
            # everything a release gives it: the manifest, the signed seed statements, and its own share
            body, _ = kh.release_split(params.session_id, _InProcessSource(srv), min_clients=2)
            manifest = closing.released(srv)[1]
            p = next(e for e in manifest["participants"] if e["hospital"] == victim)
            box = bytes.fromhex(closing.tags(srv)[victim]["box"])
            seed_v = split.open_seed(params, kh.secret_context(params.session_id), victim, p["payload_sha256"], box)
            got, refusals = None, []
            for name, ask in (("GET /contributions/{h}", lambda: closing.contribution(srv, victim)),
                              ("GET /aggregate", lambda: closing.masked_aggregate(srv))):
                try:
                    got = ask()
                    break
                except SecureAFLError as e:
                    refusals.append(f"{name}: {type(e).__name__}")
        finally:
            aggregator.shutdown(srv)
    err = float("inf")
    if got is not None:
        from secure_afl import split
        F = _field(params)
        words = np.array(get_backend(params).masked_words(got))
        words = F.sub(words, F.expand_field(seed_v, words.shape[0], split.DOMAIN_SHARE))
        x_hat = attack_layout().unpack(field_decode(params, words), gamma=GAMMA).cross[:, 1]
        err = float(np.max(np.abs(x_hat - vectors[victim][1])))
    outcome = "recovered" if err < 1e-6 else "refused" if got is None else "leak"
    say(verbose, f"[split-keyholder] {outcome.upper()}: it holds the victim's seed and a {len(body)}-byte share; "
                  + ("no route served a masked vector (" + "; ".join(refusals) + ")" if got is None else
                     f"a route served a masked vector: the victim's x off by {err:.3g}"))
    return {"attack": "split-keyholder", "outcome": outcome, "refusals": refusals, "max_error": err}


def attack_split_subset(*, seed: int = 0, verbose: bool = True, work=None, **_) -> dict:
    """A malicious split server after one hospital: a manifest naming only the victim, then the key holder's
    genuine share combined with the victim's masked vector alone."""
    from secure_afl import split
    from secure_afl.backends import get_backend
    from secure_afl.exceptions import SecureAFLError
    from secure_afl.signing import MANIFEST_PREFIX, canonical_json

    with workdir(work) as d:
        srv, kh, pki_dir, vectors = _split_service(d, seed=seed)
        try:
            victim = sorted(vectors)[0]
            params = kh.params(srv.config.session_id)
            genuine = closing.released(srv)[1]
            # (1) the server signs a manifest of the victim alone and asks for the share that unmasks it
            st = {k: v for k, v in genuine.items() if k != "signature"}
            st = {**st, "min_clients": 1, "participants": [e for e in st["participants"] if e["hospital"] == victim]}
            forged = {**st, "signature": srv.key.sign(MANIFEST_PREFIX + canonical_json(st)).hex()}
            payload = srv.store.get_blob(next(r["payload_sha256"] for r in srv.store.uploads()
                                              if r["hospital"] == victim))
            from secure_afl.envelope import seal

            alone_sum = seal(params, "aggregate", _field(params).to_bytes(get_backend(params).masked_words(payload)),
                             contributors=1)  # what the server combines: the victim's masked vector alone

            def combine(manifest, body, statement):
                try:
                    share = split.verify_share(params, manifest, body, statement, kh.party.identity_pub())
                    v = split.collect(params, alone_sum, share)
                    err = float(np.max(np.abs(v - vectors[victim][0])))
                    return err, f"combined with the victim's masked vector: off by {err:.3g}"
                except SecureAFLError as e:
                    return float("inf"), f"combined with the victim's masked vector: {type(e).__name__}"

            alone = fresh_keyholder(kh, pki_dir, d, "alone")
            try:
                err1, first = combine(forged, *alone.release_split(params.session_id, _InProcessSource(srv, forged),
                                                                   min_clients=2))
            except SecureAFLError as e:
                err1, first = float("inf"), f"no share ({type(e).__name__})"
            # (2) the genuine share (whole cohort) against the victim's masked vector alone
            err2, second = combine(genuine, *kh.release_split(params.session_id, _InProcessSource(srv),
                                                              min_clients=2))
        finally:
            aggregator.shutdown(srv)
    err = min(err1, err2)
    victim_share = np.isfinite(err1)
    outcome = "recovered" if err < 1e-6 else "refused" if not np.isfinite(err) else "leak"
    say(verbose, f"[split-subset] {outcome.upper()}: victim-only manifest -> {first}; the cohort's genuine share "
                  f"-> {second}")
    return {"attack": "split-subset", "outcome": outcome, "victim_only_share": bool(victim_share), "max_error": err}


def _subset_sum(srv, params, keep) -> bytes:
    """The masked sum of the uploads of ``keep`` as the server forms it (the collector's input)."""
    F, be = _field(params), get_backend(params)
    total = None
    for r in srv.store.uploads():
        if r["hospital"] in keep:
            w = be.masked_words(srv.store.get_blob(r["payload_sha256"]))
            total = w if total is None else F.add(total, w)
    return seal(params, "aggregate", F.to_bytes(total), contributors=len(keep))


def attack_split_cohort(*, seed: int = 0, verbose: bool = True, work=None, roster: int = 6, **_) -> dict:
    """A malicious split server with min_clients - 1 colluders shrinks the cohort to one honest hospital
    (``roster`` hospitals at min_clients 3 and the signed default colluder bound)."""
    from secure_afl import split
    from secure_afl.cohort import release_policy

    hospitals = tuple(f"hosp-{x}" for x in "abcdefghijklmnop"[:roster])
    with workdir(work) as d:
        srv, kh, pki_dir, vectors = _split_service(Path(d), hospitals=hospitals, min_clients=3, seed=seed)
        try:
            params = kh.params(srv.config.session_id)
            policy = release_policy(load_signed(pki_dir, params.session_id))
            victim, colluders = hospitals[0], hospitals[-(policy.min_clients - 1):]
            others = [h for h in hospitals if h != victim and h not in colluders]
            key = srv.key  # the server's identity key: whatever it signs, the key holder takes as the server's
            genuine = closing.released(srv)[1]
            known = sum(vectors[h][0] for h in colluders)

            def combine(manifest, source, label):
                """The key holder's release of ``manifest``'s share, then the collector's sum as the server forms
                it, less the colluders' own vectors: the victim's estimate and its error."""
                from secure_afl.release_checks import ReleaseLedger

                fresh = fresh_keyholder(kh, pki_dir, Path(d), label)
                try:
                    body, st = fresh.release_split(params.session_id, source, min_clients=1)
                except SecureAFLError as e:
                    ledger = ReleaseLedger(fresh.keys_dir / "releases.sqlite3")
                    try:  # recorded before any seed is opened: 0 means the refusal came first
                        opened = ledger.decryption_count(params.backend_params[split.PUBLIC_CONTEXT_KEY])
                    finally:
                        ledger.close()
                    return {"outcome": "refused", "why": f"{type(e).__name__}: {e}", "seeds_opened": opened}
                keep = st["cohort"]
                share = split.verify_share(params, manifest, body, st, kh.party.identity_pub())
                v = split.collect(params, _subset_sum(srv, params, keep), share)
                err = float(np.max(np.abs(v - known - vectors[victim][0])))
                return {"outcome": "recovered" if err < 1e-6 else "released", "residual": err, "cohort": keep,
                        "statement": st, "why": f"released over {len(keep)}: {', '.join(keep)}"}

            forged = combine(genuine, ForgingSplitSource(srv, key, forge=others), "forged")
            small = subset_manifest(genuine, [victim, *colluders], key)
            smallest = combine(small, ForgingSplitSource(srv, key, manifest=small), "small")
            allowed_set = [victim, *colluders, *others[:policy.quorum - 1 - len(colluders)]]
            allowed_m = subset_manifest(genuine, allowed_set, key)
            allowed = combine(allowed_m, ForgingSplitSource(srv, key, manifest=allowed_m), "quorum")
            # one forged refusal: within the limit, so released over the rest; the evidence names the server
            one = combine(genuine, ForgingSplitSource(srv, key, forge=others[:1]), "one")
            attributed = None
            if one["outcome"] != "refused" and others[0] not in (one["statement"].get("evidence") or {}):
                attributed = {"verdict_from_messages": None, "at_fault": None, "recorded_as": "no evidence published",
                              "forged_message_kept": False}
            elif one["outcome"] != "refused" and others[0] in one["statement"]["refused"]:
                h = others[0]
                row = next(r for r in srv.store.uploads() if r["hospital"] == h)
                server_msg = forge_verifier(params, split_round.verifier_messages(srv)[h], key)
                # what the server published is in the key holder's evidence file: the forged message it signed
                ev = one["statement"]["evidence"][h]
                kept = json.loads((Path(d) / "keys-one" / f"{params.session_id}.validity-refusals.json")
                                  .read_text())["server_messages"][h]
                verdict = split.joint_verdict(params, h, row["payload_sha256"], kept,
                                                       ev["keyholder_message"], srv.party.identity_pub())
                # the hospital's own seed (it keeps it sealed beside its receipt; here the simulation opens its box)
                h_seed = split.open_seed(params, kh.secret_context(params.session_id), h, row["payload_sha256"],
                                         bytes.fromhex(closing.tags(srv)[h]["box"]))
                d_out = split.dispute(params, h, srv.store.get_blob(row["payload_sha256"]), closing.tags(srv)[h],
                                      h_seed, kept, ev["keyholder_message"], srv.party.identity_pub())
                attributed = {"verdict_from_messages": verdict, "at_fault": d_out["at_fault"],
                              "recorded_as": ev["attribution"], "forged_message_kept": kept == server_msg or
                              kept["message"] == server_msg["message"]}
        finally:
            aggregator.shutdown(srv)
    closed = [forged, smallest]
    outcome = "recovered" if any(r["outcome"] == "recovered" for r in closed) else "refused"
    say(verbose, f"[split-cohort] forged refusals of {len(others)} honest uploads: {forged['outcome'].upper()} "
                  f"({forged['why']})")
    say(verbose, f"[split-cohort] manifest of the victim and {len(colluders)} colluders: "
                  f"{smallest['outcome'].upper()} ({smallest['why']})")
    say(verbose, f"[split-cohort] manifest of q = {policy.quorum} (victim, colluders, "
                  f"{policy.quorum - 1 - len(colluders)} honest): {allowed['outcome'].upper()}"
                  + (f" with residual {allowed['residual']:.3g} (the other honest hospitals' statistics stay in "
                     "the colluders' view of the victim)" if "residual" in allowed else f" ({allowed['why']})"))
    if attributed is not None:
        say(verbose, f"[split-cohort] one forged refusal: {one['outcome'].upper()} ({one['why']}); recorded as "
                      f"'{attributed['recorded_as']}', the two published messages give '{attributed['verdict_from_messages']}', "
                      f"and the hospital's own upload shows the {attributed['at_fault']} at fault")
    return {"attack": "split-cohort", "outcome": outcome, "forged": forged["outcome"],
            "small_manifest": smallest["outcome"], "small_manifest_seeds_opened": smallest.get("seeds_opened"),
            "quorum_release": allowed["outcome"],
            "quorum_residual": allowed.get("residual"), "quorum": policy.quorum, "one_forged": one["outcome"],
            "attributed": attributed,
            "max_error": min(r.get("residual", float("inf")) for r in (forged, smallest))}


# ---------------------------------------------------------------------------
# split: a server that re-masks the sum once it holds the key holder's share
# ---------------------------------------------------------------------------
class _ShareConn:
    """The key holder's connection as its share path uses it: ``POST .../split/share`` to the in-process server."""

    def __init__(self, srv):
        self.srv, self.session_id = srv, srv.config.session_id

    def path(self, p: str) -> str:
        return p

    def request(self, method, path, body=b"", headers=None):
        from secure_afl.protocol import H_TAG

        return split_round.collect_request(self.srv, "keyholder:keyholder", body, (headers or {}).get(H_TAG))


def _re_masked(params, masked_sum: bytes, share: bytes, contributors: int):
    """What a server holding every masked upload and the share forms: ``enc(v*) - share`` for v* the cohort's
    true statistics with classes 0 and 1 swapped. Returns (sealed forged sum, v* unpacked)."""
    import dataclasses

    from secure_afl import split

    F, layout = _field(params), attack_layout()
    share = F.from_bytes(share, split.main_words(params))
    stats = layout.unpack(split.collect(params, masked_sum, share), gamma=params.gamma)
    swap = [1, 0] + list(range(2, CLASSES))
    target = dataclasses.replace(stats, cross=stats.cross[:, swap], class_counts=stats.class_counts[swap])
    forged = F.sub(split.Circuit(params).lanes(layout.pack(target)), share)
    return seal(params, "aggregate", F.to_bytes(forged), contributors=contributors), target


def attack_split_remask(*, seed: int = 0, verbose: bool = True, work=None, **_) -> dict:
    """A split server that would choose W: it asks for the key holder's share before it commits to the
    cohort's masked sum, then, holding the share, answers ``enc(v*) - share`` for its target aggregate v*
    (classes 0 and 1 swapped) as a second commitment, and finally stores that sum in place of the one it gave."""
    import base64
    import subprocess
    import sys

    from secure_afl import split
    from secure_afl.analytic import solve_from_sums
    from secure_afl.model_file import model_metadata, write_model

    refusals = {}
    with workdir(work) as d:
        srv, kh, pki_dir, vectors = _split_service(d, seed=seed)
        try:
            sid, party = srv.config.session_id, "keyholder:keyholder"
            params = kh.params(sid)
            body, statement = kh.release_split(sid, _InProcessSource(srv), min_clients=2)
            kh.keep_split_share(sid, body, statement)
            try:  # (1) the share asked for before any commitment
                kh.send_split_share(_ShareConn(srv))
            except SecureAFLError as e:
                refusals["share_before_commit"] = f"{type(e).__name__}({getattr(e, 'reason', '')}): {e}"
            manifest = closing.released(srv)[1]
            honest = split_round.commit(srv, party, statement)
            share = kh.take_commitment(sid, manifest, honest)
            split_round.collect(srv, party, share, statement)
            # (2) holding the share: enc(v*) - share, signed by the server for the key holder's statement
            forged, target = _re_masked(params, base64.b64decode(honest["aggregate"]), share,
                                        len(statement["cohort"]))
            second = {"masked_sum": split.sign_masked_sum(srv.key, params, statement, forged),
                      "aggregate": base64.b64encode(forged).decode()}
            try:
                kh.take_commitment(sid, manifest, second)
            except SecureAFLError as e:
                refusals["second_sum"] = f"{type(e).__name__}: {e}"
            res = kh.release_kept(sid)
            # (3) the server's state then holds the re-masked sum in place of the one it gave
            srv.store.set_meta("split_result", {**srv.store.get_meta("split_result"),
                                                "masked_sum": second["masked_sum"],
                                                "masked_sum_blob": srv.store.put_blob(forged)})
        finally:
            aggregator.shutdown(srv)
        write_model(d / "model.safetensors", res.W, model_metadata(res.params, res.report, 0.0))
        audit = subprocess.run([sys.executable, "-m", "secure_afl.cli", "audit", "release", "--state",
                                str(d / "server" / sid), "--pki", str(pki_dir), "--model", str(d / "model.safetensors"),
                                "--kept", str(kh.keys_dir / f"{sid}.split-commitment.json")],
                               capture_output=True, text=True, timeout=300)
    lines = audit.stdout.strip().splitlines()
    named = lines[-1] if lines else audit.stderr.strip()[-200:]
    W_plain = solve_from_sums(attack_layout().unpack(sum(v for v, _ in vectors.values()), gamma=GAMMA))
    W_target = solve_from_sums(target)
    rel = float(np.linalg.norm(res.W - W_plain) / np.linalg.norm(W_plain))
    to_target = float(np.linalg.norm(res.W - W_target) / np.linalg.norm(W_target))
    bound = float(res.report["w_error_bound"]["rel_bound"])
    outcome = "steered" if to_target < 1e-3 else \
        "refused" if rel <= bound and len(refusals) == 2 and named.startswith("AT FAULT: the server") else "leak"
    say(verbose, f"[split-remask] {outcome.upper()}: share before the commitment: "
                 f"{refusals.get('share_before_commit', 'SENT')}; enc(v*) - share as a second sum: "
                 f"{refusals.get('second_sum', 'TAKEN')}; W off the plaintext solve by {rel:.3g} (bound {bound:.3g}), "
                 f"off the server's target by {to_target:.3g}; the audit of the stored re-masked sum: {named}")
    return {"attack": "split-remask", "outcome": outcome, "refusals": refusals, "w_rel_error": rel,
            "w_rel_bound": bound, "w_to_target": to_target, "audit": named, "audit_rc": audit.returncode}


def attack_secagg_rerun(*, seed: int = 0, verbose: bool = True, work=None, **_) -> dict:
    """A secagg server re-runs a completed round (same number, fresh keys) after the hospitals restarted."""
    from concurrent.futures import ThreadPoolExecutor

    from secure_afl.clients.hospital import HospitalClient, protect_vector
    from secure_afl.clients.secagg_client import run_secagg
    from secure_afl.keyholder import KeyHolder
    from secure_afl.secagg import SecAggBackend

    from .harness import start_server

    names = ["h1", "h2", "h3", "h4"]
    victim = names[0]
    rng = np.random.default_rng(seed)
    with workdir(work) as d:
        d = Path(d)
        pki_dir = d / "pki"
        make_pki(pki_dir, names, name="attack consortium")
        b, sid = attack_bounds(), "attack-rerun"
        sections = {"session": {"id": sid, "backend": "secagg", "dim": DIM, "classes": CLASSES, "gamma": GAMMA,
                                "min_clients": 2, "min_class_count": 1, "hospitals": names},
                    "bounds": {"max_norm": b.max_norm, "n_max": b.n_max, "k_max": b.k_max},
                    "secagg": {"threshold": 2, "stage_timeout_s": 5.0}}
        stats = {h: local_statistics(*embeddings(rng, 12), CLASSES) for h in names}
        kh = KeyHolder(pki_dir, "keyholder", d / "keys", passphrase=os.urandom(16).hex().encode())

        def run_server(label, taking_part):
            """One server process of the signed session (its own data directory: a fresh round 1), each
            hospital of ``taking_part`` a fresh process (a restart) with its own PKI bundle, where its record is."""
            srv_section = server_section(d / label, pki_dir)
            cfg = write_session(d / f"{label}.toml", pki_dir, {**sections, "server": srv_section})
            url = f"https://127.0.0.1:{srv_section['port']}"
            server = start_server(cfg, d / f"{label}.log", url, kh.party)
            try:
                def one(h):
                    cl = HospitalClient(url, sid, pki.load_party(pki_dir, "hospital", h), timeout=60,
                                        receipts_dir=d / "receipts" / label / h)
                    try:
                        p = cl.fetch_params()
                        return run_secagg(cl, p, stats[h], timeout=60)
                    except SecureAFLError as e:
                        return e
                    finally:
                        cl.close()

                with ThreadPoolExecutor(max_workers=len(taking_part)) as pool:
                    answers = dict(zip(taking_part, pool.map(one, taking_part)))
                conn = kh.connect(url, sid)
                try:  # what the server itself holds: the masked sum and the reconstructed unmask material
                    if conn.info()["status"] != "released":
                        conn.request("POST", conn.path("/close"))
                    agg = conn.request("GET", conn.path("/aggregate")).content
                    unmask = conn.request("GET", conn.path("/secagg/unmask-material")).json()
                    p = load_signed(pki_dir, sid).session_params()
                    return answers, SecAggBackend(p).reveal(agg, unmask=unmask)
                except SecureAFLError:
                    return answers, None
                finally:
                    conn.close()
            finally:
                server.stop()

        first, sum_all = run_server("first", names)
        second, sum_rest = run_server("second", names[1:])
        p = load_signed(pki_dir, sid).session_params()
        truth = protect_vector(p, stats[victim])
    refusals = {h: f"{type(a).__name__}" for h, a in second.items() if isinstance(a, BaseException)}
    err = float("inf") if sum_all is None or sum_rest is None else float(np.max(np.abs(sum_all - sum_rest - truth)))
    outcome = "recovered" if err < 1e-6 else "refused" if sum_rest is None else "leak"
    say(verbose, f"[secagg-rerun] {outcome.upper()}: first round released over {len(names)}"
                  f"{'' if sum_all is not None else ' (NOT released)'}; the re-run of round 1 without {victim}: "
                  + (f"refused by {len(refusals)} of {len(names) - 1} hospitals ({', '.join(sorted(refusals))})"
                     if sum_rest is None else f"released, the difference off the victim by {err:.3g}"))
    return {"attack": "secagg-rerun", "outcome": outcome, "first_released": sum_all is not None,
            "refused_by": sorted(refusals), "max_error": err}


#: a real split session in process (PKI, signed session, server role, key holder, every upload), for tests that
#: play the server against the key holder
split_service = _split_service
