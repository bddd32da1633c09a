"""A consortium's second session and a hospital that joins later: `pki bundle` run again adds what is new to
the bundles the parties hold, and a bundle copied inside another is named, not blamed on the operator."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from secure_afl import pki
from secure_afl.cli import main
from secure_afl_tools.harness import Consortium
from support.walkthrough import CLASSES, documented_sessions, make_inputs, prompt_commands, run_session


def _main(capsys, *args):
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _files(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_pki_bundle_run_again_adds_a_session_and_a_new_hospital_without_overwriting(tmp_path, capsys):
    # Prepare: the first session's bundles, handed out
    c = Consortium(tmp_path / "op", backend="plain", hospitals=("h1", "h2"), sign=False)
    bundles = tmp_path / "bundles"
    assert _main(capsys, "pki", "bundle", "--dir", c.pki_dir, "--out", bundles)[0] == 0
    before = _files(bundles)

    # Execute: a session signed without --bundles, then a hospital issued, each followed by `pki bundle`
    assert _main(capsys, "session", "sign", c.config, "--pki", c.pki_dir)[0] == 0
    rc1, out1, _ = _main(capsys, "pki", "bundle", "--dir", c.pki_dir, "--out", bundles)
    assert _main(capsys, "pki", "issue", "--dir", c.pki_dir, "--role", "hospital", "--name", "h3")[0] == 0
    rc2, out2, _ = _main(capsys, "pki", "bundle", "--dir", c.pki_dir, "--out", bundles)

    # Assert: every bundle holds the session and the roster naming h3; h3 has its own bundle; no file a party
    # held changed except the (CA-signed, public) roster
    assert rc1 == 0 and rc2 == 0
    assert "hospital-h1" in out1 and f"added sessions/{c.session_id}.json" in out1
    assert "added roster.json" in out2 and "hospital-h3" in out2
    after = _files(bundles)
    changed = {k for k in before if after[k] != before[k]}
    assert changed and all(k.endswith("/roster.json") for k in changed), changed
    for b in bundles.iterdir():
        assert (b / "sessions" / f"{c.session_id}.json").exists()
        roster = json.loads((b / "roster.json").read_text())
        assert "h3" in json.dumps(roster)
    assert pki.load_party(bundles / "hospital-h3", "hospital", "h3").name == "h3"
    assert not list(bundles.rglob("ca.key"))


def test_pki_bundle_refuses_a_bundle_with_another_partys_keys_and_changes_nothing(tmp_path, capsys):
    # Prepare: bundles made, then one party's key file in its bundle replaced (another CA's bundle there)
    c = Consortium(tmp_path / "op", backend="plain", hospitals=("h1", "h2"), sign=False)
    bundles = tmp_path / "bundles"
    assert _main(capsys, "pki", "bundle", "--dir", c.pki_dir, "--out", bundles)[0] == 0
    key = bundles / "hospital-h2" / "hospital-h2" / "identity.pub"
    key.write_bytes(b"another key")
    assert _main(capsys, "pki", "issue", "--dir", c.pki_dir, "--role", "hospital", "--name", "h3")[0] == 0
    before = _files(bundles)

    # Execute
    rc, _, err = _main(capsys, "pki", "bundle", "--dir", c.pki_dir, "--out", bundles)

    # Assert: one line naming the file; no bundle written or changed (h3's neither)
    assert rc == 3 and err.count("\n") == 1 and str(key) in err and "[file_exists]" in err
    assert _files(bundles) == before


def test_a_bundle_copied_inside_the_last_one_is_named(tmp_path, capsys):
    # Prepare: the server's pki/ from the first session; the second session's bundle copied with `cp -r
    # BUNDLE pki` again, which puts it at pki/server-aggregator/
    c = Consortium(tmp_path / "op", backend="plain", hospitals=("h1", "h2"), sign=False)
    bundles = tmp_path / "bundles"
    assert _main(capsys, "pki", "bundle", "--dir", c.pki_dir, "--out", bundles)[0] == 0
    held = tmp_path / "server" / "pki"
    shutil.copytree(bundles / "server-aggregator", held)
    assert _main(capsys, "session", "sign", c.config, "--pki", c.pki_dir, "--bundles", bundles)[0] == 0
    shutil.copytree(bundles / "server-aggregator", held / "server-aggregator", dirs_exist_ok=True)

    # Execute
    rc, _, err = _main(capsys, "session", "show", "--session", c.session_id, "--pki", held)

    # Assert: the nested folder is named with the copy that works
    assert rc != 0 and err.count("\n") == 1
    assert f"{held / 'server-aggregator'} holds it" in err and "cp -r BUNDLE/." in err


def _second_session_commands() -> list[tuple[str, str]]:
    """The "## A second session" section of docs/RUNNING.md, as (party, command) in order."""
    import re

    text = (Path(__file__).resolve().parent.parent / "docs" / "RUNNING.md").read_text()
    return prompt_commands(re.search(r"^## A second session.*?```sh\n(.*?)```", text, re.S | re.M).group(1))


@pytest.mark.e2e
@pytest.mark.slow
def test_the_documented_second_session_with_a_new_hospital_runs_as_written(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from PIL import Image

    # Prepare: the new hospital's images
    make_inputs(tmp_path)
    rng = np.random.default_rng(4)
    for c in CLASSES:
        (tmp_path / "hosp-d" / "images" / c).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(
                tmp_path / "hosp-d" / "images" / c / f"{i}.png")

    # Execute: README's split session, then the second session as docs/RUNNING.md writes it, in one run: the
    # first session's server still running, as a reader who followed README would have it
    run_session(tmp_path, documented_sessions()["split"] + _second_session_commands())

    # Assert: four hospitals released; every party's pki/ is its one bundle, not a bundle inside a bundle;
    # the first session's report is untouched
    report = json.loads((tmp_path / "keyholder" / "report-cohort-split-2.json").read_text())
    assert report["participants"] == ["hosp-a", "hosp-b", "hosp-c", "hosp-d"] and report["samples"] == 24
    own = {"server": "server-aggregator", "keyholder": "keyholder-keyholder",
           **{h: f"hospital-{h}" for h in ("hosp-a", "hosp-b", "hosp-c", "hosp-d")}}
    for party, bundle in own.items():
        held = sorted(p.name for p in (tmp_path / party / "pki").iterdir())
        assert held == sorted(["ca.pem", "roster.json", "sessions", bundle]), (party, held)
        assert (tmp_path / party / "pki" / "sessions" / "cohort-split-2.json").exists()
    assert json.loads((tmp_path / "keyholder" / "report-cohort-split.json").read_text())["samples"] == 18
    assert (tmp_path / "keyholder" / "model-cohort-split.safetensors").is_file()
