"""Availability and refusal identities against a real server process (TLS on 127.0.0.1).

Memory is read from the server's own /proc/PID/status; every wait is bounded
by a socket timeout or a deadline, never a sleep.
"""

from __future__ import annotations

import hashlib
import json
import select
import socket
import ssl
import time

import httpx
import pytest

from secure_afl import pki
from secure_afl.protocol import API, H_UPLOAD, sign_request
from secure_afl.signing import sign_upload

from support import Consortium

pytestmark = [pytest.mark.e2e, pytest.mark.security]

READ_TIMEOUT_S = 2.0


@pytest.fixture
def service(tmp_path):
    c = Consortium(tmp_path, backend="plain", hospitals=("h1", "h2", "h3"), min_clients=2,
                   extra_server={"read_timeout_s": READ_TIMEOUT_S, "refusal_interval_s": 3600.0}).start()
    yield c
    c.stop()


def _rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _tls_socket(c: Consortium, name: str = "h1", ctx: ssl.SSLContext | None = None) -> ssl.SSLSocket:
    party = pki.load_party(c.pki_dir, "hospital", name)
    ctx = ctx or pki.client_ssl_context(party.ca_file, cert_file=party.cert_file, key_file=party.key_file)
    raw = socket.create_connection(("127.0.0.1", c.port), timeout=10)
    return ctx.wrap_socket(raw, server_hostname="127.0.0.1")


def _client(c: Consortium, name: str = "h1") -> httpx.Client:
    party = pki.load_party(c.pki_dir, "hospital", name)
    ctx = pki.client_ssl_context(party.ca_file, cert_file=party.cert_file, key_file=party.key_file)
    return httpx.Client(base_url=c.url, verify=ctx, timeout=30)


