"""split: the key holder forms the release from the server-signed masked sum over its own signed cohort, and the
server's part is checkable (``secure-afl audit release``); a pilot compares the model with plaintext
(``secure-afl audit compare``).

The e2e tests run real server processes over HTTPS. The server is made malicious the way a compromised server
would be: its stored commitment is replaced (and re-signed with its own identity key, which such a server holds),
before the key holder asks for it, or after the share has left (then holding the aggregate).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import subprocess
import sys

import numpy as np
import pytest

from secure_afl import domains, pki, split
from secure_afl.analytic import solve_from_sums
from secure_afl.backends import get_backend
from secure_afl.clients.statsfile import write_statistics_file
from secure_afl.encoding import canonical_json
from secure_afl.envelope import open_envelope, seal
from secure_afl.exceptions import EXIT_INPUT, EXIT_SECURITY, PolicyViolation, SecureAFLError
from secure_afl.keyholder.release import split_share
from secure_afl.packing import Layout
from secure_afl.params import SessionParams
from secure_afl.hazmat import fixedpoint, flp
from secure_afl.keyholder import write_model
from secure_afl.model_file import model_metadata
from secure_afl.keyholder.verify import ServerForgery
from secure_afl.release_checks import ReleaseLedger
from secure_afl.server.store import Store
from secure_afl.session.signed import load_signed

pytestmark = [pytest.mark.e2e, pytest.mark.security]

HOSPITALS = ("h1", "h2", "h3")


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "secure_afl.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def _uploaded(consortium):
    """A split session with three honest uploads and the round closed: (consortium, plaintext stats per hospital)."""
    # Goldilocks without the statement, signed explicitly: these tests forge Goldilocks words
    c = consortium(backend="split", hospitals=HOSPITALS, min_clients=2, extra_session={"min_class_count": 1},
                   split={"field": "goldilocks", "gram_proof": False})
    c.start()
    c.keyholder.keygen(load_signed(c.pki_dir, c.session_id).session_params())
    with c.connect_keyholder() as conn:
        c.keyholder.publish(conn)
    plain = {}
    for h in HOSPITALS:
        cl = c.hospital(h)
        plain[h] = c.stats(*c.data(h))
        cl.submit(plain[h])
        cl.close()
    return c, plain


def _total(plain: dict):
    out = None
    for s in plain.values():
        out = s if out is None else out + s
    return out


def _server_sign(c, statement: dict) -> dict:
    key = pki.load_party(c.pki_dir, "server", "aggregator").identity_key()
    return {**statement, "signature": key.sign(domains.SPLIT_SUM + canonical_json(statement)).hex()}


def _stored(c):
    """What the server holds: (params, its signed answer record, masked uploads by hospital, the masked sum)."""
    store = Store(c.root / "server" / c.session_id)
    try:
        record = store.get_meta("split_result")
        uploads = {r["hospital"]: store.get_blob(r["payload_sha256"]) for r in store.uploads()}
        return c.keyholder.params(c.session_id), record, uploads, store.get_blob(record["masked_sum_blob"])
    finally:
        store.close()


def _blocked(c) -> str | None:
    ledger = ReleaseLedger(c.keyholder.keys_dir / "releases.sqlite3")
    try:
        return ledger.blocked_reason(c.keyholder.params(c.session_id).backend_params[split.PUBLIC_CONTEXT_KEY])
    finally:
        ledger.close()


def test_the_model_is_the_key_holders_own_release_over_its_own_cohort(consortium, tmp_path):
    # Prepare
    c, plain = _uploaded(consortium)
    # Execute: the key holder's real finalize against the real server
    with c.connect_keyholder() as conn:
        res = c.keyholder.finalize(conn, min_clients=2)
    # Assert: W is the key holder's solve of the plaintext sum (within its certified bound), over its cohort
    W_plain = solve_from_sums(_total(plain))
    rel = np.linalg.norm(res.W - W_plain) / np.linalg.norm(W_plain)
    assert res.report["w_error_bound"]["applies"] and rel <= res.report["w_error_bound"]["rel_bound"]
    assert res.report["participants"] == list(HOSPITALS) and res.report["refused"] == {}
    params, record, _, masked = _stored(c)
    assert res.report["participants"] == record["share_statement"]["cohort"]
    assert res.report["masked_sum_sha256"] == hashlib.sha256(masked).hexdigest()
    # with nothing refused, the cohort's masked sum is the manifest's own masked aggregate, byte for byte
    assert res.report["masked_sum_sha256"] == res.manifest["aggregate_sha256"]


def _statement_formed(c, conn):
    """The key holder's share and signed statement formed over the real server's manifest and kept (the share
    has not left); the round is closed."""
    from secure_afl.keyholder.release import HTTPSource

    c.keyholder.close_round(conn)
    body, statement = c.keyholder.release_split(c.session_id, HTTPSource(conn), min_clients=2)
    c.keyholder.keep_split_share(c.session_id, body, statement)
    return body, statement


def _commit_as(c, statement: dict, masked: bytes) -> None:
    """The compromised server stores, as its commitment for ``statement``, its own signature over ``masked``:
    what its `.../split/commit` then answers."""
    store = Store(c.root / "server" / c.session_id)
    try:
        params = SessionParams.from_dict(store.get_meta("params"))
        key = pki.load_party(c.pki_dir, "server", "aggregator").identity_key()
        store.set_meta("split_commit", {"share_statement": statement,
                                        "masked_sum": split.sign_masked_sum(key, params, statement, masked),
                                        "masked_sum_blob": store.put_blob(masked)})
    finally:
        store.close()


def test_a_forged_stale_or_mismatched_masked_sum_is_refused_by_name_before_the_share_leaves(consortium, caplog):
    # Prepare: the key holder's statement committed to by the real server; its honest answer
    c, _ = _uploaded(consortium)
    conn = c.connect_keyholder()
    body, statement = _statement_formed(c, conn)
    answer = conn.request("POST", conn.path("/split/commit"), body=canonical_json(statement)).json()
    honest_signed = answer["masked_sum"]
    masked = base64.b64decode(answer["aggregate"])
    params, uploads = c.keyholder.params(c.session_id), _uploads(c)
    honest = {k: v for k, v in honest_signed.items() if k != "signature"}
    be = get_backend(params)
    n = fixedpoint.n_words(params.layout.length)
    two = flp.add(be.masked_words(uploads["h1"]), be.masked_words(uploads["h2"]))
    over_two = seal(params, "aggregate", flp.to_bytes(two), contributors=3)
    other_key = pki.load_party(c.pki_dir, "keyholder", "keyholder").identity_key()  # any key but the server's
    forgeries = {
        "answers another share statement": (_server_sign(c, {**honest, "share_statement_sha256": "00" * 32}), masked),
        "over another cohort": (_server_sign(c, {**honest, "cohort": ["h1", "h2"]}), masked),
        "does not match the masked sum's bytes": (honest_signed, seal(params, "aggregate",
                                                                      flp.to_bytes(np.zeros(n, np.uint64)))),
        "not signed by the server": ({**honest, "signature": other_key.sign(
            domains.SPLIT_SUM + canonical_json(honest)).hex()}, masked),
        "not a signed masked sum": ("not a statement", masked),
    }
    rel = c.keyholder.open_release(c.session_id, min_clients=0, unseal=False)
    manifest = conn.request("GET", conn.path("/manifest")).json()
    # Execute / Assert: each answer is refused by name, logged, and recorded against the key, and nothing is kept
    caplog.set_level(logging.ERROR, logger="secure_afl.keyholder")
    for name, (signed, sum_bytes) in forgeries.items():
        with pytest.raises(ServerForgery, match=name):
            split_share.keep_commitment(rel, manifest, body, statement, {"masked_sum": signed, "aggregate": base64.b64encode(sum_bytes).decode()})
        assert name in caplog.records[-1].getMessage()
        assert split_share.kept_commitment(rel) is None
    assert "answers another share statement" in _blocked(c)
    # the share never left: the server holds none
    assert _stored_share(c) is None
    # a correctly signed sum over another set of uploads (h3's masked vector left out): kept (the key holder
    # cannot tell before its share is added), then refused as the release is formed -- from the kept bytes
    _commit_as(c, statement, over_two)
    with pytest.raises(ServerForgery, match="does not decode"):
        c.keyholder.finalize(conn, min_clients=2)
    assert split_share.kept_commitment(rel).masked_sum == over_two
    conn.close()


def _uploads(c) -> dict:
    store = Store(c.root / "server" / c.session_id)
    try:
        return {r["hospital"]: store.get_blob(r["payload_sha256"]) for r in store.uploads()}
    finally:
        store.close()


def _stored_share(c):
    store = Store(c.root / "server" / c.session_id)
    try:
        record = store.get_meta("split_result")
        return None if record is None else store.get_blob(record["share_sha256"])
    finally:
        store.close()


def _audit(c, model, kept=True):
    extra = ["--kept", c.keyholder.keys_dir / f"{c.session_id}.split-commitment.json"] if kept else []
    return _cli("audit", "release", "--state", c.root / "server" / c.session_id, "--pki", c.pki_dir, "--model",
                model, *extra)


def test_a_sum_re_masked_after_the_share_cannot_reach_the_model_and_the_audit_names_the_server(consortium,
                                                                                               tmp_path):
    # Prepare: the server commits to the honest sum; the key holder keeps it and sends its share, then stops
    # (a crash before it formed the release)
    c, plain = _uploaded(consortium)
    conn = c.connect_keyholder()
    body, statement = _statement_formed(c, conn)
    kept = c.keyholder.commit_split_share(conn, min_clients=2)
    c.keyholder.send_split_share(conn)
    params = c.keyholder.params(c.session_id)
    share = flp.from_bytes(_stored_share(c))
    # the compromised server now holds the share and every masked upload, so it reads the aggregate, and answers
    # enc(v*) - share for its target v*: the true statistics with classes 0 and 1 relabelled
    stats = Layout(params.layout.dim, params.layout.n_classes).unpack(split.collect(params, kept.masked_sum, share),
                                                                      gamma=params.gamma)
    swap = [1, 0] + list(range(2, params.layout.n_classes))
    target = dataclasses.replace(stats, cross=stats.cross[:, swap], class_counts=stats.class_counts[swap])
    v_star = params.layout.pack(target)
    enc = flp.encode_signed(fixedpoint.encode(v_star, tuple(params.backend_params["frac_bits"])).view(np.int64))
    forged = seal(params, "aggregate", flp.to_bytes(flp.sub(enc, share)), contributors=3)
    _commit_as(c, statement, forged)
    store = Store(c.root / "server" / c.session_id)
    record = store.get_meta("split_result")
    store.set_meta("split_result", {**record, "masked_sum": store.get_meta("split_commit")["masked_sum"],
                                    "masked_sum_blob": store.put_blob(forged)})
    store.close()
    # the forgery passes every check on the signed sum, and its release is the server's target
    fresh = conn.request("POST", conn.path("/split/commit"), body=canonical_json(statement)).json()
    split.verify_masked_sum(params, statement, forged, fresh["masked_sum"], pki.pinned_identity(c.pki_dir, "server"))
    W_target = solve_from_sums(target)
    # Execute: the key holder's real finalize, run again
    kept_file = c.keyholder.keys_dir / f"{c.session_id}.split-commitment.json"
    aside = kept_file.read_bytes()
    kept_file.unlink()  # first with its kept copy lost: it refuses rather than take a sum from the server
    with pytest.raises(PolicyViolation, match="kept copy") as e:
        c.keyholder.finalize(conn, min_clients=2)
    assert e.value.reason == "commitment_missing"
    kept_file.write_bytes(aside)
    res = c.keyholder.finalize(conn, min_clients=2)
    conn.close()
    # Assert: the model is the release of the sum committed before the share left, not the server's target
    W_plain = solve_from_sums(_total(plain))
    assert np.linalg.norm(res.W - W_plain) / np.linalg.norm(W_plain) <= res.report["w_error_bound"]["rel_bound"]
    assert not np.allclose(res.W, W_target, rtol=1e-3)
    assert res.report["masked_sum_sha256"] == hashlib.sha256(kept.masked_sum).hexdigest()
    model = tmp_path / "model.safetensors"
    write_model(model, res.W, model_metadata(res.params, res.report, 0.0))
    # the audit, given the key holder's kept copy: the server's state holds another sum than it gave, and that
    # sum is not the cohort's
    out = _audit(c, model)
    assert out.returncode == EXIT_SECURITY, out.stdout + out.stderr
    assert "two commitments for one share statement" in out.stdout
    assert out.stdout.strip().splitlines()[-1].startswith("AT FAULT: the server")
    assert "key holder (W" not in out.stdout.strip().splitlines()[-1]


def test_a_commitment_answered_over_another_manifest_keeps_the_share(consortium):
    # Prepare: the key holder's statement formed; the compromised server then serves another manifest and
    # answers the commitment for the key holder's statement without checking it against that manifest
    c, _ = _uploaded(consortium)
    conn = c.connect_keyholder()
    body, statement = _statement_formed(c, conn)
    params = c.keyholder.params(c.session_id)
    store = Store(c.root / "server" / c.session_id)
    try:
        manifest = store.get_meta("manifest")
        masked = split.cohort_masked_sum(params, store.get_blob(manifest["aggregate_sha256"]), [], 3)
        store.set_meta("manifest", {**manifest, "participants": manifest["participants"][::-1]})
    finally:
        store.close()
    _commit_as(c, statement, masked)
    # Execute / Assert: refused by name before the share leaves; nothing kept
    with pytest.raises(ServerForgery, match="another manifest"):
        c.keyholder.finalize(conn, min_clients=2)
    conn.close()
    assert _stored_share(c) is None
    assert split_share.kept_commitment(c.keyholder.open_release(c.session_id, min_clients=0, unseal=False)) is None


def test_the_server_takes_no_share_before_it_committed_to_the_sum(consortium):
    # Prepare: the key holder's statement and share formed, no commitment asked
    c, _ = _uploaded(consortium)
    conn = c.connect_keyholder()
    body, statement = _statement_formed(c, conn)
    # Execute: a share sent out of order (as a key holder ignoring the order would)
    from secure_afl.protocol import H_TAG

    with pytest.raises(SecureAFLError, match="no masked sum is committed"):
        conn.request("POST", conn.path("/split/share"), body=body, headers={H_TAG: canonical_json(statement).decode()})
    conn.close()
    # Assert: refused, audited by name, nothing taken
    assert _stored_share(c) is None
    log = (c.root / "server" / c.session_id / "audit.jsonl").read_text()
    assert '"split_collect"' in log and "no masked sum is committed" in log
    # the server commits once: the same statement gets the same answer, another statement of the session (a
    # cohort without h3, signed by the key holder's own key) is refused
    with c.connect_keyholder() as conn:
        first = conn.request("POST", conn.path("/split/commit"), body=canonical_json(statement)).json()
        assert conn.request("POST", conn.path("/split/commit"), body=canonical_json(statement)).json() == first
        params = c.keyholder.params(c.session_id)
        manifest = conn.request("GET", conn.path("/manifest")).json()
        _, other = split.sign_share(c.keyholder.party.identity_key(), params, manifest,
                                    flp.from_bytes(body), {"h3": "linear"})
        with pytest.raises(SecureAFLError, match="already committed"):
            conn.request("POST", conn.path("/split/commit"), body=canonical_json(other))


def test_the_audit_recomputes_the_release_and_names_a_forged_masked_sum(consortium, tmp_path):
    # Prepare: the key holder's statement; the compromised server commits to a sum moved by one count in
    # class 0's slot (small enough to decode and pass the checks: the key holder alone cannot tell it)
    c, plain = _uploaded(consortium)
    conn = c.connect_keyholder()
    body, statement = _statement_formed(c, conn)
    params = c.keyholder.params(c.session_id)
    answer = conn.request("POST", conn.path("/split/commit"), body=canonical_json(statement)).json()
    masked = base64.b64decode(answer["aggregate"])
    words = flp.from_bytes(open_envelope(params, masked, "aggregate").body)
    moved = np.zeros(params.layout.length)
    moved[params.layout.slices["gram"].start] = 1.0  # C[0, 0] + 1
    delta = np.asarray(fixedpoint.encode(moved, tuple(params.backend_params["frac_bits"])), dtype=np.uint64)
    forged = seal(params, "aggregate", flp.to_bytes(flp.add(words, delta)), contributors=3)
    _commit_as(c, statement, forged)
    # Execute: the real finalize takes it (it verifies: signed by the server for its statement)
    res = c.keyholder.finalize(conn, min_clients=2)
    conn.close()
    model = tmp_path / "model.safetensors"
    write_model(model, res.W, model_metadata(res.params, res.report, 0.0))
    # Assert: the audit, with and without the key holder's kept copy, names the server
    for kept in (True, False):
        bad = _audit(c, model, kept=kept)
        assert bad.returncode == EXIT_SECURITY, bad.stdout + bad.stderr
        assert "MISMATCH: masked sum: the server's signed sum is not the sum of the cohort's stored masked " \
               "uploads" in bad.stdout
        assert bad.stdout.strip().splitlines()[-1].startswith("AT FAULT: the server"), bad.stdout
        assert "model: W" not in bad.stdout  # W is the release of the sum it was given: the key holder is clear
    # the key holder at fault: a W that is not the release of the sum it kept
    write_model(model, res.W + 1e-6, model_metadata(res.params, res.report, 0.0), force=True)
    bad = _audit(c, model)
    assert "MISMATCH: model: W is not the release of the server's sum" in bad.stdout
    assert "the key holder (W" in bad.stdout.strip().splitlines()[-1]


def test_the_honest_release_audits_bit_for_bit_from_the_kept_copy(consortium, tmp_path):
    c, plain = _uploaded(consortium)
    with c.connect_keyholder() as conn:
        res = c.keyholder.finalize(conn, min_clients=2)
    model = tmp_path / "model.safetensors"
    write_model(model, res.W, model_metadata(res.params, res.report, 0.0))
    ok = _audit(c, model)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "bit for bit" in ok.stdout and ok.stdout.strip().splitlines()[-1].startswith("OK:")
    # the model names its session, share statement and committed sum
    from secure_afl.model_file import read_model

    _, meta = read_model(model)
    kept = json.loads((c.keyholder.keys_dir / f"{c.session_id}.split-commitment.json").read_text())
    assert meta.session == c.session_id
    assert meta.share_statement_sha256 == split.share_statement_digest(kept["share_statement"])
    assert meta.masked_sum_sha256 == kept["masked_sum"]["masked_sum_sha256"]
    # the model naming another cohort is the key holder's fault
    write_model(model, res.W, {**model_metadata(res.params, res.report, 0.0), "participants": ["h1", "h2"]},
                force=True)
    bad = _audit(c, model)
    assert bad.returncode == EXIT_SECURITY and "MISMATCH: model: names participants" in bad.stdout
    assert "the key holder (W" in bad.stdout.strip().splitlines()[-1]
    # an upload in the server's state whose hospital-signed seed statement does not hold (its signature moved):
    # the server's state cannot show that hospital sent it
    write_model(model, res.W, model_metadata(res.params, res.report, 0.0), force=True)
    store = Store(c.root / "server" / c.session_id)
    try:
        row = store.db.execute("SELECT tag FROM uploads WHERE hospital='h2'").fetchone()
        tag = json.loads(row[0])
        sig = tag["signature"]
        tag["signature"] = ("0" if sig[0] != "0" else "1") + sig[1:]
        store.db.execute("UPDATE uploads SET tag=? WHERE hospital='h2'", (json.dumps(tag),))
    finally:
        store.close()
    bad = _audit(c, model)
    assert bad.returncode == EXIT_SECURITY, bad.stdout + bad.stderr
    assert "MISMATCH: upload of h2: its signed seed statement does not hold" in bad.stdout
    assert bad.stdout.strip().splitlines()[-1].startswith("AT FAULT: the server")


def test_the_key_holders_query_seeds_cannot_be_predicted_from_anything_public(consortium):
    # Prepare: the real release, which sent the server one query seed per upload
    c, _ = _uploaded(consortium)
    with c.connect_keyholder() as conn:
        c.keyholder.finalize(conn, min_clients=2)
        context = conn.request("GET", conn.path("/context"), signed=False).content
    store = Store(c.root / "server" / c.session_id)
    try:
        sent = store.verifier_messages()
        tags = {h: tag for h, (_, tag) in store.upload_tags().items()}
    finally:
        store.close()
    params = c.keyholder.params(c.session_id)
    # Execute: the query seeds a server would derive from what it holds in place of the key holder's secret
    public = [b"", context, params.digest(), c.session_id.encode(),
              bytes.fromhex(params.backend_params[split.PUBLIC_CONTEXT_KEY])]
    guessed = {split.query_seed(split.query_key(p), params, h, tags[h]["payload_sha256"], tags[h]["validity"]).hex()
               for p in public for h in sent}
    # Assert: none is a query seed the key holder sent (a predictable one lets the server form its message first)
    assert len(sent) == 3 and not guessed & {m["query_seed"] for m in sent.values()}


def test_audit_compare_against_the_hospitals_own_statistics_files(consortium, tmp_path):
    # Prepare: the real finalize's model, and each hospital's statistics file as `client embed --stats-only` writes it
    c, plain = _uploaded(consortium)
    out = _cli("keyholder", "finalize", "--pki", c.pki_dir, "--keys", c.root / "keys", "--server", c.url,
               "--session", c.session_id, "--min-clients", 2, "--out", tmp_path / "model.safetensors",
               "--report", tmp_path / "report.json", "--passphrase-file", _passfile(tmp_path))
    assert out.returncode == 0, out.stderr
    names = [f"class-{i}" for i in range(c.classes)]
    files = []
    for h in HOSPITALS:
        s = plain[h]
        # the hospital's file holds X^T X (gamma 0), as the embedding step writes it
        raw = type(s)(s.gram - s.gamma * np.eye(s.gram.shape[0]), s.cross, s.n, s.class_counts, 1.0, 0.0)
        files.append(write_statistics_file(tmp_path / f"{h}.npz", raw, names))
    # Execute / Assert: every file: equal within the certified bound
    ok = _cli("audit", "compare", "--model", tmp_path / "model.safetensors", "--stats", *files)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # one rule, its tolerance printed, and the verdict the printed figures give
    import re

    err = float(re.search(r"^W relative error against the plaintext solve: (\S+)$", ok.stdout, re.M).group(1))
    tol = float(re.search(r"^tolerance: (\S+) \(the certified bound", ok.stdout, re.M).group(1))
    assert err <= tol and f"equal: W relative error {err:.3g} <= tolerance {tol:.3g}" in ok.stdout
    # a W ten times the certified bound away from the plaintext's: NOT EQUAL, and a security exit
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), framework="numpy") as f:
        W, raw = f.get_tensor("W"), dict(f.metadata())
    bound = float(json.loads(raw["w_rel_bound"]))
    E = np.random.default_rng(3).standard_normal(W.shape)
    moved = W + 10 * bound * np.linalg.norm(W) * E / np.linalg.norm(E)
    write_model(tmp_path / "moved.safetensors", moved, raw)
    far = _cli("audit", "compare", "--model", tmp_path / "moved.safetensors", "--stats", *files)
    assert far.returncode == EXIT_SECURITY, far.stdout + far.stderr
    assert "NOT EQUAL: W relative error" in far.stdout and "> tolerance" in far.stdout
    # one file left out: what differs is named, and the exit code is not 0
    short = _cli("audit", "compare", "--model", tmp_path / "model.safetensors", "--stats", *files[:2])
    assert short.returncode == EXIT_INPUT, short.stdout + short.stderr
    assert "2 statistics files for the release's 3 participants" in short.stdout


def _passfile(tmp_path):
    p = tmp_path / "pass"
    p.write_text("test passphrase\n")
    p.chmod(0o600)
    return p



def test_a_dispute_names_the_server_the_key_holder_or_the_hospital(consortium):
    # Prepare: h1 and h2 submit with the real client (which keeps its seed sealed beside its receipt); h3 runs
    # modified software and uploads a class count of -1; one refusal is allowed
    from secure_afl.keyholder.release import HTTPSource
    from secure_afl.split import Circuit, UploadCommitment
    from secure_afl_tools.attack_parties import forge_verifier

    c = consortium(backend="split", hospitals=HOSPITALS, min_clients=2,
                   extra_session={"min_class_count": 1, "max_refusals": 1},
                   split={"field": "goldilocks", "gram_proof": False})  # forged Goldilocks words below
    c.start()
    c.keyholder.keygen(load_signed(c.pki_dir, c.session_id).session_params())
    conn = c.connect_keyholder()
    c.keyholder.publish(conn)
    kept = {}
    for h in ("h1", "h2"):
        cl = c.hospital(h)
        cl.submit(c.stats(*c.data(h)))
        payload_path, statement_path, seed_path = cl.dispute_paths()
        kept[h] = (payload_path.read_bytes(), json.loads(statement_path.read_text()), cl.kept_seed())
        assert cl.kept_seed() != seed_path.read_bytes()  # sealed at rest, not the seed itself
        cl.close()
    cl = c.hospital("h3")
    params = cl.fetch_params()
    cl.__dict__["_split_seeds"] = {}  # so that the client keeps the cheater's seed beside its receipt too
    be = get_backend(params)
    ctx = cl.conn.request("GET", cl.conn.path("/context"), signed=False).content
    lanes = be.circuit.lanes(params.layout.pack(c.stats(*c.data("h3")))).copy()
    lanes[params.layout.slices["counts"].start] = (-(1 << be.circuit.f1)) % flp.P
    body, seed3, com = be.circuit.prove("h3", lanes=lanes, check=False)
    payload3, st3 = be.seal_upload(body, seed3, com, ctx, "h3", cl.party.identity_key())
    cl.__dict__["_split_seeds"][hashlib.sha256(payload3).hexdigest()] = seed3
    cl.upload(params, payload3, tag=st3)
    cl.close()
    # Execute: the key holder's real release refuses h3; the published messages are kept
    res = c.keyholder.finalize(conn, min_clients=2)
    evidence = json.loads((c.keyholder.keys_dir / f"{c.session_id}.validity-refusals.json").read_text())
    genuine = HTTPSource(conn).split_verifier()
    conn.close()
    server_pub = pki.pinned_identity(c.pki_dir, "server")
    server_key = pki.load_party(c.pki_dir, "server", "aggregator").identity_key()
    assert res.report["refused"] == {"h3": "linear"}

    # the hospital at fault: h3's own upload, seed and the two published messages
    h3 = split.dispute(params, "h3", payload3, st3, seed3, evidence["server_messages"]["h3"],
                       evidence["keyholder"]["h3"]["keyholder_message"], server_pub)
    assert h3["at_fault"] == "hospital" and h3["server_message_true"] and h3["keyholder_message_true"]

    # h1's honest upload, had it been refused: the key holder's true message (what an honest key holder
    # publishes), formed from the seed h1 kept
    payload1, st1, seed1 = kept["h1"]
    circuit = Circuit(params)
    qs = bytes.fromhex(genuine["h1"]["query_seed"])
    true_kh = circuit.query(circuit.helper_share(seed1), UploadCommitment.from_dict(st1["validity"]), "h1", qs,
                            leader=False)
    # the server at fault: its signed message falsified
    out = split.dispute(params, "h1", payload1, st1, seed1, forge_verifier(params, genuine["h1"], server_key),
                        flp.to_bytes(true_kh).hex(), server_pub)
    assert out["at_fault"] == "server" and not out["server_message_true"]
    # the key holder at fault: both messages true and the joint verdict "valid", yet refused
    out = split.dispute(params, "h1", payload1, st1, seed1, genuine["h1"], flp.to_bytes(true_kh).hex(), server_pub)
    assert out["at_fault"] == "keyholder" and out["verdict"] is None and out["keyholder_message_true"]
    # the key holder at fault: its published message is not the one h1's seed gives
    false_kh = true_kh.copy()
    false_kh[0] = flp.add(false_kh[:1], np.uint64(1))[0]
    out = split.dispute(params, "h1", payload1, st1, seed1, genuine["h1"], flp.to_bytes(false_kh).hex(), server_pub)
    assert out["at_fault"] == "keyholder" and not out["keyholder_message_true"]
    # and a refusal "on the commitment" that h1's seed meets
    assert split.dispute(params, "h1", payload1, st1, seed1, genuine["h1"], None, server_pub)["at_fault"] == \
        "keyholder"

    # Execute / Assert: `secure-afl client dispute`, one line per case, from what each hospital kept
    def cli_dispute(name, evidence_doc):
        path = c.root / f"evidence-{name}-{len(evidence_doc['server_messages'][name]['signature'])}.json"
        path.write_text(json.dumps(evidence_doc))
        out = _cli("client", "dispute", "--server", c.url, "--session", c.session_id, "--pki", c.pki_dir,
                   "--name", name, "--receipts", c.root / "receipts", "--evidence", path)
        assert out.returncode == 0, out.stdout + out.stderr
        assert len(out.stdout.strip().splitlines()) == 1
        return out.stdout.strip()

    line = cli_dispute("h3", evidence)
    assert line.startswith("AT FAULT: this hospital (h3)") and "linear" in line
    forged = forge_verifier(params, genuine["h1"], server_key)
    seed_file = c.hospital("h1").dispute_paths()[2]
    kept_seed = seed_file.read_bytes()
    seed_file.unlink()  # the server-fault case needs no seed
    line = cli_dispute("h1", {"server_messages": {"h1": forged},
                              "keyholder": {"h1": {"keyholder_message": flp.to_bytes(true_kh).hex()}}})
    assert line.startswith("AT FAULT: the server") and "not opened" in line
    seed_file.write_bytes(kept_seed)
    line = cli_dispute("h1", {"server_messages": {"h1": genuine["h1"]},
                              "keyholder": {"h1": {"keyholder_message": flp.to_bytes(true_kh).hex()}}})
    assert line.startswith("AT FAULT: the key holder") and "accept the upload" in line
