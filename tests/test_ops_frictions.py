"""The operator's small frictions: commands that end as they should, say what they do, and refuse what they must."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support import free_port  # noqa: F401  (kept for the server tests below)


def _cli(*args, env=None, timeout=300, cwd=None):
    env = env if env is not None else {k: v for k, v in os.environ.items() if k != "SECURE_AFL_KEY_PASSPHRASE"}
    return subprocess.run([sys.executable, "-m", "secure_afl.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=cwd)


@pytest.mark.e2e
def test_keyholder_judge_ends_with_success_once_its_session_is_released(consortium, tmp_path):
    # Prepare: a split session released by finalize, as README's judge beside the session would see it end
    from test_split_stream import _honest, _start

    c, conn = _start(consortium)
    _honest(c, "h1", 1)
    _honest(c, "h2", 2)
    c.keyholder.finalize(conn, min_clients=2)
    conn.close()
    phrase = tmp_path / "passphrase"
    phrase.write_bytes(b"test passphrase")
    phrase.chmod(0o600)
    # Execute: the judge loop, started (or still running) once the key has been used
    out = _cli("keyholder", "judge", "--pki", c.pki_dir, "--keys", c.root / "keys", "--passphrase-file", phrase,
               "--server", c.url, "--session", c.session_id, "--interval", "0.2")
    # Assert: a released session is the loop's end, not an error
    assert out.returncode == 0, out.stderr
    assert "released" in out.stdout and "error" not in out.stderr
