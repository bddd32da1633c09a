"""Uploads in (signed statement in the headers, body streamed under its caps), receipts out; what the key
holder reads back: the aggregate, each stored upload, the tag statements and the manifest."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from secure_afl.encoding import parse_json
from secure_afl.exceptions import Forbidden, MalformedPayload, SecureAFLError
from secure_afl.protocol import API, H_TAG, H_UPLOAD

from .. import closing, intake, peer_auth
from ..session_state import ServerSession
from .gate import Gate, peer_of


def upload_router(session: ServerSession, gate: Gate) -> APIRouter:
    router = APIRouter()

    @router.post(API + "/sessions/{session_id}/uploads")
    async def upload(session_id: str, request: Request):
        gate.session(session_id, request)
        peer = peer_of(request)
        raw, raw_tag = request.headers.get(H_UPLOAD), request.headers.get(H_TAG)
        try:
            if not raw:
                raise MalformedPayload(f"missing {H_UPLOAD} header (the signed upload statement)")
            statement = parse_json(raw, f"{H_UPLOAD} header")
            tag = parse_json(raw_tag, f"{H_TAG} header") if raw_tag else None
        except SecureAFLError as e:
            peer_auth.refuse(session, "upload", None, e, peer=peer)
            raise
        hospital = peer_auth.authenticate_upload(session, statement, peer)
        body = await gate.stream(request, hospital, "upload", statement["payload_sha256"])
        # CPU-bound validation (ciphertext parsing) runs off the event loop.
        # gate.stream checked the body against this digest while it arrived: submit need not hash it again
        return await run_in_threadpool(lambda: intake.submit(session, hospital, statement, body, tag, peer=peer,
                                                             payload_sha256=statement["payload_sha256"]))

    @router.get(API + "/sessions/{session_id}/receipts/{hospital}")
    async def receipt(session_id: str, hospital: str, request: Request):
        gate.session(session_id, request)
        party = await gate.authed(request, ("hospital", "keyholder"))
        if party.startswith("hospital:") and party != f"hospital:{hospital}":
            raise Forbidden("a hospital may read only its own receipt")
        return intake.receipt(session, hospital)

    @router.get(API + "/sessions/{session_id}/aggregate")
    async def aggregate(session_id: str, request: Request):
        gate.session(session_id, request)
        await gate.authed(request, ("keyholder",))
        return Response(closing.masked_aggregate(session), media_type="application/octet-stream")

    @router.get(API + "/sessions/{session_id}/contributions/{hospital}")
    async def contribution(session_id: str, hospital: str, request: Request):
        gate.session(session_id, request)
        await gate.authed(request, ("keyholder",))
        return Response(closing.contribution(session, hospital), media_type="application/octet-stream")

    @router.get(API + "/sessions/{session_id}/tags")
    async def tags(session_id: str, request: Request):
        gate.session(session_id, request)
        await gate.authed(request, ("keyholder",))
        return JSONResponse(closing.tags(session))

    @router.get(API + "/sessions/{session_id}/manifest")
    async def manifest(session_id: str, request: Request):
        gate.session(session_id, request)
        await gate.authed(request, ("keyholder", "hospital"))
        return JSONResponse(closing.released(session)[1])

    return router
