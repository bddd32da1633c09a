"""HTTP boundary of the aggregation server (FastAPI, served by uvicorn over mTLS).

Only mapping lives here: every decision is made by
:class:`~secure_afl.server.aggregator.AggregationServer`, every refusal is a 4xx
with a machine-readable ``{"error": reason, "detail": ...}`` body and an audit
record, and nothing is stored for a refused request.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from secure_afl.exceptions import Forbidden, MalformedPayload, NotFound, SecureAFLError, TooLarge, http_status
from secure_afl.protocol import API, H_TAG, H_UPLOAD

from .aggregator import AggregationServer

__all__ = ["create_app"]

log = logging.getLogger("secure_afl.server")


def _error(status: int, reason: str, detail: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": reason, "detail": detail})


async def _read_body(request: Request, cap: int) -> bytes:
    """Read at most ``cap`` bytes; refuse larger bodies without buffering them."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > cap:
                raise TooLarge(f"body of {declared} bytes exceeds the cap of {cap}")
        except ValueError:
            raise MalformedPayload("bad Content-Length") from None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise TooLarge(f"body exceeds the cap of {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(server: AggregationServer) -> FastAPI:
    app = FastAPI(title="secure-afl aggregation server", version="1", docs_url=None, redoc_url=None)
    app.state.server = server
    sid = server.config.session_id
    cap = server.config.max_upload_bytes

    @app.exception_handler(SecureAFLError)
    async def _refused(request: Request, exc: SecureAFLError):
        return _error(http_status(exc), exc.reason, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return _error(400, "malformed", "request does not match the API")

    def _session(session_id: str, request: Request) -> None:
        if session_id != sid:
            err = NotFound(f"unknown session {session_id[:64]!r}; this server runs session {sid!r}")
            server.refuse("request", request.headers.get("x-safl-party", "anonymous"), err,
                          {"path": request.url.path[:200]})
            raise err

    async def _authed(request: Request, roles: tuple[str, ...], body: bytes = b"") -> str:
        return server.authenticate(request.headers, request.method, request.url.path, body, roles=roles)

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
        body = await _read_body(request, cap)
        party = await _authed(request, ("keyholder",), body)
        return server.publish_context(party, body)

    @app.post(API + "/sessions/{session_id}/uploads")
    async def upload(session_id: str, request: Request):
        _session(session_id, request)
        raw = request.headers.get(H_UPLOAD)
        hospital = "anonymous"
        try:
            statement = json.loads(raw) if raw else None
            if not isinstance(statement, dict):
                raise MalformedPayload(f"missing or malformed {H_UPLOAD} header (the signed upload statement)")
            hospital = str(statement.get("hospital", "anonymous"))[:64]
            raw_tag = request.headers.get(H_TAG)
            tag = json.loads(raw_tag) if raw_tag else None
            body = await _read_body(request, cap)
        except json.JSONDecodeError:
            err = MalformedPayload(f"{H_UPLOAD} or {H_TAG} header is not JSON")
            server.refuse("upload", hospital, err)
            raise err from None
        except SecureAFLError as e:
            server.refuse("upload", hospital, e)
            raise
        # CPU-bound validation (ciphertext parsing) runs off the event loop.
        return await run_in_threadpool(server.submit, hospital, statement, body, tag)

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
        blob, _ = server.released()
        return Response(blob, media_type="application/octet-stream")

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

    extra = getattr(server, "register_routes", None)
    if extra is not None:
        extra(app, _session, _authed, _read_body)
    return app
