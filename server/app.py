"""HTTP boundary of the aggregation server (FastAPI, served by uvicorn over mTLS).

The app: every HTTP route of the server, one router per concern in server/routes/ (sessions.py: the session
and its public context; uploads.py: uploads, receipts and what the key holder reads back; audit.py: health
and the audit head; secagg_rounds.py; split_collector.py), each behind the checks of routes/gate.py.
Only mapping lives there: every decision is made by the stage modules' functions over the session's
:class:`~secure_afl.server.session_state.ServerSession`, every refusal is a 4xx
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

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError

from secure_afl.exceptions import MalformedPayload, SecureAFLError, http_status

from . import peer_auth
from .routes.audit import audit_router
from .routes.gate import Gate, LastResort, error_response, peer_of
from .routes.secagg_rounds import secagg_router
from .routes.sessions import session_router
from .routes.split_collector import split_router
from .routes.uploads import upload_router
from .session_state import ServerSession

__all__ = ["create_app"]


def create_app(session: ServerSession) -> FastAPI:
    app = FastAPI(title="secure-afl aggregation server", version="1", docs_url=None, redoc_url=None)
    app.state.session = session

    @app.exception_handler(SecureAFLError)
    async def _refused(request: Request, exc: SecureAFLError):
        return error_response(http_status(exc), exc.reason, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        err = MalformedPayload("request does not match the API")
        peer_auth.refuse(session, "request", None, err, {"path": request.url.path[:200]}, peer=peer_of(request))
        return error_response(400, "malformed", str(err))

    gate = Gate(session)
    for router in (audit_router, session_router, upload_router):
        app.include_router(router(session, gate))
    if session.secagg is not None:
        app.include_router(secagg_router(session, gate))
    if session.split is not None:
        app.include_router(split_router(session, gate))
    app.add_middleware(LastResort, server=session)
    return app
