"""Signed HTTPS transport used by the hospital client and the key holder.

mTLS with the consortium CA (httpx + an ``ssl.SSLContext`` from
:mod:`secure_afl.pki`), plus an Ed25519 request signature on every call that
is not public (:func:`secure_afl.protocol.sign_request`). A 4xx answer is
turned back into the library's typed exception with the server's reason, so
callers handle network refusals and local refusals the same way. The reason
-> class table is :func:`secure_afl.exceptions.error_class` (the same registry
the server answers from); a server that does not answer at all is
:class:`~secure_afl.exceptions.ServerUnreachable`.

Crowds: a server at its limits answers 429 ``busy`` (every body slot taken)
or 503 (uvicorn's connection cap). Neither request reached a handler, so
nothing took effect and sending it again, signed afresh, is safe even for an
upload: the request is retried after ``Retry-After`` when the server sends
one, else after an exponential backoff (``_BACKOFF_S`` doubling to
``BACKOFF_MAX_S``) with full jitter, so a thousand refused hospitals do not
come back in step; for at most ``busy_s`` seconds in all.

What waiting cannot fix is not waited for: an address that is not
``https://HOST:PORT`` is refused before any connection, and a server whose
certificate the consortium CA did not issue (another consortium's server, a
wrong address) ends the request at once with
:class:`~secure_afl.exceptions.UntrustedServer`. Only a server that does not
answer (refused or timed-out connection: not running, restarting) is retried,
for ``retry_s`` seconds, with one log line saying what is awaited.
"""

from __future__ import annotations

import logging
import random
import ssl
import threading
import time
from typing import Iterable
from urllib.parse import urlsplit

import httpx

from secure_afl import exceptions as E
from secure_afl.exceptions import ServiceError
from secure_afl.protocol import API, sign_request

__all__ = ["BACKOFF_MAX_S", "KEEPALIVE_EXPIRY_S", "ServiceClient", "ServiceError", "check_server_url",
           "error_from_response", "retry_delay"]

log = logging.getLogger("secure_afl.transport")

#: Statuses that mean "not now" (nothing was processed), answered by waiting and sending again.
_RETRY_STATUSES = (429, 503)
_BACKOFF_S = 0.25
BACKOFF_MAX_S = 8.0
_RNG = random.Random()
#: A connection attempt to a host that does not answer (no refusal) gives up after this long, so the
#: whole wait stays within retry_s plus this, whatever the request's own (long) timeout.
_CONNECT_TIMEOUT_S = 10.0
#: An idle connection is reused for at most this long, well under the server's keep-alive (``server.tls_server``
#: ``KEEP_ALIVE_S``, 5 s; httpx's own default is also 5 s). At equal limits a request sent as the server closed the
#: connection was lost ("Server disconnected without sending a response"): at K = 1000, d = 512, 28 hospitals'
#: requests, each then retried after a warning that the server did not answer (an upload lost so is sent again
#: in full).
KEEPALIVE_EXPIRY_S = 2.0


def check_server_url(url: str) -> str:
    """``url`` without a trailing slash if it is ``https://HOST[:PORT]``; else :class:`InvalidParameterError`.

    The server speaks only HTTPS with mutual TLS: ``http://`` or a bare ``HOST:PORT`` could never reach it,
    so they are refused here rather than retried as if the server were down.
    """
    text = str(url).strip()
    parts = urlsplit(text)
    if parts.scheme.lower() != "https" or not parts.hostname:
        rest = text.split("://", 1)[1] if "://" in text else text
        raise E.InvalidParameterError(
            f"server address {text!r} is not https://HOST:PORT (the server speaks only HTTPS); "
            f"did you mean https://{rest.rstrip('/')}?", reason="bad_server_url")
    return text.rstrip("/")