def _closed_by_server(sock: ssl.SSLSocket, deadline: float) -> bool:
    """True once the server closes the connection (EOF or reset) before ``deadline``."""
    sock.setblocking(False)
    while time.monotonic() < deadline:
        if sock.pending() == 0:
            select.select([sock], [], [], max(0.0, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except (ssl.SSLWantReadError, BlockingIOError):
            continue
        except (ConnectionError, ssl.SSLError, OSError):
            return True
        if not data:
            return True
    return False


def _signed_upload_head(c: Consortium, fill: bytes) -> tuple[bytes, bytes]:
    """(the raw HTTP head of h1's signed upload, its 1 MiB body of ``fill`` bytes): what a client sends before
    and as the body, for tests that then send only part of it."""
    party = pki.load_party(c.pki_dir, "hospital", "h1")
    info = _client(c).get(f"{API}/sessions/{c.session_id}").json()
    body = fill * (1 << 20)
    st = sign_upload(party.identity_key(), c.session_id, bytes.fromhex(info["params_digest"]),
                     hashlib.sha256(body).digest(), "h1")
    head = (f"POST {API}/sessions/{c.session_id}/uploads HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Length: {len(body)}\r\n{H_UPLOAD}: {json.dumps(st, separators=(',', ':'))}\r\n\r\n").encode()
    return head, body


def _audit(c: Consortium) -> list[dict]:
    return [json.loads(line) for line in c.audit_path().read_text().splitlines()]


def test_held_unauthenticated_bodies_do_not_raise_server_rss(service):
    # Prepare: 12 mTLS connections announce 64 MB uploads with an unsigned statement
    pid = service.server.proc.pid
    before = _rss_kib(pid)
    path = f"{API}/sessions/{service.session_id}/uploads"
    statement = json.dumps({"hospital": "h1", "payload_sha256": "00" * 32})
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 64000000\r\n"
            f"Content-Type: application/octet-stream\r\n{H_UPLOAD}: {statement}\r\n\r\n").encode()
    socks = [_tls_socket(service) for _ in range(12)]
    chunk = b"\0" * (1 << 20)
    peak = before
    try:
        # Execute: push up to 24 MB into each, as long as the server reads
        for s in socks:
            s.sendall(head)
        for _ in range(24):
            for s in socks:
                try:
                    s.settimeout(0.5)
                    s.sendall(chunk)
                except (OSError, ssl.SSLError):
                    pass
            peak = max(peak, _rss_kib(pid))
        answered = 0
        for s in socks:
            try:
                s.settimeout(10)
                answered += s.recv(4096).startswith(b"HTTP/1.1 4")
            except (OSError, ssl.SSLError):
                pass
    finally:
        for s in socks:
            s.close()

    # Assert: refused from the headers alone; the server never buffered the bodies
    growth_mib = (peak - before) / 1024
    print(f"\nheld bodies: RSS {before / 1024:.0f} -> peak {peak / 1024:.0f} MiB (+{growth_mib:.0f} MiB); "
          f"{answered}/12 answered 4xx before the body")
    assert growth_mib < 48, growth_mib
    assert answered >= 1


def test_slow_headers_are_cut_by_the_read_timeout(service):
    # Prepare: 25 mTLS connections that send half a request line and stop
    socks = [_tls_socket(service) for _ in range(25)]
    t0 = time.monotonic()
    try:
        for s in socks:
            s.sendall(b"POST /v1/sessions/x/uploads HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        # Execute / Assert: each is closed by the server within the timeout plus slack
        deadline = t0 + READ_TIMEOUT_S + 15
        closed = sum(_closed_by_server(s, deadline) for s in socks)
    finally:
        for s in socks:
            s.close()
    elapsed = time.monotonic() - t0
    print(f"\nslow headers: {closed}/25 cut after {elapsed:.1f} s (read timeout {READ_TIMEOUT_S} s)")
    assert closed == 25


def test_held_authenticated_body_is_cut_by_the_read_timeout(service):
    # Prepare: h1 announces a signed 1 MiB upload and sends only half of it
    head, body = _signed_upload_head(service, b"\1")
    s = _tls_socket(service)
    try:
        s.sendall(head + body[: len(body) // 2])
        t0 = time.monotonic()
        # Execute
        s.settimeout(READ_TIMEOUT_S + 15)
        answer = s.recv(4096)
        elapsed = time.monotonic() - t0
    finally:
        s.close()

    # Assert: a 408 with a reason, and the refusal is audited under h1 (authenticated before the body)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert elapsed < READ_TIMEOUT_S + 10
    rec = [r for r in _audit(service) if r["reason"] == "timeout"]
    assert rec and rec[-1]["actor"] == "h1"


def test_server_runs_with_the_project_tls_context(service):
    # A TLS 1.2 CBC suite that the context uvicorn builds itself (Python's default suites) accepts
    party = pki.load_party(service.pki_dir, "hospital", "h1")
    ctx = pki.client_ssl_context(party.ca_file, cert_file=party.cert_file, key_file=party.key_file)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers("ECDHE-ECDSA-AES128-SHA256")
    with pytest.raises(ssl.SSLError):
        _tls_socket(service, ctx=ctx).close()
    # the same client with the project's suites connects
    ok = pki.client_ssl_context(party.ca_file, cert_file=party.cert_file, key_file=party.key_file)
    ok.maximum_version = ssl.TLSVersion.TLSv1_2
    s = _tls_socket(service, ctx=ok)
    assert s.version() == "TLSv1.2" and ("GCM" in s.cipher()[0] or "CHACHA" in s.cipher()[0])
    s.close()


def test_signature_must_belong_to_the_tls_certificate(service):
    # Prepare: h2's signed upload statement, sent over h1's mTLS connection
    info = _client(service).get(f"{API}/sessions/{service.session_id}").json()
    body = b"\1" * 64
    h2 = pki.load_party(service.pki_dir, "hospital", "h2")
    st = sign_upload(h2.identity_key(), service.session_id, bytes.fromhex(info["params_digest"]),
                     hashlib.sha256(body).digest(), "h2")

    # Execute
    with _client(service, "h1") as cl:
        resp = cl.post(f"{API}/sessions/{service.session_id}/uploads", content=body,
                       headers={H_UPLOAD: json.dumps(st, separators=(",", ":"))})

    # Assert
    assert resp.status_code == 401 and resp.json()["error"] == "unauthenticated"
    rec = _audit(service)[-1]
    assert rec["actor"] == "unauthenticated" and rec["details"]["tls_peer"]["cert_party"] == "hospital:h1"

    # the same for a signed request: h2's valid signature over h1's connection
    path = f"{API}/sessions/{service.session_id}/receipts/h2"
    with _client(service, "h1") as cl:
        resp = cl.get(path, headers=sign_request(h2.identity_key(), "hospital:h2", "GET", path))
    assert resp.status_code == 401 and resp.json()["error"] == "unauthenticated"


def test_refusal_cannot_be_written_under_a_claimed_name(service):
    # Prepare: from h1's connection, a request that claims to be h2 with a bad signature
    path = f"{API}/sessions/{service.session_id}/receipts/h2"
    h1 = pki.load_party(service.pki_dir, "hospital", "h1")
    headers = sign_request(h1.identity_key(), "hospital:h2", "GET", path)

    # Execute
    with _client(service, "h1") as cl:
        resp = cl.get(path, headers=headers)

    # Assert: refused; the audit names no one but the authenticated TLS peer
    assert resp.status_code == 401
    refusals = [r for r in _audit(service) if r["outcome"] == "refused"]
    assert refusals and all(r["actor"] != "hospital:h2" for r in refusals)
    assert refusals[-1]["actor"] == "unauthenticated"
    assert refusals[-1]["details"]["tls_peer"]["cert_party"] == "hospital:h1"


def test_unsigned_requests_cannot_grow_the_log_cheaply(service):
    # Prepare
    size0 = service.audit_path().stat().st_size
    path = f"{API}/sessions/{service.session_id}/manifest"
    n = 3000
    t0 = time.monotonic()

    # Execute: 3,000 unsigned requests over one keep-alive connection
    with _client(service, "h1") as cl:
        statuses = {cl.get(path).status_code for _ in range(n)}
    elapsed = time.monotonic() - t0
    growth = service.audit_path().stat().st_size - size0

    # Assert: all refused; the log holds one record for the peer, the rest are counted for its summary
    print(f"\n{n} unsigned requests in {elapsed:.1f} s: audit log +{growth} bytes")
    assert statuses == {400}
    assert growth < 4096
    service.stop()
    tail = _audit(service)[-1]
    assert tail["event"] == "refusals_suppressed" and tail["details"]["count"] == n - 1


def test_client_disconnect_mid_body_is_audited_without_a_traceback(service):
    # Prepare: h1's signed upload statement for a 1 MiB body
    head, body = _signed_upload_head(service, b"\2")

    # Execute: half the body, then the client goes away; a later request shows the server still serves
    s = _tls_socket(service)
    s.sendall(head + body[: len(body) // 2])
    s.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(r["reason"] == "disconnected" for r in _audit(service)):
        _client(service).get(f"{API}/health")

    # Assert
    rec = [r for r in _audit(service) if r["reason"] == "disconnected"]
    assert rec and rec[-1]["actor"] == "h1"
    service.stop()
    assert "Traceback" not in (service.root / "server.log").read_text()
