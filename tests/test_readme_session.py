"""The documented sessions ("A session, end to end"), run exactly as written, for every backend.

The commands are read from README.md (split) and docs/RUNNING.md (BFV, SecAgg, CKKS),
so the documentation cannot drift from what works. Every party has its own directory; the only things the test
puts there are the inputs the README says a party holds before the session
(a hospital's images). The port is replaced by a free one so parallel runs do not
collide. The lines run as a shell user would run them: a command ending in ``&`` runs in the background of
its party's shell and is waited for only where that party's lines say ``wait``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from support.walkthrough import CLASSES, HOSPITALS, WALKTHROUGHS, documented_sessions, make_inputs, run_session, \
    session_sections

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")


def _holds_only_its_own_bundle(root: Path) -> None:
    expected = {"server": "server-aggregator", "keyholder": "keyholder-keyholder",
                **{h: f"hospital-{h}" for h in HOSPITALS}}
    for party, own in expected.items():
        pki_dir = root / party / "pki"
        assert sorted(p.name for p in pki_dir.iterdir()) == sorted(["ca.pem", "roster.json", "sessions", own]), party
    assert [p for p in root.rglob("ca.key")] == [root / "operator" / "pki" / "ca.key"]


def test_readme_documents_every_protected_backend():
    # README keeps one walkthrough; the others live in docs/RUNNING.md, run by the same test
    assert [m for m in re.findall(r"^### With (\w+)", "".join(session_sections(WALKTHROUGHS[0].read_text())), re.M)] \
        == ["split"]
    sessions = documented_sessions()
    assert sorted(sessions) == ["BFV", "CKKS", "SecAgg", "split"]
    for commands in sessions.values():
        assert {p for p, _ in commands} == {"operator", "server", "keyholder", *HOSPITALS}


@pytest.mark.e2e
@pytest.mark.parametrize("backend", ["CKKS", "BFV", "SecAgg", "split"])
def test_documented_session_runs_as_written(tmp_path, backend):
    # Prepare
    make_inputs(tmp_path)
    commands = documented_sessions()[backend]

    # Execute
    timing = run_session(tmp_path, commands)

    # Assert: the key holder's model and report (named by the session), the hospital's audit check, each
    # party's files
    session_id = {"CKKS": "cohort-ckks", "BFV": "cohort-bfv", "SecAgg": "cohort-secagg",
                  "split": "cohort-split"}[backend]
    report = json.loads((tmp_path / "keyholder" / f"report-{session_id}.json").read_text())
    assert report["participants"] == list(HOSPITALS)
    assert report["class_counts"] == [6, 6, 6] and report["samples"] == 18
    from secure_afl.keyholder import read_model

    W, meta = read_model(tmp_path / "keyholder" / f"model-{session_id}.safetensors")
    assert W.shape == (512, 3) and np.all(np.isfinite(W))
    # the model says which session, class order and extractor it belongs to: the session.toml's own
    from secure_afl.server.config import load_config

    declared = load_config(tmp_path / "server" / "session.toml").extractor
    assert meta.session == session_id and meta.class_names == CLASSES
    assert meta.extractor.to_dict() == declared
    if backend == "BFV":  # exact decryption: nothing flooded, no ridge
        assert report["flood_sigma"] == 0.0 and report["flood_ridge"] == 0.0
    if backend == "split":  # README's hospital applies the model to its images (`secure-afl predict`)
        rows = (tmp_path / "hosp-a" / "predictions.csv").read_text().splitlines()
        assert rows[0] == "index,file,label,predicted,score" and len(rows) == 1 + 6
        assert all(r.split(",")[3] in CLASSES for r in rows[1:])
    assert len(list((tmp_path / "hosp-a" / "receipts").glob("*.json"))) == 1
    _holds_only_its_own_bundle(tmp_path)
    print(f"\n{backend}: documented session took {timing['seconds']:.1f} s")
