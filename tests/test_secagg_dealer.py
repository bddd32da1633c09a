"""An inconsistent secagg dealer: named with a transferable proof, the round refused before any unmask, the
retry completed without it; a consistent dealer is never named; a forged accusation proves nothing.

The e2e tests run the real server process (mTLS, SQLite, audit log), the hospitals' real run loops
(``HospitalClient.submit`` -> ``SecAggParticipant`` -> ``SecAggClient``) and the key holder's finalize.
The cheating dealer is a real hospital whose Shamir dealing is replaced, in its own thread only, by one
that moves one holder's share off the polynomial: every share still matches the commitment the dealer
signs, which is all the dealer controls.
"""

from __future__ import annotations

import base64
import json
import threading
from dataclasses import replace

import numpy as np
import pytest
from support.secagg_adversary import MaliciousServer, hospital_data

import secure_afl.secagg.client as secagg_client_module
from secure_afl import pki
from secure_afl.analytic import centralised_weights
from secure_afl.exceptions import InvalidContribution, MalformedPayload, StageError
from secure_afl.hazmat.shamir import PRIME, Share, deal, evaluate, random_polynomial
from secure_afl.protocol import SECAGG_COMPLAINT
from secure_afl.secagg import DealerComplaint, DealRecord, MaskedInputRequest, SecAggClient, decode_message
from secure_afl.secagg.masking import deal_challenge, share_commitment

CHEATER = "cheater-h1"


def _cheating_deal(victim_index):
    """``deal`` that, in the cheater's thread only, moves the share of the holder ``victim_index`` by one."""
    honest = secagg_client_module.deal

    def deal_(secret, threshold, n, *, indices=None):
        shares, poly = honest(secret, threshold, n, indices=indices)
        if threading.current_thread().name == CHEATER:
            shares = [Share(s.index, (s.value + 1) % PRIME, s.threshold, s.length) if s.index == victim_index else s
                      for s in shares]
        return shares, poly

    return deal_


def _run(c, data, names, *, timeout=90):
    results = {}

    def go(h):
        cl = c.hospital(h)
        try:
            results[h] = cl.submit(c.stats(*data[h]), timeout=timeout)
        except Exception as e:  # each hospital's verdict is what the test measures
            results[h] = e
        finally:
            cl.close()

    threads = [threading.Thread(target=go, args=(h,), name=CHEATER if h == "h1" else f"hospital-{h}", daemon=True)
               for h in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 60)
    return results


def _audit(c) -> list[dict]:
    return [json.loads(line) for line in c.audit_path().read_text().splitlines()]


def _finalize_exact(c, data, survivors):
    conn = c.connect_keyholder()
    try:
        res = c.keyholder.finalize(conn, min_clients=2)
    finally:
        conn.close()
    assert res.report["participants"] == survivors
    X = np.concatenate([data[h][0] for h in survivors])
    y = np.concatenate([data[h][1] for h in survivors])
    W = centralised_weights(X, y, c.classes)
    assert np.linalg.norm(res.W - W) / np.linalg.norm(W) <= 1e-9


