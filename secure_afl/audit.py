"""Append-only, hash-chained audit log (JSON Lines) and its verifier.

Who runs this: the aggregation server writes it (:class:`AuditLog`), one
record per decision (upload accepted / refused, round closed, aggregate
released, ...); an auditor checks it with :func:`verify_log` or
``secure-afl audit verify LOG [--receipts DIR] [--server-pub FILE]``.

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
import sys
import threading
import time as _time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from ._io import fsync_dir, write_all, write_file
from .exceptions import (
    AuditChainBroken,
    InvalidSignature,
    MalformedPayload,
    exit_code,
)
from .signing import canonical_json, verify_receipt

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
    "verify_log",
    "load_receipts",
    "register",
]

CHAIN_PREFIX = b"secure-afl/audit/v1\0"
RECORD_SIG_PREFIX = b"secure-afl/audit-record/v1\0"
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
        rec = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise broken("not valid JSON", "malformed") from None
    if not isinstance(rec, dict):
        raise broken("not a JSON object", "malformed")
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
# verifier
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditVerification:
    """Result of :func:`verify_log` on a log that verified."""

    n_records: int
    n_accepted: int
    n_refused: int
    n_receipts: int
    head_hash: str
    signed: bool

    def summary(self) -> str:
        sig = ", server signatures verified" if self.signed else ""
        return (f"OK: {self.n_records} records ({self.n_accepted} accepted, {self.n_refused} refused), "
                f"{self.n_receipts} receipts matched{sig}; head {self.head_hash}")


def _server_pub(server_pub):
    if server_pub is None:
        return None
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if isinstance(server_pub, Ed25519PublicKey):
        return server_pub
    from .pki import load_identity_pub

    if isinstance(server_pub, (bytes, bytearray)) and len(server_pub) == 32:
        return Ed25519PublicKey.from_public_bytes(bytes(server_pub))
    return load_identity_pub(server_pub)


def verify_log(path, *, server_pub=None, receipts: Iterable[Mapping] = (),
               records_signed: bool = True) -> AuditVerification:
    """Verify the chain of ``path`` and that every receipt is backed by it.

    Parameters
    ----------
    path : path-like
        The JSON Lines audit log.
    server_pub : Ed25519PublicKey, PEM path/str or raw bytes, optional
        If given, every receipt's signature is verified and, unless
        ``records_signed=False`` (a log written without a signing key), every
        record must carry a valid server signature.
    receipts : iterable of dict
        Receipts from :func:`secure_afl.signing.make_receipt`. Each must
        point (by ``seq``) to an ``upload``/``accepted`` record of the same
        session, hospital and payload hash.

    Raises
    ------
    AuditChainBroken
        ``index`` names the first broken record (0-based line = expected
        seq): malformed line, wrong seq (deleted/reordered record), broken
        link, hash mismatch (edited field), bad signature, or a torn last
        line. For a receipt failure ``index`` is the record it points to
        (``None`` if there is none) and ``reason`` starts with ``receipt_``.
    """
    pub = _server_pub(server_pub)
    data = Path(path).read_bytes()
    lines, torn = _split_lines(data)
    prev = GENESIS_HASH
    records = []
    for i, line in enumerate(lines):
        rec = _check_record(line, i, prev, pub if records_signed else None)
        records.append(rec)
        prev = rec["hash"]
    if torn:
        raise AuditChainBroken(f"record {len(lines)}: torn last line (no newline; crash mid-write?)",
                               index=len(lines), reason="torn_record")

    n_receipts = 0
    for j, receipt in enumerate(receipts):
        _check_receipt(receipt, j, records, pub)
        n_receipts += 1
    n_acc = sum(r["outcome"] == "accepted" for r in records)
    return AuditVerification(n_records=len(records), n_accepted=n_acc, n_refused=len(records) - n_acc,
                             n_receipts=n_receipts, head_hash=prev,
                             signed=pub is not None and records_signed)


def _check_receipt(receipt, j: int, records: list[dict], pub) -> None:
    label = f"receipt {j}"
    if isinstance(receipt, Mapping) and "_source" in receipt:
        label += f" ({receipt['_source']})"
        receipt = {k: v for k, v in receipt.items() if k != "_source"}
    try:
        if pub is not None:
            r = verify_receipt(receipt, pub)
        else:  # structure only; without the server key the signature cannot be checked
            r = dict(receipt)
            for f in ("session_id", "hospital", "payload_sha256", "seq"):
                r[f]
    except InvalidSignature:
        raise AuditChainBroken(f"{label}: server signature does not verify",
                               reason="receipt_bad_signature") from None
    except (MalformedPayload, KeyError, TypeError, ValueError):
        raise AuditChainBroken(f"{label}: malformed receipt", reason="receipt_malformed") from None
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


def load_receipts(directory) -> list[dict]:
    """Every receipt in ``directory/*.json`` (a file holds one receipt or a list)."""
    out: list[dict] = []
    for f in sorted(Path(directory).glob("*.json")):
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
    if args.pki is not None and args.server_pub is None:
        from .pki import pinned_identity

        args.server_pub = pinned_identity(args.pki, "server")
    try:
        receipts = load_receipts(args.receipts) if args.receipts else []
        if receipts and args.server_pub is None:
            print("warning: no --server-pub; receipt signatures are not verified", file=sys.stderr)
        result = verify_log(args.log, server_pub=args.server_pub, receipts=receipts,
                            records_signed=not args.unsigned_records)
    except AuditChainBroken as exc:
        where = f" (record index {exc.index})" if exc.index is not None else ""
        print(f"BROKEN{where}: {exc} [{exc.reason}]")
        return exit_code(exc)
    print(result.summary())
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="audit_command", metavar="ACTION", required=True)
    p = sub.add_parser("verify", help="verify the hash chain of an audit log and receipts against it")
    p.add_argument("log", help="audit log (JSON Lines)")
    p.add_argument("--receipts", default=None, help="directory of receipt *.json files")
    p.add_argument("--server-pub", default=None,
                   help="server identity public key (PEM, e.g. server-NAME/identity.pub, or raw hex)")
    p.add_argument("--pki", default=None, help="a party's PKI bundle: pins the server's key from its roster")
    p.add_argument("--unsigned-records", action="store_true",
                   help="the log was written without a signing key: use --server-pub for receipts only")
    p.set_defaults(func=_cmd_verify)
