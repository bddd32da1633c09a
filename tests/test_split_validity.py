"""split's validity proof: the Goldilocks field, the bit FLP, the validity circuit, and refusal through the service.

Field and proof code is checked against an independent Python-integer
reference (tests/support/flp_reference.py) and the vectors in vectors/flp.json.
The circuit tests run the protocol functions the server and the key holder run
(the server's signed message, the key holder's verdict on its own share); the
e2e tests drive real server processes as a malicious hospital would.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secure_afl import split
from secure_afl.backends import get_backend
from secure_afl.exceptions import BoundsExceeded, InvalidInputError, InvalidSignature, MalformedPayload, \
    SecureAFLError
from secure_afl.hazmat import flp, ternary
from secure_afl.split.sizes import LINEAR_REPS
from secure_afl.workers import WorkerPool
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.stats import local_statistics

from support import flp_reference as ref
from support.split_cheat import keeping_honest_bits

VECTORS = json.loads((Path(__file__).resolve().parent.parent / "vectors" / "flp.json").read_text())
P = flp.P
LAYOUT = Layout(6, 3)
BOUNDS = Bounds(4.0, 50, 8)
GAMMA = 1.0
#: what this file tests: the statement without the Gram part, over Goldilocks (two lanes per value), signed
#: explicitly since the default session is the Gram statement in Field128
GOLDILOCKS_PLAIN = {"field": "goldilocks", "gram_proof": False}


def _params(*args, **kw):
    return split.split_session_params(*args, **{**GOLDILOCKS_PLAIN, **kw})


def _arr(xs):
    return np.array([int(x) for x in xs], dtype=np.uint64)


def _ints(a):
    return [int(x) for x in np.asarray(a).reshape(-1)]


# -- field ------------------------------------------------------------------------------------------------
def test_field_matches_the_vectors():
    rows = VECTORS["field"]
    a, b = _arr([r["a"] for r in rows]), _arr([r["b"] for r in rows])
    assert VECTORS["p"] == P
    assert _ints(flp.add(a, b)) == [r["sum"] for r in rows]
    assert _ints(flp.sub(a, b)) == [r["difference"] for r in rows]
    assert _ints(flp.mul(a, b)) == [r["product"] for r in rows]


@pytest.fixture(params=["numpy", "compiled"])
def field_product(request, monkeypatch):
    """flp.mul as numpy computes it, and as a verifier that loaded the compiled kernels does (flp.mul_into)."""
    if request.param == "compiled":
        if not ternary.AVAILABLE:
            pytest.skip("numba is not installed")
        monkeypatch.setattr(flp, "_compiled_mul", ternary.product_kernel())
    else:
        monkeypatch.setattr(flp, "_compiled_mul", None)
    return request.param


def test_field_arithmetic_agrees_with_python_integers_on_random_and_edge_values(field_product):
    rng = random.Random(5)
    edge = [0, 1, 2, P - 1, P - 2, 2 ** 32 - 1, 2 ** 32, 2 ** 32 + 1, 2 ** 63, P // 2, P // 2 + 1, 2 ** 64 - 2 ** 32]
    xs = edge * len(edge) + [rng.randrange(P) for _ in range(3000)]
    ys = [e for e in edge for _ in edge] + [rng.randrange(P) for _ in range(3000)]
    a, b = _arr(xs), _arr(ys)
    assert _ints(flp.mul(a, b)) == [x * y % P for x, y in zip(xs, ys)]
    assert _ints(flp.add(a, b)) == [(x + y) % P for x, y in zip(xs, ys)]
    assert _ints(flp.sub(a, b)) == [(x - y) % P for x, y in zip(xs, ys)]
    assert _ints(flp.neg(a)) == [-x % P for x in xs]
    assert flp.sum_mod(a) == sum(xs) % P and flp.dot(a, b) == sum(x * y for x, y in zip(xs, ys)) % P
    m = a[:3000].reshape(60, 50)
    assert _ints(flp.sum_mod(m, axis=0)) == [sum(xs[i * 50 + j] for i in range(60)) % P for j in range(50)]
    assert _ints(flp.powers(xs[-1], 20, start=3)) == [pow(xs[-1], 3 + i, P) for i in range(20)]
    # broadcast as the verifiers' queries use it: a (G, c) block times a column, and a vector times a scalar
    col = a[3000:3060].reshape(60, 1)
    assert _ints(flp.mul(m, col)) == [xs[i * 50 + j] * xs[3000 + i] % P for i in range(60) for j in range(50)]
    assert _ints(flp.mul(a, np.uint64(ys[7]))) == [x * ys[7] % P for x in xs]


def test_the_compiled_product_is_the_interpreted_loop_and_numpy():
    # flp.mul_into is the source numba compiles: run as plain Python it must give numpy's products too
    rng = random.Random(8)
    xs = [0, 1, P - 1, 2 ** 63, 2 ** 32 - 1, 2 ** 32] + [rng.randrange(P) for _ in range(300)]
    ys = [P - 1, P - 1, P - 1, 2 ** 63, 2 ** 32 + 1, 2 ** 32] + [rng.randrange(P) for _ in range(300)]
    out = np.zeros(len(xs), dtype=np.uint64)
    with np.errstate(over="ignore"):
        flp.mul_into(_arr(xs), _arr(ys), out)
    assert _ints(out) == [x * y % P for x, y in zip(xs, ys)]


def test_signed_encoding_round_trips_on_the_centred_range():
    half = (P - 1) // 2
    z = np.array([0, 1, -1, 2 ** 62, -(2 ** 62), half, -half], dtype=np.int64)
    f = flp.encode_signed(z)
    assert _ints(f) == [int(v) % P for v in z]
    assert np.array_equal(flp.decode_signed(f), z)
    # past the centred range the value would wrap to the other representative: refused (tests/test_flp_signed.py)
    with pytest.raises(BoundsExceeded):
        flp.encode_signed(np.array([half + 1], dtype=np.int64))


def test_roots_of_unity_and_ntt():
    w = flp.root_of_unity(1 << 32)
    assert pow(w, 1 << 32, P) == 1 and pow(w, 1 << 31, P) == P - 1
    v = VECTORS["ntt"]
    assert flp.root_of_unity(8) == v["root"]
    assert _ints(flp.ntt(_arr(v["input"]))) == v["output"]
    rng = random.Random(9)
    for n in (2, 4, 32, 256):
        x = [rng.randrange(P) for _ in range(n)]
        assert _ints(flp.ntt(_arr(x))) == ref.dft(x, ref.root(n))
        assert _ints(flp.intt(flp.ntt(_arr(x)))) == x
    with pytest.raises(InvalidInputError):
        flp.root_of_unity(12)


def test_field_bytes_refuse_non_elements_and_expansion_is_uniform_below_p():
    assert _ints(flp.from_bytes(flp.to_bytes(_arr([0, P - 1])))) == [0, P - 1]
    for bad in ((P).to_bytes(8, "little"), (2 ** 64 - 1).to_bytes(8, "little"), b"\x00" * 7):
        with pytest.raises(MalformedPayload):
            flp.from_bytes(bad)
    e = VECTORS["expand_field"]
    key = bytes.fromhex(e["key_hex"])
    got = flp.expand_field(key, 5000, e["domain"].encode())
    assert _ints(got[:len(e["first"])]) == e["first"]
    assert int(got.max()) < P and _ints(flp.expand_field(key, 7, e["domain"].encode())) == _ints(got[:7])


# -- the bit proof ------------------------------------------------------------------------------------------
def _shares(x, rng):
    r = flp.to_field([rng.randrange(P) for _ in range(len(x))])
    return flp.sub(x, r), r


def _run_bitproof(bp, bits, proof, jr, t, rng):
    b0, b1 = _shares(bits, rng)
    p0, p1 = _shares(proof, rng)
    return bp.decide(flp.add(bp.query(b0, p0, jr, t, leader=True), bp.query(b1, p1, jr, t, leader=False)))


def test_bit_proof_matches_the_reference_and_the_vector():
    v = VECTORS["bit_proof"]
    bp = flp.BitProof(len(v["bits"]), chunk=v["chunk"])
    assert _ints(bp.prove(_arr(v["bits"]), v["joint_rand"], _arr(v["seeds"]))) == v["proof"]
    rng = random.Random(3)
    for m, c in ((1, 1), (9, 2), (40, 7), (300, 17)):
        bits = [rng.randrange(2) for _ in range(m)]
        seeds = [rng.randrange(P) for _ in range(2 * c)]
        jr = rng.randrange(P)
        assert _ints(flp.BitProof(m, chunk=c).prove(_arr(bits), jr, _arr(seeds))) == ref.bit_proof(bits, jr, seeds, c)


def test_repeated_proofs_equal_the_reference_one_by_one():
    # prove_reps shares the V wires' coset values across repetitions: each proof must still be the one
    # the reference builds for its own joint randomness and seeds
    rng = random.Random(23)
    for m, c in ((1, 1), (40, 7), (300, 17)):
        bits = [rng.randrange(2) for _ in range(m)]
        jrs = [rng.randrange(P) for _ in range(3)]
        seeds = [[rng.randrange(P) for _ in range(2 * c)] for _ in jrs]
        got = flp.BitProof(m, chunk=c).prove_reps(_arr(bits), jrs, [_arr(s) for s in seeds])
        assert [_ints(g) for g in got] == [ref.bit_proof(bits, jr, s, c) for jr, s in zip(jrs, seeds)]


@pytest.mark.parametrize("m", [1, 7, 500, 20000])
def test_bit_proof_accepts_bits_and_refuses_any_single_non_bit(m):
    rng = random.Random(m)
    bp = flp.BitProof(m)
    bits = _arr([rng.randrange(2) for _ in range(m)])
    seeds = flp.to_field([rng.randrange(P) for _ in range(2 * bp.chunk)])
    jr, t = rng.randrange(P), rng.randrange(P)
    assert _run_bitproof(bp, bits, bp.prove(bits, jr, seeds), jr, t, rng)
    for bad in (2, P - 1, rng.randrange(P)):
        forged = bits.copy()
        forged[rng.randrange(m)] = bad
        assert not _run_bitproof(bp, forged, bp.prove(forged, jr, seeds), jr, t, rng)


def test_bit_proof_refuses_a_tampered_proof_and_another_joint_randomness():
    rng = random.Random(11)
    bp = flp.BitProof(300)
    bits = _arr([rng.randrange(2) for _ in range(300)])
    jr, t = rng.randrange(P), rng.randrange(P)
    proof = bp.prove(bits, jr, flp.to_field([rng.randrange(P) for _ in range(2 * bp.chunk)]))
    for i in (0, 2 * bp.chunk, bp.proof_len - 1, rng.randrange(bp.proof_len)):
        tampered = proof.copy()
        tampered[i] = (int(tampered[i]) + 1) % P
        assert not _run_bitproof(bp, bits, tampered, jr, t, rng)
    # a non-bit with the proof made for joint randomness r, checked at r + 1 (the prover cannot pick r)
    forged = bits.copy()
    forged[5] = 3
    assert not _run_bitproof(bp, forged, bp.prove(forged, jr, flp.to_field([1] * 2 * bp.chunk)), jr + 1, t, rng)


def test_bit_proof_refuses_a_query_point_on_the_domain():
    bp = flp.BitProof(100)
    with pytest.raises(InvalidInputError, match="domain"):
        bp.query(np.zeros(100, dtype=np.uint64), np.zeros(bp.proof_len, dtype=np.uint64), 5,
                 flp.root_of_unity(bp.n), leader=True)


# -- the validity circuit, through the server's and the key holder's protocol functions --------------------
@pytest.fixture(scope="module")
def session():
    """(params, backend, the server's identity key, the key holder's public seed key)."""
    params = _params("validity-unit", LAYOUT, GAMMA, BOUNDS)
    keys = split.generate_keys(params)
    params = split.bind_public_context(params, keys.public_context)
    return params, get_backend(params), Ed25519PrivateKey.generate(), keys.public_context


def _stats_vector(n=BOUNDS.n_max, labels=(0, 1), norm=1.0, seed=0):
    """Packed statistics of n rows of norm ``norm * B`` (the edge: n = n_max, trace = n B^2, a class of 0)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, LAYOUT.dim))
    X *= BOUNDS.max_norm * norm / np.linalg.norm(X, axis=1, keepdims=True)
    y = np.array([labels[i % len(labels)] for i in range(n)])
    return LAYOUT.pack(local_statistics(X, y, LAYOUT.n_classes, gamma=GAMMA))


