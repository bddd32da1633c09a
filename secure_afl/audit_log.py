"""Append-only, hash-chained audit log (JSON Lines) and its verifier.

Who runs this: the aggregation server writes it (:class:`AuditLog`), one
record per decision (upload accepted / refused, round closed, aggregate
released, ...); an auditor checks it with :func:`verify_log` or
``secure-afl audit verify LOG --pki DIR --head HEAD [--receipts DIR] [--session ID]``.

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

import argparse
import datetime as _dt
import hashlib
import json
import os
import threading
import time as _time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from . import domains, pki
from secure_afl._io import fsync_dir, write_all, write_file
from secure_afl.exceptions import (
    AuditChainBroken,
    InvalidInputError,
    InvalidSignature,
    MalformedPayload,
    SecureAFLError,
)
from secure_afl.signing import verify_receipt
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
    "AuditVerification",
    "record_hash",
    "check_chain",
    "expected_head",
    "make_close_record",
    "verify_close_record",
    "countersign_head",
    "verify_countersign",
    "verify_log",
    "load_receipts",
    "register",
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


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _check_record(line: bytes, index: int, prev_hash: str, server_pub=None) -> dict:
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


def _split_lines(data: bytes) -> tuple[list[bytes], bytes]:
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

    Opening reads and checks the whole existing chain (O(n)); a torn last line
    is quarantined and logged as ``log_recovered``; any other damage raises
    :class:`AuditChainBroken` and nothing is written. The file is locked
    (``flock``) so a second writer on the same file fails fast. Thread-safe.
    """

    def __init__(self, path, *, signing_key=None, clock: Callable[[], float] | None = None):
        self.path = Path(path)
        self._key = signing_key
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
                    raise RuntimeError(f"{self.path} is already open by another AuditLog writer") from None
            if created:
                fsync_dir(self.path.parent)
            with open(fd, "rb", closefd=False) as fh:
                fh.seek(0)
                data = fh.read()
            lines, torn = _split_lines(data)
            prev = GENESIS_HASH
            for i, line in enumerate(lines):
                prev = _check_record(line, i, prev)["hash"]
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
                "time": _iso(self._clock()),
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
            return rec


# --------------------------------------------------------------------------
# the signed head: session-close record and the key holder's countersignature
# --------------------------------------------------------------------------

CLOSE_PREFIX = domains.AUDIT_CLOSE
COUNTERSIGN_PREFIX = domains.AUDIT_COUNTERSIGN
_CLOSE_FIELDS = ("type", "v", "session_id", "seq", "head", "participants", "time")
_COUNTERSIGN_FIELDS = ("type", "v", "session_id", "seq", "head", "participants", "keyholder", "close_signature")


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
    return _verified_statement(record, _CLOSE_FIELDS, "audit_close", CLOSE_PREFIX, _server_pub(server_pub))


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
                             _server_pub(keyholder_pub))
    if not isinstance(close_record, Mapping) or any(
            cs[f] != close_record.get(f) for f in ("session_id", "seq", "head", "participants")) \
            or cs["close_signature"] != close_record.get("signature"):
        raise InvalidSignature()
    return cs


# --------------------------------------------------------------------------
# verifier
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditVerification:
    """Result of :func:`verify_log` on a log that verified."""

    n_records: int
    n_accepted: int
    n_refused: int
    n_receipts: int
    head_seq: int
    head_hash: str
    countersigned_by: str | None = None
    sessions: tuple[str, ...] = ()
    #: receipts handed in that belong to other sessions: set aside, not checked
    n_other_receipts: int = 0

    def summary(self) -> str:
        cs = f", countersigned by {self.countersigned_by}" if self.countersigned_by else ""
        other = (f" ({self.n_other_receipts} of other sessions set aside)" if self.n_other_receipts else "")
        which = f"session {', '.join(self.sessions)}: " if self.sessions else ""
        return (f"OK: {which}{self.n_records} records ({self.n_accepted} accepted, {self.n_refused} refused), "
                f"server signatures verified, {self.n_receipts} receipts matched{other}; "
                f"expected head {self.head_seq}:{self.head_hash} present{cs}")


def _server_pub(server_pub):
    if server_pub is None:
        raise TypeError("a public key is required")
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if isinstance(server_pub, Ed25519PublicKey):
        return server_pub
    from secure_afl.pki import load_identity_pub

    if isinstance(server_pub, (bytes, bytearray)) and len(server_pub) == 32:
        return Ed25519PublicKey.from_public_bytes(bytes(server_pub))
    return load_identity_pub(server_pub)


