"""Application-level Ed25519 signatures: uploads, receipts and manifests.

Who runs this: a hospital signs its upload (:func:`sign_upload`); the server
verifies it (:func:`verify_upload`), returns a signed receipt
(:func:`make_receipt`) and, when the round closes, signs a manifest of the
contributions in the aggregate (:func:`build_manifest`); the key holder checks
the manifest before it decrypts anything (:func:`verify_manifest`); an auditor
checks receipts against the audit log (:mod:`secure_afl.audit_log`).

Every signature is over ``PREFIX || canonical_json(statement)`` where the
statement is the signed dict without its ``signature`` field, canonical JSON
is :func:`secure_afl.encoding.canonical_json`, and the prefix is a per-kind domain separator
(``b"secure-afl/upload/v1\\0"``, ``.../receipt/v1\\0``, ``.../manifest/v1\\0``),
so a signature of one kind can never be replayed as another. Byte strings
(digests, nonces, keys, signatures) travel as lower-case hex; times are
integer Unix seconds.

Every verification failure of a signature, and every mismatch between what a
signature covers and what it is claimed to cover (payload hash, hospital),
raises a detail-free :class:`~secure_afl.exceptions.InvalidSignature`. A
statement for another session raises :class:`WrongSession`, for other
parameters :class:`ParameterMismatch`; structurally broken statements raise
:class:`MalformedPayload`.
"""

from __future__ import annotations

import re
import secrets
import time as _time
from typing import Iterable, Mapping

from . import domains
from .encoding import canonical_json
from .exceptions import (
    DuplicateContribution,
    InsufficientContributors,
    InvalidSignature,
    MalformedPayload,
    ParameterMismatch,
    PolicyViolation,
    ReplayedContribution,
    WrongSession,
)
from secure_afl.pki import public_key_from_hex
from secure_afl.pki import public_key_hex

__all__ = [
    "UPLOAD_PREFIX",
    "RECEIPT_PREFIX",
    "MANIFEST_PREFIX",
    "sign_upload",
    "verify_upload",
    "make_receipt",
    "verify_receipt",
    "build_manifest",
    "verify_manifest",
]

UPLOAD_PREFIX = domains.UPLOAD
RECEIPT_PREFIX = domains.RECEIPT
MANIFEST_PREFIX = domains.MANIFEST

_VERSION = 1
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HEX = re.compile(r"^[0-9a-f]*$")
_UPLOAD_FIELDS = ("type", "v", "session_id", "params_digest", "hospital", "payload_sha256", "nonce", "time")
_PARTICIPANT_FIELDS = ("hospital", "payload_sha256", "nonce", "time", "signature", "identity_pub")


# --------------------------------------------------------------------------
# boundary checks
# --------------------------------------------------------------------------


def _hex_of(name: str, value, length: int | None = None) -> str:
    """Bytes or hex str -> lower-case hex (TypeError / ValueError on misuse)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value).hex()
    elif isinstance(value, str):
        value = value.lower()
        if not _HEX.match(value) or len(value) % 2:
            raise ValueError(f"{name} must be bytes or a hex string")
    else:
        raise TypeError(f"{name} must be bytes or a hex string")
    if length is not None and len(value) != 2 * length:
        raise ValueError(f"{name} must be {length} bytes")
    return value


def _name_of(name: str, value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str")
    if not _NAME.match(value):
        raise ValueError(f"{name} must match [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}")
    return value


def _time_of(timestamp) -> int:
    if timestamp is None:
        return int(_time.time())
    if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)):
        raise TypeError("timestamp must be a number of Unix seconds")
    return int(timestamp)


def _private_key(key):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if not isinstance(key, Ed25519PrivateKey):
        raise TypeError("signing key must be an Ed25519PrivateKey")
    return key


def _public_key(key):
    """Ed25519PublicKey, raw 32 bytes, hex str, or anything with .public_key()."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if isinstance(key, Ed25519PublicKey):
        return key
    if isinstance(key, (bytes, bytearray)) and len(key) == 32:
        return Ed25519PublicKey.from_public_bytes(bytes(key))
    if isinstance(key, str):

        return public_key_from_hex(key)
    if hasattr(key, "public_key"):  # pki.Enrolment
        return key.public_key()
    raise TypeError("public key must be an Ed25519PublicKey, 32 raw bytes or hex")


