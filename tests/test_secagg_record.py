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
import threading

import numpy as np
import pytest
from support import Consortium
from support.secagg_adversary import MaliciousServer, hospital_data

from secure_afl import pki
from secure_afl.exceptions import EXIT_INPUT, EXIT_SECURITY, InvalidContribution, UnreadableRecord
from secure_afl.protocol import SECAGG_CONSISTENCY
from secure_afl.secagg import SecAggClient, Stage
from secure_afl.secagg.record import RECORD_DIR, SurvivorRecord, default_directory
from secure_afl.server import aggregator

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
        view = conn.status()
    assert view["uploaded"] == [], view


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
        view = conn.status()
    assert view["uploaded"] == [], view


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



# -- the Flower ClientApp: two SuperNodes of one hospital, two ServerApp runs -------------------------------------
def _flower_consortium(tmp_path):
    from flwr.supercore.task_identity import TaskIdentity

    # a stage clock long enough for one run to wait at the survivor set while the other finishes
    c = Consortium(tmp_path, backend="secagg", hospitals=HOSPITALS, min_clients=2,
                   secagg={"threshold": 2, "stage_timeout_s": 10.0})
    data = {}
    for h in HOSPITALS:
        data[h] = c.root / f"{h}.npz"
        np.savez(data[h], **dict(zip("Xy", c.data(h, n=12))))
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 0, 0
    return c, data


class _TwoFlowerRuns:
    """Two ServerApp runs of the session's SecAgg round at once (two native servers of the signed session, each
    hospital's two SuperNodes with their own node contexts), each in its own thread; the grids' holds order
    them. ``first_done`` is set once run 1 has ended; ``first_thread`` runs it."""

    def __init__(self):
        self.first_done = threading.Event()
        self.first_thread: threading.Thread | None = None

    def run(self, c, data, hold_first, hold_second) -> list:
        """(grid, server, exception or None) per run, after both ended."""
        from support.flower import InProcessGrid, node_contexts

        from secure_afl.flower import server_app
        from secure_afl.server.config import load_config
        from secure_afl.server.aggregator import open_server

        nodes = {h: i + 1 for i, h in enumerate(HOSPITALS)}
        runs = []
        for k, hold in ((1, hold_first), (2, hold_second)):
            cfg = load_config(c.config)
            cfg.data_dir = c.root / f"server-{k}"
            runs.append([InProcessGrid(node_contexts(c, 6 + k, data, HOSPITALS), hold=hold), open_server(cfg), None])

        def go(run, done):
            try:
                server_app._secagg_round(run[0], run[1], nodes, reply_timeout_s=60)
            except Exception as e:  # the verdict of each run is what the test measures
                run[2] = e
            finally:
                done.set()

        threads = [threading.Thread(target=go, args=(r, done), daemon=True)
                   for r, done in zip(runs, (self.first_done, threading.Event()))]
        self.first_thread = threads[0]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(240)
        finally:
            for r in runs:
                aggregator.shutdown(r[1])
        return runs


def _stage(m) -> str | None:
    from secure_afl.flower.records import SECAGG, unpack_str

    return unpack_str(m.content, "stage") if m.metadata.message_type == SECAGG else None


def test_flower_the_second_supernode_of_a_hospital_signs_no_second_survivor_set(tmp_path):
    # Prepare: every hospital's SuperNode in run 1 waits at the survivor set until run 2's have all answered
    # their masked inputs (their setup passed: nothing was signed then); run 2's wait until run 1 is over
    c, data = _flower_consortium(tmp_path)
    second_at_survivors, runs = threading.Event(), _TwoFlowerRuns()

    def hold_first(m, ctx):
        if _stage(m) == SECAGG_CONSISTENCY:
            assert second_at_survivors.wait(120)

    def hold_second(m, ctx):
        if _stage(m) == SECAGG_CONSISTENCY:
            second_at_survivors.set()
            assert runs.first_done.wait(120)

    # Execute
    (g1, s1, e1), (g2, s2, e2) = runs.run(c, data, hold_first, hold_second)
    # Assert: run 1 released over the four; in run 2 every hospital answered up to its masked input and then
    # refused to sign, naming the record run 1 wrote; run 2 produced no sum
    assert e1 is None and s1.secagg.round.fixed_point_sum_ is not None, e1
    assert g1.answered.count(SECAGG_CONSISTENCY) == 4
    assert g2.answered.count(Stage.MASKED_INPUT) == 4 and SECAGG_CONSISTENCY not in g2.answered, g2.answered
    assert all("signed a survivor set" in g2.errors[(h, SECAGG_CONSISTENCY)] for h in HOSPITALS), g2.errors
    assert getattr(s2.secagg.round, "fixed_point_sum_", None) is None and e2 is not None


