"""The server's audit of refused requests and uploads, rate-limited for the unauthenticated ones."""

from __future__ import annotations

import threading
import time

from secure_afl.exceptions import SecureAFLError

__all__ = ["RefusalLog"]


class RefusalLog:
    """Refusals into the session's audit log. ``peer_party`` names the enrolled party a TLS certificate
    belongs to (or None)."""

    def __init__(self, audit, session_id: str, interval_s: float, peer_party):
        self.audit, self.session_id, self.interval_s = audit, session_id, interval_s
        self._peer_party = peer_party
        # unauthenticated refusals per TLS peer: [window start, suppressed count, {reason: count}]
        self._unauth: dict[str, list] = {}
        self._unauth_lock = threading.Lock()

    def refuse(self, event: str, actor: str | None, err: SecureAFLError, details: dict | None = None, *,
               peer: dict | None = None) -> None:
        """Audit a refusal. ``actor`` must be an authenticated identity, or None.

        A refusal without an authenticated identity is recorded as
        ``unauthenticated`` with the TLS peer (address, certificate digest and
        the enrolled party that certificate belongs to); at most one such
        record per peer per ``refusal_interval_s`` is written in full, the
        rest are counted and summarised in one ``refusals_suppressed`` record,
        so unsigned requests cannot grow the log at line rate.
        """
        details = {**(details or {}), "message": str(err)[:300]}
        if peer is not None:
            details["tls_peer"] = {**peer, "cert_party": self._peer_party(peer)}
        if actor is None:
            if not self._admit_unauthenticated(peer, err.reason):
                return
            actor = "unauthenticated"
        self.audit.append(event, actor=str(actor)[:128], outcome="refused",
                          session=self.session_id, reason=err.reason, details=details)

    # distinct peers tracked at once; beyond it, all further peers share one counter
    _MAX_TRACKED_PEERS = 1024

    def _admit_unauthenticated(self, peer: dict | None, reason: str) -> bool:
        peer = peer or {}
        key = peer.get("cert_sha256") or str(peer.get("addr") or "local").rpartition(":")[0] or "local"
        now = time.monotonic()
        with self._unauth_lock:
            slot = self._unauth.get(key)
            if slot is None and len(self._unauth) >= self._MAX_TRACKED_PEERS:
                key, slot = "*", self._unauth.get("*")
            if slot is not None and now - slot[0] < self.interval_s:
                slot[1] += 1
                slot[2][reason] = slot[2].get(reason, 0) + 1
                return False
            if slot is not None:
                self._write_suppressed(key, slot)
            self._unauth[key] = [now, 0, {}]
            return True

    def flush(self) -> None:
        """Write the pending ``refusals_suppressed`` summaries (at release and shutdown)."""
        with self._unauth_lock:
            for key, slot in self._unauth.items():
                self._write_suppressed(key, slot)
            self._unauth.clear()

    def _write_suppressed(self, key: str, slot: list) -> None:
        if slot[1]:
            self.audit.append("refusals_suppressed", actor="unauthenticated", outcome="refused",
                              session=self.session_id, reason="rate_limited",
                              details={"peer": key, "count": slot[1], "reasons": dict(sorted(slot[2].items())),
                                       "interval_s": self.interval_s})
            slot[1], slot[2] = 0, {}
