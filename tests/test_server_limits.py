"""The server's connection cap and the open-files limit behind it, on a real `secure-afl server run` process."""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from secure_afl import pki
from secure_afl_tools.harness import ServerProcess
from secure_afl.server.tls_server import SPARE_FILES

pytestmark = pytest.mark.e2e

_OPEN = 80  # more than the old fixed cap of 64, fewer than k_max + 16


def _open_tls(port: int, ctx) -> socket.socket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    return ctx.wrap_socket(raw, server_hostname="127.0.0.1")


def _status(sock) -> int:
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed before a status line")
        head += chunk
    return int(head.split(b" ", 2)[1])


def test_every_hospital_of_a_large_roster_can_hold_a_connection_at_once(consortium):
    """k_max = 100: the default cap is k_max + 16, so 80 members' connections open together are all served;
    with a cap of 64 the requests on the connections past it were answered 503 and came back on new ones."""
    # Prepare
    c = consortium(backend="plain", k_max=100).start()
    ctx = pki.load_party(c.pki_dir, "hospital", "h1").client_ssl_context()
    socks = []
    try:
        # Execute: every connection completes its handshake before any request is sent
        for _ in range(_OPEN):
            socks.append(_open_tls(c.port, ctx))
        for s in socks:
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        statuses = [_status(s) for s in socks]
    finally:
        for s in socks:
            s.close()
        c.stop()
    # Assert
    assert statuses.count(503) == 0, f"{statuses.count(503)} of {_OPEN} connections turned away"
    assert statuses == [200] * _OPEN
    assert "at most 116 connections" in (c.root / "server.log").read_text()


def _run_server(config: Path, limits: tuple[int, int], log) -> subprocess.Popen:
    def lower():
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)

    return subprocess.Popen([sys.executable, "-m", "secure_afl.cli", "server", "run", "--config", str(config), "--allow-ca-key"],
                            stdout=log, stderr=subprocess.STDOUT, preexec_fn=lower)


def _soft_open_files(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-files line in /proc/PID/limits")


def test_server_run_refuses_a_connection_cap_its_open_files_limit_cannot_hold(consortium):
    # Prepare: k_max = 1000, so the automatic cap is 1016 connections; the hard limit is 300 files
    c = consortium(backend="plain", k_max=1000)
    # Execute
    with open(c.root / "server.log", "wb") as log:
        proc = _run_server(c.config, (300, 300), log)
        try:
            proc.wait(timeout=60)
        finally:
            proc.kill()
    # Assert: a one-line configuration error at start, no traceback, nothing served
    text = (c.root / "server.log").read_text()
    assert proc.returncode == 3, text  # bad input, in the one-line form of every command
    assert text.startswith(f"secure-afl: error [invalid_parameter]: {c.config}: ") and len(text.splitlines()) == 1
    assert "max_connections" in text and f"{1016 + SPARE_FILES} open files" in text and "at most 300" in text
    assert "Traceback" not in text


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 1016 + SPARE_FILES,
                    reason="this machine's hard open-files limit is below what the test raises to")
def test_server_run_raises_its_soft_open_files_limit_to_its_connection_cap(consortium):
    # Prepare: a soft limit of 300 under a hard limit that allows the cap
    c = consortium(backend="plain", k_max=1000)
    server = ServerProcess(c.config, c.root / "server.log")
    server._log = open(c.root / "server.log", "wb")
    server.proc = _run_server(c.config, (300, resource.getrlimit(resource.RLIMIT_NOFILE)[1]), server._log)
    kh = c.keyholder.party
    try:
        # Execute
        server.wait_ready(c.url, kh.ca_file, (kh.cert_file, kh.key_file), timeout=60)
        # Assert: the running server's own soft limit covers 1016 connections and the spares
        assert _soft_open_files(server.proc.pid) == 1016 + SPARE_FILES
    finally:
        server.stop()


def test_a_client_reuses_an_idle_connection_for_less_time_than_the_server_keeps_it(consortium):
    """Equal limits (httpx's 5 s against the server's 5 s) let a hospital send a request on a connection the
    server was closing: at K = 1000 the request was lost, retried after a warning, and an upload sent again."""
    import time

    from secure_afl.transport.tls_client import KEEPALIVE_EXPIRY_S, ServiceClient

    # Prepare
    c = consortium(backend="plain").start()
    party = pki.load_party(c.pki_dir, "hospital", "h1")
    sock = _open_tls(c.port, party.client_ssl_context())
    try:
        # Execute: one request, then the idle connection held until the server closes it (bounded by the timeout)
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert _status(sock) == 200
        t0 = time.monotonic()
        while sock.recv(4096):
            pass
        held = time.monotonic() - t0
        with ServiceClient(c.url, party, c.session_id, timeout=30) as client:
            expiry = client.http._transport._pool._keepalive_expiry  # the pool the client's requests go through
    finally:
        sock.close()
        c.stop()
    # Assert: the client lets go of an idle connection well before the server does
    assert expiry == KEEPALIVE_EXPIRY_S and 2 * expiry <= held, (expiry, held)
