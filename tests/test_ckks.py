"""Tests of the ``ckks`` backend and its hazmat layer (real TenSEAL, no mocks)."""

from __future__ import annotations

import json
import os
import stat
import struct
from pathlib import Path

import numpy as np
import pytest
import tenseal as ts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from secure_afl.backends import get_backend
from secure_afl.backends.ckks import (
    DEFAULT_MAX_ABS_ERROR,
    CKKSBackend,
    bind_public_context,
    ckks_parameters,
    ckks_session_params,
    count_breaks,
    expected_abs_error,
    generate_keys,
    load_secret_context,
    new_ckks_session,
    save_secret_context,
)
from secure_afl.envelope import peek_header, seal
from secure_afl.exceptions import (
    BoundsExceeded,
    InvalidContribution,
    InvalidKey,
    InvalidParameterError,
    MalformedPayload,
    ParameterMismatch,
    RoundAlreadyClosed,
    SanityCheckFailed,
    SecretKeyNotAllowed,
    WrongSession,
)
from secure_afl.hazmat import ckks as hz
from secure_afl.hazmat.at_rest import open_secret
from secure_afl.packing import Layout
from secure_afl.params import Bounds, SessionParams

VECTORS = Path(__file__).resolve().parent.parent / "vectors"
LAYOUT = Layout(8, 3)
BOUNDS = Bounds(max_norm=1.0, n_max=100, k_max=10)
GAMMA = 1.0
H = BOUNDS.hospital_bound(GAMMA)  # 101


@pytest.fixture(scope="module")
def session():
    params, keys = new_ckks_session("ckks-test", LAYOUT, GAMMA, BOUNDS)
    return params, keys


@pytest.fixture(scope="module")
def other_key_session():
    """Same session id, layout and bounds, but a different fresh key."""
    return new_ckks_session("ckks-test", LAYOUT, GAMMA, BOUNDS)


def _vectors(k, seed=0, scale=H):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-scale, scale, LAYOUT.length) for _ in range(k)]


def _round(params, keys, vectors):
    be = CKKSBackend(params)
    acc = be.combiner(public_context=keys.public_context)
    for v in vectors:
        acc.add(be.protect(v, public_context=keys.public_context))
    return be.reveal(acc.aggregate(), secret_context=keys.secret_context)


def _reseal(params, payload, body):
    env = peek_header(payload)
    return seal(params, env.header["kind"], body)


def _chunks(body):
    magic, count, total = struct.unpack_from("<8sII", body)
    pos, out = 16, []
    for _ in range(count):
        (n,) = struct.unpack_from("<Q", body, pos)
        out.append(body[pos + 8:pos + 8 + n])
        pos += 8 + n
    return magic, total, out


def _spans_body(params, vector, encrypt):
    """A body whose chunks are ``encrypt(values)`` for each span the session expects."""
    v = np.asarray(vector, dtype=np.float64)
    spans = ckks_parameters(params).spans(v.shape[0], count_breaks(params.layout))
    return _body(v.shape[0], [encrypt(list(v[a:b])) for a, b in spans])


def _body(total, chunks):
    parts = [struct.pack("<8sII", b"SAFLCKK1", len(chunks), total)]
    for c in chunks:
        parts += [struct.pack("<Q", len(c)), c]
    return b"".join(parts)


# -- parameter selection -----------------------------------------------------------
def test_chosen_chain_is_the_smallest_that_holds_bounds_and_precision(session):
    # Prepare
    params, _ = session
    agg, k = BOUNDS.aggregate_bound(1.0), BOUNDS.k_max

    # Execute
    p = ckks_parameters(params)

    # Assert: 128-bit budget, precision target, headroom (H) -- and one data bit fewer breaks (H).
    assert sum(p.coeff_mod_bit_sizes) <= hz.SEAL_MAX_COEFF_BITS[p.poly_modulus_degree]
    assert hz.noise_bound(p, k) <= 1e-6
    assert agg <= p.max_aggregate(k)
    bits = p.coeff_mod_bit_sizes
    smaller = (bits[0] - 1,) + bits[1:]
    assert agg > hz.CKKSParameters(p.poly_modulus_degree, smaller, p.scale_bits).max_aggregate(k)
    assert len(params.backend_params["public_context_sha256"]) == 64