def _verdict(session, body, seed, commitment, hospital="h1", *, tamper=None):
    """Server's signed message on its share, key holder's verdict on the seed's share (the release path)."""
    params, be, server_key, public = session
    payload, st = be.seal_upload(body, seed, commitment, public, hospital, Ed25519PrivateKey.generate())
    split.check_upload(be.circuit, payload, st)
    sha = hashlib.sha256(payload).hexdigest()
    expected = split.query_seed(os.urandom(32), params, hospital, sha, st["validity"])
    msg = split.leader_message(be.circuit, hospital, payload, st, server_key, expected)
    if tamper is not None:
        msg = tamper(msg)
    qs, leader = split.verify_leader_message(msg, server_key.public_key(), be.circuit, hospital, sha,
                                                      expected)
    return split.helper_verdict(be.circuit, hospital, seed, st, qs, leader)


@pytest.mark.parametrize("chunk", [None, 64, "compiled"])
def test_projection_matches_the_reference_on_edge_values(session, monkeypatch, chunk):
    # chunk 64: the float32 sums are cut into many chunks, as for lanes longer than 2^20 entries; "compiled":
    # the numba kernel (secure_afl.hazmat.ternary), the others the numpy path
    from secure_afl.hazmat import ternary

    if chunk == "compiled" and not ternary.AVAILABLE:
        pytest.skip("numba is not installed")
    monkeypatch.setattr(split.projection, "_COMPILED", chunk == "compiled")
    monkeypatch.setattr(ternary, "WARM_CALLS", -1 if chunk == "compiled" else 1 << 60)
    if isinstance(chunk, int):
        monkeypatch.setattr(split.projection, "_PROJ_CHUNK", chunk)
    rng = random.Random(17)
    for dim in (6, 40):
        params = _params(f"proj-{dim}", Layout(dim, 5), GAMMA, BOUNDS)
        c = split.Circuit(params)
        edge = [0, 1, P - 1, P // 2, P // 2 + 1, 2 ** 63, 2 ** 64 - 2 ** 32, 15, 16, 2 ** 60 + 7]
        hi = [edge[i] if i < len(edge) else rng.randrange(P) for i in range(c.L)]
        lanes = _arr(hi + [rng.randrange(P) for _ in range(c.L)])
        fs = bytes(rng.randrange(256) for _ in range(32))
        assert _ints(c.project(lanes, fs)) == ref.projection(hi, fs, split.ROWS)


def test_a_negative_diagonal_entry_within_the_trace_and_entry_bounds_is_not_refused(session):
    # The statement bounds the trace and every entry, not each diagonal entry's sign (docs/VALIDITY.md, "What
    # the statement leaves out"): moving weight from C_00 to C_11 so that C_00 < 0 keeps every relation true.
    c = session[1].circuit
    lanes = c.lanes(_stats_vector(n=40)).copy()
    r, col = np.triu_indices(LAYOUT.dim)
    d0, d1 = np.nonzero(r == col)[0][:2]
    shift = int(flp.decode_signed(lanes[d0:d0 + 1])[0]) + (1 << c.f1)  # C_00 becomes -1
    _set(lanes, c, d0, int(flp.decode_signed(lanes[d0:d0 + 1])[0]) - shift)
    _set(lanes, c, d1, int(flp.decode_signed(lanes[d1:d1 + 1])[0]) + shift)
    with pytest.raises(BoundsExceeded):  # the honest prover still refuses such statistics of its own
        c.prove("h1", lanes=lanes)
    assert _verdict(session, *c.prove("h1", lanes=lanes, check=False)) is None


def test_both_verifiers_in_worker_processes_decide_and_sum_as_one_process_does(tmp_path):
    # The release's verdicts run in spawned worker processes once there are enough uploads: the server's
    # messages (read from the payload files) and the key holder's verdicts and share must be those of one
    # process, a cheater refused by name either way.
    params = _params("procs", LAYOUT, GAMMA, BOUNDS)
    keys = split.generate_keys(params)
    params = split.bind_public_context(params, keys.public_context)
    be = get_backend(params)
    server_key = Ed25519PrivateKey.generate()
    uploads, manifest, statements, enrolled = [], {"participants": []}, {}, {}
    for k in range(5):
        h, ident = f"h{k}", Ed25519PrivateKey.generate()
        lanes = be.circuit.lanes(_stats_vector(n=20, seed=k)).copy()
        if k == 3:  # two contributors in one upload
            _set(lanes, be.circuit, LAYOUT.slices["contributors"].start, 2 << be.circuit.f1)
        payload, st = be.seal_upload(*be.circuit.prove(h, lanes=lanes, check=False), keys.public_context, h, ident)
        sha = hashlib.sha256(payload).hexdigest()
        (tmp_path / sha).write_bytes(payload)
        qs = split.query_seed(split.query_key(keys.secret_context), params, h, sha, st["validity"])
        uploads.append((h, tmp_path / sha, sha, st, qs))
        manifest["participants"].append({"hospital": h, "payload_sha256": sha})
        statements[h], enrolled[h] = st, ident.public_key()
    results = []
    workers = WorkerPool(2, warm=ternary.warm)  # as a verifier's: the compiled projection in each worker
    workers.start()
    for pool in (None, workers):
        msgs = split.leader_messages(params, uploads, server_key, pool=pool)
        items = [(h, split.open_statement_seed(params, keys.secret_context, statements, enrolled, h, sha),
                  st["validity"], qs,
                  split.verify_leader_message(msgs[h], server_key.public_key(), be.circuit, h, sha, qs)[1])
                 for h, _, sha, st, qs in uploads]
        verdicts, judged_sum = split.keyholder_verdicts(params, items, pool=pool)
        refused = {h: v for h, v in verdicts.items() if v}
        share = split.keyholder_share(params, keys.secret_context, manifest, statements, enrolled, refused=refused,
                                      sum_masks=split.pool.lane_masks(params, pool))
        assert np.array_equal(share, judged_sum)  # the running sum of the judged uploads is the cohort's share
        results.append((share, refused))
    (one, refused_one), (two, refused_two) = results
    assert refused_one == refused_two == {"h3": "linear"} and np.array_equal(one, two)
    # a payload file that is not the manifest's upload (another hospital's, well formed) is refused by the
    # worker that reads it, before a message is formed over the wrong words
    (tmp_path / uploads[0][2]).write_bytes((tmp_path / uploads[1][2]).read_bytes())
    with pytest.raises(MalformedPayload, match="h0"):
        split.leader_messages(params, uploads, server_key, pool=pool)
    assert pool.started
    pool.close()


def test_a_free_low_lane_is_accepted_and_moves_the_release_by_less_than_its_bound():
    # The low lane is not range-proven: whatever a hospital puts there, the collector reads the low-lane sum
    # through its centred representative, so the release moves by less than 2^(63 - f1 - f2) per entry and
    # n, the counts and the contributors (whose low lanes the proof pins to 0) stay exact.
    params = _params("free-lo", LAYOUT, GAMMA, BOUNDS)
    keys = split.generate_keys(params)
    params = split.bind_public_context(params, keys.public_context)
    be, c = get_backend(params), None
    c = be.circuit
    f1, f2 = c.f1, c.f2
    server_key = Ed25519PrivateKey.generate()
    vectors = [_stats_vector(n=30, seed=s) for s in range(3)]
    acc, manifest, statements, enrolled = be.combiner(), {"participants": []}, {}, {}
    for k, v in enumerate(vectors):
        hospital, ident = f"h{k}", Ed25519PrivateKey.generate()
        lanes = c.lanes(v).copy()
        if k == 2:  # every Gram and cross entry's low lane at +-2^62: far past any honest value
            for i in range(LAYOUT.slices["n"].start):
                _set(lanes, c, i, (1 << 62) * (-1) ** i, lane=1)
        body, seed, commitment = c.prove(hospital, lanes=lanes)
        payload, st = be.seal_upload(body, seed, commitment, keys.public_context, hospital, ident)
        split.check_upload(be.circuit, payload, st)
        sha = hashlib.sha256(payload).hexdigest()
        expected = split.query_seed(os.urandom(32), params, hospital, sha, st["validity"])
        msg = split.leader_message(be.circuit, hospital, payload, st, server_key, expected)
        qs, leader = split.verify_leader_message(msg, server_key.public_key(), c, hospital, sha, expected)
        assert split.helper_verdict(c, hospital, seed, st, qs, leader) is None
        acc.add(payload)
        manifest["participants"].append({"hospital": hospital, "payload_sha256": hashlib.sha256(payload).hexdigest()})
        statements[hospital], enrolled[hospital] = st, ident.public_key()
    share = split.keyholder_share(params, keys.secret_context, manifest, statements, enrolled)
    released = be.reveal(acc.aggregate(), share=share)
    moved = np.abs(released - np.sum(vectors, axis=0))
    exact = slice(LAYOUT.slices["n"].start, LAYOUT.length)
    assert 0 < float(moved.max()) < 2.0 ** (63 - f1 - f2) and not moved[exact].any()


def _honest(session, v, hospital="h1"):
    be = session[1]
    return be.circuit.prove(hospital, v)


def test_honest_uploads_at_the_bounds_edges_are_accepted(session):
    # n = n_max, every row of norm exactly B (trace = n B^2 + d gamma), one class with count 0, all in one class
    for v in (_stats_vector(), _stats_vector(labels=(2,)), _stats_vector(n=1, labels=(0,), norm=0.999)):
        assert _verdict(session, *_honest(session, v)) is None


def _lanes_with(session, v, edit):
    lanes = session[1].circuit.lanes(v).copy()
    edit(lanes, session[1].circuit)
    return lanes


def _cheat(session, lanes, hospital="h1"):
    return session[1].circuit.prove(hospital, lanes=lanes, check=False)


def test_the_honest_prover_refuses_statistics_outside_the_bounds(session):
    v = _stats_vector()
    v[LAYOUT.slices["counts"].start] = -1.0
    with pytest.raises(BoundsExceeded):
        _honest(session, v)


def _set(lanes, c, i, value, lane=0):
    lanes[lane * c.L + i] = int(value) % P


@pytest.mark.parametrize("violation", ["count_minus_one", "non_integer_n", "n_above_n_max", "trace_too_large",
                                       "gram_entry_too_large", "cross_entry_too_large",
                                       "two_contributors", "tag_slot_used", "count_fraction_in_lo_lane",
                                       "counts_do_not_sum_to_n"])
def test_each_bound_violated_alone_is_refused(session, violation):
    c = session[1].circuit
    sl = LAYOUT.slices
    v = _stats_vector(n=40)
    honest = c.lanes(v)
    f1 = 1 << c.f1
    smart = ()
    if violation == "trace_too_large":  # one row of norm 1.05 B among rows of norm B: every entry stays small
        X = np.random.default_rng(1).normal(size=(40, LAYOUT.dim))
        X *= BOUNDS.max_norm / np.linalg.norm(X, axis=1, keepdims=True)
        honest = c.lanes(LAYOUT.pack(local_statistics(X, np.arange(40) % 2, LAYOUT.n_classes, gamma=GAMMA)))
        X[0] *= 1.05
        lanes = c.lanes(LAYOUT.pack(local_statistics(X, np.arange(40) % 2, LAYOUT.n_classes, gamma=GAMMA)))
        smart = ("slack",)  # the honest Gram's slack bits: every other relation holds
    else:
        def edit(lanes, c):
            i_n, i_c = sl["n"].start, sl["counts"].start
            if violation == "count_minus_one":  # class 2 gets -1, class 0 one more: the sum is still n
                _set(lanes, c, i_c + 2, -f1)
                _set(lanes, c, i_c, int(flp.decode_signed(lanes[i_c:i_c + 1])[0]) + f1)
            elif violation == "non_integer_n":  # n + 1/2, the counts unchanged
                _set(lanes, c, i_n, int(flp.decode_signed(lanes[i_n:i_n + 1])[0]) + f1 // 2)
            elif violation == "n_above_n_max":  # n = n_max + 1 with class 0 carrying the extra sample
                for i in (i_n, i_c):
                    _set(lanes, c, i, int(flp.decode_signed(lanes[i:i + 1])[0]) + (BOUNDS.n_max - 40 + 1) * f1)
            elif violation == "gram_entry_too_large":  # an off-diagonal Gram entry at 2^60 (about 1e12 here x 2^f1)
                _set(lanes, c, 1, 1 << 60)
            elif violation == "cross_entry_too_large":
                _set(lanes, c, sl["cross"].start + 4, -(1 << 61))
            elif violation == "two_contributors":
                _set(lanes, c, sl["contributors"].start, 2 * f1)
            elif violation == "tag_slot_used":
                _set(lanes, c, sl["tag"].start, 12345)
            elif violation == "count_fraction_in_lo_lane":  # class 0 = its count + 2^-(f1+f2), n likewise
                _set(lanes, c, i_c, 1, lane=1)
                _set(lanes, c, i_n, 1, lane=1)
            elif violation == "counts_do_not_sum_to_n":  # class 0 one more, n unchanged
                _set(lanes, c, i_c, int(flp.decode_signed(lanes[i_c:i_c + 1])[0]) + f1)
        lanes = _lanes_with(session, v, edit)
        if violation == "count_minus_one":
            smart = ("counts",)  # count bits of the honest counts: they sum to n
    cheat = keeping_honest_bits(honest, smart) if smart else None
    body = c.prove("h1", lanes=lanes, check=False, aux_override=cheat)
    assert _verdict(session, *body) == "linear"


def test_each_random_combination_of_the_relations_refuses_on_its_own(session):
    # Prepare: an upload that breaks one linear relation (n + 1/2), and both verifiers' real messages on it
    c = session[1].circuit
    i_n = LAYOUT.slices["n"].start

    def edit(lanes, c):
        _set(lanes, c, i_n, int(flp.decode_signed(lanes[i_n:i_n + 1])[0]) + (1 << c.f1) // 2)

    body, seed, com = _cheat(session, _lanes_with(session, _stats_vector(n=40), edit))
    qs = os.urandom(32)
    lead = c.query(c.leader_share(body), com, "h1", qs, leader=True)
    help_ = c.query(c.helper_share(seed), com, "h1", qs, leader=False)
    total = flp.add(lead, help_)
    assert all(int(total[j]) != 0 for j in range(LINEAR_REPS))
    # Act / Assert: each combination vanishing on its own (probability 1/p each, the case the repetition is for)
    # leaves the other to refuse the upload
    for j in range(LINEAR_REPS):
        moved = lead.copy()
        moved[j] = flp.sub(moved[j:j + 1], total[j:j + 1])[0]
        assert int(flp.add(moved, help_)[j]) == 0
        assert c.decide(moved, help_) == "linear"


def test_a_non_bit_that_satisfies_every_linear_relation_is_refused_by_the_bit_proof(session):
    c = session[1].circuit
    i_c = LAYOUT.slices["counts"].start

    def edit(lanes, c):  # class 2 = -1 and class 0 + 1, "bits" of -1 = (p - 1, 0, ...)
        _set(lanes, c, i_c + 2, -(1 << c.f1))
        _set(lanes, c, i_c, int(flp.decode_signed(lanes[i_c:i_c + 1])[0]) + (1 << c.f1))

    lanes = _lanes_with(session, _stats_vector(n=40), edit)

    def aux(circuit, x, fs):
        off, _, width = circuit.offsets["counts"]
        b = circuit.aux_bits(x, fs)  # the decomposition, unchecked: what modified software starts from
        b[off + 2 * width:off + 3 * width] = 0
        b[off + 2 * width] = P - 1
        return b

    assert _verdict(session, *c.prove("h1", lanes=lanes, check=False, aux_override=aux)) == "bits"


def test_a_statement_whose_seed_commitment_is_not_of_the_sealed_seed_is_refused(session):
    body, seed, com = _honest(session, _stats_vector())
    other = split.UploadCommitment(com.main_sha256, com.aux_sha256, split.seed_digest(b"x" * 32))
    assert _verdict(session, body, seed, other) == "commitment"


def test_tampered_proof_is_refused(session):
    be = session[1]
    body, seed, com = _honest(session, _stats_vector())
    for i in (be.circuit.main_len + be.circuit.n_bits, be.circuit.total - 1):
        t = body.copy()
        t[i] = (int(t[i]) + 1) % P
        assert _verdict(session, t, seed, com) == "bits"


def test_a_proof_replayed_on_another_upload_is_refused(session):
    be = session[1]
    c = be.circuit
    body1, seed1, com1 = _honest(session, _stats_vector(seed=1))
    # the same body and seed presented as another hospital's (Fiat-Shamir binds the hospital)
    assert _verdict(session, body1, seed1, com1, hospital="h2") is not None
    # upload 1's bits and proofs grafted onto upload 2's vector (same seed, so the masks line up)
    x2 = c.lanes(_stats_vector(n=30, seed=2))
    mask = flp.expand_field(seed1, c.total, split.DOMAIN_SHARE)
    graft = body1.copy()
    graft[:c.main_len] = flp.add(x2, mask[:c.main_len])
    com = split.UploadCommitment(hashlib.sha256(flp.to_bytes(graft[:c.main_len])).hexdigest(),
                                          com1.aux_sha256, com1.seed_sha256)
    assert _verdict(session, graft, seed1, com) is not None
    # a commitment that is not of the uploaded words is refused at the upload
    with pytest.raises(MalformedPayload):
        _verdict(session, graft, seed1, com1)


def test_a_forged_or_replayed_server_verifier_message_is_refused(session):
    be = session[1]
    body, seed, com = _honest(session, _stats_vector())
    other_body, other_seed, other_com = _honest(session, _stats_vector(seed=4))

    def flip(msg):
        raw = bytearray(bytes.fromhex(msg["message"]))
        raw[0] ^= 1
        return {**msg, "message": raw.hex()}

    def unsigned(msg):
        return {k: v for k, v in msg.items() if k != "signature"}

    def resigned_by_another(msg):  # the right statement, signed by a key that is not the server's
        return {**msg, "signature": Ed25519PrivateKey.generate().sign(b"x").hex()}

    for tamper in (flip, unsigned, resigned_by_another):
        with pytest.raises(InvalidSignature):
            _verdict(session, body, seed, com, tamper=tamper)
    # replayed: the server's genuine signed message for another upload (at that upload's query seed)
    replay = split.leader_message(be.circuit, "h1", _payload_of(session, other_body, other_seed, other_com),
                                           {"validity": other_com.to_dict()}, session[2], os.urandom(32))
    with pytest.raises(InvalidSignature):
        _verdict(session, body, seed, com, tamper=lambda _: replay)
    # formed before the key holder's query existed: this very upload, signed, at a query seed of the server's
    # own choosing (what the server did when it drew the seed itself)
    own = {}

    def at_own_seed(_):
        own["msg"] = split.leader_message(be.circuit, "h1", own["payload"], own["st"], session[2], os.urandom(32))
        return own["msg"]

    params, _, server_key, public = session
    own["payload"], own["st"] = be.seal_upload(body, seed, com, public, "h1", Ed25519PrivateKey.generate())
    with pytest.raises(InvalidSignature, match="query seed"):
        _verdict(session, body, seed, com, tamper=at_own_seed)


def _payload_of(session, body, seed, com):
    return session[1].seal_upload(body, seed, com, session[3], "h1", Ed25519PrivateKey.generate())[0]


def test_soundness_and_sizes_are_stated_for_the_session(session):
    d = split.describe(session[1].circuit)
    assert d["soundness_bits_q64"] >= 64.0
    assert d["proof_words"] + d["aux_bits"] > 0 and d["main_words"] == 2 * LAYOUT.length


def test_choose_frac_bits_keeps_k_max_proven_uploads_below_the_wrap_bound(session):
    params = session[0]
    c = session[1].circuit
    assert params.bounds.k_max * (1 << c.sizes["m_hi"]) < 1 << split.WRAP_BITS
    assert params.bounds.k_max * (1 << (c.f2 - 1)) < 1 << split.WRAP_BITS  # honest low lanes
    assert split.proven_aggregate_bound(params) < 2.0 ** 63 / 2.0 ** c.f1
    # the trace relation sums the diagonal entries unbounded but for 2T each: at d = 512 that is what sets f1
    for circuit in (c, split.Circuit(_params("wide", Layout(512, 100), GAMMA,
                                                                         Bounds(1.0, 1000, 10)))):
        worst = circuit.d * 2 * circuit.T + circuit.sizes["slack_max"] + (1 << circuit.sizes["m_s"])
        assert worst < 1 << split.WRAP_BITS


def test_query_seed_must_be_32_bytes(session):
    c = session[1].circuit
    body, seed, com = _honest(session, _stats_vector())
    with pytest.raises(MalformedPayload):
        c.query(c.leader_share(body), com, "h1", os.urandom(16), leader=True)


# -- e2e: a malicious hospital through the real service --------------------------------------------------------
def _start(consortium, hospitals=("h1", "h2", "h3"), min_clients=2, k_max=8, max_refusals=1):
    # one refusal allowed: the cohort left (2 of 3) still meets the quorum of c = 0
    c = consortium(backend="split", hospitals=hospitals, min_clients=min_clients, k_max=k_max,
                   extra_session={"max_refusals": max_refusals, "colluders": 0}, split=GOLDILOCKS_PLAIN).start()
    conn = c.connect_keyholder()
    c.keyholder.keygen(_params(c.session_id, Layout(c.dim, c.classes), 1.0,
                                                  Bounds(c.max_norm, 1000, k_max)))
    c.keyholder.publish(conn)
    return c, conn


def _malicious_upload(c, name, edit):
    """What a hospital running modified software sends: a well-formed, signed upload whose statement is false."""
    cl = c.hospital(name)
    params = cl.fetch_params()
    be = get_backend(params)
    ctx = cl.conn.request("GET", cl.conn.path("/context"), signed=False).content
    lanes = be.circuit.lanes(Layout(c.dim, c.classes).pack(c.stats(*c.data(name)))).copy()
    edit(lanes, be.circuit, params)
    body, seed, com = be.circuit.prove(name, lanes=lanes, check=False)
    payload, st = be.seal_upload(body, seed, com, ctx, name, cl.party.identity_key())
    receipt = cl.upload(params, payload, tag=st)
    cl.close()
    return receipt


def _entry_1e12(lanes, circuit, params):
    lanes[1] = (1 << 61) % P  # an off-diagonal Gram entry far past anything the bounds allow


@pytest.mark.e2e
def test_an_upload_beyond_the_bounds_is_refused_by_name_and_the_others_are_released(consortium):
    # Prepare: h1, h2 honest; h3 uploads a Gram entry of 2^61 / 2^f1 (receipted: the server cannot read it)
    c, conn = _start(consortium)
    honest = {}
    for h in ("h1", "h2"):
        X, y = c.data(h)
        honest[h] = c.stats(X, y)
        cl = c.hospital(h)
        cl.submit(honest[h])
        cl.close()
    receipt = _malicious_upload(c, "h3", _entry_1e12)
    # Execute: the key holder's ordinary release
    res = c.keyholder.finalize(conn, min_clients=2)
    conn.close()
    # Assert: receipted, then refused by name in the signed release and the audit log; W is h1 + h2's
    assert receipt["hospital"] == "h3"
    assert res.report["refused"] == {"h3": "linear"} and res.report["participants"] == ["h1", "h2"]
    gamma = c.keyholder.params(c.session_id).gamma  # the released Gram carries K gamma I (RI intermediary)
    assert np.allclose(res.stats.gram - 2 * gamma * np.eye(c.dim), honest["h1"].gram + honest["h2"].gram,
                       rtol=1e-12, atol=1e-9)
    assert np.allclose(res.stats.cross, honest["h1"].cross + honest["h2"].cross, rtol=1e-12, atol=1e-9)
    assert res.stats.n == honest["h1"].n + honest["h2"].n
    audit = (c.root / "server" / c.session_id).rglob("*audit*")
    text = "".join(p.read_text(errors="replace") for p in audit if p.is_file())
    assert "split_validity" in text and "hospital:h3" in text
    evidence = json.loads((c.keyholder.keys_dir / f"{c.session_id}.validity-refusals.json").read_text())
    assert set(evidence["server_messages"]) == {"h3"} and evidence["server_messages"]["h3"]["signature"]


@pytest.mark.e2e
def test_a_refusal_below_min_clients_releases_nothing(consortium):
    c, conn = _start(consortium, hospitals=("h1", "h2"), min_clients=2)
    cl = c.hospital("h1")
    cl.submit(c.stats(*c.data("h1")))
    cl.close()
    _malicious_upload(c, "h2", _entry_1e12)
    with pytest.raises(SecureAFLError, match="h2"):
        c.keyholder.finalize(conn, min_clients=2)
    conn.close()


# -- the attack commands ----------------------------------------------------------------------------------------
def test_attack_veto_is_refused_by_name_under_split_and_vetoes_the_other_backends():
    from secure_afl_tools.attacks_validity import attack_veto

    r = attack_veto(verbose=False)
    assert r["table"] == {"split": "refused", "ckks": "vetoed", "bfv": "vetoed", "secagg": "vetoed"}
    assert r["outcome"] == "refused"


def test_attack_steer_moves_w_within_the_bounds_and_every_upload_is_accepted():
    from secure_afl_tools.attacks_validity import attack_steer

    r = attack_steer(verbose=False)
    moved = [row["moved"] for row in r["rows"]]
    assert all(row["accepted"] for row in r["rows"]) and moved == sorted(moved) and moved[-1] > 0.5


def _attack_cli(args, patch: str = ""):
    """``secure-afl attack ARGS`` in a fresh interpreter (its own server processes), after ``patch``."""
    import subprocess
    import sys

    code = f"import sys\n{patch}\nfrom secure_afl.cli import main\nsys.exit(main({['attack', *args]!r}))\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)


@pytest.mark.e2e
@pytest.mark.slow
def test_cli_attack_veto_through_the_service_exits_zero_because_split_refuses_the_hospital_by_name():
    # Execute: one server process per backend, two honest hospitals, h2 uploading an impossible vector
    out = _attack_cli(["veto"])
    # Assert: split names h2 (the key holder's signed refusal and the server's split_validity audit record)
    # and releases over the others; every other backend loses the release with nobody named
    assert out.returncode == 0, out.stdout + out.stderr
    split_line = next(line for line in out.stdout.splitlines() if line.startswith("[veto] split"))
    assert "REFUSED: h2's upload refused by name" in split_line and "names hospital:h2" in split_line
    assert "released over 2 hospitals" in split_line
    for backend in ("ckks", "bfv", "secagg", "plain"):
        line = next(x for x in out.stdout.splitlines() if x.startswith(f"[veto] {backend}"))
        assert "VETOED" in line and "nobody named" in line
    assert "ATTACK SUCCEEDED" not in out.stderr


# the split key holder's verdict on its share switched off, as a regression would: it accepts every proof
_NO_VERDICT = ("import secure_afl.split.roles as v\n"
               "v.helper_verdict = lambda *a, **k: (None, None) if k.get('with_message') else None")


@pytest.mark.e2e
def test_cli_attack_veto_exits_7_when_the_split_key_holder_no_longer_judges_the_proofs():
    out = _attack_cli(["veto", "--backend", "split"], _NO_VERDICT)
    assert out.returncode == 7, out.stdout + out.stderr  # EXIT_SECURITY
    assert "[veto] split  VETOED" in out.stdout and "nobody named" in out.stdout
    assert "ATTACK SUCCEEDED" in out.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_steering_through_the_service_trips_the_cauchy_schwarz_check_unless_the_target_is_inside_it():
    from secure_afl_tools.attacks_validity import attack_steer_service

    # Execute: ckks through a real server; alpha 1, the bound with the +-5 target, the bound inside the cone
    r = attack_steer_service(backends=("ckks",), alphas=(1.0, None), verbose=False)
    small, wide, cone = r["rows"]
    # Assert: every upload was receipted; the wide target loses the release (nobody named), the careful one
    # is released and dominates W
    assert small["accepted"] and 0 < small["moved"] < cone["moved"]
    assert not wide["accepted"] and not wide["refused"] and "class_cauchy_schwarz" in wide["error"]
    assert cone["target"] == "cone" and cone["accepted"] and cone["moved"] > 0.5


def test_cli_attack_backend_option_is_for_the_hospital_attacks_only(capsys):
    from secure_afl.cli import main

    assert main(["attack", "split-server", "--backend", "split"]) == 2  # refused before anything runs
    assert "veto and steer" in capsys.readouterr().err


def test_the_validity_benchmark_runs_and_accepts_its_honest_upload():
    from secure_afl_tools.bench_validity import run

    r = run(8, 3, n=50)
    assert r["accepted"] and r["proof_bytes"] > 0 and r["plain_upload_bytes"] == 8 * 2 * Layout(8, 3).length


@pytest.mark.e2e
def test_an_in_bounds_upload_that_breaks_the_gram_shape_is_released_and_reported_not_a_veto(consortium):
    # Prepare: h3's proof holds (counts, trace, entries within the proven bound) but C_01 = 3/4 T_hi (in lane
    # units), far beyond sqrt(C_00 C_11) and beyond k_max times the declared per-entry bound
    c, conn = _start(consortium, k_max=3)
    for h in ("h1", "h2"):
        cl = c.hospital(h)
        cl.submit(c.stats(*c.data(h)))
        cl.close()

    def shape(lanes, circuit, params):
        big = 3 * circuit.T // 4
        assert big > params.bounds.aggregate_bound(params.gamma) * 2.0 ** circuit.f1
        lanes[1] = big

    _malicious_upload(c, "h3", shape)
    # Execute
    res = c.keyholder.finalize(conn, min_clients=2)
    conn.close()
    # Assert: released over all three; the checks the proof does not establish are reported as failed
    checks = res.report["sanity"]["checks"]
    assert res.report["refused"] == {} and res.report["participants"] == ["h1", "h2", "h3"]
    assert checks["cauchy_schwarz"] is False and checks["counts_integral"] is True
    assert np.all(np.isfinite(res.W))


@pytest.mark.e2e
def test_an_upload_whose_signed_commitment_is_not_of_its_words_is_refused_at_upload(consortium):
    # Prepare: h3 signs a commitment to other lanes than it sends (so its rows would not test its data)
    c, conn = _start(consortium)
    cl = c.hospital("h3")
    params = cl.fetch_params()
    be = get_backend(params)
    ctx = cl.conn.request("GET", cl.conn.path("/context"), signed=False).content
    body, seed, com = be.circuit.prove("h3", Layout(c.dim, c.classes).pack(c.stats(*c.data("h3"))))
    lying = split.UploadCommitment(hashlib.sha256(b"other lanes").hexdigest(), com.aux_sha256,
                                            com.seed_sha256)
    payload, st = be.seal_upload(body, seed, lying, ctx, "h3", cl.party.identity_key())
    # Execute / Assert: refused by the server at upload, nothing receipted
    with pytest.raises(MalformedPayload, match="commitment"):
        cl.upload(params, payload, tag=st)
    cl.close()
    conn.close()