@pytest.mark.e2e
@pytest.mark.security
def test_inconsistent_dealer_is_named_refused_before_unmask_and_the_retry_completes_without_it(consortium,
                                                                                               monkeypatch):
    # Prepare: 4 hospitals, t = 2 (quorum 3); h1 deals h4 a b-share off its polynomial (matching the
    # commitment h1 signs)
    names = ("h1", "h2", "h3", "h4")
    c = consortium(backend="secagg", hospitals=names, min_clients=2,
                   secagg={"threshold": 2, "stage_timeout_s": 5.0}).start()
    data = {h: c.data(h, n=30) for h in names}
    monkeypatch.setattr(secagg_client_module, "deal", _cheating_deal(victim_index=4))

    # Execute
    results = _run(c, data, names)

    # Assert: h2, h3, h4 got receipts (round 2); h1 was left out of round 2
    assert all(isinstance(results[h], dict) for h in ("h2", "h3", "h4")), results
    # (the server left it out of round 2's setup, so it is told it never joined that round)
    assert isinstance(results["h1"], StageError) and "round 2" in str(results["h1"]), results
    log = _audit(c)
    # the dealer is named, by the holder it cheated, with evidence that anyone holding h1's key can re-check
    named = [r for r in log if r["event"] == "secagg_inconsistent_dealer"]
    assert [(r["details"]["dealer"], r["details"]["holder"], r["details"]["round"]) for r in named] == [
        ("h1", "h4", 1)]
    evidence = decode_message(base64.b64decode(named[0]["details"]["evidence"]))
    h1_pub = pki.load_enrolments(c.pki_dir, role="hospital")["h1"].public_key()
    h2_pub = pki.load_enrolments(c.pki_dir, role="hospital")["h2"].public_key()
    conn = c.connect_keyholder()
    info = conn.info()
    conn.close()
    digest = info["params_digest"]
    assert evidence.proves(h1_pub, digest, 2) and not evidence.proves(h2_pub, digest, 2)
    # round 1 was refused at the masked input, before any unmask request (nothing revealed), naming the reason
    aborts = [r for r in log if r["event"] == "secagg_stage_closed" and r["outcome"] == "refused"]
    assert [(a["details"]["round"], a["details"]["stage"], a["reason"], a["details"]["retry"]) for a in aborts] == [
        (1, "masked_input", "inconsistent_dealer", True)]
    assert not any(r["event"] in ("secagg_consistency", "secagg_unmask") and r["details"].get("round") == 1
                   for r in log)
    opened = [r["details"] for r in log if r["event"] == "secagg_round_opened"]
    assert [o["round"] for o in opened] == [1, 2] and opened[1]["excluded"] == ["h1"]
    # round 2 completed without h1 and released exactly the others' statistics
    assert info["secagg"]["round"] == 2 and info["secagg"]["stage"] == "done"
    _finalize_exact(c, data, ["h2", "h3", "h4"])


@pytest.mark.e2e
@pytest.mark.security
def test_consistent_dealers_are_never_named_and_a_forged_complaint_is_refused(consortium):
    # Prepare: 3 honest hospitals, t = 2; h3 pauses before its masked input and, with the genuine signed
    # deal record of h1 it was relayed, accuses h1 with shares of its own making
    names = ("h1", "h2", "h3")
    c = consortium(backend="secagg", hospitals=names, min_clients=2,
                   secagg={"threshold": 2, "stage_timeout_s": 30.0}).start()
    data = {h: c.data(h, n=30) for h in names}
    from clients.secagg_client import SecAggParticipant

    site = c.hospital("h3")
    part = SecAggParticipant(site, site.fetch_params(), c.stats(*data["h3"]))
    honest = {}
    threads = [threading.Thread(target=lambda h=h: honest.update({h: _run(c, data, (h,))[h]}), daemon=True)
               for h in ("h1", "h2")]
    for t in threads:
        t.start()
    assert part.run(pause_before="masked_input", timeout=60, poll=0.05) is None
    r = site.conn.request("GET", site.conn.path("/secagg/request")).json()
    req = decode_message(base64.b64decode(r["request"]))
    assert isinstance(req, MaskedInputRequest)
    record = next(d for d in req.deals if d.dealer == 1)
    fake = [Share(3, v, 2, 32).to_bytes() for v in (1, 2, 3)]
    forged = DealerComplaint(record.session_id, 3, record, *fake, round=record.round)

    # Execute
    with pytest.raises(InvalidContribution):
        site.conn.request("POST", site.conn.path("/secagg/complaint"), body=forged.to_bytes())
    receipt = part.run(timeout=60, poll=0.05)
    for t in threads:
        t.join(120)
    site.close()

    # Assert: the complaint was refused and changed nothing; nobody was named; round 1 completed with all three
    log = _audit(c)
    assert isinstance(receipt, dict) and all(isinstance(v, dict) for v in honest.values()), honest
    assert not [x for x in log if x["event"] == "secagg_inconsistent_dealer"]
    refused = [x for x in log if x["event"] == "secagg_complaint" and x["outcome"] == "refused"]
    assert [(x["actor"], x["reason"]) for x in refused] == [("h3", "invalid_contribution")]
    assert not [x for x in log if x["event"] == "secagg_stage_closed" and x["outcome"] == "refused"]
    _finalize_exact(c, data, list(names))


