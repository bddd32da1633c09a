"""The aggregation server as a Flower ServerApp: it only sums, signs and audits.

Runs on: the SuperLink's machine (Flower starts it for ``flwr run``). It holds
the native server's state machine (:func:`secure_afl.server.aggregator.open_server`):
the same SQLite store, content-addressed payload files, hash-chained audit log,
signed receipts and server-signed manifest. Flower messages replace HTTP:

1. roll call: each SuperNode says which party it serves (routing only; every
   later statement is signed and checked against the PKI);
2. ckks: the key holder's signed context publication opens the session;
3. upload: each hospital's signed, protected contribution is validated, stored
   durably, added to the running sum and audited; the signed receipt goes back;
4. close: at least ``min_clients`` contributions, or nothing is released;
5. finalize: the aggregate, manifest, tag statements and the server-signed audit
   close record go to the key holder's SuperNode, which countersigns the close
   record (or refuses to decrypt), then verifies, reveals and solves W there (W
   never comes back); the countersignature is stored as the HTTP route stores it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

from flwr.app import Context, Message
from flwr.serverapp import Grid, ServerApp

from secure_afl.backends import HE_BACKENDS
from secure_afl.exceptions import MalformedPayload, SecureAFLError, StageError
from secure_afl.protocol import API
from secure_afl.signing import canonical_json
from secure_afl.server.aggregator import open_server
from secure_afl.server.config import load_config

from .messages import FINALIZE, PUBLISH, RECEIPT, ROLL_CALL, UPLOAD, pack, unpack_blob, unpack_json, unpack_str

__all__ = ["app", "run_session"]

log = logging.getLogger("secure_afl.flower.server")

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    try:
        report = run_session(grid, Path(str(rc["session-config"])), node_wait_s=float(rc["node-wait-s"]),
                             reply_timeout_s=float(rc["reply-timeout-s"]))
    except SecureAFLError as e:
        # one machine-readable line in the run's log stream (`flwr run --stream`, `flwr log`)
        log.error("secure-afl round refused: %s: %s", e.reason, e)
        raise
    log.warning("secure-afl round done: %s", json.dumps(report, sort_keys=True))


def run_session(grid: Grid, session_config: Path, *, node_wait_s: float, reply_timeout_s: float) -> dict:
    """One secure AFL round over ``grid``; returns the key holder's report."""
    config = load_config(session_config)
    if config.backend == "secagg":
        raise StageError("the Flower app carries plain, ckks and bfv sessions; run secagg with the native service")
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
            _uploads(grid, server, hosp_nodes, reply_timeout_s)
            server.close(config.name)
        aggregate, manifest = server.released()
        # the signed close record: the key holder countersigns it before it decrypts anything
        fields = {"info": server.info(), "manifest": manifest, "close": server.audit_head()["close"]}
        blob = aggregate
        if config.backend in HE_BACKENDS:
            # the key holder never decrypts a server-formed sum: it gets the signed uploads and re-sums them
            uploads = [(p["hospital"], server.contribution(p["hospital"])) for p in manifest["participants"]]
            fields.update(tags=server.tags(), contributions=[[h, len(b)] for h, b in uploads])
            blob = b"".join(b for _, b in uploads)
        reply = _one(grid, Message(content=pack(fields, blob), dst_node_id=kh_node, message_type=FINALIZE),
                     reply_timeout_s, "the key holder's finalize")
        # stored (and verified against the key holder's enrolled key) as POST /audit/countersign stores it
        server.store_countersign(f"keyholder:{config.keyholder}",
                                 canonical_json(unpack_json(reply.content, "countersign")))
        if "error" in reply.content["fields"]:
            raise StageError(f"the key holder's finalize failed: {unpack_str(reply.content, 'error')}: "
                             f"{unpack_str(reply.content, 'detail')}")
        return unpack_json(reply.content, "report")
    finally:
        server.shutdown()


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
            log.warning("node %s did not answer the roll call: %s", reply.metadata.src_node_id, reply.error.reason)
            continue
        try:
            parties[reply.metadata.src_node_id] = (unpack_str(reply.content, "role"),
                                                   unpack_str(reply.content, "name"))
        except SecureAFLError as e:  # a garbled answer only leaves that node out
            log.warning("node %s answered the roll call with %s", reply.metadata.src_node_id, e)
    log.info("roll call: %s", sorted(parties.values()))
    return parties


def _one(grid: Grid, msg: Message, timeout_s: float, what: str) -> Message:
    replies = list(grid.send_and_receive([msg], timeout=timeout_s))
    if not replies:
        raise StageError(f"no reply to {what} within {timeout_s:.0f} s")
    if replies[0].has_error():
        raise StageError(f"{what} failed: {replies[0].error.reason}")
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
    ctx = server.public_context if info["backend"] in HE_BACKENDS else b""
    msgs = [Message(content=pack({"info": info}, ctx), dst_node_id=nid, message_type=UPLOAD) for nid in nodes]
    answers = []
    for reply in grid.send_and_receive(msgs, timeout=timeout_s):
        if reply.has_error():
            log.warning("node %s sent no upload: %s", reply.metadata.src_node_id, reply.error.reason)
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
            log.warning("node %s did not accept its answer: %s", ack.metadata.src_node_id, ack.error.reason)
