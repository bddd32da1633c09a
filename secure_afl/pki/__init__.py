"""Consortium PKI: a private CA, TLS certificates and Ed25519 identity keys.

Who runs this: the consortium operator (``secure-afl pki init`` / ``issue``),
once per party. The server, key holder and hospital clients only *load* what
it wrote. No network code lives here; the ``ssl.SSLContext`` helpers are handed
to uvicorn / httpx by the services.

Two kinds of keys per party
---------------------------
* **TLS key** (ECDSA P-256) and an X.509 certificate signed by the consortium
  CA. Used only for transport authentication (mutual TLS). ECDSA rather than
  Ed25519 because Ed25519 TLS certificates are not accepted by every OpenSSL
  build that Python's :mod:`ssl` links against.
* **Identity key** (Ed25519). Used for application-level signatures that must
  outlive the TLS connection: upload statements, server receipts, manifests
  and audit records (:mod:`secure_afl.signing`, :mod:`secure_afl.audit_log`).
  The certificate binds it: its SAN carries
  ``urn:secure-afl:identity:ed25519:<sha256 of the raw public key>``.

On-disk layout
--------------
::

    DIR/
      ca.pem                       consortium root CA certificate (ECDSA P-256)
      ca.key                       CA private key, PKCS#8 PEM, mode 0600
      <role>-<name>/               one per party, role in server|keyholder|hospital
        cert.pem                   TLS certificate signed by the CA
        key.pem                    TLS private key (ECDSA P-256), mode 0600
        identity.key               Ed25519 private key, PKCS#8 PEM, mode 0600
        identity.pub               Ed25519 public key, SubjectPublicKeyInfo PEM
        enrolment.json             {role, name, identity_pub (hex), cert_sha256}

Certificates
------------
=========  ==========================  =======================================
role       extended key usage          subject alternative names
=========  ==========================  =======================================
server     serverAuth, clientAuth      --dns entries (default 127.0.0.1,
                                       localhost), party + identity URIs
keyholder  serverAuth, clientAuth      same as server
hospital   clientAuth only             party + identity URIs (+ --dns if given)
=========  ==========================  =======================================

A hospital certificate cannot serve TLS (no serverAuth), so a hospital cannot
impersonate the server to another hospital. The subject is
``O=<consortium>, OU=<role>, CN=<name>``; :func:`peer_identity` reads role and
name back from a peer certificate.

Notes
-----
Private keys are written unencrypted (mode 0600, created with ``O_EXCL`` so an
existing key is never overwritten). Protect the directory with file-system
permissions or a secrets store; keep ``ca.key`` offline after issuing.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import ipaddress
import json
import os
import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from .. import domains
from ..encoding import canonical_json
from secure_afl._io import refuse_if_shared, write_file
from secure_afl._validation import param_error
from secure_afl.exceptions import InvalidInputError, InvalidSignature, MalformedPayload, MissingEnrolment

__all__ = [
    "ROLES",
    "Enrolment",
    "PartyFiles",
    "PeerIdentity",
    "init_ca",
    "issue",
    "load_party",
    "load_enrolments",
    "write_roster",
    "load_roster",
    "make_bundles",
    "pinned_identity",
    "enrolled_keys",
    "load_certificate",
    "load_identity_key",
    "load_identity_pub",
    "public_key_hex",
    "public_key_from_hex",
    "cert_fingerprint",
    "verify_certificate",
    "peer_identity",
    "server_ssl_context",
    "client_ssl_context",
    "uvicorn_ssl_kwargs",
    "register",
]

ROLES = ("server", "keyholder", "hospital")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_URN_PARTY = "urn:secure-afl:party:"
_URN_IDENTITY = "urn:secure-afl:identity:ed25519:"
_DEFAULT_SAN = ("127.0.0.1", "localhost")
_CLOCK_SKEW = _dt.timedelta(minutes=5)

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
ROSTER = "roster.json"
_ROSTER_PREFIX = domains.ROSTER


# --------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------


def _check_name(name, caller: str, param: str = "name") -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise param_error(param, caller, "a name matching [A-Za-z0-9][A-Za-z0-9._-]{0,63}", name)
    return name


def _check_role(role, caller: str) -> str:
    if role not in ROLES:
        raise param_error("role", caller, f"one of {ROLES}", role)
    return role


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def _write_file(path: Path, data: bytes, *, private: bool) -> None:
    """Create ``path`` (never overwrite); private files get mode 0600."""
    write_file(path, data, mode=0o600 if private else 0o644)


def _private_pem(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_private_key(path: Path):
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


def _identity_digest(public_key) -> str:
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

    key = _load_private_key(Path(path))
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


# --------------------------------------------------------------------------
# records
# --------------------------------------------------------------------------


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
        _check_role(e.role, "Enrolment")
        _check_name(e.name, "Enrolment")
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

    def client_ssl_context(self, *, present_cert: bool = True) -> ssl.SSLContext:
        if present_cert:
            return client_ssl_context(self.ca_file, cert_file=self.cert_file, key_file=self.key_file)
        return client_ssl_context(self.ca_file)

    def uvicorn_ssl_kwargs(self, *, require_client_cert: bool = True) -> dict:
        return uvicorn_ssl_kwargs(self.cert_file, self.key_file, self.ca_file,
                                  require_client_cert=require_client_cert)


# --------------------------------------------------------------------------
# issuing
# --------------------------------------------------------------------------


def init_ca(pki_dir, *, name: str = "secure-afl consortium", days: int = 3650) -> Path:
    """Create ``DIR/ca.pem`` and ``DIR/ca.key`` (0600). Refuses to overwrite.

    Returns the path of ``ca.pem``.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    if not isinstance(name, str) or not name.strip() or len(name) > 64:
        raise param_error("name", "init_ca", "a non-empty str of at most 64 characters", name)
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise param_error("days", "init_ca", "an int >= 1", days)
    d = Path(pki_dir)
    d.mkdir(parents=True, exist_ok=True)
    if (d / CA_KEY).exists() or (d / CA_CERT).exists():
        raise FileExistsError(f"{d} already holds a CA; refusing to overwrite it")

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, name),
        x509.NameAttribute(NameOID.COMMON_NAME, f"{name} root CA"),
    ])
    now = _now()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + _dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=True,
                          crl_sign=True, encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_file(d / CA_KEY, _private_pem(key), private=True)
    _write_file(d / CA_CERT, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return d / CA_CERT


def _san_entries(dns: Iterable[str]):
    from cryptography import x509

    out = []
    for entry in dns:
        entry = entry.strip()
        if not entry:
            continue
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(entry)))
        except ValueError:
            out.append(x509.DNSName(entry))
    return out


