"""What a new consortium reads in its first hour: each message says what happened and what to do, in the
``secure-afl: error [reason]: message`` form with the documented exit code, never a Python class name.

The end-to-end cases run the real ``secure-afl`` command against real server processes on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from secure_afl.session.signed import load_signed
from secure_afl.cli import main
from secure_afl.clients.statsfile import write_statistics_file
from secure_afl.exceptions import EXIT_INPUT, EXIT_KEYS, EXIT_REFUSED
from secure_afl.server.config import write_config
from support import Consortium

_CLASS_NAMES = ("Error", "Exception", "<class")


def _cli(*args, timeout=300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SECURE_AFL_KEY_PASSPHRASE"}
    return subprocess.run([sys.executable, "-m", "secure_afl.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env)


def _error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("secure-afl: error [")]
    assert len(lines) == 1, err
    assert not any(w in lines[0].split("]: ", 1)[0] for w in _CLASS_NAMES), lines[0]
    return lines[0]


def _keyed(c):
    c.keyholder.keygen(load_signed(c.pki_dir, c.session_id).session_params())


def _finalize(c, tmp_path, *extra):
    return _cli("keyholder", "finalize", "--pki", c.pki_dir, "--keys", c.root / "keys", "--server", c.url,
                "--session", c.session_id, "--min-clients", c.min_clients, "--out", tmp_path / "model.safetensors",
                "--report", tmp_path / "report.json", "--wait-server", 5, *extra)


@pytest.mark.e2e
def test_submit_before_publish_says_what_it_waits_for_honours_wait_server_and_gives_a_hint(consortium, tmp_path):
    # Prepare: a split session whose key holder made its key but has not published it
    c = consortium(backend="split", hospitals=("h1", "h2"), min_clients=2).start()
    _keyed(c)
    X, y = c.data("h1")
    stats = write_statistics_file(tmp_path / "s.npz", c.stats(X, y), [f"class-{i}" for i in range(c.classes)],
                                  metadata={"max_row_norm": float(np.linalg.norm(X, axis=1).max())})

    # Execute
    t0 = time.monotonic()
    out = _cli("client", "submit", "--server", c.url, "--session", c.session_id, "--pki", c.pki_dir, "--name", "h1",
               "--stats", stats, "--receipts", tmp_path / "rc", "--no-progress", "--wait-server", 2)
    took = time.monotonic() - t0

    # Assert: said before waiting, waited --wait-server (not 60 s), refused with the reason and the fix
    assert out.returncode == EXIT_REFUSED, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[0] == (f"secure-afl: session {c.session_id} is waiting for the key holder's public context "
                        "(`secure-afl keyholder publish`); trying again for up to 2 s"), out.stderr
    assert _error_line(out.stderr) == (
        f"secure-afl: error [awaiting_publication]: session {c.session_id} still has no public context from the "
        "key holder after 2 s: nothing was sent; run this command again once the key holder has run "
        "`secure-afl keyholder publish` (or give it longer with --wait-server SECONDS)")
    assert took < 30
    assert not (tmp_path / "rc").exists() or not list((tmp_path / "rc").iterdir())


@pytest.mark.e2e
def test_finalize_without_a_passphrase_names_the_flag_not_the_python_argument(consortium, tmp_path):
    # Prepare: a published bfv session with two uploads
    c = consortium(backend="bfv", hospitals=("h1", "h2"), min_clients=2).start()
    _keyed(c)
    with c.connect_keyholder() as conn:
        c.keyholder.publish(conn)

    # Execute: no --passphrase-file and no $SECURE_AFL_KEY_PASSPHRASE
    out = _finalize(c, tmp_path)

    # Assert
    assert out.returncode == EXIT_KEYS
    assert _error_line(out.stderr) == (
        f"secure-afl: error [invalid_key]: the sealed keys of session {c.session_id} need the passphrase they "
        "were made with: --passphrase-file FILE or $SECURE_AFL_KEY_PASSPHRASE")
    with c.connect_keyholder() as conn:
        assert conn.info()["status"] == "open"


@pytest.mark.e2e
def test_split_finalize_applies_the_key_holders_own_lambda_since_it_solves_w_itself(consortium, tmp_path):
    # Prepare: a published split session, both hospitals uploaded
    from secure_afl.analytic import solve_from_sums
    from secure_afl.keyholder import read_model

    c = consortium(backend="split", hospitals=("h1", "h2"), min_clients=2, extra_session={"min_class_count": 1})
    c.start()
    _keyed(c)
    with c.connect_keyholder() as conn:
        c.keyholder.publish(conn)
    plain = None
    for h in c.hospitals:
        cl = c.hospital(h)
        s = c.stats(*c.data(h))
        plain = s if plain is None else plain + s
        cl.submit(s)
        cl.close()
    passfile = tmp_path / "pass"
    passfile.write_text("test passphrase\n")
    passfile.chmod(0o600)

    # Execute: a --lambda and a stricter --min-class-count than the session's (the key holder applies both)
    out = _finalize(c, tmp_path, "--passphrase-file", passfile, "--lambda", "0.5", "--min-class-count", "2")

    # Assert: the release is the key holder's solve at that ridge, over the plaintext sum
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["lambda_total"] == 0.5 and report["participants"] == ["h1", "h2"]
    W, meta = read_model(tmp_path / "model.safetensors")
    assert np.max(np.abs(W - solve_from_sums(plain, lam=0.5))) < 1e-6


@pytest.mark.e2e
def test_an_exact_release_of_a_singular_c_does_not_blame_noise_and_reports_one_lambda(consortium, tmp_path):
    # Prepare: plain (exact, no noise), 6 features but 4 samples in all: C is singular
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2, extra_session={"min_class_count": 1})
    c.start()
    for h in c.hospitals:
        cl = c.hospital(h)
        X, y = c.data(h, n=2)
        cl.submit(c.stats(X, y))
        cl.close()

    # Execute
    out = _finalize(c, tmp_path)

    # Assert
    assert out.returncode == 0, out.stderr
    w_line = next(ln for ln in out.stdout.splitlines() if ln.startswith("W: "))
    assert w_line == ("W: no bound (C singular): W is the minimum-norm solution C^+ Q of sums decrypted exactly "
                      "(no noise was added), but a singular C gives it no perturbation bound; more samples or a "
                      "--lambda ridge give one")
    assert "at this noise" not in out.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert "lambda" not in report and report["lambda_requested"] == report["lambda_total"] == 0.0


@pytest.mark.e2e
def test_finalize_to_an_unwritable_model_path_is_refused_before_the_release(consortium, tmp_path):
    # Prepare: a plain session with both uploads; --out names a directory
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2).start()
    for h in c.hospitals:
        cl = c.hospital(h)
        cl.submit(c.stats(*c.data(h)))
        cl.close()
    (tmp_path / "models").mkdir()

    # Execute
    out = _cli("keyholder", "finalize", "--pki", c.pki_dir, "--keys", c.root / "keys", "--server", c.url,
               "--session", c.session_id, "--min-clients", 2, "--out", tmp_path / "models")

    # Assert: refused in one line, and the round is still open for the corrected command
    assert out.returncode == EXIT_INPUT
    assert _error_line(out.stderr) == (f"secure-afl: error [is_a_directory]: --out {tmp_path / 'models'} is a "
                                       "directory; name a file (nothing was changed)")
    with c.connect_keyholder() as conn:
        assert conn.info()["status"] == "open"


def test_server_run_on_a_session_toml_that_is_not_the_signed_one_is_the_one_line_error(tmp_path, capsys):
    # Prepare: the operator signed min_clients 2; the server's copy says 3
    c = Consortium(tmp_path, backend="plain", hospitals=("h1", "h2", "h3"), min_clients=2)
    import tomllib

    cfg = tomllib.loads(c.config.read_text())
    cfg["session"]["min_clients"] = 3
    write_config(c.config, cfg)

    # Execute
    rc = main(["server", "run", "--config", str(c.config), "--allow-ca-key"])

    # Assert: the documented format and exit code (3: input), naming the file and the field
    err = capsys.readouterr().err
    assert rc == EXIT_INPUT
    line = _error_line(err)
    assert line.startswith(f"secure-afl: error [parameter_mismatch]: {c.config}: ") and "min_clients" in line, line
    assert len(err.strip().splitlines()) == 1


def test_a_missing_file_is_named_in_words(tmp_path, capsys):
    # Execute: a session file that does not exist
    rc = main(["session", "sign", str(tmp_path / "session.toml"), "--pki", str(tmp_path / "pki")])

    # Assert: a reason in words, not the Python exception's name
    assert rc == EXIT_INPUT
    assert capsys.readouterr().err.strip() == f"secure-afl: error [file_not_found]: no such file: {tmp_path / 'session.toml'}"


def test_a_timeout_is_reported_in_words():
    from secure_afl.cli import one_line

    assert one_line(TimeoutError("gave up waiting for the server after 5 s")) == \
        "secure-afl: error [timed_out]: gave up waiting for the server after 5 s"


@pytest.mark.flower
def test_a_flower_refusal_carries_the_secure_afl_reason_not_a_class_repr():
    """A ClientApp that refuses (here the key holder's wrong passphrase) reaches the ServerApp as Flower's
    "<class '...'>:<'...'>" error text; the round's refusal line names the reason instead."""
    from flwr.app import Error

    from secure_afl.flower.server_app import node_error

    err = Error(code=2, reason="<class 'secure_afl.exceptions.InvalidKey'>:<'this passphrase does not open the "
                               "sealed keys of session S'>")
    assert node_error(err) == ("invalid_key", "this passphrase does not open the sealed keys of session S")
    assert node_error(Error(code=2, reason="<class 'ZeroDivisionError'>:<'division by zero'>")) == \
        ("node_error", "division by zero")
