"""``run_split``: every split role in memory (hospitals, server, key holder, collector), as the parties run them."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secure_afl import split
from secure_afl.exceptions import InvalidInputError, InvalidSignature
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
    run = split.run_split(params, keys, vectors, uploads={"h3": cheat}, identities={"h3": ident})
    assert run.verdicts == {"h1": None, "h2": None, "h3": "linear"}
    assert run.share[1]["cohort"] == ["h1", "h2"] and run.share[1]["refused"] == {"h3": "linear"}
    # its evidence is the key holder's own message: with the server's signed one, anyone recomputes the verdict
    ev = run.share[1]["evidence"]["h3"]
    sha = hashlib.sha256(cheat[0]).hexdigest()
    assert split.joint_verdict(params, "h3", sha, run.server_messages["h3"], ev["keyholder_message"],
                               run.server_pub) == "linear"
    tol = split.expected_abs_error(params, 2)
    assert float(np.max(np.abs(run.vector - vectors["h1"] - vectors["h2"]))) <= tol


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
