"""Health, and the audit log's close record with the key holder's countersignature."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from secure_afl.protocol import API

from .. import audit_records, closing
from ..session_state import ServerSession
from .gate import Gate


def audit_router(session: ServerSession, gate: Gate) -> APIRouter:
    router = APIRouter()

    @router.get(f"{API}/health")
    async def health():
        return {"ok": True, "session": session.config.session_id, "status": session.status}

    @router.get(API + "/sessions/{session_id}/audit/head")
    async def audit_head(session_id: str, request: Request):
        gate.session(session_id, request)
        await gate.authed(request, ("keyholder", "hospital"))
        return audit_records.audit_head(session)

    @router.post(API + "/sessions/{session_id}/audit/countersign")
    async def audit_countersign(session_id: str, request: Request):
        gate.session(session_id, request)
        party, body = await gate.signed_body(request, ("keyholder",))
        return await run_in_threadpool(closing.store_countersign, session, party, body)

    return router
