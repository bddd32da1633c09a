"""The ``split`` server: leader aggregator and collector; functions over
:class:`server.session_state.ServerSession` and its :class:`~server.session_state.SplitState`.

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
import logging

from secure_afl import split
from secure_afl.cohort import JOINT_CHECK, cohort_after_refusals
from secure_afl.exceptions import MalformedPayload, RoundAlreadyClosed, SecureAFLError, StageError
from secure_afl.protocol import H_TAG
from secure_afl.split_release import cohort_masked_sum

from .closing import released
from .peer_auth import refuse
from .session_state import ServerSession

__all__ = ["close_verifiers", "collect", "collect_request", "commit", "commit_request", "form_verifier_messages", "result", "split_statements",
           "verifier_messages"]

log = logging.getLogger("secure_afl.server")


def _verifiers(session: ServerSession):
    """This session's verifier worker processes, started on the first query and kept for every later one."""
    with session.lock:
        if session.split.verifier_pool is None:
            session.split.verifier_pool = split.pool.verifier_pool()
        return session.split.verifier_pool


def close_verifiers(session: ServerSession) -> None:
    if session.split.verifier_pool is not None:
        session.split.verifier_pool.close()


def split_statements(session: ServerSession, after="0", party: str | None = None) -> dict:
    """hospital -> its signed seed statement, for every upload accepted so far (open or released) after the
    first ``after`` in arrival order: the key holder derives each upload's query seed from it as soon as
    the upload is in, and asks only for what is new since its last poll. A server that leaves one out
    only moves that upload's verdict to the release, which asks for every participant by name."""
    if not isinstance(after, int):
        if not isinstance(after, str) or not (after.isascii() and after.isdigit()) or len(after) > 9:
            err = MalformedPayload("after: the number of seed statements already read, a non-negative integer")
            refuse(session, "split_statements", party, err)
            raise err
        after = int(after)
    return {h: tag for h, (_, tag) in session.store.upload_tags(after=after).items() if tag is not None}


def verifier_messages(session: ServerSession) -> dict:
    """hospital -> this server's signed verifier message for its upload, as formed so far (at the key
    holder's query seeds, :func:`form_verifier_messages`): the key holder decides on them, and a refusal
    it signs can be traced to the message the server signed."""
    return session.store.verifier_messages()


def form_verifier_messages(session: ServerSession, party: str, body: bytes) -> dict:
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
        with session.lock:
            rows = session.store.upload_tags(list(queries))
            done = session.store.verifier_messages(list(queries))
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
                todo.append((h, session.store.blob_path(sha), sha, tag, bytes.fromhex(q["query_seed"])))
    except (SecureAFLError, ValueError) as e:
        err = e if isinstance(e, SecureAFLError) else MalformedPayload("a query seed is not hex")
        refuse(session, "split_queries", party, err)
        raise err from None
    # independent per upload (outside the lock: uploads keep arriving): in this session's worker processes,
    # started once it has seen enough uploads and kept for every later query
    formed = split.leader_messages(session.params, todo, session.key, pool=_verifiers(session)) if todo else {}
    with session.lock:  # a concurrent query for the same upload may have kept its message first: that one stays
        session.store.keep_verifier_messages(formed)
        done = session.store.verifier_messages(list(queries))
    return {h: done[h] for h in queries}


def commit(session: ServerSession, party: str, statement: dict) -> dict:
    """``POST .../split/commit``: the key holder's signed share statement alone (its share not yet sent) ->
    the server-signed masked sum of exactly that statement's cohort (the manifest's sum less the refused
    uploads' masked words, :func:`~secure_afl.split_release.cohort_masked_sum`), stored before it is
    returned. That stored answer is the server's commitment: it is formed while the server holds no share,
    so it cannot depend on the aggregate; the same statement again gets the same answer, any other
    statement of this session is refused (one commitment per session and seed key)."""
    with session.lock:
        try:
            aggregate, manifest = released(session)
            kept = session.store.get_meta("split_commit")
            if kept is not None:
                if not isinstance(statement, dict) or kept["masked_sum"]["share_statement_sha256"] != \
                        split.share_statement_digest(statement):
                    raise RoundAlreadyClosed("the server already committed to the masked sum of another share "
                                             "statement of this session; it commits once")
                return _commitment(session, kept)
            split.verify_share_statement(session.params, manifest, statement, session.roster.lookup_pub(party))
            refused = dict(statement["refused"])
            # the signed session's floor, whatever the statement says: refusals past max_refusals or a cohort
            # below the quorum abort the release here too
            cohort_after_refusals(session.release_policy, [p["hospital"] for p in manifest["participants"]],
                                  refused)
            masked_sum = cohort_masked_sum(session.params, aggregate, [
                session.store.get_blob(row["payload_sha256"]) for row in session.store.uploads()
                if row["hospital"] in refused], len(statement["cohort"]), _twisted(session, statement["cohort"]))
        except SecureAFLError as e:
            refuse(session, "split_commit", party, e)
            raise
        signed = split.sign_masked_sum(session.key, session.params, statement, masked_sum)
        kept = {"share_statement": statement, "masked_sum": signed,
                "masked_sum_blob": session.store.put_blob(masked_sum)}
        session.store.set_meta("split_commit", kept)
        session.audit.append("split_commit", actor=party, outcome="accepted", session=session.config.session_id,
                             details={"share_statement_sha256": signed["share_statement_sha256"],
                                      "masked_sum_sha256": signed["masked_sum_sha256"],
                                      "contributors": len(statement["cohort"])})
        return _commitment(session, kept)


