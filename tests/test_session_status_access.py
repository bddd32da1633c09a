"""Who may read a running session's status, and what each caller sees, through a real server process.

The view dates each hospital's upload and names who was refused and why, so the server answers it over mutual
TLS only (even where ``[server] require_client_cert = false`` lets other requests in without a certificate),
signed for the session's path, and only to the session's own parties: the key holder and the server's own
identity see every roster hospital, a roster hospital its own entry and the counts. A consortium hospital
outside the roster (a spare, or one removed after its key was stolen) is refused, as is a request without a
client certificate, or with another party's.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from secure_afl_tools.harness import KEYHOLDER, SERVER

from secure_afl import pki
from secure_afl.exceptions import SecureAFLError, Unauthenticated, UnknownParty
from secure_afl.session.signed import sign
from secure_afl.transport.tls_client import ServiceClient

pytestmark = [pytest.mark.e2e, pytest.mark.security]

ROSTER = ("h1", "h2", "h3")
SPARE = "h4"


def _status(c, role, name, *, cert_of=None, present_cert=True):
    """GET status signed by ``role-name``, over TLS presenting ``cert_of``'s certificate (default its own)."""
    party = pki.load_party(c.pki_dir, role, name)
    verify = None if cert_of is None else pki.load_party(c.pki_dir, *cert_of).client_ssl_context()
    with ServiceClient(c.url, party, c.session_id, timeout=30, retry_s=5, present_cert=present_cert,
                       verify=verify) as conn:
        return conn.request("GET", conn.path("/status")).json()


def test_status_answers_the_sessions_own_parties_only_each_with_its_own_view(consortium):
    # Prepare: plain over h1..h3, a spare h4 issued by the same CA and left out of the signed roster; client
    # certificates optional at the server; h1 uploads, h3's upload is refused
    c = consortium(backend="plain", hospitals=ROSTER, min_clients=2, sign=False,
                   extra_server={"require_client_cert": False})
    pki.issue(c.pki_dir, "hospital", SPARE)
    sign(c.config, c.pki_dir)
    c.start()
    h1 = c.hospital("h1")
    h1.submit(c.stats(*c.data("h1")))
    h3 = c.hospital("h3")
    with pytest.raises(SecureAFLError) as h3_refused:
        h3.upload(h3.fetch_params(), b"not a plain payload")
    h1.close()
    h3.close()

    # Execute: each caller asks
    keyholder = _status(c, "keyholder", KEYHOLDER)
    operator = _status(c, "server", SERVER)
    h2 = _status(c, "hospital", "h2")
    with pytest.raises(UnknownParty) as spare:
        _status(c, "hospital", SPARE)
    with pytest.raises(Unauthenticated) as bare:
        _status(c, "hospital", "h2", present_cert=False)
    with pytest.raises(Unauthenticated) as borrowed:
        _status(c, "hospital", "h2", cert_of=("hospital", "h1"))
    # the public session info, unsigned and without a certificate (what the spare or anyone reaching the port
    # reads)
    with ServiceClient(c.url, pki.load_party(c.pki_dir, "hospital", SPARE), c.session_id, timeout=30, retry_s=5,
                       present_cert=False) as conn:
        public = conn.info()

    # Assert: the key holder and the operator see every roster hospital's fate
    for full in (keyholder, operator):
        assert full["view"] == "session" and full["roster"] == list(ROSTER)
        assert full["uploaded"] == ["h1"] and full["silent"] == ["h2"]
        assert full["refused"] == {"h3": h3_refused.value.reason}
    # a roster hospital sees its own entry and the counts, no other hospital's name or fate
    assert h2["view"] == "hospital" and h2["you"] == {"hospital": "h2", "state": "silent", "reason": None,
                                                      "judged": False, "released": False}
    assert h2["counts"] == {"roster": 3, "uploaded": 1, "judged": 0, "valid": 0, "refused": 1, "silent": 1}
    assert not {"roster", "uploaded", "refused", "silent"} & set(h2)
    assert "h1" not in json.dumps(h2) and "h3" not in json.dumps(h2)
    # the public info dates no upload: no count, no name that uploaded, only what building an upload needs
    assert public["session_id"] == c.session_id and public["status"] == "open"
    assert not {"contributions", "uploaded", "refused", "counts"} & set(public), sorted(public)
    assert "h3" in public["hospitals"] and h3_refused.value.reason not in json.dumps(public)
    # the spare, a certificate-less request and a borrowed certificate are refused, each audited
    assert f"{SPARE!r} is not in the signed roster" in str(spare.value)
    assert "mutual TLS only" in str(bare.value) and "not the one enrolled" in str(borrowed.value)
    log = [json.loads(line) for line in c.audit_path().read_text().splitlines()]
    refused = [r for r in log if r["outcome"] == "refused" and r["event"] == "request"]
    assert {r["reason"] for r in refused} >= {"unknown_party", "unauthenticated"}

    # the command a hospital runs prints its own line and the counts, and names no other hospital
    shown = subprocess.run([sys.executable, "-m", "secure_afl.cli", "session", "status", "--server", c.url,
                            "--session", c.session_id, "--pki", str(c.pki_dir), "--as", "hospital-h2"],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "you       h2: silent" in shown.stdout and "uploaded 1, refused 1, silent 1" in shown.stdout
    assert "h1" not in shown.stdout and "h3" not in shown.stdout

    # Execute: the server restarted; the summary of refusals is rebuilt from the log it reopens
    c.stop()
    c.start()
    again = _status(c, "keyholder", KEYHOLDER)
    # Assert
    assert again["refused"] == keyholder["refused"] and again["uploaded"] == ["h1"]
