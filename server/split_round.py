"""The ``split`` server: leader aggregator and collector.

Leader: it sums the hospitals' masked vectors ``y_k = enc(x_k) + PRG(s_k)``
(no online rounds: a hospital that never uploads is simply not in the sum or
the manifest) and keeps each hospital's signed seed statement, which it
relays to the key holder as that upload's tag. No route serves a masked
vector or the masked sum to anyone: the key holder holds every seed, so
either would be readable there.

Collector: once the key holder posted its share ``S = -sum PRG(s_k)``,
signed over this session's manifest (its digest, masked-sum hash and
cohort), the server checks that signature against the pinned key holder
identity and its own stored manifest, forms ``dec(Y + S)``, and runs the
checks, RI restoration and the solve (the path plain and secagg releases
take). The result (W and the report) is stored and served to the consortium's
parties; the share is accepted once.
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np

from secure_afl.exceptions import Forbidden, MalformedPayload, RoundAlreadyClosed, SecureAFLError, StageError
from secure_afl.protocol import API, H_TAG, SPLIT_RESULT_ENCODING

from .aggregator import AggregationServer, log
from secure_afl import split
from secure_afl.backends import get_backend
from secure_afl.certify import certify_release
from secure_afl.cohort import JOINT_CHECK, cohort_after_refusals
from secure_afl.packing import Layout

__all__ = ["SplitAggregationServer"]


def _dp_checks_and_solve(params, stats, contributors: int):
    """A noisy release (each hospital added its Skellam share before masking): the noise-aware checks, no
    rare-class rule (every count is noised), and the DP solve (PSD repair and the calibrated ridge, never RI
    restoration), as the key holder does for secagg and bfv. The privacy ledger is the key holder's: it
    accounted this release before its share left (``KeyHolder.release_split``); the epsilon here is the same
    public function of the signed parameters and the cohort size."""
    from secure_afl.dp import dp_sanity_check, dp_solve
    from secure_afl.dp.mechanism import release_epsilon

    if contributors < int(params.dp["min_contributors"]):  # the key holder refuses first; never solve short noise
        raise StageError(f"{contributors} contributions carry less than the declared noise "
                         f"(dp min_contributors={params.dp['min_contributors']})")
    # a proven upload may exceed the declared per-entry bound (up to 2T, docs/VALIDITY.md) without wrapping:
    # the noisy bound is reported, as the non-DP shape checks are, so it cannot veto the release
    checks = dp_sanity_check(stats, params, contributors, advisory=("noisy_bound",))
    W, solve_info = dp_solve(stats, params, contributors)
    return {"checks": checks}, W, {**dict(params.dp), "epsilon": release_epsilon(params, contributors),
                                   "contributors": contributors, "solve": solve_info}


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

    def collect(self, party: str, body: bytes, statement: dict) -> dict:
        """Check the key holder's share against the stored manifest, unmask the sum, check and solve."""
        from secure_afl.analytic import solve_from_sums
        from secure_afl.release_checks import check_class_minimum, sanity_check

        with self._lock:
            try:
                aggregate, manifest = self.released()
                if self.store.get_meta("split_result") is not None:
                    raise RoundAlreadyClosed("the key holder's share was already combined; a share is taken once")
                share = split.verify_share(self.params, manifest, body, statement, self.lookup_pub(party))
                refused = dict(statement["refused"])
                # the signed session's floor, whatever the share says: refusals past max_refusals or a cohort
                # below the quorum abort the release here too
                cohort_after_refusals(self.release_policy, [p["hospital"] for p in manifest["participants"]],
                                      refused)
                # the refused uploads are in the masked sum but not in the key holder's share: take them out
                backend = get_backend(self.params)
                out = [backend.masked_words(self.store.get_blob(row["payload_sha256"]))
                       for row in self.store.uploads() if row["hospital"] in refused]
                vector = split.collect(self.params, aggregate, share, subtract=out)
                participants = list(statement["cohort"])
                tol = split.expected_abs_error(self.params, len(participants))
                stats = Layout(self.params.layout.dim, self.params.layout.n_classes).unpack(vector,
                                                                                           gamma=self.params.gamma)
                if self.params.dp is None:
                    # a hospital can break the Gram's shape (PSD, Cauchy-Schwarz) and the trace by a 2^-30 relative
                    # slack while its validity proof holds: those checks are reported, not a veto (docs/VALIDITY.md)
                    sanity = sanity_check(stats, self.params, len(participants), abs_tol=tol,
                                          advisory=split.ADVISORY_CHECKS)
                    check_class_minimum(stats, self.config.min_class_count)
                    W, dp_info = solve_from_sums(stats), None
                else:
                    sanity, W, dp_info = _dp_checks_and_solve(self.params, stats, len(participants))
                bound = certify_release(self.params, stats, W, len(participants))
            except SecureAFLError as e:
                self.refuse("split_collect", party, e)
                raise
            report = {
                "session_id": self.params.session_id, "backend": "split", "participants": participants,
                "contributors": len(participants), "samples": int(round(stats.n)),
                "class_counts": [int(round(c)) for c in stats.class_counts], "gamma": self.params.gamma,
                "lambda_requested": 0.0, "lambda_total": 0.0, "aggregate_sha256": manifest["aggregate_sha256"],
                "params_digest": self.params.digest().hex(),
                "sanity": sanity if isinstance(sanity, dict) else sanity.to_dict(),
                "error_bound_per_entry": tol, "dp": dp_info, "w_error_bound": bound.to_dict(),
                "verdict": bound.verdict, "share_sha256": statement["share_sha256"], "collector": "server",
                "refused": refused,
            }
            buf = io.BytesIO()
            np.save(buf, vector.astype("<f8"))
            vec_sha = self.store.put_blob(buf.getvalue())
            buf = io.BytesIO()
            np.save(buf, np.ascontiguousarray(W, dtype="<f8"))
            w_sha = self.store.put_blob(buf.getvalue())
            self.store.set_meta("split_result", {"report": report, "aggregate_vector_sha256": vec_sha,
                                                 "W_sha256": w_sha})
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
                                       "manifest_sha256": statement["manifest_sha256"], "contributors":
                                       len(participants)})
            log.info("[Stage release] split: key holder's share combined over %d contributions", len(participants))
            return report

    def result(self) -> bytes:
        """``{report, vector, W}`` (the released aggregate sum and the model) as JSON bytes, each array the base64
        of its ``.npy`` file (float64 little endian, shape in the header): exact, and 182 634 floats at d = 512
        took a quarter of a second to print and parse as JSON numbers."""
        r = self.store.get_meta("split_result")
        if r is None:
            raise StageError("the key holder has not released its share yet")
        return json.dumps({"report": r["report"], "encoding": SPLIT_RESULT_ENCODING,
                           "vector": base64.b64encode(self.store.get_blob(r["aggregate_vector_sha256"])).decode(),
                           "W": base64.b64encode(self.store.get_blob(r["W_sha256"])).decode()}).encode()

    def collect_request(self, party: str, body: bytes, raw_statement: str | None) -> dict:
        """``POST .../split/share``: the key holder's share with its signed statement in the ``H_TAG``
        header (parsed here, so a malformed header is refused and audited like any other refusal)."""
        try:
            if not raw_statement:
                raise MalformedPayload(f"missing {H_TAG} header (the key holder's signed share statement)")
            statement = json.loads(raw_statement)
            if not isinstance(statement, dict):
                raise MalformedPayload("the share statement is not a JSON object")
        except (ValueError, SecureAFLError) as e:
            err = e if isinstance(e, SecureAFLError) else MalformedPayload("the share statement is not JSON")
            self.refuse("split_collect", party, err)
            raise err from None
        return self.collect(party, body, statement)
