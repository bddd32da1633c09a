"""The auditor's side of the audit log: verify the chain, its signed head, the receipts and the countersignature.

Who runs this: anyone holding the published log, its head and the consortium
PKI (a hospital with its receipts, an auditor):
``secure-afl audit verify LOG --pki DIR --head HEAD [--receipts DIR] [--session ID]``.
The format and the server's writer are :mod:`secure_afl.audit_log`; what the
verifier checks, and why a head is needed, is explained there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from secure_afl.exceptions import (
    AuditChainBroken,
    InvalidInputError,
    InvalidSignature,
    MalformedPayload,
)
from secure_afl.signing import verify_receipt
from secure_afl.encoding import canonical_json

try:  # POSIX: one writer per log file
    import fcntl as _fcntl
except ImportError:  # pragma: no cover
    _fcntl = None
from .audit_log import GENESIS_HASH, check_record, public_key, split_lines, verify_close_record, verify_countersign
from secure_afl.signing import MANIFEST_PREFIX

__all__ = ["AuditVerification", "ChainShape", "check_chain", "expected_head", "verify_log", "load_receipts"]


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


def _read_chain(path, pub) -> list[dict]:
    data = Path(path).read_bytes()
    lines, torn = split_lines(data)
    prev = GENESIS_HASH
    records = []
    for i, line in enumerate(lines):
        rec = check_record(line, i, prev, pub)
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
    pub = public_key(server_pub)
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
    pub = public_key(server_pub)
    records = _read_chain(path, pub)
    try:
        seq, head_hash, close = expected_head(head, pub)
    except InvalidSignature:
        raise AuditChainBroken("the expected head's server signature does not verify",
                               reason="head_bad_signature") from None
    except MalformedPayload as e:
        raise AuditChainBroken(f"expected head unusable: {e}", reason="head_malformed") from None
    logged = sorted({r["session"] for r in records if isinstance(r.get("session"), str)})
    # a head of another session says nothing about this log: a wrong file, named as such, not a tampering alarm
    of = _head_session(head)
    if of is not None and logged and of not in logged:
        raise InvalidInputError(f"the expected head is of session {of}, but {path} is the audit log of session "
                                f"{', '.join(logged)}: pass that session's head (the key holder's "
                                f"keys/{logged[0]}.audit-head.json), or the log of session {of}",
                                reason="head_of_other_session")
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


def _head_session(head) -> str | None:
    """The session a signed head object names (close record, receipt, manifest), once its signature held."""
    if not isinstance(head, Mapping):
        return None
    obj = head.get("close", head)
    sid = obj.get("session_id") if isinstance(obj, Mapping) else None
    return sid if isinstance(sid, str) else None


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
