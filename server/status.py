"""A running session's state for its operator (``secure-afl session status``), from the server's own records."""

from __future__ import annotations

import json
import time

__all__ = ["session_info", "session_status"]


def session_info(server) -> dict:
    return {
        "session_id": server.config.session_id,
        "status": server.status,
        "backend": server.config.backend,
        "params": server.params.to_dict() if server.params else None,
        "params_digest": server.params.digest().hex() if server.params else None,
        "min_clients": server.config.min_clients,
        "min_class_count": server.config.min_class_count,
        "colluders": server.release_policy.colluders,
        "contributions": server.store.upload_count(),
        "hospitals": sorted(server._enrolled),
        "deadline": server.deadline,
        "max_upload_bytes": server.config.max_upload_bytes,
        "server_identity_pub": server.identity_pub_hex,
        "keyholder_params_signature": server.store.get_meta("params_signature"),
    }


def session_status(server) -> dict:
    """Where the session stands, for an operator's ``secure-afl session status``: every roster hospital's
    state (uploaded, asked to be judged, refused with the reason, silent), the quorum and how many more
    may still drop out, the deadline. Who took part is in the manifest every party reads at the release
    anyway; this says it while the session runs, to the consortium's own parties (mTLS) only."""
    roster = sorted(server._enrolled)
    uploaded = sorted({row["hospital"] for row in server.store.uploads()})
    judged = sorted(server.store.verifier_messages()) if server.config.backend == "split" else []
    refused: dict[str, str] = {}
    for rec in _audit_records(server.audit.path):  # the server's own refusals of roster hospitals' uploads
        if rec.get("event") == "upload" and rec.get("outcome") == "refused" and rec.get("actor") in roster:
            refused[rec["actor"]] = rec.get("reason") or "refused"
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


def _phase(server) -> str:
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


def _audit_records(path):
    try:
        with open(path, "rb") as f:
            for line in f:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue  # a torn last line is the log's to recover, not this view's
    except OSError:
        return