@pytest.mark.security
def test_backend_refuses_parameters_that_miss_the_precision_target(session):
    # Prepare: the session's parameters claimed for a tighter precision target than they meet
    params, _ = session
    forged = params.with_backend_params(max_abs_error=1e-12)

    # Execute / Assert
    with pytest.raises(InvalidParameterError, match="precision target"):
        CKKSBackend(forged)


@pytest.mark.parametrize("k_max, limit", [(10, 40.0), (100, 44.0)])
def test_d512_c100_session_bytes_per_value(k_max, limit):
    # Prepare: d = 512, C = 100, unit-norm embeddings, 256 samples per hospital (the bench's session)
    lay = Layout(512, 100)
    b = Bounds(1.0, 256, k_max)

    # Execute: the default precision target of the flooded release
    params, keys = new_ckks_session("wire", lay, 1.0, b)
    payload = CKKSBackend(params).protect(np.zeros(lay.length), public_context=keys.public_context)

    # Assert: measured bytes on the wire per packed value (SEAL's zstd stores 33-35-bit primes' residues in
    # about 41 bits, so k_max 100's two 35-bit primes cost more than their nominal 35 bytes)
    assert len(payload) / lay.length <= limit


def test_larger_bounds_pick_larger_parameters():
    # Prepare
    huge = Bounds(max_norm=2.0 ** 40, n_max=1, k_max=4)  # aggregate bound 2^82

    # Execute
    default = ckks_session_params("s", LAYOUT, 0.0, huge)
    small = ckks_session_params("s", LAYOUT, 0.0, BOUNDS)
    many = ckks_session_params("s", LAYOUT, 0.0, Bounds(1.0, 100, 1000))

    # Assert
    assert ckks_parameters(default).data_bits > ckks_parameters(small).data_bits
    assert ckks_parameters(default).max_aggregate(4) >= huge.aggregate_bound(0.0)
    cp = ckks_parameters(many)
    coeffs = cp.poly_modulus_degree * cp.n_chunks(LAYOUT.length, count_breaks(LAYOUT))
    assert hz.flooded_tolerance(cp, 1000, coeffs, LAYOUT.length, 0.0)[2] <= DEFAULT_MAX_ABS_ERROR


@pytest.mark.security
def test_session_whose_precision_cannot_be_met_is_refused_with_the_reason():
    # Prepare: a huge aggregate bound and a tiny precision target do not fit N <= 32768 at 128-bit security.
    b = Bounds(max_norm=1e6, n_max=10**6, k_max=1000)

    # Execute / Assert
    with pytest.raises(InvalidParameterError, match="128-bit security") as e:
        ckks_session_params("s", LAYOUT, 1.0, b, max_abs_error=1e-20)
    assert "max_abs_error=1e-20" in str(e.value) and "Lower n_max, max_norm or k_max" in str(e.value)


@pytest.mark.security
@pytest.mark.parametrize(
    "bounds, kw",
    [
        (Bounds(max_norm=1e60, n_max=10 ** 9, k_max=1000), {}),
        (Bounds(max_norm=2.0 ** 80, n_max=1, k_max=4), {"max_poly_modulus_degree": 8192}),
    ],
)
def test_session_refuses_bounds_that_cannot_fit(bounds, kw):
    # Prepare / Execute / Assert
    with pytest.raises(InvalidParameterError, match="Lower n_max, max_norm or k_max"):
        ckks_session_params("s", LAYOUT, 0.0, bounds, **kw)


@pytest.mark.security
def test_backend_refuses_parameters_too_small_for_the_bounds(session):
    # Prepare: design-point parameters claimed for bounds they cannot hold
    params, _ = session
    forged = SessionParams("ckks-test", "ckks", LAYOUT, 0.0, Bounds(2.0 ** 40, 10, 10), dict(params.backend_params))

    # Execute / Assert
    with pytest.raises(InvalidParameterError):
        CKKSBackend(forged)


