"""The key holder's own signed HTTPS connection to the aggregation server.

mTLS with the consortium CA (an ``ssl.SSLContext`` from :mod:`secure_afl.pki`)
and an Ed25519 request signature on every call. Kept apart from the
hospitals' transport so the key holder depends on nothing a hospital ships.
A 4xx answer becomes the library's typed exception for the server's reason.
"""

from __future__ import annotations

import time

import httpx

from secure_afl import exceptions as E
from secure_afl.exceptions import SecureAFLError
from secure_afl.protocol import API, sign_request

__all__ = ["KeyHolderConnection", "ServerRefused"]


class ServerRefused(SecureAFLError):
    """The server answered 4xx with a reason that has no class in :mod:`secure_afl.exceptions`."""


def _classes_by_reason() -> dict:
    out: dict = {}
    todo = [SecureAFLError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            todo.append(sub)
            if sub.__module__ == E.__name__ and isinstance(sub.__dict__.get("reason"), str):
                out.setdefault(sub.__dict__["reason"], sub)
    return out


def refusal(status_code: int, reason: str, detail: str) -> SecureAFLError:
    """The library's typed exception for a server refusal (``status_code`` attached)."""
    cls = _classes_by_reason().get(reason, ServerRefused)
    err = cls(f"server refused ({status_code} {reason}): {detail}", reason=reason)
    err.status_code = status_code
    return err


class KeyHolderConnection:
    def __init__(self, base_url: str, party, session_id: str, *, timeout: float = 300.0, retry_s: float = 60.0):
        self.party = party
        self.party_id = f"{party.role}:{party.name}"
        self.session_id = session_id
        self._key = party.identity_key()
        self.http = httpx.Client(base_url=base_url.rstrip("/"), verify=party.client_ssl_context(present_cert=True),
                                 timeout=timeout)
        self.retry_s = retry_s

    def close(self) -> None:
        self.http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def path(self, suffix: str = "") -> str:
        return f"{API}/sessions/{self.session_id}{suffix}"

    def request(self, method: str, path: str, *, body: bytes = b"") -> httpx.Response:
        """One signed request; a refused connection (server restarting) is retried with a fresh nonce."""
        deadline = time.monotonic() + self.retry_s
        while True:
            try:
                resp = self.http.request(method, path, content=body,
                                         headers=sign_request(self._key, self.party_id, method, path, body))
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.25)
        if resp.status_code >= 400:
            try:
                msg = resp.json()
                reason, detail = str(msg.get("error", "error")), str(msg.get("detail", ""))
            except ValueError:
                reason, detail = "error", resp.text[:200]
            raise refusal(resp.status_code, reason, detail)
        return resp

    def info(self) -> dict:
        return self.request("GET", self.path()).json()

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