def _tls_refusal(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification failure behind a transport error, if that is what it is."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ssl.SSLCertVerificationError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _untrusted(base_url: str, err: ssl.SSLCertVerificationError) -> E.UntrustedServer:
    why = getattr(err, "verify_message", None) or str(err)
    if getattr(err, "verify_code", None) == 62:  # X509_V_ERR_HOSTNAME_MISMATCH
        advice = ("the certificate is the consortium's but names another host: use the server address the "
                  "operator published")
    else:
        advice = ("it is not the server of the consortium whose ca.pem is in --pki: check the address, and "
                  "that --pki is the bundle your consortium's operator gave you")
    return E.UntrustedServer(f"{base_url} presents a certificate your consortium's CA did not issue ({why}); "
                             f"{advice}")


def retry_delay(attempt: int, retry_after: str | None, *, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based) of a 429/503.

    The server's ``Retry-After`` (delta seconds), spread by up to a quarter
    more so a crowd refused together does not return together; without one,
    full jitter over a doubling backoff capped at ``BACKOFF_MAX_S``.
    """
    rng = rng or _RNG
    if retry_after is not None and retry_after.strip().isdigit():
        base = min(float(retry_after), 10 * BACKOFF_MAX_S)
        return base * (1.0 + 0.25 * rng.random())
    return rng.uniform(0.0, min(BACKOFF_MAX_S, _BACKOFF_S * 2.0 ** attempt))


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
                 present_cert: bool = True, verify=None, retry_s: float = 60.0, busy_s: float = 900.0):
        self.base_url = check_server_url(base_url)
        self.party = party
        self.party_id = f"{party.role}:{party.name}"
        self.session_id = session_id
        self._key = party.identity_key()
        ctx = verify if verify is not None else party.client_ssl_context(present_cert=present_cert)
        self.http = httpx.Client(base_url=self.base_url, verify=ctx,
                                 timeout=httpx.Timeout(timeout, connect=min(timeout, _CONNECT_TIMEOUT_S)),
                                 limits=httpx.Limits(max_connections=100, max_keepalive_connections=20,
                                                     keepalive_expiry=KEEPALIVE_EXPIRY_S))
        self.retry_s = retry_s
        self.busy_s = busy_s
        self.bytes_downloaded = 0  # response bodies received (benchmarks report it)
        self.busy_retries = 0  # 429/503 answers absorbed by waiting (benchmarks report it)
        self._counters = threading.Lock()  # the key holder downloads from several threads at once

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
        """One request; connection failures (server restarting) are retried for ``retry_s``,
        429/503 answers (server at its limits) for ``busy_s``, ``content`` streams excepted.

        A retried request is signed afresh (new nonce), so the server never sees
        a replayed signature. ``retry=False`` is for requests whose effect is
        unknown after a dropped connection (an upload): the caller finds out
        (its receipt) before sending again; a 429/503 is retried all the same,
        since the server did not act on it.
        """
        deadline = time.monotonic() + (self.retry_s if retry else 0.0)
        busy_deadline = time.monotonic() + self.busy_s
        attempt = 0
        waiting = False
        while True:
            h = dict(headers or {})
            if signed:
                h.update(sign_request(self._key, self.party_id, method, path, body))
            try:
                resp = self.http.request(method, path, content=content if content is not None else body,
                                         headers=h)
                with self._counters:
                    self.bytes_downloaded += len(resp.content)
            except httpx.TransportError as e:
                refusal = _tls_refusal(e)
                if refusal is not None:  # permanent: the same certificate will be presented on every try
                    raise _untrusted(self.base_url, refusal) from e
                if content is not None or time.monotonic() > deadline:
                    waited = f" within {self.retry_s:.0f} s" if retry and self.retry_s > 0 else ""
                    raise E.ServerUnreachable(
                        f"no answer from {self.base_url}{waited} ({type(e).__name__}: {e}): is `secure-afl "
                        "server run` up at that address?") from e
                if not waiting:
                    waiting = True
                    log.warning("no answer from %s yet (%s); trying again for up to %.0f s", self.base_url,
                                e, max(0.0, deadline - time.monotonic()))
                time.sleep(0.25)
                continue
            if resp.status_code in _RETRY_STATUSES and content is None:
                wait = retry_delay(attempt, resp.headers.get("retry-after"))
                if time.monotonic() + wait <= busy_deadline:
                    with self._counters:
                        self.busy_retries += 1
                    attempt += 1
                    time.sleep(wait)
                    continue
            break
        if resp.status_code >= 400:
            raise error_from_response(resp)
        return resp

    def info(self) -> dict:
        """The public session info: what a hospital needs to build its upload; no upload count, no names' fates."""
        return self.request("GET", self.path(), signed=False).json()

    def status(self) -> dict:
        """The signed party's own view of the session status (mutual TLS; server/status.py ``status_view``):
        the key holder sees every roster hospital's state, a roster hospital its own entry and the counts."""
        return self.request("GET", self.path("/status")).json()

    def wait_until(self, predicate, *, timeout: float, interval: float = 0.2, what: str = "condition",
                   read=None) -> dict:
        """Poll ``read()`` (the public info by default; :meth:`status` for what only the parties see) until
        ``predicate`` holds on it; bounded by ``timeout``."""
        read = self.info if read is None else read
        deadline = time.monotonic() + timeout
        while True:
            info = read()
            if predicate(info):
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"gave up waiting for {what} after {timeout:.0f} s (status {info['status']})")
            time.sleep(interval)
