"""A mistyped secret changes nothing: ``keyholder finalize`` opens the sealed key before it closes the round
or records the key as used, so the rerun with the right passphrase releases the session (and, bfv, a
hospital that uploads between the two runs is still counted).

Every step is the real ``secure-afl`` command against a real server process on 127.0.0.1.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from secure_afl.session.signed import load_signed
from secure_afl.exceptions import EXIT_KEYS
from secure_afl.keyholder import read_model

pytestmark = [pytest.mark.e2e, pytest.mark.security]


def _cli(*args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SECURE_AFL_KEY_PASSPHRASE"}
    return subprocess.run([sys.executable, "-m", "secure_afl.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=env)


def _secret(path, text: str):
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


def _finalize(c, out, passfile):
    return _cli("keyholder", "finalize", "--pki", c.pki_dir, "--keys", c.root / "keys", "--server", c.url,
                "--session", c.session_id, "--min-clients", 2, "--out", out, "--passphrase-file", passfile,
                "--wait-server", 5)


def _submit(c, names):
    for h in names:
        cl = c.hospital(h)
        cl.submit(c.stats(*c.data(h)))
        cl.close()


@pytest.mark.parametrize("wrong", ["not the passphrase at all", "short", None],
                         ids=["wrong", "short-wrong-file", "missing-file"])
@pytest.mark.parametrize("backend", ["split", "bfv"])
def test_wrong_passphrase_at_finalize_changes_nothing_and_the_rerun_releases(consortium, tmp_path, backend, wrong):
    # Prepare: keys sealed with the consortium's passphrase (the fixture's), published; two of three upload
    c = consortium(backend=backend, hospitals=("h1", "h2", "h3"), min_clients=2).start()
    c.keyholder.keygen(load_signed(c.pki_dir, c.session_id).session_params())
    with c.connect_keyholder() as conn:
        c.keyholder.publish(conn)
    _submit(c, ["h1", "h2"])
    right = _secret(tmp_path / "right.pass", "test passphrase")
    bad = _secret(tmp_path / "bad.pass", wrong) if wrong is not None else tmp_path / "no-such.pass"
    model = tmp_path / "model.safetensors"

    # Execute: the typo
    out = _finalize(c, model, bad)

    # Assert: one line naming the fix, exit 6 (keys), and nothing changed on the server or in the ledger
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    if wrong is None:
        assert out.returncode == 3 and lines[0].startswith("secure-afl: error [file_not_found]: "), lines[0]
        assert str(bad) in lines[0]
    else:
        assert out.returncode == EXIT_KEYS, out.stderr
        assert lines[0].startswith("secure-afl: error [invalid_key]: this passphrase does not open the sealed "
                                   f"keys of session {c.session_id}"), lines[0]
        assert "rerun" in lines[0] and "longer" not in lines[0]
    assert not model.exists()
    with c.connect_keyholder() as conn:
        assert conn.info()["status"] == "open"

    # a hospital that was late is not locked out (the round is still open)
    _submit(c, ["h3"])

    # Execute: the rerun with the right passphrase
    out = _finalize(c, model, right)

    # Assert: released, from all three
    assert out.returncode == 0, out.stderr
    assert "from 3 hospitals" in out.stdout, out.stdout
    W, meta = read_model(model)
    assert W.shape == (c.dim, c.classes) and np.isfinite(W).all()
