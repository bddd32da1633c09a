"""TLS contexts from the consortium CA (TLS 1.2 floor, forward-secret AEAD suites, mutual TLS).

Handed to uvicorn and httpx by the services; no network code here.
"""

from __future__ import annotations

import ssl

from secure_afl._validation import param_error


__all__ = ["server_ssl_context", "client_ssl_context", "uvicorn_ssl_kwargs"]


def server_ssl_context(cert_file, key_file, ca_file, *, require_client_cert: bool = True) -> ssl.SSLContext:
    """TLS server context; mutual TLS (client cert from the CA) unless disabled.

    TLS 1.2 is the floor. With ``require_client_cert=False`` a client may
    connect without a certificate and the application must authenticate it
    another way; a certificate it does present is still checked against the
    CA, so a view served over mutual TLS only (the session status) stays
    reachable to the parties that present theirs.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # TLS 1.2: forward-secret AEAD suites only (TLS 1.3 suites are all of that kind)
    ctx.set_ciphers("ECDHE+AESGCM:ECDHE+CHACHA20")
    ctx.load_cert_chain(certfile=str(cert_file), keyfile=str(key_file))
    ctx.load_verify_locations(cafile=str(ca_file))
    ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return ctx


def client_ssl_context(ca_file, *, cert_file=None, key_file=None) -> ssl.SSLContext:
    """TLS client context that trusts only the consortium CA.

    Hostname checking stays on (the server certificate carries 127.0.0.1 and
    localhost by default). Give ``cert_file``/``key_file`` to present a client
    certificate (mutual TLS). For httpx: ``httpx.Client(verify=ctx)``.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cafile=str(ca_file))
    if cert_file is not None:
        ctx.load_cert_chain(certfile=str(cert_file), keyfile=None if key_file is None else str(key_file))
    elif key_file is not None:
        raise param_error("key_file", "client_ssl_context", "None when cert_file is None", key_file)
    return ctx


def uvicorn_ssl_kwargs(cert_file, key_file, ca_file, *, require_client_cert: bool = True) -> dict:
    """Keyword arguments for ``uvicorn.run`` / ``uvicorn.Config``."""
    return {
        "ssl_certfile": str(cert_file),
        "ssl_keyfile": str(key_file),
        "ssl_ca_certs": str(ca_file),
        "ssl_cert_reqs": ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL,
    }