def _read_chain(path, pub) -> list[dict]:
    data = Path(path).read_bytes()
    lines, torn = _split_lines(data)
    prev = GENESIS_HASH
    records = []
    for i, line in enumerate(lines):
        rec = _check_record(line, i, prev, pub)
        records.append(rec)
        prev = rec["hash"]
    if torn:
        raise AuditChainBroken(f"record {len(lines)}: torn last line (no newline; crash mid-write?)",
                               index=len(lines), reason="torn_record")
    return records


@dataclass(frozen=True)
class ChainShape:
    """What :func:`check_chain` found: counts and the last record's hash."""

    n_records: int
    n_accepted: int
    head_hash: str


def check_chain(path) -> ChainShape:
    """Structure only: every line links, hashes and is canonical.

    Not an audit verdict (no signature, no expected head): a writer with the
    file can rebuild any chain. :func:`verify_log` is the auditor's check.
    """
    records = _read_chain(path, None)
    return ChainShape(len(records), sum(r["outcome"] == "accepted" for r in records),
                      records[-1]["hash"] if records else GENESIS_HASH)


def expected_head(obj, server_pub) -> tuple[int, str, dict | None]:
    """``(seq, head, close record or None)`` from what an auditor holds.

    ``obj`` is a ``"SEQ:HEX"`` string, a server-signed receipt (``seq`` and
    ``audit_head``), a manifest (``audit``), a close record, or the server's
    ``{"close": ..., "countersign": ...}`` bundle. Signed objects are verified
    with ``server_pub``.
    """
    pub = _server_pub(server_pub)
    if isinstance(obj, str):
        seq_s, _, head = obj.partition(":")
        try:
            seq = int(seq_s)
            if seq < 0 or len(bytes.fromhex(head)) != 32:
                raise ValueError
        except ValueError:
            raise MalformedPayload("an explicit head is SEQ:HEX (64 hex digits)") from None
        return seq, head.lower(), None
    if not isinstance(obj, Mapping):
        raise MalformedPayload("no audit head in this object")
    if "close" in obj:
        obj = obj["close"]
    kind = obj.get("type")
    if kind == "audit_close":
        rec = verify_close_record(obj, pub)
        return rec["seq"], rec["head"], rec
    if kind == "receipt" and "audit_head" in obj:
        r = verify_receipt(obj, pub)
        return r["seq"], r["audit_head"], None
    if kind == "manifest" and isinstance(obj.get("audit"), Mapping):
        from secure_afl.signing import MANIFEST_PREFIX

        fields = [k for k in obj if k != "signature"]
        from cryptography.exceptions import InvalidSignature as _CryptoInvalidSignature

        try:
            pub.verify(bytes.fromhex(obj["signature"]), MANIFEST_PREFIX + canonical_json({k: obj[k] for k in fields}))
        except (KeyError, ValueError, TypeError, _CryptoInvalidSignature):
            raise InvalidSignature() from None
        return expected_head(f"{obj['audit'].get('seq')}:{obj['audit'].get('head')}", pub)
    raise MalformedPayload("no audit head in this object (receipt, manifest, close record or SEQ:HEX)")


