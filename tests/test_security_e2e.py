"""Security tests against a real ``secure-afl server run`` process (mTLS on 127.0.0.1).

One server process per module (started with :func:`secure_afl_tools.harness.start_server`
on a free port, bounded waits, always stopped in the fixture finaliser).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os

import httpx
import numpy as np
import pytest

from secure_afl import pki
from secure_afl.backends.ckks import ckks_session_params, generate_keys
from secure_afl_tools.harness import make_pki, start_server, write_session
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.tagging import generate_tag_key, new_tag, seal_tag, sign_tag
from secure_afl.protocol import API, H_TAG, H_UPLOAD, context_publication, sign_request

from support import free_port

pytestmark = [pytest.mark.security, pytest.mark.e2e]

DIM, CLASSES, GAMMA = 4, 3, 1.0
SID = "sec-e2e"
HOSPITALS = ["hosp-a", "hosp-b"]


@contextlib.contextmanager
def _live_server(tmp_path_factory):
    work = tmp_path_factory.mktemp("e2e")
    pki_dir = work / "pki"
    make_pki(pki_dir, HOSPITALS, name="e2e security")
    foreign = work / "foreign"
    pki.init_ca(foreign, name="another consortium")
    pki.issue(foreign, "hospital", "hosp-a")
    port = free_port()
    write_session(work / "session.toml", pki_dir, {
        "session": {"id": SID, "backend": "ckks", "dim": DIM, "classes": CLASSES, "gamma": GAMMA,
                    "min_clients": 2, "deadline_s": 3600, "hospitals": HOSPITALS},
        "bounds": {"max_norm": 2.0, "n_max": 100, "k_max": 4},
        "server": {"host": "127.0.0.1", "port": port, "data_dir": str(work / "server"), "pki_dir": str(pki_dir)},
    })
    proc = start_server(work / "session.toml", work / "server.log", f"https://127.0.0.1:{port}",
                        pki.load_party(pki_dir, "keyholder", "keyholder"), timeout=60)
    try:
        yield {"url": f"https://127.0.0.1:{port}", "pki": pki_dir, "foreign": foreign, "work": work}
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A server whose session awaits the key holder's context."""
    with _live_server(tmp_path_factory) as live:
        yield live


@pytest.fixture(scope="module")
def open_live(tmp_path_factory):
    """A server of its own whose session is open: the key holder has published a public context."""
    with _live_server(tmp_path_factory) as live:
        kh, client = _client(live, "keyholder", "keyholder")
        keys = generate_keys(ckks_session_params(SID, Layout(DIM, CLASSES), GAMMA, Bounds(2.0, 100, 4)))
        with client:
            published = _publish_context(kh, client, keys, keys.public_context)
        assert published.status_code == 200 and _info(live)["status"] == "open", published.text
        yield live


def _publish_context(kh, client, keys, context):
    """POST ``context`` as the session's context, signed by the key holder over the public one."""
    from secure_afl.backends.ckks import bind_public_context
    from secure_afl.keyholder_params import sign_session_params

    params = ckks_session_params(SID, Layout(DIM, CLASSES), GAMMA, Bounds(2.0, 100, 4))
    tag_key = generate_tag_key()[1]
    sig = sign_session_params(kh.identity_key(), bind_public_context(params, keys.public_context)
                              .with_backend_params(tag_public_key=tag_key))
    path = f"{API}/sessions/{SID}/context"
    body = context_publication(context, tag_key, sig)
    return client.post(path, content=body, headers=sign_request(kh.identity_key(), "keyholder:keyholder", "POST",
                                                                path, body))


def _client(live, role="hospital", name="hosp-a", present_cert=True):
    party = pki.load_party(live["pki"], role, name)
    return party, httpx.Client(base_url=live["url"], verify=party.client_ssl_context(present_cert=present_cert),
                               timeout=10)


def _info(live):
    _, c = _client(live)
    with c:
        return c.get(f"{API}/sessions/{SID}").json()


def _uploaded(live):
    """Who uploaded, from the key holder's signed status view (the public info carries no upload count)."""
    from secure_afl.transport.tls_client import ServiceClient

    with ServiceClient(live["url"], pki.load_party(live["pki"], "keyholder", "keyholder"), SID, timeout=30,
                       retry_s=5) as conn:
        return conn.status()["uploaded"]


def _audit(live):
    return [json.loads(x) for x in (live["work"] / "server" / SID / "audit.jsonl").read_text().splitlines()]


def test_tls_without_client_certificate_refused_by_server_process(live):
    # Prepare
    _, client = _client(live, present_cert=False)

    # Execute / Assert: the handshake (or the first read) fails; no HTTP answer at all
    with client, pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
        client.get(f"{API}/health")


def test_tls_with_foreign_ca_certificate_refused_by_server_process(live):
    # Prepare: same name, certificate from another CA; trusts the real CA for the server
    foreign = pki.load_party(live["foreign"], "hospital", "hosp-a")
    ctx = pki.client_ssl_context(live["pki"] / "ca.pem", cert_file=foreign.cert_file, key_file=foreign.key_file)

    # Execute / Assert
    with httpx.Client(base_url=live["url"], verify=ctx, timeout=10) as client, \
            pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
        client.get(f"{API}/health")


