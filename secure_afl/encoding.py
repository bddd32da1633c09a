"""Canonical JSON (the bytes every hash and signature covers) and the strict parser for untrusted JSON.

One writer, one reader, for every signed or hashed statement, header and
digest of the project: :func:`canonical_json` is ``json.dumps`` with sorted
keys, compact separators, ASCII output and ``allow_nan=False`` (NaN and
infinities have no canonical form, so a statement holding one is refused at
the writer, never hashed). :func:`parse_json` accepts one plain JSON document
and raises :class:`~secure_afl.exceptions.MalformedPayload` for anything else.
Files written for people to read (reports, receipts on disk) may use
``indent``; nothing hashes those bytes.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .exceptions import MalformedPayload

__all__ = ["canonical_json", "canonical_text", "parse_json", "MAX_JSON_DEPTH"]

# Every message this protocol defines nests at most a few levels; the bound stops a
# deeply nested document before the parser recurses on it.
MAX_JSON_DEPTH = 32


def canonical_json(obj: Any) -> bytes:
    """The byte string that is hashed or signed for ``obj`` (ValueError for NaN or infinity)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def canonical_text(obj: Any) -> str:
    """:func:`canonical_json` as a ``str`` (for a header value or a digest's input that is text)."""
    return canonical_json(obj).decode("ascii")


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise MalformedPayload(f"duplicated JSON key {k[:40]!r}")
        out[k] = v
    return out


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = {c: None for c in range(128) if chr(c) not in "[]{}"}


def _too_deep(text: str, max_depth: int) -> bool:
    """Bracket nesting outside strings exceeds ``max_depth`` (C-speed filtering, early exit)."""
    if text.count("[") + text.count("{") <= max_depth:
        return False
    brackets = _STRING.sub("", text).translate(_NOT_BRACKET)
    depth = 0
    for ch in brackets:
        if ch in "[{":
            depth += 1
            if depth > max_depth:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def parse_json(data, what: str = "message", *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse untrusted JSON: :class:`MalformedPayload` for anything but one plain document.

    Refuses non-UTF-8 input, nesting deeper than ``max_depth``, duplicated
    object keys (two parsers could disagree on which one counts) and
    non-finite numbers.
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedPayload(f"{what} is not UTF-8") from None
    if not isinstance(data, str):
        raise MalformedPayload(f"{what} is not text")
    if _too_deep(data, max_depth):
        raise MalformedPayload(f"{what} nests deeper than {max_depth} levels")

    def _no_constant(name):
        raise MalformedPayload(f"{what} contains {name}")

    try:
        return json.loads(data, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except (json.JSONDecodeError, RecursionError):
        raise MalformedPayload(f"{what} is not JSON") from None
