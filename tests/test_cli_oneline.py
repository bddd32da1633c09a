"""Mistakes a new consortium makes, answered by the real ``secure-afl`` command in one line, fast.

Every case runs the console entry point in its own process (against real
server processes on 127.0.0.1 where one is involved) and checks what an
operator sees: the documented exit code, one line on stderr with no
traceback, the advice that fits the party and, where waiting cannot help
(a certificate or address mistake, a missing file), that the command gives
up well before its retry window (``--wait-server 30``) would have run out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from secure_afl import pki
from secure_afl.clients.statsfile import write_statistics_file
from support import free_port
from secure_afl.exceptions import EXIT_INPUT, EXIT_KEYS, EXIT_UNREACHABLE
from secure_afl.server.config import write_config
from secure_afl.signing import make_receipt

pytestmark = pytest.mark.e2e

#: What a retry would cost: a command that ends well within this did not retry.
RETRY_WINDOW_S = 30
#: Interpreter start and imports on a loaded two-core machine, plus the work itself.
FAST_S = 12


def _cli(*args, cwd=None) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k != "SECURE_AFL_KEY_PASSPHRASE"}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "secure_afl.cli", *map(str, args)], capture_output=True,
                         text=True, timeout=300, env=env, cwd=cwd)
    return out, time.monotonic() - t0


def _one_line(out: subprocess.CompletedProcess, code: int, reason: str) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == code, out.stderr
    assert "Traceback" not in out.stderr and len(lines) == 1, out.stderr
    assert lines[0].startswith(f"secure-afl: error [{reason}]: "), lines[0]
    return lines[0]


def _stats_file(c, name: str, path: Path) -> Path:
    X, y = c.data(name)
    return write_statistics_file(path, c.stats(X, y), [f"class-{i}" for i in range(c.classes)],
                                 metadata={"max_row_norm": float(np.linalg.norm(X, axis=1).max())})


def _submit(c, pki_dir, name: str, stats, *, server=None):
    return ("client", "submit", "--server", server or c.url, "--session", c.session_id, "--pki", pki_dir,
            "--name", name, "--stats", stats, "--receipts", c.root / "receipts", "--no-progress",
            "--wait-server", RETRY_WINDOW_S)


# -- session.toml and server start ------------------------------------------------------
@pytest.mark.parametrize("command", ["server run", "session sign"])
def test_toml_syntax_error_is_one_line(consortium, tmp_path, command):
    # Prepare: a session.toml with a typo (`dim = = 6`)
    c = consortium(backend="ckks", hospitals=("h1", "h2"), min_clients=2)
    bad = tmp_path / "session.toml"
    bad.write_text(c.config.read_text().replace("dim = 6", "dim = = 6"))
    signed_before = sorted((c.pki_dir / "sessions").glob("*"))
    args = (["server", "run", "--config", bad, "--allow-ca-key"] if command == "server run" else
            ["session", "sign", bad, "--pki", c.pki_dir])

    # Execute
    out, _ = _cli(*args)

    # Assert: the file and the place are named; nothing was created
    line = _one_line(out, EXIT_INPUT, "invalid_toml")
    assert str(bad) in line and "line 4" in line
    assert sorted((c.pki_dir / "sessions").glob("*")) == signed_before


def test_server_start_on_a_taken_port_is_one_line(consortium, tmp_path):
    # Prepare: a running server holds the port; a second session is configured on the same port
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2).start()
    cfg = tmp_path / "second.toml"
    write_config(cfg, {
        "session": {"id": "second", "backend": "plain", "dim": 4, "classes": 2, "min_clients": 2,
                    "hospitals": ["h1", "h2"]},
        "bounds": {"max_norm": 4.0, "n_max": 100, "k_max": 8},
        "server": {"port": c.port, "data_dir": str(tmp_path / "srv2"), "pki_dir": str(c.pki_dir)},
    })

    # Execute
    out, seconds = _cli("server", "run", "--config", cfg, "--allow-ca-key")

    # Assert: refused at once, nothing opened, the first server untouched
    line = _one_line(out, EXIT_INPUT, "port_in_use")
    assert f"port {c.port} on 127.0.0.1 is in use" in line
    assert "serving session" not in out.stderr + out.stdout
    assert seconds < FAST_S and not (tmp_path / "srv2").exists()
    with c.connect_keyholder() as conn:
        assert conn.info()["session_id"] == c.session_id


def test_demo_with_a_relative_workdir(tmp_path):
    # Execute: the working directory given relative to where the command runs
    out, _ = _cli("demo", "--backend", "plain", "--hospitals", "3", "--workdir", "work", cwd=tmp_path)

    # Assert: the server's data is under work/ (not work/work/), and the demo passed
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "W: within certified bound" in out.stdout
    assert (tmp_path / "work" / "server").is_dir() and not (tmp_path / "work" / "work").exists()


# -- addresses and certificates: permanent, never retried -------------------------------
@pytest.mark.parametrize("form", ["http", "bare"])
def test_server_address_without_https_is_one_line_at_once(consortium, tmp_path, form):
    # Prepare
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2).start()
    stats = _stats_file(c, "h1", tmp_path / "h1.npz")
    address = {"http": f"http://127.0.0.1:{c.port}", "bare": f"127.0.0.1:{c.port}"}[form]

    # Execute
    out, seconds = _cli(*_submit(c, c.pki_dir, "h1", stats, server=address))

    # Assert: the fix is named, and no retry window was spent
    line = _one_line(out, EXIT_INPUT, "bad_server_url")
    assert f"did you mean https://127.0.0.1:{c.port}?" in line
    assert seconds < FAST_S < RETRY_WINDOW_S
    with c.connect_keyholder() as conn:
        assert conn.info()["contributions"] == 0


def test_server_of_another_consortium_is_one_line_at_once(consortium, tmp_path):
    # Prepare: the hospital's bundle is from consortium B; the server it is pointed at is A's
    a = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2).start()
    b = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2)
    stats = _stats_file(b, "h1", tmp_path / "h1.npz")

    # Execute
    out, seconds = _cli(*_submit(b, b.pki_dir, "h1", stats, server=a.url))

    # Assert: a certificate mistake is not "unreachable", and is not retried
    line = _one_line(out, EXIT_KEYS, "untrusted_server")
    assert a.url in line and "certificate" in line and "bundle" in line
    assert seconds < FAST_S < RETRY_WINDOW_S
    with a.connect_keyholder() as conn:
        assert conn.info()["contributions"] == 0


def test_keyholder_finalize_against_a_dead_server_says_what_it_waits_for(consortium, tmp_path):
    # Prepare: nothing listens on the address
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2)
    url = f"https://127.0.0.1:{free_port()}"

    # Execute
    out, seconds = _cli("keyholder", "finalize", "--pki", c.pki_dir, "--keys", c.root / "keys", "--server", url,
                        "--session", c.session_id, "--min-clients", 2, "--out", tmp_path / "m.safetensors",
                        "--wait-server", 3)

    # Assert: one notice of the wait (with its bound), then one error line, and it kept to the bound
    lines = out.stderr.strip().splitlines()
    assert out.returncode == EXIT_UNREACHABLE and "Traceback" not in out.stderr and len(lines) == 2, out.stderr
    assert lines[0] == lines[0].strip() and "trying again for up to 3 s" in lines[0] and url in lines[0]
    assert lines[1].startswith("secure-afl: error [unreachable]: ") and "within 3 s" in lines[1]
    assert 3 <= seconds < 3 + FAST_S
    assert not (tmp_path / "m.safetensors").exists()


def test_hospital_with_a_wrong_pki_is_told_to_ask_the_operator(consortium, tmp_path):
    # Prepare: the hospital points --pki at the folder that holds its bundle, not at the bundle
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2)
    bundles = pki.make_bundles(c.pki_dir, tmp_path / "bundles")
    assert bundles
    stats = _stats_file(c, "h1", tmp_path / "h1.npz")

    # Execute
    out, _ = _cli(*_submit(c, tmp_path / "bundles", "h1", stats))

    # Assert: hospitals do not issue identities; the advice is to get the bundle
    line = _one_line(out, EXIT_INPUT, "file_not_found")
    assert "pki issue" not in line and "ask the operator" in line and "'h1'" in line


# -- statistics files ------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["random bytes", "pickled object", "text"])
def test_junk_statistics_file_is_one_line(consortium, tmp_path, kind):
    # Prepare: a file that is not an .npz archive; no server runs, so a connection attempt would wait
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2)
    junk = tmp_path / "stats.npz"
    if kind == "random bytes":
        junk.write_bytes(np.random.default_rng(0).bytes(300))
    elif kind == "pickled object":
        with open(junk, "wb") as fh:
            np.save(fh, np.array([{"gram": 1}], dtype=object), allow_pickle=True)
    else:
        junk.write_text("gram,cross\n1,2\n")

    # Execute
    out, seconds = _cli(*_submit(c, c.pki_dir, "h1", junk))

    # Assert: says what the file is not, before contacting anyone; numpy's advice to unpickle never shows
    line = _one_line(out, EXIT_INPUT, "bad_statistics_file")
    assert "is not a statistics or embeddings file" in line and "pickle" not in line
    assert seconds < FAST_S < RETRY_WINDOW_S


def test_missing_statistics_file_is_bad_input_before_any_connection(consortium, tmp_path):
    # Prepare: the server is not even running; a connection attempt would wait RETRY_WINDOW_S
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2)

    # Execute
    out, seconds = _cli(*_submit(c, c.pki_dir, "h1", tmp_path / "no-such-stats.npz"))

    # Assert: exit 3 like every other input error (not 4, the server's "no such session")
    line = _one_line(out, EXIT_INPUT, "bad_statistics_file")
    assert "no such file" in line and "client embed" in line
    assert seconds < FAST_S < RETRY_WINDOW_S


# -- key holder ------------------------------------------------------------------------
def test_publish_with_a_wrong_passphrase_is_refused_before_anything_is_published(consortium, tmp_path):
    # Prepare: keys sealed with one passphrase; publish is given another
    c = consortium(backend="ckks", hospitals=("h1", "h2"), min_clients=2).start()
    good, wrong = tmp_path / "good.pass", tmp_path / "wrong.pass"
    good.write_text("the passphrase keygen was given\n")
    wrong.write_text("the passphrase keygen was not given\n")
    for f in (good, wrong):
        f.chmod(0o600)
    keys = tmp_path / "keys"
    keygen, _ = _cli("keyholder", "keygen", "--pki", c.pki_dir, "--keys", keys, "--session", c.session_id,
                     "--passphrase-file", good)
    assert keygen.returncode == 0, keygen.stderr
    publish = ("keyholder", "publish", "--pki", c.pki_dir, "--keys", keys, "--server", c.url, "--session",
               c.session_id)

    # Execute
    out, _ = _cli(*publish, "--passphrase-file", wrong)

    # Assert: refused at publish; hospitals still have no key to encrypt to
    line = _one_line(out, EXIT_KEYS, "invalid_key")
    assert "does not open the sealed keys" in line
    with c.connect_keyholder() as conn:
        assert conn.info()["status"] == "awaiting_context"
    right, _ = _cli(*publish, "--passphrase-file", good)
    assert right.returncode == 0, right.stderr
    with c.connect_keyholder() as conn:
        assert conn.info()["status"] == "open"


# -- audit verify ----------------------------------------------------------------------
@pytest.fixture
def released(consortium, tmp_path):
    """A plain session with two hospitals, released; the hospitals' receipts in one folder."""
    c = consortium(backend="plain", hospitals=("h1", "h2", "h3"), min_clients=2).start()
    for h in ("h1", "h2"):
        cl = c.hospital(h)
        cl.submit(c.stats(*c.data(h)))
        cl.close()
    with c.connect_keyholder() as conn:
        c.keyholder.finalize(conn, min_clients=2)
    return c


