"""The payload envelope every backend's bytes travel in.

    b"SAFLPAY1" | u32 header length | canonical JSON header | body

The header binds the session id, backend, parameter digest, layout id, the
payload kind ("contribution" or "aggregate") and the SHA-256 of the body, so
a payload for another session or other parameters is refused before its body
is looked at, and any truncation or bit flip in the body is detected.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from . import domains
from .exceptions import MalformedPayload, ParameterMismatch, WrongSession
from .params import SessionParams
from .encoding import canonical_json, parse_json

__all__ = ["seal", "open_envelope", "Envelope", "peek_header", "MAX_HEADER"]

_MAGIC = domains.PAYLOAD_MAGIC
_LEN = struct.Struct("<I")
MAX_HEADER = 64 * 1024
KINDS = ("contribution", "aggregate")


@dataclass(frozen=True)
class Envelope:
    header: dict
    body: bytes


def seal(params: SessionParams, kind: str, body: bytes, **extra) -> bytes:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    header = {
        "session_id": params.session_id,
        "backend": params.backend,
        "params_digest": params.digest().hex(),
        "layout": params.layout.layout_id,
        "kind": kind,
        "body_sha256": hashlib.sha256(body).hexdigest(),
        "body_len": len(body),
    }
    header.update(extra)
    hb = canonical_json(header)
    return _MAGIC + _LEN.pack(len(hb)) + hb + body


def sealed_size(params: SessionParams, kind: str, body_len: int, **extra) -> int:
    """The length :func:`seal` gives a body of ``body_len`` bytes (without forming the body: a hash is always
    64 hex digits)."""
    header = {"session_id": params.session_id, "backend": params.backend, "params_digest": params.digest().hex(),
              "layout": params.layout.layout_id, "kind": kind, "body_sha256": "0" * 64, "body_len": int(body_len)}
    header.update(extra)
    return len(_MAGIC) + _LEN.size + len(canonical_json(header)) + int(body_len)


def peek_header(data: bytes, *, accepted: bool = False) -> Envelope:
    """Parse the envelope without checking it against any session.

    ``accepted``: these exact bytes are an upload the server accepted after this function checked its body
    digest (the caller has just matched their SHA-256 against the accepted upload's), so the body is not
    hashed a second time. Every other caller leaves it False."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("payload must be bytes")
    data = bytes(data)
    if len(data) < len(_MAGIC) + _LEN.size or not data.startswith(_MAGIC):
        raise MalformedPayload("not a secure-afl payload (bad magic or truncated)")
    (hlen,) = _LEN.unpack_from(data, len(_MAGIC))
    start = len(_MAGIC) + _LEN.size
    if hlen > MAX_HEADER or start + hlen > len(data):
        raise MalformedPayload("payload header length out of range")
    header = parse_json(data[start:start + hlen], "payload header")
    if not isinstance(header, dict):
        raise MalformedPayload("payload header is not an object")
    body = data[start + hlen:]
    if header.get("body_len") != len(body):
        raise MalformedPayload("payload body truncated or extended")
    if not accepted and header.get("body_sha256") != hashlib.sha256(body).hexdigest():
        raise MalformedPayload("payload body does not match its digest")
    return Envelope(header, body)


def open_envelope(params: SessionParams, data: bytes, kind: str, *, accepted: bool = False) -> Envelope:
    """Return the envelope if it belongs to ``params`` and has ``kind`` (``accepted``: :func:`peek_header`)."""
    env = peek_header(data, accepted=accepted)
    h = env.header
    if h.get("session_id") != params.session_id:
        raise WrongSession(f"payload is for session {h.get('session_id')!r}, not {params.session_id!r}")
    if h.get("backend") != params.backend:
        raise ParameterMismatch(f"payload backend {h.get('backend')!r} != session backend {params.backend!r}")
    if h.get("layout") != params.layout.layout_id:
        raise ParameterMismatch(f"payload layout {h.get('layout')!r} != {params.layout.layout_id!r}")
    if h.get("params_digest") != params.digest().hex():
        raise ParameterMismatch("payload was produced under other session parameters")
    if h.get("kind") != kind:
        raise MalformedPayload(f"expected a {kind} payload, got {h.get('kind')!r}")
    return env
