"""Append-only, hash-chained audit log (JSON Lines): its format, the server's writer and the signed head.

Who runs this: the aggregation server writes it (:class:`AuditLog`), one
record per decision (upload accepted / refused, round closed, aggregate
released, ...), and signs its close record; the key holder countersigns it.
An auditor checks the log with :mod:`secure_afl.audit_verify`
(``secure-afl audit verify LOG --pki DIR --head HEAD [--receipts DIR] [--session ID]``).

What pins the log
-----------------
A hash chain and the server's per-record signatures stop anyone but the
server from editing the log; they do not stop the server (it holds its key)
from cutting the tail or rebuilding the chain. So the verifier always checks
the log against an *expected head* (record ``seq`` with hash ``head``) that
someone else holds: each receipt carries its record's seq and hash; the
manifest carries the head when the aggregate was fixed; at release the
server signs a close record (seq and hash of the ``release`` record, the
participants), which the key holder countersigns at finalize
(:func:`countersign_head`). A release record must name every hospital
holding a receipt from before it.

Record format
-------------
One JSON object per line::

    {"seq": 0, "time": "2026-01-01T00:00:00.000000Z", "event": "upload",
     "actor": "hosp-a", "session": "s1", "outcome": "accepted",
     "reason": null, "details": {"payload_sha256": "..."},
     "prev_hash": "00..00", "hash": "...", "sig": "..."}

The chain is::

    hash_i = SHA-256(b"secure-afl/audit/v1\\0" || bytes(prev_hash_i) || canonical_json(body_i))
    prev_hash_0 = 32 zero bytes,  prev_hash_i = hash_{i-1},  seq_i = i

where ``body_i`` is the record without ``hash`` and ``sig`` (it includes
``prev_hash`` and ``seq``). With a signing key, ``sig`` is the server's
Ed25519 signature over ``b"secure-afl/audit-record/v1\\0" || bytes(hash_i)``.

Conventions the verifier relies on: an accepted upload is written as
``event="upload", outcome="accepted", actor=<hospital>, session=<session id>,
details={"payload_sha256": <hex>, ...}`` and the receipt for it carries that
record's ``seq`` (:func:`secure_afl.signing.make_receipt`).

Durability
----------
Each record is one ``write`` of the full line followed by ``fsync``; the
caller acknowledges the event (e.g. returns a receipt) only after
:meth:`AuditLog.append` returns, so a SIGKILL cannot lose an acknowledged
event. A crash mid-write leaves a *torn* last line (no trailing newline):
:func:`verify_log` reports it as broken, and reopening the writer moves the
torn bytes to ``LOG.torn-<n>``, truncates them and appends a ``log_recovered``
record, so the chain continues from the last good record. Any other damage
(a record whose hash, seq or link is wrong) makes the writer refuse to open.

Notes
-----
A hash chain alone lets whoever can rewrite the whole file recompute it;
per-record server signatures pin the server to what it wrote, and receipts
held by hospitals pin the accepted uploads: a deleted or altered accepted
upload is then detected even if the chain was rebuilt.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import threading
import time as _time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from . import domains, pki
from secure_afl._io import fsync_dir, write_all, write_file
from secure_afl.exceptions import AuditChainBroken, InvalidSignature, MalformedPayload, StateInUse
from secure_afl.encoding import canonical_json, parse_json

try:  # POSIX: one writer per log file
    import fcntl as _fcntl
except ImportError:  # pragma: no cover
    _fcntl = None

__all__ = [
    "CHAIN_PREFIX",
    "RECORD_SIG_PREFIX",
    "GENESIS_HASH",
    "OUTCOMES",
    "AuditLog",
    "record_hash",
    "check_record",
    "split_lines",
    "public_key",
    "make_close_record",
    "verify_close_record",
    "countersign_head",
    "verify_countersign",
]

CHAIN_PREFIX = domains.AUDIT_CHAIN
RECORD_SIG_PREFIX = domains.AUDIT_RECORD
GENESIS_HASH = "00" * 32
OUTCOMES = ("accepted", "refused")
_BODY_FIELDS = ("seq", "time", "event", "actor", "session", "outcome", "reason", "details", "prev_hash")


def record_hash(body: Mapping) -> str:
    """``SHA-256(CHAIN_PREFIX || prev_hash || canonical_json(body))`` as hex."""
    prev = bytes.fromhex(body["prev_hash"])
    return hashlib.sha256(CHAIN_PREFIX + prev + canonical_json(dict(body))).hexdigest()


def iso_time(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def check_record(line: bytes, index: int, prev_hash: str, server_pub=None) -> dict:
    """Parse and check one line against the chain; AuditChainBroken(index) otherwise."""
    def broken(why: str, reason: str = "audit_chain_broken"):
        return AuditChainBroken(f"record {index}: {why}", index=index, reason=reason)

    try:
        rec = parse_json(line, "audit record")
    except MalformedPayload:
        raise broken("not valid JSON (or a duplicated key, or nested too deep)", "malformed") from None
    if not isinstance(rec, dict):
        raise broken("not a JSON object", "malformed")
    try:
        canonical = canonical_json(rec)
    except (TypeError, ValueError):
        raise broken("not canonical JSON", "not_canonical") from None
    if canonical != line:
        # one byte string per record: a line that parses the same but reads differently elsewhere
        # (spacing, key order, escapes) is not what the writer wrote
        raise broken("not the canonical encoding of its content", "not_canonical")
    allowed = set(_BODY_FIELDS) | {"hash", "sig"}
    if set(rec) - allowed or any(f not in rec for f in _BODY_FIELDS + ("hash",)):
        raise broken("unexpected or missing fields", "malformed")
    if rec["seq"] != index or isinstance(rec["seq"], bool):
        raise broken(f"seq {rec['seq']!r} where {index} was expected", "seq_mismatch")
    if rec["prev_hash"] != prev_hash:
        raise broken("prev_hash does not link to the previous record", "link_mismatch")
    if rec["outcome"] not in OUTCOMES:
        raise broken("outcome is neither accepted nor refused", "malformed")
    body = {k: rec[k] for k in _BODY_FIELDS}
    try:
        h = record_hash(body)
    except (ValueError, TypeError):
        raise broken("prev_hash is not hex", "malformed") from None
    if rec["hash"] != h:
        raise broken("hash does not match the record's content", "hash_mismatch")
    if server_pub is not None:
        from cryptography.exceptions import InvalidSignature as _CryptoInvalidSignature

        sig = rec.get("sig")
        try:
            if not isinstance(sig, str):
                raise ValueError
            server_pub.verify(bytes.fromhex(sig), RECORD_SIG_PREFIX + bytes.fromhex(h))
        except (ValueError, _CryptoInvalidSignature):
            raise broken("server signature missing or invalid", "bad_record_signature") from None
    return rec


def split_lines(data: bytes) -> tuple[list[bytes], bytes]:
    """Complete lines (without the newline) and the torn tail (b"" if none)."""
    if not data:
        return [], b""
    parts = data.split(b"\n")
    return parts[:-1], parts[-1]


# --------------------------------------------------------------------------
# writer
# --------------------------------------------------------------------------


class AuditLog:
    """Durable, hash-chained append-only writer.

    Parameters
    ----------
    path : path-like
        The JSON Lines file; created (mode 0600) if absent.
    signing_key : Ed25519PrivateKey, optional
        The server's identity key; signs every record's hash.
    clock : callable, optional
        Returns Unix seconds; ``time.time`` by default (a seam for tests).
    on_record : callable, optional
        Called with every record, each existing one as the chain is checked at opening and each one appended
        (under the writer's lock, so in log order): a reader that keeps a summary of the log pays for each
        record once, never a re-read per question.

    Opening reads and checks the whole existing chain (O(n)); a torn last line
    is quarantined and logged as ``log_recovered``; any other damage raises
    :class:`AuditChainBroken` and nothing is written. The file is locked
    (``flock``) so a second writer on the same file fails fast. Thread-safe.
    """

    def __init__(self, path, *, signing_key=None, clock: Callable[[], float] | None = None,
                 on_record: Callable[[dict], None] | None = None):
        self.path = Path(path)
        self._key = signing_key
        self._on_record = on_record
        self._clock = clock or _time.time
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._open()

    # -- lifecycle ---------------------------------------------------------

    def _open(self) -> None:
        created = not self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            if _fcntl is not None:
                try:
                    _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
                except BlockingIOError:
                    raise StateInUse(f"{self.path} is already open by another writer (a second server on the "
                                     "same state?); nothing was written") from None
            if created:
                fsync_dir(self.path.parent)
            with open(fd, "rb", closefd=False) as fh:
                fh.seek(0)
                data = fh.read()
            lines, torn = split_lines(data)
            prev = GENESIS_HASH
            for i, line in enumerate(lines):
                rec = check_record(line, i, prev)
                prev = rec["hash"]
                if self._on_record is not None:
                    self._on_record(rec)
            self._seq, self._head, self._fd = len(lines), prev, fd
            if torn:
                self._recover(torn, len(data) - len(torn))
        except BaseException:
            if self._fd is None:
                os.close(fd)
            raise

    def _recover(self, torn: bytes, good_len: int) -> None:
        n = 0
        while (side := self.path.with_name(f"{self.path.name}.torn-{n}")).exists():
            n += 1
        write_file(side, torn)
        os.ftruncate(self._fd, good_len)
        os.fsync(self._fd)
        self.append("log_recovered", actor="audit", outcome="accepted",
                    reason="torn_last_line",
                    details={"torn_bytes": len(torn), "torn_sha256": hashlib.sha256(torn).hexdigest(),
                             "quarantined_to": side.name})

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)  # releases the flock
                self._fd = None

    def __enter__(self) -> "AuditLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- state ---------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        """The seq the next record will get (= number of records)."""
        return self._seq

    @property
    def head(self) -> str:
        """Hash of the last record (``GENESIS_HASH`` when empty)."""
        return self._head

    def find(self, event: str, actor: str | None, **details) -> dict | None:
        """The first ``accepted`` record of ``event`` by ``actor`` whose details include ``details``.

        For crash recovery: a record already written must not be written again.
        """
        with self._lock:
            with open(self.path, "rb") as fh:
                for line in fh:
                    rec = json.loads(line)
                    d = rec.get("details") or {}
                    if rec["event"] == event and actor in (None, rec["actor"]) and rec["outcome"] == "accepted" \
                            and all(d.get(k) == v for k, v in details.items()):
                        return rec
        return None

    # -- writing ---------------------------------------------------------------

    def append(self, event: str, *, actor: str, outcome: str, session: str | None = None,
               reason: str | None = None, details: Mapping[str, Any] | None = None) -> dict:
        """Append one record durably (write + fsync) and return it.

        ``outcome`` is ``"accepted"`` or ``"refused"``; ``details`` must be
        JSON-serialisable (finite floats only). The returned record's ``seq``
        is what a receipt for an accepted upload carries.
        """
        if not isinstance(event, str) or not event:
            raise TypeError("event must be a non-empty str")
        if not isinstance(actor, str) or not actor:
            raise TypeError("actor must be a non-empty str")
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}; got {outcome!r}")
        if session is not None and not isinstance(session, str):
            raise TypeError("session must be a str or None")
        if reason is not None and not isinstance(reason, str):
            raise TypeError("reason must be a str or None")
        details = dict(details or {})
        canonical_json(details)  # fail before taking the lock on unserialisable details
        with self._lock:
            if self._fd is None:
                raise ValueError("audit log is closed")
            body = {
                "seq": self._seq,
                "time": iso_time(self._clock()),
                "event": event,
                "actor": actor,
                "session": session,
                "outcome": outcome,
                "reason": reason,
                "details": details,
                "prev_hash": self._head,
            }
            rec = {**body, "hash": record_hash(body)}
            if self._key is not None:
                rec["sig"] = self._key.sign(RECORD_SIG_PREFIX + bytes.fromhex(rec["hash"])).hex()
            write_all(self._fd, canonical_json(rec) + b"\n")
            os.fsync(self._fd)
            self._seq += 1
            self._head = rec["hash"]
            if self._on_record is not None:
                self._on_record(rec)
            return rec


# --------------------------------------------------------------------------
# the signed head: session-close record and the key holder's countersignature
# --------------------------------------------------------------------------

CLOSE_PREFIX = domains.AUDIT_CLOSE
COUNTERSIGN_PREFIX = domains.AUDIT_COUNTERSIGN
_CLOSE_FIELDS = ("type", "v", "session_id", "seq", "head", "participants", "time")
_COUNTERSIGN_FIELDS = ("type", "v", "session_id", "seq", "head", "participants", "keyholder", "close_signature")


def public_key(server_pub):
    """An Ed25519 public key from a key, its 32 raw bytes, or a PEM file / text (:func:`pki.load_identity_pub`)."""
    if server_pub is None:
        raise TypeError("a public key is required")
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if isinstance(server_pub, Ed25519PublicKey):
        return server_pub
    if isinstance(server_pub, (bytes, bytearray)) and len(server_pub) == 32:
        return Ed25519PublicKey.from_public_bytes(bytes(server_pub))
    return pki.load_identity_pub(server_pub)


def _sign_statement(key, prefix: bytes, statement: dict) -> dict:
    return {**statement, "signature": key.sign(prefix + canonical_json(statement)).hex()}


def _verified_statement(obj, fields, kind: str, prefix: bytes, pub) -> dict:
    from cryptography.exceptions import InvalidSignature as _CryptoInvalidSignature

    if not isinstance(obj, Mapping) or any(f not in obj for f in fields + ("signature",)) \
            or obj.get("type") != kind or obj.get("v") != 1:
        raise MalformedPayload(f"not a {kind} statement")
    statement = {f: obj[f] for f in fields}
    try:
        pub.verify(bytes.fromhex(obj["signature"]), prefix + canonical_json(statement))
    except (ValueError, TypeError, _CryptoInvalidSignature):
        raise InvalidSignature() from None
    seq = statement["seq"]
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0 or not isinstance(statement["head"], str):
        raise MalformedPayload(f"{kind}: seq/head malformed")
    if not isinstance(statement["participants"], list) or \
            not all(isinstance(p, str) for p in statement["participants"]):
        raise MalformedPayload(f"{kind}: participants must be a list of names")
    return {**statement, "signature": obj["signature"]}


def make_close_record(server_key, session_id: str, seq: int, head: str, participants: Iterable[str],
                      timestamp: float | None = None) -> dict:
    """The server's signed statement that the session closed at log record ``seq`` with hash ``head``.

    ``participants`` are the hospitals whose uploads the release summed.
    """
    statement = {"type": "audit_close", "v": 1, "session_id": session_id, "seq": int(seq), "head": head,
                 "participants": sorted(participants),
                 "time": int(_time.time() if timestamp is None else timestamp)}
    return _sign_statement(server_key, CLOSE_PREFIX, statement)


def verify_close_record(record, server_pub) -> dict:
    """The close record if the server's signature holds; InvalidSignature / MalformedPayload otherwise."""
    return _verified_statement(record, _CLOSE_FIELDS, "audit_close", CLOSE_PREFIX, public_key(server_pub))


def countersign_head(keyholder_key, keyholder: str, close_record, server_pub, manifest: Mapping | None = None) -> dict:
    """The key holder's countersignature over the server's close record (at finalize).

    Refuses (:class:`InvalidSignature`, :class:`MalformedPayload`) a record the
    server did not sign, and, given the manifest, one whose participants are
    not the manifest's: the key holder vouches only for a head that describes
    the release it is about to decrypt.
    """
    rec = verify_close_record(close_record, server_pub)
    if manifest is not None:
        named = sorted(p.get("hospital") for p in manifest.get("participants", []))
        if named != rec["participants"] or manifest.get("session_id") != rec["session_id"]:
            raise MalformedPayload("the audit close record does not describe the manifest's release")
    statement = {"type": "audit_countersign", "v": 1, "session_id": rec["session_id"], "seq": rec["seq"],
                 "head": rec["head"], "participants": rec["participants"], "keyholder": keyholder,
                 "close_signature": rec["signature"]}
    return _sign_statement(keyholder_key, COUNTERSIGN_PREFIX, statement)


def verify_countersign(countersign, keyholder_pub, close_record) -> dict:
    """The countersignature if the key holder signed exactly this close record."""
    cs = _verified_statement(countersign, _COUNTERSIGN_FIELDS, "audit_countersign", COUNTERSIGN_PREFIX,
                             public_key(keyholder_pub))
    if not isinstance(close_record, Mapping) or any(
            cs[f] != close_record.get(f) for f in ("session_id", "seq", "head", "participants")) \
            or cs["close_signature"] != close_record.get("signature"):
        raise InvalidSignature()
    return cs


# --------------------------------------------------------------------------
# verifier
# --------------------------------------------------------------------------
