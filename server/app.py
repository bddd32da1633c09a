"""HTTP boundary of the aggregation server (FastAPI, served by uvicorn over mTLS).

Every HTTP route of the server lives here, secagg's rounds and split's share,
verifier and result routes included.
Only mapping lives here: every decision is made by
:class:`~secure_afl.server.aggregator.AggregationServer`, every refusal is a 4xx
with a machine-readable ``{"error": reason, "detail": ...}`` body and an audit
record, and nothing is stored for a refused request.

Order of work for a request with a body: the signed headers are checked
(signature, enrolment, binding to the TLS certificate, nonce) before a byte of
the body is read; then the body is streamed under a size cap, a per-chunk read
timeout, a whole-body deadline and a cap on bodies read at once, and checked
against the digest the signature covers. An unauthenticated caller therefore
costs the server its headers only (bounded by h11 and the header timeout in
server/tls_server.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from secure_afl.exceptions import (
    Forbidden,
    InternalError,
    InvalidSignature,
    MalformedPayload,
    NotFound,
    RequestTimeout,
    SecureAFLError,
    ServerBusy,
    TooLarge,
    http_status,
)
from secure_afl.protocol import API, H_BODY, H_TAG, H_UPLOAD, SECAGG_COMPLAINT, SECAGG_CONSISTENCY
from secure_afl.encoding import parse_json

from .aggregator import AggregationServer
from .secagg_round import SecAggAggregationServer
from .split_round import SplitAggregationServer

__all__ = ["create_app"]

log = logging.getLogger("secure_afl.server")

_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _error(status: int, reason: str, detail: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": reason, "detail": detail})


def _peer(request: Request) -> dict | None:
    """The transport's record of the TLS connection (server/tls_server.py); None in process."""
    return request.scope.get("state", {}).get("tls_peer")


class _LastResort:
    """ASGI wrapper: an exception nothing else handled becomes an audited JSON answer, not a traceback.

    Deep recursion is what untrusted input causes (a parser fed a nested
    document), so it is a 400; anything else is a 500 with a reason and an
    audit record, and the server log gets one line.
    """

    def __init__(self, app, server: AggregationServer):
        self.app, self.server = app, server

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def _send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, _send)
        except ClientDisconnect:
            return
        except Exception as exc:  # noqa: BLE001 - the boundary: nothing escapes as a traceback
            if isinstance(exc, RecursionError):
                err = MalformedPayload("input nested too deeply")
            else:
                err = InternalError(f"internal error ({type(exc).__name__})")
                # the traceback goes to the operator's log only; the client gets the type name
                log.error("internal error on %s %s: %s", scope.get("method"), scope.get("path"),
                          type(exc).__name__, exc_info=exc)
            try:
                self.server.refuse("request", None, err, {"path": str(scope.get("path"))[:200]},
                                   peer=scope.get("state", {}).get("tls_peer"))
            except Exception:  # noqa: BLE001 - the audit failure itself is logged, the answer still goes out
                log.error("could not audit an internal error")
            if not started:
                status = http_status(err)
                await _error(status, err.reason, str(err))(scope, receive, send)


