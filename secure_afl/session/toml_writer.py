"""``session.toml`` for people: a writer that escapes every string (TOML basic strings)."""

from __future__ import annotations

import datetime as _dt
import math
import re
from pathlib import Path
from typing import Any, Mapping

from secure_afl.exceptions import InvalidParameterError

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_str(s: str) -> str:
    """A TOML basic string: quote, backslash and every control character (incl. DEL) escaped."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\u{o:04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise InvalidParameterError(f"{v!r} has no place in a session file")
        return repr(v)
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, _dt.datetime):
        return v.isoformat()
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise InvalidParameterError(f"cannot write {type(v).__name__} {v!r} to TOML")


def _toml_key(k: str) -> str:
    return k if _BARE.match(k) else _toml_str(k)


def write_toml(path, sections: Mapping[str, Mapping[str, Any]]) -> None:
    """Write ``{section: {key: value}}`` as TOML (strings escaped; None values left out)."""
    lines = []
    for section, values in sections.items():
        lines.append(f"[{_toml_key(section)}]")
        lines += [f"{_toml_key(k)} = {toml_value(v)}" for k, v in values.items() if v is not None]
        lines.append("")
    Path(path).write_text("\n".join(lines), encoding="utf-8")
