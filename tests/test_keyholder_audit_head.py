"""The key holder keeps the audit head it countersigned, so a server cannot withhold it from auditors."""

from __future__ import annotations

import pytest
from support import Consortium

from secure_afl.cli import main

pytestmark = [pytest.mark.security, pytest.mark.e2e]


def test_auditor_verifies_the_log_with_the_key_holders_head_when_the_server_withholds_its_own(tmp_path, capsys):
    # Prepare: a plain session through the real server process; both hospitals upload, the key holder
    # finalizes; then the server withholds its audit-head.json
    c = Consortium(tmp_path / "c", backend="plain", hospitals=("h1", "h2"), min_clients=2).start()
    try:
        for h in c.hospitals:
            cl = c.hospital(h)
            cl.submit(c.stats(*c.data(h)))
            cl.close()
        rc = main(["keyholder", "finalize", "--pki", str(c.pki_dir), "--keys", str(c.root / "keys"),
                   "--server", c.url, "--session", c.session_id, "--min-clients", "2",
                   "--out", str(tmp_path / "model.safetensors"), "--report", str(tmp_path / "report.json")])
    finally:
        c.stop()
    assert rc == 0
    (c.audit_path().parent / "audit-head.json").unlink()
    kept = c.root / "keys" / f"{c.session_id}.audit-head.json"
    capsys.readouterr()

    # Execute: the auditor takes the head from the key holder's publication
    rc = main(["audit", "verify", str(c.audit_path()), "--pki", str(c.pki_dir), "--head", str(kept),
               "--receipts", str(c.root / "receipts")])

    # Assert: the whole log up to the release verifies, countersigned by the key holder
    assert rc == 0
    assert "countersigned by keyholder" in capsys.readouterr().out