def test_client_refuses_server_not_signed_by_consortium_ca(live):
    # Prepare: a hospital that trusts only another CA must not talk to this server
    foreign = pki.load_party(live["foreign"], "hospital", "hosp-a")

    # Execute / Assert
    with httpx.Client(base_url=live["url"], verify=foreign.client_ssl_context(), timeout=10) as client, \
            pytest.raises(httpx.ConnectError):
        client.get(f"{API}/health")


def test_secret_key_context_refused_over_https_then_public_accepted(live):
    # Prepare: the key holder's fresh keys for this session
    kh, client = _client(live, "keyholder", "keyholder")
    keys = generate_keys(ckks_session_params(SID, Layout(DIM, CLASSES), GAMMA, Bounds(2.0, 100, 4)))

    def publish(context):
        return _publish_context(kh, client, keys, context)

    with client:
        # Execute
        refused = publish(keys.secret_context)
        status_after_refusal = _info(live)["status"]
        accepted = publish(keys.public_context)

    # Assert
    assert refused.status_code == 422 and refused.json()["error"] == "secret_key_context"
    assert status_after_refusal == "awaiting_context"
    assert any(r["event"] == "publish_context" and r["outcome"] == "refused" and r["reason"] == "secret_key_context"
               for r in _audit(live))
    assert accepted.status_code == 200 and _info(live)["status"] == "open"


def test_replay_and_duplicate_over_https_refused_nothing_stored(open_live):
    # Prepare: an open session; hosp-a uploads one real ckks contribution
    from secure_afl.backends.ckks import CKKSBackend
    from secure_afl.params import SessionParams
    from secure_afl.signing import sign_upload

    live = open_live
    info = _info(live)
    params = SessionParams.from_dict(info["params"])
    party, client = _client(live)
    with client:
        ctx = client.get(f"{API}/sessions/{SID}/context").content
        rng = np.random.default_rng(0)
        v = np.zeros(params.layout.length)
        v[: DIM] = rng.uniform(0, 1, DIM)
        tag = new_tag(params)
        v[params.layout.slices["tag"]] = tag
        payload = CKKSBackend(params).protect(v, public_context=ctx)
        st = sign_upload(party.identity_key(), SID, params.digest(), hashlib.sha256(payload).digest(), "hosp-a")
        tag_st = sign_tag(party.identity_key(), params, "hosp-a", hashlib.sha256(payload).hexdigest(),
                          seal_tag(params, "hosp-a", tag))
        headers = {H_UPLOAD: json.dumps(st), H_TAG: json.dumps(tag_st), "content-type": "application/octet-stream"}
        path = f"{API}/sessions/{SID}/uploads"
        assert client.post(path, content=payload, headers=headers).status_code == 200
        stored = sorted(os.listdir(live["work"] / "server" / SID / "payloads"))

        # Execute
        replay = client.post(path, content=payload, headers=headers)
        st2 = sign_upload(party.identity_key(), SID, params.digest(), hashlib.sha256(payload).digest(), "hosp-a")
        dup = client.post(path, content=payload, headers={**headers, H_UPLOAD: json.dumps(st2)})

    # Assert
    assert replay.status_code == 409 and replay.json()["error"] == "replay"
    assert dup.status_code == 409 and dup.json()["error"] == "duplicate"
    assert _uploaded(live) == ["hosp-a"]
    assert sorted(os.listdir(live["work"] / "server" / SID / "payloads")) == stored
    tail = _audit(live)[-2:]
    assert [(r["outcome"], r["reason"]) for r in tail] == [("refused", "replay"), ("refused", "duplicate")]


def test_a_request_signed_by_one_hospital_over_anothers_tls_certificate_is_refused(live):
    # the signature names the party; the TLS certificate is what the transport authenticated: they must be the
    # same enrolled party, or a party holding one hospital's certificate key and another's signing key (or a
    # relay between two connections) would act as either
    path = f"{API}/sessions/{SID}/receipts/hosp-b"
    b = pki.load_party(live["pki"], "hospital", "hosp-b")

    def as_b(client):
        return client.get(path, headers=sign_request(b.identity_key(), "hospital:hosp-b", "GET", path, b""))

    # Execute: hosp-b's signed request over hosp-a's certificate, then over its own
    _, over_a = _client(live, "hospital", "hosp-a")
    with over_a:
        mixed = as_b(over_a)
    _, over_b = _client(live, "hospital", "hosp-b")
    with over_b:
        own = as_b(over_b)

    # Assert: refused as unauthenticated and audited; the same request over its own certificate authenticates
    # (and finds no receipt: hosp-b has not uploaded)
    assert mixed.status_code == 401, mixed.text
    assert "certificate" in mixed.json()["detail"]
    assert own.status_code == 404, own.text
    assert any(r["outcome"] == "refused" and r["reason"] == "unauthenticated" and r["details"]["path"] == path
               and r["details"]["tls_peer"]["cert_party"] == "hospital:hosp-a" for r in _audit(live))
