"""Signed HTTPS transport used by the hospital client and the key holder.

mTLS with the consortium CA (httpx + an ``ssl.SSLContext`` from
:mod:`secure_afl.pki`), plus an Ed25519 request signature on every call that
is not public (:func:`secure_afl.protocol.sign_request`). A 4xx answer is
turned back into the library's typed exception with the server's reason, so
callers handle network refusals and local refusals the same way. The reason
-> class table is :func:`secure_afl.exceptions.error_class` (the same registry
the server answers from); a server that does not answer at all is
:class:`~secure_afl.exceptions.ServerUnreachable`.
"""

from __future__ import annotations

import time
from typing import Iterable

import httpx

from secure_afl import exceptions as E
from secure_afl.exceptions import ServiceError
from secure_afl.protocol import API, sign_request

__all__ = ["ServiceClient", "ServiceError", "error_from_response"]


def error_from_response(resp: httpx.Response) -> E.SecureAFLError:
    try:
        body = resp.json()
        reason, detail = str(body.get("error", "error")), str(body.get("detail", ""))
    except ValueError:
        reason, detail = "error", resp.text[:200]
    cls = E.error_class(reason)
    err = cls(f"server refused ({resp.status_code} {reason}): {detail}", reason=reason)
    err.status_code = resp.status_code
    return err


class ServiceClient:
    """One party's authenticated connection to the aggregation server."""

    def __init__(self, base_url: str, party, session_id: str, *, timeout: float = 120.0,
                 present_cert: bool = True, verify=None, retry_s: float = 60.0):
        self.base_url = base_url.rstrip("/")
        self.party = party
        self.party_id = f"{party.role}:{party.name}"
        self.session_id = session_id
        self._key = party.identity_key()
        ctx = verify if verify is not None else party.client_ssl_context(present_cert=present_cert)
        self.http = httpx.Client(base_url=self.base_url, verify=ctx, timeout=timeout)
        self.retry_s = retry_s
        self.bytes_downloaded = 0  # response bodies received (benchmarks report it)

    def close(self) -> None:
        self.http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def path(self, suffix: str = "") -> str:
        return f"{API}/sessions/{self.session_id}{suffix}"

    def request(self, method: str, path: str, *, body: bytes = b"", signed: bool = True,
                headers: dict | None = None, content: Iterable[bytes] | None = None,
                retry: bool = True) -> httpx.Response:
        """One request; connection failures (server restarting) are retried for ``retry_s``.

        A retried request is signed afresh (new nonce), so the server never sees
        a replayed signature; whether a retried POST had already taken effect is
        for the caller to find out (a 409 duplicate says so).
        """
        deadline = time.monotonic() + (self.retry_s if retry else 0.0)
        while True:
            h = dict(headers or {})
            if signed:
                h.update(sign_request(self._key, self.party_id, method, path, body))
            try:
                resp = self.http.request(method, path, content=content if content is not None else body,
                                         headers=h)
                self.bytes_downloaded += len(resp.content)
                break
            except httpx.TransportError as e:
                if content is not None or time.monotonic() > deadline:
                    raise E.ServerUnreachable(f"no answer from {self.base_url} ({type(e).__name__}: {e})") from e
                time.sleep(0.25)
        if resp.status_code >= 400:
            raise error_from_response(resp)
        return resp

    def info(self) -> dict:
        return self.request("GET", self.path(), signed=False).json()

    def wait_until(self, predicate, *, timeout: float, interval: float = 0.2, what: str = "condition") -> dict:
        """Poll the session info until ``predicate(info)``; bounded by ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.info()
            if predicate(info):
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"gave up waiting for {what} after {timeout:.0f} s (status {info['status']})")
            time.sleep(interval)
