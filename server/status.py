"""A running session's state for the parties that run it (``secure-afl session status``), from the server's own
records: who may read it, what each caller sees, and the summary of refusals kept as the log grows.

Who sees what. The view names every roster hospital's fate (uploaded, refused and why, silent) while the
session runs; polled, it dates each hospital's arrival. So it goes only to a caller authenticated over mTLS
(the signer of the request must be the party enrolled for the TLS client certificate, whatever
``[server] require_client_cert`` says) and signed for this session's path:

* the session's key holder and the server's own identity (the operator's ``--as server-NAME``): the whole view;
* a hospital of the signed roster: its own entry and the aggregate progress (counts, quorum, dropouts left,
  deadline), no other hospital's name or fate;
* anyone else, a consortium hospital outside the roster included: refused (``unknown_party``), audited.
"""

from __future__ import annotations

import time

from secure_afl.exceptions import Unauthenticated

from . import secagg_round
from .peer_auth import refuse
from .session_state import ServerSession, StatusSummary

__all__ = ["observe_record", "session_info", "session_status", "status_view"]


def observe_record(summary: StatusSummary, rec: dict) -> None:
    """Fold one audit record into the status summary (the audit log's ``on_record``)."""
    if rec.get("event") == "upload" and rec.get("outcome") == "refused" and rec.get("actor") != "unauthenticated":
        with summary.lock:
            summary.refused[str(rec.get("actor"))] = rec.get("reason") or "refused"


def session_info(server: ServerSession) -> dict:
    """The public session info every party reads; secagg adds its round."""
    info = {
        "session_id": server.config.session_id,
        "status": server.status,
        "backend": server.config.backend,
        "params": server.params.to_dict() if server.params else None,
        "params_digest": server.params.digest().hex() if server.params else None,
        "min_clients": server.config.min_clients,
        "min_class_count": server.config.min_class_count,
        "colluders": server.release_policy.colluders,
        "hospitals": sorted(server.enrolled),
        "deadline": server.deadline,
        "max_upload_bytes": server.config.max_upload_bytes,
        "server_identity_pub": server.identity_pub_hex,
        "keyholder_params_signature": server.store.get_meta("params_signature"),
    }
    if server.secagg is not None:
        info["secagg"] = secagg_round.round_info(server)
    return info


def session_status(server: ServerSession) -> dict:
    """Where the session stands: every roster hospital's state (uploaded, asked to be judged, refused with the
    reason, silent), the quorum and how many more may still drop out, the deadline. O(roster), never a read of
    the audit log (:class:`StatusSummary`)."""
    roster = sorted(server.enrolled)
    uploaded = sorted(server.store.upload_tags())
    judged = sorted(server.store.judged_hospitals()) if server.config.backend == "split" else []
    with server.status_summary.lock:
        refused = {h: why for h, why in server.status_summary.refused.items() if h in server.enrolled}
    # the release's cohort: split's from the key holder's signed share statement (its verdicts), the others'
    # from the server's manifest
    statement = (server.store.get_meta("split_result") or {}).get("share_statement") or {}
    manifest = server.store.get_meta("manifest") or {}
    verdicts = dict(statement.get("refused") or {})
    valid = list(statement.get("cohort") or []) if statement else \
        [p["hospital"] for p in manifest.get("participants") or []] if server.config.backend != "split" else []
    for h, why in verdicts.items():  # the key holder's verdicts, known at the release
        refused[h] = why
    for h in uploaded:  # a later accepted upload replaces a refused attempt, a release verdict does not
        if h in refused and h not in verdicts:
            del refused[h]
    policy = server.release_policy
    counted = [h for h in uploaded if h not in refused]
    return {
        "session_id": server.config.session_id, "backend": server.config.backend, "status": server.status,
        "phase": _phase(server),
        "roster": roster, "uploaded": uploaded, "judged": judged,
        "valid": sorted(valid), "refused": dict(sorted(refused.items())),
        "silent": [h for h in roster if h not in uploaded and h not in refused],
        "quorum": policy.quorum, "still_needed": max(0, policy.quorum - len(counted)),
        "dropouts_left": max(0, len(roster) - len(refused) - policy.quorum),
        "deadline": server.deadline, "now": time.time(),
    }


def _phase(server: ServerSession) -> str:
    """What the session's state means for its parties, in words. The server's own state says "released" once
    it has closed the round and signed the manifest; the release itself is the key holder's, and only split's
    (its signed share statement and masked sum) passes through the server."""
    if server.status != "released":
        return server.status
    if server.config.backend == "split":
        if server.store.get_meta("split_result") is not None:
            return "released (the key holder's share statement and the masked sum are recorded)"
        return "closed, not released yet: the manifest is signed; `keyholder finalize` releases it"
    if server.store.get_meta("audit_countersign") is not None:
        return ("closed: the manifest is signed and the key holder has countersigned it, the step before its "
                "release (the release itself happens at the key holder, unseen by the server)")
    return "closed, not released yet: the manifest is signed; `keyholder finalize` releases it"


def status_view(server: ServerSession, party: str, peer: dict | None) -> dict:
    """What ``party`` (already authenticated by its signed request) may see of :func:`session_status`.

    mTLS is required here whatever ``require_client_cert`` says: the TLS client certificate must be the one
    enrolled for the signer, so a stolen identity key alone reads nothing. A roster hospital gets its own
    entry and the counts; the key holder and the server's own identity get everything."""
    try:
        cert = (peer or {}).get("cert_sha256")
        if cert is None:
            raise Unauthenticated("the session status is served over mutual TLS only: present the consortium "
                                  "certificate enrolled for the signing party")
        if cert != server.roster.enrolment(party).cert_sha256:
            raise Unauthenticated(f"the request is signed by {party!r} but the TLS client certificate is not the "
                                  "one enrolled for it")
    except Unauthenticated as e:
        refuse(server, "request", party, e, {"path": "status"}, peer=peer)
        raise
    full = session_status(server)
    role, _, name = party.partition(":")
    if role in ("keyholder", "server"):
        return {**full, "view": "session"}
    state = "refused" if name in full["refused"] else "uploaded" if name in full["uploaded"] else "silent"
    own = {"hospital": name, "state": state, "reason": full["refused"].get(name),
           "judged": name in full["judged"], "released": name in full["valid"]}
    return {"view": "hospital", "you": own,
            **{k: full[k] for k in ("session_id", "backend", "status", "quorum", "still_needed", "dropouts_left",
                                    "deadline", "now")},
            "counts": {k: len(full[k]) for k in ("roster", "uploaded", "judged", "valid", "refused", "silent")}}
