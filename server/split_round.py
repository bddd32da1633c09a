"""The ``split`` server: leader aggregator and collector.

Leader: it sums the hospitals' masked vectors ``y_k = enc(x_k) + PRG(s_k)``
(no online rounds: a hospital that never uploads is simply not in the sum or
the manifest) and keeps each hospital's signed seed statement, which it
relays to the key holder as that upload's tag. No route serves a masked
vector or the masked sum to anyone: the key holder holds every seed, so
either would be readable there.

Commit before reveal. The key holder first sends only its statement, signed
over this session's manifest, the cohort its share covers and the share's
hash; the server checks it against the pinned key holder identity, its own
stored manifest and the signed release policy, signs the masked sum ``Y_c``
of exactly that cohort and stores the signed answer before returning it
(:meth:`commit`). Only then does the key holder send its share
``S = -sum PRG(s_k)`` (:meth:`collect`), which the server takes for the
committed statement alone. A server holding ``S`` and every masked upload
knows the aggregate and could answer ``enc(v*) - S`` for any ``v*``; signed
and stored before ``S`` exists for it, ``Y_c`` cannot depend on the
aggregate. The key holder adds ``S`` to the ``Y_c`` it kept and forms the
release itself; the server keeps the statement, the share and its signed sum
for an auditor (``secure-afl audit release``).
"""

from __future__ import annotations

import base64
import json


from secure_afl.exceptions import Forbidden, MalformedPayload, RoundAlreadyClosed, SecureAFLError, StageError
from secure_afl.protocol import H_TAG

from .aggregator import AggregationServer, log
from secure_afl import split
from secure_afl.cohort import JOINT_CHECK, cohort_after_refusals
from secure_afl.split_release import cohort_masked_sum

__all__ = ["SplitAggregationServer"]


