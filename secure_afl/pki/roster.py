"""The CA-signed roster of enrolled parties, and pinning the one enrolled server or key holder.

:func:`pinned_identity` is the one place any party learns whom to trust.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

from secure_afl import domains
from secure_afl.encoding import canonical_json
from secure_afl.exceptions import InvalidSignature, MalformedPayload, MissingEnrolment
from .identity import CA_CERT, Enrolment, ROSTER, cert_fingerprint, check_role, load_certificate

__all__ = ["load_enrolments", "roster_message", "load_roster", "pinned_identity", "enrolled_keys"]


_ROSTER_PREFIX = domains.ROSTER


def load_enrolments(pki_dir, *, role: str = "hospital") -> dict[str, Enrolment]:
    """``{name: Enrolment}`` of every party with ``role``.

    From the CA-signed ``roster.json`` when ``pki_dir`` is a party's bundle
    (:func:`make_bundles`); otherwise from every ``<role>-*/enrolment.json``
    (the operator's own PKI directory).
    """
    check_role(role, "load_enrolments")
    if (Path(pki_dir) / ROSTER).exists():
        return {e.name: e for e in load_roster(pki_dir) if e.role == role}
    out: dict[str, Enrolment] = {}
    for f in sorted(Path(pki_dir).glob(f"{role}-*/enrolment.json")):
        e = Enrolment.from_dict(json.loads(f.read_text()))
        if e.role == role:
            out[e.name] = e
    return out


def roster_message(body: dict) -> bytes:
    return _ROSTER_PREFIX + canonical_json(body)


def load_roster(pki_dir) -> list[Enrolment]:
    """The parties of ``pki_dir/roster.json``, after checking the CA's signature over it.

    :class:`InvalidSignature` if the roster was altered or signed by another CA.
    """
    from cryptography.exceptions import InvalidSignature as _Bad
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    d = Path(pki_dir)
    try:
        doc = json.loads((d / ROSTER).read_text())
        body, sig = doc["roster"], bytes.fromhex(doc["signature"])
    except (KeyError, TypeError, ValueError):
        raise MalformedPayload(f"{d / ROSTER} is not a roster") from None
    ca = load_certificate(d / CA_CERT)
    try:
        ca.public_key().verify(sig, roster_message(body), ec.ECDSA(hashes.SHA256()))
    except _Bad:
        raise InvalidSignature(f"{d / ROSTER} is not signed by the consortium CA in {d / CA_CERT}") from None
    if body.get("ca_sha256") != cert_fingerprint(ca):
        raise InvalidSignature(f"{d / ROSTER} names another CA")
    return [Enrolment.from_dict(p) for p in body.get("parties", [])]


def pinned_identity(pki_dir, role: str, name: str | None = None):
    """The Ed25519 identity public key the roster pins for ``role`` (and ``name``).

    The one place any party learns whom to trust: the server a hospital or
    the key holder talks to, the key holder whose parameters a hospital
    checks, the parties an auditor's log names. With ``name`` None the role
    must have exactly one party (the server, the key holder).
    :class:`MissingEnrolment` otherwise.
    """
    parties = load_enrolments(pki_dir, role=role)
    if name is None:
        if len(parties) != 1:
            raise MissingEnrolment(f"{pki_dir} enrols {len(parties)} {role} identities "
                                   f"({', '.join(sorted(parties)) or 'none'}); name the one to pin with --{role} NAME "
                                   "where the command has it, or use that party's own bundle")
        return next(iter(parties.values())).public_key()
    if name not in parties:
        raise MissingEnrolment(f"{role} {name!r} is not enrolled in {pki_dir}")
    return parties[name].public_key()


def enrolled_keys(enrolments: Mapping[str, Enrolment]) -> dict:
    """``{name: Ed25519PublicKey}`` for :func:`secure_afl.signing.verify_manifest`."""
    return {name: e.public_key() for name, e in enrolments.items()}
