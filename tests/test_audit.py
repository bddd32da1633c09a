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

from secure_afl import audit
from secure_afl.audit import AuditLog, record_hash, verify_log
from secure_afl.exceptions import AuditChainBroken
from secure_afl.signing import canonical_json, make_receipt

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


def _rechain(records):
    """What a log rewriter can do without the server key: recompute every hash."""
    prev, out = audit.GENESIS_HASH, []
    for i, r in enumerate(records):
        body = {k: r[k] for k in audit._BODY_FIELDS}
        body.update(seq=i, prev_hash=prev)
        prev = record_hash(body)
        out.append(canonical_json({**body, "hash": prev}) + b"\n")
    return out


# --------------------------------------------------------------------------
# chain
# --------------------------------------------------------------------------


def test_audit_chain_verifies(tmp_path):
    # Prepare
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path)

    # Execute
    result = verify_log(path)

    # Assert
    assert (result.n_records, result.n_accepted, result.n_refused) == (6, 5, 1)
    assert result.head_hash == recs[-1]["hash"]
    assert [r["seq"] for r in recs] == list(range(6))
    assert recs[0]["prev_hash"] == audit.GENESIS_HASH and recs[1]["prev_hash"] == recs[0]["hash"]
    assert "OK: 6 records (5 accepted, 1 refused)" in result.summary()


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
        verify_log(path)

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
        verify_log(path)

    # Assert
    assert exc.value.index == index


def test_deleted_last_record_changes_head_hash(tmp_path):
    """Dropping the tail leaves a valid shorter chain: the head hash (or a receipt) catches it."""
    # Prepare
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path)
    _rewrite(path, _lines(path)[:-1])

    # Execute
    result = verify_log(path)

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
        verify_log(path)

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
        verify_log(path)

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
        verify_log(path)

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
    assert verify_log(path).n_records == 7


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
    result = verify_log(path)

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
        with pytest.raises(RuntimeError):
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
from secure_afl.audit import AuditLog
log = AuditLog(sys.argv[1])
i = 0
while True:
    rec = log.append("upload", actor="hosp-%d" % i, session="s1", outcome="accepted",
                     details={"payload_sha256": "%064x" % i, "pad": "x" * 3000})
    print(rec["seq"], flush=True)
    i += 1
"""


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
    result = verify_log(path)

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
    return [make_receipt(key, r["session"], r["actor"], r["details"]["payload_sha256"], r["seq"], T0)
            for r in records if r["event"] == "upload" and r["outcome"] == "accepted"]


@pytest.mark.security
def test_signed_audit_log_and_receipts_verify(tmp_path, server_key):
    # Prepare
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path, key=server_key)
    receipts = _receipts_for(recs, server_key)

    # Execute
    result = verify_log(path, server_pub=server_key.public_key(), receipts=receipts)

    # Assert
    assert result.signed and result.n_receipts == 4


@pytest.mark.security
def test_audit_record_signature_from_other_key_detected(tmp_path, server_key):
    # Prepare
    path = tmp_path / "audit.jsonl"
    _write_session(path, key=Ed25519PrivateKey.generate())

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        verify_log(path, server_pub=server_key.public_key())

    # Assert
    assert exc.value.index == 0 and exc.value.reason == "bad_record_signature"


@pytest.mark.security
def test_rebuilt_chain_without_accepted_upload_detected_by_receipt(tmp_path, server_key):
    # Prepare: the server drops hosp-1's accepted upload and recomputes the chain
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path)
    receipts = _receipts_for(recs, server_key)
    kept = [r for r in recs if r["actor"] != "hosp-1"]
    _rewrite(path, _rechain(kept))
    assert verify_log(path).n_records == 5  # the chain alone still verifies

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        verify_log(path, server_pub=server_key.public_key(), receipts=receipts, records_signed=False)

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
        verify_log(path, server_pub=server_key.public_key())

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
        verify_log(path, server_pub=server_key.public_key(), receipts=forged)

    # Assert
    assert exc.value.reason == "receipt_bad_signature"


@pytest.mark.security
def test_receipt_pointing_at_refused_record_detected(tmp_path, server_key):
    # Prepare: receipt claims the refused duplicate (seq 5) was accepted
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path, key=server_key)
    r = make_receipt(server_key, "s1", "hosp-0", _digest("again"), recs[5]["seq"], T0)

    # Execute
    with pytest.raises(AuditChainBroken) as exc:
        verify_log(path, server_pub=server_key.public_key(), receipts=[r])

    # Assert
    assert exc.value.index == 5 and exc.value.reason == "receipt_unmatched"


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def _cli(argv):
    parser = argparse.ArgumentParser()
    audit.register(parser)
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_audit_verify_ok_with_receipts_and_server_key(tmp_path, server_key, capsys):
    # Prepare
    path = tmp_path / "audit.jsonl"
    recs = _write_session(path, key=server_key)
    rdir = tmp_path / "receipts"
    rdir.mkdir()
    for i, r in enumerate(_receipts_for(recs, server_key)):
        (rdir / f"r{i}.json").write_text(json.dumps(r))
    pub = tmp_path / "server.pub"
    pub.write_bytes(server_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                         serialization.PublicFormat.SubjectPublicKeyInfo))

    # Execute
    rc = _cli(["verify", str(path), "--receipts", str(rdir), "--server-pub", str(pub)])

    # Assert
    out = capsys.readouterr().out
    assert rc == 0
    assert out.startswith("OK: 6 records (5 accepted, 1 refused), 4 receipts matched")


def test_cli_audit_verify_names_first_broken_record(tmp_path, capsys):
    # Prepare
    path = tmp_path / "audit.jsonl"
    _write_session(path)
    lines = _lines(path)
    lines[3] = lines[3].replace(b"accepted", b"refused")
    _rewrite(path, lines)

    # Execute
    rc = _cli(["verify", str(path)])

    # Assert
    out = capsys.readouterr().out
    assert rc == 7  # a security check failed (the documented exit code)
    assert out.startswith("BROKEN (record index 3)")