def create_app(server: AggregationServer) -> FastAPI:
    app = FastAPI(title="secure-afl aggregation server", version="1", docs_url=None, redoc_url=None)
    app.state.server = server
    cfg = server.config
    sid = cfg.session_id
    cap = cfg.max_upload_bytes
    # bodies read at once; made on first use so it belongs to the serving event loop. A request
    # waiting for a slot holds its headers and at most uvicorn's flow-control buffer of body.
    slots: list[asyncio.Semaphore] = []

    @app.exception_handler(SecureAFLError)
    async def _refused(request: Request, exc: SecureAFLError):
        return _error(http_status(exc), exc.reason, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        err = MalformedPayload("request does not match the API")
        server.refuse("request", None, err, {"path": request.url.path[:200]}, peer=_peer(request))
        return _error(400, "malformed", str(err))

    def _session(session_id: str, request: Request) -> None:
        if session_id != sid:
            err = NotFound(f"unknown session {session_id[:64]!r}; this server runs session {sid!r}")
            server.refuse("request", None, err, {"path": request.url.path[:200]}, peer=_peer(request))
            raise err

    async def _authed(request: Request, roles: tuple[str, ...], body: bytes | None = None) -> str:
        """The signed party of a request without a body (or whose body is already known)."""
        digest = _EMPTY_SHA256 if body is None else hashlib.sha256(body).hexdigest()
        return server.authenticate(request.headers, request.method, request.url.path, digest, roles=roles,
                                   peer=_peer(request))

    async def _stream(request: Request, party: str, event: str, expected_sha256: str) -> bytes:
        """The body of an authenticated request: capped, timed, counted, checked against its digest."""
        peer = _peer(request)
        if not slots:
            slots.append(asyncio.Semaphore(cfg.max_concurrent_uploads))
        try:
            declared = request.headers.get("content-length")
            if declared is not None:
                if not declared.isdigit():
                    raise MalformedPayload("bad Content-Length")
                if int(declared) > cap:
                    raise TooLarge(f"body of {declared} bytes exceeds the cap of {cap}")
            try:
                await asyncio.wait_for(slots[0].acquire(), timeout=cfg.read_timeout_s)
            except asyncio.TimeoutError:
                raise ServerBusy(f"{cfg.max_concurrent_uploads} request bodies are being read; retry later") from None
        except SecureAFLError as e:
            server.refuse(event, party, e, peer=peer)
            raise
        try:
            h, chunks, size = hashlib.sha256(), [], 0
            deadline = time.monotonic() + cfg.body_timeout_s
            it = request.stream().__aiter__()
            while True:
                left = min(cfg.read_timeout_s, deadline - time.monotonic())
                if left <= 0:
                    raise RequestTimeout(f"the body did not arrive within {cfg.body_timeout_s:g} s")
                try:
                    chunk = await asyncio.wait_for(it.__anext__(), timeout=left)
                except StopAsyncIteration:
                    break
                except asyncio.TimeoutError:
                    raise RequestTimeout(f"no body data for {left:.0f} s") from None
                except ClientDisconnect:
                    raise MalformedPayload("the client disconnected mid-body", reason="disconnected") from None
                size += len(chunk)
                if size > cap:
                    raise TooLarge(f"body exceeds the cap of {cap} bytes")
                h.update(chunk)
                chunks.append(chunk)
            if h.hexdigest() != expected_sha256:
                raise InvalidSignature()  # the signature covers another body
            return b"".join(chunks)
        except SecureAFLError as e:
            server.refuse(event, party, e, peer=peer)
            raise
        finally:
            slots[0].release()

    async def _signed_body(request: Request, roles: tuple[str, ...]) -> tuple[str, bytes]:
        """Authenticate from the headers (the signature covers the body digest), then read the body."""
        digest = request.headers.get(H_BODY, "")
        party = server.authenticate(request.headers, request.method, request.url.path, digest, roles=roles,
                                    peer=_peer(request))
        return party, await _stream(request, party, "request", digest)

    @app.get(f"{API}/health")
    async def health():
        return {"ok": True, "session": sid, "status": server.status}

    @app.get(API + "/sessions/{session_id}")
    async def session_info(session_id: str, request: Request):
        _session(session_id, request)
        return server.info()

    @app.get(API + "/sessions/{session_id}/context")
    async def get_context(session_id: str, request: Request):
        _session(session_id, request)
        if server.public_context is None:
            raise NotFound("no public context published")
        return Response(server.public_context, media_type="application/octet-stream")

    @app.post(API + "/sessions/{session_id}/context")
    async def publish_context(session_id: str, request: Request):
        _session(session_id, request)
        party, body = await _signed_body(request, ("keyholder",))
        return await run_in_threadpool(server.publish_context, party, body)

    @app.post(API + "/sessions/{session_id}/uploads")
    async def upload(session_id: str, request: Request):
        _session(session_id, request)
        peer = _peer(request)
        raw, raw_tag = request.headers.get(H_UPLOAD), request.headers.get(H_TAG)
        try:
            if not raw:
                raise MalformedPayload(f"missing {H_UPLOAD} header (the signed upload statement)")
            statement = parse_json(raw, f"{H_UPLOAD} header")
            tag = parse_json(raw_tag, f"{H_TAG} header") if raw_tag else None
        except SecureAFLError as e:
            server.refuse("upload", None, e, peer=peer)
            raise
        hospital = server.authenticate_upload(statement, peer)
        body = await _stream(request, hospital, "upload", statement["payload_sha256"])
        # CPU-bound validation (ciphertext parsing) runs off the event loop.
        # _stream checked the body against this digest while it arrived: submit need not hash it again
        return await run_in_threadpool(lambda: server.submit(hospital, statement, body, tag, peer=peer,
                                                             payload_sha256=statement["payload_sha256"]))

    @app.get(API + "/sessions/{session_id}/receipts/{hospital}")
    async def receipt(session_id: str, hospital: str, request: Request):
        _session(session_id, request)
        party = await _authed(request, ("hospital", "keyholder"))
        if party.startswith("hospital:") and party != f"hospital:{hospital}":
            raise Forbidden("a hospital may read only its own receipt")
        return server.receipt(hospital)

    @app.post(API + "/sessions/{session_id}/close")
    async def close(session_id: str, request: Request):
        _session(session_id, request)
        party = await _authed(request, ("keyholder",))
        return await run_in_threadpool(server.close, party)

    @app.get(API + "/sessions/{session_id}/aggregate")
    async def aggregate(session_id: str, request: Request):
        _session(session_id, request)
        await _authed(request, ("keyholder",))
        return Response(server.masked_aggregate(), media_type="application/octet-stream")

    @app.get(API + "/sessions/{session_id}/contributions/{hospital}")
    async def contribution(session_id: str, hospital: str, request: Request):
        _session(session_id, request)
        await _authed(request, ("keyholder",))
        return Response(server.contribution(hospital), media_type="application/octet-stream")

    @app.get(API + "/sessions/{session_id}/tags")
    async def tags(session_id: str, request: Request):
        _session(session_id, request)
        await _authed(request, ("keyholder",))
        return server.tags()

    @app.get(API + "/sessions/{session_id}/manifest")
    async def manifest(session_id: str, request: Request):
        _session(session_id, request)
        await _authed(request, ("keyholder", "hospital"))
        return server.released()[1]

    @app.get(API + "/sessions/{session_id}/audit/head")
    async def audit_head(session_id: str, request: Request):
        _session(session_id, request)
        await _authed(request, ("keyholder", "hospital"))
        return server.audit_head()

    @app.post(API + "/sessions/{session_id}/audit/countersign")
    async def audit_countersign(session_id: str, request: Request):
        _session(session_id, request)
        party, body = await _signed_body(request, ("keyholder",))
        return await run_in_threadpool(server.store_countersign, party, body)

    if isinstance(server, SecAggAggregationServer):
        _secagg_routes(app, server, _session, _authed, _signed_body)
    if isinstance(server, SplitAggregationServer):
        _split_routes(app, server, _session, _authed, _signed_body)
    app.add_middleware(_LastResort, server=server)
    return app


def _secagg_routes(app: FastAPI, server: SecAggAggregationServer, session_guard, authed, read_body) -> None:
    """secagg's key-exchange and unmask rounds (server/secagg_round.py decides, this maps)."""

    @app.get(API + "/sessions/{session_id}/secagg/request")
    async def secagg_request(session_id: str, request: Request):
        session_guard(session_id, request)
        party = await authed(request, ("hospital",))
        return server.secagg_request(party.partition(":")[2])

    @app.post(API + "/sessions/{session_id}/secagg/{stage}")
    async def secagg_message(session_id: str, stage: str, request: Request):
        session_guard(session_id, request)
        party, body = await read_body(request, ("hospital",))
        if stage == SECAGG_CONSISTENCY:
            return server.secagg_consistency(party.partition(":")[2], body)
        if stage == SECAGG_COMPLAINT:
            return server.secagg_complaint(party.partition(":")[2], body)
        return server.secagg_message(party.partition(":")[2], stage, body)

    @app.get(API + "/sessions/{session_id}/secagg/unmask-material")
    async def unmask_material(session_id: str, request: Request):
        session_guard(session_id, request)
        await authed(request, ("keyholder",))
        return server.unmask_material()


def _split_routes(app: FastAPI, server: SplitAggregationServer, session_guard, authed, read_body) -> None:
    """split's collector: the key holder's share in, the server's verifier messages and the release out
    (server/split_round.py decides, this maps)."""

    @app.post(API + "/sessions/{session_id}/split/share")
    async def split_share(session_id: str, request: Request):
        session_guard(session_id, request)
        party, body = await read_body(request, ("keyholder",))
        return await run_in_threadpool(server.collect_request, party, body, request.headers.get(H_TAG))

    @app.get(API + "/sessions/{session_id}/split/verifier")
    async def split_verifier(session_id: str, request: Request):
        session_guard(session_id, request)
        await authed(request, ("keyholder",))
        return await run_in_threadpool(server.verifier_messages)

    @app.get(API + "/sessions/{session_id}/split/statements")
    async def split_statements(session_id: str, request: Request):
        session_guard(session_id, request)
        await authed(request, ("keyholder",))
        return await run_in_threadpool(server.split_statements)

    @app.post(API + "/sessions/{session_id}/split/queries")
    async def split_queries(session_id: str, request: Request):
        session_guard(session_id, request)
        party, body = await read_body(request, ("keyholder",))
        return await run_in_threadpool(server.form_verifier_messages, party, body)

    @app.get(API + "/sessions/{session_id}/split/result")
    async def split_result(session_id: str, request: Request):
        session_guard(session_id, request)
        await authed(request, ("keyholder", "hospital"))
        return Response(server.result(), media_type="application/json")
