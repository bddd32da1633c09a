"""A release is made once: the key holder's command never replaces a file it did not write, refuses on its own
side before the server closes the round, and the operator's status view never calls a session released
before a release exists. Each case runs the real ``secure-afl`` command against a real server process."""

from __future__ import annotations

import json

import pytest

from secure_afl.exceptions import EXIT_INPUT, EXIT_REFUSED
from support.cli import one_line, passphrase_file, run_cli
from support.sessions import honest_upload, open_split_session, split_session_at_quorum

e2e = pytest.mark.e2e


def _finalize(c, tmp_path, *extra, min_clients):
    phrase = passphrase_file(tmp_path / "passphrase", "test passphrase")
    return run_cli("keyholder", "finalize", "--pki", c.pki_dir, "--keys", c.root / "keys", "--passphrase-file",
                   phrase, "--server", c.url, "--session", c.session_id, "--min-clients", min_clients, *extra,
                   cwd=tmp_path)[0]


def _status(c):
    out = run_cli("session", "status", "--server", c.url, "--session", c.session_id, "--pki", c.pki_dir,
                  "--as", "server-aggregator", timeout=120)[0]
    assert out.returncode == 0, out.stderr
    return out.stdout


@e2e
def test_finalize_never_replaces_an_existing_model_and_leaves_the_session_open(consortium, tmp_path):
    # Prepare: a split session whose quorum has uploaded, and the model file of an earlier release at --out
    c, conn = split_session_at_quorum(consortium)
    conn.close()
    earlier = tmp_path / "model.safetensors"
    earlier.write_bytes(b"the model another session released")
    report = tmp_path / "report.json"
    report.write_text("{}")

    # Execute: finalize naming it, then naming only the existing report
    out = _finalize(c, tmp_path, "--out", earlier, min_clients=2)
    rep = _finalize(c, tmp_path, "--report", report, min_clients=2)

    # Assert: refused by name before anything happened: the file as it was, the round still open
    line = one_line(out, EXIT_INPUT, "output_exists")
    assert f"--out {earlier} already exists" in line
    assert earlier.read_bytes() == b"the model another session released"
    line = one_line(rep, EXIT_INPUT, "output_exists")
    assert f"--report {report} already exists" in line and report.read_text() == "{}"
    assert "closing session" not in out.stdout + rep.stdout
    assert f"session {c.session_id} (split): open" in _status(c)
    assert not (tmp_path / f"model-{c.session_id}.safetensors").exists()


@e2e
def test_a_floor_of_the_key_holder_refuses_before_the_close_and_a_late_hospital_still_uploads(consortium, tmp_path):
    # Prepare: four hospitals, a signed quorum of 3, three uploads; the key holder asks for all four
    c, conn = open_split_session(consortium, hospitals=("h1", "h2", "h3", "h4"))
    for i, h in enumerate(("h1", "h2", "h3"), 1):
        honest_upload(c, h, i)
    conn.close()

    # Execute: finalize with the key holder's own floor of 4
    refused = _finalize(c, tmp_path, min_clients=4)
    status_after_refusal = _status(c)
    honest_upload(c, "h4", 4)  # the late hospital
    released = _finalize(c, tmp_path, min_clients=4)

    # Assert: refused before the close, saying how to release; the session stayed open for h4; then released
    line = one_line(refused, EXIT_REFUSED, "insufficient_contributors")
    assert f"not closing session {c.session_id}: 3 uploads accepted" in line
    assert "the session stays open" in line and "rerun with --min-clients 3 (the signed quorum is 3)" in line
    assert "closing session" not in refused.stdout
    assert f"session {c.session_id} (split): open" in status_after_refusal
    assert "released" not in status_after_refusal.splitlines()[0]
    assert released.returncode == 0, released.stderr
    assert (tmp_path / f"model-{c.session_id}.safetensors").is_file()
    assert "from 4 hospitals" in released.stdout
    assert f"session {c.session_id} (split): released (" in _status(c)


@e2e
def test_a_closed_session_without_a_release_is_not_called_released(consortium, tmp_path):
    # Prepare: a split session closed by the server at the quorum, its key holder not having released yet
    c, conn = split_session_at_quorum(consortium)
    c.keyholder.close_round(conn)
    conn.close()

    # Execute
    text = _status(c)
    st = json.loads(run_cli("session", "status", "--server", c.url, "--session", c.session_id, "--pki",
                            c.pki_dir, "--as", "server-aggregator", "--json", timeout=120)[0].stdout)

    # Assert: closed, and what releases it
    assert text.splitlines()[0] == (f"session {c.session_id} (split): closed, not released yet: the manifest is "
                                    "signed; `keyholder finalize` releases it")
    assert st["phase"].startswith("closed, not released yet")


@e2e
def test_a_mistyped_keys_directory_is_named_and_not_created(consortium, tmp_path):
    # Prepare: a split session with its quorum in
    from secure_afl.exceptions import EXIT_KEYS

    c, conn = split_session_at_quorum(consortium)
    conn.close()
    phrase = passphrase_file(tmp_path / "passphrase", "test passphrase")
    typo = tmp_path / "kyes"

    # Execute
    out = run_cli("keyholder", "finalize", "--pki", c.pki_dir, "--keys", typo, "--passphrase-file", phrase,
                  "--server", c.url, "--session", c.session_id, "--min-clients", 2, cwd=tmp_path)[0]

    # Assert: named, nothing created, no "closing session" announced, the round still open
    line = one_line(out, EXIT_KEYS, "invalid_key")
    assert f"no key directory {typo}" in line and not typo.exists() and "closing session" not in out.stdout
    assert f"session {c.session_id} (split): open" in _status(c)
