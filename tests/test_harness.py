"""The consortium harness (secure_afl_tools.harness) the tests and the tools share starts a real server and stops it.

A test that leaves a server behind, or waits without a bound for one that never comes up, would hang or
leak into every later test: both paths run here against a real ``secure-afl server run`` process.
"""

from __future__ import annotations

import socket

import httpx
import pytest

from secure_afl.pki import client_ssl_context
from secure_afl_tools.harness import Consortium, start_server
from support import Consortium as SupportConsortium


def test_the_tests_and_the_tools_share_one_consortium():
    assert SupportConsortium is Consortium


@pytest.mark.e2e
def test_a_consortium_serves_mutual_tls_on_loopback_and_stops_on_leaving_the_block(tmp_path):
    c = Consortium(tmp_path, backend="plain")
    kh = c.keyholder.party
    with c:
        assert c.url.startswith("https://127.0.0.1:") and c.server.proc.poll() is None
        ctx = client_ssl_context(kh.ca_file, cert_file=kh.cert_file, key_file=kh.key_file)
        assert httpx.get(f"{c.url}/v1/health", verify=ctx, timeout=10).status_code == 200
    assert c.server.proc.poll() is not None
    with socket.socket() as s:  # the port is free again: nothing of the server is left listening
        s.bind(("127.0.0.1", c.port))


@pytest.mark.e2e
def test_a_server_that_cannot_come_up_is_reported_and_stopped(tmp_path):
    c = Consortium(tmp_path, backend="plain")
    with socket.socket() as taken:  # its port is already in use: the server process exits at once
        taken.bind(("127.0.0.1", c.port))
        taken.listen()
        with pytest.raises((RuntimeError, TimeoutError)):
            start_server(c.config, tmp_path / "server.log", c.url, c.keyholder.party, timeout=60)
