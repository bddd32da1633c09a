"""The key holder's own signed HTTPS connection to the aggregation server.

The hospitals' transport (:mod:`secure_afl.transport.tls_client`: mTLS with the
consortium CA, an Ed25519 signature on every call, 4xx answers as the
library's typed exceptions, retries after a restart or a 429/503) with what
differs for the key holder: longer timeouts (it downloads every upload) and
a signed ``info``.
"""

from __future__ import annotations

from secure_afl.transport.tls_client import ServiceClient

__all__ = ["KeyHolderConnection"]


class KeyHolderConnection(ServiceClient):
    def __init__(self, base_url: str, party, session_id: str, *, timeout: float = 300.0, retry_s: float = 60.0):
        super().__init__(base_url, party, session_id, timeout=timeout, retry_s=retry_s)

    def info(self) -> dict:
        return self.request("GET", self.path()).json()
