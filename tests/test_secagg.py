"""secagg backend: PRG vectors, protocol correctness under dropout, refusals, stage order."""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import replace
from itertools import product

import numpy as np
import pytest
from support import json_parametrize
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sstats

from secure_afl.backends import get_backend
from secure_afl.secagg import (
    identities,
    dropout_tolerance,
    AdvertiseKeysRequest,
    EncryptedShare,
    MaskedInput,
    MaskedInputRequest,
    SecAggBackend,
    SecAggClient,
    SecAggServerRound,
    SetupRequest,
    ShareKeysRequest,
    Stage,
    UnmaskMaterial,
    UnmaskRequest,
    decode_message,
    neighbour_graph,
    recommended_neighbours,
    secagg_session_params,
    simulate_round,
)
from secure_afl.exceptions import (
    DuplicateContribution,
    InsufficientShares,
    InvalidContribution,
    InvalidInputError,
    InvalidParameterError,
    MalformedPayload,
    OverlappingUnmaskRequest,
    ParameterMismatch,
    RoundAlreadyClosed,
    StageError,
    WrongSession,
)
from secure_afl.hazmat import fixedpoint
from secure_afl.hazmat.prg import add_expanded, agree, expand
from secure_afl.packing import Layout
from secure_afl.params import Bounds

LAYOUT = Layout(12, 3)  # L = 78 + 36 + 3 + 2 + 4 = 123
BOUNDS = Bounds(1.0, 100, 20)
SEED = bytes(range(32))


PRIV, PUB = identities(100)


def make_params(n=5, *, session="sess-1", **kw):
    return secagg_session_params(session, LAYOUT, 1.0, BOUNDS, n_parties=n, **kw)


def client(params, u):
    return SecAggClient(params, u, PRIV[u], PUB)


def server_round(params, ids):
    return SecAggServerRound(params, participants=ids, identity_keys=PUB)


def random_vectors(k, rng, layout=LAYOUT, scale=50.0):
    return [rng.uniform(-scale, scale, layout.length) for _ in range(k)]


def relay(msg):
    """What the HTTP service does: serialise, ship, parse."""
    return decode_message(msg.to_bytes())


def drive(params, vectors, *, drop_before_masked=(), clients=None, upto=None):
    """Run the protocol message by message through bytes; returns (server, clients)."""
    ids = list(range(1, len(vectors) + 1))
    server = server_round(params, ids)
    clients = clients or {u: client(params, u) for u in ids}
    for stage in Stage.all():
        if stage == Stage.UNMASK:  # the consistency check opens the stage
            for u in sorted(server.active):
                server.receive(relay(clients[u].sign_survivors(server.survivors_)))
        if stage == upto:
            return server, clients
        for u in sorted(server.active):
            req = relay(server.request(u))
            if stage == Stage.MASKED_INPUT:
                if u in drop_before_masked:
                    continue
                resp = clients[u].masked_input(req, vectors[u - 1])
            else:
                resp = clients[u].handle(req)
            server.receive(relay(resp))
        server.close_stage()
    return server, clients


# ---------------------------------------------------------------------------
# PRG
# ---------------------------------------------------------------------------
def _rotl(x, n):
    return ((x << n) | (x >> (32 - n))) & 0xFFFFFFFF


def reference_chacha20_block(key, counter, nonce):
    """Independent pure-Python ChaCha20 block (RFC 8439 section 2.3), for cross-checking only."""
    st = [0x61707865, 0x3320646E, 0x79622D32, 0x6B206574, *struct.unpack("<8I", key), counter,
          *struct.unpack("<3I", nonce)]
    w = list(st)

    def qr(a, b, c, d):
        w[a] = (w[a] + w[b]) & 0xFFFFFFFF; w[d] = _rotl(w[d] ^ w[a], 16)  # noqa: E702
        w[c] = (w[c] + w[d]) & 0xFFFFFFFF; w[b] = _rotl(w[b] ^ w[c], 12)  # noqa: E702
        w[a] = (w[a] + w[b]) & 0xFFFFFFFF; w[d] = _rotl(w[d] ^ w[a], 8)  # noqa: E702
        w[c] = (w[c] + w[d]) & 0xFFFFFFFF; w[b] = _rotl(w[b] ^ w[c], 7)  # noqa: E702

    for _ in range(10):
        qr(0, 4, 8, 12); qr(1, 5, 9, 13); qr(2, 6, 10, 14); qr(3, 7, 11, 15)  # noqa: E702
        qr(0, 5, 10, 15); qr(1, 6, 11, 12); qr(2, 7, 8, 13); qr(3, 4, 9, 14)  # noqa: E702
    return struct.pack("<16I", *[(a + b) & 0xFFFFFFFF for a, b in zip(w, st)])


