"""A party whose certificate has expired, or whose clock is off, is told so in words: the certificate's end date
before any connection, the clock difference the server measured in the refusal."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from secure_afl.exceptions import EXIT_KEYS, ReplayedContribution
from support.cli import FAST_S, one_line, run_cli, stats_file, submit_args

e2e = pytest.mark.e2e


def _expire(c, name: str) -> dt.datetime:
    """Re-sign hospital ``name``'s certificate with the consortium CA, its validity ended two days ago, as a
    certificate of last year's bundle would be; returns its end."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from secure_afl.pki.identity import load_certificate, load_private_key

    path = c.pki_dir / f"hospital-{name}" / "cert.pem"
    cert = load_certificate(path)
    ca_key = load_private_key(c.pki_dir / "ca.key")
    end = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) - dt.timedelta(days=2)
    b = (x509.CertificateBuilder().subject_name(cert.subject).issuer_name(cert.issuer)
         .public_key(cert.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(end - dt.timedelta(days=365)).not_valid_after(end))
    for ext in cert.extensions:
        b = b.add_extension(ext.value, ext.critical)
    path.write_bytes(b.sign(ca_key, None if isinstance(ca_key, ed25519.Ed25519PrivateKey) else hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    return end


@e2e
def test_an_expired_hospital_certificate_is_named_with_its_date_before_any_connection(consortium, tmp_path):
    # Prepare: a running plain session; h1's certificate expired two days ago
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2).start()
    stats = stats_file(c, "h1", tmp_path / "stats.npz")
    end = _expire(c, "h1")

    # Execute
    out, took = run_cli(*submit_args(c, "h1", stats))

    # Assert: the keys exit code, the date, no retry window spent; nothing reached the server
    line = one_line(out, EXIT_KEYS, "certificate_expired")
    assert f"expired on {end:%Y-%m-%d %H:%M:%S} UTC" in line and "hospital h1" in line
    assert took < FAST_S
    with c.connect_keyholder() as conn:
        assert conn.status()["uploaded"] == []


@e2e
def test_a_request_from_a_clock_two_days_ahead_is_refused_naming_the_difference(consortium, monkeypatch):
    # Prepare: a running plain session; this hospital's machine clock two days ahead of the server's
    import time

    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2).start()
    cl = c.hospital("h1")
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 2 * 86400)  # this process only: the server keeps its own

    # Execute
    with pytest.raises(ReplayedContribution) as err:
        cl.submit(c.stats(*c.data("h1")))
    monkeypatch.undo()
    cl.close()

    # Assert: the refusal measures the clocks' difference (two days = 172800 s, give or take the round trip)
    text = str(err.value)
    found = re.search(r"request timestamp outside the accepted window: the request's clock is (\d+) s ahead", text)
    assert found, text
    # whole seconds, truncated: the request left a moment before the server read its clock
    assert abs(int(found.group(1)) - 2 * 86400) <= 60, text
    assert "of the server's" in text and "clocks" in text


@e2e
def test_the_server_logs_a_refused_tls_handshake_with_its_reason(consortium):
    # Prepare: a running session; h1's certificate expired, presented anyway by a client that does not check it
    import socket
    import ssl
    import time
    from urllib.parse import urlparse

    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2).start()
    _expire(c, "h1")
    d = c.pki_dir / "hospital-h1"
    ctx = ssl.create_default_context(cafile=str(c.pki_dir / "ca.pem"))
    ctx.load_cert_chain(str(d / "cert.pem"), str(d / "key.pem"))
    u = urlparse(c.url)

    # Execute: the handshake (TLS 1.3 reports the client certificate's refusal on the first read)
    answer = b""
    with socket.create_connection((u.hostname, u.port), timeout=30) as raw:
        try:
            with ctx.wrap_socket(raw, server_hostname=u.hostname) as tls:
                tls.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = tls.recv(1)
        except (ssl.SSLError, ConnectionError):
            pass
    assert answer == b""  # no HTTP answer: the server dropped the connection
    log = c.root / "server.log"
    for _ in range(100):  # bounded: the server writes its line as it drops the connection
        if "TLS handshake refused" in log.read_text():
            break
        time.sleep(0.1)

    # Assert: the server's log names the refusal and its reason
    line = next(ln for ln in log.read_text().splitlines() if "TLS handshake refused" in ln)
    assert "certificate has expired" in line or "expired" in line, line
