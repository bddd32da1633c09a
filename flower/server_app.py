"""The aggregation server as a Flower ServerApp: it only sums, signs and audits.

Runs on: the SuperLink's machine (Flower starts it for ``flwr run``). It holds
the native server's state machine (:func:`secure_afl.server.rounds.open_server`):
the same SQLite store, content-addressed payload files, hash-chained audit log,
signed receipts and server-signed manifest. Flower messages replace HTTP:

1. roll call: each SuperNode says which party it serves (routing only; every
   later statement is signed and checked against the PKI);
2. ckks: the key holder's signed context publication opens the session;
3. upload: each hospital's signed, protected contribution is validated, stored
   durably, added to the running sum and audited; the signed receipt goes back;
   secagg instead: the native SecAgg round (:class:`SecAggAggregationServer`)
   is driven over Flower messages, one per hospital and stage (setup, advertise
   keys, share keys, masked input, consistency check, unmask); a hospital whose
   answer does not arrive before the stage clock runs out is dropped, exactly as
   over HTTP; the masked input is a signed upload with its receipt;
4. close: at least ``min_clients`` contributions, or nothing is released;
5. countersign: the server-signed audit close record and the manifest go to the
   key holder's SuperNode, whose countersignature is stored (as the HTTP route
   stores it) before anything is decrypted;
6. finalize: the aggregate (secagg: with the server's unmask material), manifest,
   tag statements and close record go to the key holder's SuperNode, which
   countersigns again (or refuses to decrypt), then verifies, reveals and solves
   W there (W never comes back).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import time
from pathlib import Path

try:
    from tomllib import TOMLDecodeError
except ImportError:  # Python 3.10
    from tomli import TOMLDecodeError

from flwr.app import Context, Message
from flwr.serverapp import Grid, ServerApp

from secure_afl.backends import HE_BACKENDS
from secure_afl.params import KEYED_BACKENDS
from secure_afl.exceptions import (
    InsufficientShares,
    InvalidParameterError,
    MalformedPayload,
    SecureAFLError,
    StageError,
)
from secure_afl.protocol import API, SECAGG_CONSISTENCY
from secure_afl.secagg import Stage
from secure_afl.encoding import canonical_json
from secure_afl.server.rounds import open_server
from secure_afl.server.config import load_config

from .records import (
    COUNTERSIGN,
    FINALIZE,
    PUBLISH,
    RECEIPT,
    ROLL_CALL,
    SECAGG,
    SPLIT_COMMIT,
    SPLIT_RESULT,
    SPLIT_QUERIES,
    UPLOAD,
    pack,
    unpack_blob,
    unpack_json,
    unpack_str,
)

__all__ = ["app", "run_session", "node_error"]

log = logging.getLogger("secure_afl.flower.server")

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    try:
        report = run_session(grid, Path(str(rc["session-config"])), node_wait_s=float(rc["node-wait-s"]),
                             reply_timeout_s=float(rc["reply-timeout-s"]))
    except SecureAFLError as e:
        # one machine-readable line in the run's log stream (`flwr run --stream`, `flwr log`) and no
        # traceback: a refusal is an outcome, not a crash. `flwr run` exits 0 either way (Flower's
        # choice), so the outcome is read from this line (docs/FLOWER.md).
        log.error("secure-afl round refused: %s: %s", e.reason, " ".join(str(e).split()))
        return
    log.warning("secure-afl round done: %s", json.dumps(report, sort_keys=True))


def run_session(grid: Grid, session_config: Path, *, node_wait_s: float, reply_timeout_s: float) -> dict:
    """One secure AFL round over ``grid``; returns the key holder's report."""
    try:
        config = load_config(session_config)
    except TOMLDecodeError as e:  # a typo in session.toml is a refusal (one line), not a crash
        raise InvalidParameterError(f"{session_config} is not valid TOML: {e}", reason="invalid_toml") from None
    server = open_server(config)
    try:
        hospitals = set(server.info()["hospitals"])
        parties = _roll_call(grid, len(hospitals) + 1, node_wait_s, reply_timeout_s)
        keyholders = [nid for nid, (role, name) in parties.items()
                      if role == "keyholder" and name == config.keyholder]
        if len(keyholders) != 1:
            raise StageError(f"exactly one SuperNode must serve the key holder {config.keyholder!r}; "
                             f"found {len(keyholders)}")
        kh_node = keyholders[0]
        if server.status == "awaiting_context":
            _publish(grid, server, kh_node, reply_timeout_s)
        hosp_nodes = [nid for nid, (role, _) in parties.items() if role == "hospital"]
        if server.status == "open":
            if config.backend == "secagg":
                _secagg_round(grid, server, {name: nid for nid, (role, name) in parties.items()
                                             if role == "hospital"}, reply_timeout_s)
            else:
                _uploads(grid, server, hosp_nodes, reply_timeout_s)
            server.close(config.name)
        aggregate, manifest = server.released()
        # the signed close record: stored countersigned before the key holder decrypts anything
        close = server.audit_head()["close"]
        reply = _one(grid, Message(content=pack({"manifest": manifest, "close": close}), dst_node_id=kh_node,
                                   message_type=COUNTERSIGN), reply_timeout_s, "the key holder's countersignature")
        if "error" in reply.content["fields"]:
            raise StageError(f"the key holder refused to countersign: {unpack_str(reply.content, 'error')}: "
                             f"{unpack_str(reply.content, 'detail')}")
        server.store_countersign(f"keyholder:{config.keyholder}",
                                 canonical_json(unpack_json(reply.content, "countersign")))
        fields = {"info": server.info(), "manifest": manifest, "close": close}
        if config.backend == "split":
            return _split_release(grid, server, config, kh_node, fields, reply_timeout_s)
        blob = aggregate
        if config.backend == "secagg":  # what removes the masks from the survivors' sum, and nothing more
            fields["unmask"] = server.unmask_material()
        if config.backend in HE_BACKENDS:
            # the key holder never decrypts a server-formed sum: it gets the signed uploads and re-sums them
            uploads = [(p["hospital"], server.contribution(p["hospital"])) for p in manifest["participants"]]
            fields.update(tags=server.tags(), contributions=[[h, len(b)] for h, b in uploads])
            blob = b"".join(b for _, b in uploads)
        reply = _one(grid, Message(content=pack(fields, blob), dst_node_id=kh_node, message_type=FINALIZE),
                     reply_timeout_s, "the key holder's finalize")
        # the same countersignature again (Ed25519 is deterministic); storing it is idempotent
        server.store_countersign(f"keyholder:{config.keyholder}",
                                 canonical_json(unpack_json(reply.content, "countersign")))
        if "error" in reply.content["fields"]:
            raise StageError(f"the key holder's finalize failed: {unpack_str(reply.content, 'error')}: "
                             f"{unpack_str(reply.content, 'detail')}")
        return unpack_json(reply.content, "report")
    finally:
        server.shutdown()


