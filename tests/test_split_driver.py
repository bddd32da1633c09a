"""``run_split``: every split role in memory (hospitals, server, key holder, collector), as the parties run them."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secure_afl import split
from secure_afl.cohort import ReleasePolicy
from secure_afl.exceptions import InsufficientContributors, InvalidInputError, InvalidSignature
from secure_afl.hazmat import flp
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.stats import local_statistics

LAYOUT = Layout(4, 3)
BOUNDS = Bounds(4.0, 60, 8)


def _vector(seed: int, n: int = 40) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, LAYOUT.dim))
    X *= BOUNDS.max_norm * 0.8 / np.linalg.norm(X, axis=1, keepdims=True)
    return LAYOUT.pack(local_statistics(X, np.arange(n) % LAYOUT.n_classes, LAYOUT.n_classes, gamma=1.0))


@pytest.fixture(scope="module")
def session():
    params = split.split_session_params("driver", LAYOUT, 1.0, BOUNDS)
    keys = split.generate_keys(params)
    return split.bind_public_context(params, keys.public_context), keys


def _counter_bytes(label: bytes):
    """A deterministic stand-in for os.urandom: the roles must take all their randomness from it."""
    state = {"i": 0}

    def draw(n: int) -> bytes:
        state["i"] += 1
        return hashlib.shake_256(label + state["i"].to_bytes(4, "big")).digest(n)
    return draw


def test_an_honest_round_releases_the_sum(session):
    params, keys = session
    vectors = [_vector(k) for k in range(3)]
    run = split.run_split(params, keys, vectors)
    assert run.verdicts == {"h1": None, "h2": None, "h3": None}
    assert run.share[1]["cohort"] == ["h1", "h2", "h3"] and run.share[1]["refused"] == {}
    tol = split.expected_abs_error(params, 3)
    assert float(np.max(np.abs(run.vector - np.sum(vectors, axis=0)))) <= tol


def test_a_cheater_is_refused_by_name_and_the_rest_released(session):
    params, keys = session
    vectors = {"h1": _vector(1), "h2": _vector(2)}
    circuit = split.Circuit(params)
    lanes = circuit.lanes(_vector(3)).copy()
    i = LAYOUT.slices["counts"].start
    lanes[i] = (-(1 << circuit.f1)) % flp.P  # a class count of -1: the bits wrap, the joint check fails
    ident = Ed25519PrivateKey.generate()
    body, seed, com = circuit.prove("h3", lanes=lanes, check=False)
    cheat = split.seal_upload(params, body, seed, com, keys.public_context, "h3", ident)
    # the session's policy lets one upload be refused (max_refusals = 1) and needs two to release
    policy = ReleasePolicy("driver", "split", ("h1", "h2", "h3"), min_clients=2, colluders=0, quorum=2,
                           max_refusals=1, min_class_count=1, deadline=None)
    run = split.run_split(params, keys, vectors, uploads={"h3": cheat}, identities={"h3": ident}, policy=policy)
    assert run.verdicts == {"h1": None, "h2": None, "h3": "linear"}
    assert run.share[1]["cohort"] == ["h1", "h2"] and run.share[1]["refused"] == {"h3": "linear"}
    # its evidence is the key holder's own message: with the server's signed one, anyone recomputes the verdict
    ev = run.share[1]["evidence"]["h3"]
    sha = hashlib.sha256(cheat[0]).hexdigest()
    assert split.joint_verdict(params, "h3", sha, run.server_messages["h3"], ev["keyholder_message"],
                               run.server_pub) == "linear"
    tol = split.expected_abs_error(params, 2)
    assert float(np.max(np.abs(run.vector - vectors["h1"] - vectors["h2"]))) <= tol


def _cheat(params, keys, hospital: str):
    circuit = split.Circuit(params)
    lanes = circuit.lanes(_vector(3)).copy()
    lanes[LAYOUT.slices["counts"].start] = (-(1 << circuit.f1)) % flp.P
    ident = Ed25519PrivateKey.generate()
    body, seed, com = circuit.prove(hospital, lanes=lanes, check=False)
    return split.seal_upload(params, body, seed, com, keys.public_context, hospital, ident), ident


def test_the_release_policy_of_the_session_applies_as_the_parties_apply_it(session):
    # Prepare: two honest uploads and a cheater; the session's default policy over three hospitals tolerates no
    # refusal (max_refusals = colluders = 0), and a quorum of 2
    params, keys = session
    cheat, ident = _cheat(params, keys, "h3")
    vectors = {"h1": _vector(1), "h2": _vector(2)}
    # Execute / Assert: the refusal passes the signed limit: nothing is released, naming the limit
    with pytest.raises(InsufficientContributors, match="max_refusals"):
        split.run_split(params, keys, vectors, uploads={"h3": cheat}, identities={"h3": ident})
    # a policy allowing one refusal but needing three contributors: the cohort of two is below the quorum
    strict = ReleasePolicy("driver", "split", ("h1", "h2", "h3"), min_clients=3, colluders=0, quorum=3,
                           max_refusals=1, min_class_count=1, deadline=None)
    with pytest.raises(InsufficientContributors, match="quorum"):
        split.run_split(params, keys, vectors, uploads={"h3": cheat}, identities={"h3": ident}, policy=strict)
    # one hospital alone, under a roster of three: below the quorum of two (no release over whatever remains)
    with pytest.raises(InsufficientContributors, match="quorum"):
        split.run_split(params, keys, {"h1": _vector(1)}, policy=split.default_policy(params, ["h1", "h2", "h3"]))


def test_the_key_holder_forms_the_release_from_the_servers_signed_sum_of_its_cohort(session):
    params, keys = session
    run = split.run_split(params, keys, [_vector(k) for k in range(2)])
    masked, signed = run.masked_sum
    # the sum is the server's word over exactly the key holder's statement: another statement's is refused
    split.verify_masked_sum(params, run.share[1], masked, signed, run.server_pub)
    other = {**run.share[1], "cohort": ["h1"]}
    with pytest.raises(InvalidSignature, match="another share statement"):
        split.verify_masked_sum(params, other, masked, signed, run.server_pub)


def test_a_server_message_changed_after_signing_stops_the_key_holder(session):
    params, keys = session

    def tamper(h, msg):
        words = flp.from_bytes(bytes.fromhex(msg["message"]))
        words[0] = flp.add(words[:1], np.uint64(1))[0]
        return {**msg, "message": flp.to_bytes(words).hex()}

    with pytest.raises(InvalidSignature):
        split.run_split(params, keys, [_vector(4)], tamper=tamper)


def test_the_roles_draw_no_randomness_of_their_own(session):
    params, keys = session
    idents = {"h1": Ed25519PrivateKey.from_private_bytes(bytes(32))}
    a = split.run_split(params, keys, [_vector(5)], identities=idents, randbytes=_counter_bytes(b"r"))
    b = split.run_split(params, keys, [_vector(5)], identities=idents, randbytes=_counter_bytes(b"r"))
    c = split.run_split(params, keys, [_vector(5)], identities=idents, randbytes=_counter_bytes(b"other"))
    # the same randomness gives the same payload and commitment (the HPKE box alone is sealed afresh)
    assert a.uploads["h1"][0] == b.uploads["h1"][0] != c.uploads["h1"][0]
    assert a.uploads["h1"][1]["validity"] == b.uploads["h1"][1]["validity"]
    assert a.uploads["h1"][1]["box"] != b.uploads["h1"][1]["box"]


def test_a_proving_try_takes_exactly_its_randomness(session):
    params, _ = session
    c = split.Circuit(params)
    x, fw = c.witness(_vector(6))
    with pytest.raises(InvalidInputError, match="randomness"):
        c.prove_once("h1", x, fw, bytes(c.rand_size - 1))
