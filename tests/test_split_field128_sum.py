"""A split session over Field128 sums ONE exact word per value: the integer ``hi 2^f2 + lo`` that secagg and bfv
sum as two lanes, masked, summed, unmasked and decoded in the session's field, and refused where an upload,
a share or a sum has another field's size."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secure_afl import split
from secure_afl.backends import get_backend
from secure_afl.envelope import open_envelope, seal
from secure_afl.exceptions import MalformedPayload, ParameterMismatch
from secure_afl.hazmat import fixedpoint
from secure_afl.hazmat.fields import GOLDILOCKS
from secure_afl.hazmat.field128 import FIELD128
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.stats import local_statistics

LAYOUT = Layout(6, 3)
BOUNDS = Bounds(2.0, 80, 6)


def _session(field="field128"):
    params = split.split_session_params("f128-sum", LAYOUT, 1.0, BOUNDS, field=field)
    keys = split.generate_keys(params)
    return split.bind_public_context(params, keys.public_context), keys


def _vectors(k, seed=3):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(k):
        n = 30 + 10 * i
        X = rng.normal(size=(n, LAYOUT.dim))
        X *= 0.95 * BOUNDS.max_norm / np.linalg.norm(X, axis=1, keepdims=True)
        out.append(LAYOUT.pack(local_statistics(X, rng.integers(0, LAYOUT.n_classes, n), LAYOUT.n_classes)))
    return out


def _upload_all(params, keys, vectors):
    be = get_backend(params)
    acc, participants, statements, enrolled, payloads = be.combiner(), [], {}, {}, {}
    for i, v in enumerate(vectors):
        h, key = f"h{i}", Ed25519PrivateKey.generate()
        payload, st = be.protect(v, public_context=keys.public_context, hospital=h, identity_key=key)
        acc.add(payload)
        participants.append({"hospital": h, "payload_sha256": hashlib.sha256(payload).hexdigest()})
        statements[h], enrolled[h], payloads[h] = st, key.public_key(), payload
    return be, acc, {"participants": participants}, statements, enrolled, payloads


def test_the_signed_scale_is_secaggs_and_the_one_word_is_its_two_lanes_combined():
    # Prepare
    params, _ = _session()
    c = split.Circuit(params)
    f1, f2 = params.backend_params["frac_bits"]
    v = _vectors(1)[0]
    # Execute
    word = c.lanes(v)
    # Assert: secagg's own scale, and each word is hi 2^f2 + lo of secagg's lanes, exactly
    assert (f1, f2) == fixedpoint.choose_frac_bits(BOUNDS, 1.0)
    assert word.dtype == FIELD128.dtype and word.shape == (LAYOUT.length,)
    lanes = fixedpoint.encode(v, (f1, f2)).view(np.int64)
    want = [int(h) * (1 << f2) + int(lo) for h, lo in zip(lanes[:LAYOUT.length], lanes[LAYOUT.length:])]
    assert [int(x) for x in FIELD128.decode_signed(word)] == want
    # a value past 2^64 round-trips: the word is wider than either lane
    assert max(abs(x) for x in want) > 1 << 64


def test_a_field128_round_releases_secaggs_float64_sum_and_every_mask_cancels():
    # Prepare
    params, keys = _session()
    vectors = _vectors(4)
    # Execute
    be, acc, manifest, statements, enrolled, _ = _upload_all(params, keys, vectors)
    share = split.keyholder_share(params, keys.secret_context, manifest, statements, enrolled)
    total = split.collect(params, acc.aggregate(), share)
    # Assert: the share is one Field128 word per value, and the release is the two-lane decode bit for bit
    assert share.dtype == FIELD128.dtype and share.shape == (LAYOUT.length,)
    fb = tuple(params.backend_params["frac_bits"])
    want = fixedpoint.decode(fixedpoint.fixed_point_sum(vectors, fb), fb)
    assert np.array_equal(total, want)


def test_the_combiners_partial_sums_merge_to_the_one_running_sum():
    # Prepare
    params, keys = _session()
    be, whole, manifest, statements, enrolled, payloads = _upload_all(params, keys, _vectors(3))
    a, b = be.combiner(), be.combiner()
    # Execute: the uploads split over two combiners, the second's partial merged into the first
    a.add(payloads["h0"])
    b.add(payloads["h1"])
    b.add(payloads["h2"])
    with pytest.raises(MalformedPayload, match="wrong length"):  # half a Field128 word short
        a.merge(b.partial()[:-8], 1)
    a.merge(b.partial(), b.count)
    # Assert
    assert len(b.partial()) == FIELD128.ENCODED_SIZE * LAYOUT.length
    assert a.aggregate() == whole.aggregate()


def test_a_goldilocks_sized_upload_share_or_sum_is_refused_in_a_field128_session():
    # Prepare: a field128 session, and an honest upload of the same statistics over Goldilocks
    params, keys = _session()
    gparams, gkeys = _session("goldilocks")
    be, acc, manifest, statements, enrolled, payloads = _upload_all(params, keys, _vectors(2))
    gbe = get_backend(gparams)
    gpayload, _ = gbe.protect(_vectors(1)[0], public_context=gkeys.public_context, hospital="h9",
                              identity_key=Ed25519PrivateKey.generate())
    # the Goldilocks body sealed under the field128 session: what a hospital's stale software would send
    forged = seal(params, "contribution", open_envelope(gparams, gpayload, "contribution").body)
    before = acc.partial()
    # Execute / Assert: refused at the combiner, the sum unchanged
    with pytest.raises(MalformedPayload, match="split upload"):
        acc.add(forged)
    assert acc.partial() == before and acc.count == 2
    before = acc.aggregate()
    # a Goldilocks-sized share (2L words) does not unmask a field128 sum
    gshare = split.keyholder_share(params, keys.secret_context, manifest, statements, enrolled)
    with pytest.raises(MalformedPayload, match="wrong length|session's field"):
        split.collect(params, before, np.zeros(2 * LAYOUT.length, dtype=np.uint64))
    assert np.all(np.isfinite(split.collect(params, before, gshare)))
    # a Goldilocks masked sum has a field128 sum's length (2L 8-byte words, L 16-byte ones), but it is sealed
    # under the other session's parameters, field included: the server's cohort sum and the collector refuse it
    gsum = seal(gparams, "aggregate", GOLDILOCKS.to_bytes(np.zeros(2 * LAYOUT.length, dtype=np.uint64)),
                contributors=2)
    with pytest.raises(ParameterMismatch):
        split.cohort_masked_sum(params, gsum, [], 2)
    with pytest.raises(ParameterMismatch):
        split.collect(params, gsum, gshare)


def test_a_refused_upload_is_taken_out_of_a_field128_sum_word_for_word():
    # Prepare
    params, keys = _session()
    vectors = _vectors(3)
    be, acc, manifest, statements, enrolled, payloads = _upload_all(params, keys, vectors)
    # Execute: the cohort without h2, as the server forms it, with the key holder's share over that cohort
    cohort = split.cohort_masked_sum(params, acc.aggregate(), [payloads["h2"]], 2)
    share = split.keyholder_share(params, keys.secret_context, manifest, statements, enrolled,
                                  refused={"h2": "linear"})
    total = split.collect(params, cohort, share)
    # Assert
    fb = tuple(params.backend_params["frac_bits"])
    assert np.array_equal(total, fixedpoint.decode(fixedpoint.fixed_point_sum(vectors[:2], fb), fb))


@pytest.mark.e2e
@pytest.mark.parametrize("gram", [False, True], ids=["plain", "gram"])
def test_a_field128_session_runs_end_to_end_through_the_real_server(consortium, gram):
    # Prepare: a split session signed over field128 (with the exact Gram statement or without) by the key
    # holder, two of three hospitals upload
    from secure_afl.analytic import centralised_weights

    section = {"field": "field128", "gram_proof": gram}
    c = consortium(backend="split", hospitals=("h1", "h2", "h3"), min_clients=2, split=section).start()
    conn = c.connect_keyholder()
    c.keyholder.keygen(split.split_session_params(c.session_id, Layout(c.dim, c.classes), 1.0,
                                                  Bounds(c.max_norm, 1000, 8), field="field128", gram_proof=gram))
    c.keyholder.publish(conn)
    data = {h: c.data(h) for h in ("h1", "h2")}
    for h, (X, y) in data.items():
        cl = c.hospital(h)
        cl.submit(c.stats(X, y))
        cl.close()
    # Execute
    res = c.keyholder.finalize(conn, min_clients=2)
    conn.close()
    # Assert: the signed session is field128 and its release is the pooled plaintext solve, from exactly the
    # float64 sum secagg's encoding gives
    params = c.keyholder.params(c.session_id)
    assert params.backend_params["field"] == "field128" and split.gram_enabled(params) == gram
    X_all = np.concatenate([data[h][0] for h in data])
    y_all = np.concatenate([data[h][1] for h in data])
    W_joint = centralised_weights(X_all, y_all, c.classes)
    assert res.report["participants"] == ["h1", "h2"] and res.report["contributors"] == 2
    assert np.linalg.norm(res.W - W_joint) / np.linalg.norm(W_joint) <= 1e-9