class SplitAggregationServer(AggregationServer):

    def _verifiers(self):
        with self._lock:
            if "_verifier_pool" not in self.__dict__:
                self._verifier_pool = split.pool.verifier_pool(spare=1)
            return self._verifier_pool

    def shutdown(self) -> None:
        pool = self.__dict__.get("_verifier_pool")
        if pool is not None:
            pool.close()
        super().shutdown()

    def contribution(self, hospital: str) -> bytes:
        raise Forbidden("a split session serves no masked vector: whoever holds the seeds could read it")

    def masked_aggregate(self) -> bytes:
        raise Forbidden("a split session serves no masked sum: whoever holds the seeds could read a forged one")

    def split_statements(self, after="0", party: str | None = None) -> dict:
        """hospital -> its signed seed statement, for every upload accepted so far (open or released) after the
        first ``after`` in arrival order: the key holder derives each upload's query seed from it as soon as
        the upload is in, and asks only for what is new since its last poll. A server that leaves one out
        only moves that upload's verdict to the release, which asks for every participant by name."""
        if not isinstance(after, int):
            if not isinstance(after, str) or not (after.isascii() and after.isdigit()) or len(after) > 9:
                err = MalformedPayload("after: the number of seed statements already read, a non-negative integer")
                self.refuse("split_statements", party, err)
                raise err
            after = int(after)
        return {h: tag for h, (_, tag) in self.store.upload_tags(after=after).items() if tag is not None}

    def verifier_messages(self) -> dict:
        """hospital -> this server's signed verifier message for its upload, as formed so far (at the key
        holder's query seeds, :meth:`form_verifier_messages`): the key holder decides on them, and a refusal
        it signs can be traced to the message the server signed."""
        return self.store.verifier_messages()

    def form_verifier_messages(self, party: str, body: bytes) -> dict:
        """``POST .../split/queries``: ``{hospital: {payload_sha256, query_seed}}`` from the key holder -> the
        server's signed verifier message for each named accepted upload at that query seed, formed now and
        kept. One message per upload: the same query again returns the kept one, another query seed for an
        upload that has one is refused (the server never answers two queries on one upload)."""
        try:
            try:
                queries = json.loads(body)
            except ValueError:
                raise MalformedPayload("the verifier queries are not JSON") from None
            if not isinstance(queries, dict) or not all(
                    isinstance(q, dict) and isinstance(q.get("payload_sha256"), str)
                    and isinstance(q.get("query_seed"), str) and len(q["query_seed"]) == 64 for q in queries.values()):
                raise MalformedPayload("the verifier queries are not {hospital: {payload_sha256, query_seed (32 "
                                       "bytes hex)}}")
            with self._lock:
                rows = self.store.upload_tags(list(queries))
                done = self.store.verifier_messages(list(queries))
                todo = []
                for h, q in queries.items():
                    sha, tag = rows.get(h, (None, None))
                    if sha is None or sha != q["payload_sha256"] or tag is None:
                        raise MalformedPayload(f"a verifier query names no accepted upload of {h}")
                    kept = done.get(h)
                    if kept is not None:
                        if (kept["payload_sha256"], kept["query_seed"]) != (q["payload_sha256"], q["query_seed"]):
                            raise MalformedPayload(f"the upload of {h} already has its verifier message, at "
                                                   "another query seed")
                        continue
                    todo.append((h, self.store.blob_path(sha), sha, tag, bytes.fromhex(q["query_seed"])))
        except (SecureAFLError, ValueError) as e:
            err = e if isinstance(e, SecureAFLError) else MalformedPayload("a query seed is not hex")
            self.refuse("split_queries", party, err)
            raise err from None
        # independent per upload (outside the lock: uploads keep arriving): in this session's worker processes,
        # started once it has seen enough uploads and kept for every later query
        formed = split.leader_messages(self.params, todo, self._key, pool=self._verifiers()) if todo else {}
        with self._lock:  # a concurrent query for the same upload may have kept its message first: that one stays
            self.store.keep_verifier_messages(formed)
            done = self.store.verifier_messages(list(queries))
        return {h: done[h] for h in queries}

    def commit(self, party: str, statement: dict) -> dict:
        """``POST .../split/commit``: the key holder's signed share statement alone (its share not yet sent) ->
        the server-signed masked sum of exactly that statement's cohort (the manifest's sum less the refused
        uploads' masked words, :func:`~secure_afl.split_release.cohort_masked_sum`), stored before it is
        returned. That stored answer is the server's commitment: it is formed while the server holds no share,
        so it cannot depend on the aggregate; the same statement again gets the same answer, any other
        statement of this session is refused (one commitment per session and seed key)."""
        with self._lock:
            try:
                aggregate, manifest = self.released()
                kept = self.store.get_meta("split_commit")
                if kept is not None:
                    if not isinstance(statement, dict) or kept["masked_sum"]["share_statement_sha256"] != \
                            split.share_statement_digest(statement):
                        raise RoundAlreadyClosed("the server already committed to the masked sum of another share "
                                                 "statement of this session; it commits once")
                    return self._commitment(kept)
                split.verify_share_statement(self.params, manifest, statement, self.lookup_pub(party))
                refused = dict(statement["refused"])
                # the signed session's floor, whatever the statement says: refusals past max_refusals or a cohort
                # below the quorum abort the release here too
                cohort_after_refusals(self.release_policy, [p["hospital"] for p in manifest["participants"]],
                                      refused)
                masked_sum = cohort_masked_sum(self.params, aggregate, [
                    self.store.get_blob(row["payload_sha256"]) for row in self.store.uploads()
                    if row["hospital"] in refused], len(statement["cohort"]))
            except SecureAFLError as e:
                self.refuse("split_commit", party, e)
                raise
            signed = split.sign_masked_sum(self._key, self.params, statement, masked_sum)
            kept = {"share_statement": statement, "masked_sum": signed,
                    "masked_sum_blob": self.store.put_blob(masked_sum)}
            self.store.set_meta("split_commit", kept)
            self.audit.append("split_commit", actor=party, outcome="accepted", session=self.config.session_id,
                              details={"share_statement_sha256": signed["share_statement_sha256"],
                                       "masked_sum_sha256": signed["masked_sum_sha256"],
                                       "contributors": len(statement["cohort"])})
            return self._commitment(kept)

    def _commitment(self, kept: dict) -> dict:
        return {"masked_sum": kept["masked_sum"],
                "aggregate": base64.b64encode(self.store.get_blob(kept["masked_sum_blob"])).decode()}

    def collect(self, party: str, body: bytes, statement: dict) -> dict:
        """``POST .../split/share``: the key holder's share, taken only for the statement the server already
        committed a masked sum to (:meth:`commit`); a share for any other statement, or before a commitment, is
        refused. Keeps the statement, the share and the committed sum for an auditor, who recomputes the sum
        from the stored uploads. Returns the committed signed sum."""
        with self._lock:
            try:
                _, manifest = self.released()
                kept = self.store.get_meta("split_commit")
                digest = split.share_statement_digest(statement)
                if kept is None or kept["masked_sum"]["share_statement_sha256"] != digest:
                    raise StageError("no masked sum is committed for this share statement: the server takes a "
                                     "share only after it has signed and kept the cohort's masked sum "
                                     "(POST .../split/commit)")
                split.verify_share(self.params, manifest, body, statement, self.lookup_pub(party))
                taken = self.store.get_meta("split_result")
                if taken is not None:
                    if taken["share_statement"] == statement:
                        return taken["masked_sum"]  # the same share again (a key holder's retry): nothing new
                    raise RoundAlreadyClosed("the key holder's share was already taken; a share is taken once")
            except SecureAFLError as e:
                self.refuse("split_collect", party, e)
                raise
            refused = dict(statement["refused"])
            signed = kept["masked_sum"]
            self.store.set_meta("split_result", {"share_statement": statement, "masked_sum": signed,
                                                 "share_sha256": self.store.put_blob(body),
                                                 "masked_sum_blob": kept["masked_sum_blob"]})
            for h, check in refused.items():
                # the key holder's signed share names it; the server's own verifier message is kept beside
                # and so is the key holder's own message: with the two, anyone recomputes the verdict; only the
                # hospital, from its own upload, can tell which of its upload and the server's message is false
                ev = (statement.get("evidence") or {}).get(h) or {}
                self.audit.append("split_validity", actor="hospital:" + h, outcome="refused",
                                  session=self.config.session_id,
                                  details={"check": check, "by": party, "share_sha256": statement["share_sha256"],
                                           "attribution": ev.get("attribution", JOINT_CHECK),
                                           "keyholder_message": ev.get("keyholder_message")})
            self.audit.append("split_collect", actor=party, outcome="accepted", session=self.config.session_id,
                              details={"share_sha256": statement["share_sha256"],
                                       "manifest_sha256": statement["manifest_sha256"],
                                       "masked_sum_sha256": signed["masked_sum_sha256"],
                                       "contributors": len(statement["cohort"])})
            log.info("[Stage release] split: the key holder's share taken over its cohort of %d",
                     len(statement["cohort"]))
            return signed

    def result(self) -> bytes:
        """``{share_statement, share, masked_sum, aggregate}`` as JSON bytes: the key holder's signed share
        statement and share (base64), the server-signed masked-sum statement and the sealed masked sum over that
        statement's cohort (base64), once the share is taken: the record an auditor checks against the stored
        uploads. The key holder never forms its release from this answer, only from the sum it kept at the
        commitment (:meth:`commit`)."""
        r = self.store.get_meta("split_result")
        if r is None:
            raise StageError("the key holder has not released its share yet")
        return json.dumps({"share_statement": r["share_statement"], "masked_sum": r["masked_sum"],
                           "share": base64.b64encode(self.store.get_blob(r["share_sha256"])).decode(),
                           "aggregate": base64.b64encode(self.store.get_blob(r["masked_sum_blob"])).decode()}
                          ).encode()

    def _statement(self, event: str, party: str, raw: str | bytes | None, what: str) -> dict:
        """The key holder's signed share statement from ``raw`` JSON (parsed here, so a malformed one is refused
        and audited like any other refusal)."""
        try:
            if not raw:
                raise MalformedPayload(f"missing {what} (the key holder's signed share statement)")
            statement = json.loads(raw)
            if not isinstance(statement, dict):
                raise MalformedPayload("the share statement is not a JSON object")
        except (ValueError, SecureAFLError) as e:
            err = e if isinstance(e, SecureAFLError) else MalformedPayload("the share statement is not JSON")
            self.refuse(event, party, err)
            raise err from None
        return statement

    def commit_request(self, party: str, body: bytes) -> dict:
        """``POST .../split/commit``: the body is the key holder's signed share statement (no share)."""
        return self.commit(party, self._statement("split_commit", party, body, "request body"))

    def collect_request(self, party: str, body: bytes, raw_statement: str | None) -> dict:
        """``POST .../split/share``: the key holder's share with its signed statement in the ``H_TAG``
        header."""
        return self.collect(party, body, self._statement("split_collect", party, raw_statement, f"{H_TAG} header"))
