"""A malicious secagg server against the hospitals' own run loops (tests/support/secagg_adversary.py).

Each test runs real hospitals (real PKI and identity keys, the real
SecAggParticipant loop and SecAggClient state machine) against a server that
deviates from the protocol, and measures what the server gets: whether the
hospitals refused, and whether the victim's vector can be unmasked from the
shares collected.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.secagg_adversary import MaliciousServer, hospital_data

from secure_afl.exceptions import InsufficientShares, InvalidContribution, ParameterMismatch
from secure_afl.secagg import neighbour_graph

pytestmark = pytest.mark.security


def _split_survivor_sets(adv: MaliciousServer, victim: int) -> None:
    """Show the victim and half the others S1 = everybody, the other half S2 = everybody but the victim.

    With the colluder signing both, each set gets about (n + 1) / 2 signatures: enough for a quorum
    of max(t, n/2 + 1), never for one with 2 q > n + t - 1.
    """
    everybody = tuple(range(1, len(adv.names) + 1))
    honest = [c for c in everybody if c not in (victim, adv.colluder)]
    half = len(honest) // 2
    for c in [victim] + honest[:half]:
        adv.survivor_sets[c] = everybody
    for c in honest[half:]:
        adv.survivor_sets[c] = tuple(x for x in everybody if x != victim)


@pytest.mark.parametrize("n, t", [(5, 3), (7, 2), (9, 4)])
def test_two_survivor_sets_with_one_colluder_are_refused_and_the_victim_stays_masked(tmp_path, n, t):
    # Prepare: h1 is the victim, the last hospital colludes with the server; n = 5, t = 3 is the case an
    # earlier quorum of max(t, n/2 + 1) = 3 let through
    adv = MaliciousServer(tmp_path, n, threshold=t, colluder=n)
    victim = 1
    _split_survivor_sets(adv, victim)
    data = hospital_data(adv.names)

    # Execute
    results = adv.run(data)

    # Assert: no honest hospital answered an unmask request; the victim cannot be unmasked
    assert all(isinstance(r, (InsufficientShares, InvalidContribution)) for r in results.values()), results
    assert not adv.unmask_responses
    assert adv.try_unmask(victim) is None
    assert len(adv.masked) == n  # the attack reached the unmask stage: everybody had uploaded


def test_attack_measurement_recovers_the_victim_when_hospitals_reveal_both_shares(tmp_path):
    # Prepare: the same measurement with the hospitals' answers given to it directly (as the attack
    # would get them if the hospitals answered both sets): it must recover the victim exactly
    adv = MaliciousServer(tmp_path, 5, threshold=3, colluder=5)
    data = hospital_data(adv.names)
    adv.run(data)  # honest round

    # Execute: the colluder's own shares plus the honest b-shares and the s-shares the honest
    # hospitals would reveal for a "dropped" victim
    parts = adv.participants
    for h, p in parts.items():
        held = p.client._held
        adv.unmask_responses[(h, "b")] = type("R", (), {"self_mask_shares": {1: held[1][0].to_bytes()},
                                                        "mask_key_shares": {}})()
        adv.unmask_responses[(h, "s")] = type("R", (), {"self_mask_shares": {},
                                                        "mask_key_shares": {1: held[1][1].to_bytes()}})()
    y = adv.try_unmask(1)

    # Assert
    assert all(p.client.stage == "done" for p in parts.values())
    assert y is not None and np.array_equal(y, adv.victim_fixed_point(1))


def test_graph_seed_chosen_by_the_server_is_refused(tmp_path):
    # Prepare: SecAgg+ graph (degree 4); the server grinds a seed that seats its colluder h8 next to h1
    n = 8
    adv = MaliciousServer(tmp_path, n, threshold=3, neighbours=4, colluder=n)
    seed = next(s for s in (bytes([i]) * 32 for i in range(256)) if n in neighbour_graph(n, 4, s)[1])
    adv.graph_seed = seed

    # Execute
    results = adv.run(hospital_data(adv.names))

    # Assert: every honest hospital refused at share_keys; no share left any of them
    assert all(isinstance(r, InvalidContribution) for r in results.values()), results
    assert all(p.client.stage == "aborted" for p in adv.participants.values())
    assert set(adv.share_keys_responses) <= {n}


def test_survivor_set_smaller_than_the_quorum_is_not_signed(tmp_path):
    # Prepare: 7 hospitals, t = 3 (quorum (7 + 2) // 2 + 1 = 5); the server announces a 4-hospital set
    adv = MaliciousServer(tmp_path, 7, threshold=3, colluder=7)
    small = (1, 2, 3, 7)
    for c in range(1, 8):
        adv.survivor_sets[c] = small

    # Execute
    results = adv.run(hospital_data(adv.names))

    # Assert: nobody signed, nobody revealed a share
    assert all(isinstance(results[h], InsufficientShares) for h in ("h1", "h2", "h3")), results
    assert all(isinstance(results[h], InvalidContribution) for h in ("h4", "h5", "h6")), results  # not in it
    assert not adv.statements and not adv.unmask_responses
    assert all(p.client.stage == "aborted" for p in adv.participants.values())


def test_honest_server_round_completes_through_the_same_harness(tmp_path, caplog):
    import logging

    # Prepare: control run, nothing deviates; the server keeps everybody waiting in setup for 6 polls
    adv = MaliciousServer(tmp_path, 5, threshold=3)
    adv.hold_setup_polls = 6

    # Execute
    with caplog.at_level(logging.INFO, logger="secure_afl.client"):
        results = adv.run(hospital_data(adv.names))

    # Assert: complete; a waiting hospital says so once per stage, not once per poll
    assert all(isinstance(r, dict) for r in results.values()), results
    assert set(adv.unmask_responses) == {1, 2, 3, 4, 5}
    waits = [r.getMessage() for r in caplog.records if "waits for the other hospitals" in r.getMessage()]
    assert sum("(setup, round " in w for w in waits) == 5 and len(waits) == len(set(waits))


@pytest.mark.e2e
def test_one_wrong_share_is_discarded_and_named_and_the_round_completes_exactly(tmp_path):
    import json
    import threading

    from support import Consortium

    from secure_afl.analytic import centralised_weights
    from secure_afl.clients.secagg_client import SecAggParticipant
    from secure_afl.secagg import UnmaskRequest, UnmaskResponse

    # Prepare: a real server process; 5 hospitals, t = 3; h5 answers its unmask request with one
    # well-formed but wrong share (h1's self-mask share, last bit flipped)
    c = Consortium(tmp_path / "c", backend="secagg", hospitals=("h1", "h2", "h3", "h4", "h5"), min_clients=2,
                   secagg={"threshold": 3, "stage_timeout_s": 30.0})
    try:
        c.start()
        data = {h: c.data(h) for h in c.hospitals}
        parts, results = {}, {}
        for h in c.hospitals:
            cl = c.hospital(h)
            parts[h] = SecAggParticipant(cl, cl.fetch_params(), c.stats(*data[h]))
        honest_handle = parts["h5"].client.handle

        def lying_handle(request, **kw):
            resp = honest_handle(request, **kw)
            if isinstance(request, UnmaskRequest):
                b = dict(resp.self_mask_shares)
                b[1] = b[1][:-1] + bytes([b[1][-1] ^ 1])
                resp = UnmaskResponse(resp.session_id, resp.client_id, b, resp.mask_key_shares)
            return resp

        parts["h5"].client.handle = lying_handle

        def go(h):
            try:
                results[h] = parts[h].run(timeout=120, poll=0.05)
            except Exception as e:  # asserted below
                results[h] = e

        threads = [threading.Thread(target=go, args=(h,), daemon=True) for h in c.hospitals]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)

        # Execute
        conn = c.connect_keyholder()
        res = c.keyholder.finalize(conn, min_clients=5)
        conn.close()
    finally:
        for p in parts.values():
            p.hospital.close()
        c.stop()

    # Assert: exact over all five, the wrong share named in the audit log
    assert all(isinstance(r, dict) for r in results.values()), results
    assert res.report["participants"] == ["h1", "h2", "h3", "h4", "h5"]
    X = np.concatenate([d[0] for d in data.values()])
    y = np.concatenate([d[1] for d in data.values()])
    W_joint = centralised_weights(X, y, c.classes)
    assert np.linalg.norm(res.W - W_joint) / np.linalg.norm(W_joint) <= 1e-9
    log = [json.loads(line) for line in c.audit_path().read_text().splitlines()]
    bad = [r for r in log if r["event"] == "secagg_bad_share"]
    assert [(r["actor"], r["details"]["owner"], r["details"]["kind"]) for r in bad] == [("h5", "h1", "b")]


def test_advertisement_relayed_with_the_servers_own_key_is_refused(tmp_path):
    # Prepare: the server swaps h2's share-encryption key for its own (and seeds the graph consistently)
    adv = MaliciousServer(tmp_path, 5, threshold=3, colluder=5)
    adv.forge_ad = 2

    # Execute
    results = adv.run(hospital_data(adv.names))

    # Assert: nobody encrypted a share to the server's key
    assert all(isinstance(r, InvalidContribution) for r in results.values()), results
    assert set(adv.share_keys_responses) <= {5}


def test_advertisement_list_too_short_for_the_quorum_is_refused(tmp_path):
    # Prepare: 5 hospitals, t = 3, min_clients = 2; the server relays only 3 advertisements, for which
    # the quorum max((3 + 2) // 2 + 1, 2 + 2) = 4 cannot be met
    adv = MaliciousServer(tmp_path, 5, threshold=3, colluder=5)
    adv.ads_shown = (1, 2, 3)

    # Execute
    results = adv.run(hospital_data(adv.names), timeout=5)

    # Assert
    assert all(isinstance(results[h], InsufficientShares) for h in ("h1", "h2", "h3")), results
    assert isinstance(results["h4"], InvalidContribution)  # its own advertisement was left out
    assert set(adv.share_keys_responses) <= {5}


def test_share_dealt_off_its_commitment_is_refused_by_its_holder(tmp_path):
    # Prepare: the colluder h5 deals h2 a wrong self-mask share under the right commitment, so that h2
    # would later look like the liar
    adv = MaliciousServer(tmp_path, 5, threshold=3, colluder=5)
    adv.frame_holder = 2

    # Execute
    results = adv.run(hospital_data(adv.names), timeout=5)

    # Assert: h2 refuses at its masked input and names the dealer
    assert isinstance(results["h2"], InvalidContribution) and "client 5" in str(results["h2"]), results
    assert 2 not in adv.masked


def test_unmask_request_calling_a_signed_survivor_dropped_is_refused(tmp_path):
    # Prepare: everybody signs the full set (quorum met), then the server asks h3 and h4 for h1's
    # mask-key share as if h1 had dropped, and h2 for h1's self-mask share
    adv = MaliciousServer(tmp_path, 5, threshold=3, colluder=5)
    adv.ask_key_share_of = {3: 1, 4: 1}

    # Execute
    results = adv.run(hospital_data(adv.names))

    # Assert
    assert isinstance(results["h3"], InvalidContribution) and isinstance(results["h4"], InvalidContribution)
    assert adv.try_unmask(1) is None


def test_two_advertisement_lists_with_t_minus_1_colluders_leave_the_victim_masked(tmp_path):
    # Prepare: n = 8 at the default t = 5 (4 colluders h5..h8). The server shows h1 (victim) and h2 every
    # advertisement but h4's, and h3, h4 every one but h2's: a quorum counted on the 7 advertisements each
    # group was shown is 6, which h1, h2 + 4 colluders reach for "everybody advertised" and h3, h4 + 4
    # colluders reach for "h1 dropped". The signed roster fixes n = 8, so the quorum is 7 for everybody.
    adv = MaliciousServer(tmp_path, 8, threshold=5, colluders=(5, 6, 7, 8))
    view_a, view_b = (1, 2, 3, 5, 6, 7, 8), (1, 3, 4, 5, 6, 7, 8)
    adv.views = {1: view_a, 2: view_a, 3: view_b, 4: view_b}
    adv.survivor_sets = {1: view_a, 2: view_a, 3: (3, 4, 5, 6, 7, 8), 4: (3, 4, 5, 6, 7, 8)}

    # Execute
    results = adv.run(hospital_data(adv.names))

    # Assert: nobody answered an unmask request and the shares collected do not open h1
    assert all(isinstance(r, InsufficientShares) for r in results.values()), results
    assert not adv.unmask_responses
    assert adv.try_unmask(1) is None
    assert set(adv.masked) == set(range(1, 9))  # the attack reached the unmask stage


def test_threshold_2_chosen_by_the_server_is_refused_before_any_share_leaves(tmp_path):
    # Prepare: the operator signed 7 hospitals at the default threshold (4); the server runs t = 2, so
    # that with no colluder at all two dropped-and-surviving views would open everybody
    adv = MaliciousServer(tmp_path, 7, threshold=2, signed_threshold=4)

    # Execute
    results = adv.run(hospital_data(adv.names))

    # Assert: every hospital refused at the session info, naming the field; nothing of the round left it
    assert all(isinstance(r, ParameterMismatch) and "backend_params.threshold" in str(r)
               for r in results.values()), results
    assert not adv.round.advertisements and not adv.share_keys_responses and not adv.masked


def test_genuine_signatures_over_another_survivor_set_relayed_as_the_quorum_reveal_nothing(tmp_path):
    # Prepare: n = 5, t = 3, quorum 4, t - 1 = 2 colluders (h4, h5). h2, h3 are shown "everybody but h1"
    # and sign it: with the colluders that set has its quorum. h1 (victim) is shown "everybody", signs
    # it, and is sent the four genuine statements over the OTHER set as its quorum. Answering them it
    # would reveal its own b-share, which with the colluders' two is t = 3, while h2, h3 and the
    # colluders give 4 s-shares of "dropped" h1.
    adv = MaliciousServer(tmp_path, 5, threshold=3, colluders=(4, 5))
    others = (2, 3, 4, 5)
    adv.survivor_sets = {1: (1, 2, 3, 4, 5), 2: others, 3: others}
    adv.quorum_shown = {1: others}

    # Execute
    results = adv.run(hospital_data(adv.names))

    # Assert: h1 names the equivocation and reveals nothing; the victim stays masked
    assert isinstance(results["h1"], InvalidContribution) and "another survivor set" in str(results["h1"]), results
    assert 1 not in adv.unmask_responses and 1 in adv.statements  # it signed, and was asked to unmask
    assert adv.try_unmask(1) is None


def test_another_sessions_signed_info_relayed_by_the_server_is_refused(tmp_path):
    # Prepare: the operator also signed session "adv2" for the same hospitals at t = 2; the server relays
    # that session's info and parameters to hospitals that joined "adv"
    from secure_afl.session.definition import normalise
    from secure_afl.session.schema import parse
    from secure_afl.session.signed import sign_definition

    adv = MaliciousServer(tmp_path, 5, threshold=3)
    other = normalise(parse({
        "session": {"id": "adv2", "backend": "secagg", "dim": 3, "classes": 2, "gamma": 1.0, "min_clients": 2,
                    "hospitals": adv.names},
        "bounds": {"max_norm": 4.0, "n_max": 100, "k_max": 5}, "secagg": {"threshold": 2}}))
    sign_definition(other, adv.pki_dir)
    honest_info = adv.info
    params2 = other.session_params()
    adv.info = lambda: {**honest_info(), "session_id": "adv2", "params": params2.to_dict(),
                        "params_digest": params2.digest().hex()}

    # Execute
    results = adv.run(hospital_data(adv.names))

    # Assert: refused before the round, both sessions named
    from secure_afl.exceptions import WrongSession

    assert all(isinstance(r, WrongSession) and "'adv2'" in str(r) and "'adv'" in str(r) for r in results.values())
    assert not adv.round.advertisements and not adv.share_keys_responses
