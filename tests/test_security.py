"""Security test suite: every threat of threat_model/THREAT_MODEL.md
that can be checked in process.

The HTTP tests drive the real FastAPI app (``server.app.create_app``) over the
real server session (``open_server``) with its real SQLite store and hash-chained
audit log, through ``fastapi.testclient.TestClient``; TLS is exercised against
a real server process in ``tests/test_security_e2e.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from secure_afl import pki
from secure_afl.audit_verify import check_chain, verify_log
from secure_afl.backends import get_backend
from secure_afl.protection import check_vector
from secure_afl.backends.ckks import CKKSBackend, generate_keys, new_ckks_session
from secure_afl.envelope import peek_header, seal
from secure_afl.exceptions import (
    AuditChainBroken,
    BoundsExceeded,
    DecryptionRefused,
    InvalidInputError,
    PolicyViolation,
    SanityCheckFailed,
)
from secure_afl.hazmat import ckks as hz
from secure_afl.packing import Layout
from secure_afl.params import Bounds, SessionParams
from secure_afl.protocol import API, H_UPLOAD, context_publication, sign_request
from secure_afl.release_checks import ReleaseLedger, check_class_minimum, sanity_check
from secure_afl.server import aggregator, audit_records, closing, peer_auth
from secure_afl.server.aggregator import open_server
from secure_afl.server.app import create_app
from secure_afl.server.config import ServerConfig
from secure_afl.keyholder import KeyHolder
from secure_afl.signing import build_manifest, sign_upload
from secure_afl.stats import StatisticsAccumulator, SufficientStatistics, local_statistics
from secure_afl.tagging import generate_tag_key

pytestmark = pytest.mark.security

DIM, CLASSES, GAMMA = 4, 3, 1.0
BOUNDS = Bounds(max_norm=2.0, n_max=100, k_max=8)
HOSPITALS = ("hosp-a", "hosp-b", "hosp-c")
CAP = 4096


# ---------------------------------------------------------------------------
# fixtures and helpers
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def consortium(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    pki.init_ca(d, name="security tests")
    pki.issue(d, "server", "aggregator")
    pki.issue(d, "keyholder", "keyholder")
    for h in (*HOSPITALS, "stranger"):
        pki.issue(d, "hospital", h)
    return d


def _config(consortium, data_dir, *, backend="plain", sid="sec-1", min_clients=2, cap=CAP):
    # colluders = 0, the operator's explicit choice: these tests release over 2 of the 3 hospitals (the default
    # bound, 1, would make every release need all three)
    cfg = ServerConfig(session_id=sid, backend=backend, dim=DIM, classes=CLASSES, gamma=GAMMA, bounds=BOUNDS,
                       min_clients=min_clients, colluders=0, data_dir=data_dir, pki_dir=consortium,
                       hospitals=list(HOSPITALS), max_upload_bytes=cap, deadline_s=3600)
    from secure_afl.session.signed import sign_definition

    (consortium / "sessions" / f"{sid}.json").unlink(missing_ok=True)  # each test defines its session anew
    sign_definition(cfg.definition, consortium)
    return cfg


class Service:
    """The real app over the real server, plus the bookkeeping the tests assert on."""

    def __init__(self, consortium, data_dir, **kw):
        self.pki = consortium
        self.server = open_server(_config(consortium, data_dir, **kw))
        self.client = TestClient(create_app(self.server))
        self.sid = self.server.config.session_id

    def close(self):
        self.client.close()
        aggregator.shutdown(self.server)

    def path(self, suffix=""):
        return f"{API}/sessions/{self.sid}{suffix}"

    def party(self, name, role="hospital"):
        return pki.load_party(self.pki, role, name)

    def payload(self, vector=None, seed=0):
        if vector is None:
            vector = _vector(seed)
        return get_backend(self.server.params).protect(vector)

    def statement(self, name, payload, *, signer=None, sid=None, digest=None, timestamp=None):
        key = (signer or self.party(name)).identity_key()
        return sign_upload(key, sid or self.sid, digest or self.server.params.digest(),
                           hashlib.sha256(payload).digest(), name, timestamp=timestamp)

    def upload(self, name, payload, statement=None, **headers):
        st_ = statement if statement is not None else self.statement(name, payload)
        h = {H_UPLOAD: json.dumps(st_, separators=(",", ":")), "content-type": "application/octet-stream"}
        h.update(headers)
        return self.client.post(self.path("/uploads"), content=payload, headers=h)

    def signed(self, method, suffix, party, body=b"", nonce=None):
        path = self.path(suffix)
        h = sign_request(party.identity_key(), f"{party.role}:{party.name}", method, path, body, nonce=nonce)
        return self.client.request(method, path, content=body, headers=h)

    def count(self):
        return self.server.store.upload_count()

    def blobs(self):
        return sorted(p.name for p in self.server.store.payload_dir.iterdir())

    def audit(self):
        return [json.loads(line) for line in (self.server.dir / "audit.jsonl").read_text().splitlines()]


def _true_head(svc) -> str:
    """What a countersigned close record would pin: the writer's own last record."""
    return f"{svc.server.audit.next_seq - 1}:{svc.server.audit.head}"


