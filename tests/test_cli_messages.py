"""What an operator reads from the real ``secure-afl`` command, above all when it refuses: one line
``secure-afl: error [reason]: message`` on stderr, no traceback, a reason in words (never a Python class name),
the advice that fits the party, and the exit code :mod:`secure_afl.exceptions` documents (3 input, 4 refused,
5 unreachable, 6 keys).

The ``e2e`` cases run the console entry point in its own process (:mod:`support.cli`) against real server
processes on 127.0.0.1. Where waiting cannot help (a certificate or address mistake, a missing or junk file) the
command must give up well before its retry window (``--wait-server 30``) would have run out; where something was
refused, nothing already accepted changes (the round stays open, no model file, no key published).
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from secure_afl import pki
from secure_afl.cli import main
from secure_afl.clients.statsfile import write_statistics_file
from secure_afl.exceptions import EXIT_INPUT, EXIT_KEYS, EXIT_REFUSED, EXIT_UNREACHABLE
from secure_afl.server.config import write_config
from secure_afl.session.signed import load_signed, sign_definition
from secure_afl.signing import make_receipt
from secure_afl.stats import local_statistics
from support import Consortium, free_port
from support.cli import (FAST_S, RETRY_WINDOW_S, error_line, finalize_args, one_line, passphrase_file, run_cli,
                         stats_file, submit_args)

e2e = pytest.mark.e2e


def _contribute(c, hospitals):
    for h in hospitals:
        cl = c.hospital(h)
        cl.submit(c.stats(*c.data(h)))
        cl.close()


def _keyed(c):
    c.keyholder.keygen(load_signed(c.pki_dir, c.session_id).session_params())


@pytest.fixture
def released(consortium):
    """A plain session of three hospitals, two of which contributed, released; the receipts in one folder."""
    c = consortium(backend="plain", hospitals=("h1", "h2", "h3"), min_clients=2).start()
    _contribute(c, ("h1", "h2"))
    with c.connect_keyholder() as conn:
        c.keyholder.finalize(conn, min_clients=2)
    return c


# -- session.toml and server start ------------------------------------------------------
@e2e
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
    out, _ = run_cli(*args)

    # Assert: the file and the place are named; nothing was created
    line = one_line(out, EXIT_INPUT, "invalid_toml")
    assert str(bad) in line and "line 4" in line
    assert sorted((c.pki_dir / "sessions").glob("*")) == signed_before


@e2e
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
    out, seconds = run_cli("server", "run", "--config", cfg, "--allow-ca-key")

    # Assert: refused at once, nothing opened, the first server untouched
    line = one_line(out, EXIT_INPUT, "port_in_use")
    assert f"port {c.port} on 127.0.0.1 is in use" in line
    assert "serving session" not in out.stderr + out.stdout
    assert seconds < FAST_S and not (tmp_path / "srv2").exists()
    with c.connect_keyholder() as conn:
        assert conn.info()["session_id"] == c.session_id


@e2e
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
    out, _ = run_cli("server", "run", "--config", cfg, "--allow-ca-key")

    # Assert
    line = one_line(out, EXIT_INPUT, "missing_enrolment")
    assert "h-unknown" in line


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
    line = error_line(err)
    assert line.startswith(f"secure-afl: error [parameter_mismatch]: {c.config}: ") and "min_clients" in line, line
    assert len(err.strip().splitlines()) == 1


def test_a_missing_file_is_named_in_words(tmp_path, capsys):
    # Execute: a session file that does not exist
    rc = main(["session", "sign", str(tmp_path / "session.toml"), "--pki", str(tmp_path / "pki")])

    # Assert: a reason in words, not the Python exception's name
    assert rc == EXIT_INPUT
    assert capsys.readouterr().err.strip() == \
        f"secure-afl: error [file_not_found]: no such file: {tmp_path / 'session.toml'}"


@e2e
def test_demo_with_a_relative_workdir(tmp_path):
    # Execute: the working directory given relative to where the command runs
    out, _ = run_cli("demo", "--backend", "plain", "--hospitals", "3", "--workdir", "work", cwd=tmp_path)

    # Assert: the server's data is under work/ (not work/work/), and the demo passed
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "W: within certified bound" in out.stdout
    assert (tmp_path / "work" / "server").is_dir() and not (tmp_path / "work" / "work").exists()


# -- addresses and certificates: permanent, never retried -------------------------------
@e2e
@pytest.mark.parametrize("form", ["http", "bare"])
def test_server_address_without_https_is_one_line_at_once(consortium, tmp_path, form):
    # Prepare
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2).start()
    stats = stats_file(c, "h1", tmp_path / "h1.npz")
    address = {"http": f"http://127.0.0.1:{c.port}", "bare": f"127.0.0.1:{c.port}"}[form]

    # Execute
    out, seconds = run_cli(*submit_args(c, "h1", stats, server=address, wait_server=RETRY_WINDOW_S))

    # Assert: the fix is named, and no retry window was spent
    line = one_line(out, EXIT_INPUT, "bad_server_url")
    assert f"did you mean https://127.0.0.1:{c.port}?" in line
    assert seconds < FAST_S < RETRY_WINDOW_S
    with c.connect_keyholder() as conn:
        assert conn.status()["uploaded"] == []


@e2e
def test_server_of_another_consortium_is_one_line_at_once(consortium, tmp_path):
    # Prepare: the hospital's bundle is from consortium B; the server it is pointed at is A's
    a = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2).start()
    b = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2)
    stats = stats_file(b, "h1", tmp_path / "h1.npz")

    # Execute
    out, seconds = run_cli(*submit_args(b, "h1", stats, server=a.url, wait_server=RETRY_WINDOW_S))

    # Assert: a certificate mistake is not "unreachable", and is not retried
    line = one_line(out, EXIT_KEYS, "untrusted_server")
    assert a.url in line and "certificate" in line and "bundle" in line
    assert seconds < FAST_S < RETRY_WINDOW_S
    with a.connect_keyholder() as conn:
        assert conn.status()["uploaded"] == []


@e2e
@pytest.mark.parametrize("debug", [False, True], ids=["one-line", "debug-traceback"])
def test_server_not_running(consortium, tmp_path, debug):
    # Prepare: a consortium whose server was never started
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2)
    args = submit_args(c, "h1", stats_file(c, "h1", tmp_path / "h1.npz"),
                       server=f"https://127.0.0.1:{free_port()}", wait_server=0)

    # Execute
    out, _ = run_cli(*(["--debug"] if debug else []), *args)

    # Assert: one line by default; --debug shows the traceback behind it instead
    if debug:
        assert out.returncode != 0 and "Traceback" in out.stderr and "ServerUnreachable" in out.stderr
    else:
        one_line(out, EXIT_UNREACHABLE, "unreachable")


@e2e
def test_keyholder_finalize_against_a_dead_server_says_what_it_waits_for(consortium, tmp_path):
    # Prepare: nothing listens on the address
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2)
    url = f"https://127.0.0.1:{free_port()}"

    # Execute
    out, seconds = run_cli("keyholder", "finalize", "--pki", c.pki_dir, "--keys", c.root / "keys", "--server", url,
                           "--session", c.session_id, "--min-clients", 2, "--out", tmp_path / "m.safetensors",
                           "--wait-server", 3)

    # Assert: one notice of the wait (with its bound), then one error line, and it kept to the bound
    lines = out.stderr.strip().splitlines()
    assert out.returncode == EXIT_UNREACHABLE and "Traceback" not in out.stderr and len(lines) == 2, out.stderr
    assert lines[0] == lines[0].strip() and "trying again for up to 3 s" in lines[0] and url in lines[0]
    assert lines[1].startswith("secure-afl: error [unreachable]: ") and "within 3 s" in lines[1]
    assert 3 <= seconds < 3 + FAST_S
    assert not (tmp_path / "m.safetensors").exists()


@e2e
def test_hospital_with_a_wrong_pki_is_told_to_ask_the_operator(consortium, tmp_path):
    # Prepare: the hospital points --pki at the folder that holds its bundle, not at the bundle
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2)
    bundles = pki.make_bundles(c.pki_dir, tmp_path / "bundles")
    assert bundles
    stats = stats_file(c, "h1", tmp_path / "h1.npz")

    # Execute
    out, _ = run_cli(*submit_args(c, "h1", stats, pki_dir=tmp_path / "bundles", wait_server=RETRY_WINDOW_S))

    # Assert: hospitals do not issue identities; the advice is to get the bundle
    line = one_line(out, EXIT_INPUT, "file_not_found")
    assert "pki issue" not in line and "ask the operator" in line and "'h1'" in line


# -- statistics files and submissions ---------------------------------------------------
@e2e
def test_stats_file_with_other_class_count_is_one_line(consortium, tmp_path):
    # Prepare: a 2-class statistics file for a 3-class session
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2).start()
    path = stats_file(c, "h1", tmp_path / "h1.npz", classes=2)

    # Execute
    out, _ = run_cli(*submit_args(c, "h1", path))

    # Assert: refused before anything was sent
    line = one_line(out, EXIT_INPUT, "invalid_input")
    assert "2 classes" in line and "3" in line
    with c.connect_keyholder() as conn:
        assert conn.status()["uploaded"] == []


@e2e
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
    args = submit_args(c, "h1", path)
    if kind == "embeddings":
        args[args.index("--stats")] = "--embeddings"

    # Execute
    out, _ = run_cli(*args)

    # Assert: refused on the hospital before anything was sent
    line = one_line(out, EXIT_INPUT, "bounds_exceeded")
    assert f"B={c.max_norm}" in line
    with c.connect_keyholder() as conn:
        assert conn.status()["uploaded"] == []


@e2e
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
    out, seconds = run_cli(*submit_args(c, "h1", junk, wait_server=RETRY_WINDOW_S))

    # Assert: says what the file is not, before contacting anyone; numpy's advice to unpickle never shows
    line = one_line(out, EXIT_INPUT, "bad_statistics_file")
    assert "is not a statistics or embeddings file" in line and "pickle" not in line
    assert seconds < FAST_S < RETRY_WINDOW_S


@e2e
def test_missing_statistics_file_is_bad_input_before_any_connection(consortium, tmp_path):
    # Prepare: the server is not even running; a connection attempt would wait RETRY_WINDOW_S
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2)

    # Execute
    out, seconds = run_cli(*submit_args(c, "h1", tmp_path / "no-such-stats.npz", wait_server=RETRY_WINDOW_S))

    # Assert: exit 3 like every other input error (not 4, the server's "no such session")
    line = one_line(out, EXIT_INPUT, "bad_statistics_file")
    assert "no such file" in line and "client embed" in line
    assert seconds < FAST_S < RETRY_WINDOW_S


@e2e
def test_wrong_session_id_is_one_line(consortium, tmp_path):
    # Prepare: the operator defined a session this server does not run
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2).start()
    d = load_signed(c.pki_dir, c.session_id)
    sign_definition(replace(d, body={**d.body, "id": "no-such-session"}), c.pki_dir)

    # Execute
    out, _ = run_cli(*submit_args(c, "h1", stats_file(c, "h1", tmp_path / "h1.npz"), session="no-such-session"))

    # Assert: the line names both the asked and the served session
    line = one_line(out, EXIT_REFUSED, "not_found")
    assert "no-such-session" in line and c.session_id in line


@e2e
def test_submit_after_release_is_one_line(released, tmp_path):
    # Execute: the third hospital submits after the key holder released the other two's aggregate
    out, _ = run_cli(*submit_args(released, "h3", stats_file(released, "h3", tmp_path / "h3.npz"),
                                  receipts=tmp_path / "rc"))

    # Assert
    one_line(out, EXIT_REFUSED, "round_closed")


@e2e
def test_submit_before_publish_says_what_it_waits_for_honours_wait_server_and_gives_a_hint(consortium, tmp_path):
    # Prepare: a split session whose key holder made its key but has not published it
    c = consortium(backend="split", hospitals=("h1", "h2"), min_clients=2).start()
    _keyed(c)
    stats = stats_file(c, "h1", tmp_path / "s.npz")

    # Execute
    out, took = run_cli(*submit_args(c, "h1", stats, receipts=tmp_path / "rc", wait_server=2))

    # Assert: said before waiting, waited --wait-server (not 60 s), refused with the reason and the fix
    assert out.returncode == EXIT_REFUSED, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[0] == (f"secure-afl: session {c.session_id} is waiting for the key holder's public context "
                        "(`secure-afl keyholder publish`); trying again for up to 2 s"), out.stderr
    assert error_line(out.stderr) == (
        f"secure-afl: error [awaiting_publication]: session {c.session_id} still has no public context from the "
        "key holder after 2 s: nothing was sent; run this command again once the key holder has run "
        "`secure-afl keyholder publish` (or give it longer with --wait-server SECONDS)")
    assert took < 30
    assert not (tmp_path / "rc").exists() or not list((tmp_path / "rc").iterdir())


# -- key holder ------------------------------------------------------------------------
@e2e
@pytest.mark.parametrize("session_min, contributed", [(2, ("h1",)), (None, ("h1", "h2"))],
                         ids=["below-the-signed-minimum", "below-the-default-minimum-of-3"])
def test_finalize_below_min_clients_is_one_line(consortium, tmp_path, session_min, contributed):
    # Prepare: fewer contributions than the session needs: its signed min_clients, or (none signed) the default
    # of 3, which holds even against the key holder's own --min-clients 2 (K = 2 would let each hospital recover
    # the other's statistics by subtraction)
    c = consortium(backend="plain", hospitals=("h1", "h2", "h3"), min_clients=session_min).start()
    _contribute(c, contributed)

    # Execute
    out, _ = run_cli(*finalize_args(c, tmp_path / "model.safetensors", min_clients=2))

    # Assert: nothing released, no model written; the line names the minimum that held
    line = one_line(out, EXIT_REFUSED, "insufficient_contributors")
    assert str(session_min or 3) in line
    assert not (tmp_path / "model.safetensors").exists()
    with c.connect_keyholder() as conn:
        assert conn.info()["status"] == "open"


@e2e
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
    _contribute(c, ("h1", "h2"))
    wrong = passphrase_file(tmp_path / "wrong.pass", "not the passphrase at all")

    # Execute
    out, _ = run_cli(*finalize_args(c, tmp_path / "model.safetensors", "--passphrase-file", wrong))

    # Assert
    one_line(out, EXIT_KEYS, "invalid_key")
    assert not (tmp_path / "model.safetensors").exists()


@e2e
def test_finalize_without_a_passphrase_names_the_flag_not_the_python_argument(consortium, tmp_path):
    # Prepare: a published bfv session with two uploads
    c = consortium(backend="bfv", hospitals=("h1", "h2"), min_clients=2).start()
    _keyed(c)
    with c.connect_keyholder() as conn:
        c.keyholder.publish(conn)

    # Execute: no --passphrase-file and no $SECURE_AFL_KEY_PASSPHRASE
    out, _ = run_cli(*finalize_args(c, tmp_path / "model.safetensors", "--report", tmp_path / "report.json",
                                    "--wait-server", 5))

    # Assert
    assert out.returncode == EXIT_KEYS
    assert error_line(out.stderr) == (
        f"secure-afl: error [invalid_key]: the sealed keys of session {c.session_id} need the passphrase they "
        "were made with: --passphrase-file FILE or $SECURE_AFL_KEY_PASSPHRASE")
    with c.connect_keyholder() as conn:
        assert conn.info()["status"] == "open"


@e2e
def test_publish_with_a_wrong_passphrase_is_refused_before_anything_is_published(consortium, tmp_path):
    # Prepare: keys sealed with one passphrase; publish is given another
    c = consortium(backend="ckks", hospitals=("h1", "h2"), min_clients=2).start()
    good = passphrase_file(tmp_path / "good.pass", "the passphrase keygen was given")
    wrong = passphrase_file(tmp_path / "wrong.pass", "the passphrase keygen was not given")
    keys = tmp_path / "keys"
    keygen, _ = run_cli("keyholder", "keygen", "--pki", c.pki_dir, "--keys", keys, "--session", c.session_id,
                        "--passphrase-file", good)
    assert keygen.returncode == 0, keygen.stderr
    publish = ("keyholder", "publish", "--pki", c.pki_dir, "--keys", keys, "--server", c.url, "--session",
               c.session_id)

    # Execute
    out, _ = run_cli(*publish, "--passphrase-file", wrong)

    # Assert: refused at publish; hospitals still have no key to encrypt to
    line = one_line(out, EXIT_KEYS, "invalid_key")
    assert "does not open the sealed keys" in line
    with c.connect_keyholder() as conn:
        assert conn.info()["status"] == "awaiting_context"
    right, _ = run_cli(*publish, "--passphrase-file", good)
    assert right.returncode == 0, right.stderr
    with c.connect_keyholder() as conn:
        assert conn.info()["status"] == "open"


@e2e
def test_keygen_twice_is_one_line(consortium, tmp_path):
    # Prepare: the first keygen succeeds through the same command
    c = consortium(backend="ckks", hospitals=("h1", "h2"), min_clients=2)
    passfile = passphrase_file(tmp_path / "kh.pass", "a long enough key holder passphrase")
    args = ["keyholder", "keygen", "--pki", c.pki_dir, "--keys", c.root / "keys", "--session", c.session_id,
            "--passphrase-file", passfile]
    first, _ = run_cli(*args)
    assert first.returncode == 0, first.stderr
    before = {p.name: p.read_bytes() for p in sorted((c.root / "keys").iterdir())}

    # Execute
    out, _ = run_cli(*args)

    # Assert: refused, and the first key is untouched
    line = one_line(out, EXIT_INPUT, "invalid_input")
    assert "already exist" in line
    assert {p.name: p.read_bytes() for p in sorted((c.root / "keys").iterdir())} == before


@e2e
def test_finalize_to_an_unwritable_model_path_is_refused_before_the_release(consortium, tmp_path):
    # Prepare: a plain session with both uploads; --out names a directory
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2).start()
    _contribute(c, c.hospitals)
    (tmp_path / "models").mkdir()

    # Execute
    out, _ = run_cli(*finalize_args(c, tmp_path / "models"))

    # Assert: refused in one line, and the round is still open for the corrected command
    assert out.returncode == EXIT_INPUT
    assert error_line(out.stderr) == (f"secure-afl: error [is_a_directory]: --out {tmp_path / 'models'} is a "
                                      "directory; name a file (nothing was changed)")
    with c.connect_keyholder() as conn:
        assert conn.info()["status"] == "open"


@e2e
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
    passfile = passphrase_file(tmp_path / "pass", "test passphrase")

    # Execute: a --lambda and a stricter --min-class-count than the session's (the key holder applies both)
    out, _ = run_cli(*finalize_args(c, tmp_path / "model.safetensors", "--report", tmp_path / "report.json",
                                    "--wait-server", 5, "--passphrase-file", passfile, "--lambda", "0.5",
                                    "--min-class-count", "2"))

    # Assert: the release is the key holder's solve at that ridge, over the plaintext sum
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["lambda_total"] == 0.5 and report["participants"] == ["h1", "h2"]
    W, meta = read_model(tmp_path / "model.safetensors")
    assert np.max(np.abs(W - solve_from_sums(plain, lam=0.5))) < 1e-6


@e2e
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
    out, _ = run_cli(*finalize_args(c, tmp_path / "model.safetensors", "--report", tmp_path / "report.json",
                                    "--wait-server", 5))

    # Assert
    assert out.returncode == 0, out.stderr
    w_line = next(ln for ln in out.stdout.splitlines() if ln.startswith("W: "))
    assert w_line == ("W: no bound (C singular): W is the minimum-norm solution C^+ Q of sums released exactly "
                      "(no noise was added), but a singular C gives it no perturbation bound; more samples or a "
                      "--lambda ridge give one")
    assert "at this noise" not in out.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert "lambda" not in report and report["lambda_requested"] == report["lambda_total"] == 0.0


# -- audit verify ----------------------------------------------------------------------
def _verify(c, receipts, *extra):
    log = c.audit_path()
    return run_cli("audit", "verify", log, "--pki", c.pki_dir, "--head", log.parent / "audit-head.json",
                   "--receipts", receipts, *extra)[0]


def _other_session_receipt(c) -> dict:
    """A receipt the same server signed in an earlier session (as a hospital's folder keeps them)."""
    key = pki.load_party(c.pki_dir, "server", "aggregator").identity_key()
    return make_receipt(key, "earlier-session", "h1", bytes(32), 3, audit_head="ab" * 32)


@e2e
def test_audit_verify_with_a_missing_receipts_folder_fails(released, tmp_path):
    out = _verify(released, tmp_path / "no-such-folder")
    line = one_line(out, EXIT_INPUT, "invalid_input")
    assert "no-such-folder: no such file or directory" in line and not out.stdout.startswith("OK")


@e2e
def test_audit_verify_accepts_one_receipt_file(released):
    # Execute: the hospital passes its receipt file instead of the folder
    out = _verify(released, released.root / "receipts" / f"receipt-{released.session_id}-h1.json")

    # Assert
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith(f"OK: session {released.session_id}: ") and " 1 receipts matched;" in out.stdout


@e2e
def test_audit_verify_picks_this_sessions_receipts_from_a_shared_folder(released):
    # Prepare: the folder also holds a receipt of another session (it used to read as BROKEN)
    folder = released.root / "receipts"
    (folder / "receipt-earlier-session-h1.json").write_text(json.dumps(_other_session_receipt(released)))

    # Execute
    out = _verify(released, folder)

    # Assert: both of this session's receipts checked, the other one set aside and counted
    assert out.returncode == 0, out.stdout + out.stderr
    assert " 2 receipts matched (1 of other sessions set aside);" in out.stdout


@e2e
def test_audit_verify_fails_when_no_receipt_is_of_this_session(released, tmp_path):
    # Prepare: a folder holding only another session's receipt
    folder = tmp_path / "old-receipts"
    folder.mkdir()
    (folder / "receipt-earlier-session-h1.json").write_text(json.dumps(_other_session_receipt(released)))

    # Execute
    out = _verify(released, folder)

    # Assert: zero checked receipts is not an OK
    line = one_line(out, EXIT_INPUT, "invalid_input")
    assert f"no receipt of session {released.session_id}" in line and "earlier-session" in line
    assert "OK" not in out.stdout


@e2e
def test_audit_verify_refuses_the_log_of_another_session(released):
    out = _verify(released, released.root / "receipts", "--session", "the-session-i-meant")
    line = one_line(out, EXIT_INPUT, "invalid_input")
    assert f"audit log of session {released.session_id}, not of session the-session-i-meant" in line


@e2e
def test_audit_verify_with_the_head_of_another_session_names_it_and_raises_no_tampering_alarm(released, tmp_path):
    # Prepare: a head the same server signed in another session (a receipt pins a head as well as a close record)
    head = tmp_path / "other-head.json"
    head.write_text(json.dumps(_other_session_receipt(released)))

    # Execute
    log = released.audit_path()
    out = run_cli("audit", "verify", log, "--pki", released.pki_dir, "--head", head, "--receipts",
                  released.root / "receipts")[0]

    # Assert: a wrong file named as such, with its exit code, not BROKEN with the security one
    line = one_line(out, EXIT_INPUT, "head_of_other_session")
    assert (f"the expected head is of session earlier-session, but {log} is the audit log of session "
            f"{released.session_id}") in line
    assert "BROKEN" not in out.stdout + out.stderr


# -- reasons in words, wherever the error comes from -----------------------------------
def test_a_timeout_is_reported_in_words():
    from secure_afl.cli import one_line as render

    assert render(TimeoutError("gave up waiting for the server after 5 s")) == \
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