def _split_release(grid: Grid, server, config, kh_node: int, fields: dict, timeout_s: float) -> dict:
    """split, commit before reveal: the key holder gets the manifest, the hospitals' signed seed statements and
    the server's signed verifier messages -- no masked vector, no masked sum -- and answers with its signed share
    statement alone (its share kept); the server checks it against its own manifest and the signed policy, signs
    and stores the masked sum of exactly that statement's cohort (:meth:`commit`) and relays it; the key holder
    checks and keeps it, and only then answers with its share, which the server takes for the committed
    statement alone; the key holder forms the release from the sum it kept."""
    party = f"keyholder:{config.keyholder}"
    # the key holder's query seed per upload (from its own key and the signed commitment), then the server's
    # signed verifier message at each, as POST /split/queries forms them: the key holder decides each proof on
    # them before its share
    tags = server.tags()
    reply = _one(grid, Message(content=pack({"info": fields["info"], "tags": tags}, b""), dst_node_id=kh_node,
                               message_type=SPLIT_QUERIES), timeout_s, "the key holder's query seeds")
    _refused(reply, "the key holder sent no query seeds")
    queries = unpack_json(reply.content, "queries")
    verifier = server.form_verifier_messages(party, canonical_json(queries)) if queries else {}
    fields = {**fields, "tags": tags, "verifier": verifier, "split": True}
    reply = _one(grid, Message(content=pack(fields, b""), dst_node_id=kh_node,
                               message_type=FINALIZE), timeout_s, "the key holder's split share statement")
    server.store_countersign(party, canonical_json(unpack_json(reply.content, "countersign")))
    _refused(reply, "the key holder released no share")
    statement = unpack_json(reply.content, "share_statement")
    if not isinstance(statement, dict):
        raise MalformedPayload("the share statement is not a JSON object")
    small = {"info": fields["info"], "manifest": fields["manifest"]}
    reply = _one(grid, Message(content=pack({**small, "commitment": server.commit(party, statement)}, b""),
                               dst_node_id=kh_node, message_type=SPLIT_COMMIT), timeout_s, "the key holder's share")
    _refused(reply, "the key holder refused the committed masked sum")
    server.collect(party, unpack_blob(reply.content), statement)
    reply = _one(grid, Message(content=pack(small, b""), dst_node_id=kh_node, message_type=SPLIT_RESULT),
                 timeout_s, "the key holder's model")
    _refused(reply, "the key holder formed no release")
    return unpack_json(reply.content, "report")


