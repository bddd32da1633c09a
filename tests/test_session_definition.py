"""The operator's signed session definition: one strict schema, and every party pins the signed one.

Each refusal goes through a party's real command (``session sign``, ``server
run``, ``client submit``, ``keyholder keygen``, ``keyholder finalize``) and
must be one line naming what is wrong; a server relaying a value that
disagrees with the signed definition is refused by the hospital's real run
loop (tests/secagg_adversary.py) with the field named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import numpy as np
import pytest
from support import Consortium

from secure_afl import pki
from secure_afl.session.definition import normalise
from secure_afl.session.schema import load_toml
from secure_afl.session.signed import load_signed, sign_definition
from secure_afl.session.toml_writer import write_toml
from secure_afl.clients.statsfile import write_statistics_file
from secure_afl.exceptions import EXIT_INPUT, EXIT_KEYS

pytestmark = pytest.mark.security


def _cli(*args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SECURE_AFL_KEY_PASSPHRASE"}
    return subprocess.run([sys.executable, "-m", "secure_afl.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=180, env=env)


def _one_line(out: subprocess.CompletedProcess, code: int, reason: str) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == code and len(lines) == 1, out.stderr
    assert lines[0].startswith(f"secure-afl: error [{reason}]: "), lines[0]
    return lines[0]


def _edit(c: Consortium, section: str, **changes) -> None:
    raw = tomllib.loads(c.config.read_text())
    raw[section].update(changes)
    write_toml(c.config, raw)


def _stats(c: Consortium, name: str):
    X, y = c.data(name)
    return write_statistics_file(c.root / f"{name}.npz", c.stats(X, y), [f"class-{i}" for i in range(c.classes)],
                                 metadata={"max_row_norm": float(np.linalg.norm(X, axis=1).max())})


def _party_commands(c: Consortium) -> dict[str, list]:
    """What each party runs with the session's definition (none of them gets as far as the network)."""
    return {
        "server": ["server", "run", "--config", c.config, "--allow-ca-key"],
        "hospital": ["client", "submit", "--server", c.url, "--session", c.session_id, "--pki", c.pki_dir,
                     "--name", "h1", "--stats", _stats(c, "h1"), "--receipts", c.root / "rc", "--no-progress"],
        "keyholder": ["keyholder", "keygen", "--pki", c.pki_dir, "--keys", c.root / "keys", "--session",
                      c.session_id],
    }


@pytest.mark.e2e
@pytest.mark.parametrize("section, key, value, words", [
    ("session", "min_client", 8, ["'min_client'", "did you mean 'min_clients'"]),
    ("secagg", "treshold", 2, ["'treshold'", "did you mean 'threshold'"]),
    ("session", "dim", "512", ["dim must be an integer", "'512'"]),
    ("session", "gamma", True, ["gamma must be a number"]),
    ("session", "min_clients", 5, ["roster of 3 hospitals cannot release with min_clients = 5", "smallest roster that works has 5"]),
])
def test_a_bad_session_file_is_refused_in_one_line_by_the_operator_and_the_server(tmp_path, section, key, value,
                                                                                     words):
    # Prepare: a secagg session of 3 hospitals, one key misspelt, mistyped or impossible
    c = Consortium(tmp_path, backend="secagg", hospitals=("h1", "h2", "h3"), secagg={"stage_timeout_s": 30.0},
                   sign=False)
    _edit(c, section, **{key: value})

    # Execute
    signed = _cli("session", "sign", c.config, "--pki", c.pki_dir)
    served = _cli("server", "run", "--config", c.config, "--allow-ca-key")

    # Assert: one line each, the key named; nothing was signed
    for out in (signed, served):
        line = _one_line(out, EXIT_INPUT, "invalid_parameter")
        assert all(w in line for w in words), line
    assert not (c.pki_dir / "sessions").exists()


@pytest.mark.e2e
def test_every_party_refuses_a_session_nobody_signed(tmp_path):
    # Prepare: the operator wrote session.toml but never signed it
    c = Consortium(tmp_path, backend="ckks", hospitals=("h1", "h2", "h3"), sign=False)

    # Execute / Assert: one line per party, naming the command that signs
    for party, args in _party_commands(c).items():
        line = _one_line(_cli(*args), EXIT_INPUT, "missing_enrolment")
        assert "no signed definition of session 't-ckks'" in line and "secure-afl session sign" in line, party


@pytest.mark.e2e
def test_every_party_refuses_a_session_signed_by_another_ca(tmp_path):
    # Prepare: the same definition, signed by a CA of someone else's making, placed where parties look
    c = Consortium(tmp_path, backend="ckks", hospitals=("h1", "h2", "h3"), sign=False)
    foreign = tmp_path / "foreign"
    pki.init_ca(foreign, name="not the consortium")
    definition = normalise(load_toml(c.config), issued_hospitals=["h1", "h2", "h3"])
    [path] = sign_definition(definition, foreign)
    (c.pki_dir / "sessions").mkdir()
    (c.pki_dir / "sessions" / path.name).write_bytes(path.read_bytes())

    # Execute / Assert
    for party, args in _party_commands(c).items():
        line = _one_line(_cli(*args), EXIT_KEYS, "bad_signature")
        assert "not signed by the consortium CA" in line, party


