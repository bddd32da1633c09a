"""The field split's proof runs over: named in the session's signed parameters, bound into the joint and query
randomness with the repetition count, and a session or upload signed before it was named refused by name."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from secure_afl import split
from secure_afl.backends.split import SplitBackend
from secure_afl.exceptions import InvalidInputError, InvalidParameterError
from secure_afl.hazmat.fields import GOLDILOCKS, field_named
from secure_afl.packing import Layout
from secure_afl.params import Bounds, SessionParams
from secure_afl.split.sizes import FIELD_KEY
from secure_afl.stats import local_statistics
from secure_afl_tools.vectors import files as vector_files, split_messages as split_vectors

LAYOUT = Layout(4, 3)
BOUNDS = Bounds(4.0, 60, 8)


def _params(**kw) -> SessionParams:
    """Goldilocks without the Gram statement unless ``kw`` says otherwise: most of what follows is that path."""
    return split.split_session_params("field-test", LAYOUT, 1.0, BOUNDS, **{"field": "goldilocks",
                                                                           "gram_proof": False, **kw})


def _without_field(params: SessionParams) -> SessionParams:
    d = params.to_dict()
    del d["backend_params"][FIELD_KEY]
    return SessionParams.from_dict(d)


def test_every_split_session_signs_its_field_and_the_circuit_runs_over_it():
    # the default, with DP or without: Field128 with the Gram statement
    default = split.split_session_params("field-test", LAYOUT, 1.0, BOUNDS)
    assert default.backend_params[FIELD_KEY] == "field128" and split.gram_enabled(default)
    assert split.Circuit(default).F is field_named("field128")
    from secure_afl.backends.session_params import dp_session_params
    from secure_afl.dp import DPSpec

    with_dp = dp_session_params(DPSpec(1.0, 1e-5, 3), "split", "field-test", LAYOUT, 1.0, BOUNDS)
    assert with_dp.backend_params[FIELD_KEY] == "field128" and split.gram_enabled(with_dp)
    assert split.Circuit(with_dp).F is field_named("field128")
    params = _params()
    assert params.backend_params[FIELD_KEY] == "goldilocks"
    c = split.Circuit(params)
    assert c.F is GOLDILOCKS and c.bits.F is c.F and c.statement.F is c.F
    gram = split.Circuit(_params(gram_proof=True))
    assert gram.part("gram").sq.F is gram.F


def test_a_session_signed_before_the_field_was_named_is_refused_by_name():
    old = _without_field(_params())
    with pytest.raises(InvalidParameterError, match="name no proof field"):
        split.Circuit(old)
    with pytest.raises(InvalidParameterError, match="name no proof field"):
        SplitBackend(old)
    d = _params().to_dict()
    d["backend_params"][FIELD_KEY] = "babybear"
    with pytest.raises(InvalidParameterError, match="unknown proof field 'babybear'"):
        split.Circuit(SessionParams.from_dict(d))


def test_the_field_changes_the_session_digest():
    # the uploads, receipts and verifier messages of a session all sign its parameters' digest: one signed
    # without the field (the old format) is never one signed with it
    assert _without_field(_params()).digest() != _params().digest()


def test_the_joint_randomness_binds_the_repetition_count_and_the_field():
    c = split.Circuit(_params())
    fs, aux = hashlib.sha256(b"fs").digest(), hashlib.sha256(b"aux").hexdigest()
    three = c.joint_rand(fs, aux)
    assert len(three) == c.reps == 3
    c.reps = 4
    four = c.joint_rand(fs, aux)
    # a four-repetition circuit's first three joint rands are not the three-repetition circuit's
    assert len(four) == 4 and not set(three) & set(four)
    pts3 = split.Circuit(_params()).query_rand(fs, aux, bytes(32))[0]
    pts4 = c.query_rand(fs, aux, bytes(32))[0]
    assert not set(pts3) & set(pts4)


class _Renamed:
    """Goldilocks under another name: only the binding differs."""

    def __getattr__(self, name):
        return getattr(GOLDILOCKS, name)

    name = "other-field"


def test_the_joint_and_query_randomness_bind_the_field_name():
    c = split.Circuit(_params())
    fs, aux = hashlib.sha256(b"fs").digest(), hashlib.sha256(b"aux").hexdigest()
    before = c.joint_rand(fs, aux), c.query_rand(fs, aux, bytes(32))
    c.F = _Renamed()
    after = c.joint_rand(fs, aux), c.query_rand(fs, aux, bytes(32))
    assert not set(before[0]) & set(after[0])
    assert not set(before[1][0]) & set(after[1][0])
    assert not np.array_equal(before[1][1], after[1][1])


def test_an_honest_upload_still_proves_and_a_proof_for_another_repetition_count_is_refused():
    params = _params()
    c = split.Circuit(params)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20, 4))
    X *= 0.9 * BOUNDS.max_norm / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)
    vec = LAYOUT.pack(local_statistics(X, rng.integers(0, 3, size=20), 3))
    body, seed, com = c.prove("h1", vec)
    qs = bytes(range(32))
    lead = c.query(c.leader_share(body), com, "h1", qs, leader=True)
    help_ = c.query(c.helper_share(seed), com, "h1", qs, leader=False)
    assert c.decide(lead, help_) is None
    # the same bits proven under a four-repetition circuit's joint randomness (its first three proofs kept):
    # the three-repetition verifiers refuse them
    four = split.Circuit(params)
    four.reps = 4

    orig = c.joint_rand
    c.joint_rand = lambda fs, aux: four.joint_rand(fs, aux)[:3]
    try:
        body2, seed2, com2 = c.prove("h1", vec)
    finally:
        c.joint_rand = orig
    lead = c.query(c.leader_share(body2), com2, "h1", qs, leader=True)
    help_ = c.query(c.helper_share(seed2), com2, "h1", qs, leader=False)
    assert c.decide(lead, help_) == "bits"


def test_a_vector_file_of_the_old_version_is_refused_by_name(tmp_path):
    # version 1: the vectors of sessions signed before the field was named
    (tmp_path / "split").mkdir()
    text = (vector_files.ROOT / "split" / "plain.json").read_text()
    (tmp_path / "split" / "plain.json").write_text(
        text.replace(f'"version": {split_vectors.VERSION}', '"version": 1'))
    with pytest.raises(InvalidInputError, match="plain.json is version 1 of the split vectors"):
        vector_files.instance("split", "plain", tmp_path)
    assert vector_files.instance("split", "plain")["version"] == split_vectors.VERSION


def _sections(**extra):
    base = {"session": {"id": "size-session", "backend": "split", "dim": 6, "classes": 3,
                        "hospitals": ["h1", "h2", "h3"], "min_clients": 2},
            "bounds": {"max_norm": 2.0, "n_max": 200, "k_max": 8}}
    base["session"].update(extra)
    return base


def test_session_sign_refuses_a_session_whose_upload_exceeds_max_upload_bytes_naming_the_size():
    from secure_afl.exceptions import SecureAFLError
    from secure_afl.session.definition import normalise
    from secure_afl.session.schema import parse

    from secure_afl.envelope import seal

    definition = normalise(parse(_sections()))
    params = definition.session_params()
    c = split.Circuit(params)
    size = c.upload_bytes()
    # the size is the sealed payload's, byte for byte (a proven upload of this session, sealed as a hospital does)
    layout = params.layout
    X = np.full((5, layout.dim), 0.3)
    body, _, _ = c.prove("h1", layout.pack(local_statistics(X, np.array([0, 1, 2, 0, 1]), layout.n_classes,
                                                            gamma=params.gamma)))
    assert len(seal(params, "contribution", c.F.to_bytes(body))) == size
    normalise(parse(_sections(max_upload_bytes=size)))  # exactly at the cap: signed
    with pytest.raises(SecureAFLError, match=rf"every upload of this session is {size} bytes.*max_upload_bytes = "
                                             rf"{size - 1}"):
        normalise(parse(_sections(max_upload_bytes=size - 1)))


def test_the_goldilocks_object_is_the_modules_arithmetic_checked_against_python_integers():
    from secure_afl.exceptions import MalformedPayload
    from secure_afl.hazmat.fields import canonical, field_named, small

    F = field_named("goldilocks")
    assert F is GOLDILOCKS and F.P == (1 << 64) - (1 << 32) + 1 and F.ENCODED_SIZE == 8 and F.dtype == np.uint64
    rng = np.random.default_rng(7)
    xs = [int(v) for v in rng.integers(0, 1 << 62, size=64)] + [0, 1, F.P - 1, F.P - 2, F.HALF, F.HALF + 1]
    ys = xs[::-1]
    a, b = F.to_field(xs), F.to_field(ys)
    p = F.P
    assert [int(v) for v in F.to_ints(F.add(a, b))] == [(x + y) % p for x, y in zip(xs, ys)]
    assert [int(v) for v in F.to_ints(F.sub(a, b))] == [(x - y) % p for x, y in zip(xs, ys)]
    assert [int(v) for v in F.to_ints(F.mul(a, b))] == [x * y % p for x, y in zip(xs, ys)]
    assert F.dot(a, b) == sum(x * y for x, y in zip(xs, ys)) % p
    z = np.array([-5, 0, 7, -F.HALF, F.HALF], dtype=np.int64)
    assert list(F.decode_signed(F.encode_signed(z))) == list(z)
    assert list(F.decode_signed_float(F.encode_signed(z))) == [float(v) for v in z]
    assert np.array_equal(F.from_bytes(F.to_bytes(a)), a)
    with pytest.raises(MalformedPayload):
        canonical(F, np.array([p], dtype=np.uint64))
    with pytest.raises(MalformedPayload):
        F.from_bytes(np.array([p], dtype="<u8").tobytes())
    assert np.array_equal(small(F, np.array([0, 1, 1], dtype=np.uint64)), np.array([0, 1, 1], dtype=np.uint64))
    with pytest.raises(AttributeError):
        F.P = 5


def test_the_bit_and_square_sum_proofs_run_over_field128_as_over_goldilocks():
    from secure_afl.hazmat.field128 import FIELD128 as F
    from secure_afl.hazmat.flp import BitProof
    from secure_afl.hazmat.flp_square import SquareSumProof

    rng = np.random.default_rng(1)
    m = 700
    bits = F.to_field([int(v) for v in rng.integers(0, 2, m)])
    bp = BitProof(m, field=F)
    jr, t = (1 << 100) + 12345, (1 << 120) + 987
    proof = bp.prove(bits, jr, F.expand_field(bytes(32), 2 * bp.chunk, b"saflVALIDprf"))
    mb, mp = F.expand_field(b"\1" * 32, m, b"saflVALIDprf"), F.expand_field(b"\2" * 32, bp.proof_len, b"saflVALIDprf")

    def verdict(b, pf):
        lead = bp.query(F.add(b, mb), F.add(pf, mp), jr, t, leader=True)
        return bp.decide(F.add(lead, bp.query(F.neg(mb), F.neg(mp), jr, t, leader=False)))

    assert verdict(bits, proof)
    bad = bits.copy()
    bad[5] = F.to_field([2])[0]
    assert not verdict(bad, bp.prove(bad, jr, F.expand_field(bytes(32), 2 * bp.chunk, b"saflVALIDprf")))
    sq = SquareSumProof(50, 3, field=F)
    vi = [int(x) for x in rng.integers(-1000, 1000, 150)]
    v = F.to_field(vi)
    pf = sq.prove(v, F.expand_field(bytes(32), sq.chunk, b"saflVALIDprf"))
    assert [int(o) for o in F.to_ints(sq.outputs(pf))] == [sum(x * x for x in vi[g * 50:(g + 1) * 50]) % F.P
                                                             for g in range(3)]
    assert sq.decide(sq.query(v, pf, t))


def test_a_circuit_over_field128_proves_an_honest_upload_and_refuses_a_false_one():
    # the circuit takes every operation from the field its parameters name: the same statement over Field128,
    # on one word per value read at scale 2^(f1 + f2)
    params = _params(field="field128")
    c = split.Circuit(params)
    assert c.F.name == "field128" and c.F.ENCODED_SIZE == 16 and c.main_len == LAYOUT.length
    assert c.f1 == sum(params.backend_params["frac_bits"]) and c.f2 == 0
    rng = np.random.default_rng(2)
    X = rng.normal(size=(20, 4))
    X *= 0.9 * BOUNDS.max_norm / np.linalg.norm(X, axis=1, keepdims=True)
    vec = LAYOUT.pack(local_statistics(X, rng.integers(0, 3, size=20), 3))
    qs = bytes(range(32))

    def verdict(body, seed, com):
        lead = c.query(c.leader_share(c.F.to_bytes(body)), com, "h1", qs, leader=True)
        return c.decide(lead, c.query(c.helper_share(seed), com, "h1", qs, leader=False))

    assert verdict(*c.prove("h1", vec)) is None
    # a count of -1 with its bits claiming 0: refused by the affine checks, as over Goldilocks
    x, fw = c.witness(vec)
    i, j = c.i_counts[0], c.i_counts[1]
    hi = c.F.decode_signed(x[:c.L]).astype(object)
    hi[j] += hi[i] + (1 << c.f1)
    hi[i] = -(1 << c.f1)
    lanes = np.concatenate([c.F.encode_signed(hi), x[c.L:]])
    body, seed, com = c.prove("h1", lanes=lanes, factor=fw, check=False)
    assert verdict(body, seed, com) == "linear"