def _vector(seed=0, n=10, scale=1.0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, DIM))
    X *= (scale * rng.uniform(0.2, 1.0, n) / np.linalg.norm(X, axis=1))[:, None]
    y = np.arange(n) % CLASSES
    s = local_statistics(X, y, CLASSES)
    return Layout(DIM, CLASSES).pack(
        SufficientStatistics(s.gram + GAMMA * np.eye(DIM), s.cross, s.n, s.class_counts, 1.0, GAMMA))


@pytest.fixture
def service(consortium, tmp_path):
    svc = Service(consortium, tmp_path / "server")
    yield svc
    svc.close()


def _assert_refused(svc, resp, status, reason, *, count_before, blobs_before):
    assert resp.status_code == status, resp.text
    assert resp.json()["error"] == reason
    assert svc.count() == count_before
    assert svc.blobs() == blobs_before
    last = svc.audit()[-1]
    assert last["outcome"] == "refused" and last["reason"] == reason


# ---------------------------------------------------------------------------
# ckks: the secret key never reaches the server; the key holder decrypts only aggregates
# ---------------------------------------------------------------------------
def test_server_refuses_secret_key_context_over_http(consortium, tmp_path):
    # Prepare: a ckks session awaiting the key holder's public context
    svc = Service(consortium, tmp_path / "server", backend="ckks", sid="sec-ckks", cap=64_000_000)
    try:
        keys = generate_keys(svc.server.definition.session_params())
        kh = svc.party("keyholder", "keyholder")

        # Execute: the key holder (mistakenly or maliciously) publishes the SECRET context
        tag_key = generate_tag_key()[1]
        from secure_afl.backends.ckks import bind_public_context
        from secure_afl.keyholder_params import sign_session_params

        sig = sign_session_params(kh.identity_key(), bind_public_context(svc.server.definition.session_params(),
                                                                         keys.public_context)
                                  .with_backend_params(tag_public_key=tag_key))
        resp = svc.signed("POST", "/context", kh, context_publication(keys.secret_context, tag_key, sig))

        # Assert: 422 secret_key_context, audited, nothing stored, session still closed
        assert resp.status_code == 422 and resp.json()["error"] == "secret_key_context"
        assert svc.server.public_context is None and svc.server.status == "awaiting_context"
        assert svc.audit()[-1]["outcome"] == "refused" and svc.audit()[-1]["event"] == "publish_context"
        assert svc.blobs() == []
        ok = svc.signed("POST", "/context", kh, context_publication(keys.public_context, tag_key, sig))
        assert ok.status_code == 200 and svc.server.status == "open"
    finally:
        svc.close()


def test_ckks_overflow_beyond_declared_bound_refused_at_reveal():
    # Prepare: a malicious hospital encrypts, bypassing protect()'s bound check, a
    # value 10x the declared aggregate bound (the sum would be meaningless)
    params, keys = new_ckks_session("sec-ovf", Layout(DIM, CLASSES), GAMMA, BOUNDS)
    backend = CKKSBackend(params)
    v = _vector(1)
    bad = v.copy()
    bad[0] = 10 * BOUNDS.aggregate_bound(GAMMA)
    ctx = hz.load_context(keys.public_context, backend.ckks_, secret=False)
    payload = seal(params, "contribution", hz.encrypt_vector(ctx, backend.ckks_, bad, backend.breaks))
    comb = backend.combiner(public_context=keys.public_context)
    comb.add(backend.protect(v, public_context=keys.public_context))
    comb.add(payload)  # the server cannot tell: ciphertexts carry no range proof

    # Execute / Assert: the honest path refuses before encrypting; reveal refuses the sum
    with pytest.raises(BoundsExceeded):
        backend.protect(bad, public_context=keys.public_context)
    with pytest.raises(SanityCheckFailed):
        backend.reveal(comb.aggregate(), secret_context=keys.secret_context)


# ---------------------------------------------------------------------------
# upload endpoint: authentication, replay, duplicates, sessions, sizes
# ---------------------------------------------------------------------------
def test_valid_upload_accepted_with_receipt_and_stored(service):
    # Prepare
    payload = service.payload()

    # Execute
    resp = service.upload("hosp-a", payload)

    # Assert: the control for every refusal below
    assert resp.status_code == 200 and resp.json()["hospital"] == "hosp-a"
    assert service.count() == 1 and service.blobs() == [hashlib.sha256(payload).hexdigest()]