# -- the proof itself: what anyone holding the dealer's enrolled key can check ----------------------------

def _dealing(key, *, off_by: int = 0, t: int = 3, holders=(1, 2, 3, 4, 5), sid="s", digest="d" * 64, r=1):
    """A dealer's signed record and every holder's (b, s, r) share bytes; ``off_by`` moves holder 5's b-share."""
    import secrets

    dealer = holders[0]
    b_sh, f_b = deal(secrets.token_bytes(32), t, len(holders), indices=holders)
    s_sh, f_s = deal(secrets.token_bytes(32), t, len(holders), indices=holders)
    f_r = random_polynomial(t)
    r_sh = [Share(v, evaluate(f_r, v), t, 32) for v in holders]
    b_sh = [Share(s.index, (s.value + off_by) % PRIME, t, 32) if s.index == holders[-1] else s for s in b_sh]
    shares = {v: tuple(x.to_bytes() for x in trio) for v, *trio in zip(holders, b_sh, s_sh, r_sh)}
    commits = tuple((v, *(share_commitment(sid, digest, k, dealer, v, raw, round=r) for k, raw in zip("bsr", shares[v])))
                    for v in holders)
    c1, c2 = deal_challenge(sid, digest, dealer, commits, round=r)
    check = tuple((a + c1 * b + c2 * s) % PRIME for a, b, s in zip(f_r, f_b, f_s))
    return DealRecord(sid, r, digest, dealer, commits, check).signed(key), shares


@pytest.mark.security
def test_a_complaint_proves_exactly_an_inconsistent_signed_dealing():
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    pub = key.public_key()
    bad, bad_shares = _dealing(key, off_by=1)
    good, good_shares = _dealing(key)
    complaint = lambda rec, sh, holder=5: DealerComplaint("s", holder, rec, *sh[holder], round=1)  # noqa: E731

    # the holder of the moved share proves it; the others' shares pass the check, so they prove nothing
    assert complaint(bad, bad_shares).proves(pub, "d" * 64, 3)
    assert not any(complaint(bad, bad_shares, h).proves(pub, "d" * 64, 3) for h in (2, 3, 4))
    # a consistent dealer is never named, by any holder
    assert not any(complaint(good, good_shares, h).proves(pub, "d" * 64, 3) for h in (2, 3, 4, 5))
    # forged: shares that do not match the signed commitments, a record the dealer did not sign, or another
    # session's digest
    moved = list(good_shares[5])
    moved[0] = Share(5, (Share.from_bytes(moved[0]).value + 1) % PRIME, 3, 32).to_bytes()
    assert not DealerComplaint("s", 5, good, *moved, round=1).proves(pub, "d" * 64, 3)
    assert not complaint(bad, bad_shares).proves(other.public_key(), "d" * 64, 3)
    resigned, _ = _dealing(other, off_by=1)
    assert not complaint(resigned, bad_shares).proves(pub, "d" * 64, 3)
    assert not complaint(bad, bad_shares).proves(pub, "e" * 64, 3)


# -- through the hospitals' run loop against a malicious server (tests/support/secagg_adversary.py) -------

