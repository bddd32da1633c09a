"""Expected failures through the real ``secure-afl`` command: one line on stderr, the documented exit code.

Every case runs the console entry point in its own process against real
server processes on 127.0.0.1; the exit codes are the ones
:mod:`secure_afl.exceptions` documents (3 input, 4 refused, 5 unreachable,
6 keys).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from secure_afl.clients.statsfile import write_statistics_file
from secure_afl.exceptions import EXIT_INPUT, EXIT_KEYS, EXIT_REFUSED, EXIT_UNREACHABLE
from secure_afl.server.config import write_config
from secure_afl.stats import local_statistics
from support import Consortium, free_port

pytestmark = pytest.mark.e2e


def _cli(*args, env=None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    full_env.pop("SECURE_AFL_KEY_PASSPHRASE", None)
    return subprocess.run([sys.executable, "-m", "secure_afl.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=180, env=full_env)


def _assert_one_line(out: subprocess.CompletedProcess, code: int, reason: str) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == code, out.stderr
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"secure-afl: error [{reason}]: "), lines[0]
    return lines[0]


def _submit_args(c: Consortium, name: str, stats_file, *, session=None, server=None):
    return ["client", "submit", "--server", server or c.url, "--session", session or c.session_id,
            "--pki", c.pki_dir, "--name", name, "--stats", stats_file, "--receipts", c.root / "rc",
            "--no-progress"]


def _stats_file(c: Consortium, name: str, path, *, classes=None):
    X, y = c.data(name)
    classes = classes or c.classes
    stats = c.stats(X, y) if classes == c.classes else _stats_with_classes(c, X, y % classes, classes)
    return write_statistics_file(path, stats, [f"class-{i}" for i in range(classes)],
                                 metadata={"max_row_norm": float(np.linalg.norm(X, axis=1).max())})


def _stats_with_classes(c, X, y, classes):
    from secure_afl.stats import StatisticsAccumulator

    acc = StatisticsAccumulator(X.shape[1], classes, max_norm=c.max_norm)
    acc.update(X, y)
    return acc.finalize(gamma=0.0)


def _finalize_args(c: Consortium, tmp_path, passphrase_file=None):
    args = ["keyholder", "finalize", "--pki", c.pki_dir, "--keys", c.root / "keys", "--server", c.url,
            "--session", c.session_id, "--min-clients", c.min_clients, "--out", tmp_path / "model.safetensors"]
    return args + (["--passphrase-file", passphrase_file] if passphrase_file else [])


def test_submit_after_release_is_one_line(consortium, tmp_path):
    # Prepare: two hospitals contributed and the key holder released the aggregate
    c = consortium(backend="plain", hospitals=("h1", "h2", "h3"), min_clients=2).start()
    for h in ("h1", "h2"):
        cl = c.hospital(h)
        cl.submit(c.stats(*c.data(h)))
        cl.close()
    with c.connect_keyholder() as conn:
        c.keyholder.finalize(conn, min_clients=2)

    # Execute
    out = _cli(*_submit_args(c, "h3", _stats_file(c, "h3", tmp_path / "h3.npz")))

    # Assert
    _assert_one_line(out, EXIT_REFUSED, "round_closed")


def test_stats_file_with_other_class_count_is_one_line(consortium, tmp_path):
    # Prepare: a 2-class statistics file for a 3-class session
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2).start()
    path = _stats_file(c, "h1", tmp_path / "h1.npz", classes=2)

    # Execute
    out = _cli(*_submit_args(c, "h1", path))

    # Assert: refused before anything was sent
    line = _assert_one_line(out, EXIT_INPUT, "invalid_input")
    assert "2 classes" in line and "3" in line
    with c.connect_keyholder() as conn:
        assert conn.info()["contributions"] == 0


@pytest.mark.parametrize("kind", ["stats", "embeddings"])
def test_file_with_a_row_over_the_bound_is_one_line(consortium, tmp_path, kind):
    # Prepare: one embedding of norm 1.5 B, as a statistics file recording it or as raw embeddings
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2).start()
    X, y = c.data("h1")
    X[0] *= 1.5 * c.max_norm / np.linalg.norm(X[0])
    path = tmp_path / "h1.npz"
    if kind == "stats":
        write_statistics_file(path, local_statistics(X, y, c.classes),
                              [f"class-{i}" for i in range(c.classes)],
                              metadata={"max_row_norm": float(np.linalg.norm(X, axis=1).max())})
    else:
        np.savez(path, X=X, y=y)
    args = _submit_args(c, "h1", path)
    if kind == "embeddings":
        args[args.index("--stats")] = "--embeddings"

    # Execute
    out = _cli(*args)

    # Assert: refused on the hospital before anything was sent
    line = _assert_one_line(out, EXIT_INPUT, "bounds_exceeded")
    assert f"B={c.max_norm}" in line
    with c.connect_keyholder() as conn:
        assert conn.info()["contributions"] == 0


def test_wrong_session_id_is_one_line(consortium, tmp_path):
    # Prepare
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2).start()
    from dataclasses import replace

    from secure_afl.session.signed import load_signed, sign_definition

    d = load_signed(c.pki_dir, c.session_id)  # the operator defined a session this server does not run
    sign_definition(replace(d, body={**d.body, "id": "no-such-session"}), c.pki_dir)

    # Execute
    out = _cli(*_submit_args(c, "h1", _stats_file(c, "h1", tmp_path / "h1.npz"), session="no-such-session"))

    # Assert: the line names both the asked and the served session
    line = _assert_one_line(out, EXIT_REFUSED, "not_found")
    assert "no-such-session" in line and c.session_id in line


def test_server_not_running_is_one_line(consortium, tmp_path):
    # Prepare: a consortium whose server was never started
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2)

    # Execute
    out = _cli(*_submit_args(c, "h1", _stats_file(c, "h1", tmp_path / "h1.npz"),
                             server=f"https://127.0.0.1:{free_port()}"), "--wait-server", "0")

    # Assert
    _assert_one_line(out, EXIT_UNREACHABLE, "unreachable")


def test_finalize_below_min_clients_is_one_line(consortium, tmp_path):
    # Prepare: one contribution in a session that needs two
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2).start()
    cl = c.hospital("h1")
    cl.submit(c.stats(*c.data("h1")))
    cl.close()

    # Execute
    out = _cli(*_finalize_args(c, tmp_path))

    # Assert: nothing released, no model written
    _assert_one_line(out, EXIT_REFUSED, "insufficient_contributors")
    assert not (tmp_path / "model.safetensors").exists()
    with c.connect_keyholder() as conn:
        assert conn.info()["status"] == "open"


def test_wrong_passphrase_is_one_line(consortium, tmp_path):
    # Prepare: a ckks session whose key was sealed with the consortium's passphrase
    c = consortium(backend="ckks", hospitals=("h1", "h2"), min_clients=2).start()
    from secure_afl.backends.ckks import ckks_session_params
    from secure_afl.packing import Layout
    from secure_afl.params import Bounds

    c.keyholder.keygen(ckks_session_params(c.session_id, Layout(c.dim, c.classes), 1.0,
                                           Bounds(c.max_norm, 1000, 8)))
    with c.connect_keyholder() as conn:
        c.keyholder.publish(conn)
    for h in ("h1", "h2"):
        cl = c.hospital(h)
        cl.submit(c.stats(*c.data(h)))
        cl.close()
    wrong = tmp_path / "wrong.pass"
    wrong.write_text("not the passphrase at all\n")
    wrong.chmod(0o600)

    # Execute
    out = _cli(*_finalize_args(c, tmp_path, wrong))

    # Assert
    _assert_one_line(out, EXIT_KEYS, "invalid_key")
    assert not (tmp_path / "model.safetensors").exists()


def test_keygen_twice_is_one_line(consortium, tmp_path):
    # Prepare: the first keygen succeeds through the same command
    c = consortium(backend="ckks", hospitals=("h1", "h2"), min_clients=2)
    passfile = tmp_path / "kh.pass"
    passfile.write_text("a long enough key holder passphrase\n")
    passfile.chmod(0o600)
    args = ["keyholder", "keygen", "--pki", c.pki_dir, "--keys", c.root / "keys", "--session", c.session_id,
            "--passphrase-file", passfile]
    first = _cli(*args)
    assert first.returncode == 0, first.stderr
    sealed = sorted((c.root / "keys").iterdir())
    before = {p.name: p.read_bytes() for p in sealed}

    # Execute
    out = _cli(*args)

    # Assert: refused, and the first key is untouched
    line = _assert_one_line(out, EXIT_INPUT, "invalid_input")
    assert "already exist" in line
    assert {p.name: p.read_bytes() for p in sorted((c.root / "keys").iterdir())} == before


def test_server_start_with_missing_enrolment_is_one_line(consortium, tmp_path):
    # Prepare: session.toml lists a hospital the PKI never enrolled
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2)
    cfg = tmp_path / "session.toml"
    write_config(cfg, {
        "session": {"id": "s-missing", "backend": "plain", "dim": 4, "classes": 2, "min_clients": 2,
                    "hospitals": ["h1", "h2", "h-unknown"]},
        "bounds": {"max_norm": 4.0, "n_max": 100, "k_max": 8},
        "server": {"port": free_port(), "data_dir": str(tmp_path / "srv"), "pki_dir": str(c.pki_dir)},
    })

    # Execute
    out = _cli("server", "run", "--config", cfg, "--allow-ca-key")

    # Assert
    line = _assert_one_line(out, EXIT_INPUT, "missing_enrolment")
    assert "h-unknown" in line


def test_debug_shows_the_traceback(consortium, tmp_path):
    # Prepare
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2)

    # Execute
    out = _cli("--debug", *_submit_args(c, "h1", _stats_file(c, "h1", tmp_path / "h1.npz"),
                                         server=f"https://127.0.0.1:{free_port()}"), "--wait-server", "0")

    # Assert
    assert out.returncode != 0 and "Traceback" in out.stderr and "ServerUnreachable" in out.stderr


def test_default_min_clients_refuses_a_two_hospital_release(consortium, tmp_path):
    # Prepare: session.toml without min_clients; two hospitals contributed (K = 2 would let each
    # recover the other's statistics by subtraction)
    c = consortium(backend="plain", hospitals=("h1", "h2", "h3"), min_clients=None).start()
    for h in ("h1", "h2"):
        cl = c.hospital(h)
        cl.submit(c.stats(*c.data(h)))
        cl.close()

    # Execute: the key holder asks for a release with its own threshold of 2
    out = _cli("keyholder", "finalize", "--pki", c.pki_dir, "--keys", c.root / "keys", "--server", c.url,
               "--session", c.session_id, "--min-clients", 2, "--out", tmp_path / "model.safetensors")

    # Assert: the session's default (3, as OPERATIONS.md requires) holds
    line = _assert_one_line(out, EXIT_REFUSED, "insufficient_contributors")
    assert "3" in line
    assert not (tmp_path / "model.safetensors").exists()