def test_replayed_upload_rejected_409_replay_nothing_stored(service):
    # Prepare: one accepted upload; the attacker captured its bytes and headers
    payload = service.payload()
    statement = service.statement("hosp-a", payload)
    assert service.upload("hosp-a", payload, statement).status_code == 200
    before = (service.count(), service.blobs())

    # Execute
    resp = service.upload("hosp-a", payload, statement)

    # Assert
    _assert_refused(service, resp, 409, "replay", count_before=before[0], blobs_before=before[1])


def test_duplicate_upload_rejected_409_duplicate_nothing_stored(service):
    # Prepare: hosp-a already contributed; it signs a second, different payload
    assert service.upload("hosp-a", service.payload(seed=1)).status_code == 200
    before = (service.count(), service.blobs())

    # Execute
    resp = service.upload("hosp-a", service.payload(seed=2))

    # Assert
    _assert_refused(service, resp, 409, "duplicate", count_before=before[0], blobs_before=before[1])


def test_stale_upload_statement_rejected_as_replay(service):
    # Prepare: a statement signed 20 minutes ago (outside the 300 s window)
    payload = service.payload()
    statement = service.statement("hosp-a", payload, timestamp=time.time() - 1200)

    # Execute
    resp = service.upload("hosp-a", payload, statement)

    # Assert
    _assert_refused(service, resp, 409, "replay", count_before=0, blobs_before=[])


def test_wrong_session_statement_rejected(service):
    # Prepare: a statement signed for another session
    payload = service.payload()
    statement = service.statement("hosp-a", payload, sid="other-session")

    # Execute
    resp = service.upload("hosp-a", payload, statement)

    # Assert
    _assert_refused(service, resp, 422, "wrong_session", count_before=0, blobs_before=[])


def test_wrong_session_payload_rejected(service):
    # Prepare: a correctly signed statement over a payload sealed for another session
    other = SessionParams("other-session", "plain", Layout(DIM, CLASSES), GAMMA, BOUNDS)
    payload = get_backend(other).protect(_vector())

    # Execute
    resp = service.upload("hosp-a", payload)

    # Assert
    _assert_refused(service, resp, 422, "wrong_session", count_before=0, blobs_before=[])


def test_unsigned_upload_rejected(service):
    # Prepare
    payload = service.payload()

    # Execute: no X-SAFL-Upload header at all
    resp = service.client.post(service.path("/uploads"), content=payload)

    # Assert
    _assert_refused(service, resp, 400, "malformed", count_before=0, blobs_before=[])


def test_upload_signed_with_another_hospitals_key_rejected(service):
    # Prepare: hosp-b signs a statement that claims to be hosp-a's
    payload = service.payload()
    statement = service.statement("hosp-a", payload, signer=service.party("hosp-b"))

    # Execute
    resp = service.upload("hosp-a", payload, statement)

    # Assert: a cryptographic failure: one generic reason
    _assert_refused(service, resp, 401, "bad_signature", count_before=0, blobs_before=[])


def test_upload_from_unenrolled_hospital_rejected(service):
    # Prepare: "stranger" holds a valid consortium identity but is not in this session
    payload = service.payload()
    statement = service.statement("stranger", payload)

    # Execute
    resp = service.upload("stranger", payload, statement)

    # Assert
    _assert_refused(service, resp, 403, "unknown_party", count_before=0, blobs_before=[])


def test_tampered_payload_bit_flip_rejected(service):
    # Prepare: the statement signs the original bytes; one bit of the body flips in transit
    payload = service.payload()
    statement = service.statement("hosp-a", payload)
    tampered = bytearray(payload)
    tampered[-3] ^= 0x10

    # Execute
    resp = service.upload("hosp-a", bytes(tampered), statement)

    # Assert
    _assert_refused(service, resp, 401, "bad_signature", count_before=0, blobs_before=[])


def test_truncated_payload_rejected_even_when_signed(service):
    # Prepare: the hospital's own software truncates the payload and signs the stump
    payload = service.payload()[:-16]

    # Execute
    resp = service.upload("hosp-a", payload)

    # Assert: the envelope's body length/digest catches it
    _assert_refused(service, resp, 400, "malformed", count_before=0, blobs_before=[])


def test_oversized_body_rejected_413_without_storing(service):
    # Prepare: a body over the session's cap (max_upload_bytes = 4096)
    payload = service.payload() + b"\0" * (CAP + 1)

    # Execute
    resp = service.upload("hosp-a", payload)

    # Assert
    _assert_refused(service, resp, 413, "too_large", count_before=0, blobs_before=[])


