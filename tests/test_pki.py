"""Consortium PKI: certificate chain, key-file modes, mutual TLS on 127.0.0.1."""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import ssl
import stat
import threading

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from secure_afl import pki
from secure_afl.consortium.cli import register_pki
from secure_afl.exceptions import InvalidInputError, InvalidParameterError, InvalidSignature

_TIMEOUT = 5.0


@pytest.fixture(scope="module")
def consortium(tmp_path_factory):
    root = tmp_path_factory.mktemp("pki")
    good, foreign = root / "consortium", root / "foreign"
    pki.init_ca(good, name="Test Consortium")
    pki.init_ca(foreign, name="Foreign Consortium")
    return {
        "dir": good,
        "foreign_dir": foreign,
        "server": pki.issue(good, "server", "agg"),
        "keyholder": pki.issue(good, "keyholder", "kh"),
        "hosp_a": pki.issue(good, "hospital", "hosp-a"),
        "hosp_b": pki.issue(good, "hospital", "hosp-b", dns=["127.0.0.1"]),
        "foreign_hosp": pki.issue(foreign, "hospital", "hosp-a"),
        "foreign_server": pki.issue(foreign, "server", "agg"),
    }


def _tls_exchange(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext):
    """One TLS connection on 127.0.0.1; returns (client outcome, server outcome).

    The client outcome is the server's reply bytes or the exception raised;
    the server outcome is ("ok", peer DER cert or None) or the exception.
    Every socket is closed and every wait is bounded.
    """
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(_TIMEOUT)
    port = listener.getsockname()[1]
    server_result: dict = {}

    def serve():
        try:
            conn, _ = listener.accept()
        except OSError as exc:
            server_result["outcome"] = exc
            return
        try:
            conn.settimeout(_TIMEOUT)
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                peer = tls.getpeercert(binary_form=True)
                data = tls.recv(16)
                tls.sendall(b"pong:" + data)
                server_result["outcome"] = ("ok", peer)
        except (ssl.SSLError, OSError) as exc:
            server_result["outcome"] = exc
        finally:
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client_outcome: object = None
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=_TIMEOUT) as raw:
            with client_ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.sendall(b"ping")
                client_outcome = tls.recv(16)
    except (ssl.SSLError, OSError) as exc:
        client_outcome = exc
    finally:
        thread.join(_TIMEOUT)
        listener.close()
    assert not thread.is_alive(), "TLS server thread did not finish"
    return client_outcome, server_result.get("outcome")


# --------------------------------------------------------------------------
# certificates and files
# --------------------------------------------------------------------------


@pytest.mark.security
def test_issued_certificates_chain_to_consortium_ca(consortium):
    # Prepare
    ca = pki.load_certificate(consortium["dir"] / "ca.pem")
    parties = [consortium[k] for k in ("server", "keyholder", "hosp_a", "hosp_b")]

    # Execute / Assert (verify_certificate raises on failure)
    for party in parties:
        pki.verify_certificate(party.certificate(), ca)


@pytest.mark.security
def test_certificate_from_foreign_ca_rejected(consortium):
    # Prepare
    ca = pki.load_certificate(consortium["dir"] / "ca.pem")
    foreign_cert = consortium["foreign_hosp"].certificate()

    # Execute / Assert
    with pytest.raises(InvalidSignature):
        pki.verify_certificate(foreign_cert, ca)


@pytest.mark.security
def test_private_key_files_are_owner_only(consortium):
    # Prepare
    party = consortium["hosp_a"]
    private = [consortium["dir"] / "ca.key", party.key_file, party.identity_key_file]
    public = [consortium["dir"] / "ca.pem", party.cert_file, party.identity_pub_file, party.enrolment_file]

    # Execute
    private_modes = [stat.S_IMODE(p.stat().st_mode) for p in private]
    public_modes = [stat.S_IMODE(p.stat().st_mode) for p in public]

    # Assert
    assert private_modes == [0o600] * len(private)
    assert all(m & 0o022 == 0 for m in public_modes)