def _refused(reply, what: str) -> None:
    if "error" in reply.content["fields"]:
        raise StageError(f"{what}: {unpack_str(reply.content, 'error')}: {unpack_str(reply.content, 'detail')}")


def _roll_call(grid: Grid, expected: int, wait_s: float, timeout_s: float) -> dict[int, tuple[str, str]]:
    """node id -> (role, name) for every SuperNode connected within ``wait_s``."""
    deadline = time.monotonic() + wait_s
    nodes = list(grid.get_node_ids())
    while len(nodes) < expected and time.monotonic() < deadline:
        time.sleep(0.5)  # SuperNodes register with the SuperLink on their own schedule
        nodes = list(grid.get_node_ids())
    msgs = [Message(content=pack(), dst_node_id=nid, message_type=ROLL_CALL) for nid in nodes]
    parties = {}
    for reply in grid.send_and_receive(msgs, timeout=timeout_s):
        if reply.has_error():
            log.warning("node %s did not answer the roll call: %s: %s", reply.metadata.src_node_id,
                        *node_error(reply.error))
            continue
        try:
            parties[reply.metadata.src_node_id] = (unpack_str(reply.content, "role"),
                                                   unpack_str(reply.content, "name"))
        except SecureAFLError as e:  # a garbled answer only leaves that node out
            log.warning("node %s answered the roll call with %s", reply.metadata.src_node_id, e)
    log.info("roll call: %s", sorted(parties.values()))
    return parties


# how a SuperNode reports an exception its ClientApp raised: "<class 'module.Name'>:<'message'>"
_CLIENTAPP_EXCEPTION = re.compile(r"^<class '([\w.]+)'>:<'(.*)'>$", re.S)


def node_error(error) -> tuple[str, str]:
    """``(reason, message)`` of a node's error reply: the secure-afl reason of the exception its ClientApp
    raised, never Flower's class repr of it (``node_error`` for anything that is not a secure-afl refusal)."""
    import secure_afl.exceptions as exceptions

    text = str(getattr(error, "reason", "") or "")
    m = _CLIENTAPP_EXCEPTION.match(text)
    if m is None:
        return "node_error", " ".join(text.split()) or "the node reported an error without a reason"
    cls = getattr(exceptions, m.group(1).rpartition(".")[2], None)
    known = isinstance(cls, type) and issubclass(cls, exceptions.SecureAFLError)
    return (cls.reason if known else "node_error"), " ".join(m.group(2).split())