def verify_log(path, *, server_pub, head, receipts: Iterable[Mapping] = (), countersign=None,
               keyholder_pub=None, session: str | None = None) -> AuditVerification:
    """Verify ``path`` as the server's log up to an expected head, and receipts against it.

    Parameters
    ----------
    path : path-like
        The JSON Lines audit log.
    server_pub : Ed25519PublicKey, PEM path/str or raw bytes
        The server's identity key, from the consortium PKI. Every record and
        every receipt must carry its valid signature.
    head : str or dict
        What pins the log's extent (:func:`expected_head`): the record at that
        seq must exist and have that hash, so a cut tail, a re-appended tail
        or a rewritten prefix fails.
    receipts : iterable of dict
        Receipts from :func:`secure_afl.signing.make_receipt`. Each must
        point (by ``seq``, and by ``audit_head``) to an ``upload``/``accepted``
        record of the same session, hospital and payload hash, and a release
        recorded after it must name that hospital among its participants.
        A receipt naming a session this log does not record (a hospital's
        folder of receipts from several sessions) is set aside, not checked,
        and counted in ``n_other_receipts``.
    countersign, keyholder_pub
        With a close-record head, the key holder's countersignature and key;
        required for such a head, since the close record alone is the
        server's own word.
    session : str, optional
        The session the auditor means. The log must record it (else
        :class:`~secure_afl.exceptions.InvalidInputError`: a log of another
        session passes its own checks, so only this pins which one was
        verified), and only its receipts are checked. Default: the sessions
        the log records, named in the result.

    Raises
    ------
    AuditChainBroken
        ``index`` names the first broken record (0-based line = expected seq);
        ``reason`` says what broke (``truncated``, ``head_mismatch``,
        ``not_canonical``, ``receipt_*``, ...).
    """
    pub = _server_pub(server_pub)
    records = _read_chain(path, pub)
    try:
        seq, head_hash, close = expected_head(head, pub)
    except InvalidSignature:
        raise AuditChainBroken("the expected head's server signature does not verify",
                               reason="head_bad_signature") from None
    except MalformedPayload as e:
        raise AuditChainBroken(f"expected head unusable: {e}", reason="head_malformed") from None
    if seq >= len(records):
        raise AuditChainBroken(f"the log ends at record {len(records) - 1} but the expected head is record "
                               f"{seq}: its tail was cut", index=len(records), reason="truncated")
    if records[seq]["hash"] != head_hash:
        raise AuditChainBroken(f"record {seq} is not the expected head {head_hash}: the log was rewritten",
                               index=seq, reason="head_mismatch")
    countersigned_by = None
    if close is not None:
        rel = records[seq]
        named = (rel.get("details") or {}).get("participants") if isinstance(rel.get("details"), dict) else None
        if not (rel["event"] == "release" and rel["outcome"] == "accepted" and rel["session"] == close["session_id"]
                and named == close["participants"]):
            raise AuditChainBroken(f"record {seq} is not the release the close record describes",
                                   index=seq, reason="head_mismatch")
        if countersign is None or keyholder_pub is None:
            raise AuditChainBroken("a close-record head needs the key holder's countersignature",
                                   reason="head_not_countersigned")
        try:
            cs = verify_countersign(countersign, keyholder_pub, close)
        except (InvalidSignature, MalformedPayload):
            raise AuditChainBroken("the key holder's countersignature does not cover this close record",
                                   reason="head_bad_countersign") from None
        countersigned_by = cs["keyholder"]

    logged = sorted({r["session"] for r in records if isinstance(r.get("session"), str)})
    if session is not None and session not in logged:
        raise InvalidInputError(f"{path} is the audit log of session {', '.join(logged) or '(none)'}, "
                                f"not of session {session}")
    wanted = {session} if session is not None else set(logged)
    n_receipts = n_other = 0
    for j, receipt in enumerate(receipts):
        named = receipt.get("session_id") if isinstance(receipt, Mapping) else None
        if isinstance(named, str) and named not in wanted:
            n_other += 1  # another session's receipt: this log says nothing about it
            continue
        _check_receipt(receipt, j, records, pub)
        n_receipts += 1
    n_acc = sum(r["outcome"] == "accepted" for r in records)
    return AuditVerification(n_records=len(records), n_accepted=n_acc, n_refused=len(records) - n_acc,
                             n_receipts=n_receipts, head_seq=seq, head_hash=head_hash,
                             countersigned_by=countersigned_by, sessions=tuple(sorted(wanted)),
                             n_other_receipts=n_other)


def _check_receipt(receipt, j: int, records: list[dict], pub) -> None:
    label = f"receipt {j}"
    if isinstance(receipt, Mapping) and "_source" in receipt:
        label += f" ({receipt['_source']})"
        receipt = {k: v for k, v in receipt.items() if k != "_source"}
    try:
        r = verify_receipt(receipt, pub)
        r["audit_head"]
    except InvalidSignature:
        raise AuditChainBroken(f"{label}: server signature does not verify",
                               reason="receipt_bad_signature") from None
    except (MalformedPayload, KeyError, TypeError, ValueError):
        raise AuditChainBroken(f"{label}: malformed receipt (or one without its audit head)",
                               reason="receipt_malformed") from None
    seq = r["seq"]
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < len(records):
        raise AuditChainBroken(f"{label}: seq {seq!r} has no record in the log",
                               reason="receipt_unmatched")
    rec = records[seq]
    details = rec["details"] if isinstance(rec["details"], dict) else {}
    if not (rec["event"] == "upload" and rec["outcome"] == "accepted"
            and rec["session"] == r["session_id"] and rec["actor"] == r["hospital"]
            and details.get("payload_sha256") == r["payload_sha256"]):
        raise AuditChainBroken(
            f"{label}: record {seq} is not the accepted upload of {r['hospital']!r} "
            f"with payload {r['payload_sha256']}", index=seq, reason="receipt_unmatched")
    if rec["hash"] != r["audit_head"]:
        raise AuditChainBroken(f"{label}: record {seq} is not the record the receipt was issued for "
                               "(the log before it was rewritten)", index=seq, reason="receipt_unmatched")
    for later in records[seq + 1:]:
        if later["event"] == "release" and later["outcome"] == "accepted" and later["session"] == r["session_id"]:
            named = later["details"].get("participants") if isinstance(later["details"], dict) else None
            if not isinstance(named, list) or r["hospital"] not in named:
                raise AuditChainBroken(f"{label}: the release at record {later['seq']} leaves out "
                                       f"{r['hospital']!r}, whose upload was accepted before it",
                                       index=later["seq"], reason="receipt_not_released")