def _pub_hex(key) -> str:

    return public_key_hex(_public_key(key))


def _sign(key, prefix: bytes, statement: Mapping) -> str:
    return _private_key(key).sign(prefix + canonical_json(statement)).hex()


def _verify(pub, prefix: bytes, statement: Mapping, signature) -> None:
    from cryptography.exceptions import InvalidSignature as _CryptoInvalidSignature

    if not isinstance(signature, str) or len(signature) != 128 or not _HEX.match(signature):
        raise InvalidSignature()
    try:
        _public_key(pub).verify(bytes.fromhex(signature), prefix + canonical_json(statement))
    except _CryptoInvalidSignature:
        raise InvalidSignature() from None


def _as_dict(name: str, value) -> dict:
    if not isinstance(value, Mapping):
        raise MalformedPayload(f"{name} must be a JSON object")
    return dict(value)


def _require(d: Mapping, fields: Iterable[str], what: str) -> None:
    missing = [f for f in fields if f not in d]
    if missing:
        raise MalformedPayload(f"{what} lacks field(s) {missing}")


# --------------------------------------------------------------------------
# uploads (hospital -> server)
# --------------------------------------------------------------------------


def _upload_statement(session_id, params_digest, payload_sha256, hospital, nonce, timestamp) -> dict:
    return {
        "type": "upload",
        "v": _VERSION,
        "session_id": _name_of("session_id", session_id),
        "params_digest": _hex_of("params_digest", params_digest, 32),
        "hospital": _name_of("hospital", hospital),
        "payload_sha256": _hex_of("payload_sha256", payload_sha256, 32),
        "nonce": _hex_of("nonce", nonce, 16),
        "time": _time_of(timestamp),
    }


def sign_upload(identity_key, session_id: str, params_digest: bytes, payload_sha256: bytes,
                hospital: str, *, nonce: bytes | None = None, timestamp: float | None = None) -> dict:
    """Sign the statement "hospital uploads payload_sha256 to session_id".

    Parameters
    ----------
    identity_key : Ed25519PrivateKey
        The hospital's identity key (``PartyFiles.identity_key()``).
    session_id : str
    params_digest : bytes (32) or hex
        ``SessionParams.digest()``.
    payload_sha256 : bytes (32) or hex
        SHA-256 of the exact payload bytes uploaded (the whole envelope).
    hospital : str
        The enrolled name of the signer.
    nonce : bytes (16), optional
        Fresh random bytes by default (``secrets``); a seam for test vectors.
    timestamp : number, optional
        Unix seconds; ``time.time()`` by default.

    Returns
    -------
    dict
        ``{type, v, session_id, params_digest, hospital, payload_sha256,
        nonce, time, signature}`` (hex strings, int time): send it with the
        payload; the server verifies it with :func:`verify_upload` and keeps
        it for the manifest.
    """
    if nonce is None:
        nonce = secrets.token_bytes(16)
    statement = _upload_statement(session_id, params_digest, payload_sha256, hospital, nonce, timestamp)
    return {**statement, "signature": _sign(identity_key, UPLOAD_PREFIX, statement)}