def _one(grid: Grid, msg: Message, timeout_s: float, what: str) -> Message:
    replies = list(grid.send_and_receive([msg], timeout=timeout_s))
    if not replies:
        raise StageError(f"no reply to {what} within {timeout_s:.0f} s")
    if replies[0].has_error():
        reason, text = node_error(replies[0].error)
        raise StageError(f"{what} failed: {text}", reason=reason)
    return replies[0]


def _publish(grid: Grid, server, kh_node: int, timeout_s: float) -> None:
    """The key holder's signed publication, checked exactly as the HTTP endpoint checks it."""
    path = f"{API}/sessions/{server.config.session_id}/context"
    reply = _one(grid, Message(content=pack({"session_id": server.config.session_id, "path": path}),
                               dst_node_id=kh_node, message_type=PUBLISH), timeout_s, "the context publication")
    headers, body = unpack_json(reply.content, "headers"), unpack_blob(reply.content)
    if not isinstance(headers, dict):
        raise MalformedPayload("publication headers must be a JSON object")
    # the signature covers the body's digest, as the HTTP route checks it before reading the body
    party = server.authenticate({str(k): str(v) for k, v in headers.items()}, "POST", path,
                                hashlib.sha256(body).hexdigest(), roles=("keyholder",))
    server.publish_context(party, body)


def _uploads(grid: Grid, server, nodes: list[int], timeout_s: float) -> None:
    """Each hospital's signed upload through the native server's ``submit``; the receipt goes back."""
    info = server.info()
    ctx = server.public_context if info["backend"] in KEYED_BACKENDS else b""
    msgs = [Message(content=pack({"info": info}, ctx), dst_node_id=nid, message_type=UPLOAD) for nid in nodes]
    answers = []
    for reply in grid.send_and_receive(msgs, timeout=timeout_s):
        if reply.has_error():
            log.warning("node %s sent no upload: %s: %s", reply.metadata.src_node_id, *node_error(reply.error))
            continue
        hospital = "anonymous"
        try:
            hospital = unpack_str(reply.content, "hospital")
            statement, tag = unpack_json(reply.content, "statement"), unpack_json(reply.content, "tag")
            payload = unpack_blob(reply.content)
        except SecureAFLError as e:
            server.refuse("upload", hospital, e, {"transport": "flower"})
            answers.append((reply, {"error": e.reason, "detail": str(e)}))
            continue
        try:
            answers.append((reply, {"receipt": server.submit(hospital, statement, payload, tag)}))
        except SecureAFLError as e:  # refused and audited by submit; the hospital learns why
            answers.append((reply, {"error": e.reason, "detail": str(e)}))
    receipts = [Message(content=pack(body), dst_node_id=reply.metadata.src_node_id, message_type=RECEIPT)
                for reply, body in answers]
    for ack in grid.send_and_receive(receipts, timeout=timeout_s):
        if ack.has_error():
            log.warning("node %s did not accept its answer: %s: %s", ack.metadata.src_node_id, *node_error(ack.error))