def load_receipts(directory) -> list[dict]:
    """Every receipt in ``directory/*.json``, or in ``directory`` itself when it is one file (a file holds
    one receipt or a list). A path that does not exist is :class:`InvalidInputError`: asked-for receipts
    that silently are not there would make the check vacuous."""
    where = Path(directory)
    if where.is_file():
        files = [where]
    elif where.is_dir():
        files = sorted(where.glob("*.json"))
    else:
        raise InvalidInputError(f"receipts {where}: no such file or directory")
    out: list[dict] = []
    for f in files:
        try:
            obj = json.loads(f.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise AuditChainBroken(f"{f.name}: not JSON", reason="receipt_malformed") from None
        items = obj if isinstance(obj, list) else [obj]
        for k, item in enumerate(items):
            if not isinstance(item, dict):
                raise AuditChainBroken(f"{f.name}: not a receipt object", reason="receipt_malformed")
            out.append({**item, "_source": f.name if len(items) == 1 else f"{f.name}[{k}]"})
    return out


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def _cmd_verify(args) -> int:
    # a broken chain prints BROKEN and ends with its exit code; anything else (no such file, a head
    # that is not JSON, a party missing from the PKI) is one line from secure_afl.cli with its exit code
    try:
        server_pub = pki.pinned_identity(args.pki, "server", args.server)
        head = args.head
        countersign = keyholder_pub = None
        if ":" not in head or Path(head).exists():
            bundle = parse_json(Path(head).read_bytes(), f"head file {head}")
            head = bundle
            if isinstance(bundle, dict) and "countersign" in bundle:
                countersign = bundle["countersign"]
                if isinstance(countersign, dict):
                    keyholder_pub = pki.pinned_identity(args.pki, "keyholder", countersign.get("keyholder"))
        receipts = load_receipts(args.receipts) if args.receipts else []
        result = verify_log(args.log, server_pub=server_pub, head=head, receipts=receipts,
                            countersign=countersign, keyholder_pub=keyholder_pub, session=args.session)
    except AuditChainBroken as exc:
        where = f" (record index {exc.index})" if exc.index is not None else ""
        print(f"BROKEN{where}: {exc} [{exc.reason}]")
        # a detail reason such as "malformed" names another class in the registry; BROKEN is always
        # a failed security check
        return AuditChainBroken.exit_code
    except (ValueError, TypeError) as exc:
        if isinstance(exc, SecureAFLError):
            raise
        raise MalformedPayload(str(exc)) from None
    if args.receipts and result.n_receipts == 0:
        # receipts were asked for: a check of none of them is no check (wrong folder, other sessions only)
        others = sorted({r.get("session_id") for r in receipts if isinstance(r.get("session_id"), str)})
        found = (f"{len(receipts)} receipts, of session {', '.join(others)}" if others else
                 f"{len(receipts)} receipts")
        raise InvalidInputError(f"no receipt of session {', '.join(result.sessions) or '(none)'} in "
                                f"{args.receipts} ({found}): pass the folder `client submit --receipts` wrote")
    print(result.summary())
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="audit_command", metavar="ACTION", required=True)
    p = sub.add_parser("verify", help="verify an audit log up to its expected head, and receipts against it")
    p.add_argument("log", help="audit log (JSON Lines)")
    p.add_argument("--pki", required=True,
                   help="consortium PKI directory or a party's PKI bundle (pins the server's and key holder's keys)")
    p.add_argument("--server", default=None, help="server name in the PKI (default: the only one)")
    p.add_argument("--head", required=True,
                   help="the expected head: audit-head.json (close record + key holder countersignature), "
                        "a receipt or manifest JSON file, or SEQ:HEX")
    p.add_argument("--receipts", default=None,
                   help="directory of receipt *.json files, or one receipt file; receipts of other sessions "
                        "are set aside, and at least one of this session's must be there")
    p.add_argument("--session", default=None,
                   help="the session you mean: the log must be its log (default: the session the log records, "
                        "named in the OK line)")
    p.set_defaults(func=_cmd_verify)
