"""secagg round lifecycle through the service: abort, retry under the same session, stale rounds, max_rounds.

Real server processes on 127.0.0.1 (mTLS, SQLite), real hospital run loops
(:func:`secure_afl.clients.secagg_client.run_secagg` via ``HospitalClient.submit``)
and the real key holder's finalize.
"""

from __future__ import annotations

import json
import sqlite3
import time

import numpy as np
import pytest

from secure_afl.analytic import centralised_weights
from secure_afl.exceptions import InsufficientShares, StaleRound
from secure_afl.secagg import decode_message
from support import plain_reference
from support.sessions import run_secagg_plan


pytestmark = pytest.mark.e2e




def _audit(c) -> list[dict]:
    return [json.loads(line) for line in c.audit_path().read_text().splitlines()]


def _wait_for(pred, what: str, limit: float = 60.0):
    """Bounded poll of the server's public state (no fixed sleep)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _stored(c, stage_key: str) -> dict[str, bytes]:
    db = sqlite3.connect(f"file:{c.root / 'server' / c.session_id / 'state.sqlite3'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT party, data FROM messages WHERE stage=?", (stage_key,)).fetchall()
    finally:
        db.close()
    return {p: bytes(d) for p, d in rows}


def test_aborted_round_is_retried_with_fresh_keys_and_round_2_is_exact(consortium):
    # Prepare: 4 hospitals, t = 2 (quorum 3); h3 and h4 crash before the masked input, so round 1 has two
    # masked inputs and aborts; h3 runs `client submit` again at once, h4 never comes back
    names = ("h1", "h2", "h3", "h4")
    c = consortium(backend="secagg", hospitals=names, min_clients=2,
                   secagg={"threshold": 2, "stage_timeout_s": 3.0}).start()
    data = {h: c.data(h, n=30) for h in names}
    plan = {"h1": [None], "h2": [None], "h3": ["masked_input", None], "h4": ["masked_input"]}
    # Execute
    results, errors = run_secagg_plan(c, data, plan)
    conn = c.connect_keyholder()
    info = conn.info()
    res = c.keyholder.finalize(conn, min_clients=2)
    conn.close()
    # Assert: round 2 released exactly the plaintext statistics of its survivors h1, h2, h3
    assert not errors, errors
    survivors = ["h1", "h2", "h3"]
    assert info["secagg"]["round"] == 2 and info["secagg"]["stage"] == "done"
    assert res.report["participants"] == survivors
    X = np.concatenate([data[h][0] for h in survivors])
    y = np.concatenate([data[h][1] for h in survivors])
    W_joint = centralised_weights(X, y, c.classes)
    assert np.linalg.norm(res.W - W_joint) / np.linalg.norm(W_joint) <= 1e-9
    ref = plain_reference(c, data, survivors)
    assert np.array_equal(np.round(res.stats.class_counts), ref.class_counts)
    assert np.allclose(res.stats.cross, ref.cross, rtol=1e-12, atol=1e-9)
    # the log tells the story with true counts: round 1 aborted at the masked input with 2 of 4, round 2 opened
    log = _audit(c)
    aborts = [r["details"] for r in log if r["event"] == "secagg_stage_closed" and r["outcome"] == "refused"]
    assert [(a["round"], a["stage"], a["answered"], a["expected"], a["dropped"], a["retry"]) for a in aborts] == [
        (1, "masked_input", 2, 4, ["h3", "h4"], True)]
    opened = [r["details"] for r in log if r["event"] == "secagg_round_opened"]
    assert [o["round"] for o in opened] == [1, 2] and opened[1]["retired_masked_inputs"] == 2
    # fresh keys: no advertisement of round 2 repeats a key of round 1
    keys = {r: {decode_message(d).enc_public_key for d in _stored(c, k).values()}
            for r, k in ((1, "advertise_keys"), (2, "advertise_keys@2"))}
    assert len(keys[1]) == 4 and len(keys[2]) == 3 and not keys[1] & keys[2]
    # the receipts the hospitals keep are those of round 2's uploads
    uploads = [r for r in log if r["event"] == "upload" and r["outcome"] == "accepted"]
    round2 = {r["actor"]: r["details"]["payload_sha256"] for r in uploads[-3:]}
    assert len(uploads) == 5 and {results[h]["payload_sha256"] for h in survivors} == set(round2.values())


def test_round_1_message_replayed_into_round_2_is_refused_audited_not_stored(consortium):
    # Prepare: 3 hospitals, t = 2 (quorum 3); all three crash before the masked input: round 1 aborts
    names = ("h1", "h2", "h3")
    c = consortium(backend="secagg", hospitals=names, min_clients=2,
                   secagg={"threshold": 2, "stage_timeout_s": 2.0}).start()
    data = {h: c.data(h, n=25) for h in names}
    _, errors = run_secagg_plan(c, data, {h: ["masked_input"] for h in names})
    assert not errors, errors
    kh = c.connect_keyholder()
    _wait_for(lambda: kh.info()["secagg"]["stage"] == "aborted", "round 1 to abort")
    old_ack = _stored(c, "setup")["h1"]
    assert decode_message(old_ack).round == 1
    h1 = c.hospital("h1")
    conn = h1.conn
    # Execute: h1's first poll opens round 2; then its round-1 setup answer is sent again
    first = conn.request("GET", conn.path("/secagg/request")).json()
    with pytest.raises(StaleRound) as ei:
        conn.request("POST", conn.path("/secagg/setup"), body=old_ack)
    again = conn.request("GET", conn.path("/secagg/request")).json()
    h1.close()
    # Assert: refused with its reason, audited, nothing stored: h1 is still asked for its round-2 answer
    assert first["round"] == 2 and first["stage"] == "setup" and "request" in first
    assert ei.value.reason == "stale_round" and ei.value.status_code == 409
    refusals = [r for r in _audit(c) if r["event"] == "secagg_setup" and r["outcome"] == "refused"]
    assert [(r["actor"], r["reason"]) for r in refusals] == [("h1", "stale_round")]
    assert "h1" not in _stored(c, "setup@2") and "request" in again
    # ... and round 2 still completes exactly with all three (fresh keys, same session)
    results, errors = run_secagg_plan(c, data, {h: [None] for h in names})
    res = c.keyholder.finalize(kh, min_clients=2)
    kh.close()
    assert not errors, errors
    assert res.report["participants"] == list(names)
    ref = plain_reference(c, data, names)
    assert np.array_equal(np.round(res.stats.class_counts), ref.class_counts)
    assert np.allclose(res.stats.cross, ref.cross, rtol=1e-12, atol=1e-9)


def test_session_with_max_rounds_1_stays_aborted(consortium):
    # Prepare: as the retry test, but the session allows one round
    names = ("h1", "h2", "h3", "h4")
    c = consortium(backend="secagg", hospitals=names, min_clients=2,
                   secagg={"threshold": 2, "stage_timeout_s": 2.0, "max_rounds": 1}).start()
    data = {h: c.data(h, n=20) for h in names}
    # Execute
    results, errors = run_secagg_plan(c, data, {"h1": [None], "h2": [None], "h3": ["masked_input", None],
                                      "h4": ["masked_input"]}, timeout=40)
    kh = c.connect_keyholder()
    info = kh.info()
    kh.close()
    # Assert: no second round; the hospitals still running learn that the session is over
    assert info["secagg"] == {**info["secagg"], "round": 1, "stage": "aborted", "max_rounds": 1}
    assert {h: type(e) for h, e in errors.items()} == {h: InsufficientShares for h in ("h1", "h2", "h3")}
    log = _audit(c)
    assert [r["details"]["round"] for r in log if r["event"] == "secagg_round_opened"] == [1]
    aborts = [r["details"] for r in log if r["event"] == "secagg_stage_closed" and r["outcome"] == "refused"]
    assert [(a["round"], a["retry"]) for a in aborts] == [(1, False)]



def test_round_aborted_after_unmask_requests_went_out_is_not_retried(consortium):
    # Prepare: 3 hospitals, t = 2 (quorum 3): all sign the survivor set, so unmask requests go out; h2 and h3
    # then vanish before revealing their shares, leaving every secret with one share: round 1 aborts
    names = ("h1", "h2", "h3")
    c = consortium(backend="secagg", hospitals=names, min_clients=2,
                   secagg={"threshold": 2, "stage_timeout_s": 2.0, "max_rounds": 3}).start()
    data = {h: c.data(h, n=20) for h in names}
    # Execute
    _, errors = run_secagg_plan(c, data, {"h1": [None], "h2": ["unmask_response"], "h3": ["unmask_response"]}, timeout=40)
    kh = c.connect_keyholder()
    info = kh.info()
    kh.close()
    # Assert: the server may hold shares of round 1, so no round 2 is opened although rounds remain
    assert (info["secagg"]["round"], info["secagg"]["stage"]) == (1, "aborted")
    assert {h: type(e) for h, e in errors.items()} == {"h1": InsufficientShares}
    log = _audit(c)
    aborts = [r["details"] for r in log if r["event"] == "secagg_stage_closed" and r["outcome"] == "refused"]
    assert [(a["round"], a["stage"], a["answered"], a["expected"], a["retry"]) for a in aborts] == [
        (1, "unmask", 1, 3, False)]
    assert [r["details"]["round"] for r in log if r["event"] == "secagg_round_opened"] == [1]


def test_hospital_that_signed_a_survivor_set_takes_part_in_no_later_round(consortium):
    # Prepare: 3 hospitals, t = 2 (quorum 3); h3 vanishes before the consistency check, h1 and h2 sign the
    # survivor set, the quorum is never reached: round 1 aborts before any unmask request, so round 2 opens
    names = ("h1", "h2", "h3")
    c = consortium(backend="secagg", hospitals=names, min_clients=2,
                   secagg={"threshold": 2, "stage_timeout_s": 2.0, "max_rounds": 2}).start()
    data = {h: c.data(h, n=20) for h in names}
    # Execute: h3 comes back for round 2
    _, errors = run_secagg_plan(c, data, {"h1": [None], "h2": [None], "h3": ["unmask", None]}, timeout=40)
    # Assert: h1 and h2 refuse round 2 (a server that secretly completed round 1 could difference the sums)
    assert {h: type(e).__name__ for h, e in errors.items()} == {
        "h1": "InvalidContribution", "h2": "InvalidContribution", "h3": "InsufficientShares"}
    assert "signed the survivor set of round 1" in str(errors["h1"])
    log = _audit(c)
    aborts = [r["details"] for r in log if r["event"] == "secagg_stage_closed" and r["outcome"] == "refused"]
    assert [(a["round"], a["stage"], a["retry"]) for a in aborts][0] == (1, "unmask", True)
    opened = [r["seq"] for r in log if r["event"] == "secagg_round_opened" and r["details"]["round"] == 2]
    later = [r["actor"] for r in log if opened and r["seq"] > opened[0] and r["outcome"] == "accepted"
             and r["event"] in ("secagg_setup", "secagg_advertise_keys", "upload")]
    assert opened and set(later) <= {"h3"}
