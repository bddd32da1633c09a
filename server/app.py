"""HTTP boundary of the aggregation server (FastAPI, served by uvicorn over mTLS).

The app: every HTTP route of the server, one router per concern in server/routes/ (sessions.py: the session
and its public context; uploads.py: uploads, receipts and what the key holder reads back; audit.py: health
and the audit head; secagg_rounds.py; split_collector.py), each behind the checks of routes/gate.py.
Only mapping lives there: every decision is made by
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

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError

from secure_afl.exceptions import MalformedPayload, SecureAFLError, http_status

from .aggregator import AggregationServer
from .routes.audit import audit_router
from .routes.gate import Gate, LastResort, error_response, peer_of
from .routes.secagg_rounds import secagg_router
from .routes.sessions import session_router
from .routes.split_collector import split_router
from .routes.uploads import upload_router
from .secagg_round import SecAggAggregationServer
from .split_round import SplitAggregationServer

__all__ = ["create_app"]


def create_app(server: AggregationServer) -> FastAPI:
    app = FastAPI(title="secure-afl aggregation server", version="1", docs_url=None, redoc_url=None)
    app.state.server = server

    @app.exception_handler(SecureAFLError)
    async def _refused(request: Request, exc: SecureAFLError):
        return error_response(http_status(exc), exc.reason, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        err = MalformedPayload("request does not match the API")
        server.refuse("request", None, err, {"path": request.url.path[:200]}, peer=peer_of(request))
        return error_response(400, "malformed", str(err))

    gate = Gate(server)
    for router in (audit_router, session_router, upload_router):
        app.include_router(router(server, gate))
    if isinstance(server, SecAggAggregationServer):
        app.include_router(secagg_router(server, gate))
    if isinstance(server, SplitAggregationServer):
        app.include_router(split_router(server, gate))
    app.add_middleware(LastResort, server=server)
    return app