def _secagg_round(grid: Grid, server, hospitals: dict[str, int], reply_timeout_s: float) -> None:
    """The native SecAgg round with Flower messages in place of the hospitals' polls.

    Each hospital is asked what the server's ``secagg_request`` would answer
    its poll, once per stage, and its answer goes through the same methods as
    the HTTP routes (authenticated by the hospital's signature, refused and
    audited there). The server's own stage clock closes a stage when everyone
    answered or ``stage_timeout_s`` passed: an answer Flower did not deliver in
    time is a dropout, and the round finishes if enough hospitals survive.
    """
    sid = server.config.session_id
    info = server.info()
    nodes = {name: nid for name, nid in hospitals.items() if name in server.client_ids}
    asked: set[tuple[str, str]] = set()
    pending: dict[str, tuple[str, str]] = {}  # Flower message id -> (hospital, phase)
    stage, progress = None, time.monotonic()
    limit = reply_timeout_s + server.config.stage_timeout_s
    # One Flower run drives one SecAgg round: the native service's retry under a new round number needs
    # hospitals that poll again, so a poll must not open round r + 1 here once the clock has aborted round r.
    first = server.round_number
    server.open_round(server.config.name)
    while server.round_stage not in ("done", "aborted") and server.round_number == first:
        if server.round_stage != stage:
            stage, progress = server.round_stage, time.monotonic()
        elif time.monotonic() - progress > limit:
            raise StageError(f"the secagg round made no progress in {stage} for {limit:.0f} s")
        out = []
        for name, nid in nodes.items():
            r = server.secagg_request_in_round(name)  # None: the stage clock (another thread) aborted the round
            if r is None:
                break
            if "survivors" in r:
                phase, fields, blob = SECAGG_CONSISTENCY, {"survivors": r["survivors"]}, None
            elif "request" in r:
                phase, fields, blob = r["stage"], {"signature": r["signature"]}, base64.b64decode(r["request"])
            else:  # dropped, waiting for the others, or the round is over
                continue
            if (name, phase) in asked:
                continue
            asked.add((name, phase))
            if phase == Stage.SETUP:
                fields["info"] = info
            out.append(((name, phase), Message(content=pack({"stage": phase, "session_id": sid, **fields}, blob),
                                               dst_node_id=nid, message_type=SECAGG)))
        if out:
            for (who, _), mid in zip(out, grid.push_messages([m for _, m in out])):
                if mid:
                    pending[mid] = who
        if pending:
            for reply in grid.pull_messages(list(pending)):
                who = pending.pop(reply.metadata.reply_to_message_id, None)
                if who is not None and who[1] != "receipt":
                    receipt = _secagg_answer(server, *who, reply)
                    if receipt is not None:
                        ack = Message(content=pack(receipt), dst_node_id=nodes[who[0]], message_type=RECEIPT)
                        for mid in grid.push_messages([ack]):
                            if mid:
                                pending[mid] = (who[0], "receipt")
                elif who is not None and reply.has_error():
                    log.warning("%s did not keep its receipt: %s", who[0], reply.error.reason)
        time.sleep(0.2)  # bounded by the stage clock above; Flower has no push to the ServerApp
    if server.round_stage != "done":
        raise InsufficientShares("the secagg round aborted: too few hospitals survived; nothing was revealed")


def _secagg_answer(server, hospital: str, phase: str, reply: Message) -> dict | None:
    """Feed one hospital's answer to the native round; for a masked input, the answer for its receipt."""
    if reply.has_error():  # the hospital refused (its guards) or failed: silent for the round
        log.warning("%s did not answer %s: %s", hospital, phase, reply.error.reason)
        return None
    sid = server.config.session_id
    try:
        body = unpack_blob(reply.content)
        if phase == Stage.MASKED_INPUT:
            statement = unpack_json(reply.content, "statement")
            claimed = statement.get("hospital") if isinstance(statement, dict) else None
            return {"receipt": server.submit(str(claimed), statement, body)}
        headers = unpack_json(reply.content, "headers")
        if not isinstance(headers, dict):
            raise MalformedPayload("request headers must be a JSON object")
        path = f"{API}/sessions/{sid}/secagg/{phase}"
        party = server.authenticate({str(k): str(v) for k, v in headers.items()}, "POST", path,
                                    hashlib.sha256(body).hexdigest(), roles=("hospital",))
        name = party.partition(":")[2]
        if phase == SECAGG_CONSISTENCY:
            server.secagg_consistency(name, body)
        else:
            server.secagg_message(name, phase, body)
    except MalformedPayload as e:  # unreadable before any identity is proven
        server.refuse(f"secagg_{phase}"[:64], None, e, {"transport": "flower"})
        log.warning("answer routed as %s for %s refused: %s", hospital, phase, e)
    except SecureAFLError as e:  # refused and audited by the native method
        log.warning("answer routed as %s for %s refused: %s: %s", hospital, phase, e.reason, e)
        if phase == Stage.MASKED_INPUT:
            return {"error": e.reason, "detail": str(e)}
    return None
