"""The operator's small frictions: commands that end as they should, say what they do, and refuse what they must."""

from __future__ import annotations

import os
import re
from pathlib import Path
import subprocess
import sys

import pytest

from support import free_port
from support.cli import passphrase_file
from support.sessions import cheating_upload, honest_upload, open_split_session, split_session_at_quorum


def _cli(*args, env=None, timeout=300, cwd=None):
    env = env if env is not None else {k: v for k, v in os.environ.items() if k != "SECURE_AFL_KEY_PASSPHRASE"}
    return subprocess.run([sys.executable, "-m", "secure_afl.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=cwd)


@pytest.mark.e2e
def test_keyholder_judge_ends_with_success_once_its_session_is_released(consortium, tmp_path):
    # Prepare: a split session released by finalize, as README's judge beside the session would see it end
    c, conn = split_session_at_quorum(consortium)
    conn.close()
    phrase = passphrase_file(tmp_path / "passphrase", "test passphrase")
    released = _cli("keyholder", "finalize", "--pki", c.pki_dir, "--keys", c.root / "keys", "--passphrase-file",
                    phrase, "--server", c.url, "--session", c.session_id, "--min-clients", 2,
                    "--out", tmp_path / "W.safetensors")
    assert released.returncode == 0, released.stderr
    # the release said what it was doing before the model line
    assert released.stdout.startswith(f"secure-afl keyholder finalize: closing session {c.session_id} on {c.url} "
                                      "and releasing its 2 uploads")
    # Execute: the judge loop, started (or still running) once the key has been used
    out = _cli("keyholder", "judge", "--pki", c.pki_dir, "--keys", c.root / "keys", "--passphrase-file", phrase,
               "--server", c.url, "--session", c.session_id, "--interval", "0.2")
    # Assert: a released session is the loop's end, not an error
    assert out.returncode == 0, out.stderr
    assert "released" in out.stdout and "error" not in out.stderr


@pytest.mark.e2e
def test_keyholder_judge_says_when_every_roster_hospital_is_in_and_judged(consortium, tmp_path):
    # Prepare: a split session of three with two uploads in
    c, conn = split_session_at_quorum(consortium)
    conn.close()
    phrase = passphrase_file(tmp_path / "passphrase", "test passphrase")
    args = ("keyholder", "judge", "--pki", c.pki_dir, "--keys", c.root / "keys", "--passphrase-file", phrase,
            "--server", c.url, "--session", c.session_id, "--once")

    # Execute: one pass with h3 still out, one after its upload
    partial = _cli(*args)
    honest_upload(c, "h3", 3)
    complete = _cli(*args)

    # Assert: the line comes only once no one is left to wait for
    assert partial.returncode == 0 and complete.returncode == 0, partial.stderr + complete.stderr
    assert "h1: valid" in partial.stdout and "roster" not in partial.stdout
    assert "h3: valid" in complete.stdout
    assert "every hospital of the roster (3) has uploaded and is judged" in complete.stdout


def _main(capsys, *args):
    """secure-afl's main() in this process: (exit code, stdout, stderr)."""
    from secure_afl.cli import main

    try:
        rc = main([str(a) for a in args])
    except SystemExit as exc:  # argparse's own exits (--version, --help)
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_version_and_a_bare_call_list_the_installed_version_and_every_command(capsys):
    # Prepare: the installed distribution's version, read as pip reads it
    from importlib.metadata import version

    from secure_afl.cli import COMMANDS

    # Execute: the two first calls of a new user
    shown = _main(capsys, "--version")
    bare = _main(capsys)
    # Assert: the version line, and the command list (not only "the following arguments are required")
    assert shown[0] == 0 and shown[1].strip() == f"secure-afl {version('secure-afl')}"
    assert bare[0] == 2
    assert all(f"    {name}" in bare[1] for name, _, _ in COMMANDS), bare[1]
    assert "required" not in bare[2]


def test_session_show_takes_the_id_as_session_like_every_other_command(consortium, capsys):
    # Prepare: a signed session in the consortium's PKI
    import json

    c = consortium(backend="split")
    # Execute: the spelling every other command uses, the older positional one, and none
    flag = _main(capsys, "session", "show", "--session", c.session_id, "--pki", c.pki_dir)
    positional = _main(capsys, "session", "show", c.session_id, "--pki", c.pki_dir)
    missing = _main(capsys, "session", "show", "--pki", c.pki_dir)
    # Assert: --session prints the definition; the positional one still does, with a note; none is one line
    assert flag[0] == 0, flag[2]
    assert json.loads(flag[1])["id"] == c.session_id and "note" not in flag[2]
    assert positional[0] == 0 and json.loads(positional[1])["id"] == c.session_id
    assert "--session ID" in positional[2]
    assert missing[0] == 3 and missing[2].count("\n") == 1 and "--session" in missing[2]


@pytest.mark.e2e
def test_a_second_server_on_the_same_state_is_one_line_and_the_first_keeps_serving(consortium):
    # Prepare: a server running its session
    c, conn = open_split_session(consortium)
    honest_upload(c, "h1", 1)
    # Execute: the same session.toml started again (another port, the same state)
    out = _cli("server", "run", "--config", c.config, "--port", free_port(), "--allow-ca-key", timeout=120)
    # Assert: one line, the documented exit code (4: refused), no traceback; the first server still answers
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 4 and len(lines) == 1, out.stderr
    assert lines[0].startswith("secure-afl: error [state_in_use]: ") and "another server" in lines[0]
    assert conn.info()["status"] == "open"
    conn.close()


@pytest.mark.e2e
def test_server_run_refuses_the_operators_pki_directory_unless_asked(consortium):
    # Prepare: a session whose [server] pki_dir is the CA's own directory (ca.key inside), as when the
    # operator starts the server from its own directory
    from secure_afl.pki import CA_KEY

    c = consortium(backend="plain")
    assert (c.pki_dir / CA_KEY).exists()
    # Execute
    out = _cli("server", "run", "--config", c.config, timeout=120)
    # Assert: one line naming the key and the way out; no state was made
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 3 and len(lines) == 1, out.stderr
    assert "[ca_key_present]" in lines[0] and CA_KEY in lines[0] and "--allow-ca-key" in lines[0]
    assert not (c.root / "server").exists()


@pytest.mark.e2e
def test_server_run_refuses_a_pki_directory_with_other_parties_keys_even_without_the_ca_key(consortium, tmp_path):
    # Prepare: the operator's directory with the CA key moved offline: every hospital's and the key holder's
    # private keys are still in it; and the server's own bundle beside it
    from secure_afl import pki
    from secure_afl.pki import CA_KEY
    from secure_afl.server.cli import foreign_private_keys

    c = consortium(backend="plain")
    offline = tmp_path / "offline-ca.key"
    (c.pki_dir / CA_KEY).rename(offline)
    # Execute
    out = _cli("server", "run", "--config", c.config, timeout=120)
    # Assert: one line naming a key that is not the server's, the way out; no state was made
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 3 and len(lines) == 1, out.stderr
    assert "[private_key_present]" in lines[0] and "--allow-ca-key" in lines[0]
    named = re.search(r"\((\S+)\) and \d+ other private keys", lines[0])
    assert named and Path(named.group(1)).parent.name != "server-aggregator", lines[0]
    assert Path(named.group(1)).name in ("key.pem", "identity.key")
    assert not (c.root / "server").exists()
    # the server's own bundle holds no key but its own: nothing to refuse there
    (c.pki_dir / CA_KEY).write_bytes(offline.read_bytes())
    pki.write_bundles(c.pki_dir, tmp_path / "bundles")
    assert foreign_private_keys(tmp_path / "bundles" / "server-aggregator", "aggregator") == []
    assert foreign_private_keys(tmp_path / "bundles" / "hospital-h1", "aggregator")  # a hospital's is refused


@pytest.mark.e2e
def test_a_restarted_server_says_what_it_resumed(consortium):
    # Prepare: two accepted uploads, then the server stops
    c, conn = open_split_session(consortium)
    honest_upload(c, "h1", 1)
    honest_upload(c, "h3", 3)
    conn.close()
    c.stop()
    before = (c.root / "server.log").read_text()
    # Execute: the same session.toml started again
    c.start()
    # Assert: the restart names the session and the uploads it kept; a fresh start said nothing of the kind
    log = (c.root / "server.log").read_text()[len(before):]
    assert "resumed session t-split (open)" in log and "2 uploads accepted before the restart (h1, h3)" in log
    assert "resumed" not in before


def test_client_fingerprint_says_what_it_builds_before_the_block(capsys):
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    # Execute: the operator's fingerprint of a seeded random backbone
    rc, out, err = _main(capsys, "client", "fingerprint", "--backbone", "resnet18", "--weights", "random",
                         "--seed", "0", "--classes", "a,b")
    # Assert: stdout is only the TOML block (it is appended to session.toml); stderr said what took the time
    assert rc == 0 and out.startswith("[extractor]\n") and "dim = 512" in out
    assert err.splitlines()[0].startswith("secure-afl client fingerprint: building resnet18 (random weights)")


@pytest.mark.e2e
def test_session_status_shows_each_roster_hospitals_fate_from_a_running_server(consortium, tmp_path):
    # Prepare: a split session of three, h1 honest and judged, h3 a cheat the release refuses, h2 silent until
    # just before the release; a deadline an hour away
    import json
    import time

    c, conn = open_split_session(consortium, extra_session={"deadline_s": 3600.0})
    honest_upload(c, "h1", 1)
    c.keyholder.judge_split(conn)
    cheating_upload(c, "h3", 3)
    args = ("session", "status", "--server", c.url, "--session", c.session_id, "--pki", c.pki_dir,
            "--as", "server-aggregator")

    # Execute: while open, then after the release
    open_ = _cli(*args, "--json", timeout=120)
    text = _cli(*args, timeout=120)
    honest_upload(c, "h2", 2)
    c.keyholder.finalize(conn, min_clients=2)
    conn.close()
    after = _cli(*args, "--json", timeout=120)

    # Assert: the roster's fates, the quorum and the deadline as the server holds them
    assert open_.returncode == 0, open_.stderr
    st = json.loads(open_.stdout)
    assert st["status"] == "open" and st["roster"] == ["h1", "h2", "h3"]
    assert st["uploaded"] == ["h1", "h3"] and st["judged"] == ["h1"] and st["silent"] == ["h2"]
    assert st["refused"] == {} and st["quorum"] == 2 and st["still_needed"] == 0 and st["dropouts_left"] == 1
    assert 3500 < st["deadline"] - time.time() <= 3600
    assert text.returncode == 0 and "uploaded  2: h1, h3" in text.stdout and "silent    1: h2" in text.stdout
    assert "deadline  " in text.stdout and "(in 59 min" in text.stdout
    st = json.loads(after.stdout)
    assert st["status"] == "released" and st["valid"] == ["h1", "h2"] and st["refused"] == {"h3": "linear"}
    assert st["silent"] == [] and st["dropouts_left"] == 0


def test_keyholder_help_describes_every_backend_with_a_key(capsys):
    # Prepare: the backends whose key holder makes a key
    from secure_afl.params import KEYED_BACKENDS

    # Execute
    rc, out, _ = _main(capsys, "keyholder", "--help")
    # Assert: keygen's line names each of them, not one backend's keys
    keygen = re.search(r"keygen\s+(.*?)\n    \w", out, re.S).group(1)
    assert rc == 0 and all(re.search(rf"\b{b}\b", keygen) for b in KEYED_BACKENDS), keygen
