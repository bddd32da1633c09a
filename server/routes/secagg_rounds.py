"""secagg's key-exchange and unmask rounds (server/secagg_round.py decides, this maps)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from secure_afl.protocol import API, SECAGG_COMPLAINT, SECAGG_CONSISTENCY

from .. import secagg_round
from ..session_state import ServerSession
from .gate import Gate


def secagg_router(session: ServerSession, gate: Gate) -> APIRouter:
    router = APIRouter()

    @router.get(API + "/sessions/{session_id}/secagg/request")
    async def secagg_request(session_id: str, request: Request):
        gate.session(session_id, request)
        party = await gate.authed(request, ("hospital",))
        return secagg_round.secagg_request(session, party.partition(":")[2])

    @router.post(API + "/sessions/{session_id}/secagg/{stage}")
    async def secagg_message(session_id: str, stage: str, request: Request):
        gate.session(session_id, request)
        party, body = await gate.signed_body(request, ("hospital",))
        if stage == SECAGG_CONSISTENCY:
            return secagg_round.secagg_consistency(session, party.partition(":")[2], body)
        if stage == SECAGG_COMPLAINT:
            return secagg_round.secagg_complaint(session, party.partition(":")[2], body)
        return secagg_round.secagg_message(session, party.partition(":")[2], stage, body)

    @router.get(API + "/sessions/{session_id}/secagg/unmask-material")
    async def unmask_material(session_id: str, request: Request):
        gate.session(session_id, request)
        await gate.authed(request, ("keyholder",))
        return secagg_round.unmask_material(session)

    return router
