"""Ed25519 upload statements, receipts and manifests."""

from __future__ import annotations

import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secure_afl import exceptions
from secure_afl.pki import public_key_hex
from secure_afl.signing import (
    MANIFEST_PREFIX,
    UPLOAD_PREFIX,
    build_manifest,
    canonical_json,
    make_receipt,
    sign_upload,
    verify_manifest,
    verify_receipt,
    verify_upload,
)

SESSION = "s1"
PARAMS = hashlib.sha256(b"params").digest()
AGG = hashlib.sha256(b"aggregate").digest()
T0 = 1_700_000_000


def _payload(name: str) -> bytes:
    return hashlib.sha256(f"payload of {name}".encode()).digest()


@pytest.fixture(scope="module")
def keys():
    return {name: Ed25519PrivateKey.generate() for name in ("server", "hosp-a", "hosp-b", "hosp-c", "rogue")}


@pytest.fixture(scope="module")
def enrolled(keys):
    return {n: keys[n].public_key() for n in ("hosp-a", "hosp-b", "hosp-c")}


def _participant(keys, name, *, signer=None, session=SESSION, params=PARAMS):
    key = keys[signer or name]
    up = sign_upload(key, session, params, _payload(name), name, timestamp=T0)
    return {**up, "identity_pub": public_key_hex(key.public_key())}


def _manifest(keys, names, *, min_clients=2):
    parts = [_participant(keys, n) for n in names]
    return build_manifest(keys["server"], SESSION, PARAMS, parts, AGG, min_clients, timestamp=T0)


def _resign(statement: dict, key, prefix=MANIFEST_PREFIX) -> dict:
    """What a malicious server can do: sign whatever it likes with its own key."""
    body = {k: v for k, v in statement.items() if k != "signature"}
    return {**body, "signature": key.sign(prefix + canonical_json(body)).hex()}


# --------------------------------------------------------------------------
# uploads
# --------------------------------------------------------------------------


def test_upload_signature_round_trip(keys):
    # Prepare
    key = keys["hosp-a"]

    # Execute
    up = sign_upload(key, SESSION, PARAMS, _payload("hosp-a"), "hosp-a")
    out = verify_upload(up, key.public_key(), session_id=SESSION, params_digest=PARAMS,
                        payload_sha256=_payload("hosp-a"), hospital="hosp-a", max_age_s=60)

    # Assert
    assert out == up
    assert len(bytes.fromhex(up["nonce"])) == 16 and len(bytes.fromhex(up["signature"])) == 64


def test_upload_signature_is_deterministic_given_nonce_and_time(keys):
    # Execute
    a = sign_upload(keys["hosp-a"], SESSION, PARAMS, _payload("x"), "hosp-a", nonce=b"\0" * 16, timestamp=T0)
    b = sign_upload(keys["hosp-a"], SESSION, PARAMS, _payload("x"), "hosp-a", nonce=b"\0" * 16, timestamp=T0)

    # Assert
    assert a == b


@pytest.mark.security
@pytest.mark.parametrize("field, value", [
    ("session_id", "s2"),
    ("params_digest", "11" * 32),
    ("hospital", "hosp-b"),
    ("payload_sha256", "22" * 32),
    ("nonce", "33" * 16),
    ("time", T0 + 1),
    ("signature", "00" * 64),
])
def test_tampered_upload_statement_detected(keys, field, value):
    # Prepare
    up = sign_upload(keys["hosp-a"], SESSION, PARAMS, _payload("hosp-a"), "hosp-a", timestamp=T0)
    tampered = {**up, field: value}

    # Execute / Assert
    with pytest.raises(exceptions.InvalidSignature):
        verify_upload(tampered, keys["hosp-a"].public_key())


@pytest.mark.security
def test_upload_signed_by_another_key_refused(keys):
    # Prepare
    up = sign_upload(keys["rogue"], SESSION, PARAMS, _payload("hosp-a"), "hosp-a")

    # Execute / Assert
    with pytest.raises(exceptions.InvalidSignature):
        verify_upload(up, keys["hosp-a"].public_key())


@pytest.mark.security
def test_upload_for_other_payload_session_or_parameters_refused(keys):
    # Prepare
    pub = keys["hosp-a"].public_key()
    up = sign_upload(keys["hosp-a"], SESSION, PARAMS, _payload("hosp-a"), "hosp-a")

    # Execute / Assert
    with pytest.raises(exceptions.InvalidSignature):
        verify_upload(up, pub, payload_sha256=_payload("other"))
    with pytest.raises(exceptions.InvalidSignature):
        verify_upload(up, pub, hospital="hosp-b")
    with pytest.raises(exceptions.WrongSession):
        verify_upload(up, pub, session_id="s2")
    with pytest.raises(exceptions.ParameterMismatch):
        verify_upload(up, pub, params_digest=hashlib.sha256(b"other").digest())