def verify_upload(upload: Mapping, identity_pub, *, session_id: str | None = None,
                  params_digest: bytes | None = None, payload_sha256: bytes | None = None,
                  hospital: str | None = None, max_age_s: float | None = None,
                  now: float | None = None) -> dict:
    """Verify an upload statement; return it (as a plain dict) if it holds.

    Each keyword given is compared with the statement: another session raises
    :class:`WrongSession`, other parameters :class:`ParameterMismatch`, another
    payload hash or hospital :class:`InvalidSignature` (the signature does not
    cover these bytes / this party). With ``max_age_s``, a statement older than
    that (or more than ``max_age_s`` in the future) raises
    :class:`ReplayedContribution`. Nonce uniqueness is the caller's job (the
    server accepts one upload per hospital per session).
    """
    up = _as_dict("upload", upload)
    _require(up, _UPLOAD_FIELDS + ("signature",), "upload")
    if up["type"] != "upload" or up["v"] != _VERSION:
        raise MalformedPayload("not an upload statement of version 1")
    try:
        statement = _upload_statement(up["session_id"], up["params_digest"], up["payload_sha256"],
                                      up["hospital"], up["nonce"], up["time"])
    except (TypeError, ValueError):
        raise MalformedPayload("upload statement has malformed fields") from None
    if statement != {k: up[k] for k in _UPLOAD_FIELDS}:  # e.g. upper-case hex, float time
        raise MalformedPayload("upload statement is not canonical")
    _verify(identity_pub, UPLOAD_PREFIX, statement, up["signature"])
    if session_id is not None and statement["session_id"] != session_id:
        raise WrongSession("upload is for another session")
    if params_digest is not None and statement["params_digest"] != _hex_of("params_digest", params_digest, 32):
        raise ParameterMismatch("upload was signed for other session parameters")
    if payload_sha256 is not None and statement["payload_sha256"] != _hex_of("payload_sha256", payload_sha256, 32):
        raise InvalidSignature()
    if hospital is not None and statement["hospital"] != hospital:
        raise InvalidSignature()
    if max_age_s is not None:
        t = _time.time() if now is None else now
        if abs(t - statement["time"]) > max_age_s:
            skew = statement["time"] - t
            raise ReplayedContribution(
                f"upload statement is stale or from the future: signed {abs(skew):.0f} s "
                f"{'ahead of' if skew > 0 else 'behind'} the server's clock (at most {max_age_s:.0f} s is "
                "accepted): a replayed upload, or clocks that differ; set both machines' clocks right and retry")
    return {**statement, "signature": up["signature"]}


# --------------------------------------------------------------------------
# receipts (server -> hospital)
# --------------------------------------------------------------------------


def make_receipt(server_key, session_id: str, hospital: str, payload_sha256: bytes, seq: int,
                 time: float | None = None, *, audit_head: str | None = None) -> dict:
    """Server-signed receipt for an accepted upload.

    ``seq`` is the audit-log ``seq`` of the ``upload``/``accepted`` record
    (:meth:`secure_afl.audit_log.AuditLog.append` returns it):
    :func:`secure_afl.audit_verify.verify_log` checks that record exists and names the
    same session, hospital and payload hash. ``time`` defaults to now.

    ``audit_head`` is that record's hash: the receipt then pins the whole log
    prefix up to it, so a log rewritten before ``seq`` no longer matches.

    Returns ``{type, v, session_id, hospital, payload_sha256, seq, time,
    [audit_head,] signature}``.
    """
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise TypeError("seq must be a non-negative int")
    statement = {
        "type": "receipt",
        "v": _VERSION,
        "session_id": _name_of("session_id", session_id),
        "hospital": _name_of("hospital", hospital),
        "payload_sha256": _hex_of("payload_sha256", payload_sha256, 32),
        "seq": seq,
        "time": _time_of(time),
    }
    if audit_head is not None:
        statement["audit_head"] = _hex_of("audit_head", audit_head, 32)
    return {**statement, "signature": _sign(server_key, RECEIPT_PREFIX, statement)}


def verify_receipt(receipt: Mapping, server_pub) -> dict:
    """Verify a receipt's server signature; return the receipt as a plain dict.

    Raises :class:`MalformedPayload` if fields are missing or of the wrong
    kind, :class:`InvalidSignature` if the signature does not verify.
    """
    r = _as_dict("receipt", receipt)
    fields = ("type", "v", "session_id", "hospital", "payload_sha256", "seq", "time")
    if "audit_head" in r:  # covered by the signature when present
        fields += ("audit_head",)
    _require(r, fields + ("signature",), "receipt")
    if r["type"] != "receipt" or r["v"] != _VERSION:
        raise MalformedPayload("not a receipt of version 1")
    if (isinstance(r["seq"], bool) or not isinstance(r["seq"], int)
            or isinstance(r["time"], bool) or not isinstance(r["time"], int)):
        raise MalformedPayload("receipt seq/time must be ints")
    statement = {k: r[k] for k in fields}
    _verify(server_pub, RECEIPT_PREFIX, statement, r["signature"])
    return {**statement, "signature": r["signature"]}


# --------------------------------------------------------------------------
# manifests (server -> key holder, auditor)
# --------------------------------------------------------------------------


def _participant_entry(p: Mapping) -> dict:
    p = _as_dict("participant", p)
    _require(p, _PARTICIPANT_FIELDS, "participant")
    return {k: p[k] for k in _PARTICIPANT_FIELDS}