@pytest.mark.parametrize("bad", [
    {"poly_modulus_degree": 8192, "coeff_mod_bit_sizes": [60, 60, 60, 60], "scale_bits": 40},  # 240 > 218 bits
    {"poly_modulus_degree": 1000, "coeff_mod_bit_sizes": [60, 40, 40], "scale_bits": 40},
    {"poly_modulus_degree": 8192, "coeff_mod_bit_sizes": [60, 40, 40], "scale_bits": 99},
    {"poly_modulus_degree": 8192, "coeff_mod_bit_sizes": [60], "scale_bits": 40},
    {"poly_modulus_degree": 8192, "scale_bits": 40},
])
def test_invalid_ckks_parameters_are_refused(bad):
    # Prepare / Execute / Assert
    with pytest.raises(InvalidParameterError):
        hz.CKKSParameters.from_dict(bad)


@pytest.mark.parametrize("case", json.loads((VECTORS / "ckks_invalid_params.json").read_text())["cases"],
                         ids=lambda c: c["name"])
def test_invalid_params_vectors(case):
    # Prepare
    b = case["bounds"]

    # Execute / Assert
    with pytest.raises(InvalidParameterError):
        ckks_session_params("s", LAYOUT, case["gamma"], Bounds(b["max_norm"], b["n_max"], b["k_max"]),
                            **case.get("kwargs", {}))


# -- correctness ----------------------------------------------------------------------
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    vectors=st.integers(1, 5).flatmap(
        lambda k: st.lists(
            hnp.arrays(np.float64, LAYOUT.length,
                       elements=st.floats(-H, H, allow_nan=False, allow_infinity=False, width=64)),
            min_size=k, max_size=k,
        )
    )
)
def test_decrypted_sum_matches_plain_sum_within_bound(session, vectors):
    # Prepare
    params, keys = session
    magnitude = sum(float(np.max(np.abs(v))) for v in vectors)

    # Execute
    revealed = _round(params, keys, vectors)

    # Assert
    bound = expected_abs_error(params, len(vectors), magnitude=magnitude)
    assert revealed.shape == (LAYOUT.length,) and revealed.dtype == np.float64
    assert np.max(np.abs(revealed - np.sum(vectors, axis=0))) <= bound


