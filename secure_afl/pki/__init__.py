"""Consortium PKI: a private CA, TLS certificates and Ed25519 identity keys.

Who runs this: the consortium operator (``secure-afl pki init`` / ``issue``,
consortium/cli.py), once per party. The server, key holder and hospital
clients only *load* what it wrote. No network code lives here; the
``ssl.SSLContext`` helpers are handed to uvicorn / httpx by the services.

One module per job, every public name gathered here:

* :mod:`.ca` - the CA's side: create the CA, issue, sign the roster, bundles;
* :mod:`.identity` - loading keys, certificates, enrolments, a party's files;
* :mod:`.roster` - the CA-signed roster and :func:`pinned_identity`;
* :mod:`.tls` - TLS contexts.

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

from .ca import init_ca, issue, make_bundles, write_bundles, write_roster
from .identity import (
    CA_CERT,
    CA_KEY,
    ROLES,
    ROSTER,
    Enrolment,
    PartyFiles,
    PeerIdentity,
    cert_fingerprint,
    load_certificate,
    load_identity_key,
    load_identity_pub,
    load_party,
    load_private_key,
    peer_identity,
    public_key_from_hex,
    public_key_hex,
    verify_certificate,
)
from .roster import enrolled_keys, load_enrolments, load_roster, pinned_identity
from .tls import client_ssl_context, server_ssl_context, uvicorn_ssl_kwargs

__all__ = [
    "ROLES",
    "CA_CERT",
    "CA_KEY",
    "ROSTER",
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
    "write_bundles",
    "pinned_identity",
    "enrolled_keys",
    "load_certificate",
    "load_identity_key",
    "load_identity_pub",
    "load_private_key",
    "public_key_hex",
    "public_key_from_hex",
    "cert_fingerprint",
    "verify_certificate",
    "peer_identity",
    "server_ssl_context",
    "client_ssl_context",
    "uvicorn_ssl_kwargs",
]