def _check_participants(entries: list[dict], session_id: str, params_digest: str, enrolled) -> None:
    """Enrolment, distinctness and every upload signature (order matters for the error)."""
    if enrolled is not None:
        enrolled_hex = {}
        for name, pub in dict(enrolled).items():
            enrolled_hex[name] = _pub_hex(pub)
        for e in entries:
            if e["hospital"] not in enrolled_hex:
                raise PolicyViolation(f"participant {str(e['hospital'])[:64]!r} is not in the session's roster",
                                      reason="unknown_identity")
            if e["identity_pub"] != enrolled_hex[e["hospital"]]:
                raise PolicyViolation("a participant's identity key is not the enrolled one",
                                      reason="unknown_identity")
    names = [e["hospital"] for e in entries]
    pubs = [e["identity_pub"] for e in entries]
    if len(set(names)) != len(names) or len(set(pubs)) != len(pubs):
        raise DuplicateContribution("the same identity appears twice among the participants")
    for e in entries:
        upload = {"type": "upload", "v": _VERSION, "session_id": session_id,
                  "params_digest": params_digest, **{k: e[k] for k in _PARTICIPANT_FIELDS if k != "identity_pub"}}
        verify_upload(upload, e["identity_pub"])


def build_manifest(server_key, session_id: str, params_digest: bytes, participants: Iterable[Mapping],
                   aggregate_sha256: bytes, min_clients: int, *, enrolled: Mapping | None = None,
                   timestamp: float | None = None, audit: Mapping | None = None) -> dict:
    """Server-signed list of the contributions summed into one aggregate.

    Parameters
    ----------
    server_key : Ed25519PrivateKey
        The server's identity key.
    session_id, params_digest
        The session the aggregate belongs to.
    participants : iterable of dict
        One per contribution: the dict returned by :func:`sign_upload` plus
        ``identity_pub`` (hex of the raw key, or an Ed25519PublicKey). Only
        ``hospital, payload_sha256, nonce, time, signature, identity_pub`` are
        kept; the upload's session and parameters must be this manifest's.
    aggregate_sha256 : bytes (32) or hex
        SHA-256 of the aggregate payload bytes handed to the key holder.
    min_clients : int
        The release threshold; the manifest is refused below it.
    enrolled : mapping name -> public key, optional
        If given, every participant must be enrolled with that key.
    audit : ``{"seq": int, "head": hex}``, optional
        The audit log's last record when the manifest is signed; an auditor
        holding the manifest can then detect a log cut before that point.

    Returns
    -------
    dict
        ``{type, v, session_id, params_digest, aggregate_sha256, min_clients,
        participants (sorted by hospital), time, signature}``.

    Raises
    ------
    InvalidSignature, WrongSession, ParameterMismatch, DuplicateContribution,
    PolicyViolation, InsufficientContributors
        The server never signs a manifest that :func:`verify_manifest` would
        refuse.
    """
    if isinstance(min_clients, bool) or not isinstance(min_clients, int) or min_clients < 1:
        raise ValueError("min_clients must be an int >= 1")
    session_id = _name_of("session_id", session_id)
    pd = _hex_of("params_digest", params_digest, 32)
    entries = []
    for p in participants:
        p = _as_dict("participant", p)
        if "identity_pub" in p:
            p["identity_pub"] = _pub_hex(p["identity_pub"])
        if p.get("session_id", session_id) != session_id:
            raise WrongSession("a participant's upload is for another session")
        if p.get("params_digest", pd) != pd:
            raise ParameterMismatch("a participant's upload is for other parameters")
        entries.append(_participant_entry(p))
    entries.sort(key=lambda e: e["hospital"])
    _check_participants(entries, session_id, pd, enrolled)
    if len(entries) < min_clients:
        raise InsufficientContributors(
            f"{len(entries)} contributions, fewer than min_clients={min_clients}")
    statement = {
        "type": "manifest",
        "v": _VERSION,
        "session_id": session_id,
        "params_digest": pd,
        "aggregate_sha256": _hex_of("aggregate_sha256", aggregate_sha256, 32),
        "min_clients": min_clients,
        "participants": entries,
        "time": _time_of(timestamp),
    }
    if audit is not None:
        seq = audit.get("seq")
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
            raise ValueError("audit seq must be a non-negative int")
        statement["audit"] = {"seq": seq, "head": _hex_of("audit head", audit.get("head"), 32)}
    return {**statement, "signature": _sign(server_key, MANIFEST_PREFIX, statement)}