def test_multi_chunk_vector_round_trips():
    # Prepare: L = 4370 > 4096 slots, so two ciphertexts per payload
    layout = Layout(90, 3)
    params, keys = new_ckks_session("ckks-chunks", layout, GAMMA, BOUNDS)
    rng = np.random.default_rng(1)
    vs = [rng.uniform(-H, H, layout.length) for _ in range(3)]
    be = CKKSBackend(params)

    # Execute
    acc = be.combiner(public_context=keys.public_context)
    payloads = [be.protect(v, public_context=keys.public_context) for v in vs]
    for p in payloads:
        acc.add(p)
    revealed = be.reveal(acc.aggregate(), secret_context=keys.secret_context)

    # Assert
    _, total, chunks = _chunks(peek_header(payloads[0]).body)
    # the Gram and cross entries in N/2-value chunks, then the counts block in a chunk of its own
    assert (total, len(chunks)) == (layout.length, -(-layout.slices["n"].start // ckks_parameters(params).slots) + 1)
    assert len(chunks) >= 3
    assert np.max(np.abs(revealed - np.sum(vs, axis=0))) <= expected_abs_error(params, 3, magnitude=3 * H)


def test_aggregate_header_counts_contributors(session):
    # Prepare
    params, keys = session
    be = get_backend(params)
    acc = be.combiner(public_context=keys.public_context)

    # Execute
    for v in _vectors(3):
        acc.add(be.protect(v, public_context=keys.public_context))
    agg = acc.aggregate()

    # Assert
    assert peek_header(agg).header["contributors"] == 3
    assert peek_header(agg).header["kind"] == "aggregate"
    with pytest.raises(RoundAlreadyClosed):
        acc.add(be.protect(_vectors(1)[0], public_context=keys.public_context))


@pytest.mark.parametrize("case", json.loads((VECTORS / "ckks_encode_decode.json").read_text())["cases"],
                         ids=lambda c: c["name"])
def test_encode_decode_vectors(case):
    # Prepare
    p = hz.CKKSParameters.from_dict(case["params"])
    ctx = hz.generate_context(p)
    pub = hz.load_context(hz.serialize_public(ctx), p, secret=False)
    inputs = [np.array(x, dtype=np.float64) for x in case["inputs"]]
    magnitude = sum(float(np.max(np.abs(x))) for x in inputs)

    # Execute
    acc = None
    for x in inputs:
        acc = hz.add_chunks(acc, hz.load_chunks(pub, p, hz.encrypt_vector(pub, p, x), len(x)))
    for c in acc:
        c.link_context(ctx)
    out = hz.decrypt_chunks(ctx, acc, len(inputs[0]))

    # Assert
    assert case["abs_tol"] >= hz.expected_abs_error(p, len(inputs), magnitude) * 0.999
    np.testing.assert_allclose(out, np.array(case["expected"]), rtol=0, atol=case["abs_tol"])


# -- overflow ------------------------------------------------------------------------
@pytest.mark.security
def test_raw_tenseal_wraps_silently():
    # Prepare: design point; 2^58 encodes (2^58 * 2^40 = 2^98 < 2^100 = Q)
    ctx = ts.context(ts.SCHEME_TYPE.CKKS, 8192, coeff_mod_bit_sizes=[60, 40, 40])
    ctx.global_scale = 2.0 ** 40
    x = 2.0 ** 58
    c = ts.ckks_vector(ctx, [x] * 4)

    # Execute: 3 * 2^98 > Q/2 wraps mod Q, and nothing complains
    total = np.array((c + c + c).decrypt())

    # Assert: garbage (about 3x - Q/Delta ~ -2^58), no exception
    assert np.all(np.abs(total - 3 * x) > 1e17)
    assert np.all(total < 0)


@pytest.mark.security
def test_edge_of_the_bound_decrypts_correctly_and_beyond_is_refused():
    # Prepare: hospital bound 2^52, k_max 4 -> aggregate bound 2^54 <= 2^55 (design point)
    bounds = Bounds(max_norm=2.0 ** 26, n_max=1, k_max=4)
    params, keys = new_ckks_session("edge", LAYOUT, 0.0, bounds)
    edge = np.full(LAYOUT.length, 2.0 ** 52)
    edge[::2] = -(2.0 ** 52)
    be = CKKSBackend(params)

    # Execute
    revealed = _round(params, keys, [edge] * 4)

    # Assert
    np.testing.assert_allclose(revealed, 4 * edge, rtol=1e-12)
    with pytest.raises(BoundsExceeded):
        be.protect(edge * 1.001, public_context=keys.public_context)


@pytest.mark.security
def test_protect_refuses_out_of_bound_vector_before_encryption(session):
    # Prepare
    params, keys = session
    v = _vectors(1)[0]
    v[5] = 2.0 ** 58  # would wrap a sum (test_raw_tenseal_wraps_silently)

    # Execute / Assert
    with pytest.raises(BoundsExceeded):
        CKKSBackend(params).protect(v, public_context=keys.public_context)


@pytest.mark.security
def test_reveal_refuses_a_wrapped_aggregate(session):
    # Prepare: a dishonest hospital bypasses the recipe and encrypts 2^58
    params, keys = session
    p = ckks_parameters(params)
    pub = hz.load_context(keys.public_context, p, secret=False)
    x = p.data_modulus / p.scale / 4  # encodes fine; three of them pass Q/2
    bad = seal(params, "contribution", hz.encrypt_vector(pub, p, np.full(LAYOUT.length, x), count_breaks(LAYOUT)))
    be = CKKSBackend(params)
    acc = be.combiner(public_context=keys.public_context)

    # Execute: the server cannot tell
    for _ in range(3):
        acc.add(bad)
    agg = acc.aggregate()

    # Assert
    with pytest.raises(SanityCheckFailed):
        be.reveal(agg, secret_context=keys.secret_context)


# -- keys and contexts ------------------------------------------------------------------
@pytest.mark.security
def test_public_context_holds_no_secret_relin_or_galois_keys(session):
    # Prepare
    _, keys = session

    # Execute
    ctx = ts.context_from(keys.public_context)

    # Assert
    assert ctx.is_public() and not ctx.has_secret_key()
    assert not ctx.has_relin_keys() and not ctx.has_galois_keys()
    assert ts.context_from(keys.secret_context).has_secret_key()


@pytest.mark.security
def test_fresh_key_per_session(session, other_key_session):
    # Prepare / Execute
    (p1, k1), (p2, k2) = session, other_key_session

    # Assert
    assert k1.public_context != k2.public_context
    assert p1.digest() != p2.digest()
    assert "secret" not in repr(k1).replace("secret=<hidden>", "")


@pytest.mark.security
def test_public_context_cannot_decrypt_a_payload(session):
    # Prepare
    params, keys = session
    payload = CKKSBackend(params).protect(_vectors(1)[0], public_context=keys.public_context)
    chunk = _chunks(peek_header(payload).body)[2][0]
    pub = ts.context_from(keys.public_context)

    # Execute / Assert: TenSEAL itself cannot
    with pytest.raises(ValueError):
        ts.ckks_vector_from(pub, chunk).decrypt()
    # ... and our reveal refuses a public context with a typed error
    agg = seal(params, "aggregate", peek_header(payload).body)
    with pytest.raises(InvalidKey):
        CKKSBackend(params).reveal(agg, secret_context=keys.public_context)


@pytest.mark.security
def test_server_refuses_secret_key_context(session):
    # Prepare
    params, keys = session
    be = CKKSBackend(params)

    # Execute / Assert
    with pytest.raises(SecretKeyNotAllowed):
        be.combiner(public_context=keys.secret_context)


@pytest.mark.security
def test_hospital_refuses_secret_key_context(session):
    # Prepare
    params, keys = session

    # Execute / Assert
    with pytest.raises(SecretKeyNotAllowed):
        CKKSBackend(params).protect(_vectors(1)[0], public_context=keys.secret_context)


@pytest.mark.security
def test_contexts_of_another_key_are_refused(session, other_key_session):
    # Prepare
    params, keys = session
    _, other = other_key_session
    be = CKKSBackend(params)
    agg_acc = be.combiner(public_context=keys.public_context)
    agg_acc.add(be.protect(_vectors(1)[0], public_context=keys.public_context))
    agg = agg_acc.aggregate()

    # Execute / Assert
    with pytest.raises(ParameterMismatch):
        be.protect(_vectors(1)[0], public_context=other.public_context)
    with pytest.raises(ParameterMismatch):
        be.combiner(public_context=other.public_context)
    with pytest.raises(ParameterMismatch):
        be.reveal(agg, secret_context=other.secret_context)


def test_unbound_params_are_refused(session):
    # Prepare
    _, keys = session
    unbound = ckks_session_params("ckks-test", LAYOUT, GAMMA, BOUNDS)

    # Execute / Assert
    with pytest.raises(InvalidParameterError, match="bind_public_context"):
        CKKSBackend(unbound).protect(_vectors(1)[0], public_context=keys.public_context)
    assert bind_public_context(unbound, keys.public_context).backend_params["public_context_sha256"]


@pytest.mark.parametrize("junk", [b"", b"not a context", os.urandom(2048)])
def test_garbage_context_bytes_are_malformed(session, junk):
    # Prepare
    params, _ = session

    # Execute / Assert
    with pytest.raises(MalformedPayload):
        CKKSBackend(params).combiner(public_context=junk)


def test_context_for_other_parameters_is_refused(session):
    # Prepare
    params, _ = session
    other = hz.generate_context(hz.CKKSParameters(8192, (60, 60, 60), 40))

    # Execute / Assert
    with pytest.raises(ParameterMismatch):
        hz.load_context(hz.serialize_public(other), ckks_parameters(params), secret=False)


# -- payload checks -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def payload(session):
    params, keys = session
    return CKKSBackend(params).protect(_vectors(1, seed=7)[0], public_context=keys.public_context)


@pytest.mark.security
def test_truncated_payload_is_malformed(session, payload):
    # Prepare
    params, keys = session
    acc = CKKSBackend(params).combiner(public_context=keys.public_context)

    # Execute / Assert
    for cut in (1, 100, len(payload) // 2, len(payload) - 1):
        with pytest.raises(MalformedPayload):
            acc.add(payload[:cut])


@pytest.mark.security
def test_bit_flip_in_body_is_detected(session, payload):
    # Prepare
    params, keys = session
    bad = bytearray(payload)
    bad[-1000] ^= 0x01

    # Execute / Assert
    with pytest.raises(MalformedPayload):
        CKKSBackend(params).combiner(public_context=keys.public_context).add(bytes(bad))


@pytest.mark.security
def test_resealed_tampered_bodies_are_typed_errors(session, payload):
    # Prepare: a sender who recomputes the body hash
    params, keys = session
    body = peek_header(payload).body
    _, total, chunks = _chunks(body)
    c = chunks[0]
    tampered = {
        "bad magic": b"XXXXXXXX" + body[8:],
        "chunk count": _body(total, chunks + chunks),
        "wrong length": _body(total + 1, chunks),
        "truncated chunk": _body(total, [c[: len(c) // 2]]),
        "garbage chunk": _body(total, [os.urandom(len(c))]),
        "trailing bytes": body + b"\x00",
        "empty chunk": _body(total, [b""]),
    }
    acc = CKKSBackend(params).combiner(public_context=keys.public_context)

    # Execute / Assert
    for b in tampered.values():
        with pytest.raises((MalformedPayload, InvalidContribution)):
            acc.add(_reseal(params, payload, b))
    assert acc.count == 0  # nothing half-added


@pytest.mark.security
@pytest.mark.parametrize("session_id, gamma, error", [("another-session", GAMMA, WrongSession),
                                                      ("ckks-test", 2.0, ParameterMismatch)],
                         ids=["wrong session", "wrong parameters"])
def test_payload_of_another_session_or_parameters_is_refused(session, session_id, gamma, error):
    # Prepare: the same key, another session id or (same session id) another gamma
    params, keys = session
    other = bind_public_context(ckks_session_params(session_id, LAYOUT, gamma, BOUNDS), keys.public_context)
    foreign = CKKSBackend(other).protect(_vectors(1)[0], public_context=keys.public_context)

    # Execute / Assert
    with pytest.raises(error):
        CKKSBackend(params).combiner(public_context=keys.public_context).add(foreign)


@pytest.mark.security
def test_payload_under_another_key_is_refused(session, other_key_session):
    # Prepare
    params, keys = session
    p2, k2 = other_key_session
    foreign = CKKSBackend(p2).protect(_vectors(1)[0], public_context=k2.public_context)

    # Execute / Assert
    with pytest.raises(ParameterMismatch):
        CKKSBackend(params).combiner(public_context=keys.public_context).add(foreign)


@pytest.mark.security
def test_ciphertext_with_other_ring_parameters_is_refused(session):
    # Prepare: a sender forges the header but encrypts under N = 16384
    params, keys = session
    p = hz.CKKSParameters(16384, (60, 60, 60, 60, 60), 40)
    ctx = hz.generate_context(p)
    forged = seal(params, "contribution",
                  _spans_body(params, _vectors(1)[0], lambda v: ts.ckks_vector(ctx, v).serialize()))

    # Execute / Assert
    with pytest.raises(InvalidContribution):
        CKKSBackend(params).combiner(public_context=keys.public_context).add(forged)


@pytest.mark.security
def test_lower_level_ciphertext_is_refused(session):
    # Prepare: a rescaled ciphertext lives mod a smaller Q (less headroom); bounds that need two data primes
    params, keys = new_ckks_session("low", LAYOUT, 1.0, Bounds(2.0 ** 20, 1000, 10))
    assert ckks_parameters(params).n_data_primes >= 2
    pub = ts.context_from(keys.public_context)
    forged = seal(params, "contribution",
                  _spans_body(params, _vectors(1)[0], lambda v: (ts.ckks_vector(pub, v) * 1.0).serialize()))

    # Execute / Assert
    with pytest.raises(InvalidContribution):
        CKKSBackend(params).combiner(public_context=keys.public_context).add(forged)


@pytest.mark.security
def test_reveal_refuses_a_contribution_payload(session, payload):
    # Prepare
    params, keys = session

    # Execute / Assert
    with pytest.raises(MalformedPayload):
        CKKSBackend(params).reveal(payload, secret_context=keys.secret_context)


# -- secret context at rest -----------------------------------------------------------------
@pytest.mark.security
def test_secret_context_at_rest_passphrase(tmp_path, session):
    # Prepare
    params, keys = session
    path = tmp_path / "sk.bin"

    # Execute
    save_secret_context(path, keys.secret_context, session_id="ckks-test", passphrase="correct horse",
                        scrypt_log2_n=14)
    loaded = load_secret_context(path, session_id="ckks-test", passphrase="correct horse")

    # Assert
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert loaded == keys.secret_context
    blob = path.read_bytes()
    sk = keys.secret_context
    for off in range(0, len(sk) - 32, len(sk) // 16):
        assert sk[off:off + 32] not in blob
    with pytest.raises(InvalidKey):
        load_secret_context(path, session_id="ckks-test", passphrase="wrong horse")
    with pytest.raises(InvalidKey):
        load_secret_context(path, session_id="another-session", passphrase="correct horse")
    with pytest.raises(FileExistsError):
        save_secret_context(path, sk, session_id="ckks-test", passphrase="x", scrypt_log2_n=14)
    # the loaded context decrypts this session's aggregates
    be = CKKSBackend(params)
    acc = be.combiner(public_context=keys.public_context)
    v = _vectors(1)[0]
    acc.add(be.protect(v, public_context=keys.public_context))
    assert np.allclose(be.reveal(acc.aggregate(), secret_context=loaded), v, atol=1e-6)


@pytest.mark.security
def test_secret_context_at_rest_key_file(tmp_path, session):
    # Prepare
    _, keys = session
    key = os.urandom(32)
    path = tmp_path / "sk.bin"

    # Execute
    save_secret_context(path, keys.secret_context, session_id="ckks-test", key=key)

    # Assert
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_secret_context(path, session_id="ckks-test", key=key) == keys.secret_context
    with pytest.raises(InvalidKey):
        load_secret_context(path, session_id="ckks-test", key=os.urandom(32))
    with pytest.raises(InvalidKey):
        load_secret_context(path, session_id="ckks-test", passphrase="a passphrase")
    tampered = bytearray(path.read_bytes())
    tampered[-5] ^= 1
    with pytest.raises(InvalidKey):
        open_secret(bytes(tampered), associated_data=b"secure-afl/ckks-secret-context/v1/session=ckks-test",
                       key=key)
    with pytest.raises(MalformedPayload):
        open_secret(b"short", associated_data=b"", key=key)


def test_generate_keys_is_fresh(session):
    # Prepare
    params, keys = session

    # Execute
    again = generate_keys(params)

    # Assert
    assert again.public_context != keys.public_context
    assert again.secret_context != keys.secret_context


@pytest.mark.security
@pytest.mark.parametrize("k_max", [1, 10, 100])
def test_chosen_chain_holds_bounds_just_below_powers_of_two(k_max):
    # Prepare: aggregate bounds at the edge of an integer number of bits, where SEAL's primes (a bit
    # below 2^b) matter; every chosen chain must still satisfy the headroom condition (H).
    for j in range(4, 60, 3):
        a = 2.0 ** j * (1 - 1e-9)

        # Execute
        p = hz.select_parameters(a, k_max, max_abs_error=1e-6)

        # Assert
        assert a <= p.max_aggregate(k_max), (j, p)


def test_the_ciphertext_reader_returns_every_residue_the_element_accessor_does():
    # Prepare: fresh ciphertexts of a small context, of a short and a full vector
    import tenseal as ts

    from secure_afl.exceptions import InvalidParameterError
    from secure_afl.hazmat.ckks import ciphertext_words

    ctx = ts.context(ts.SCHEME_TYPE.CKKS, 4096, coeff_mod_bit_sizes=[40, 20, 40])
    ctx.global_scale = 2 ** 20
    rng = np.random.default_rng(7)
    for values in (rng.normal(size=3), rng.normal(size=2048)):
        vec = ts.ckks_vector(ctx, values)
        ct = vec.ciphertext()[0]
        words = 2 * 2 * 4096
        reference = np.fromiter(map(ct.__getitem__, range(words)), dtype=np.uint64, count=words)
        # Assert: SEAL's serialised form read whole gives the accessor's residues, in its order
        assert np.array_equal(ciphertext_words(vec, 4096, 2), reference)
        # and a reader asked for another geometry refuses instead of reading past or short
        with pytest.raises(InvalidParameterError, match="fresh two-polynomial"):
            ciphertext_words(vec, 4096, 3)
