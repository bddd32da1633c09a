"""A secagg hospital signs at most one survivor set per session, whatever process, directory or transport it runs.

Two unmasked sums of one session over different survivor sets differ by the
hospitals left out of one. The hospital's record of the set it signed
(:mod:`secure_afl.secagg.record`) lives in its own PKI bundle directory, so a
process restarted from another working directory finds it; the check, the
signature and the durable write happen under an exclusive lock, and the check
is made again just before signing, so that two processes of one hospital that
both started before either signed cannot both sign; a record that cannot be
read refuses. Each test drives the real run loop the way the attacker would:

* the native ``client submit`` command against a real server process, the
  server wiped and re-run after round 1 (what a server does to obtain a second
  sum) and the hospitals restarted from other directories;
* the native participant loops against the adversarial server of
  :mod:`support.secagg_adversary`, which keeps each hospital's two processes
  in two rounds of the same session;
* the Flower ClientApp's message handlers, driven by the real ServerApp round
  loop (:func:`secure_afl.flower.server_app._secagg_round`) as in
  ``test_flower_secagg_rerun.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from support import Consortium
from support.secagg_adversary import MaliciousServer, hospital_data

from secure_afl import pki
from secure_afl.exceptions import EXIT_INPUT, EXIT_SECURITY, InvalidContribution, UnreadableRecord
from secure_afl.secagg import SecAggClient, Stage
from secure_afl.secagg.record import RECORD_DIR, SurvivorRecord, default_directory

pytestmark = pytest.mark.security

HOSPITALS = ("h1", "h2", "h3", "h4")


def _record(pki_dir, hospital: str, session_id: str) -> SurvivorRecord:
    return SurvivorRecord(default_directory(pki.load_party(pki_dir, "hospital", hospital)), session_id, hospital)


# -- the native command, a real server, restarted hospitals ------------------------------------------------------
def _submit(c: Consortium, h: str, data_file, cwd) -> subprocess.Popen:
    """``secure-afl client submit`` as an operator runs it from ``cwd``: no record directory named, the
    default relative receipts directory."""
    os.makedirs(cwd, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "secure_afl.cli", "client", "submit", "--server", c.url,
                             "--session", c.session_id, "--pki", str(c.pki_dir), "--name", h,
                             "--embeddings", str(data_file), "--no-progress", "--wait-server", "10"],
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(procs: dict) -> dict:
    out = {}
    for h, p in procs.items():
        stdout, stderr = p.communicate(timeout=240)
        out[h] = (p.returncode, stdout, stderr)
    return out


@pytest.fixture
def secagg_consortium(consortium, tmp_path):
    c = consortium(backend="secagg", hospitals=HOSPITALS, min_clients=2,
                   secagg={"threshold": 2, "stage_timeout_s": 5.0})
    data = {}
    for h in HOSPITALS:
        data[h] = c.root / f"{h}.npz"
        np.savez(data[h], **dict(zip("Xy", c.data(h, n=12))))
    return c, data


@pytest.mark.e2e
def test_a_hospital_restarted_from_another_directory_refuses_the_rerun_of_the_session(secagg_consortium, tmp_path):
    # Prepare: round 1 completes over the 4 hospitals, each `client submit` started in a directory of its own
    c, data = secagg_consortium
    c.start()
    first = _finish({h: _submit(c, h, data[h], tmp_path / "run-1" / h) for h in HOSPITALS})
    assert all(code == 0 for code, _, _ in first.values()), first
    # the server runs the session again from nothing (its state wiped: a fresh round 1), without the victim
    c.stop()
    shutil.rmtree(c.root / "server")
    c.start()
    # Execute: h2..h4 restarted, each from another working directory than the one it signed from
    second = _finish({h: _submit(c, h, data[h], tmp_path / "run-2" / h) for h in HOSPITALS[1:]})
    # Assert: every one refuses before it sends anything, in one line naming the record in its PKI bundle
    for h, (code, _, stderr) in second.items():
        lines = stderr.strip().splitlines()
        assert code == EXIT_SECURITY and len(lines) == 1, (h, code, stderr)
        assert "signed a survivor set" in lines[0] and f"hospital-{h}/{RECORD_DIR}" in lines[0], lines[0]
    with c.connect_keyholder() as conn:
        info = conn.info()
    assert info["contributions"] == 0, info


@pytest.mark.e2e
def test_a_corrupt_record_refuses_in_one_line_before_anything_is_sent(secagg_consortium, tmp_path):
    # Prepare: h1's record of this session exists but is cut short (a crash of the disk, an edit)
    c, data = secagg_consortium
    rec = _record(c.pki_dir, "h1", c.session_id)
    rec.path.parent.mkdir(parents=True)
    rec.path.write_text('{"session_id": "' + c.session_id + '", "hosp')
    c.start()
    # Execute
    code, _, stderr = _finish({"h1": _submit(c, "h1", data["h1"], tmp_path / "h1")})["h1"]
    # Assert: one line, the documented exit code, nothing reached the server
    lines = stderr.strip().splitlines()
    assert code == EXIT_INPUT and len(lines) == 1, stderr
    assert lines[0].startswith("secure-afl: error [unreadable_record]: ") and str(rec.path) in lines[0]
    with c.connect_keyholder() as conn:
        info = conn.info()
    assert info["contributions"] == 0, info


# -- the native participant loop: two processes of one hospital ---------------------------------------------------
@pytest.fixture
def two_rounds(tmp_path):
    """The adversarial server holding two rounds of one session apart, each hospital's second process in the
    second; both processes of every hospital have answered up to the survivor set, nothing is signed yet."""
    adv = MaliciousServer(tmp_path, 4, threshold=2)
    twin = MaliciousServer(tmp_path, 4, threshold=2, twin=adv)
    data = hospital_data(adv.names)
    paused = twin.run(data, pause_before=Stage.UNMASK)
    assert paused == {h: None for h in adv.names}, paused
    return adv, twin, data


def test_the_second_process_of_a_hospital_signs_no_second_survivor_set(two_rounds):
    adv, twin, data = two_rounds
    # Execute: the first processes complete round 1; then the second ones reach their signature
    first = adv.run(data)
    second = twin.run(data, resume=True)
    # Assert: the first round released (each hospital's receipt); no second process signed, each naming the
    # record its first process wrote; the server holds one survivor-set signature per hospital
    assert all(isinstance(r, dict) for r in first.values()), first
    assert all(isinstance(e, InvalidContribution) and "signed a survivor set" in str(e)
               for e in second.values()), second
    assert twin.statements == {} and twin.unmask_responses == {}
    assert sorted(adv.statements) == [1, 2, 3, 4]


def test_a_process_that_reaches_the_signature_while_another_signs_is_refused(two_rounds, monkeypatch):
    # Prepare: h1's first process, between its check and its durable write (inside its signature), lets its
    # second process take the signing step (the order two racing processes may take)
    adv, twin, data = two_rounds
    second, outcome = twin.participants["h1"], {}
    original = SecAggClient.sign_survivors

    def sign_with_the_other_process_inside(self, survivors):
        if self is adv.participants["h1"].client and not outcome:
            try:
                second._sign_survivors(list(twin.round.survivors_))
                outcome["second"] = "signed"
            except InvalidContribution as e:
                outcome["second"] = e
        return original(self, survivors)

    monkeypatch.setattr(SecAggClient, "sign_survivors", sign_with_the_other_process_inside)
    # Execute
    first = adv.run(data)
    # Assert: the first process signed and completed; the second was refused at the lock, signed nothing
    assert all(isinstance(r, dict) for r in first.values()), first
    assert isinstance(outcome["second"], InvalidContribution) and "locked" in str(outcome["second"])
    assert 1 not in twin.statements and 1 in adv.statements

