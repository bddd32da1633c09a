"""bfv backend: exact sums, key binding, ciphertext checks, noise-budget and bound guards."""

from __future__ import annotations

import numpy as np
import pytest
import tenseal as ts

from secure_afl.backends import get_backend
from secure_afl.backends.bfv import BFVBackend, bfv_parameters, bfv_session_params, new_bfv_session
from secure_afl.backends.secagg import secagg_session_params, simulate_round
from secure_afl.envelope import peek_header, seal
from secure_afl import exceptions
from secure_afl.hazmat import bfv as hzb
from secure_afl.hazmat import fixedpoint
from secure_afl.packing import Layout
from secure_afl.params import Bounds, SessionParams

LAYOUT = Layout(8, 3)
BOUNDS = Bounds(max_norm=1.0, n_max=100, k_max=4)
GAMMA = 1.0
H = BOUNDS.hospital_bound(GAMMA)


@pytest.fixture(scope="module")
def session():
    return new_bfv_session("bfv-test", LAYOUT, GAMMA, BOUNDS)


def _vectors(k, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-H, H, LAYOUT.length) * 10.0 ** rng.uniform(-9, 0, LAYOUT.length) for _ in range(k)]


def _combine(params, keys, payloads):
    acc = BFVBackend(params).combiner(public_context=keys.public_context)
    for p in payloads:
        acc.add(p)
    return acc.aggregate()


def test_round_trip_equals_secagg_and_the_fixed_point_sum(session):
    # Prepare
    params, keys = session
    vs = _vectors(4)
    be = get_backend(params)

    # Execute
    revealed = be.reveal(_combine(params, keys, [be.protect(v, public_context=keys.public_context) for v in vs]),
                         secret_context=keys.secret_context)
    sp = secagg_session_params("s", LAYOUT, GAMMA, BOUNDS)
    agg, exact, _, _ = simulate_round(sp, vs)

    # Assert
    fb = tuple(params.backend_params["frac_bits"])
    assert exact and np.array_equal(revealed, agg)
    assert np.array_equal(revealed, fixedpoint.decode(fixedpoint.fixed_point_sum(vs, fb), fb))


@pytest.mark.security
def test_edge_of_the_lane_bound_decrypts_exactly(session):
    # Prepare: every hospital at +-H: each lane sum at its no-wrap edge
    params, keys = session
    edge = np.full(LAYOUT.length, H)
    edge[::2] = -H
    be = BFVBackend(params)

    # Execute
    revealed = be.reveal(_combine(params, keys, [be.protect(edge, public_context=keys.public_context)] * 4),
                         secret_context=keys.secret_context)

    # Assert
    assert np.array_equal(revealed, 4 * edge)


@pytest.mark.security
def test_protect_refuses_out_of_bound_vector(session):
    # Prepare
    params, keys = session
    v = _vectors(1)[0]
    v[3] = 2 * H

    # Execute / Assert
    with pytest.raises(exceptions.BoundsExceeded):
        BFVBackend(params).protect(v, public_context=keys.public_context)


@pytest.mark.security
def test_server_refuses_a_secret_context_and_a_foreign_one(session):
    # Prepare
    params, keys = session
    _, other = new_bfv_session("bfv-test", LAYOUT, GAMMA, BOUNDS)

    # Execute / Assert
    with pytest.raises(exceptions.SecretKeyNotAllowed):
        BFVBackend(params).combiner(public_context=keys.secret_context)
    with pytest.raises(exceptions.ParameterMismatch):
        BFVBackend(params).combiner(public_context=other.public_context)
    with pytest.raises(exceptions.InvalidKey):
        BFVBackend(params).reveal(_combine(params, keys, [BFVBackend(params).protect(
            _vectors(1)[0], public_context=keys.public_context)]), secret_context=keys.public_context)


@pytest.mark.security
def test_ciphertext_under_another_key_is_refused_or_caught(session):
    # Prepare: a payload made under a foreign key with the session's parameters, sealed as this session's
    params, keys = session
    _, other = new_bfv_session("bfv-test", LAYOUT, GAMMA, BOUNDS)
    words = fixedpoint.encode(_vectors(1)[0], tuple(params.backend_params["frac_bits"]))
    p = bfv_parameters(params)
    foreign = hzb.load_context(other.public_context, p, secret=False)
    bad = seal(params, "contribution", hzb.encrypt_words(foreign, p, words))
    be = BFVBackend(params)

    # Execute
    agg = _combine(params, keys, [bad, be.protect(_vectors(1, 1)[0], public_context=keys.public_context)])

    # Assert: decrypts to garbage far outside the declared bound, which the key holder refuses
    with pytest.raises(exceptions.SanityCheckFailed):
        be.reveal(agg, secret_context=keys.secret_context)