def test_flower_a_supernode_that_reaches_the_signature_while_another_signs_is_refused(tmp_path, monkeypatch):
    # Prepare: as above, but h1's second SuperNode gets its survivor set while its first one is inside its
    # signature (between its check and its durable write): its handler runs there, in the first one's turn
    c, data = _flower_consortium(tmp_path)
    from secure_afl.flower import client_app
    from support.flower import handle

    second_at_survivors, taken, runs = threading.Event(), threading.Event(), _TwoFlowerRuns()
    held: dict = {}

    def hold_first(m, ctx):
        if _stage(m) == SECAGG_CONSISTENCY:
            assert second_at_survivors.wait(120)

    def hold_second(m, ctx):
        if _stage(m) != SECAGG_CONSISTENCY:
            return None
        if ctx.node_config["name"] == "h1":
            held["message"], held["context"] = m, ctx
            second_at_survivors.set()
            assert taken.wait(120)
            return held["reply"]
        assert runs.first_done.wait(120)
        return None

    original = SecAggClient.sign_survivors

    def sign_with_the_other_supernode_inside(self, survivors):
        if threading.current_thread() is runs.first_thread and self.client_id == 1 and \
                "inside" not in held:
            held["inside"] = True  # the second SuperNode's own signature, if it gets that far, runs unhindered
            held["reply"] = handle(client_app.secagg, held["message"], held["context"])
            taken.set()
        return original(self, survivors)

    monkeypatch.setattr(SecAggClient, "sign_survivors", sign_with_the_other_supernode_inside)
    # Execute
    (g1, s1, e1), (g2, _, _) = runs.run(c, data, hold_first, hold_second)
    # Assert: run 1 completed with h1's signature; h1's second SuperNode was refused at the lock
    assert e1 is None and s1.secagg.round.fixed_point_sum_ is not None, e1
    assert "locked" in g2.errors.get(("h1", SECAGG_CONSISTENCY), "it signed"), (g2.errors, g2.answered)
    assert ("h1", SECAGG_CONSISTENCY) not in g1.errors


def test_flower_a_corrupt_record_refuses_the_setup(tmp_path):
    # Prepare: h1's record of the session cut short
    from support.flower import InProcessGrid, node_contexts

    from secure_afl.flower import server_app
    from secure_afl.server.config import load_config
    from secure_afl.server.aggregator import open_server

    c, data = _flower_consortium(tmp_path)
    rec = _record(c.pki_dir, "h1", c.session_id)
    rec.path.parent.mkdir(parents=True)
    rec.path.write_bytes(b"\x00\x00")
    cfg = load_config(c.config)
    cfg.data_dir = c.root / "server"
    server = open_server(cfg)
    grid = InProcessGrid(node_contexts(c, 7, data, HOSPITALS))
    # Execute: the round runs over the others (3 of 4 reach the quorum)
    try:
        server_app._secagg_round(grid, server, {h: i + 1 for i, h in enumerate(HOSPITALS)}, reply_timeout_s=60)
    finally:
        aggregator.shutdown(server)
    # Assert: h1 refused its setup in one line naming the record, and answered nothing
    why = grid.errors[("h1", Stage.SETUP)]
    assert why.startswith(f"{UnreadableRecord.__name__}: ") and str(rec.path) in why and "\n" not in why
    assert grid.answered.count(Stage.SETUP) == 3


@pytest.mark.security
def test_a_record_the_system_cannot_read_refuses_by_name_and_never_counts_as_unsigned(tmp_path):
    # Prepare: the record's path exists but reading it is an OS error (a directory in its place: what root's
    # permissions cannot stop; an unreadable disk or a loop of links fails the same way)
    rec = SurvivorRecord(tmp_path / "records", "s-os", "h1")
    rec.path.mkdir(parents=True)
    # Execute / Assert: a refusal naming the record, for the question and for the check before any part
    for ask in (rec.signed_round, lambda: rec.refuse_if_signed(1)):
        with pytest.raises(UnreadableRecord) as refused:
            ask()
        assert str(rec.path) in str(refused.value) and "takes no part" in str(refused.value)
