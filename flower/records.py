"""What travels in Flower messages: names of the message types and record layout.

Payloads (ciphertexts, masked or plain vectors, the aggregate) ride in an
ArrayRecord as one raw byte array, so Flower chunks them in transit and the
bytes arrive exactly as signed; statements and receipts are canonical JSON in
a ConfigRecord, verified by the receiver like the HTTP headers that carry them
in the native service.
"""

from __future__ import annotations

import json
from pathlib import Path

from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from secure_afl.exceptions import MalformedPayload

PROJECT_DIR = Path(__file__).resolve().parent / "project"

ROLL_CALL = "query.roll_call"
PUBLISH = "query.publish"
UPLOAD = "train.upload"
RECEIPT = "query.receipt"
COUNTERSIGN = "query.countersign"
FINALIZE = "query.finalize"
SECAGG = "query.secagg"
SPLIT_COMMIT = "query.split_commit"
SPLIT_RESULT = "query.split_result"
SPLIT_QUERIES = "query.split_queries"

__all__ = ["PROJECT_DIR", "ROLL_CALL", "PUBLISH", "UPLOAD", "RECEIPT", "COUNTERSIGN", "FINALIZE", "SECAGG",
           "SPLIT_COMMIT", "SPLIT_RESULT", "SPLIT_QUERIES", "pack",
           "unpack_blob", "unpack_json", "unpack_str"]


def pack(fields: dict | None = None, blob: bytes | None = None) -> RecordDict:
    """JSON-able ``fields`` as strings in a ConfigRecord, ``blob`` as raw bytes in an ArrayRecord."""
    rd = RecordDict()
    rd["fields"] = ConfigRecord({k: v if isinstance(v, (str, bytes)) else json.dumps(v, separators=(",", ":"))
                                 for k, v in (fields or {}).items()})
    if blob is not None:
        rd["blob"] = ArrayRecord({"data": Array(dtype="uint8", shape=(len(blob),), stype="raw", data=blob)})
    return rd


def unpack_str(rd: RecordDict, key: str) -> str:
    try:
        value = rd["fields"][key]
    except KeyError:
        raise MalformedPayload(f"message lacks the field {key!r}") from None
    if not isinstance(value, str):
        raise MalformedPayload(f"field {key!r} must be a string")
    return value


def unpack_json(rd: RecordDict, key: str):
    try:
        return json.loads(unpack_str(rd, key))
    except ValueError:
        raise MalformedPayload(f"field {key!r} is not JSON") from None


def unpack_blob(rd: RecordDict) -> bytes:
    try:
        return bytes(rd["blob"]["data"].data)
    except (KeyError, AttributeError, TypeError):
        raise MalformedPayload("message lacks its payload") from None