def test_out_of_bound_plain_upload_refused_by_server(service):
    # Prepare: a hospital signs a vector beyond the declared per-hospital bound (poisoning)
    v = _vector()
    v[0] = 10 * BOUNDS.hospital_bound(GAMMA)
    env_body = v.astype("<f8").tobytes()
    payload = seal(service.server.params, "contribution", env_body)

    # Execute
    resp = service.upload("hosp-a", payload)

    # Assert
    _assert_refused(service, resp, 422, "bounds_exceeded", count_before=0, blobs_before=[])


def test_nan_payload_refused_by_server(service):
    # Prepare
    v = _vector()
    v[3] = np.nan
    payload = seal(service.server.params, "contribution", v.astype("<f8").tobytes())

    # Execute
    resp = service.upload("hosp-a", payload)

    # Assert
    _assert_refused(service, resp, 400, "malformed", count_before=0, blobs_before=[])


def test_request_nonce_replay_refused(service):
    # Prepare: a signed request by the key holder, captured
    kh = service.party("keyholder", "keyholder")
    nonce = os.urandom(16)
    first = service.signed("POST", "/close", kh, nonce=nonce)
    assert first.status_code == 409 and first.json()["error"] == "insufficient_contributors"

    # Execute: the same request (same nonce) again
    resp = service.signed("POST", "/close", kh, nonce=nonce)

    # Assert
    assert resp.status_code == 409 and resp.json()["error"] == "replay"
    assert service.audit()[-1]["outcome"] == "refused"


def test_close_below_min_clients_releases_nothing(service):
    # Prepare: one of min_clients = 2 contributions
    assert service.upload("hosp-a", service.payload()).status_code == 200

    # Execute
    resp = service.signed("POST", "/close", service.party("keyholder", "keyholder"))

    # Assert
    assert resp.status_code == 409 and resp.json()["error"] == "insufficient_contributors"
    assert service.server.status == "open"
    agg = service.signed("GET", "/aggregate", service.party("keyholder", "keyholder"))
    assert agg.status_code == 409 and agg.json()["error"] == "wrong_stage"


def test_hospital_cannot_close_or_read_the_aggregate(service):
    # Prepare
    hosp = service.party("hosp-a")

    # Execute
    close = service.signed("POST", "/close", hosp)
    agg = service.signed("GET", "/aggregate", hosp)

    # Assert
    assert close.status_code == 403 and close.json()["error"] == "forbidden"
    assert agg.status_code == 403 and agg.json()["error"] == "forbidden"


def test_upload_after_release_refused(service):
    # Prepare: two contributions, released
    for i, h in enumerate(HOSPITALS[:2]):
        assert service.upload(h, service.payload(seed=i)).status_code == 200
    assert service.signed("POST", "/close", service.party("keyholder", "keyholder")).status_code == 200
    before = (service.count(), service.blobs())

    # Execute
    resp = service.upload("hosp-c", service.payload(seed=3))

    # Assert
    _assert_refused(service, resp, 409, "round_closed", count_before=before[0], blobs_before=before[1])


def test_every_refusal_is_audited_and_the_chain_still_verifies(service):
    # Prepare: a mix of refusals and one acceptance
    payload = service.payload()
    service.client.post(service.path("/uploads"), content=payload)
    service.upload("stranger", payload, service.statement("stranger", payload))
    service.upload("hosp-a", payload)
    service.upload("hosp-a", payload)

    peer_auth.flush_refusals(service.server)

    # Execute
    v = verify_log(service.server.dir / "audit.jsonl", server_pub=service.party("aggregator", "server").identity_pub(),
                   head=_true_head(service))

    # Assert: session_created + 1 acceptance; the 3 refusals are 2 records plus one unauthenticated refusal
    # counted in a refusals_suppressed summary (same peer, same interval); all signed and chained
    records = service.audit()
    suppressed = sum(r["details"]["count"] for r in records if r["event"] == "refusals_suppressed")
    assert v.n_accepted == 2
    assert sum(r["outcome"] == "refused" and r["event"] != "refusals_suppressed" for r in records) + suppressed == 3


def test_tampered_audit_record_detected(service):
    # Prepare: a refused upload then an accepted one; the operator edits the refusal away
    service.upload("stranger", service.payload(), service.statement("stranger", service.payload()))
    assert service.upload("hosp-a", service.payload()).status_code == 200
    log = service.server.dir / "audit.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    rec = json.loads(lines[1])
    rec["outcome"] = "accepted"
    lines[1] = json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n"
    log.write_text("".join(lines))

    # Execute / Assert
    with pytest.raises(AuditChainBroken) as info:
        check_chain(log)
    assert info.value.index == 1