@pytest.mark.security
def test_stale_upload_statement_refused(keys):
    # Prepare
    up = sign_upload(keys["hosp-a"], SESSION, PARAMS, _payload("hosp-a"), "hosp-a", timestamp=T0)

    # Execute / Assert
    verify_upload(up, keys["hosp-a"].public_key(), max_age_s=300, now=T0 + 299)
    with pytest.raises(exceptions.ReplayedContribution):
        verify_upload(up, keys["hosp-a"].public_key(), max_age_s=300, now=T0 + 301)


def test_malformed_upload_statement_refused(keys):
    # Prepare
    up = sign_upload(keys["hosp-a"], SESSION, PARAMS, _payload("hosp-a"), "hosp-a", timestamp=T0)

    # Execute / Assert
    with pytest.raises(exceptions.MalformedPayload):
        verify_upload({k: v for k, v in up.items() if k != "nonce"}, keys["hosp-a"].public_key())
    with pytest.raises(exceptions.MalformedPayload):
        verify_upload({**up, "payload_sha256": up["payload_sha256"].upper()}, keys["hosp-a"].public_key())
    with pytest.raises(exceptions.MalformedPayload):
        verify_upload("not a dict", keys["hosp-a"].public_key())


def test_sign_upload_checks_argument_types(keys):
    # Execute / Assert
    with pytest.raises(TypeError):
        sign_upload(keys["hosp-a"], SESSION, PARAMS, 123, "hosp-a")
    with pytest.raises(ValueError):
        sign_upload(keys["hosp-a"], SESSION, PARAMS, b"short", "hosp-a")
    with pytest.raises(TypeError):
        sign_upload(keys["hosp-a"].public_key(), SESSION, PARAMS, _payload("x"), "hosp-a")


# --------------------------------------------------------------------------
# receipts and domain separation
# --------------------------------------------------------------------------


def test_receipt_round_trip(keys):
    # Execute
    r = make_receipt(keys["server"], SESSION, "hosp-a", _payload("hosp-a"), 7, T0)

    # Assert
    assert verify_receipt(r, keys["server"].public_key()) == r
    assert r["seq"] == 7 and r["payload_sha256"] == _payload("hosp-a").hex()


@pytest.mark.security
@pytest.mark.parametrize("field, value", [("seq", 8), ("hospital", "hosp-b"), ("payload_sha256", "44" * 32),
                                          ("session_id", "s2"), ("time", T0 - 1)])
def test_tampered_receipt_detected(keys, field, value):
    # Prepare
    r = make_receipt(keys["server"], SESSION, "hosp-a", _payload("hosp-a"), 7, T0)

    # Execute / Assert
    with pytest.raises(exceptions.InvalidSignature):
        verify_receipt({**r, field: value}, keys["server"].public_key())


@pytest.mark.security
def test_receipt_signed_by_non_server_key_refused(keys):
    # Prepare
    r = make_receipt(keys["rogue"], SESSION, "hosp-a", _payload("hosp-a"), 7, T0)

    # Execute / Assert
    with pytest.raises(exceptions.InvalidSignature):
        verify_receipt(r, keys["server"].public_key())


@pytest.mark.security
def test_signature_of_one_kind_cannot_be_replayed_as_another(keys):
    # Prepare: the same statement signed under the upload domain instead of the receipt domain
    r = make_receipt(keys["server"], SESSION, "hosp-a", _payload("hosp-a"), 7, T0)
    cross = _resign(r, keys["server"], prefix=UPLOAD_PREFIX)

    # Execute / Assert
    with pytest.raises(exceptions.InvalidSignature):
        verify_receipt(cross, keys["server"].public_key())


# --------------------------------------------------------------------------
# manifests
# --------------------------------------------------------------------------


def test_valid_manifest_verifies(keys, enrolled):
    # Prepare
    m = _manifest(keys, ["hosp-b", "hosp-a", "hosp-c"], min_clients=3)

    # Execute
    out = verify_manifest(m, keys["server"].public_key(), enrolled, 3, session_id=SESSION,
                          params_digest=PARAMS, aggregate_sha256=AGG)

    # Assert
    assert out == m
    assert [p["hospital"] for p in m["participants"]] == ["hosp-a", "hosp-b", "hosp-c"]


@pytest.mark.security
def test_manifest_with_fewer_than_min_clients_refused(keys, enrolled):
    # Prepare
    m = _manifest(keys, ["hosp-a", "hosp-b"], min_clients=2)

    # Execute / Assert
    with pytest.raises(exceptions.InsufficientContributors):
        verify_manifest(m, keys["server"].public_key(), enrolled, 3)
    with pytest.raises(exceptions.InsufficientContributors):
        _manifest(keys, ["hosp-a"], min_clients=2)


@pytest.mark.security
def test_manifest_with_unknown_identity_refused(keys, enrolled):
    # Prepare: "rogue" is not enrolled but signs for itself
    parts = [_participant(keys, "hosp-a"), _participant(keys, "rogue")]
    m = build_manifest(keys["server"], SESSION, PARAMS, parts, AGG, 2, timestamp=T0)

    # Execute / Assert
    with pytest.raises(exceptions.PolicyViolation) as exc:
        verify_manifest(m, keys["server"].public_key(), enrolled, 2)
    assert exc.value.reason == "unknown_identity"


