"""Hash-chained audit log: chain, tampering, torn writes, resume, receipts, CLI."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secure_afl import audit_log as audit
from secure_afl.cli import audit_commands
from secure_afl.audit_log import AuditLog, record_hash
from secure_afl.audit_verify import check_chain, verify_log
from secure_afl.exceptions import AuditChainBroken, StateInUse
from secure_afl.signing import make_receipt
from secure_afl.encoding import canonical_json

REPO = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000.0


def _clock():
    t = [T0]

    def tick():
        t[0] += 1.0
        return t[0]
    return tick


def _digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def _write_session(path, *, key=None, n_uploads=4):
    """open, n uploads accepted (one refused duplicate), close; returns the records."""
    recs = []
    with AuditLog(path, signing_key=key, clock=_clock()) as log:
        recs.append(log.append("session_opened", actor="server", session="s1", outcome="accepted",
                               details={"min_clients": 2}))
        for i in range(n_uploads):
            recs.append(log.append("upload", actor=f"hosp-{i}", session="s1", outcome="accepted",
                                   details={"payload_sha256": _digest(f"p{i}")}))
        recs.append(log.append("upload", actor="hosp-0", session="s1", outcome="refused",
                               reason="duplicate", details={"payload_sha256": _digest("again")}))
    return recs


def _lines(path) -> list[bytes]:
    return Path(path).read_bytes().splitlines(keepends=True)


def _rewrite(path, lines):
    Path(path).write_bytes(b"".join(lines))


def _rechain(records, key=None):
    """What a log rewriter can do: recompute every hash (and, holding the server key, re-sign)."""
    prev, out = audit.GENESIS_HASH, []
    for i, r in enumerate(records):
        body = {k: r[k] for k in audit._BODY_FIELDS}
        body.update(seq=i, prev_hash=prev)
        prev = record_hash(body)
        rec = {**body, "hash": prev}
        if key is not None:
            rec["sig"] = key.sign(audit.RECORD_SIG_PREFIX + bytes.fromhex(prev)).hex()
        out.append(canonical_json(rec) + b"\n")
    return out


# --------------------------------------------------------------------------
# chain
# --------------------------------------------------------------------------


def test_audit_chain_verifies(tmp_path):
    # Prepare
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path)

    # Execute
    result = check_chain(path)

    # Assert
    assert (result.n_records, result.n_accepted) == (6, 5)
    assert result.head_hash == recs[-1]["hash"]
    assert [r["seq"] for r in recs] == list(range(6))
    assert recs[0]["prev_hash"] == audit.GENESIS_HASH and recs[1]["prev_hash"] == recs[0]["hash"]


def test_audit_log_file_is_owner_only(tmp_path):
    # Prepare / Execute
    path = tmp_path / "audit.jsonl"
    _write_session(path, n_uploads=1)

    # Assert
    assert os.stat(path).st_mode & 0o077 == 0


@pytest.mark.security
@pytest.mark.parametrize("field, value", [
    ("time", "2030-01-01T00:00:00.000000Z"),
    ("event", "session_closed"),
    ("actor", "hosp-9"),
    ("session", "s2"),
    ("outcome", "refused"),
    ("reason", "forged"),
    ("details", {"payload_sha256": "00" * 32}),
    ("prev_hash", "11" * 32),
    ("seq", 7),
    ("hash", "22" * 32),
])
def test_tampered_audit_record_detected(tmp_path, field, value):
    # Prepare
    path = tmp_path / "audit.jsonl"
    _write_session(path)
    lines = _lines(path)
    rec = json.loads(lines[2])
    rec[field] = value
    lines[2] = canonical_json(rec) + b"\n"
    _rewrite(path, lines)

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        check_chain(path)

    # Assert
    assert exc.value.index == 2


@pytest.mark.security
@pytest.mark.parametrize("index", [0, 2, 4])
def test_deleted_audit_record_detected(tmp_path, index):
    # Prepare
    path = tmp_path / "audit.jsonl"
    _write_session(path)
    lines = _lines(path)
    del lines[index]
    _rewrite(path, lines)

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        check_chain(path)

    # Assert
    assert exc.value.index == index


def test_deleted_last_record_leaves_a_valid_shorter_chain(tmp_path):
    """The chain alone cannot see a cut tail: that is why verify_log needs the expected head."""
    # Prepare
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path)
    _rewrite(path, _lines(path)[:-1])

    # Execute
    result = check_chain(path)

    # Assert
    assert result.n_records == 5 and result.head_hash != recs[-1]["hash"]


@pytest.mark.security
def test_reordered_audit_records_detected(tmp_path):
    # Prepare
    path = tmp_path / "audit.jsonl"
    _write_session(path)
    lines = _lines(path)
    lines[1], lines[3] = lines[3], lines[1]
    _rewrite(path, lines)

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        check_chain(path)

    # Assert
    assert exc.value.index == 1


@pytest.mark.security
@pytest.mark.parametrize("index, keep", [(5, 1), (5, 40), (3, 17)])
def test_audit_log_truncated_mid_line_detected(tmp_path, index, keep):
    # Prepare
    path = tmp_path / "audit.jsonl"
    _write_session(path)
    lines = _lines(path)
    _rewrite(path, lines[:index] + [lines[index][:keep]])

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        check_chain(path)

    # Assert
    assert exc.value.index == index
    assert exc.value.reason == "torn_record"


@pytest.mark.security
def test_garbage_line_detected(tmp_path):
    # Prepare
    path = tmp_path / "audit.jsonl"
    _write_session(path)
    lines = _lines(path)
    lines.insert(4, b"{not json}\n")
    _rewrite(path, lines)

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        check_chain(path)

    # Assert
    assert exc.value.index == 4 and exc.value.reason == "malformed"


# --------------------------------------------------------------------------
# writer: resume, torn tail, refusal, durability
# --------------------------------------------------------------------------


def test_audit_log_resume_after_reopen_continues_chain(tmp_path):
    # Prepare
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path)

    # Execute
    with AuditLog(path) as log:
        assert (log.next_seq, log.head) == (6, recs[-1]["hash"])
        new = log.append("round_closed", actor="server", session="s1", outcome="accepted")

    # Assert
    assert new["seq"] == 6 and new["prev_hash"] == recs[-1]["hash"]
    assert check_chain(path).n_records == 7


@pytest.mark.security
def test_audit_log_reopen_quarantines_torn_last_line(tmp_path):
    # Prepare
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path)
    torn = b'{"seq":6,"time":"2026'
    with open(path, "ab") as fh:
        fh.write(torn)

    # Execute
    with AuditLog(path) as log:
        log.append("round_closed", actor="server", session="s1", outcome="accepted")
    result = check_chain(path)

    # Assert
    records = [json.loads(x) for x in _lines(path)]
    assert result.n_records == 8
    assert records[6]["event"] == "log_recovered" and records[6]["prev_hash"] == recs[-1]["hash"]
    assert records[6]["details"]["torn_sha256"] == hashlib.sha256(torn).hexdigest()
    assert (tmp_path / "audit.jsonl.torn-0").read_bytes() == torn


@pytest.mark.security
def test_audit_log_writer_refuses_tampered_log(tmp_path):
    # Prepare
    path = tmp_path / "audit.jsonl"
    _write_session(path)
    lines = _lines(path)
    lines[1] = lines[1].replace(b"hosp-0", b"hosp-X")
    _rewrite(path, lines)
    before = path.read_bytes()

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        AuditLog(path)

    # Assert
    assert exc.value.index == 1
    assert path.read_bytes() == before


def test_second_writer_on_same_log_refused(tmp_path):
    # Prepare
    path = tmp_path / "audit.jsonl"

    # Execute / Assert
    with AuditLog(path):
        with pytest.raises(StateInUse):
            AuditLog(path)
    AuditLog(path).close()  # the lock is released on close


def test_append_rejects_bad_arguments(tmp_path):
    # Prepare
    with AuditLog(tmp_path / "audit.jsonl") as log:
        # Execute / Assert
        with pytest.raises(ValueError):
            log.append("upload", actor="hosp-a", outcome="maybe")
        with pytest.raises(ValueError):
            log.append("upload", actor="hosp-a", outcome="accepted", details={"x": float("nan")})
        with pytest.raises(TypeError):
            log.append("upload", actor=None, outcome="accepted")
        assert log.next_seq == 0


_CHILD = r"""
import sys
from secure_afl.audit_log import AuditLog
log = AuditLog(sys.argv[1])
i = 0
while True:
    rec = log.append("upload", actor="hosp-%d" % i, session="s1", outcome="accepted",
                     details={"payload_sha256": "%064x" % i, "pad": "x" * 3000})
    print(rec["seq"], flush=True)
    i += 1