class _TamperingServer(MaliciousServer):
    """Relays h1's deal record to h2 with its check polynomial changed; keeps every complaint it gets."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.complaints = []

    def _deviate(self, req):
        req = super()._deviate(req)
        if isinstance(req, MaskedInputRequest) and req.client_id == 2:
            deals = tuple(replace(d, check=((d.check[0] + 1) % PRIME,) + d.check[1:]) if d.dealer == 1 else d
                          for d in req.deals)
            req = replace(req, deals=deals)
        return req

    def handle(self, name, method, path, body):
        if path.endswith("/" + SECAGG_COMPLAINT):
            self.complaints.append((name, body))
            return {"accepted": True}
        return super().handle(name, method, path, body)


@pytest.mark.security
def test_a_check_polynomial_changed_by_the_server_draws_no_complaint_and_reveals_no_share(tmp_path):
    # Prepare: n = 4, t = 2, all honest; the server changes h1's signed check polynomial before relaying it
    # to h2, hoping h2 complains and so reveals both its b- and its s-share of h1
    adv = _TamperingServer(tmp_path, 4, threshold=2)

    # Execute
    results = adv.run(hospital_data(adv.names), timeout=5)

    # Assert: h2 refused the record as not signed by h1, and sent nothing
    assert isinstance(results["h2"], InvalidContribution) and "client 1" in str(results["h2"]), results
    assert not adv.complaints


@pytest.mark.security
def test_a_deal_record_at_odds_with_its_shares_is_refused_before_it_is_relayed(tmp_path):
    # Prepare: real hospitals' state machines up to their share-keys responses; h1's response then claims
    # another commitment for its own share than its signed record
    from secure_afl.packing import Layout
    from secure_afl.params import Bounds
    from secure_afl.secagg import SecAggServerRound, identities, secagg_session_params

    params = secagg_session_params("odd", Layout(3, 2), 1.0, Bounds(4.0, 100, 4), n_parties=4, threshold=2)
    keys, pubs = identities(4)
    server = SecAggServerRound(params, identity_keys=pubs)
    clients = {i: SecAggClient(params, i, keys[i], pubs) for i in keys}
    for _ in ("setup", "advertise_keys"):
        for i, cl in clients.items():
            server.receive(cl.handle(server.request(i)))
        server.close_stage()
    responses = {i: cl.handle(server.request(i)) for i, cl in clients.items()}
    record = responses[1].deal
    odd = [replace(responses[1], own_commit_b=bytes(32)),  # commitments other than its record's
           replace(responses[1], deal=None),
           replace(responses[1], deal=replace(record, round=2).signed(keys[1])),  # then no complaint would prove
           replace(responses[1], deal=replace(record, check=record.check[:1]).signed(keys[1]))]

    # Execute / Assert: refused, and nothing of h1's dealing is kept for relaying
    for response in odd:
        with pytest.raises(MalformedPayload):
            server.receive(response)
    assert not server.has_responded(1)
    for i in (2, 3, 4):
        server.receive(responses[i])
    server.close_stage()
    assert all(es.sender != 1 for i in (2, 3, 4) for es in server.request(i).shares)


@pytest.mark.e2e
@pytest.mark.security
def test_a_dealer_whose_off_polynomial_share_went_to_a_silent_colluder_is_named_at_unmask(consortium, monkeypatch):
    # Prepare: 4 hospitals, t = 2; h1 deals h4 a b-share off its polynomial and h4, colluding, skips its check
    # and keeps quiet; at unmask 4 > t shares of h1's self-mask seed come back
    names = ("h1", "h2", "h3", "h4")
    c = consortium(backend="secagg", hospitals=names, min_clients=2,
                   secagg={"threshold": 2, "stage_timeout_s": 5.0}).start()
    data = {h: c.data(h, n=30) for h in names}
    monkeypatch.setattr(secagg_client_module, "deal", _cheating_deal(victim_index=4))
    honest_check = secagg_client_module.on_check_polynomial
    monkeypatch.setattr(secagg_client_module, "on_check_polynomial",
                        lambda *a: threading.current_thread().name == "hospital-h4" or honest_check(*a))

    # Execute
    results = _run(c, data, names)

    # Assert: the round aborted at unmask naming h1; unmask requests had gone out, so no retry
    log = _audit(c)
    aborts = [r for r in log if r["event"] == "secagg_stage_closed" and r["outcome"] == "refused"]
    assert [(a["details"]["round"], a["details"]["stage"], a["reason"], a["details"].get("dealer"),
             a["details"]["retry"]) for a in aborts] == [(1, "unmask", "inconsistent_dealer", "h1", False)]
    assert not [r for r in log if r["event"] == "secagg_inconsistent_dealer"]  # nobody complained
    assert all(isinstance(v, Exception) for v in results.values()), results