@pytest.mark.security
def test_reveal_refuses_an_aggregate_beyond_the_declared_bound(session):
    # Prepare: hospitals bypass the recipe and encrypt lane words far beyond the declared bound
    params, keys = session
    p = bfv_parameters(params)
    pub = hzb.load_context(keys.public_context, p, secret=False)
    words = np.zeros(fixedpoint.n_words(LAYOUT.length), dtype=np.int64)
    words[:LAYOUT.length] = 2**57
    bad = seal(params, "contribution", hzb.encrypt_words(pub, p, words))

    # Execute: the server cannot tell
    agg = _combine(params, keys, [bad] * 3)

    # Assert
    with pytest.raises(exceptions.SanityCheckFailed, match="declared aggregate bound"):
        BFVBackend(params).reveal(agg, secret_context=keys.secret_context)


@pytest.mark.security
def test_aggregate_without_noise_budget_is_not_decrypted(session):
    # Prepare: many more additions than the parameters hold (the server could add one payload repeatedly)
    params, keys = session
    be = BFVBackend(params)
    payload = be.protect(np.zeros(LAYOUT.length), public_context=keys.public_context)
    ctx = hzb.load_context(keys.public_context, bfv_parameters(params), secret=False)
    p = bfv_parameters(params)
    n = fixedpoint.n_words(LAYOUT.length)
    chunks = hzb.load_chunks(ctx, p, peek_header(payload).body, n)
    for _ in range(40):  # doubling 40 times: 2^40 copies of the noise, far beyond the budget
        for c in chunks:
            c.add_(c)
    agg = seal(params, "aggregate", hzb.dump_chunks(chunks, n), contributors=1)

    # Execute / Assert
    with pytest.raises(exceptions.SanityCheckFailed, match="noise budget"):
        be.reveal(agg, secret_context=keys.secret_context)


@pytest.mark.security
def test_malformed_and_wrong_scheme_bodies_refused(session):
    # Prepare
    params, keys = session
    be = BFVBackend(params)
    payload = be.protect(_vectors(1)[0], public_context=keys.public_context)
    body = peek_header(payload).body
    ckks_ctx = ts.context(ts.SCHEME_TYPE.CKKS, poly_modulus_degree=8192, coeff_mod_bit_sizes=[40, 40])
    ckks_ctx.global_scale = 2**20
    ckks_blob = ts.ckks_vector(ckks_ctx, [1.0]).serialize()

    # Execute / Assert
    acc = be.combiner(public_context=keys.public_context)
    with pytest.raises(exceptions.MalformedPayload):
        acc.add(seal(params, "contribution", b"XXXXXXXX" + body[8:]))
    with pytest.raises(exceptions.MalformedPayload):
        acc.add(seal(params, "contribution", body[:-3]))
    with pytest.raises(exceptions.InvalidContribution):
        acc.add(seal(params, "contribution", hzb._raw_body([ckks_blob] * 1, fixedpoint.n_words(LAYOUT.length))))
    pub = ts.context_from(keys.public_context)
    short = ts.bfv_vector(pub, [1, 2, 3]).serialize()  # a valid BFV ciphertext with the wrong slot count
    with pytest.raises(exceptions.InvalidContribution):
        acc.add(seal(params, "contribution", hzb._raw_body([short], fixedpoint.n_words(LAYOUT.length))))
    acc.add(payload)  # nothing accepted so far was lost
    assert acc.count == 1


def test_parameters_are_checked():
    # Prepare
    params = bfv_session_params("p", LAYOUT, GAMMA, BOUNDS)
    bp = dict(params.backend_params)

    # Execute / Assert
    with pytest.raises(exceptions.InvalidParameterError):
        hzb.BFVParameters.from_dict({**bp, "plain_modulus": 65537})
    with pytest.raises(exceptions.InvalidParameterError):
        hzb.BFVParameters(8192, (60, 60, 60, 60))  # 240 bits > 218: below 128-bit security
    with pytest.raises(exceptions.InvalidParameterError):
        many = Bounds(1.0, 100, 4000)  # lanes sized for 4000 hospitals, chain for 4: too little noise budget
        fb = list(fixedpoint.choose_frac_bits(many, GAMMA))
        BFVBackend(SessionParams("p", "bfv", LAYOUT, GAMMA, many, {**bp, "frac_bits": fb}))
    with pytest.raises(exceptions.InvalidParameterError):
        BFVBackend(params.with_backend_params(frac_bits=[60, 56]))  # lanes could wrap