def verify_manifest(manifest: Mapping, server_pub, enrolled: Mapping, min_clients: int, *,
                    session_id: str | None = None, params_digest: bytes | None = None,
                    aggregate_sha256: bytes | None = None) -> dict:
    """Check a manifest before acting on its aggregate (key holder, auditor).

    Checks, in order: structure (:class:`MalformedPayload`); the server
    signature (:class:`InvalidSignature`); session, parameters and aggregate
    hash if given (:class:`WrongSession`, :class:`ParameterMismatch`,
    :class:`InvalidSignature`); every participant enrolled under its key
    (:class:`PolicyViolation`, reason ``unknown_identity``); distinct names and
    keys (:class:`DuplicateContribution`); every participant's upload
    signature (:class:`InvalidSignature`); at least ``min_clients``
    participants, where ``min_clients`` is the verifier's own policy, not the
    manifest's (:class:`InsufficientContributors`).

    Returns the manifest as a plain dict.
    """
    if isinstance(min_clients, bool) or not isinstance(min_clients, int) or min_clients < 1:
        raise ValueError("min_clients must be an int >= 1")
    m = _as_dict("manifest", manifest)
    fields = ("type", "v", "session_id", "params_digest", "aggregate_sha256", "min_clients",
              "participants", "time")
    if "audit" in m:  # covered by the signature when present
        fields += ("audit",)
    _require(m, fields + ("signature",), "manifest")
    if m["type"] != "manifest" or m["v"] != _VERSION:
        raise MalformedPayload("not a manifest of version 1")
    if not isinstance(m["participants"], list):
        raise MalformedPayload("manifest participants must be a list")
    statement = {k: m[k] for k in fields}
    _verify(server_pub, MANIFEST_PREFIX, statement, m["signature"])

    if session_id is not None and m["session_id"] != session_id:
        raise WrongSession("manifest is for another session")
    if params_digest is not None and m["params_digest"] != _hex_of("params_digest", params_digest, 32):
        raise ParameterMismatch("manifest is for other session parameters")
    if aggregate_sha256 is not None and m["aggregate_sha256"] != _hex_of("aggregate_sha256", aggregate_sha256, 32):
        raise InvalidSignature()
    entries = [_participant_entry(p) for p in m["participants"]]
    _check_participants(entries, m["session_id"], m["params_digest"], enrolled)
    if len(entries) < min_clients:
        raise InsufficientContributors(
            f"{len(entries)} contributions, fewer than min_clients={min_clients}")
    return {**statement, "signature": m["signature"]}


# -- a hospital's signed statement over a sealed box sent with one upload (ckks tag, split seed) -------
def box_statement(kind: str, version: int, params, hospital: str, payload_sha256: str, box: bytes,
                  **extra) -> dict:
    """The fields a hospital signs over a box it seals for the key holder: bound to the session, its
    parameters, the hospital and the payload's SHA-256, so the box cannot be moved to another upload."""
    return {"type": kind, "v": version, "session_id": params.session_id, "params_digest": params.digest().hex(),
            "hospital": hospital, "payload_sha256": payload_sha256, "box": box.hex(), **extra}


def sign_box_statement(identity_key, prefix: bytes, statement: Mapping) -> dict:
    """The statement with the hospital's signature over ``prefix || canonical JSON``."""
    return {**statement, "signature": _sign(identity_key, prefix, statement)}


def verify_box_statement(statement: Mapping, identity_pub, prefix: bytes, expected, box_len: int,
                         what: str) -> bytes:
    """The box of a statement that is exactly ``expected(box)`` (every field, the box of ``box_len`` bytes)
    under the hospital's signature: :class:`MalformedPayload` naming ``what``, or a detail-free
    :class:`InvalidSignature`."""
    try:
        box = bytes.fromhex(statement["box"])
    except (KeyError, TypeError, ValueError):
        raise MalformedPayload(f"{what} lacks a hex box") from None
    st = expected(box)
    if {k: statement.get(k) for k in st} != st or len(box) != box_len:
        raise MalformedPayload(f"{what} does not match this session, hospital and payload")
    _verify(identity_pub, prefix, st, statement.get("signature"))
    return box
