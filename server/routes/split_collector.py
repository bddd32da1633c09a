"""split's routes: the server's verifier messages out; the key holder's share statement in and the server's
signed masked sum over its cohort out (the commitment); then the key holder's share in (server/split_round.py
decides, this maps)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from secure_afl.protocol import API, H_TAG

from .. import split_round
from ..session_state import ServerSession
from .gate import Gate


def split_router(session: ServerSession, gate: Gate) -> APIRouter:
    router = APIRouter()

    @router.post(API + "/sessions/{session_id}/split/commit")
    async def split_commit(session_id: str, request: Request):
        gate.session(session_id, request)
        party, body = await gate.signed_body(request, ("keyholder",))
        return JSONResponse(await run_in_threadpool(split_round.commit_request, session, party, body))

    @router.post(API + "/sessions/{session_id}/split/share")
    async def split_share(session_id: str, request: Request):
        gate.session(session_id, request)
        party, body = await gate.signed_body(request, ("keyholder",))
        return await run_in_threadpool(split_round.collect_request, session, party, body, request.headers.get(H_TAG))

    @router.get(API + "/sessions/{session_id}/split/verifier")
    async def split_verifier(session_id: str, request: Request):
        gate.session(session_id, request)
        await gate.authed(request, ("keyholder",))
        return JSONResponse(await run_in_threadpool(split_round.verifier_messages, session))

    @router.get(API + "/sessions/{session_id}/split/statements")
    async def split_statements(session_id: str, request: Request):
        gate.session(session_id, request)
        party = await gate.authed(request, ("keyholder",))
        return JSONResponse(await run_in_threadpool(split_round.split_statements, session,
                                                    request.query_params.get("after", "0"),
                                                    party))

    @router.post(API + "/sessions/{session_id}/split/queries")
    async def split_queries(session_id: str, request: Request):
        gate.session(session_id, request)
        party, body = await gate.signed_body(request, ("keyholder",))
        return JSONResponse(await run_in_threadpool(split_round.form_verifier_messages, session, party, body))

    @router.get(API + "/sessions/{session_id}/split/result")
    async def split_result(session_id: str, request: Request):
        gate.session(session_id, request)
        # the key holder's only: a hospital has no use for a masked sum it cannot open
        await gate.authed(request, ("keyholder",))
        return Response(await run_in_threadpool(split_round.result, session), media_type="application/json")

    return router
