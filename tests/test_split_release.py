"""split: the key holder forms the release from the server-signed masked sum over its own signed cohort, and the
server's part is checkable (``secure-afl audit release``); a pilot compares the model with plaintext
(``secure-afl audit compare``).

The e2e tests run real server processes over HTTPS. The server is made malicious the way a compromised server
would be: its stored answer is replaced (and re-signed with its own identity key, which such a server holds)
between the key holder's share and its fetch of the masked sum.
"""

from __future__ import annotations

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
from secure_afl.exceptions import EXIT_INPUT, EXIT_SECURITY
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
    c = consortium(backend="split", hospitals=HOSPITALS, min_clients=2, extra_session={"min_class_count": 1})
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


def _answer_with(c, signed: dict, masked: bytes) -> None:
    """The compromised server replaces its stored answer (the share statement and share stay as taken)."""
    store = Store(c.root / "server" / c.session_id)
    try:
        record = store.get_meta("split_result")
        store.set_meta("split_result", {**record, "masked_sum": signed, "masked_sum_blob": store.put_blob(masked)})
    finally:
        store.close()


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


def test_a_forged_stale_or_mismatched_masked_sum_is_refused_by_name(consortium, caplog):
    # Prepare: the key holder's share is taken by the real server
    c, _ = _uploaded(consortium)
    conn = c.connect_keyholder()
    c.keyholder.close_round(conn)
    body, statement = c.keyholder.post_split_share(conn, min_clients=2)
    params, record, uploads, masked = _stored(c)
    honest = {k: v for k, v in record["masked_sum"].items() if k != "signature"}
    be = get_backend(params)
    n = fixedpoint.n_words(params.layout.length)
    two = flp.add(be.masked_words(uploads["h1"]), be.masked_words(uploads["h2"]))
    over_two = seal(params, "aggregate", flp.to_bytes(two), contributors=3)
    other_key = pki.load_party(c.pki_dir, "keyholder", "keyholder").identity_key()  # any key but the server's
    forgeries = {
        # a sum the server signed for another share statement (stale, or replayed from another one)
        "answers another share statement": (_server_sign(c, {**honest, "share_statement_sha256": "00" * 32}), masked),
        # the server's signature over another cohort than the key holder signed
        "over another cohort": (_server_sign(c, {**honest, "cohort": ["h1", "h2"]}), masked),
        # other bytes under the honest signature
        "does not match the masked sum's bytes": (record["masked_sum"], seal(params, "aggregate",
                                                                          flp.to_bytes(np.zeros(n, np.uint64)))),
        # the honest statement signed by a key that is not the server's
        "not signed by the server": ({**honest, "signature": other_key.sign(
            domains.SPLIT_SUM + canonical_json(honest)).hex()}, masked),
        # a correctly signed sum over another set of uploads (h3's masked vector left out)
        "does not decode": (_server_sign(c, {**honest, "masked_sum_sha256": hashlib.sha256(over_two).hexdigest()}),
                            over_two),
    }
    # Execute / Assert: each answer is refused by name, logged, and recorded against the key (the first refusal)
    caplog.set_level(logging.ERROR, logger="secure_afl.keyholder")
    for name, (signed, sum_bytes) in forgeries.items():
        _answer_with(c, signed, sum_bytes)
        with pytest.raises(ServerForgery, match=name):
            c.keyholder.take_split_release(conn, body, statement)
        assert name in caplog.records[-1].getMessage()
    assert "answers another share statement" in _blocked(c)
    # the honest answer still forms the release
    _answer_with(c, record["masked_sum"], masked)
    res = c.keyholder.take_split_release(conn, body, statement)
    assert res.report["participants"] == statement["cohort"]
    conn.close()


def test_the_audit_recomputes_the_release_and_names_a_forged_masked_sum(consortium, tmp_path):
    # Prepare: the honest release and its model file
    c, plain = _uploaded(consortium)
    conn = c.connect_keyholder()
    c.keyholder.close_round(conn)
    body, statement = c.keyholder.post_split_share(conn, min_clients=2)
    res = c.keyholder.take_split_release(conn, body, statement)
    model = tmp_path / "model.safetensors"
    write_model(model, res.W, model_metadata(res.params, res.report, 0.0))
    state = c.root / "server" / c.session_id
    # Execute / Assert: the honest release recomputes
    ok = _cli("audit", "release", "--state", state, "--pki", c.pki_dir, "--model", model)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "bit for bit" in ok.stdout and ok.stdout.strip().splitlines()[-1].startswith("OK:")

    # Prepare: the server signs a sum moved by one count in class 0's slot (small enough to decode and pass the
    # checks: the key holder alone cannot tell it from the true one)
    params, record, _, masked = _stored(c)
    words = flp.from_bytes(open_envelope(params, masked, "aggregate").body)
    moved = np.zeros(params.layout.length)
    moved[params.layout.slices["gram"].start] = 1.0  # C[0, 0] + 1
    delta = np.asarray(fixedpoint.encode(moved, tuple(params.backend_params["frac_bits"])), dtype=np.uint64)
    forged = seal(params, "aggregate", flp.to_bytes(flp.add(words, delta)), contributors=3)
    honest = {k: v for k, v in record["masked_sum"].items() if k != "signature"}
    _answer_with(c, _server_sign(c, {**honest, "masked_sum_sha256": hashlib.sha256(forged).hexdigest()}), forged)
    res2 = c.keyholder.take_split_release(conn, body, statement)
    conn.close()
    assert not np.array_equal(res2.W, res.W)  # the key holder took it: only the audit can see it
    write_model(model, res2.W, model_metadata(res2.params, res2.report, 0.0))
    bad = _cli("audit", "release", "--state", state, "--pki", c.pki_dir, "--model", model)
    # Assert: the audit names the masked sum (and the model that follows from it)
    assert bad.returncode == EXIT_SECURITY, bad.stdout + bad.stderr
    assert "MISMATCH: masked sum: not the sum of the cohort's stored masked uploads" in bad.stdout
    assert "MISMATCH: model: W differs" in bad.stdout


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
                   extra_session={"min_class_count": 1, "max_refusals": 1})
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
    be = get_backend(params)
    ctx = cl.conn.request("GET", cl.conn.path("/context"), signed=False).content
    lanes = be.circuit.lanes(params.layout.pack(c.stats(*c.data("h3")))).copy()
    lanes[params.layout.slices["counts"].start] = (-(1 << be.circuit.f1)) % flp.P
    body, seed3, com = be.circuit.prove("h3", lanes=lanes, check=False)
    payload3, st3 = be.seal_upload(body, seed3, com, ctx, "h3", cl.party.identity_key())
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
