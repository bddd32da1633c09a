"""Signing and pinning: the operator signs the canonical definition with the CA key; every party loads it
from ``<pki>/sessions/<id>.json`` after checking that signature."""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any, Mapping

from secure_afl import domains, pki
from secure_afl.encoding import canonical_json
from secure_afl.exceptions import InvalidSignature, MissingEnrolment, ParameterMismatch, WrongSession

from .definition import SessionDefinition, normalise
from .schema import SCHEMA, load_toml, parse

_PREFIX = domains.SESSION
SESSIONS_DIR = "sessions"
_ABSENT = object()


def _message(body: Mapping) -> bytes:
    return _PREFIX + canonical_json(body)


def signed_path(pki_dir, session_id: str) -> Path:
    return Path(pki_dir) / SESSIONS_DIR / f"{session_id}.json"


def sign(toml_path, pki_dir, *, bundles_dir=None) -> tuple[SessionDefinition, list[Path]]:
    """Operator: check ``session.toml`` strictly, sign its definition with the CA key, and place it.

    Written to ``<pki_dir>/sessions/<id>.json`` and, with ``bundles_dir``, into
    every bundle there (:func:`sign_definition`).
    """

    sections = load_toml(toml_path)
    issued = pki.load_enrolments(pki_dir, role="hospital")
    definition = normalise(sections, issued_hospitals=sorted(issued), source=str(toml_path))
    return definition, sign_definition(definition, pki_dir, bundles_dir=bundles_dir)


def sign_definition(definition: SessionDefinition, pki_dir, *, bundles_dir=None) -> list[Path]:
    """Sign ``definition`` with the CA key of ``pki_dir``; place it there and in every bundle of ``bundles_dir``.

    A definition already placed under the same id is replaced only by the same
    one: a session's definition never changes once handed out.
    """
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    from secure_afl import pki

    body = dict(definition.body)
    body["ca_sha256"] = pki.cert_fingerprint(pki.load_certificate(Path(pki_dir) / pki.CA_CERT))
    key = pki.load_private_key(Path(pki_dir) / pki.CA_KEY)
    sig = key.sign(_message(body), ec.ECDSA(hashes.SHA256()))
    text = json.dumps({"definition": body, "signature": sig.hex()}, indent=2, sort_keys=True) + "\n"
    targets = [signed_path(pki_dir, definition.session_id)]
    if bundles_dir is not None:
        targets += [signed_path(b, definition.session_id) for b in sorted(Path(bundles_dir).iterdir())
                    if (b / pki.ROSTER).exists()]
    for t in targets:
        if t.exists():
            try:
                old = json.loads(t.read_text()).get("definition")
            except ValueError:
                old = None
            if old != body:
                raise ParameterMismatch(f"{t} already defines session {definition.session_id} otherwise; a signed "
                                        "session never changes: give the new definition another id")
    for t in targets:
        t.parent.mkdir(parents=True, exist_ok=True)
        t.write_text(text)
    return targets


def load_signed(pki_dir, session_id: str) -> SessionDefinition:
    """The definition of ``session_id`` in ``<pki_dir>/sessions/``, after the CA's signature check.

    Refused (one line, the file named): missing, not signed by the CA in
    ``<pki_dir>/ca.pem``, signed for another session id, or not a valid
    definition under the schema.
    """
    from cryptography.exceptions import InvalidSignature as _Bad
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    from secure_afl import pki

    path = signed_path(pki_dir, session_id)
    if not path.exists():
        nested = sorted(p for p in Path(pki_dir).glob(f"*/sessions/{path.name}"))
        if nested:
            # `cp -r BUNDLE pki` into an existing pki/ puts the new bundle inside it: the definition is here,
            # one folder too deep, and the operator did sign it
            inner = nested[0].parent.parent
            raise MissingEnrolment(f"no signed definition of session {session_id!r} at {path}, but a bundle was "
                                   f"copied inside this one: {inner} holds it. Copy the bundle's contents "
                                   f"instead (cp -r BUNDLE/. {pki_dir}/) and remove {inner}")
        raise MissingEnrolment(f"no signed definition of session {session_id!r} at {path}: the operator signs it "
                               "with `secure-afl session sign session.toml --pki PKI --bundles BUNDLES`")
    try:
        doc = json.loads(path.read_text())
        body, sig = doc["definition"], bytes.fromhex(doc["signature"])
        if not isinstance(body, dict):
            raise TypeError
    except (KeyError, TypeError, ValueError):
        raise InvalidSignature(f"{path} is not a signed session definition") from None
    ca = pki.load_certificate(Path(pki_dir) / pki.CA_CERT)
    try:
        ca.public_key().verify(sig, _message(body), ec.ECDSA(hashes.SHA256()))
    except _Bad:
        raise InvalidSignature(f"{path} is not signed by the consortium CA in {Path(pki_dir) / pki.CA_CERT}") from None
    if body.get("ca_sha256") != pki.cert_fingerprint(ca):
        raise InvalidSignature(f"{path} names another CA")
    if body.get("id") != session_id:
        raise WrongSession(f"{path} is signed for session {body.get('id')!r}, not {session_id!r}")
    return from_body({k: v for k, v in body.items() if k != "ca_sha256"}, source=str(path))


def from_body(body: Mapping[str, Any], *, source: str) -> SessionDefinition:
    """Re-check a canonical body under the schema (a signed body that does not normalise to itself is refused)."""
    if body.get("v") != 1:
        raise ParameterMismatch(f"{source}: unknown session definition version {body.get('v')!r}")
    sections: dict[str, dict] = {"session": {k: body[k] for k in SCHEMA["session"]
                                             if k in body and body[k] is not None}}
    try:
        sections["bounds"] = dict(body["bounds"])
        for key in ("secagg", "dp", "extractor", "split", "ckks"):
            if body.get(key) is not None:
                sections[key] = {k: v for k, v in body[key].items() if v is not None}
        if "deadline" in sections["session"]:
            sections["session"]["deadline"] = _dt.datetime.fromtimestamp(body["deadline"], _dt.timezone.utc)
        again = normalise(parse(sections, source=source), source=source, signed=True)
    except (KeyError, TypeError, AttributeError):
        raise ParameterMismatch(f"{source}: not a session definition") from None
    extra = set(body) - set(again.body)
    if extra or any(again.body[k] != body.get(k, _ABSENT) for k in again.body):
        bad = sorted(extra) or [k for k in again.body if again.body[k] != body.get(k, _ABSENT)]
        raise ParameterMismatch(f"{source}: the definition is not in canonical form (field {bad[0]!r})")
    return again
