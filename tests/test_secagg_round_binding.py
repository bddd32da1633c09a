"""secagg round numbers in the library: every message, signature, key derivation and share AEAD names its round."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from secure_afl.exceptions import InvalidContribution, InvalidInputError, StaleRound
from secure_afl.hazmat import fixedpoint
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.secagg import (
    MaskedInput,
    SecAggClient,
    SecAggServerRound,
    SetupRequest,
    Stage,
    decode_message,
    graph_seed,
    identities,
    secagg_session_params,
)
from secure_afl.secagg.masking import pair_seed, share_ad, share_key

LAYOUT = Layout(6, 3)
BOUNDS = Bounds(1.0, 100, 20)
PRIV, PUB = identities(8)


def params(n=5):
    return secagg_session_params("sess-r", LAYOUT, 1.0, BOUNDS, n_parties=n, threshold=3)


def relay(msg):
    return decode_message(msg.to_bytes())


def drive(p, vectors, r, *, drop=(), upto=None, on_request=None):
    """One round through bytes, as the service relays it; ``on_request(stage, u, req)`` may rewrite a request."""
    ids = list(range(1, len(vectors) + 1))
    server = SecAggServerRound(p, participants=ids, identity_keys=PUB, round=r)
    clients = {u: SecAggClient(p, u, PRIV[u], PUB, round=r) for u in ids}
    seen = []
    for stage in Stage.all():
        if stage == upto:
            return server, clients, seen
        if stage == Stage.UNMASK:
            for u in sorted(server.active):
                server.receive(relay(clients[u].sign_survivors(server.survivors_)))
        for u in sorted(server.active):
            req = relay(server.request(u))
            if on_request is not None:
                req = on_request(stage, u, req)
            if stage == Stage.MASKED_INPUT:
                if u in drop:
                    continue
                resp = clients[u].masked_input(req, vectors[u - 1])
            else:
                resp = clients[u].handle(req)
            seen += [req, resp]
            server.receive(relay(resp))
        server.close_stage()
    return server, clients, seen


def test_round_2_with_a_dropout_is_exact_and_every_message_names_round_2():
    rng = np.random.default_rng(3)
    p = params()
    vectors = [rng.uniform(-20, 20, LAYOUT.length) for _ in range(5)]
    server, _, seen = drive(p, vectors, 2, drop=(4,))
    kept = [v for i, v in enumerate(vectors) if i != 3]
    assert np.array_equal(server.fixed_point_sum_, fixedpoint.fixed_point_sum(kept, p.backend_params["frac_bits"]))
    assert {m.round for m in seen} == {2} and server.unmask_material().round == 2


def test_client_refuses_a_request_of_another_round_and_keeps_its_state():
    p = params()
    c = SecAggClient(p, 1, PRIV[1], PUB, round=2)
    with pytest.raises(StaleRound):
        c.handle(SetupRequest("sess-r", 1, p.digest().hex(), round=1))
    assert c.stage == Stage.SETUP
    assert c.handle(SetupRequest("sess-r", 1, p.digest().hex(), round=2)).round == 2


def test_relabelled_advertisement_fails_its_signature():
    p = params()
    _, clients, _ = drive(p, [np.zeros(LAYOUT.length)] * 5, 1, upto=Stage.SHARE_KEYS)
    ad = clients[2]._advertisement()
    assert ad.verify(PUB[2]) and not replace(ad, round=2).verify(PUB[2])


def test_round_1_advertisement_relayed_in_round_2_aborts_the_hospital():
    # a dropped hospital's round-1 mask key may be known to the server: masking with it would hide nothing
    p = params()
    _, old_clients, _ = drive(p, [np.zeros(LAYOUT.length)] * 5, 1, upto=Stage.SHARE_KEYS)
    stale = old_clients[5]._advertisement()

    def swap(stage, u, req):
        if stage != Stage.SHARE_KEYS:
            return req
        ads = tuple(stale if a.client_id == 5 else a for a in req.advertisements)
        return replace(req, advertisements=ads, graph_seed=graph_seed(ads))  # a seed consistent with the swap

    with pytest.raises(InvalidContribution, match="round 1"):
        drive(p, [np.zeros(LAYOUT.length)] * 5, 2, on_request=swap)


def test_round_1_masked_input_refused_in_round_2_and_not_summed():
    rng = np.random.default_rng(4)
    p = params()
    vectors = [rng.uniform(-20, 20, LAYOUT.length) for _ in range(5)]
    _, _, seen = drive(p, vectors, 1, upto=Stage.UNMASK)
    masked_1 = next(m for m in seen if isinstance(m, MaskedInput) and m.client_id == 1)
    server, _, _ = drive(p, vectors, 2, upto=Stage.MASKED_INPUT)  # round 2 waits for its masked inputs
    with pytest.raises(StaleRound):  # the message says round 1
        server.receive(masked_1.to_bytes())
    with pytest.raises(StaleRound):  # relabelled, but the sealed (and signed-upload) header says round 1
        server.receive(replace(masked_1, round=2))
    assert server.stage == Stage.MASKED_INPUT and 1 in server.waiting_for and not server.responded

def test_unmask_material_of_another_round_refused():
    rng = np.random.default_rng(5)
    p = params()
    vectors = [rng.uniform(-20, 20, LAYOUT.length) for _ in range(5)]
    server, _, _ = drive(p, vectors, 2, drop=(3,))
    material = server.unmask_material()
    with pytest.raises(InvalidInputError, match="round"):
        server.backend.unmask(server.aggregate, unmask=replace(material, round=1))


def test_pair_seeds_and_share_aead_differ_between_rounds():
    a, b = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    pb = b.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    assert pair_seed(a, pb, "s", 1, 2, round=1) != pair_seed(a, pb, "s", 1, 2, round=2)
    k1 = share_key(a, pb, "s", 1, 2, round=1)
    nonce, cb, cs = bytes(12), bytes(32), bytes(32)
    ct = k1.encrypt(nonce, b"share", share_ad("s", "d", 1, 2, cb, cs, round=1))
    with pytest.raises(InvalidTag):
        share_key(a, pb, "s", 1, 2, round=2).decrypt(nonce, ct, share_ad("s", "d", 1, 2, cb, cs, round=2))
    with pytest.raises(InvalidTag):
        k1.decrypt(nonce, ct, share_ad("s", "d", 1, 2, cb, cs, round=2))


def _ads_of_a_second_run(p, r):
    """Hospitals 1..5's genuine signed advertisements from another run of the same session and round (a
    hospital that restarted and advertised fresh keys)."""
    _, _, seen = drive(p, [np.zeros(LAYOUT.length)] * 5, r, upto=Stage.SHARE_KEYS)
    return {m.client_id: m for m in seen if type(m).__name__ == "KeyAdvertisement"}


def _relayed(req, ads):
    # what a malicious server relays: any list of signed advertisements, with the graph seed a hospital will
    # derive from it (the last advertisement of a client is the one a dictionary keeps)
    kept = {a.client_id: a for a in ads}
    return replace(req, advertisements=tuple(ads), graph_seed=graph_seed(kept.values()))


def test_two_signed_advertisements_of_one_hospital_in_one_round_are_refused_not_one_picked():
    # Prepare: hospital 3 advertised twice in round 1 (say, across a restart); the server relays both, so each
    # hospital would keep whichever it read last, and the server decides which keys h3's masks pair with
    from secure_afl.exceptions import MalformedPayload

    p = params()
    other = _ads_of_a_second_run(p, 1)

    def both_of_h3(stage, u, req):
        if stage != Stage.SHARE_KEYS:
            return req
        return _relayed(req, list(req.advertisements) + [other[3]])

    # Execute / Assert
    with pytest.raises(MalformedPayload, match="duplicate advertisement from client 3"):
        drive(p, [np.zeros(LAYOUT.length)] * 5, 1, on_request=both_of_h3)


def test_an_advertisement_that_copies_another_hospitals_keys_is_refused():
    # Prepare: hospital 4 (a colluder) signs, under its own identity, an advertisement carrying hospital 3's
    # public keys, and the server relays it with a graph seed to match
    p = params()

    def copied(stage, u, req):
        if stage != Stage.SHARE_KEYS:
            return req
        ads = {a.client_id: a for a in req.advertisements}
        forged = replace(ads[4], enc_public_key=ads[3].enc_public_key, mask_public_key=ads[3].mask_public_key)
        forged = forged.signed(PRIV[4])
        assert forged.verify(PUB[4])
        return _relayed(req, [forged if a.client_id == 4 else a for a in req.advertisements])

    # Execute / Assert
    with pytest.raises(InvalidContribution, match="same public key"):
        drive(p, [np.zeros(LAYOUT.length)] * 5, 1, on_request=copied)


def test_a_hospital_signs_one_survivor_set_per_round_and_refuses_a_second():
    # two signed survivor sets that differ by one hospital would let a server unmask that hospital from the two
    # sums; the durable record covers a restarted process, this covers the same process asked twice
    p = params()
    server, clients, _ = drive(p, [np.zeros(LAYOUT.length)] * 5, 1, upto=Stage.UNMASK)
    surv = sorted(server.survivors_)
    assert len(surv) == 5
    c = clients[1]

    # Execute / Assert: the same set again gives the same statement; another set that is itself signable
    # (every member advertised, at least the quorum) is refused, and the hospital stops
    first = c.sign_survivors(surv)
    assert c.sign_survivors(list(reversed(surv))) == first
    other = surv[:-1]
    with pytest.raises(InvalidContribution, match="second survivor set"):
        c.sign_survivors(other)
