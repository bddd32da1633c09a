"""What every route passes first: the session id, the signed headers, and (for a body) the capped, timed,
digest-checked read; and the last-resort answer for an exception nothing else handled."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from secure_afl.exceptions import (
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
from secure_afl.protocol import H_BODY

from .. import peer_auth
from ..session_state import ServerSession

log = logging.getLogger("secure_afl.server")

_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def error_response(status: int, reason: str, detail: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": reason, "detail": detail})


def peer_of(request: Request) -> dict | None:
    """The transport's record of the TLS connection (server/tls_server.py); None in process."""
    return request.scope.get("state", {}).get("tls_peer")


def _target(request: Request) -> str:
    """What a request's signature covers: the path, and its query where it has one (so a relayed or altered
    ``?after=`` fails the signature like an altered path)."""
    query = request.url.query
    return request.url.path + ("?" + query if query else "")


class Gate:
    """One app's checks before a route decides anything."""

    def __init__(self, server: ServerSession):
        self.server = server
        # bodies read at once; made on first use so it belongs to the serving event loop. A request
        # waiting for a slot holds its headers and at most uvicorn's flow-control buffer of body.
        self.slots: list[asyncio.Semaphore] = []

    def session(self, session_id: str, request: Request) -> None:
        sid = self.server.config.session_id
        if session_id != sid:
            err = NotFound(f"unknown session {session_id[:64]!r}; this server runs session {sid!r}")
            peer_auth.refuse(self.server, "request", None, err, {"path": request.url.path[:200]}, peer=peer_of(request))
            raise err

    async def authed(self, request: Request, roles: tuple[str, ...], body: bytes | None = None) -> str:
        """The signed party of a request without a body (or whose body is already known)."""
        digest = _EMPTY_SHA256 if body is None else hashlib.sha256(body).hexdigest()
        return peer_auth.authenticate(self.server, request.headers, request.method, _target(request), digest,
                                      roles=roles,
                                      peer=peer_of(request))

    async def stream(self, request: Request, party: str, event: str, expected_sha256: str) -> bytes:
        """The body of an authenticated request: capped, timed, counted, checked against its digest."""
        cfg, cap = self.server.config, self.server.config.max_upload_bytes
        peer = peer_of(request)
        if not self.slots:
            self.slots.append(asyncio.Semaphore(cfg.max_concurrent_uploads))
        try:
            declared = request.headers.get("content-length")
            if declared is not None:
                if not declared.isdigit():
                    raise MalformedPayload("bad Content-Length")
                if int(declared) > cap:
                    raise TooLarge(f"body of {declared} bytes exceeds the cap of {cap}")
            try:
                await asyncio.wait_for(self.slots[0].acquire(), timeout=cfg.read_timeout_s)
            except asyncio.TimeoutError:
                raise ServerBusy(f"{cfg.max_concurrent_uploads} request bodies are being read; retry later") from None
        except SecureAFLError as e:
            peer_auth.refuse(self.server, event, party, e, peer=peer)
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
            peer_auth.refuse(self.server, event, party, e, peer=peer)
            raise
        finally:
            self.slots[0].release()

    async def signed_body(self, request: Request, roles: tuple[str, ...]) -> tuple[str, bytes]:
        """Authenticate from the headers (the signature covers the body digest), then read the body."""
        digest = request.headers.get(H_BODY, "")
        party = peer_auth.authenticate(self.server, request.headers, request.method, _target(request), digest,
                                       roles=roles,
                                       peer=peer_of(request))
        return party, await self.stream(request, party, "request", digest)


class LastResort:
    """ASGI wrapper: an exception nothing else handled becomes an audited JSON answer, not a traceback.

    Deep recursion is what untrusted input causes (a parser fed a nested
    document), so it is a 400; anything else is a 500 with a reason and an
    audit record, and the server log gets one line.
    """

    def __init__(self, app, server: ServerSession):
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
                peer_auth.refuse(self.server, "request", None, err, {"path": str(scope.get("path"))[:200]},
                                 peer=scope.get("state", {}).get("tls_peer"))
            except Exception:  # noqa: BLE001 - the audit failure itself is logged, the answer still goes out
                log.error("could not audit an internal error")
            if not started:
                status = http_status(err)
                await error_response(status, err.reason, str(err))(scope, receive, send)
