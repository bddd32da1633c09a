"""The consortium CA's side: create the CA, issue a party's certificate and identity, sign the roster, make bundles.

Run by the operator only (``secure-afl pki ...``, consortium/cli.py); no other party holds ``ca.key``.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import json
import os
from pathlib import Path
from typing import Iterable

from secure_afl._io import write_file
from secure_afl._validation import param_error
from .identity import CA_CERT, CA_KEY, Enrolment, PartyFiles, ROLES, ROSTER, URN_IDENTITY, URN_PARTY, cert_fingerprint, check_name, check_role, identity_digest, load_certificate, load_party, load_private_key, public_key_hex, utc_now
from .roster import load_enrolments, roster_message

__all__ = ["init_ca", "issue", "write_roster", "make_bundles"]


_DEFAULT_SAN = ("127.0.0.1", "localhost")


_CLOCK_SKEW = _dt.timedelta(minutes=5)


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
    now = utc_now()
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

    check_role(role, "issue")
    check_name(name, "issue")
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise param_error("days", "issue", "an int >= 1", days)
    d = Path(pki_dir)
    ca_key = load_private_key(d / CA_KEY)
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
        x509.UniformResourceIdentifier(f"{URN_PARTY}{role}:{name}"),
        x509.UniformResourceIdentifier(URN_IDENTITY + identity_digest(identity.public_key())),
    ]
    eku = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if role in ("server", "keyholder"):
        eku.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    now = utc_now()
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


def write_roster(pki_dir, out_file) -> Path:
    """Sign the roster of every issued party (role, name, identity key, certificate hash) with the CA key."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    d = Path(pki_dir)
    parties = []
    for role in ROLES:
        parties += [e.to_dict() for e in sorted(load_enrolments(d, role=role).values(), key=lambda e: e.name)]
    body = {"v": 1, "ca_sha256": cert_fingerprint(load_certificate(d / CA_CERT)), "parties": parties}
    ca_key = load_private_key(d / CA_KEY)
    sig = ca_key.sign(roster_message(body), ec.ECDSA(hashes.SHA256()))
    out = Path(out_file)
    out.write_text(json.dumps({"roster": body, "signature": sig.hex()}, indent=2, sort_keys=True) + "\n")
    return out


def _refuse_links(out: Path, paths) -> None:
    """:class:`InvalidInputError` (``symlink``) naming the first symbolic link at or above any of ``paths``
    below ``out``: a link planted in a bundle (even a dangling one, which ``exists()`` calls absent) would make
    the copy write where it points. Checked before the first write, so a refusal changes nothing."""
    from secure_afl.exceptions import InvalidInputError

    for path in paths:
        rel = path.relative_to(out)
        for i in range(1, len(rel.parts) + 1):
            here = out.joinpath(*rel.parts[:i])
            if here.is_symlink():
                raise InvalidInputError(f"{here} is a symbolic link (to {os.readlink(here)}); a bundle is written "
                                        "as plain files and folders only: remove the link, nothing was written",
                                        reason="symlink")
            if not here.exists():
                break


def _roster_body(path: Path):
    try:
        return json.loads(path.read_text())["roster"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


_PARTY_FILES = ("cert.pem", "key.pem", "identity.key", "identity.pub", "enrolment.json")


def make_bundles(pki_dir, out_dir) -> dict[str, Path]:
    """``{"<role>-<name>": bundle}`` of :func:`write_bundles`."""
    return {party: bundle for party, (bundle, _) in write_bundles(pki_dir, out_dir).items()}


def write_bundles(pki_dir, out_dir) -> dict[str, tuple[Path, list[str]]]:
    """One directory per issued party, holding exactly what that party needs.

    ``OUT/<role>-<name>/`` = ``ca.pem`` + ``roster.json`` (every party's public
    identity and role, signed by the CA) + ``sessions/`` (the session definitions
    signed so far, :mod:`secure_afl.session`) + ``<role>-<name>/`` (this party's own
    TLS and identity keys, 0600). The CA key and other parties' private keys
    are in no bundle. Each bundle is a PKI directory every command accepts.

    Run again after a party was issued or a session signed, it adds what is new: a bundle for the new
    party, the current roster and the sessions signed since into the existing bundles. Nothing a party
    already holds is overwritten: an existing bundle of another CA, with other keys for its party, or
    with another file under a signed session's name is refused, naming the file (nothing is changed).
    Returns ``{"<role>-<name>": (bundle, added)}``: ``added`` is ``["new bundle"]``, the roster and session
    files added to an existing bundle, or empty (unchanged).
    """
    import shutil

    d, out = Path(pki_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    parties = [(role, name) for role in ROLES for name in sorted(load_enrolments(d, role=role))]
    signed = sorted((d / "sessions").glob("*.json"))
    ca = (d / CA_CERT).read_bytes()
    # every check before the first write: a refusal leaves every bundle as it was
    for role, name in parties:
        bundle = out / f"{role}-{name}"
        if not bundle.exists():
            continue
        own = load_party(d, role, name).directory
        theirs = [(bundle / CA_CERT, ca)] + [(bundle / own.name / f, (own / f).read_bytes()) for f in _PARTY_FILES]
        theirs += [(bundle / "sessions" / s.name, s.read_bytes()) for s in signed]
        for path, data in theirs:
            if path.exists() and path.read_bytes() != data:
                raise FileExistsError(f"{path} differs from the one in {d}; bundles are never overwritten "
                                      "(another CA's bundle, or another party of that name?)")
            if not path.exists() and path.parent == bundle / own.name:
                raise FileExistsError(f"{bundle} exists without {path.name}; bundles are never overwritten")
    _refuse_links(out, [out / f".{ROSTER}.tmp"] + [
        p for role, name in parties for b in [out / f"{role}-{name}"]
        for p in [b / CA_CERT, b / ROSTER, b / f".{ROSTER}.tmp", *(b / f"{role}-{name}" / f for f in _PARTY_FILES),
                  *(b / "sessions" / s.name for s in signed)]])
    roster = write_roster(d, out / f".{ROSTER}.tmp")
    made: dict[str, tuple[Path, list[str]]] = {}
    try:
        for role, name in parties:
            party = load_party(d, role, name)
            bundle = out / f"{role}-{name}"
            new = not bundle.exists()
            added: list[str] = ["new bundle"] if new else []
            if new:
                (bundle / party.directory.name).mkdir(parents=True, mode=0o700)
                bundle.chmod(0o700)
                shutil.copyfile(d / CA_CERT, bundle / CA_CERT)
                for f in _PARTY_FILES:
                    data = (party.directory / f).read_bytes()
                    _write_file(bundle / party.directory.name / f, data, private=f in ("key.pem", "identity.key"))
            if _roster_body(bundle / ROSTER) != _roster_body(roster):
                # the roster is public and CA-signed: the newer one (a party issued since) replaces it; the
                # same parties keep the file the party holds (ECDSA signs the same body differently each time)
                tmp = bundle / f".{ROSTER}.tmp"
                shutil.copyfile(roster, tmp)
                os.replace(tmp, bundle / ROSTER)
                if not new:
                    added.append(ROSTER)
            for s in signed:  # session definitions signed so far
                if not (bundle / "sessions" / s.name).exists():
                    (bundle / "sessions").mkdir(exist_ok=True)
                    _write_file(bundle / "sessions" / s.name, s.read_bytes(), private=False)
                    if not new:
                        added.append(f"sessions/{s.name}")
            made[f"{role}-{name}"] = (bundle, added)
    finally:
        roster.unlink()
    return made
