"""The release: close the round at the quorum, fix the aggregate, sign the manifest and the close record, keep
the key holder's countersignature, and serve what was released.

A mixin of :class:`server.aggregator.AggregationServer`, which sets what it reads: ``config``, ``store``,
``params``, ``audit``, ``release_policy``, ``_enrolled``, ``_key``, ``_lock``, ``_in_flight``, ``_drained``,
``_closing``, ``_combiner`` and ``dir``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time

from secure_afl import pki
from secure_afl._io import write_file
from secure_afl.audit_log import make_close_record, verify_countersign
from secure_afl.encoding import parse_json
from secure_afl.exceptions import Forbidden, InsufficientContributors, NotFound, SecureAFLError, StageError
from secure_afl.signing import build_manifest

__all__ = ["ReleaseStage"]

log = logging.getLogger("secure_afl.server")


class ReleaseStage:
    """Close, the manifest and the audit head; the released aggregate and uploads."""

    def close(self, party: str) -> dict:
        """Fix the aggregate and sign the manifest, if at least the release quorum contributed."""
        with self._lock:
            if self.status == "released":
                self._finish_release(party)
                return self.store.get_meta("manifest")
            self.flush_refusals()  # the summaries belong before the head the manifest pins
            try:
                if self.params is None:
                    raise StageError("nothing to close: the session never opened")
                # uploads already past their checks are accepted or refused before the sum is fixed; none start
                # while the lock is released for that wait (after it, the lock itself keeps them out)
                self._closing = True
                try:
                    self._drained.wait_for(lambda: not self._in_flight)
                finally:
                    self._closing = False
                if getattr(self._combiner, "lost", None):
                    self._rebuild()
                n = self.store.upload_count()
                q = self.release_policy.quorum
                if n < q:
                    raise InsufficientContributors(
                        f"{n} contributions, fewer than the release quorum q = {q} of the signed session "
                        f"(min_clients = {self.config.min_clients}, colluders = {self.release_policy.colluders}); "
                        "nothing is released")
                aggregate = self._final_aggregate()
                agg_sha = hashlib.sha256(aggregate).hexdigest()
                participants = []
                for row in self.store.uploads():
                    participants.append({**row["statement"],
                                         "identity_pub": self._enrolled[row["hospital"]].identity_pub})
                manifest = build_manifest(self._key, self.config.session_id, self.params.digest(), participants,
                                          bytes.fromhex(agg_sha), q,
                                          enrolled=pki.enrolled_keys(self._enrolled),
                                          audit={"seq": self.audit.next_seq - 1, "head": self.audit.head})
            except SecureAFLError as e:
                self.refuse("close", party, e)
                raise
            self.store.put_blob(aggregate)
            self.store.set_meta("aggregate_sha256", agg_sha)
            self.store.set_meta("manifest", manifest)
            self._finish_release(party)
            log.info("[Stage release] aggregate of %d contributions released", len(participants))
            return manifest

    def _finish_release(self, party: str) -> None:
        """The release record and the signed close record; once, also across a crash between them."""
        if self.store.get_meta("audit_close") is not None:
            return
        manifest = self.store.get_meta("manifest")
        agg_sha = manifest["aggregate_sha256"]
        names = sorted(p["hospital"] for p in manifest["participants"])
        rec = self.audit.find("release", None, aggregate_sha256=agg_sha)
        if rec is None:
            rec = self.audit.append("release", actor=party, outcome="accepted", session=self.config.session_id,
                                    details={"aggregate_sha256": agg_sha, "contributors": len(names),
                                             "participants": names})
        close = make_close_record(self._key, self.config.session_id, rec["seq"], rec["hash"], names)
        self.store.set_meta("audit_close", close)
        self._write_head_file()

    def _write_head_file(self) -> None:
        """``audit-head.json`` next to the log: what ``secure-afl audit verify --head`` takes."""

        tmp = self.dir / f".audit-head.{time.time_ns()}.tmp"
        write_file(tmp, json.dumps(self.audit_head(), indent=1).encode())
        os.replace(tmp, self.dir / "audit-head.json")

    def audit_head(self) -> dict:
        """The signed close record and, once the key holder finalized, its countersignature."""
        close = self.store.get_meta("audit_close")
        if close is None:
            raise StageError("the session has not closed; there is no audit head yet")
        return {"close": close, "countersign": self.store.get_meta("audit_countersign")}

    def store_countersign(self, party: str, body: bytes) -> dict:
        """The key holder's countersignature over the close record (sent at finalize)."""

        with self._lock:
            try:
                cs = parse_json(body, "countersignature")
                close = self.audit_head()["close"]
                verify_countersign(cs, self.lookup_pub(party), close)
                if cs.get("keyholder") != party.partition(":")[2]:
                    raise Forbidden("a key holder countersigns only in its own name")
            except SecureAFLError as e:
                self.refuse("audit_countersign", party, e)
                raise
            if self.store.get_meta("audit_countersign") is None:
                self.store.set_meta("audit_countersign", cs)
                self.audit.append("audit_countersigned", actor=party, outcome="accepted",
                                  session=self.config.session_id,
                                  details={"seq": close["seq"], "head": close["head"]})
                self._write_head_file()
            return self.audit_head()

    def _final_aggregate(self) -> bytes:
        return self._combiner.aggregate()

    def released(self) -> tuple[bytes, dict]:
        if self.status != "released":
            raise StageError("the aggregate has not been released")
        return self.store.get_blob(self.store.get_meta("aggregate_sha256")), self.store.get_meta("manifest")

    def masked_aggregate(self) -> bytes:
        """The released aggregate payload, for the key holder (plain, secagg)."""
        return self.released()[0]

    def contribution(self, hospital: str) -> bytes:
        """One accepted upload's payload bytes, for the key holder to verify and re-sum itself."""
        self.released()
        for row in self.store.uploads():
            if row["hospital"] == hospital:
                return self.store.get_blob(row["payload_sha256"])
        raise NotFound(f"no accepted upload from {hospital[:64]!r}")

    def tags(self) -> dict:
        """The participants' signed tag statements, for the key holder's aggregate check."""
        self.released()
        return {row["hospital"]: row["tag"] for row in self.store.uploads() if row["tag"] is not None}