@json_parametrize(("seed", "domain", "n_words", "words"), "prg.json")
def test_prg_known_answers_and_independent_cross_checks(seed, domain, n_words, words):
    # Prepare
    seed, domain = bytes.fromhex(seed), bytes.fromhex(domain)
    expected = [int(w, 16) for w in words]

    # Execute
    got = expand(seed, n_words, domain=domain)

    # Assert: vector, pure-Python reference, and the AEAD's keystream (counter starts at 1).
    assert got.dtype == np.uint64 and got.tolist() == expected
    stream = b"".join(reference_chacha20_block(seed, c, domain) for c in range((n_words + 7) // 8))
    assert [int.from_bytes(stream[8 * i:8 * i + 8], "little") for i in range(n_words)] == expected
    if n_words > 8:
        ct = ChaCha20Poly1305(seed).encrypt(domain, bytes(8 * (n_words - 8)), None)[:-16]
        assert np.frombuffer(ct, "<u8").tolist() == expected[8:]


@pytest.mark.parametrize("n_words", [8191, 8192, 8193, 3 * 8192 + 5])
def test_prg_stream_continues_across_blocks_and_masks_in_place(n_words):
    # Prepare: lengths around the generator's internal block size
    seed, domain = bytes(range(32)), b"saflSPLITmsk"
    base = np.random.default_rng(n_words).integers(0, 2**63, n_words, dtype=np.uint64)

    # Execute
    words = expand(seed, n_words, domain=domain)
    masked = add_expanded(base.copy(), seed, domain=domain)
    unmasked = add_expanded(masked.copy(), seed, domain=domain, subtract=True)

    # Assert: the AEAD's keystream (counter from 1) is the generator's from word 8 on, in one piece
    ct = ChaCha20Poly1305(seed).encrypt(domain, bytes(8 * (n_words - 8)), None)[:-16]
    assert np.frombuffer(ct, "<u8").tolist() == words[8:].tolist()
    assert np.array_equal(masked, base + words) and np.array_equal(unmasked, base)
    with pytest.raises(TypeError):
        add_expanded(base.astype(np.int64), seed, domain=domain)


def test_prg_domains_separate_and_seed_used_whole():
    # Prepare
    s1 = bytes(32)
    s2 = bytes(31) + b"\x01"  # differs only in the last byte: a folded seed would collide

    # Execute
    a, b, c = expand(s1, 16), expand(s2, 16), expand(s1, 16, domain=b"saflSELFmask")

    # Assert
    assert not np.array_equal(a, b) and not np.array_equal(a, c)
    assert expand(s1, 4).tolist() == a[:4].tolist()


@pytest.mark.security
def test_pairwise_seed_agreement_is_symmetric_and_bound_to_context():
    # Prepare
    ku, kv = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    pu, pv = (k.public_key().public_bytes_raw() for k in (ku, kv))

    # Execute
    s_uv = agree(ku, pv, purpose="mask", session_id="s", u=1, v=2)
    s_vu = agree(kv, pu, purpose="mask", session_id="s", u=2, v=1)

    # Assert
    assert s_uv == s_vu and len(s_uv) == 32
    assert s_uv != agree(ku, pv, purpose="mask", session_id="t", u=1, v=2)
    assert s_uv != agree(ku, pv, purpose="share-enc", session_id="s", u=1, v=2)
    assert s_uv != agree(ku, pv, purpose="mask", session_id="s", u=1, v=3)
    with pytest.raises(InvalidContribution):
        agree(ku, bytes(32), purpose="mask", session_id="s", u=1, v=2)  # small-order point


# ---------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------
def test_session_params_defaults_and_validation_messages():
    # Execute
    p = make_params(4)
    bp = p.backend_params

    # Assert
    # the default t is the largest majority-or-below threshold whose round survives one dropout: at n = 4 the
    # majority 3 needs all four (quorum max(4, 2 + 2)), so the default is the one below it
    assert dropout_tolerance(4, bp["threshold"], bp["min_clients"]) >= 1
    assert dropout_tolerance(4, bp["threshold"] + 1, bp["min_clients"]) == 0
    assert bp["neighbours"] is None and bp["n_parties"] == 4
    assert tuple(bp["frac_bits"]) == fixedpoint.choose_frac_bits(BOUNDS, 1.0)
    json.dumps(p.to_dict())
    with pytest.raises(InvalidParameterError, match="threshold=5 exceeds n_parties=4; .* use threshold <= 4"):
        make_params(4, threshold=5)
    with pytest.raises(InvalidParameterError, match="min_clients=3 with threshold=3 .* use min_clients <= 2"):
        make_params(4, threshold=3, min_clients=3)
    with pytest.raises(InvalidParameterError, match="must be even"):
        make_params(20, neighbours=5)
    with pytest.raises(InvalidParameterError, match="raise `neighbours`"):
        make_params(20, neighbours=4, threshold=6)
    with pytest.raises(InvalidParameterError, match="exceeds bounds.k_max"):
        make_params(21)
    with pytest.raises(InvalidParameterError, match="leave"):
        secagg_session_params("s", LAYOUT, 1.0, Bounds(1.0, 10**6, 20), n_parties=4, frac_bits=(45, 52))
    assert make_params(6, neighbours=8).backend_params["neighbours"] is None  # >= n-1: complete graph
    assert recommended_neighbours(1000) == 30 and recommended_neighbours(10) is None


@pytest.mark.security
def test_hand_edited_backend_params_refused():
    # Prepare
    p = make_params(5)
    weak = p.with_backend_params(threshold=1)

    # Execute / Assert
    with pytest.raises(InvalidParameterError):
        SecAggBackend(weak)
    with pytest.raises(ParameterMismatch):  # the graph is no parameter: a server-chosen seed has no place here
        SecAggBackend(p.with_backend_params(graph_seed=bytes(32).hex()))
    with pytest.raises(ParameterMismatch):
        SecAggBackend(p.with_backend_params(protocol="other"))
    assert get_backend(p).name == "secagg"


def test_neighbour_graph_is_regular_symmetric_and_public():
    # Execute
    g = neighbour_graph(100, 12, SEED)
    g2 = neighbour_graph(100, 12, SEED)
    g3 = neighbour_graph(100, 12, bytes(32))

    # Assert
    assert g == g2 and g != g3
    assert all(len(n) == 12 and u not in n for u, n in g.items())
    assert all(u in g[v] for u, n in g.items() for v in n)


# ---------------------------------------------------------------------------
# Correctness
# ---------------------------------------------------------------------------
@settings(max_examples=12, deadline=None)
@given(k=st.integers(min_value=2, max_value=6), seed=st.integers(min_value=0, max_value=2**32 - 1),
       scale=st.sampled_from([1e-6, 1.0, 100.0]))
def test_property_unmasked_sum_equals_plaintext_fixed_point_sum(k, seed, scale):
    # Prepare
    rng = np.random.default_rng(seed)
    params = make_params(k)
    vectors = random_vectors(k, rng, scale=scale)

    # Execute
    server, _ = drive(params, vectors)

    # Assert
    f = params.backend_params["frac_bits"]
    assert np.array_equal(server.fixed_point_sum_, fixedpoint.fixed_point_sum(vectors, f))
    assert np.allclose(server.aggregate_vector_, np.sum(vectors, axis=0), rtol=1e-12, atol=k * 2.0 ** -sum(f))


@pytest.mark.parametrize("k, dropout", [(10, 0.1), (10, 0.3), (20, 0.1), (20, 0.3)])
def test_dropout_gives_exact_survivor_sum(k, dropout):
    # Prepare: t = 3 tolerates 2 colluders; the quorum (7 of 10, 12 of 20) leaves room for 30 % dropouts
    rng = np.random.default_rng(k)
    params = make_params(k, threshold=3)
    vectors = random_vectors(k, rng)
    drops = set(int(i) for i in rng.choice(np.arange(1, k + 1), int(round(dropout * k)), replace=False))

    # Execute
    server, _ = drive(params, vectors, drop_before_masked=drops)
    agg, exact, timings, nbytes = simulate_round(params, vectors, dropout, rng)

    # Assert
    survivors = [vectors[u - 1] for u in range(1, k + 1) if u not in drops]
    f = params.backend_params["frac_bits"]
    assert set(server.dropped_) == drops
    assert np.array_equal(server.fixed_point_sum_, fixedpoint.fixed_point_sum(survivors, f))
    assert np.array_equal(server.aggregate_vector_, fixedpoint.decode(fixedpoint.fixed_point_sum(survivors, f), f))
    assert exact is True and nbytes > 8 * LAYOUT.length and timings["protect_per_client"] > 0


def test_neighbour_graph_round_with_100_clients_and_dropout():
    # Prepare
    k = 100
    # the threshold set as an operator trading isolation for dropouts would: the default on this sparse graph
    # is every share holder (privacy first), which survives no dropout
    params = secagg_session_params("big", Layout(4, 2), 1.0, Bounds(1.0, 100, k), neighbours=12, threshold=7)
    rng = np.random.default_rng(7)
    vectors = random_vectors(k, rng, layout=Layout(4, 2))

    # Execute
    agg, exact, timings, nbytes = simulate_round(params, vectors, 0.1, 3)

    # Assert
    assert exact is True
    assert params.backend_params["threshold"] == 7


@pytest.mark.security
def test_threshold_breaking_dropout_aborts_cleanly_and_reveals_nothing():
    # Prepare: n=10, t=6: five dropouts leave 5 < 6 holders.
    k = 10
    params = make_params(k)
    vectors = random_vectors(k, np.random.default_rng(0))
    server, clients = drive(params, vectors, upto=Stage.MASKED_INPUT)
    for u in range(1, 6):
        server.receive(relay(clients[u].masked_input(relay(server.request(u)), vectors[u - 1])))

    # Execute / Assert
    with pytest.raises(InsufficientShares):
        server.close_stage()
    assert server.aggregate_vector_ is None and server.fixed_point_sum_ is None
    assert not server._b_shares and not server._s_shares
    with pytest.raises(RoundAlreadyClosed):
        server.request(1)
    with pytest.raises(InsufficientShares):
        simulate_round(params, vectors, 0.5, 0)


@pytest.mark.security
def test_too_few_unmask_responses_abort():
    # Prepare
    k = 6
    params = make_params(k, threshold=4)
    vectors = random_vectors(k, np.random.default_rng(1))
    server, clients = drive(params, vectors, upto=Stage.UNMASK)
    for u in (1, 2, 3):
        server.receive(relay(clients[u].unmask(relay(server.request(u)))))

    # Execute / Assert
    with pytest.raises(InsufficientShares):
        server.close_stage()
    assert server.aggregate_vector_ is None


@pytest.mark.security
def test_client_refuses_unmask_below_threshold():
    # Prepare
    params = make_params(5)  # t = 3
    vectors = random_vectors(5, np.random.default_rng(2))
    server, clients = drive(params, vectors, upto=Stage.UNMASK)

    # Execute / Assert
    with pytest.raises(InsufficientShares):
        clients[1].unmask(UnmaskRequest("sess-1", 1, (1, 2), ()))


# ---------------------------------------------------------------------------
# What the server sees
# ---------------------------------------------------------------------------
def _fixed_clients(params, k):
    return {
        u: SecAggClient._from_parts(
            params, u, PRIV[u], PUB,
            enc_private=hashlib.sha256(b"enc%d" % u).digest(),
            mask_private=hashlib.sha256(b"mask%d" % u).digest(),
            self_mask_seed=hashlib.sha256(b"b%d" % u).digest(),
        )
        for u in range(1, k + 1)
    }


@pytest.mark.security
def test_single_masked_upload_is_indistinguishable_from_uniform():
    # Prepare: fixed secrets (deterministic test); the input is highly structured.
    layout = Layout(150, 10)  # L = 12,837 words
    params = secagg_session_params("unif", layout, 1.0, BOUNDS, n_parties=3)
    x = np.zeros(layout.length)
    x[: layout.length // 2] = 99.0
    x[layout.length // 2:] = -np.linspace(0, 100, layout.length - layout.length // 2)
    server, clients = drive(params, [x, x, x], upto=Stage.MASKED_INPUT, clients=_fixed_clients(params, 3))

    # Execute
    payload = clients[1].masked_input(server.request(1), x).to_bytes()
    y = SecAggBackend(params)._decode_masked(payload)[1]

    # Assert: top byte uniform (chi-square), every bit balanced, no correlation with the input.
    counts = np.bincount((y >> np.uint64(56)).astype(np.int64), minlength=256)
    assert sstats.chisquare(counts).pvalue > 1e-4
    bits = np.array([((y >> np.uint64(b)) & np.uint64(1)).sum() for b in range(64)], dtype=float)
    z = (bits - y.size / 2) / np.sqrt(y.size / 4)
    assert np.max(np.abs(z)) < 5
    enc = fixedpoint.encode(x, params.backend_params["frac_bits"])
    for a, w in ((x, y[:x.size]), (x, y[x.size:]), (enc.view(np.int64).astype(float), y)):
        r = np.corrcoef(a, w.astype(float))[0, 1]
        assert abs(r) < 5 / np.sqrt(y.size)
    r_bytes = np.corrcoef((enc >> np.uint64(56)).astype(float), (y >> np.uint64(56)).astype(float))[0, 1]
    assert abs(r_bytes) < 5 / np.sqrt(y.size)


@pytest.mark.security
def test_unmask_request_with_overlapping_lists_refused():
    # Prepare
    params = make_params(5)
    vectors = random_vectors(5, np.random.default_rng(3))
    server, clients = drive(params, vectors, upto=Stage.UNMASK)
    honest = server.request(1)

    # Execute / Assert: 3 is listed as survivor and as dropped.
    with pytest.raises(OverlappingUnmaskRequest):
        clients[1].unmask(UnmaskRequest("sess-1", 1, (1, 2, 3, 4), (3,), honest.statements))
    with pytest.raises(StageError):  # the client aborted: it never answers again
        clients[1].unmask(honest)
    with pytest.raises(OverlappingUnmaskRequest):  # asking the client's own key share
        clients[2].unmask(UnmaskRequest("sess-1", 2, (1, 3, 4), (2,), honest.statements))


@pytest.mark.security
def test_honest_unmask_never_reveals_both_shares_of_one_client():
    # Prepare
    k = 8
    params = make_params(k, threshold=3)
    vectors = random_vectors(k, np.random.default_rng(4))
    server, clients = drive(params, vectors, drop_before_masked={2, 5})

    # Assert
    assert set(server._b_shares) == set(server.survivors_)
    assert set(server._s_shares) == {2, 5}
    assert not set(server._b_shares) & set(server._s_shares)


# ---------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------
@pytest.mark.security
def test_aead_tampered_share_ciphertext_refused():
    # Prepare
    params = make_params(4)
    vectors = random_vectors(4, np.random.default_rng(5))
    server, clients = drive(params, vectors, upto=Stage.MASKED_INPUT)
    req = server.request(1)
    es = req.shares[0]
    flipped = bytes([es.ciphertext[0] ^ 1]) + es.ciphertext[1:]
    bad = MaskedInputRequest(req.session_id, 1, (EncryptedShare(es.sender, 1, es.nonce, flipped, es.commit_b, es.commit_s),) + req.shares[1:])

    # Execute / Assert
    with pytest.raises(InvalidContribution):
        clients[1].masked_input(bad, vectors[0])
    assert clients[1].stage == "aborted"


@pytest.mark.security
def test_share_redirected_to_another_recipient_refused():
    # Prepare: the server relays 2's ciphertext for 1 to 3 instead (same sender, relabelled).
    params = make_params(4)
    vectors = random_vectors(4, np.random.default_rng(6))
    server, clients = drive(params, vectors, upto=Stage.MASKED_INPUT)
    for_1 = {s.sender: s for s in server.request(1).shares}[2]
    req3 = server.request(3)
    moved = tuple(EncryptedShare(2, 3, for_1.nonce, for_1.ciphertext, for_1.commit_b, for_1.commit_s) if s.sender == 2 else s for s in req3.shares)

    # Execute / Assert
    with pytest.raises(InvalidContribution):
        clients[3].masked_input(MaskedInputRequest("sess-1", 3, moved), vectors[2])


@pytest.mark.security
def test_tampered_truncated_and_foreign_masked_inputs_refused():
    # Prepare
    params = make_params(4)
    other_session = make_params(4, session="sess-2")
    other_params = make_params(4, threshold=4)
    vectors = random_vectors(4, np.random.default_rng(8))
    server, clients = drive(params, vectors, upto=Stage.MASKED_INPUT)
    payload = clients[1].masked_input(server.request(1), vectors[0]).to_bytes()
    backend = SecAggBackend(params)

    # Execute / Assert
    flipped = payload[:-1] + bytes([payload[-1] ^ 0x80])
    with pytest.raises(MalformedPayload):
        server.receive(MaskedInput("sess-1", 1, flipped))
    with pytest.raises(MalformedPayload):
        server.receive(MaskedInput("sess-1", 1, payload[:-8]))
    with pytest.raises(MalformedPayload):
        decode_message(payload[:20])
    with pytest.raises(WrongSession):
        SecAggBackend(other_session).combiner().add(payload)
    with pytest.raises(ParameterMismatch):
        SecAggBackend(other_params).combiner().add(payload)
    server.receive(MaskedInput.from_bytes(payload))
    with pytest.raises(DuplicateContribution):
        server.receive(MaskedInput.from_bytes(payload))
    acc = backend.combiner()
    acc.add(payload)
    acc.aggregate()
    with pytest.raises(RoundAlreadyClosed):
        acc.add(payload)


def test_client_refuses_wrong_session_and_parameters():
    # Prepare
    params = make_params(4)
    hospital = client(params, 1)
    foreign = make_params(4, threshold=4).digest().hex()

    # Execute / Assert
    with pytest.raises(WrongSession):
        hospital.setup(SetupRequest("sess-9", 1, params.digest().hex()))
    with pytest.raises(ParameterMismatch):
        hospital.setup(SetupRequest("sess-1", 1, foreign))
    with pytest.raises(MalformedPayload):
        hospital.setup(SetupRequest("sess-1", 2, params.digest().hex()))
    assert hospital.stage == Stage.SETUP  # soft refusals leave the state unchanged
    hospital.setup(SetupRequest("sess-1", 1, params.digest().hex()))
    assert hospital.stage == Stage.ADVERTISE_KEYS


@pytest.mark.parametrize("data", [b"", b"{", b"[]", b'{"type":"secagg.unmask_request"}',
                                  b'{"type":"secagg.unmask_request","stage":"unmask","session_id":"s",'
                                  b'"client_id":1,"survivors":[1,"2"],"dropped":[]}',
                                  b'{"type":"nope"}'])
def test_malformed_messages_refused(data):
    with pytest.raises(MalformedPayload):
        decode_message(data)


def test_reveal_refuses_material_for_other_contributors():
    # Prepare
    params = make_params(5)
    vectors = random_vectors(5, np.random.default_rng(9))
    server, _ = drive(params, vectors, drop_before_masked={4})
    material = server.unmask_material()
    wrong = UnmaskMaterial(material.survivors[:-1], material.dropped, material.self_mask_seeds,
                           material.dropped_mask_keys, material.mask_public_keys)

    # Execute / Assert
    backend = SecAggBackend(params)
    assert np.array_equal(backend.reveal(server.aggregate, unmask=UnmaskMaterial.from_dict(
        json.loads(json.dumps(material.to_dict())))), server.aggregate_vector_)
    with pytest.raises(InvalidInputError):
        backend.reveal(server.aggregate, unmask=wrong)


def test_every_message_round_trips_through_json_and_bytes():
    # Prepare
    params = make_params(4)
    vectors = random_vectors(4, np.random.default_rng(10))
    server = server_round(params, range(1, params.backend_params["n_parties"] + 1))
    clients = {u: client(params, u) for u in range(1, 5)}
    seen = set()

    # Execute
    for stage in Stage.all():
        if stage == Stage.UNMASK:
            for u in sorted(server.active):
                st = clients[u].sign_survivors(server.survivors_)
                assert decode_message(st.to_bytes()) == st
                seen.add(type(st).__name__)
                server.receive(st)
        for u in sorted(server.active):
            req = server.request(u)
            resp = clients[u].masked_input(req, vectors[u - 1]) if stage == Stage.MASKED_INPUT else clients[u].handle(req)
            for m in (req, resp):
                seen.add(type(m).__name__)
                assert type(m).from_dict(json.loads(json.dumps(m.to_dict()))) == m
                assert decode_message(m.to_bytes()) == m
            server.receive(resp)
        server.close_stage()

    # Assert
    assert len(seen) == 11 and server.aggregate_vector_ is not None


# ---------------------------------------------------------------------------
# Stage order
# ---------------------------------------------------------------------------
def _dummy(stage, sid="sess-1", cid=1):
    return {
        Stage.SETUP: SetupRequest(sid, cid, "00"),
        Stage.ADVERTISE_KEYS: AdvertiseKeysRequest(sid, cid),
        Stage.SHARE_KEYS: ShareKeysRequest(sid, cid, (), bytes(32)),
        Stage.MASKED_INPUT: MaskedInputRequest(sid, cid, ()),
        Stage.UNMASK: UnmaskRequest(sid, cid, (), ()),
    }[stage]


@pytest.mark.security
@pytest.mark.parametrize("position", range(len(Stage.all()) + 1))
def test_client_rejects_every_out_of_order_stage(position):
    # Prepare: a real client that completed `position` stages.
    params = make_params(3)
    vectors = random_vectors(3, np.random.default_rng(11))
    upto = Stage.all()[position] if position < len(Stage.all()) else None
    server, clients = drive(params, vectors, upto=upto)
    client = clients[1]
    expected = upto or "done"

    # Execute / Assert: every (expected, received) pair with received != expected.
    for exp, received in product([expected], Stage.all()):
        if received == exp:
            continue
        with pytest.raises(StageError):
            client.handle(_dummy(received), vector=vectors[0])
        assert client.stage == exp
    if upto is not None:  # the right request still works afterwards
        req = server.request(1)
        client.handle(req, vector=vectors[0])


@pytest.mark.security
def test_server_rejects_wrong_stage_duplicates_and_late_messages():
    # Prepare
    params = make_params(3)
    vectors = random_vectors(3, np.random.default_rng(12))
    server = server_round(params, range(1, params.backend_params["n_parties"] + 1))
    clients = {u: client(params, u) for u in range(1, 4)}
    ack = clients[1].setup(server.request(1))

    # Execute / Assert
    server.receive(ack)
    with pytest.raises(DuplicateContribution):
        server.receive(ack)
    adv_client = client(params, 2)
    adv_client.setup(server.request(2))
    with pytest.raises(StageError):
        server.receive(adv_client.advertise_keys(AdvertiseKeysRequest("sess-1", 2)))
    for u in (2, 3):
        server.receive(clients[u].setup(server.request(u)))
    server.close_stage()
    with pytest.raises(StageError):
        server.receive(ack)
    done, _ = drive(params, vectors)
    with pytest.raises(RoundAlreadyClosed):
        done.request(1)



# ---------------------------------------------------------------------------
# Consistency statements: what is signed, and the compact relay
# ---------------------------------------------------------------------------
def test_survivor_digest_known_vector():
    from secure_afl.secagg.messages import survivors_digest

    # SHA-256 of the canonical JSON b"[1,2,3,7]", computed with another tool
    assert survivors_digest((1, 2, 3, 7)).hex() == "b373ee423f813fcd0246b5238b2b2c61680bb07712d83204ee97256ffc9490d8"
    assert survivors_digest((1, 2, 3, 7)) == hashlib.sha256(b"[1,2,3,7]").digest()


@pytest.mark.security
@pytest.mark.parametrize("change", ["drop_one", "add_one", "swap_one", "round", "seed"])
def test_a_signed_statement_binds_its_survivor_set(change):
    # Prepare: hospital 1's genuine signature over the survivor set of a real round
    params = make_params(6)
    server, clients = drive(params, random_vectors(6, np.random.default_rng(21)), drop_before_masked={6},
                            upto=Stage.UNMASK)
    st = clients[1].sign_survivors(server.survivors_)
    assert st.verify(PUB[1]) and st.survivors == (1, 2, 3, 4, 5)

    # Execute: the same signature on any other set, round or graph seed
    other = {"drop_one": dict(survivors=(1, 2, 3, 4)), "add_one": dict(survivors=(1, 2, 3, 4, 5, 6)),
             "swap_one": dict(survivors=(1, 2, 3, 4, 6)), "round": dict(round=2),
             "seed": dict(graph_seed=bytes(32))}[change]
    forged = replace(st, **other)

    # Assert: it verifies for nobody, after a trip through the wire format too
    assert not forged.verify(PUB[1])
    assert not decode_message(forged.to_bytes()).verify(PUB[1])


def _relayed_unmask_request(params, server, u):
    d = json.loads(server.request(u).to_bytes())
    assert d["statements"]["signers"], "the request relays the quorum's signatures"
    return d


@pytest.mark.parametrize("edit", [
    lambda st: st.update(survivors=[1, 3, 2, 4, 5]),           # not sorted
    lambda st: st.update(survivors=[1, 2, 2, 3, 4, 5]),        # repeated id
    lambda st: st.update(survivors=[1, 2, True, 4, 5]),        # a bool is no id
    lambda st: st.update(graph_seed="AAAA"),                   # seed of the wrong length
    lambda st: st.update(round=0),                             # round out of range
    lambda st: st["signers"].append([7]),                      # a signer without signature
    lambda st: st["signers"].append([False, st["signers"][0][1]]),
    lambda st: st["signers"].append([7, "AAAA"]),              # signature of the wrong length
    lambda st: st.pop("session_id"),
])
def test_compact_unmask_request_refuses_malformed_shared_part(edit):
    # Prepare
    params = make_params(5)
    server, _ = drive(params, random_vectors(5, np.random.default_rng(22)), upto=Stage.UNMASK)
    d = _relayed_unmask_request(params, server, 1)

    # Execute
    edit(d["statements"])

    # Assert
    with pytest.raises(MalformedPayload):
        decode_message(json.dumps(d).encode())


@pytest.mark.security
def test_client_refuses_a_relayed_signature_moved_to_another_signer():
    # Prepare: the server relays hospital 2's signature under hospital 3's id
    params = make_params(5)
    server, clients = drive(params, random_vectors(5, np.random.default_rng(23)), upto=Stage.UNMASK)
    d = _relayed_unmask_request(params, server, 1)
    sigs = dict((cid, sig) for cid, sig in d["statements"]["signers"])
    d["statements"]["signers"] = [[cid, sigs[2] if cid == 3 else sig] for cid, sig in d["statements"]["signers"]]

    # Execute / Assert: refused before any share is revealed
    with pytest.raises(InvalidContribution, match="client 3"):
        clients[1].unmask(decode_message(json.dumps(d).encode()))


@pytest.mark.security
def test_signatures_over_one_survivor_set_do_not_confirm_another():
    # Prepare: 9 advertised, 8 survivors S; hospital 1 was shown (and signed) a smaller set S1 than the others
    params = make_params(9, threshold=2)
    vectors = random_vectors(9, np.random.default_rng(24))
    server, clients = server_round(params, range(1, 10)), {u: client(params, u) for u in range(1, 10)}
    for stage in Stage.all()[:-1]:  # every stage before the consistency check; 9 drops before its masked input
        for u in sorted(server.active):
            req = relay(server.request(u))
            if stage == Stage.MASKED_INPUT and u == 9:
                continue
            resp = clients[u].masked_input(req, vectors[u - 1]) if stage == Stage.MASKED_INPUT else \
                clients[u].handle(req)
            server.receive(relay(resp))
        server.close_stage()
    surv = server.survivors_
    s1 = surv[:clients[1].quorum]
    assert 1 in s1 and len(s1) < len(surv)
    mine = clients[1].sign_survivors(s1)
    others = [clients[u].sign_survivors(surv) for u in surv if u != 1]

    # Execute: the server relays the others' signatures over S as statements over S1, and asks hospital 1 to
    # reveal as if S1 were the agreed set
    forged = (mine,) + tuple(replace(st, survivors=s1) for st in others)
    request = UnmaskRequest("sess-1", 1, s1, tuple(sorted(set(surv) - set(s1))), forged)

    # Assert: refused before any share leaves hospital 1
    with pytest.raises(InvalidContribution, match="not validly signed"):
        clients[1].unmask(decode_message(request.to_bytes()))


def test_unmask_log_tells_a_silent_survivor_from_a_dropped_hospital(caplog):
    """A hospital that sent its masked input and then went silent in the unmask stage is in the sum: the log
    names it as silent with its input counted, not as one of 0 "dropped"."""
    import logging

    # Prepare: six hospitals (t = 3); five answer the unmask stage, client 6 stays silent
    k = 6
    params = make_params(k)
    vectors = random_vectors(k, np.random.default_rng(2))
    server, clients = drive(params, vectors, upto=Stage.UNMASK)
    for u in (1, 2, 3, 4, 5):
        server.receive(relay(clients[u].unmask(relay(server.request(u)))))

    # Execute
    with caplog.at_level(logging.INFO, logger="secure_afl.secagg"):
        server.close_stage()

    # Assert
    assert ("[Stage 4] unmask closed: aggregate of 6 hospitals revealed (0 dropped before their masked input; "
            "1 silent in the unmask stage, their inputs counted: clients 6; 0 wrong shares discarded).") \
        in caplog.text
    assert server.aggregate_vector_ is not None
