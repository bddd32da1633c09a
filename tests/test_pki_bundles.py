"""Per-party PKI bundles and the CA-signed roster, through `secure-afl pki bundle` and the commands that read them."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from secure_afl import pki
from secure_afl.exceptions import EXIT_KEYS, InvalidSignature, MissingEnrolment

pytestmark = pytest.mark.e2e

OWN = ["cert.pem", "enrolment.json", "identity.key", "identity.pub", "key.pem"]


def _cli(*args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SECURE_AFL_KEY_PASSPHRASE"}
    return subprocess.run([sys.executable, "-m", "secure_afl.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=180, env=env)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundles")
    d = root / "pki"
    pki.init_ca(d)
    pki.issue(d, "server", "aggregator")
    pki.issue(d, "keyholder", "keyholder")
    for h in ("hosp-a", "hosp-b"):
        pki.issue(d, "hospital", h)
    out = _cli("pki", "bundle", "--dir", d, "--out", root / "bundles")
    assert out.returncode == 0, out.stderr
    return {"pki": d, "out": root / "bundles"}


def test_each_bundle_holds_exactly_ca_roster_and_its_own_keys(bundles):
    made = sorted(p.name for p in bundles["out"].iterdir())
    assert made == ["hospital-hosp-a", "hospital-hosp-b", "keyholder-keyholder", "server-aggregator"]
    for name in made:
        b = bundles["out"] / name
        assert sorted(p.name for p in b.iterdir()) == sorted(["ca.pem", "roster.json", name])
        assert sorted(p.name for p in (b / name).iterdir()) == OWN
        for secret in ("key.pem", "identity.key"):
            assert stat.S_IMODE((b / name / secret).stat().st_mode) == 0o600
    assert not list(bundles["out"].rglob("ca.key"))


def test_roster_names_every_party_and_pins_identities(bundles):
    hosp = bundles["out"] / "hospital-hosp-a"
    roster = {(e.role, e.name) for e in pki.load_roster(hosp)}
    assert roster == {("server", "aggregator"), ("keyholder", "keyholder"), ("hospital", "hosp-a"),
                      ("hospital", "hosp-b")}
    server = pki.load_party(bundles["pki"], "server", "aggregator")
    assert pki.public_key_hex(pki.pinned_identity(hosp, "server")) == pki.public_key_hex(server.identity_pub())
    with pytest.raises(MissingEnrolment):
        pki.pinned_identity(hosp, "hospital")  # two hospitals: a name is needed
    with pytest.raises(MissingEnrolment):
        pki.pinned_identity(hosp, "hospital", "hosp-z")


def test_altered_roster_is_refused_by_the_hospital_command(bundles, tmp_path):
    # Prepare: someone swaps the server's identity key in hosp-b's roster for hosp-b's own
    import shutil

    b = tmp_path / "hospital-hosp-b"
    shutil.copytree(bundles["out"] / "hospital-hosp-b", b)
    doc = json.loads((b / "roster.json").read_text())
    mine = next(p for p in doc["roster"]["parties"] if p["name"] == "hosp-b")
    for p in doc["roster"]["parties"]:
        if p["role"] == "server":
            p["identity_pub"] = mine["identity_pub"]
    (b / "roster.json").write_text(json.dumps(doc))
    (tmp_path / "e.npz").write_bytes(b"")

    # Execute
    out = _cli("client", "submit", "--server", "https://127.0.0.1:9", "--session", "s", "--pki", b, "--name",
               "hosp-b", "--stats", tmp_path / "e.npz", "--wait-server", "0")

    # Assert
    lines = out.stderr.strip().splitlines()
    assert out.returncode == EXIT_KEYS and len(lines) == 1 and "[bad_signature]" in lines[0], out.stderr
    with pytest.raises(InvalidSignature):
        pki.load_roster(b)


@pytest.mark.security
@pytest.mark.parametrize("planted", ["sessions/s-new.json", "sessions", ".roster.json.tmp"])
def test_a_symlink_planted_in_the_bundles_is_refused_by_name_and_nothing_is_written_through_it(tmp_path, planted):
    # Prepare: bundles made once; then a session signed since (its file is copied as is), and a link planted
    # in the output tree (dangling: exists() calls it absent) pointing outside it
    d, out = tmp_path / "pki", tmp_path / "bundles"
    pki.init_ca(d)
    pki.issue(d, "server", "aggregator")
    pki.issue(d, "hospital", "hosp-a")
    assert _cli("pki", "bundle", "--dir", d, "--out", out).returncode == 0
    (d / "sessions").mkdir()
    (d / "sessions" / "s-new.json").write_text('{"a signed definition": "copied byte for byte"}\n')
    target = tmp_path / "elsewhere" / "written-through-the-link"
    link = out / "hospital-hosp-a" / planted
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(target if planted != "sessions" else target.parent, target_is_directory=planted == "sessions")
    if planted == "sessions":
        target.parent.mkdir()
    # Execute
    done = _cli("pki", "bundle", "--dir", d, "--out", out)
    # Assert: one line naming the link, the input exit code; nothing written through it, nor anywhere else
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 3 and len(lines) == 1, done.stderr
    assert "[symlink]" in lines[0] and str(link) in lines[0]
    assert not target.exists() and not (target.parent / "s-new.json").exists()
    assert not (out / "server-aggregator" / "sessions").exists()