@pytest.mark.security
def test_issue_refuses_to_overwrite_existing_keys(consortium):
    # Prepare
    before = consortium["hosp_a"].identity_key_file.read_bytes()

    # Execute / Assert
    with pytest.raises(FileExistsError):
        pki.issue(consortium["dir"], "hospital", "hosp-a")
    with pytest.raises(FileExistsError):
        pki.init_ca(consortium["dir"])
    assert consortium["hosp_a"].identity_key_file.read_bytes() == before


@pytest.mark.security
@pytest.mark.parametrize("name", ["../escape", "", "a/b", "x" * 65, ".hidden"])
def test_party_name_that_could_escape_the_directory_refused(consortium, name):
    # Execute / Assert
    with pytest.raises(InvalidParameterError):
        pki.issue(consortium["dir"], "hospital", name)


def test_invalid_role_refused(consortium):
    # Execute / Assert
    with pytest.raises(InvalidParameterError):
        pki.issue(consortium["dir"], "auditor", "x")


@pytest.mark.security
def test_key_usages_separate_server_and_hospital_roles(consortium):
    # Prepare
    server_cert = consortium["server"].certificate()
    hosp_cert = consortium["hosp_a"].certificate()

    # Execute
    server_eku = server_cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    hosp_eku = hosp_cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    san = server_cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value

    # Assert
    assert ExtendedKeyUsageOID.SERVER_AUTH in server_eku
    assert list(hosp_eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]


def test_enrolment_record_binds_name_identity_and_certificate(consortium):
    # Prepare
    party = consortium["hosp_a"]

    # Execute
    enrolments = pki.load_enrolments(consortium["dir"])
    keys = pki.enrolled_keys(enrolments)
    peer = pki.peer_identity(party.certificate())

    # Assert
    assert sorted(enrolments) == ["hosp-a", "hosp-b"]  # hospitals only
    e = enrolments["hosp-a"]
    assert e.identity_pub == pki.public_key_hex(party.identity_key().public_key())
    assert pki.public_key_hex(keys["hosp-a"]) == e.identity_pub
    assert e.cert_sha256 == pki.cert_fingerprint(party.certificate())
    assert (peer.role, peer.name, peer.cert_sha256) == ("hospital", "hosp-a", e.cert_sha256)
    assert peer.identity_sha256 == hashlib.sha256(bytes.fromhex(e.identity_pub)).hexdigest()
    assert pki.Enrolment.from_dict(json.loads(party.enrolment_file.read_text())) == e


def test_load_party_missing_files_raise(consortium):
    # Execute / Assert
    assert pki.load_party(consortium["dir"], "server", "agg").cert_file.is_file()
    with pytest.raises(FileNotFoundError):
        pki.load_party(consortium["dir"], "hospital", "hosp-z")


def test_uvicorn_ssl_kwargs_require_client_certificates_by_default(consortium):
    # Execute
    on = consortium["server"].uvicorn_ssl_kwargs()
    off = consortium["server"].uvicorn_ssl_kwargs(require_client_cert=False)

    # Assert
    assert on["ssl_cert_reqs"] == ssl.CERT_REQUIRED and off["ssl_cert_reqs"] == ssl.CERT_OPTIONAL
    assert on["ssl_certfile"].endswith("server-agg/cert.pem")
    assert on["ssl_keyfile"].endswith("server-agg/key.pem")
    assert on["ssl_ca_certs"].endswith("ca.pem")


