"""The session and its roster: what the server runs, the key holder's public context, closing the round."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from secure_afl.exceptions import NotFound
from secure_afl.protocol import API

from .. import aggregator, closing, status
from ..session_state import ServerSession
from .gate import Gate, peer_of


def session_router(session: ServerSession, gate: Gate) -> APIRouter:
    router = APIRouter()

    @router.get(API + "/sessions/{session_id}")
    async def session_info(session_id: str, request: Request):
        gate.session(session_id, request)
        return JSONResponse(status.session_info(session))  # every hospital asks: json.dumps, not FastAPI's walk

    @router.get(API + "/sessions/{session_id}/status")
    async def session_status(session_id: str, request: Request):
        # signed for this session's path like every request; server.status.status_view says who sees what
        gate.session(session_id, request)
        party = await gate.authed(request, ("hospital", "keyholder", "server"))
        return JSONResponse(await run_in_threadpool(status.status_view, session, party, peer_of(request)))

    @router.get(API + "/sessions/{session_id}/context")
    async def get_context(session_id: str, request: Request):
        gate.session(session_id, request)
        if session.public_context is None:
            raise NotFound("no public context published")
        return Response(session.public_context, media_type="application/octet-stream")

    @router.post(API + "/sessions/{session_id}/context")
    async def publish_context(session_id: str, request: Request):
        gate.session(session_id, request)
        party, body = await gate.signed_body(request, ("keyholder",))
        return await run_in_threadpool(aggregator.publish_context, session, party, body)

    @router.post(API + "/sessions/{session_id}/close")
    async def close(session_id: str, request: Request):
        gate.session(session_id, request)
        party = await gate.authed(request, ("keyholder",))
        return await run_in_threadpool(closing.close, session, party)

    return router