def _twisted(session: ServerSession, cohort) -> list:
    """``(payload, query seed)`` of each cohort upload under DP with the Gram statement (none otherwise): the
    server permutes each one's noise words at the query seed it signed its verifier message at
    (:mod:`secure_afl.split.noise_twist`); an upload without a message has no verdict, and so no cohort."""
    if not split.noise_beside(session.params):
        return []
    messages = session.store.verifier_messages(list(cohort))
    rows = {r["hospital"]: r["payload_sha256"] for r in session.store.uploads()}
    missing = [h for h in cohort if h not in messages]
    if missing:
        raise MalformedPayload(f"no verifier message of this server for {', '.join(missing)}, a cohort hospital")
    return [(session.store.get_blob(rows[h]), split.signed_query_seed(messages[h], h)) for h in cohort]


def _commitment(session: ServerSession, kept: dict) -> dict:
    return {"masked_sum": kept["masked_sum"],
            "aggregate": base64.b64encode(session.store.get_blob(kept["masked_sum_blob"])).decode()}


def collect(session: ServerSession, party: str, body: bytes, statement: dict) -> dict:
    """``POST .../split/share``: the key holder's share, taken only for the statement the server already
    committed a masked sum to (:func:`commit`); a share for any other statement, or before a commitment, is
    refused. Keeps the statement, the share and the committed sum for an auditor, who recomputes the sum
    from the stored uploads. Returns the committed signed sum."""
    with session.lock:
        try:
            _, manifest = released(session)
            kept = session.store.get_meta("split_commit")
            digest = split.share_statement_digest(statement)
            if kept is None or kept["masked_sum"]["share_statement_sha256"] != digest:
                raise StageError("no masked sum is committed for this share statement: the server takes a "
                                 "share only after it has signed and kept the cohort's masked sum "
                                 "(POST .../split/commit)")
            split.verify_share(session.params, manifest, body, statement, session.roster.lookup_pub(party))
            taken = session.store.get_meta("split_result")
            if taken is not None:
                if taken["share_statement"] == statement:
                    return taken["masked_sum"]  # the same share again (a key holder's retry): nothing new
                raise RoundAlreadyClosed("the key holder's share was already taken; a share is taken once")
        except SecureAFLError as e:
            refuse(session, "split_collect", party, e)
            raise
        refused = dict(statement["refused"])
        signed = kept["masked_sum"]
        session.store.set_meta("split_result", {"share_statement": statement, "masked_sum": signed,
                                             "share_sha256": session.store.put_blob(body),
                                             "masked_sum_blob": kept["masked_sum_blob"]})
        for h, check in refused.items():
            # the key holder's signed share names it; the server's own verifier message is kept beside
            # and so is the key holder's own message: with the two, anyone recomputes the verdict; only the
            # hospital, from its own upload, can tell which of its upload and the server's message is false
            ev = (statement.get("evidence") or {}).get(h) or {}
            session.audit.append("split_validity", actor="hospital:" + h, outcome="refused",
                              session=session.config.session_id,
                              details={"check": check, "by": party, "share_sha256": statement["share_sha256"],
                                       "attribution": ev.get("attribution", JOINT_CHECK),
                                       "keyholder_message": ev.get("keyholder_message")})
        session.audit.append("split_collect", actor=party, outcome="accepted", session=session.config.session_id,
                          details={"share_sha256": statement["share_sha256"],
                                   "manifest_sha256": statement["manifest_sha256"],
                                   "masked_sum_sha256": signed["masked_sum_sha256"],
                                   "contributors": len(statement["cohort"])})
        log.info("[Stage release] split: the key holder's share taken over its cohort of %d",
                 len(statement["cohort"]))
        return signed


def result(session: ServerSession) -> bytes:
    """``{share_statement, share, masked_sum, aggregate}`` as JSON bytes: the key holder's signed share
    statement and share (base64), the server-signed masked-sum statement and the sealed masked sum over that
    statement's cohort (base64), once the share is taken: the record an auditor checks against the stored
    uploads. The key holder never forms its release from this answer, only from the sum it kept at the
    commitment (:func:`commit`)."""
    r = session.store.get_meta("split_result")
    if r is None:
        raise StageError("the key holder has not released its share yet")
    return json.dumps({"share_statement": r["share_statement"], "masked_sum": r["masked_sum"],
                       "share": base64.b64encode(session.store.get_blob(r["share_sha256"])).decode(),
                       "aggregate": base64.b64encode(session.store.get_blob(r["masked_sum_blob"])).decode()}
                      ).encode()


def _statement(session: ServerSession, event: str, party: str, raw: str | bytes | None, what: str) -> dict:
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
        refuse(session, event, party, err)
        raise err from None
    return statement


def commit_request(session: ServerSession, party: str, body: bytes) -> dict:
    """``POST .../split/commit``: the body is the key holder's signed share statement (no share)."""
    return commit(session, party, _statement(session, "split_commit", party, body, "request body"))


def collect_request(session: ServerSession, party: str, body: bytes, raw_statement: str | None) -> dict:
    """``POST .../split/share``: the key holder's share with its signed statement in the ``H_TAG``
    header."""
    return collect(session, party, body, _statement(session, "split_collect", party, raw_statement, f"{H_TAG} header"))