@pytest.mark.e2e
def test_every_party_refuses_another_sessions_definition_and_an_altered_one(tmp_path):
    # Prepare: session t-ckks is signed; its file is copied over as the definition of session "other",
    # and a copy with min_clients lowered (signature kept) as t-ckks itself
    c = Consortium(tmp_path, backend="ckks", hospitals=("h1", "h2", "h3"))
    sessions = c.pki_dir / "sessions"
    doc = json.loads((sessions / "t-ckks.json").read_text())
    (sessions / "other.json").write_text(json.dumps(doc))
    c_other = Consortium(tmp_path, backend="ckks", hospitals=("h1", "h2", "h3"), sign=False)
    c_other.session_id = "other"

    # Execute / Assert: another session's definition
    for party, args in _party_commands(c_other).items():
        if party == "server":
            continue  # the server reads its id from session.toml (t-ckks), which is signed
        line = _one_line(_cli(*args), EXIT_INPUT, "wrong_session")
        assert "signed for session 't-ckks', not 'other'" in line, party

    # Execute / Assert: an altered definition
    doc["definition"]["min_clients"] = 1
    (sessions / "t-ckks.json").write_text(json.dumps(doc))
    for party, args in _party_commands(c).items():
        line = _one_line(_cli(*args), EXIT_KEYS, "bad_signature")
        assert "not signed by the consortium CA" in line, party


@pytest.mark.e2e
def test_server_settings_that_disagree_with_the_signed_definition_are_refused_naming_the_field(tmp_path):
    # Prepare: signed with min_clients = 2; the server's session.toml is then edited to 1
    c = Consortium(tmp_path, backend="plain", hospitals=("h1", "h2", "h3"), min_clients=2)
    _edit(c, "session", min_clients=1)

    # Execute
    out = _cli("server", "run", "--config", c.config, "--allow-ca-key")

    # Assert: one line in the form of every command (bad input: exit 3), the file and the field named
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 3 and len(lines) == 1, out.stderr
    assert lines[0].startswith(f"secure-afl: error [parameter_mismatch]: {c.config}: "), lines[0]
    assert "disagrees with the signed session definition on min_clients: signed 2, got 1" in lines[0]


@pytest.mark.e2e
def test_a_definition_once_signed_never_changes(tmp_path):
    # Prepare
    c = Consortium(tmp_path, backend="plain", hospitals=("h1", "h2", "h3"), min_clients=2)
    _edit(c, "session", min_clients=3)

    # Execute
    out = _cli("session", "sign", c.config, "--pki", c.pki_dir)

    # Assert: refused, the signed file untouched
    _one_line(out, 3, "parameter_mismatch")
    assert load_signed(c.pki_dir, c.session_id)["min_clients"] == 2


@pytest.mark.e2e
def test_sign_places_the_definition_in_every_bundle_and_fills_in_the_defaults(tmp_path):
    # Prepare: bundles made before the session is signed
    c = Consortium(tmp_path, backend="secagg", hospitals=("h1", "h2", "h3", "h4", "h5"), min_clients=2,
                   sign=False)
    pki.make_bundles(c.pki_dir, tmp_path / "bundles")

    # Execute
    out = _cli("session", "sign", c.config, "--pki", c.pki_dir, "--bundles", tmp_path / "bundles")

    # Assert: every bundle pins the same definition; threshold and degree are final numbers
    assert out.returncode == 0, out.stderr
    # the default threshold is privacy first (5 hospitals at min_clients 2: t = 3, the server needs 3 colluders
    # to isolate one hospital, as in a split session of five) and one hospital may still drop out
    assert "threshold 3, neighbours all, quorum 4 of 5" in out.stdout
    bundles = sorted((tmp_path / "bundles").iterdir())
    assert len(bundles) == 7
    for b in bundles:
        d = load_signed(b, c.session_id)
        assert d.body == load_signed(c.pki_dir, c.session_id).body
        assert d["secagg"] == {"threshold": 3, "neighbours": 0, "stage_timeout_s": 60.0, "max_rounds": 3}


@pytest.mark.parametrize("text", ['quote " and backslash \\ here', "new\nline\ttab\x7fdel\x01", "ünïcødé 🩺",
                                  "x = 1\n[dp]\nepsilon = 1e9"])
def test_the_toml_writer_escapes_every_string(tmp_path, text):
    # Prepare / Execute
    write_toml(tmp_path / "s.toml", {"session": {"id": "a", "backend": text, "hospitals": [text, "b"]},
                                             "weird key": {"k.1": text}})

    # Assert: read back exactly, no section or key injected
    back = tomllib.loads((tmp_path / "s.toml").read_text())
    assert back == {"session": {"id": "a", "backend": text, "hospitals": [text, "b"]}, "weird key": {"k.1": text}}


def test_bundles_made_after_signing_carry_the_definition(tmp_path):
    # Prepare: signed first, bundled after
    c = Consortium(tmp_path, backend="plain", hospitals=("h1", "h2", "h3"), min_clients=2)

    # Execute
    made = pki.make_bundles(c.pki_dir, tmp_path / "bundles")

    # Assert: each party's bundle pins the operator's definition
    for bundle in made.values():
        assert load_signed(bundle, c.session_id).body == load_signed(c.pki_dir, c.session_id).body