# ---------------------------------------------------------------------------
# the key holder: manifest binding, sanity checks, class minimum, differencing
# ---------------------------------------------------------------------------
@pytest.fixture
def keyholder(consortium, tmp_path):
    return KeyHolder(consortium, "keyholder", tmp_path / "keys", passphrase=b"unit-test-passphrase")


def _released(service, hospitals=HOSPITALS[:2], vectors=None):
    for i, h in enumerate(hospitals):
        v = vectors[i] if vectors is not None else _vector(seed=i)
        assert service.upload(h, service.payload(v)).status_code == 200, h
    service.signed("POST", "/close", service.party("keyholder", "keyholder"))
    return closing.released(service.server)


def test_keyholder_releases_an_honest_plain_aggregate(service, keyholder):
    # Prepare
    aggregate, manifest = _released(service)

    # Execute
    res = keyholder.reveal_and_solve(service.server.params, aggregate, manifest, min_clients=2)

    # Assert: the control for the refusals below
    assert res.report["contributors"] == 2 and res.W.shape == (DIM, CLASSES)


def test_keyholder_refuses_manifest_below_its_own_min_clients(service, keyholder):
    # Prepare: the server released with its min_clients = 2
    aggregate, manifest = _released(service)

    # Execute / Assert: the key holder's own policy is 3
    with pytest.raises(DecryptionRefused) as info:
        keyholder.reveal_and_solve(service.server.params, aggregate, manifest, min_clients=3)
    assert info.value.__cause__.reason == "insufficient_contributors"


def test_keyholder_refuses_manifest_naming_unknown_identity(service, keyholder, consortium):
    # Prepare: a manifest (validly server-signed) that lists an identity the key holder
    # does not accept (restricted to the expected hospitals)
    aggregate, manifest = _released(service)

    # Execute / Assert
    with pytest.raises(DecryptionRefused) as info:
        keyholder.reveal_and_solve(service.server.params, aggregate, manifest, min_clients=2,
                                   expected_hospitals=["hosp-a", "hosp-c"])
    assert info.value.__cause__.reason == "unknown_identity"


def test_keyholder_detects_tampered_manifest(service, keyholder):
    # Prepare: someone drops a participant from the signed manifest
    aggregate, manifest = _released(service, HOSPITALS)
    tampered = {**manifest, "participants": manifest["participants"][:2]}

    # Execute / Assert
    with pytest.raises(DecryptionRefused) as info:
        keyholder.reveal_and_solve(service.server.params, aggregate, tampered, min_clients=2)
    assert info.value.__cause__.reason == "bad_signature"


def test_keyholder_refuses_aggregate_not_named_by_manifest(service, keyholder):
    # Prepare: the manifest names the released aggregate; another one is handed over
    aggregate, manifest = _released(service)
    body = bytearray(peek_header(aggregate).body)
    body[0] ^= 1  # one bit of C_11
    other = seal(service.server.params, "aggregate", bytes(body), contributors=2)

    # Execute / Assert
    with pytest.raises(DecryptionRefused):
        keyholder.reveal_and_solve(service.server.params, other, manifest, min_clients=2)


def test_non_psd_poisoned_aggregate_refused_by_keyholder(service, keyholder):
    # Prepare: hosp-b sends in-bound but impossible statistics: a Gram with a
    # negative direction (no X has X^T X like that); the plain server only checks bounds
    lay = Layout(DIM, CLASSES)
    honest = _vector(0)
    stats = lay.unpack(_vector(1), gamma=GAMMA)
    stats.gram[0, 0] -= 50.0
    poisoned = lay.pack(stats)

    aggregate, manifest = _released(service, vectors=[honest, poisoned])

    # Execute / Assert
    with pytest.raises(SanityCheckFailed) as info:
        keyholder.reveal_and_solve(service.server.params, aggregate, manifest, min_clients=2)
    assert "psd" in str(info.value) or "cauchy_schwarz" in str(info.value)


