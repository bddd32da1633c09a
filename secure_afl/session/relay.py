"""What the server relays about a session, checked against the signed definition: the first field that
disagrees is named."""

from __future__ import annotations

from typing import Any, Mapping

from secure_afl.exceptions import ParameterMismatch, WrongSession
from secure_afl.params import SessionParams
from secure_afl.tagging import TAG_KEY_PARAM

from .definition import SessionDefinition

def check_info(definition: SessionDefinition, info: Mapping[str, Any], *, source: str = "the server"):
    """The parameters a party may use, after checking what ``source`` relays against the signed definition.

    Every protocol value in the server's session info (the session id, the
    parameters and their digest, backend, min_clients, min_class_count, the
    roster, the upload cap, an absolute deadline, and for secagg the client
    numbering and round limit, and the colluder bound c) must be the signed one; the first that is not
    is named. For ckks and bfv the parameters may add only the key holder's
    context hash and tag key (which its own signature covers).
    """

    if info.get("session_id") != definition.session_id:
        raise WrongSession(f"{source} serves session {info.get('session_id')!r}; the signed definition is for "
                           f"{definition.session_id!r}")
    try:
        got = SessionParams.from_dict(info["params"])
    except (KeyError, TypeError, ValueError):
        raise ParameterMismatch(f"{source} relays no session parameters") from None
    if got.digest().hex() != info.get("params_digest"):
        raise ParameterMismatch(f"{source}'s parameter digest does not match its parameters")
    expected = definition.session_params().to_dict()
    seen = got.to_dict()
    if definition.backend in ("ckks", "bfv", "split"):
        from secure_afl.backends.ckks import PUBLIC_CONTEXT_KEY

        seen["backend_params"] = {k: v for k, v in seen["backend_params"].items()
                                  if k not in (PUBLIC_CONTEXT_KEY, TAG_KEY_PARAM)}
    check_same(expected, seen, what="params.", source=source)
    b = definition.body
    relayed = {"backend": info.get("backend"), "min_clients": info.get("min_clients"),
               "min_class_count": info.get("min_class_count"), "hospitals": info.get("hospitals"),
               "max_upload_bytes": info.get("max_upload_bytes"), "colluders": info.get("colluders")}
    check_same({k: b[k] for k in relayed}, relayed, what="", source=source)
    if b["deadline"] is not None and info.get("deadline") != b["deadline"]:
        check_same({"deadline": b["deadline"]}, {"deadline": info.get("deadline")}, what="", source=source)
    if b["backend"] == "secagg":
        sa = info.get("secagg") or {}
        check_same({"client_ids": definition.client_ids, "max_rounds": b["secagg"]["max_rounds"]},
                   {"client_ids": sa.get("client_ids"), "max_rounds": sa.get("max_rounds")},
                   what="secagg.", source=source)
        return definition.session_params()
    return got


def _flatten(value, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


_DERIVED = {"colluders", "max_refusals", "secagg.threshold", "secagg.neighbours", "dp.min_contributors"}


def check_same(expected: Mapping[str, Any], got: Mapping[str, Any], *, what: str, source: str) -> None:
    """Refuse, naming the first field, when ``got`` disagrees with the signed ``expected``."""
    a, b = _flatten(expected), _flatten(got)
    # a value the signing derives from others (the default colluder bound from min_clients, ...) is named only
    # when nothing the operator wrote differs: the key a person changed is the one to name
    for field in sorted(set(a) | set(b), key=lambda f: (f in _DERIVED, f)):
        if a.get(field, "<absent>") != b.get(field, "<absent>"):
            raise ParameterMismatch(f"{source} disagrees with the signed session definition on {what}{field}: "
                                    f"signed {a.get(field, '<absent>')!r}, got {b.get(field, '<absent>')!r}")