def _verify(c, receipts, *extra):
    log = c.audit_path()
    return _cli("audit", "verify", log, "--pki", c.pki_dir, "--head", log.parent / "audit-head.json",
                "--receipts", receipts, *extra)[0]


def _other_session_receipt(c) -> dict:
    """A receipt the same server signed in an earlier session (as a hospital's folder keeps them)."""
    key = pki.load_party(c.pki_dir, "server", "aggregator").identity_key()
    return make_receipt(key, "earlier-session", "h1", bytes(32), 3, audit_head="ab" * 32)


def test_audit_verify_with_a_missing_receipts_folder_fails(released, tmp_path):
    out = _verify(released, tmp_path / "no-such-folder")
    line = _one_line(out, EXIT_INPUT, "invalid_input")
    assert "no-such-folder: no such file or directory" in line and not out.stdout.startswith("OK")


def test_audit_verify_accepts_one_receipt_file(released):
    # Execute: the hospital passes its receipt file instead of the folder
    out = _verify(released, released.root / "receipts" / f"receipt-{released.session_id}-h1.json")

    # Assert
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith(f"OK: session {released.session_id}: ") and " 1 receipts matched;" in out.stdout


def test_audit_verify_picks_this_sessions_receipts_from_a_shared_folder(released):
    # Prepare: the folder also holds a receipt of another session (it used to read as BROKEN)
    folder = released.root / "receipts"
    (folder / "receipt-earlier-session-h1.json").write_text(json.dumps(_other_session_receipt(released)))

    # Execute
    out = _verify(released, folder)

    # Assert: both of this session's receipts checked, the other one set aside and counted
    assert out.returncode == 0, out.stdout + out.stderr
    assert " 2 receipts matched (1 of other sessions set aside);" in out.stdout


def test_audit_verify_fails_when_no_receipt_is_of_this_session(released, tmp_path):
    # Prepare: a folder holding only another session's receipt
    folder = tmp_path / "old-receipts"
    folder.mkdir()
    (folder / "receipt-earlier-session-h1.json").write_text(json.dumps(_other_session_receipt(released)))

    # Execute
    out = _verify(released, folder)

    # Assert: zero checked receipts is not an OK
    line = _one_line(out, EXIT_INPUT, "invalid_input")
    assert f"no receipt of session {released.session_id}" in line and "earlier-session" in line
    assert "OK" not in out.stdout


def test_audit_verify_refuses_the_log_of_another_session(released):
    out = _verify(released, released.root / "receipts", "--session", "the-session-i-meant")
    line = _one_line(out, EXIT_INPUT, "invalid_input")
    assert f"audit log of session {released.session_id}, not of session the-session-i-meant" in line
