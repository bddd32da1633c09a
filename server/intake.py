"""Uploads: the signed statement, the upload window (stage, deadline), replay and duplicate checks, the
backend's own door (:meth:`ProtectionBackend.admit`), the running sum, durable storage and the signed receipt.

Names no backend: each backend admits its own uploads. A mixin of
:class:`server.aggregator.AggregationServer`, which sets what it reads: ``config``, ``store``, ``params``,
``audit``, ``_enrolled``, ``_key``, ``_lock``, ``_in_flight``, ``_drained``, ``_closing``, ``_door`` and
``_combiner``.
"""

from __future__ import annotations

import hashlib
import logging
import time

from secure_afl.backends import get_backend
from secure_afl.exceptions import (
    DeadlinePassed,
    DuplicateContribution,
    MalformedPayload,
    NotFound,
    ReplayedContribution,
    RoundAlreadyClosed,
    SecureAFLError,
    ServerBusy,
    StageError,
    TooLarge,
)
from secure_afl.protocol import MAX_SKEW_S
from secure_afl.signing import make_receipt, verify_upload

__all__ = ["UploadIntake"]

log = logging.getLogger("secure_afl.server")


class UploadIntake:
    """One signed upload per enrolled hospital while the session is open."""

    @property
    def deadline(self) -> float | None:
        c = self.config
        if c.deadline is not None:
            return c.deadline
        if c.deadline_s is not None:
            return float(self.store.get_meta("created_at")) + c.deadline_s
        return None

    def submit(self, hospital: str, statement: dict, payload: bytes, tag: dict | None = None, *,
               peer: dict | None = None, payload_sha256: str | None = None) -> dict:
        """Validate, store durably, add to the running sum, audit, return a signed receipt.

        ckks uploads carry the hospital's signed aggregate tag (:mod:`secure_afl.tagging`).
        ``payload_sha256``: the body's digest where the caller already computed it from these bytes (the HTTP
        layer, as the body streamed in); else it is computed here.
        """
        sha = payload_sha256 if payload_sha256 is not None else hashlib.sha256(payload).hexdigest()
        details = {"payload_sha256": sha, "bytes": len(payload)}
        opened = None
        with self._lock:
            try:  # until the statement verifies, ``hospital`` is only a claim
                if hospital not in self._enrolled:
                    raise self.roster.not_in_session(f"hospital:{str(hospital)[:64]}")
                verify_upload(statement, self._enrolled[hospital].public_key(),
                              session_id=self.config.session_id, payload_sha256=bytes.fromhex(sha),
                              hospital=hospital, max_age_s=MAX_SKEW_S)
            except SecureAFLError as e:
                self.refuse("upload", None, e, details, peer=peer)
                raise
            except (TypeError, ValueError, KeyError) as e:
                err = MalformedPayload(f"upload statement unusable: {type(e).__name__}")
                self.refuse("upload", None, err, details, peer=peer)
                raise err from None
            try:
                self._check_open()
                if len(payload) > self.config.max_upload_bytes:
                    raise TooLarge(f"payload of {len(payload)} bytes exceeds the cap of "
                                   f"{self.config.max_upload_bytes}")
                st = verify_upload(statement, self._enrolled[hospital].public_key(),
                                   session_id=self.config.session_id, params_digest=self.params.digest(),
                                   payload_sha256=bytes.fromhex(sha), hospital=hospital, max_age_s=MAX_SKEW_S)
                if not self.store.claim_nonce("upload:" + st["nonce"], "hospital:" + hospital):
                    raise ReplayedContribution("this upload statement was already presented")
                if self.store.has_upload(hospital):
                    raise DuplicateContribution(
                        f"{hospital} already contributed to this session, and uploads are final: the first one "
                        "stands and is in the sum (its receipt is in the hospital's receipts folder); a corrected "
                        "file can only go into a new session the operator signs")
                self._check_stage_allows_upload(hospital)
                # each backend's own door (tag or seed statement, envelope, commitment): the words it opened,
                # where it opened any, feed the running sum
                if self._door is None or self._door.params is not self.params:
                    self._door = get_backend(self.params)
                opened = self._door.admit(payload, tag, hospital=hospital,
                                          identity_pub=self._enrolled[hospital].public_key(), payload_sha256=sha)
                if hospital in self._in_flight:
                    raise DuplicateContribution(f"an upload of {hospital} is being added already")
            except SecureAFLError as e:
                self.refuse("upload", hospital, e, details)
                raise
            except (TypeError, ValueError, KeyError) as e:
                err = MalformedPayload(f"upload statement unusable: {type(e).__name__}")
                self.refuse("upload", hospital, err, details)
                raise err from None
            self._in_flight.add(hospital)
        try:
            # outside the lock: the summing workers check and add up to W uploads at once
            try:
                # the words the upload check opened, where the sum runs in this process
                self._combine_upload(hospital, opened if opened is not None and self._combiner.sums_here
                                     else payload)
            except SecureAFLError as e:
                with self._lock:
                    self.refuse("upload", hospital, e, details)
                    if isinstance(e, ServerBusy):  # the server's failure, not the upload's: it may come again
                        self.store.release_nonce("upload:" + st["nonce"], "hospital:" + hospital)
                    if getattr(self._combiner, "lost", None):
                        self._rebuild_when_drained(hospital)
                raise
            except (TypeError, ValueError, KeyError) as e:
                err = MalformedPayload(f"unusable contribution: {type(e).__name__}")
                with self._lock:
                    self.refuse("upload", hospital, err, details)
                raise err from None
            with self._lock:
                try:
                    self.store.put_blob(payload, sha)
                    self.store.insert_upload(hospital, sha, st, tag)
                except Exception:
                    # not stored, so not accepted: the running sum holds it, so it is summed again from disk
                    self._rebuild_when_drained(hospital)
                    raise
                return self._finish_acceptance(hospital, sha)
        finally:
            with self._lock:
                self._in_flight.discard(hospital)
                self._drained.notify_all()

    def _rebuild_when_drained(self, hospital: str) -> None:
        """Sum the stored uploads again once no other upload is being added (they would be added to the
        running sum being replaced). Called with the lock held, by the upload ``hospital`` in flight."""
        self._in_flight.discard(hospital)
        self._drained.wait_for(lambda: not self._in_flight)
        self._rebuild()

    def _finish_acceptance(self, hospital: str, sha: str, *, recovered: bool = False) -> dict:
        # after a crash between the audit write and the receipt, the record is already there
        rec = self.audit.find("upload", hospital, payload_sha256=sha) if recovered else None
        if rec is None:
            rec = self.audit.append("upload", actor=hospital, outcome="accepted", session=self.config.session_id,
                                    details={"payload_sha256": sha, "recovered": recovered,
                                             "contributions": self.store.upload_count()})
        receipt = make_receipt(self._key, self.config.session_id, hospital, bytes.fromhex(sha), rec["seq"],
                               audit_head=rec["hash"])
        self.store.set_receipt(hospital, rec["seq"], receipt)
        log.info("[Stage upload] accepted %s (%d so far)", hospital, self.store.upload_count())
        return receipt

    def _check_open(self) -> None:
        if self.params is None:
            raise StageError("the session is not open yet (waiting for the key holder's public context)")
        if self.status == "released":
            raise RoundAlreadyClosed("the session's aggregate was released; it accepts nothing more")
        if self._closing:
            raise RoundAlreadyClosed("the session is being closed; it accepts nothing more")
        dl = self.deadline
        if dl is not None and time.time() > dl:
            raise DeadlinePassed("the session's upload deadline has passed")

    def _check_stage_allows_upload(self, hospital: str) -> None:
        """Hook for protocols with rounds before the upload (secagg overrides)."""

    def _combine_upload(self, hospital: str, payload: bytes) -> None:
        """Validate the body and add it to the running sum; a refused payload changes nothing. Called without
        the lock (the combiner is thread-safe)."""
        self._combiner.add(payload)

    def receipt(self, hospital: str) -> dict:
        for row in self.store.uploads():
            if row["hospital"] == hospital and row["receipt"]:
                return row["receipt"]
        raise NotFound(f"no accepted upload from {hospital}")