def test_embeddings_beyond_norm_bound_refused_at_client_and_at_keyholder(service, keyholder):
    # Prepare: one embedding of norm 10 > B = 2 (gross poisoning)
    X = np.zeros((3, DIM))
    X[:, 0] = [1.0, 1.0, 10.0]
    y = np.array([0, 1, 2])

    # Execute / Assert 1: the honest client refuses to accumulate it
    with pytest.raises(BoundsExceeded):
        StatisticsAccumulator(DIM, CLASSES, max_norm=BOUNDS.max_norm).update(X, y)

    # Execute / Assert 2: a patched client sends it anyway (per-entry bound n_max B^2 still
    # holds); the key holder's trace(C) <= n B^2 check refuses the release
    s = local_statistics(X, y, CLASSES)
    poisoned = Layout(DIM, CLASSES).pack(
        SufficientStatistics(s.gram + GAMMA * np.eye(DIM), s.cross, s.n, s.class_counts, 1.0, GAMMA))
    check_vector(service.server.params, poisoned)  # passes the server's bound check
    aggregate, manifest = _released(service, vectors=[_vector(0), poisoned])
    with pytest.raises(SanityCheckFailed) as info:
        keyholder.reveal_and_solve(service.server.params, aggregate, manifest, min_clients=2)
    assert "norm_bound" in str(info.value) or "cauchy_schwarz" in str(info.value)


def test_release_with_rare_class_refused_by_class_minimum(service, keyholder):
    # Prepare: class 2 has a single patient across the whole cohort
    lay = Layout(DIM, CLASSES)

    def vec(labels, seed):
        rng = np.random.default_rng(seed)
        X = rng.standard_normal((len(labels), DIM)) * 0.3
        s = local_statistics(X, np.array(labels), CLASSES)
        return lay.pack(SufficientStatistics(s.gram + GAMMA * np.eye(DIM), s.cross, s.n, s.class_counts, 1.0,
                                             GAMMA))

    aggregate, manifest = _released(service, vectors=[vec([0] * 6 + [1] * 6, 0), vec([0] * 5 + [1] * 5 + [2], 1)])

    # Execute / Assert
    with pytest.raises(PolicyViolation) as info:
        keyholder.reveal_and_solve(service.server.params, aggregate, manifest, min_clients=2, min_class_count=5)
    assert "[2]" in str(info.value)
    assert keyholder.reveal_and_solve(service.server.params, aggregate, manifest, min_clients=2,
                                      min_class_count=1).report["class_counts"] == [11, 11, 1]


def test_class_minimum_ignores_absent_classes():
    # Prepare
    stats = SufficientStatistics(np.eye(DIM), np.zeros((DIM, CLASSES)), 10.0, np.array([10.0, 0.0, 0.0]))

    # Execute / Assert: an absent class discloses nobody; a present rare one does
    check_class_minimum(stats, 5)
    stats.class_counts = np.array([9.0, 0.0, 1.0])
    with pytest.raises(PolicyViolation):
        check_class_minimum(stats, 5)


def test_release_ledger_refuses_overlapping_second_release_under_same_key(tmp_path):
    # Prepare
    ledger = ReleaseLedger(tmp_path / "releases.sqlite3")
    ledger.record("key-1", "s1", ["a", "b", "c"], "aa" * 32)

    # Execute / Assert: overlapping cohort, other aggregate, same key -> refused
    with pytest.raises(PolicyViolation):
        ledger.check("key-1", "s1", ["a", "b"], "bb" * 32)
    # the identical release again and a disjoint cohort or another key are fine
    ledger.check("key-1", "s1", ["a", "b", "c"], "aa" * 32)
    ledger.check("key-1", "s2", ["d", "e"], "cc" * 32)
    ledger.check("key-2", "s3", ["a", "b"], "dd" * 32)
    ledger.close()


def test_keyholder_ledger_refuses_second_overlapping_release(service, keyholder, consortium):
    # Prepare: the key holder released {a, b, c}; a malicious server re-signs a manifest for
    # {a, b} over the same uploads (same key) to get the difference = c
    aggregate, manifest = _released(service, HOSPITALS)
    keyholder.reveal_and_solve(service.server.params, aggregate, manifest, min_clients=2)
    backend = get_backend(service.server.params)
    comb = backend.combiner()
    rows = {r["hospital"]: r for r in service.server.store.uploads()}
    for h in ("hosp-a", "hosp-b"):
        comb.add(service.server.store.get_blob(rows[h]["payload_sha256"]))
    agg2 = comb.aggregate()
    parts = [{**rows[h]["statement"], "identity_pub": pki.public_key_hex(service.party(h).identity_pub())}
             for h in ("hosp-a", "hosp-b")]
    manifest2 = build_manifest(service.party("aggregator", "server").identity_key(), service.sid,
                               service.server.params.digest(), parts, hashlib.sha256(agg2).digest(), 2)

    # Execute / Assert
    with pytest.raises(PolicyViolation) as info:
        keyholder.reveal_and_solve(service.server.params, agg2, manifest2, min_clients=2)
    assert "differencing" in str(info.value)


