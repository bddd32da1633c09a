"""What an accepted upload and a release leave behind: the upload's audit record and signed receipt, the
release record, the signed close record and ``audit-head.json``; each formed once, also when a restart finishes
what a crash interrupted (``running_sum.rebuild``).

Functions over :class:`server.session_state.ServerSession`; they read ``config``, ``store``, ``audit``, ``key``
and ``dir``.
"""

from __future__ import annotations

import json
import logging
import os
import time

from secure_afl._io import write_file
from secure_afl.audit_log import make_close_record
from secure_afl.exceptions import StageError
from secure_afl.signing import make_receipt

from .session_state import ServerSession

__all__ = ["audit_head", "finish_acceptance", "finish_release", "write_head_file"]

log = logging.getLogger("secure_afl.server")


def finish_acceptance(session: ServerSession, hospital: str, sha: str, *, recovered: bool = False) -> dict:
    """The accepted upload's audit record and the signed receipt that names it."""
    # after a crash between the audit write and the receipt, the record is already there
    rec = session.audit.find("upload", hospital, payload_sha256=sha) if recovered else None
    if rec is None:
        rec = session.audit.append("upload", actor=hospital, outcome="accepted", session=session.config.session_id,
                                   details={"payload_sha256": sha, "recovered": recovered,
                                            "contributions": session.store.upload_count()})
    receipt = make_receipt(session.key, session.config.session_id, hospital, bytes.fromhex(sha), rec["seq"],
                           audit_head=rec["hash"])
    session.store.set_receipt(hospital, rec["seq"], receipt)
    log.info("[Stage upload] accepted %s (%d so far)", hospital, session.store.upload_count())
    return receipt


def finish_release(session: ServerSession, party: str) -> None:
    """The release record and the signed close record; once, also across a crash between them."""
    if session.store.get_meta("audit_close") is not None:
        return
    manifest = session.store.get_meta("manifest")
    agg_sha = manifest["aggregate_sha256"]
    names = sorted(p["hospital"] for p in manifest["participants"])
    rec = session.audit.find("release", None, aggregate_sha256=agg_sha)
    if rec is None:
        rec = session.audit.append("release", actor=party, outcome="accepted", session=session.config.session_id,
                                   details={"aggregate_sha256": agg_sha, "contributors": len(names),
                                            "participants": names})
    close = make_close_record(session.key, session.config.session_id, rec["seq"], rec["hash"], names)
    session.store.set_meta("audit_close", close)
    write_head_file(session)


def write_head_file(session: ServerSession) -> None:
    """``audit-head.json`` next to the log: what ``secure-afl audit verify --head`` takes."""
    tmp = session.dir / f".audit-head.{time.time_ns()}.tmp"
    write_file(tmp, json.dumps(audit_head(session), indent=1).encode())
    os.replace(tmp, session.dir / "audit-head.json")


def audit_head(session: ServerSession) -> dict:
    """The signed close record and, once the key holder finalized, its countersignature."""
    close = session.store.get_meta("audit_close")
    if close is None:
        raise StageError("the session has not closed; there is no audit head yet")
    return {"close": close, "countersign": session.store.get_meta("audit_countersign")}