"""


@pytest.mark.e2e
@pytest.mark.security
def test_sigkill_does_not_lose_acknowledged_events(tmp_path):
    # Prepare
    path = tmp_path / "audit.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE,
                             env=env, cwd=str(tmp_path))
    acked = []
    try:
        # Execute: kill -9 the writer mid-stream, after 30 acknowledged appends
        while len(acked) < 30:
            line = child.stdout.readline()
            if not line:
                break
            acked.append(int(line))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:  # pragma: no cover
            child.kill()
            child.wait(timeout=10)
        child.stdout.close()
    AuditLog(path).close()  # restart: resumes (and quarantines a torn tail, if any)
    result = check_chain(path)

    # Assert
    assert acked == list(range(30))
    records = [json.loads(x) for x in _lines(path)]
    uploads = [r["seq"] for r in records if r["event"] == "upload"]
    assert uploads[:30] == acked
    assert result.n_records >= 30


# --------------------------------------------------------------------------
# server signatures and receipts
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server_key():
    return Ed25519PrivateKey.generate()


def _receipts_for(records, key):
    return [make_receipt(key, r["session"], r["actor"], r["details"]["payload_sha256"], r["seq"], T0,
                         audit_head=r["hash"])
            for r in records if r["event"] == "upload" and r["outcome"] == "accepted"]


def _head(rec) -> str:
    return f"{rec['seq']}:{rec['hash']}"


@pytest.mark.security
def test_signed_audit_log_and_receipts_verify(tmp_path, server_key):
    # Prepare
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path, key=server_key)
    receipts = _receipts_for(recs, server_key)

    # Execute
    result = verify_log(path, server_pub=server_key.public_key(), head=_head(recs[-1]), receipts=receipts)

    # Assert
    assert result.n_receipts == 4 and (result.n_records, result.n_accepted, result.n_refused) == (6, 5, 1)
    assert "OK: session s1: 6 records (5 accepted, 1 refused), server signatures verified, 4 receipts matched" in result.summary()


@pytest.mark.security
def test_audit_record_signature_from_other_key_detected(tmp_path, server_key):
    # Prepare
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path, key=Ed25519PrivateKey.generate())

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        verify_log(path, server_pub=server_key.public_key(), head=_head(recs[-1]))

    # Assert
    assert exc.value.index == 0 and exc.value.reason == "bad_record_signature"


@pytest.mark.security
def test_rebuilt_chain_without_accepted_upload_detected_by_receipt(tmp_path, server_key):
    # Prepare: the server drops hosp-1's accepted upload and recomputes the chain
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path)
    receipts = _receipts_for(recs, server_key)
    kept = [r for r in recs if r["actor"] != "hosp-1"]
    _rewrite(path, _rechain(kept, server_key))
    assert check_chain(path).n_records == 5  # the chain alone still verifies
    new_head = json.loads(_lines(path)[-1])

    # Execute: even with a head the server supplies for its rewritten log, and every record re-signed
    with pytest.raises(AuditChainBroken) as exc:
        verify_log(path, server_pub=server_key.public_key(), head=_head(new_head), receipts=receipts)

    # Assert
    assert exc.value.reason == "receipt_unmatched"
    assert exc.value.index == recs[2]["seq"]


@pytest.mark.security
def test_rebuilt_chain_detected_by_server_signature(tmp_path, server_key):
    # Prepare
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path, key=server_key)
    kept = [r for r in recs if r["actor"] != "hosp-1"]
    _rewrite(path, _rechain(kept))

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        verify_log(path, server_pub=server_key.public_key(), head=_head(recs[-1]))

    # Assert
    assert exc.value.index == 0 and exc.value.reason == "bad_record_signature"


@pytest.mark.security
def test_forged_receipt_detected(tmp_path, server_key):
    # Prepare
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path, key=server_key)
    forged = _receipts_for(recs, Ed25519PrivateKey.generate())[:1]

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        verify_log(path, server_pub=server_key.public_key(), head=_head(recs[-1]), receipts=forged)

    # Assert
    assert exc.value.reason == "receipt_bad_signature"


@pytest.mark.security
def test_receipt_pointing_at_refused_record_detected(tmp_path, server_key):
    # Prepare: receipt claims the refused duplicate (seq 5) was accepted
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path, key=server_key)
    r = make_receipt(server_key, "s1", "hosp-0", _digest("again"), recs[5]["seq"], T0, audit_head=recs[5]["hash"])

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        verify_log(path, server_pub=server_key.public_key(), head=_head(recs[-1]), receipts=[r])

    # Assert
    assert exc.value.index == 5 and exc.value.reason == "receipt_unmatched"


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def _cli(argv):
    parser = argparse.ArgumentParser()
    audit_commands.register(parser)
    args = parser.parse_args(argv)
    return args.func(args)


# --------------------------------------------------------------------------
# the expected head: truncation, re-appending, re-signing, dropped uploads
# --------------------------------------------------------------------------


def _released_session(path, key, *, participants=("hosp-0", "hosp-1", "hosp-2", "hosp-3")):
    """A signed session whose release record names ``participants``; returns records and close record."""
    recs = _write_session(path, key=key)
    with AuditLog(path, signing_key=key, clock=_clock()) as log:
        rel = log.append("release", actor="keyholder:kh", session="s1", outcome="accepted",
                         details={"aggregate_sha256": _digest("agg"), "participants": sorted(participants)})
        recs.append(rel)
        recs.append(log.append("upload", actor="hosp-9", session="s1", outcome="refused", reason="round_closed"))
    close = audit.make_close_record(key, "s1", rel["seq"], rel["hash"], participants, T0)
    return recs, close


@pytest.fixture(scope="module")
def keyholder_key():
    return Ed25519PrivateKey.generate()


def _bundle(close, server_key, keyholder_key):
    cs = audit.countersign_head(keyholder_key, "kh", close, server_key.public_key())
    return {"close": close, "countersign": cs}


@pytest.mark.security
def test_countersigned_close_record_verifies(tmp_path, server_key, keyholder_key):
    # Prepare
    path = tmp_path / "audit.jsonl"
    recs, close = _released_session(path, server_key)
    bundle = _bundle(close, server_key, keyholder_key)

    # Execute
    result = verify_log(path, server_pub=server_key.public_key(), head=bundle, countersign=bundle["countersign"],
                        keyholder_pub=keyholder_key.public_key(), receipts=_receipts_for(recs, server_key))

    # Assert
    assert (result.head_seq, result.countersigned_by, result.n_receipts) == (6, "kh", 4)


@pytest.mark.security
@pytest.mark.parametrize("cut", [1, 2])
def test_truncated_log_fails_verify(tmp_path, server_key, keyholder_key, cut):
    # Prepare: the server cuts its tail (the refusal after release; or the release record too)
    path = tmp_path / "audit.jsonl"
    recs, close = _released_session(path, server_key)
    bundle = _bundle(close, server_key, keyholder_key)
    _rewrite(path, _lines(path)[:-cut])

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        verify_log(path, server_pub=server_key.public_key(), head=_head(recs[-1]) if cut == 1 else bundle,
                   countersign=bundle["countersign"], keyholder_pub=keyholder_key.public_key())

    # Assert
    assert exc.value.reason == "truncated"


@pytest.mark.security
def test_reappended_log_fails_verify(tmp_path, server_key, keyholder_key):
    # Prepare: cut after the uploads, then append a different, validly signed release
    path = tmp_path / "audit.jsonl"
    recs, close = _released_session(path, server_key)
    bundle = _bundle(close, server_key, keyholder_key)
    _rewrite(path, _lines(path)[:6])
    with AuditLog(path, signing_key=server_key, clock=_clock()) as log:
        log.append("release", actor="keyholder:kh", session="s1", outcome="accepted",
                   details={"aggregate_sha256": _digest("other"), "participants": ["hosp-0", "hosp-1"]})

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        verify_log(path, server_pub=server_key.public_key(), head=bundle, countersign=bundle["countersign"],
                   keyholder_pub=keyholder_key.public_key())

    # Assert
    assert exc.value.reason == "head_mismatch" and exc.value.index == 6


@pytest.mark.security
def test_resigned_rewritten_log_fails_verify(tmp_path, server_key, keyholder_key):
    # Prepare: the server drops the refused duplicate, rebuilds the chain and re-signs every record,
    # and signs a fresh close record for its new head; the key holder countersigned the original
    path = tmp_path / "audit.jsonl"
    recs, close = _released_session(path, server_key)
    bundle = _bundle(close, server_key, keyholder_key)
    kept = [r for r in recs if not (r["event"] == "upload" and r["outcome"] == "refused")]
    _rewrite(path, _rechain(kept, server_key))
    rel = json.loads(_lines(path)[5])
    forged_close = audit.make_close_record(server_key, "s1", rel["seq"], rel["hash"], close["participants"], T0)

    # Execute / Assert: against the countersigned head; and the new close record has no countersignature
    with pytest.raises(AuditChainBroken) as exc:
        verify_log(path, server_pub=server_key.public_key(), head=bundle, countersign=bundle["countersign"],
                   keyholder_pub=keyholder_key.public_key())
    assert exc.value.reason in ("truncated", "head_mismatch")
    with pytest.raises(AuditChainBroken) as exc:
        verify_log(path, server_pub=server_key.public_key(), head={"close": forged_close, "countersign": None})
    assert exc.value.reason == "head_not_countersigned"
    with pytest.raises(AuditChainBroken) as exc:
        verify_log(path, server_pub=server_key.public_key(), head=forged_close, countersign=bundle["countersign"],
                   keyholder_pub=keyholder_key.public_key())
    assert exc.value.reason == "head_bad_countersign"


@pytest.mark.security
def test_release_dropping_a_receipted_upload_fails_verify(tmp_path, server_key, keyholder_key):
    # Prepare: hosp-2 holds a receipt, but the release (and the countersigned close) leave it out
    path = tmp_path / "audit.jsonl"
    recs, close = _released_session(path, server_key, participants=("hosp-0", "hosp-1", "hosp-3"))
    bundle = _bundle(close, server_key, keyholder_key)

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        verify_log(path, server_pub=server_key.public_key(), head=bundle, countersign=bundle["countersign"],
                   keyholder_pub=keyholder_key.public_key(), receipts=_receipts_for(recs, server_key))

    # Assert
    assert exc.value.reason == "receipt_not_released" and "hosp-2" in str(exc.value)


@pytest.mark.security
def test_duplicated_json_key_line_fails_verify(tmp_path, server_key):
    # Prepare: a second "actor" key before the real one; json.loads keeps the last, so hash and
    # signature still match what a lenient parser reads, while another parser reads "hosp-x"
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path, key=server_key)
    lines = _lines(path)
    lines[2] = lines[2].replace(b'{"actor":', b'{"actor":"hosp-x","actor":', 1)
    assert json.loads(lines[2]) == recs[2]
    _rewrite(path, lines)

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        verify_log(path, server_pub=server_key.public_key(), head=_head(recs[-1]))

    # Assert
    assert exc.value.index == 2 and exc.value.reason == "malformed"


@pytest.mark.security
@pytest.mark.parametrize("edit", [(b',"event":', b', "event":'), (b'{"actor"', b'{ "actor"')])
def test_non_canonical_line_fails_verify(tmp_path, server_key, edit):
    # Prepare: the same content, spelt differently
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path, key=server_key)
    lines = _lines(path)
    lines[3] = lines[3].replace(*edit)
    assert json.loads(lines[3]) == recs[3] and lines[3] != _lines(path)[3]
    _rewrite(path, lines)

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        verify_log(path, server_pub=server_key.public_key(), head=_head(recs[-1]))

    # Assert
    assert exc.value.index == 3 and exc.value.reason == "not_canonical"


def test_countersign_refuses_a_close_record_the_server_did_not_sign(server_key, keyholder_key):
    close = audit.make_close_record(Ed25519PrivateKey.generate(), "s1", 3, "ab" * 32, ["hosp-0"], T0)
    with pytest.raises(Exception) as exc:
        audit.countersign_head(keyholder_key, "kh", close, server_key.public_key())
    assert type(exc.value).__name__ == "InvalidSignature"


def test_countersign_refuses_a_close_record_naming_other_participants(server_key, keyholder_key):
    close = audit.make_close_record(server_key, "s1", 3, "ab" * 32, ["hosp-0", "hosp-1"], T0)
    manifest = {"session_id": "s1", "participants": [{"hospital": "hosp-0"}]}
    with pytest.raises(Exception) as exc:
        audit.countersign_head(keyholder_key, "kh", close, server_key.public_key(), manifest)
    assert type(exc.value).__name__ == "MalformedPayload"


# --------------------------------------------------------------------------
# CLI: the server key comes from the PKI, the head is required
# --------------------------------------------------------------------------


def _cli(argv):
    parser = argparse.ArgumentParser()
    audit_commands.register(parser)
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture(scope="module")
def consortium_pki(tmp_path_factory):
    from secure_afl import pki

    d = tmp_path_factory.mktemp("pki")
    pki.init_ca(d, name="audit tests")
    pki.issue(d, "server", "aggregator")
    pki.issue(d, "keyholder", "kh")
    return d, pki.load_party(d, "server", "aggregator").identity_key(), pki.load_party(d, "keyholder", "kh").identity_key()


def test_cli_audit_verify_ok_with_countersigned_head_and_receipts(tmp_path, consortium_pki, capsys):
    # Prepare
    d, skey, kkey = consortium_pki
    path = tmp_path / "audit.jsonl"
    recs, close = _released_session(path, skey)
    (tmp_path / "audit-head.json").write_text(json.dumps(_bundle(close, skey, kkey)))
    rdir = tmp_path / "receipts"
    rdir.mkdir()
    for i, r in enumerate(_receipts_for(recs, skey)):
        (rdir / f"r{i}.json").write_text(json.dumps(r))

    # Execute
    rc = _cli(["verify", str(path), "--pki", str(d), "--head", str(tmp_path / "audit-head.json"),
               "--receipts", str(rdir)])

    # Assert
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.startswith("OK: session s1: 8 records (6 accepted, 2 refused), server signatures verified, 4 receipts matched")
    assert "countersigned by kh" in out


def test_cli_audit_verify_requires_head_and_pki(tmp_path, consortium_pki):
    d, skey, _ = consortium_pki
    path = tmp_path / "audit.jsonl"
    _write_session(path, key=skey)
    for argv in (["verify", str(path)], ["verify", str(path), "--pki", str(d)],
                 ["verify", str(path), "--head", "0:" + "00" * 32]):
        with pytest.raises(SystemExit) as exc:
            _cli(argv)
        assert exc.value.code == 2


def test_cli_audit_verify_refuses_a_log_signed_by_another_server_key(tmp_path, consortium_pki, capsys):
    d, _, _ = consortium_pki
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path, key=Ed25519PrivateKey.generate())
    rc = _cli(["verify", str(path), "--pki", str(d), "--head", _head(recs[-1])])
    assert rc == 7 and "bad_record_signature" in capsys.readouterr().out  # a security check failed (exit code 7)


def test_cli_audit_verify_names_first_broken_record(tmp_path, consortium_pki, capsys):
    # Prepare
    d, skey, _ = consortium_pki
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path, key=skey)
    lines = _lines(path)
    lines[3] = lines[3].replace(b"accepted", b"refused")
    _rewrite(path, lines)

    # Execute
    rc = _cli(["verify", str(path), "--pki", str(d), "--head", _head(recs[-1])])

    # Assert
    out = capsys.readouterr().out
    assert rc == 7  # a security check failed (the documented exit code)
    assert out.startswith("BROKEN (record index 3)")


def test_cli_audit_verify_exits_7_for_a_line_that_is_not_json(tmp_path, consortium_pki, capsys):
    # Prepare: the record's detail reason is "malformed", the exit code still that of a broken chain
    d, skey, _ = consortium_pki
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path, key=skey)
    lines = _lines(path)
    lines[2] = b"{not json\n"
    _rewrite(path, lines)

    # Execute
    rc = _cli(["verify", str(path), "--pki", str(d), "--head", _head(recs[-1])])

    # Assert
    out = capsys.readouterr().out
    assert rc == 7
    assert out.startswith("BROKEN (record index 2)") and "[malformed]" in out


@pytest.mark.security
def test_receipt_pins_the_log_before_it(tmp_path, server_key):
    # Prepare: the server edits a record before the receipts (same seqs, same upload records),
    # rebuilds the chain, re-signs it and offers its new head
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path, key=server_key)
    receipts = _receipts_for(recs, server_key)
    edited = [dict(r) for r in recs]
    edited[0]["details"] = {"min_clients": 1}
    _rewrite(path, _rechain(edited, server_key))
    new_head = json.loads(_lines(path)[-1])

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        verify_log(path, server_pub=server_key.public_key(), head=_head(new_head), receipts=receipts)

    # Assert
    assert exc.value.reason == "receipt_unmatched" and exc.value.index == 1


@pytest.mark.security
def test_reappended_log_fails_verify_against_an_explicit_head(tmp_path, server_key):
    # Prepare: the auditor holds SEQ:HEX of the original release; the server cut and re-appended
    path = tmp_path / "audit.jsonl"
    recs, _ = _released_session(path, server_key)
    _rewrite(path, _lines(path)[:6])
    with AuditLog(path, signing_key=server_key, clock=_clock()) as log:
        log.append("release", actor="keyholder:kh", session="s1", outcome="accepted",
                   details={"aggregate_sha256": _digest("other"), "participants": ["hosp-0", "hosp-1"]})

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        verify_log(path, server_pub=server_key.public_key(), head=_head(recs[6]))

    # Assert
    assert exc.value.reason == "head_mismatch" and exc.value.index == 6


@pytest.mark.security
def test_close_record_must_point_at_the_release(tmp_path, server_key, keyholder_key):
    # Prepare: a signed, countersigned close record that pins an earlier record (an upload), so the
    # release after it could be cut or swapped
    path = tmp_path / "audit.jsonl"
    recs, close = _released_session(path, server_key)
    early = audit.make_close_record(server_key, "s1", recs[4]["seq"], recs[4]["hash"], close["participants"], T0)
    cs = audit.countersign_head(keyholder_key, "kh", early, server_key.public_key())

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        verify_log(path, server_pub=server_key.public_key(), head=early, countersign=cs,
                   keyholder_pub=keyholder_key.public_key())

    # Assert
    assert exc.value.reason == "head_mismatch" and exc.value.index == 4