def test_sanity_check_refuses_forwarded_single_contribution():
    # Prepare: one hospital's statistics presented as a 3-hospital sum
    params = SessionParams("sec-s", "plain", Layout(DIM, CLASSES), GAMMA, BOUNDS)
    single = Layout(DIM, CLASSES).unpack(_vector(0), gamma=GAMMA)

    # Execute / Assert
    with pytest.raises(SanityCheckFailed, match="contributors"):
        sanity_check(single, params, 3, abs_tol=1e-9)
    sanity_check(single, params, 1, abs_tol=1e-9)  # control: plausible as a 1-sum


# ---------------------------------------------------------------------------
# client-side input validation
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_embeddings_refused(bad):
    # Prepare
    X = np.ones((2, DIM)) * 0.1
    X[1, 2] = bad

    # Execute / Assert
    with pytest.raises(InvalidInputError):
        StatisticsAccumulator(DIM, CLASSES, max_norm=2.0).update(X, np.array([0, 1]))
    v = _vector()
    v[5] = bad
    params = SessionParams("sec-v", "plain", Layout(DIM, CLASSES), GAMMA, BOUNDS)
    with pytest.raises(InvalidInputError):
        check_vector(params, v)


def test_oversized_or_misshapen_vector_refused_before_protection():
    # Prepare
    params = SessionParams("sec-v", "plain", Layout(DIM, CLASSES), GAMMA, BOUNDS)
    v = _vector()

    # Execute / Assert
    with pytest.raises(BoundsExceeded):
        check_vector(params, np.where(np.arange(v.size) == 0, 1e12, v))
    with pytest.raises(ValueError):
        check_vector(params, np.append(v, 0.0))
    with pytest.raises(TypeError):
        check_vector(params, np.array(["x"] * v.size))


# ---------------------------------------------------------------------------
# fuzzing the upload endpoint
# ---------------------------------------------------------------------------
_STATEMENT_FIELDS = ("type", "v", "session_id", "params_digest", "hospital", "payload_sha256", "nonce", "time",
                     "signature")
_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                       st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=80))
_json_value = st.recursive(_json_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c,
                                                                                           max_size=3), max_leaves=6)

_body_mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(0, 7)),
    st.tuples(st.just("truncate"), st.integers(0, 10_000)),
    st.tuples(st.just("extend"), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("replace"), st.binary(max_size=600)),
    st.tuples(st.just("overwrite"), st.integers(0, 10_000), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("keep")),
)
_header_mutation = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(_STATEMENT_FIELDS + ("extra",)), _json_value),
    st.tuples(st.just("delete"), st.sampled_from(_STATEMENT_FIELDS)),
    st.tuples(st.just("raw_flip"), st.integers(0, 2_000), st.integers(32, 126)),
    st.tuples(st.just("raw_truncate"), st.integers(0, 2_000)),
    st.tuples(st.just("raw"), st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=200)),
    st.tuples(st.just("absent")),
    st.tuples(st.just("keep")),
)
_extra_headers = st.dictionaries(
    st.sampled_from(["x-safl-party", "x-safl-time", "x-safl-nonce", "x-safl-signature", "content-length",
                     "content-type"]),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40), max_size=2)


def _mutate_body(payload: bytes, m) -> bytes:
    kind = m[0]
    if kind == "flip":
        b = bytearray(payload)
        b[m[1] % len(b)] ^= 1 << m[2]
        return bytes(b)
    if kind == "truncate":
        return payload[: m[1] % len(payload)]
    if kind == "extend":
        return payload + m[1]
    if kind == "replace":
        return m[1]
    if kind == "overwrite":
        i = m[1] % len(payload)
        return payload[:i] + m[2] + payload[i + len(m[2]):]
    return payload


def _mutate_header(statement: dict, m):
    kind = m[0]
    raw = json.dumps(statement, separators=(",", ":"))
    if kind == "set":
        return json.dumps({**statement, m[1]: m[2]}, separators=(",", ":"))
    if kind == "delete":
        return json.dumps({k: v for k, v in statement.items() if k != m[1]}, separators=(",", ":"))
    if kind == "raw_flip":
        i = m[1] % len(raw)
        return raw[:i] + chr(m[2]) + raw[i + 1:]
    if kind == "raw_truncate":
        return raw[: m[1] % len(raw)]
    if kind == "raw":
        return m[1]
    if kind == "absent":
        return None
    return raw


def _semantically_valid(statement: dict, header, payload: bytes, body: bytes) -> bool:
    """Would an honest server have to accept this (the mutation changed nothing that is signed)?

    The server keeps only the signed fields (extra keys are ignored, and Python-equal
    values such as ``true`` for ``1`` rebuild the same canonical statement).
    """
    if body != payload or header is None:
        return False
    try:
        d = json.loads(header)
    except ValueError:
        return False
    return isinstance(d, dict) and all(k in d and d[k] == statement[k] and type(d[k]) in (type(statement[k]), bool)
                                       for k in _STATEMENT_FIELDS)


