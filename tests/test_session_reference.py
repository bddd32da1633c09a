"""docs/SESSION.md is generated from the one session schema, and the schema's ranges are refused at load."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support import Consortium

from secure_afl.session.schema import SECTIONS, reference
from secure_afl.session.toml_writer import write_toml
from secure_afl.exceptions import EXIT_INPUT

DOC = Path(__file__).resolve().parents[1] / "docs" / "SESSION.md"


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "secure_afl.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))


def test_committed_session_reference_is_the_generated_one():
    # the reference must change with the schema: regenerate with `secure-afl session reference > docs/SESSION.md`
    assert DOC.read_text() == reference()


def test_the_reference_names_every_key_of_every_section():
    text = reference()
    for name, sec in SECTIONS.items():
        assert f"## [{name}]" in text
        for key in sec.keys:
            assert f"| `{key}` |" in text.split(f"## [{name}]")[1].split("\n## ")[0], (name, key)


@pytest.mark.e2e
def test_session_reference_command_prints_the_committed_reference():
    out = _cli("session", "reference")
    assert out.returncode == 0, out.stderr
    assert out.stdout == DOC.read_text()


@pytest.mark.e2e
@pytest.mark.parametrize("section, key, value, words", [
    ("session", "dim", 0, ["dim must be >= 1, <= 65536, not 0"]),
    ("session", "classes", 2_000_000, ["classes must be >= 1, <= 1000000"]),
    ("session", "max_upload_bytes", 10, ["max_upload_bytes must be >= 1024"]),
    ("bounds", "k_max", 2, ["k_max = 2 is below the 3 hospitals"]),
    ("session", "min_clients", 4, ["roster of 3 hospitals cannot release with min_clients = 4", "smallest roster that works has 4"]),
    ("dp", "min_contributors", 4, ["min_contributors = 4 is above the 3 hospitals"]),
    ("server", "port", 70000, ["port must be >= 1, <= 65535"]),
])
def test_out_of_range_values_and_impossible_combinations_are_refused_in_one_line(tmp_path, section, key, value,
                                                                                  words):
    # Prepare: a plain session of 3 hospitals with distributed DP, one value out of its range
    c = Consortium(tmp_path, backend="plain", hospitals=("h1", "h2", "h3"), sign=False,
                   dp={"noise_multiplier": 1.0, "min_contributors": 2})
    raw = tomllib.loads(c.config.read_text())
    raw[section][key] = value
    write_toml(c.config, raw)

    # Execute
    for out in (_cli("session", "sign", c.config, "--pki", c.pki_dir), _cli("server", "run", "--config", c.config, "--allow-ca-key")):
        # Assert: one line naming the key and its range; nothing signed
        lines = out.stderr.strip().splitlines()
        assert out.returncode == EXIT_INPUT and len(lines) == 1, out.stderr
        assert all(w in lines[0] for w in words), lines[0]
    assert not (c.pki_dir / "sessions").exists()
