"""split's routes: the server's verifier messages out; the key holder's share statement in and the server's
signed masked sum over its cohort out (the commitment); then the key holder's share in (server/split_round.py
decides, this maps)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from secure_afl.protocol import API, H_TAG

from ..split_round import SplitAggregationServer
from .gate import Gate


def split_router(server: SplitAggregationServer, gate: Gate) -> APIRouter:
    router = APIRouter()

    @router.post(API + "/sessions/{session_id}/split/commit")
    async def split_commit(session_id: str, request: Request):
        gate.session(session_id, request)
        party, body = await gate.signed_body(request, ("keyholder",))
        return JSONResponse(await run_in_threadpool(server.commit_request, party, body))

    @router.post(API + "/sessions/{session_id}/split/share")
    async def split_share(session_id: str, request: Request):
        gate.session(session_id, request)
        party, body = await gate.signed_body(request, ("keyholder",))
        return await run_in_threadpool(server.collect_request, party, body, request.headers.get(H_TAG))

    @router.get(API + "/sessions/{session_id}/split/verifier")
    async def split_verifier(session_id: str, request: Request):
        gate.session(session_id, request)
        await gate.authed(request, ("keyholder",))
        return JSONResponse(await run_in_threadpool(server.verifier_messages))

    @router.get(API + "/sessions/{session_id}/split/statements")
    async def split_statements(session_id: str, request: Request):
        gate.session(session_id, request)
        party = await gate.authed(request, ("keyholder",))
        return JSONResponse(await run_in_threadpool(server.split_statements, request.query_params.get("after", "0"),
                                                    party))

    @router.post(API + "/sessions/{session_id}/split/queries")
    async def split_queries(session_id: str, request: Request):
        gate.session(session_id, request)
        party, body = await gate.signed_body(request, ("keyholder",))
        return JSONResponse(await run_in_threadpool(server.form_verifier_messages, party, body))

    @router.get(API + "/sessions/{session_id}/split/result")
    async def split_result(session_id: str, request: Request):
        gate.session(session_id, request)
        # the key holder's only: a hospital has no use for a masked sum it cannot open
        await gate.authed(request, ("keyholder",))
        return Response(await run_in_threadpool(server.result), media_type="application/json")

    return router