def issue(pki_dir, role: str, name: str, *, dns: Iterable[str] | None = None,
          days: int = 365) -> PartyFiles:
    """Issue a TLS certificate and an Ed25519 identity key for one party.

    Parameters
    ----------
    pki_dir : path
        Directory holding ``ca.pem`` / ``ca.key`` (from :func:`init_ca`).
    role : {"server", "keyholder", "hospital"}
    name : str
        ``[A-Za-z0-9][A-Za-z0-9._-]{0,63}``; becomes the certificate CN.
    dns : iterable of str, optional
        SAN entries (IP literals become IP SANs). Defaults to
        ``("127.0.0.1", "localhost")`` for server and keyholder, none for
        hospitals.
    days : int
        Validity of the certificate.

    Returns
    -------
    PartyFiles
        Paths of the new ``<role>-<name>/`` directory. Refuses to overwrite.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    _check_role(role, "issue")
    _check_name(name, "issue")
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise param_error("days", "issue", "an int >= 1", days)
    d = Path(pki_dir)
    ca_key = _load_private_key(d / CA_KEY)
    ca_cert = load_certificate(d / CA_CERT)
    party = PartyFiles(d, role, name)
    party.directory.mkdir(mode=0o700)  # FileExistsError if the party exists

    if dns is None:
        dns = _DEFAULT_SAN if role in ("server", "keyholder") else ()
    identity = Ed25519PrivateKey.generate()
    tls_key = ec.generate_private_key(ec.SECP256R1())
    org = ca_cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    subject = x509.Name(
        ([x509.NameAttribute(NameOID.ORGANIZATION_NAME, org[0].value)] if org else [])
        + [x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
           x509.NameAttribute(NameOID.COMMON_NAME, name)]
    )
    san = _san_entries(dns) + [
        x509.UniformResourceIdentifier(f"{_URN_PARTY}{role}:{name}"),
        x509.UniformResourceIdentifier(_URN_IDENTITY + _identity_digest(identity.public_key())),
    ]
    eku = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if role in ("server", "keyholder"):
        eku.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    now = _now()
    not_after = min(now + _dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(tls_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=False,
                          crl_sign=False, encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(eku), critical=False)
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(tls_key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_file(party.key_file, _private_pem(tls_key), private=True)
    _write_file(party.cert_file, cert.public_bytes(serialization.Encoding.PEM), private=False)
    _write_file(party.identity_key_file, _private_pem(identity), private=True)
    _write_file(
        party.identity_pub_file,
        identity.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo),
        private=False,
    )
    enrolment = Enrolment(role=role, name=name, identity_pub=public_key_hex(identity.public_key()),
                          cert_sha256=cert_fingerprint(cert))
    _write_file(party.enrolment_file,
                (json.dumps(enrolment.to_dict(), indent=2, sort_keys=True) + "\n").encode(),
                private=False)
    return party


def load_party(pki_dir, role: str, name: str) -> PartyFiles:
    """Return the :class:`PartyFiles` of an issued party (FileNotFoundError if absent)."""
    _check_role(role, "load_party")
    _check_name(name, "load_party")
    party = PartyFiles(Path(pki_dir), role, name)
    for p in (party.ca_file, party.cert_file, party.key_file, party.identity_key_file,
              party.identity_pub_file):
        if not p.is_file():
            raise FileNotFoundError(f"{p} is missing: --pki must be the bundle the consortium operator made for "
                                    f"{role} {name!r} (`secure-afl pki bundle`); ask the operator for it")
    for p in (party.key_file, party.identity_key_file):
        refuse_if_shared(p, "private key")
    return party


def load_enrolments(pki_dir, *, role: str = "hospital") -> dict[str, Enrolment]:
    """``{name: Enrolment}`` of every party with ``role``.

    From the CA-signed ``roster.json`` when ``pki_dir`` is a party's bundle
    (:func:`make_bundles`); otherwise from every ``<role>-*/enrolment.json``
    (the operator's own PKI directory).
    """
    _check_role(role, "load_enrolments")
    if (Path(pki_dir) / ROSTER).exists():
        return {e.name: e for e in load_roster(pki_dir) if e.role == role}
    out: dict[str, Enrolment] = {}
    for f in sorted(Path(pki_dir).glob(f"{role}-*/enrolment.json")):
        e = Enrolment.from_dict(json.loads(f.read_text()))
        if e.role == role:
            out[e.name] = e
    return out


def _roster_message(body: dict) -> bytes:
    return _ROSTER_PREFIX + canonical_json(body)


def write_roster(pki_dir, out_file) -> Path:
    """Sign the roster of every issued party (role, name, identity key, certificate hash) with the CA key."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    d = Path(pki_dir)
    parties = []
    for role in ROLES:
        parties += [e.to_dict() for e in sorted(load_enrolments(d, role=role).values(), key=lambda e: e.name)]
    body = {"v": 1, "ca_sha256": cert_fingerprint(load_certificate(d / CA_CERT)), "parties": parties}
    ca_key = _load_private_key(d / CA_KEY)
    sig = ca_key.sign(_roster_message(body), ec.ECDSA(hashes.SHA256()))
    out = Path(out_file)
    out.write_text(json.dumps({"roster": body, "signature": sig.hex()}, indent=2, sort_keys=True) + "\n")
    return out


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
        ca.public_key().verify(sig, _roster_message(body), ec.ECDSA(hashes.SHA256()))
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
            raise MissingEnrolment(f"{pki_dir} enrols {len(parties)} {role} identities; name the one to pin")
        return next(iter(parties.values())).public_key()
    if name not in parties:
        raise MissingEnrolment(f"{role} {name!r} is not enrolled in {pki_dir}")
    return parties[name].public_key()


_PARTY_FILES = ("cert.pem", "key.pem", "identity.key", "identity.pub", "enrolment.json")


def make_bundles(pki_dir, out_dir) -> dict[str, Path]:
    """One directory per issued party, holding exactly what that party needs.

    ``OUT/<role>-<name>/`` = ``ca.pem`` + ``roster.json`` (every party's public
    identity and role, signed by the CA) + ``sessions/`` (the session definitions
    signed so far, :mod:`secure_afl.session`) + ``<role>-<name>/`` (this party's own
    TLS and identity keys, 0600). The CA key and other parties' private keys
    are in no bundle. Each bundle is a PKI directory every command accepts.
    """
    import shutil

    d, out = Path(pki_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    roster = write_roster(d, out / f".{ROSTER}.tmp")
    made = {}
    try:
        for role in ROLES:
            for name in sorted(load_enrolments(d, role=role)):
                party = load_party(d, role, name)
                bundle = out / f"{role}-{name}"
                if bundle.exists():
                    raise FileExistsError(f"{bundle} already exists; bundles are never overwritten")
                (bundle / party.directory.name).mkdir(parents=True, mode=0o700)
                bundle.chmod(0o700)
                shutil.copyfile(d / CA_CERT, bundle / CA_CERT)
                shutil.copyfile(roster, bundle / ROSTER)
                for signed in sorted((d / "sessions").glob("*.json")):  # session definitions signed so far
                    (bundle / "sessions").mkdir(exist_ok=True)
                    shutil.copyfile(signed, bundle / "sessions" / signed.name)
                for f in _PARTY_FILES:
                    data = (party.directory / f).read_bytes()
                    _write_file(bundle / party.directory.name / f, data, private=f in ("key.pem", "identity.key"))
                made[f"{role}-{name}"] = bundle
    finally:
        roster.unlink()
    return made


def enrolled_keys(enrolments: Mapping[str, Enrolment]) -> dict:
    """``{name: Ed25519PublicKey}`` for :func:`secure_afl.signing.verify_manifest`."""
    return {name: e.public_key() for name, e in enrolments.items()}


# --------------------------------------------------------------------------
# verification
# --------------------------------------------------------------------------


def verify_certificate(cert, ca_cert, *, now: _dt.datetime | None = None) -> None:
    """Check that ``cert`` was issued by ``ca_cert`` and is within validity.

    Raises :class:`InvalidSignature` (no detail) otherwise. Revocation is not
    checked (the consortium has no CRL; re-key by re-issuing the CA).
    """
    from cryptography.exceptions import InvalidSignature as _CryptoInvalidSignature

    now = now or _now()
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
        if uri.startswith(_URN_PARTY):
            role, _, name = uri[len(_URN_PARTY):].partition(":")
        elif uri.startswith(_URN_IDENTITY):
            ident = uri[len(_URN_IDENTITY):]
    if role is None:
        ou = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
        cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        role = ou[0].value if ou else None
        name = cn[0].value if cn else None
    if role not in ROLES or not isinstance(name, str) or not _NAME.match(name):
        raise MalformedPayload("certificate does not name a secure-afl party")
    return PeerIdentity(role=role, name=name, identity_sha256=ident, cert_sha256=fp)


# --------------------------------------------------------------------------
# TLS contexts
# --------------------------------------------------------------------------


def server_ssl_context(cert_file, key_file, ca_file, *, require_client_cert: bool = True) -> ssl.SSLContext:
    """TLS server context; mutual TLS (client cert from the CA) unless disabled.

    TLS 1.2 is the floor. With ``require_client_cert=False`` any client may
    connect and the application must authenticate it another way.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # TLS 1.2: forward-secret AEAD suites only (TLS 1.3 suites are all of that kind)
    ctx.set_ciphers("ECDHE+AESGCM:ECDHE+CHACHA20")
    ctx.load_cert_chain(certfile=str(cert_file), keyfile=str(key_file))
    if require_client_cert:
        ctx.load_verify_locations(cafile=str(ca_file))
        ctx.verify_mode = ssl.CERT_REQUIRED
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def client_ssl_context(ca_file, *, cert_file=None, key_file=None) -> ssl.SSLContext:
    """TLS client context that trusts only the consortium CA.

    Hostname checking stays on (the server certificate carries 127.0.0.1 and
    localhost by default). Give ``cert_file``/``key_file`` to present a client
    certificate (mutual TLS). For httpx: ``httpx.Client(verify=ctx)``.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cafile=str(ca_file))
    if cert_file is not None:
        ctx.load_cert_chain(certfile=str(cert_file), keyfile=None if key_file is None else str(key_file))
    elif key_file is not None:
        raise param_error("key_file", "client_ssl_context", "None when cert_file is None", key_file)
    return ctx


def uvicorn_ssl_kwargs(cert_file, key_file, ca_file, *, require_client_cert: bool = True) -> dict:
    """Keyword arguments for ``uvicorn.run`` / ``uvicorn.Config``."""
    return {
        "ssl_certfile": str(cert_file),
        "ssl_keyfile": str(key_file),
        "ssl_ca_certs": str(ca_file),
        "ssl_cert_reqs": ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_NONE,
    }


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def _cmd_init(args) -> int:
    ca = init_ca(args.dir, name=args.name, days=args.days)
    print(f"created {ca} and {Path(args.dir) / CA_KEY} (0600)")
    return 0


def _cmd_issue(args) -> int:
    dns = None if args.dns is None else [s for s in args.dns.split(",") if s.strip()]
    try:
        party = issue(args.dir, args.role, args.name, dns=dns, days=args.days)
    except FileExistsError:
        raise InvalidInputError(f"{Path(args.dir) / f'{args.role}-{args.name}'} already exists") from None
    except FileNotFoundError as exc:
        raise InvalidInputError(f"{exc} (run `secure-afl pki init --dir {args.dir}` first)") from None
    print(f"created {party.directory}/{{cert.pem,key.pem,identity.key,identity.pub,enrolment.json}}")
    print(json.dumps(party.enrolment().to_dict(), sort_keys=True))
    return 0


def _cmd_bundle(args) -> int:
    made = make_bundles(args.dir, args.out)
    for party, path in made.items():
        print(f"{party:<24} -> {path}/  (ca.pem, roster.json, {party}/)")
    print(f"hand each directory to its party only; {Path(args.dir) / CA_KEY} is in none of them")
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="pki_command", metavar="ACTION", required=True)
    p = sub.add_parser("init", help="create the consortium CA (DIR/ca.pem, DIR/ca.key)")
    p.add_argument("--dir", required=True, help="PKI directory")
    p.add_argument("--name", default="secure-afl consortium", help="consortium name (CA subject O)")
    p.add_argument("--days", type=int, default=3650, help="CA validity in days")
    p.set_defaults(func=_cmd_init)

    p = sub.add_parser("issue", help="issue a TLS certificate and an Ed25519 identity for a party")
    p.add_argument("--dir", required=True, help="PKI directory holding the CA")
    p.add_argument("--role", required=True, choices=ROLES)
    p.add_argument("--name", required=True, help="party name, e.g. hosp-a")
    p.add_argument("--dns", default=None,
                   help="comma-separated SAN entries (default for server/keyholder: 127.0.0.1,localhost)")
    p.add_argument("--days", type=int, default=365, help="certificate validity in days")
    p.set_defaults(func=_cmd_issue)

    p = sub.add_parser("bundle", help="one directory per party: CA, signed roster, its own keys only")
    p.add_argument("--dir", required=True, help="PKI directory holding the CA and every issued party")
    p.add_argument("--out", required=True, help="directory to create the bundles in")
    p.set_defaults(func=_cmd_bundle)