def test_cli_init_and_issue_write_the_documented_layout(tmp_path, capsys):
    # Prepare
    parser = argparse.ArgumentParser()
    register_pki(parser)
    d = str(tmp_path / "p")

    # Execute
    rcs = []
    for argv in (["init", "--dir", d, "--name", "CLI Consortium"],
                 ["issue", "--dir", d, "--role", "server", "--name", "agg", "--dns", "127.0.0.1,localhost"],
                 ["issue", "--dir", d, "--role", "hospital", "--name", "hosp-a"]):
        args = parser.parse_args(argv)
        rcs.append(args.func(args))
    out = capsys.readouterr().out
    with pytest.raises(InvalidInputError, match="already exists"):
        args = parser.parse_args(["issue", "--dir", d, "--role", "hospital", "--name", "hosp-a"])
        args.func(args)

    # Assert
    assert rcs == [0, 0, 0]
    for rel in ("ca.pem", "ca.key", "server-agg/cert.pem", "server-agg/key.pem", "hospital-hosp-a/identity.key",
                "hospital-hosp-a/identity.pub", "hospital-hosp-a/enrolment.json"):
        assert (tmp_path / "p" / rel).is_file(), rel
    assert '"name": "hosp-a"' in out


# --------------------------------------------------------------------------
# mutual TLS on 127.0.0.1
# --------------------------------------------------------------------------


@pytest.mark.security
def test_tls_with_enrolled_client_certificate_succeeds(consortium):
    # Prepare
    server_ctx = consortium["server"].server_ssl_context()
    client_ctx = consortium["hosp_a"].client_ssl_context()

    # Execute
    client, server = _tls_exchange(server_ctx, client_ctx)

    # Assert
    assert client == b"pong:ping"
    assert server[0] == "ok"
    peer = pki.peer_identity(server[1])
    assert (peer.role, peer.name) == ("hospital", "hosp-a")
    assert peer.cert_sha256 == pki.load_enrolments(consortium["dir"])["hosp-a"].cert_sha256


@pytest.mark.security
def test_tls_without_client_certificate_refused(consortium):
    # Prepare
    server_ctx = consortium["server"].server_ssl_context()
    client_ctx = consortium["hosp_a"].client_ssl_context(present_cert=False)

    # Execute
    client, server = _tls_exchange(server_ctx, client_ctx)

    # Assert
    assert client != b"pong:ping"
    assert isinstance(server, ssl.SSLError)


@pytest.mark.security
def test_tls_foreign_ca_refused(consortium):
    # Prepare: a hospital certificate issued by another CA, same name
    server_ctx = consortium["server"].server_ssl_context()
    foreign = consortium["foreign_hosp"]
    client_ctx = pki.client_ssl_context(consortium["dir"] / "ca.pem",
                                        cert_file=foreign.cert_file, key_file=foreign.key_file)

    # Execute
    client, server = _tls_exchange(server_ctx, client_ctx)

    # Assert
    assert client != b"pong:ping"
    assert isinstance(server, ssl.SSLError)


@pytest.mark.security
def test_tls_client_refuses_server_from_foreign_ca(consortium):
    # Prepare: an impostor server with a certificate from another CA
    server_ctx = consortium["foreign_server"].server_ssl_context(require_client_cert=False)
    client_ctx = consortium["hosp_a"].client_ssl_context()

    # Execute
    client, _ = _tls_exchange(server_ctx, client_ctx)

    # Assert
    assert isinstance(client, ssl.SSLCertVerificationError)


@pytest.mark.security
def test_tls_hospital_certificate_cannot_act_as_server(consortium):
    # Prepare: hosp-b's certificate even names 127.0.0.1, but lacks serverAuth
    hosp_b = consortium["hosp_b"]
    server_ctx = pki.server_ssl_context(hosp_b.cert_file, hosp_b.key_file, hosp_b.ca_file,
                                        require_client_cert=False)
    client_ctx = consortium["hosp_a"].client_ssl_context()

    # Execute
    client, _ = _tls_exchange(server_ctx, client_ctx)

    # Assert
    assert isinstance(client, ssl.SSLCertVerificationError)


def test_tls_client_certificate_optional_when_mtls_disabled(consortium):
    # Prepare
    server_ctx = consortium["server"].server_ssl_context(require_client_cert=False)
    client_ctx = consortium["hosp_a"].client_ssl_context(present_cert=False)

    # Execute
    client, server = _tls_exchange(server_ctx, client_ctx)

    # Assert
    assert client == b"pong:ping"
    assert server == ("ok", None)