@pytest.mark.security
def test_manifest_with_enrolled_name_but_foreign_key_refused(keys, enrolled):
    # Prepare: "hosp-b" signed by the rogue key (a valid signature, wrong identity)
    parts = [_participant(keys, "hosp-a"), _participant(keys, "hosp-b", signer="rogue")]
    m = build_manifest(keys["server"], SESSION, PARAMS, parts, AGG, 2, timestamp=T0)

    # Execute / Assert
    with pytest.raises(exceptions.PolicyViolation):
        verify_manifest(m, keys["server"].public_key(), enrolled, 2)
    with pytest.raises(exceptions.PolicyViolation):
        build_manifest(keys["server"], SESSION, PARAMS, parts, AGG, 2, enrolled=enrolled)


@pytest.mark.security
def test_manifest_with_duplicate_identity_refused(keys, enrolled):
    # Prepare: a malicious server counts hosp-a twice (two valid uploads) to reach min_clients
    first = _participant(keys, "hosp-a")
    second = {**sign_upload(keys["hosp-a"], SESSION, PARAMS, _payload("again"), "hosp-a", timestamp=T0),
              "identity_pub": first["identity_pub"]}
    m = _manifest(keys, ["hosp-a", "hosp-b"])
    forged = _resign({**m, "participants": sorted(
        [{k: p[k] for k in ("hospital", "payload_sha256", "nonce", "time", "signature", "identity_pub")}
         for p in (first, second)], key=lambda p: p["payload_sha256"])}, keys["server"])

    # Execute / Assert
    with pytest.raises(exceptions.DuplicateContribution):
        verify_manifest(forged, keys["server"].public_key(), enrolled, 2)
    with pytest.raises(exceptions.DuplicateContribution):
        build_manifest(keys["server"], SESSION, PARAMS, [first, second], AGG, 2)


@pytest.mark.security
def test_manifest_with_tampered_participant_entry_refused(keys, enrolled):
    # Prepare
    m = _manifest(keys, ["hosp-a", "hosp-b"])
    parts = [dict(p) for p in m["participants"]]
    parts[0]["payload_sha256"] = "55" * 32
    tampered = {**m, "participants": parts}

    # Execute / Assert: caught by the server signature, and, if the server
    # re-signs it, by the hospital's own upload signature
    with pytest.raises(exceptions.InvalidSignature):
        verify_manifest(tampered, keys["server"].public_key(), enrolled, 2)
    with pytest.raises(exceptions.InvalidSignature):
        verify_manifest(_resign(tampered, keys["server"]), keys["server"].public_key(), enrolled, 2)


@pytest.mark.security
def test_manifest_with_bad_server_signature_refused(keys, enrolled):
    # Prepare
    m = _manifest(keys, ["hosp-a", "hosp-b"])

    # Execute / Assert
    with pytest.raises(exceptions.InvalidSignature):
        verify_manifest(_resign(m, keys["rogue"]), keys["server"].public_key(), enrolled, 2)
    with pytest.raises(exceptions.InvalidSignature):
        verify_manifest({**m, "signature": "00" * 64}, keys["server"].public_key(), enrolled, 2)


@pytest.mark.security
def test_manifest_for_other_aggregate_session_or_parameters_refused(keys, enrolled):
    # Prepare
    m = _manifest(keys, ["hosp-a", "hosp-b"])
    pub = keys["server"].public_key()

    # Execute / Assert
    with pytest.raises(exceptions.InvalidSignature):
        verify_manifest(m, pub, enrolled, 2, aggregate_sha256=hashlib.sha256(b"other").digest())
    with pytest.raises(exceptions.WrongSession):
        verify_manifest(m, pub, enrolled, 2, session_id="s2")
    with pytest.raises(exceptions.ParameterMismatch):
        verify_manifest(m, pub, enrolled, 2, params_digest=hashlib.sha256(b"other").digest())


@pytest.mark.security
def test_manifest_refuses_upload_signed_for_another_session(keys):
    # Prepare
    parts = [_participant(keys, "hosp-a"), _participant(keys, "hosp-b", session="s2")]

    # Execute / Assert
    with pytest.raises(exceptions.WrongSession):
        build_manifest(keys["server"], SESSION, PARAMS, parts, AGG, 2)


def test_manifest_refuses_upload_signed_for_other_session_parameters(keys):
    # Prepare: hosp-b signed its upload under another parameter digest (another scale, bound or key)
    other = bytes(b ^ 0xFF for b in PARAMS)
    parts = [_participant(keys, "hosp-a"), _participant(keys, "hosp-b", params=other)]

    # Execute / Assert: the server signs no manifest that mixes parameters
    with pytest.raises(exceptions.ParameterMismatch):
        build_manifest(keys["server"], SESSION, PARAMS, parts, AGG, 2)
