"""Secret files and ledgers are owner-only, and the commands refuse shared ones; passphrases have a minimum.

Each case goes through the real ``secure-afl`` command (its own process).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from secure_afl.exceptions import EXIT_KEYS
from support import Consortium

pytestmark = pytest.mark.e2e


def _cli(*args, env=None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "SECURE_AFL_KEY_PASSPHRASE"}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "secure_afl.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=180, env=full_env)


def _refused(out, reason: str) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == EXIT_KEYS, out.stderr
    assert len(lines) == 1 and lines[0].startswith(f"secure-afl: error [{reason}]: "), out.stderr
    return lines[0]


@pytest.fixture
def ckks(tmp_path):
    return Consortium(tmp_path / "c", backend="ckks", hospitals=("h1", "h2"), min_clients=2)


def _keygen(c: Consortium, passfile=None, env=None):
    args = ["keyholder", "keygen", "--pki", c.pki_dir, "--keys", c.root / "keys", "--session", c.session_id]
    return _cli(*args, *(["--passphrase-file", passfile] if passfile else []), env=env)


def _secret_files(c: Consortium) -> list[str]:
    keys = c.root / "keys"
    return sorted(p.name for p in keys.iterdir() if ".enc" in p.name) if keys.exists() else []


def test_group_readable_passphrase_file_is_refused(ckks, tmp_path):
    # Prepare
    passfile = tmp_path / "kh.pass"
    passfile.write_text("a long enough key holder passphrase\n")
    passfile.chmod(0o644)

    # Execute
    out = _keygen(ckks, passfile)

    # Assert: refused before any key exists
    line = _refused(out, "insecure_file_mode")
    assert "0644" in line and str(passfile) in line
    assert _secret_files(ckks) == []


@pytest.mark.parametrize("how", ["file", "env"])
def test_one_character_passphrase_is_refused(ckks, tmp_path, how):
    # Prepare
    passfile = tmp_path / "kh.pass"
    passfile.write_text("x\n")
    passfile.chmod(0o600)

    # Execute
    out = _keygen(ckks, passfile) if how == "file" else _keygen(ckks, env={"SECURE_AFL_KEY_PASSPHRASE": "x"})

    # Assert
    _refused(out, "weak_passphrase")
    assert _secret_files(ckks) == []


def test_sealed_keys_and_ledger_are_owner_only_and_a_shared_one_is_refused(tmp_path):
    # Prepare: a plain session released through the key holder's own command
    c = Consortium(tmp_path / "c", backend="plain", hospitals=("h1", "h2"), min_clients=2).start()
    try:
        for h in ("h1", "h2"):
            cl = c.hospital(h)
            cl.submit(c.stats(*c.data(h)))
            cl.close()
        args = ["keyholder", "finalize", "--pki", c.pki_dir, "--keys", c.root / "keys", "--server", c.url,
                "--session", c.session_id, "--min-clients", 2, "--out"]

        # Execute (the second run names a new model file: an existing one is refused before the ledger is read)
        first = _cli(*args, tmp_path / "model.safetensors")
        ledger = c.root / "keys" / "releases.sqlite3"
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in ledger.parent.glob("releases.sqlite3*")}
        ledger.chmod(0o644)
        again = _cli(*args, tmp_path / "model-again.safetensors")
    finally:
        c.stop()

    # Assert: every ledger file 0600; a ledger opened up to the group is refused
    assert first.returncode == 0, first.stderr
    assert modes and set(modes.values()) == {0o600}, modes
    _refused(again, "insecure_file_mode")


def test_world_readable_identity_key_is_refused_at_the_hospital(tmp_path):
    # Prepare
    c = Consortium(tmp_path / "c", backend="plain", hospitals=("h1", "h2"), min_clients=2)
    (c.pki_dir / "hospital-h1" / "identity.key").chmod(0o644)
    X, y = c.data("h1")
    import numpy as np

    np.savez(tmp_path / "h1.npz", X=X, y=y)

    # Execute
    out = _cli("client", "submit", "--server", c.url, "--session", c.session_id, "--pki", c.pki_dir,
               "--name", "h1", "--embeddings", tmp_path / "h1.npz", "--wait-server", "0")

    # Assert
    assert "identity.key" in _refused(out, "insecure_file_mode")


@pytest.mark.parametrize("sealed_name", ["secret.enc", "tag.enc"])
def test_group_readable_sealed_secret_is_refused_at_finalize(tmp_path, sealed_name):
    # Prepare: a ckks session with two contributions; the sealed secret context was opened up to the group
    from secure_afl.backends.ckks import ckks_session_params
    from secure_afl.packing import Layout
    from secure_afl.params import Bounds

    c = Consortium(tmp_path / "c", backend="ckks", hospitals=("h1", "h2"), min_clients=2).start()
    try:
        c.keyholder.keygen(ckks_session_params(c.session_id, Layout(c.dim, c.classes), 1.0,
                                               Bounds(c.max_norm, 1000, 8)))
        with c.connect_keyholder() as conn:
            c.keyholder.publish(conn)
        for h in ("h1", "h2"):
            cl = c.hospital(h)
            cl.submit(c.stats(*c.data(h)))
            cl.close()
        sealed = c.root / "keys" / f"{c.session_id}.{sealed_name}"
        sealed.chmod(0o640)

        # Execute
        out = _cli("keyholder", "finalize", "--pki", c.pki_dir, "--keys", c.root / "keys", "--server", c.url,
                   "--session", c.session_id, "--min-clients", 2, "--out", tmp_path / "model.safetensors",
                   env={"SECURE_AFL_KEY_PASSPHRASE": "test passphrase"})
    finally:
        c.stop()

    # Assert
    assert sealed_name in _refused(out, "insecure_file_mode")
    assert not (tmp_path / "model.safetensors").exists()
