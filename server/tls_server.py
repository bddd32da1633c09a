"""How the aggregation server meets the network: uvicorn with the project's TLS context.

Three things uvicorn does not do on its own, and why they matter here:

* **Our TLS context.** uvicorn builds its own ``SSLContext`` from ``ssl_*``
  options; ``ssl_context_factory`` is its supported hook, so the server runs
  with :func:`secure_afl.pki.server_ssl_context` (TLS 1.2 floor, AEAD-only
  TLS 1.2 suites, client certificates from the consortium CA).
* **The TLS peer in every request.** The HTTP protocol copies the DER
  certificate's SHA-256 and the peer address into the request state
  (``request.state.tls_peer``), so the application can bind an Ed25519
  signature to the certificate that opened the connection, and name the
  peer in refusals of requests that are not authenticated.
* **A header read timeout.** A connection that has not delivered complete
  request headers within ``read_timeout_s`` is closed; h11 bounds the header
  size, so a slow client costs one socket and a few KiB for a bounded time.
  Body timeouts are the application's (server/app.py).

And one thing the operating system decides: every open connection is a file
descriptor, so :func:`reserve_open_files` raises the process's soft limit to
cover the connection cap before the server starts, or refuses to start.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import socket
import ssl

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from secure_afl.exceptions import InvalidParameterError

__all__ = ["GuardedH11Protocol", "KEEP_ALIVE_S", "listen", "reserve_open_files", "serve", "uvicorn_config"]

log = logging.getLogger("secure_afl.server")

#: Descriptors the server needs besides its connections: payload files, SQLite and its WAL, the audit log,
#: the summing processes' pipes, the listening socket, the interpreter's own.
SPARE_FILES = 256
#: Seconds an idle connection is kept open; a client reuses one for less (``transport.tls_client``
#: ``KEEPALIVE_EXPIRY_S``), so no request is sent on a connection this side is closing.
KEEP_ALIVE_S = 5


def reserve_open_files(connections: int) -> int | None:
    """Make room for ``connections`` open connections: raise the soft RLIMIT_NOFILE to ``connections +
    SPARE_FILES`` if it is lower. Returns the soft limit now in force (None where the platform has none).

    Raises :class:`InvalidParameterError` when the hard limit is lower: the server would otherwise start and,
    once that many hospitals connect, fail to accept or to open an upload's file mid-session.
    """
    try:
        import resource
    except ImportError:  # not a POSIX system: nothing to check
        return None
    need = connections + SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return soft
    if hard != resource.RLIM_INFINITY and hard < need:
        raise InvalidParameterError(
            f"[server] max_connections allows {connections} connections, which needs about {need} open files, "
            f"but this process may open at most {hard} (hard limit, ulimit -Hn): raise the limit (systemd "
            f"LimitNOFILE=, ulimit -n) or set a lower [server] max_connections")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    return need

# request headers larger than this are answered 400 by h11 before the application sees them
MAX_HEADER_BYTES = 64 * 1024


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus the TLS peer in the request state and a header timeout."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer = {"addr": f"{self.client[0]}:{self.client[1]}" if self.client else None, "cert_sha256": None}
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:
            der = ssl_object.getpeercert(binary_form=True)
            if der:
                peer["cert_sha256"] = hashlib.sha256(der).hexdigest()
        # per connection: the state dict is copied into every request's scope
        self.app_state = {**self.app_state, "tls_peer": peer}
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm_header_timer()

    def _arm_header_timer(self) -> None:
        timeout = getattr(self.config_ref, "read_timeout_s", None)
        if timeout is None:
            return
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = self.loop.call_later(timeout, self._cut_if_no_request)

    def _cut_if_no_request(self) -> None:
        self._header_timer = None
        waiting_for_headers = self.conn.their_state is h11.IDLE and (
            self.cycle is None or self.cycle.response_complete)
        if waiting_for_headers and not self.transport.is_closing():
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_timer()

    def connection_lost(self, exc) -> None:
        if getattr(self, "_header_timer", None) is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)


class _LoggedHandshake(ssl.SSLObject):
    """The server side of each TLS connection, logging why a handshake was refused: asyncio drops such a
    connection without a word (it logs TLS errors only in debug mode), so an expired or foreign client
    certificate would otherwise leave nothing in the server's log while the client only sees a reset."""

    def do_handshake(self) -> None:
        try:
            super().do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise
        except ssl.SSLError as e:
            why = getattr(e, "verify_message", None) or e.reason or str(e)
            log.warning("TLS handshake refused: %s (%s)", why, e.library or "ssl")
            raise


def uvicorn_config(app, cfg, party, *, log_level: str = "warning") -> uvicorn.Config:
    """A ``uvicorn.Config`` serving ``app`` with the project's TLS context and limits from ``cfg``."""

    class _Protocol(GuardedH11Protocol):
        config_ref = cfg

    def _context(_config, _default):
        ctx = party.server_ssl_context(require_client_cert=cfg.require_client_cert)
        ctx.sslobject_class = _LoggedHandshake
        return ctx

    return uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=log_level, http=_Protocol,
                          ssl_context_factory=_context, limit_concurrency=cfg.connection_limit,
                          timeout_keep_alive=KEEP_ALIVE_S, h11_max_incomplete_event_size=MAX_HEADER_BYTES)


def listen(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound before the session's store and audit log are opened.

    uvicorn binds only once it runs, and on failure logs the error and exits as if it had served;
    binding here first makes a taken port a refusal to start (:class:`InvalidParameterError`,
    reason ``port_in_use``) that names the port, with nothing opened or written.
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart need not wait TIME_WAIT
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise InvalidParameterError(
                f"port {port} on {host} is in use (another server, or a previous one still running): stop it, "
                "or choose another port ([server] port in session.toml, or --port)", reason="port_in_use") from None
        raise InvalidParameterError(f"cannot listen on {host}:{port} ({e.strerror}): check [server] host and port",
                                    reason="cannot_listen") from None
    return sock


def serve(app, cfg, party, *, log_level: str = "warning", sock: socket.socket | None = None) -> None:
    """Run uvicorn until it stops; on ``sock`` (from :func:`listen`) when given, else binding itself."""
    uvicorn.Server(uvicorn_config(app, cfg, party, log_level=log_level)).run(sockets=None if sock is None else [sock])