def _fuzz(svc, examples: int):
    stats = {"cases": 0, "status": {}}
    t0 = time.perf_counter()
    blobs0, count0 = svc.blobs(), svc.count()

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(body_m=_body_mutation, header_m=_header_mutation, extra=_extra_headers,
           hospital=st.sampled_from(HOSPITALS + ("stranger", "nobody", "../../etc")))
    def case(body_m, header_m, extra, hospital):
        payload = svc.payload(seed=1)
        name = hospital if hospital in HOSPITALS + ("stranger",) else "hosp-a"
        statement = svc.statement(name, payload)
        if hospital not in HOSPITALS + ("stranger",):
            statement["hospital"] = hospital  # a name nobody enrolled, under hosp-a's signature
        body = _mutate_body(payload, body_m)
        header = _mutate_header(statement, header_m)
        if _semantically_valid(statement, header, payload, body) and name in HOSPITALS \
                and statement["hospital"] == name:
            return  # an unmodified valid upload is not a fuzz case
        headers = {k: v for k, v in extra.items()}
        if header is not None:
            headers[H_UPLOAD] = header
        try:
            resp = svc.client.post(svc.path("/uploads"), content=body, headers=headers)
            status = resp.status_code
        except Exception as e:  # a transport-level refusal by the client library (e.g. bad content-length)
            status = f"client:{type(e).__name__}"
        stats["cases"] += 1
        stats["status"][str(status)] = stats["status"].get(str(status), 0) + 1
        assert not (isinstance(status, int) and status >= 500), (body_m, header_m, extra)
        assert status != 200, (body_m, header_m, extra)
        assert svc.count() == count0 and svc.blobs() == blobs0

    case()
    stats["seconds"] = time.perf_counter() - t0
    stats["cases_per_s"] = stats["cases"] / stats["seconds"]
    return stats


def _fuzz_and_check(svc, examples, minimum):
    # Execute
    stats = _fuzz(svc, examples)
    print(f"\nupload fuzzing: {stats['cases']} cases in {stats['seconds']:.1f} s "
          f"({stats['cases_per_s']:.0f} cases/s); statuses {stats['status']}")

    # Assert: enough real cases, nothing stored, the chain verifies, and the service still works
    assert stats["cases"] >= minimum
    assert svc.count() == 0 and svc.blobs() == []
    verify_log(svc.server.dir / "audit.jsonl", server_pub=svc.party("aggregator", "server").identity_pub(),
               head=_true_head(svc))
    ok = svc.upload("hosp-a", svc.payload(seed=1))
    assert ok.status_code == 200 and svc.count() == 1
    return stats


def test_fuzz_upload_endpoint_never_5xx_and_stores_nothing(service):
    # Prepare: a plain session, dim 4, classes 3 (the real app, SQLite and audit log)
    _fuzz_and_check(service, 300, 250)


@pytest.mark.slow
def test_fuzz_upload_endpoint_10k_cases(consortium, tmp_path):
    # Prepare: audit fsyncs dominate; /dev/shm keeps the 2-core CI machine usable
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else str(tmp_path)
    import tempfile

    with tempfile.TemporaryDirectory(dir=base) as d:
        svc = Service(consortium, os.path.join(d, "server"), sid="sec-fuzz")
        try:
            _fuzz_and_check(svc, 10_500, 10_000)
        finally:
            svc.close()


def test_server_stores_only_a_countersignature_over_its_own_close_record(service):
    # Prepare: a released session; a countersignature over a close record pinning another head
    from secure_afl.audit_log import countersign_head, make_close_record
    from secure_afl.encoding import canonical_json

    _released(service)
    kh = service.party("keyholder", "keyholder")
    server = service.party("aggregator", "server")
    close = audit_records.audit_head(service.server)["close"]
    other = make_close_record(server.identity_key(), close["session_id"], close["seq"] - 1, "ab" * 32,
                              close["participants"])
    forged = countersign_head(kh.identity_key(), "keyholder", other, server.identity_pub())
    honest = countersign_head(kh.identity_key(), "keyholder", close, server.identity_pub())

    # Execute
    refused = service.signed("POST", "/audit/countersign", kh, canonical_json(forged))
    nothing_stored = audit_records.audit_head(service.server)["countersign"] is None
    accepted = service.signed("POST", "/audit/countersign", kh, canonical_json(honest))

    # Assert
    assert refused.status_code == 401 and refused.json()["error"] == "bad_signature" and nothing_stored
    assert accepted.status_code == 200 and accepted.json()["countersign"] == honest
    head = json.loads((service.server.dir / "audit-head.json").read_text())
    assert head == {"close": close, "countersign": honest}
