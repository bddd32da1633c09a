"""Loading what the consortium CA issued: identity keys, certificates, enrolments, a party's files.

Every party runs this; nothing here writes a key. See :mod:`secure_afl.pki` for the layout on disk.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from secure_afl._io import refuse_if_shared
from secure_afl._validation import param_error
from secure_afl.exceptions import InvalidSignature, MalformedPayload
from .tls import client_ssl_context, server_ssl_context, uvicorn_ssl_kwargs

__all__ = ["ROLES", "URN_PARTY", "URN_IDENTITY", "CA_CERT", "CA_KEY", "ROSTER", "check_name", "check_role", "utc_now", "load_private_key", "public_key_hex", "public_key_from_hex", "identity_digest", "load_certificate", "cert_fingerprint", "load_identity_key", "load_identity_pub", "Enrolment", "PeerIdentity", "PartyFiles", "load_party", "verify_certificate", "peer_identity"]


ROLES = ("server", "keyholder", "hospital")


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


URN_PARTY = "urn:secure-afl:party:"


URN_IDENTITY = "urn:secure-afl:identity:ed25519:"


CA_CERT = "ca.pem"


CA_KEY = "ca.key"


ROSTER = "roster.json"


def check_name(name, caller: str, param: str = "name") -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise param_error(param, caller, "a name matching [A-Za-z0-9][A-Za-z0-9._-]{0,63}", name)
    return name


def check_role(role, caller: str) -> str:
    if role not in ROLES:
        raise param_error("role", caller, f"one of {ROLES}", role)
    return role


def utc_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def load_private_key(path: Path):
    from cryptography.hazmat.primitives import serialization

    return serialization.load_pem_private_key(Path(path).read_bytes(), password=None)


def public_key_hex(public_key) -> str:
    """Hex of the raw 32-byte Ed25519 public key (the form used on the wire)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if not isinstance(public_key, Ed25519PublicKey):
        raise TypeError("public_key must be an Ed25519PublicKey")
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def public_key_from_hex(value) -> "Ed25519PublicKey":  # noqa: F821
    """Parse the hex of a raw Ed25519 public key (MalformedPayload if unusable)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if not isinstance(value, str):
        raise MalformedPayload("identity public key must be a hex string")
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise MalformedPayload("identity public key is not hex") from None
    if len(raw) != 32:
        raise MalformedPayload("identity public key must be 32 bytes")
    return Ed25519PublicKey.from_public_bytes(raw)


def identity_digest(public_key) -> str:
    return hashlib.sha256(bytes.fromhex(public_key_hex(public_key))).hexdigest()


def load_certificate(path) -> "x509.Certificate":  # noqa: F821
    from cryptography import x509

    return x509.load_pem_x509_certificate(Path(path).read_bytes())


def cert_fingerprint(cert) -> str:
    """SHA-256 over the DER certificate, hex (matches ``getpeercert(True)``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    if isinstance(cert, x509.Certificate):
        cert = cert.public_bytes(serialization.Encoding.DER)
    if not isinstance(cert, (bytes, bytearray)):
        raise TypeError("cert must be an x509.Certificate or DER bytes")
    return hashlib.sha256(bytes(cert)).hexdigest()


def load_identity_key(path) -> "Ed25519PrivateKey":  # noqa: F821
    """Load an Ed25519 identity private key (PKCS#8 PEM)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = load_private_key(Path(path))
    if not isinstance(key, Ed25519PrivateKey):
        raise MalformedPayload(f"{path} is not an Ed25519 private key")
    return key


def load_identity_pub(path_or_text) -> "Ed25519PublicKey":  # noqa: F821
    """Load an Ed25519 public key from a PEM file, PEM bytes/str, or raw hex."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    data = path_or_text
    if isinstance(data, Path) or (isinstance(data, str) and "-----BEGIN" not in data and os.path.exists(data)):
        data = Path(data).read_bytes()
    if isinstance(data, str):
        data = data.encode()
    text = bytes(data).strip()
    if text.startswith(b"-----BEGIN"):
        key = serialization.load_pem_public_key(text)
        if not isinstance(key, Ed25519PublicKey):
            raise MalformedPayload("not an Ed25519 public key")
        return key
    return public_key_from_hex(text.decode("ascii", "replace"))


@dataclass(frozen=True)
class Enrolment:
    """What the server config lists for an enrolled party.

    Attributes
    ----------
    role, name : str
        The party (``hospital``, ``hosp-a``).
    identity_pub : str
        Hex of the raw Ed25519 identity public key; verifies its uploads.
    cert_sha256 : str
        SHA-256 of the DER TLS certificate; matches
        ``ssl_object.getpeercert(binary_form=True)`` on the server.
    """

    role: str
    name: str
    identity_pub: str
    cert_sha256: str

    def public_key(self):
        return public_key_from_hex(self.identity_pub)

    def to_dict(self) -> dict:
        return {"role": self.role, "name": self.name,
                "identity_pub": self.identity_pub, "cert_sha256": self.cert_sha256}

    @classmethod
    def from_dict(cls, d: Mapping) -> "Enrolment":
        try:
            e = cls(role=d["role"], name=d["name"], identity_pub=d["identity_pub"],
                    cert_sha256=d["cert_sha256"])
        except (KeyError, TypeError):
            raise MalformedPayload("enrolment record lacks role/name/identity_pub/cert_sha256") from None
        check_role(e.role, "Enrolment")
        check_name(e.name, "Enrolment")
        public_key_from_hex(e.identity_pub)
        return e


@dataclass(frozen=True)
class PeerIdentity:
    """Role and name read from a CA-verified peer certificate."""

    role: str
    name: str
    identity_sha256: str | None
    cert_sha256: str


@dataclass(frozen=True)
class PartyFiles:
    """Paths of one party's material; constructing it does no I/O.

    Use :func:`load_party` to get one that is checked to exist.
    """

    pki_dir: Path
    role: str
    name: str

    @property
    def directory(self) -> Path:
        return Path(self.pki_dir) / f"{self.role}-{self.name}"

    @property
    def ca_file(self) -> Path:
        return Path(self.pki_dir) / CA_CERT

    @property
    def cert_file(self) -> Path:
        return self.directory / "cert.pem"

    @property
    def key_file(self) -> Path:
        return self.directory / "key.pem"

    @property
    def identity_key_file(self) -> Path:
        return self.directory / "identity.key"

    @property
    def identity_pub_file(self) -> Path:
        return self.directory / "identity.pub"

    @property
    def enrolment_file(self) -> Path:
        return self.directory / "enrolment.json"

    def identity_key(self):
        return load_identity_key(self.identity_key_file)

    def identity_pub(self):
        return load_identity_pub(self.identity_pub_file)

    def enrolment(self) -> Enrolment:
        return Enrolment.from_dict(json.loads(self.enrolment_file.read_text()))

    def certificate(self):
        return load_certificate(self.cert_file)

    def server_ssl_context(self, *, require_client_cert: bool = True) -> ssl.SSLContext:
        return server_ssl_context(self.cert_file, self.key_file, self.ca_file,
                                  require_client_cert=require_client_cert)

    def check_validity(self, now: _dt.datetime | None = None) -> None:
        """:class:`InvalidKey` (reason ``certificate_expired``) naming the date when this party's certificate
        or its CA's is outside its validity window: the server's handshake would refuse it with no reason the
        client can read, and a retry would only wait."""
        from secure_afl.exceptions import InvalidKey

        now = now or utc_now()
        for what, path in ((f"the certificate of {self.role} {self.name}", self.cert_file),
                           ("the consortium CA's certificate", self.ca_file)):
            cert = load_certificate(path)
            start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
            if now > end:
                raise InvalidKey(f"{what} ({path}) expired on {end:%Y-%m-%d %H:%M:%S} UTC: the server refuses it at "
                                 "the handshake; ask the consortium operator for a renewed bundle "
                                 "(nothing was sent)", reason="certificate_expired")
            if now < start:
                raise InvalidKey(f"{what} ({path}) is valid only from {start:%Y-%m-%d %H:%M:%S} UTC, and this "
                                 f"machine's clock says {now:%Y-%m-%d %H:%M:%S} UTC: check the clock (nothing "
                                 "was sent)", reason="certificate_expired")

    def client_ssl_context(self, *, present_cert: bool = True) -> ssl.SSLContext:
        if present_cert:
            self.check_validity()  # before any connection, in words
            return client_ssl_context(self.ca_file, cert_file=self.cert_file, key_file=self.key_file)
        return client_ssl_context(self.ca_file)

    def uvicorn_ssl_kwargs(self, *, require_client_cert: bool = True) -> dict:
        return uvicorn_ssl_kwargs(self.cert_file, self.key_file, self.ca_file,
                                  require_client_cert=require_client_cert)


def load_party(pki_dir, role: str, name: str) -> PartyFiles:
    """Return the :class:`PartyFiles` of an issued party (FileNotFoundError if absent)."""
    check_role(role, "load_party")
    check_name(name, "load_party")
    party = PartyFiles(Path(pki_dir), role, name)
    for p in (party.ca_file, party.cert_file, party.key_file, party.identity_key_file,
              party.identity_pub_file):
        if not p.is_file():
            raise FileNotFoundError(f"{p} is missing: --pki must be the bundle the consortium operator made for "
                                    f"{role} {name!r} (`secure-afl pki bundle`); ask the operator for it")
    for p in (party.key_file, party.identity_key_file):
        refuse_if_shared(p, "private key")
    return party


def verify_certificate(cert, ca_cert, *, now: _dt.datetime | None = None) -> None:
    """Check that ``cert`` was issued by ``ca_cert`` and is within validity.

    Raises :class:`InvalidSignature` (no detail) otherwise. Revocation is not
    checked (the consortium has no CRL; re-key by re-issuing the CA).
    """
    from cryptography.exceptions import InvalidSignature as _CryptoInvalidSignature

    now = now or utc_now()
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, _CryptoInvalidSignature):
        raise InvalidSignature() from None
    for c in (cert, ca_cert):
        if not (c.not_valid_before_utc <= now <= c.not_valid_after_utc):
            raise InvalidSignature()


def peer_identity(cert) -> PeerIdentity:
    """Role, name and identity-key digest from a peer certificate.

    ``cert`` is an ``x509.Certificate`` or DER bytes (``getpeercert(True)``).
    The caller must have verified it against the CA (the TLS handshake does).
    """
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    if isinstance(cert, (bytes, bytearray)):
        cert = x509.load_der_x509_certificate(bytes(cert))
    fp = cert_fingerprint(cert)
    role = name = ident = None
    try:
        uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
            .get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    for uri in uris:
        if uri.startswith(URN_PARTY):
            role, _, name = uri[len(URN_PARTY):].partition(":")
        elif uri.startswith(URN_IDENTITY):
            ident = uri[len(URN_IDENTITY):]
    if role is None:
        ou = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
        cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        role = ou[0].value if ou else None
        name = cn[0].value if cn else None
    if role not in ROLES or not isinstance(name, str) or not _NAME.match(name):
        raise MalformedPayload("certificate does not name a secure-afl party")
    return PeerIdentity(role=role, name=name, identity_sha256=ident, cert_sha256=fp)
