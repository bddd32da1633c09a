"""The ``split`` backend: masked vectors to the server, sealed seeds to the key holder, sums combined by the server.

In-process tests check the arithmetic and the seed boxes; the e2e tests drive
real server processes over HTTPS as the hospitals, the key holder and an
attacker would.
"""

from __future__ import annotations

import glob
import hashlib
import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secure_afl.backends import get_backend
from secure_afl import split
from secure_afl.exceptions import Forbidden, InsufficientContributors, InvalidContribution, PolicyViolation, \
    SanityCheckFailed, SecureAFLError
from secure_afl import domains
from secure_afl.hazmat import fixedpoint, flp
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.signing import sign_box_statement
from secure_afl.stats import local_statistics

LAYOUT = Layout(6, 3)
BOUNDS = Bounds(4.0, 1000, 8)


def _session(sid="split-unit"):
    # Goldilocks without the statement, signed explicitly: these tests read the masked words as two uint64 lanes
    params = split.split_session_params(sid, LAYOUT, 1.0, BOUNDS, field="goldilocks", gram_proof=False)
    keys = split.generate_keys(params)
    return split.bind_public_context(params, keys.public_context), keys


def _vectors(k, seed=7):
    """Packed statistics of k hospitals (rows of norm <= B): what the validity proof accepts."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(k):
        X = rng.normal(size=(40, LAYOUT.dim))
        X *= BOUNDS.max_norm / np.linalg.norm(X, axis=1, keepdims=True) * rng.uniform(0.1, 1.0, (40, 1))
        out.append(LAYOUT.pack(local_statistics(X, rng.integers(0, LAYOUT.n_classes, 40), LAYOUT.n_classes,
                                                gamma=1.0)))
    return out


# -- in-process: arithmetic and boxes ---------------------------------------------------------------
def test_masked_vector_alone_is_not_the_encoding():
    params, keys = _session()
    v = _vectors(1)[0]
    payload, st = get_backend(params).protect(v, public_context=keys.public_context, hospital="h1",
                                              identity_key=Ed25519PrivateKey.generate())
    words = get_backend(params).masked_words(payload)
    # the encoding's high lanes are small integers; masked words are spread over the whole ring
    assert np.count_nonzero(words == fixedpoint.encode(v, params.backend_params["frac_bits"])) <= 1
    assert float(np.mean(words.view(np.int64) > 0)) not in (0.0, 1.0)


def test_seed_box_refuses_other_session_hospital_or_payload():
    params, keys = _session()
    other, _ = _session("split-other")
    sha = hashlib.sha256(b"payload").hexdigest()
    box = split.seal_seed(params, keys.public_context, "h1", sha, os.urandom(32))
    assert len(split.open_seed(params, keys.secret_context, "h1", sha, box)) == 32
    for p, h, s in ((other, "h1", sha), (params, "h2", sha), (params, "h1", hashlib.sha256(b"x").hexdigest())):
        with pytest.raises(InvalidContribution, match=h):
            split.open_seed(p, keys.secret_context, h, s, box)


# -- e2e -------------------------------------------------------------------------------------------------
def _start(consortium, hospitals=("h1", "h2", "h3"), min_clients=2):
    c = consortium(backend="split", hospitals=hospitals, min_clients=min_clients).start()
    conn = c.connect_keyholder()
    c.keyholder.keygen(split.split_session_params(c.session_id, Layout(c.dim, c.classes), 1.0,
                                                  Bounds(c.max_norm, 1000, 8)))
    c.keyholder.publish(conn)
    return c, conn


def _upload(c, names):
    data = {h: c.data(h) for h in names}
    for h, (X, y) in data.items():
        cl = c.hospital(h)
        cl.submit(c.stats(X, y))
        cl.close()
    return data


def _masked_bodies(c) -> dict[str, bytes]:
    """What the server stored: the hospitals' masked payloads (the attacker's view of its own disk)."""
    from secure_afl.envelope import peek_header

    out = {}
    for f in glob.glob(str(c.root / "server" / c.session_id / "**" / "*"), recursive=True):
        if os.path.isfile(f):
            data = open(f, "rb").read()
            try:
                env = peek_header(data)
            except (SecureAFLError, TypeError, ValueError):
                continue
            if env.header.get("kind") == "contribution":
                out[hashlib.sha256(data).hexdigest()] = data
    return out


class _Recording:
    """The key holder's HTTP client, recording every body it downloaded."""

    def __init__(self, conn):
        self.conn, self.downloaded = conn, []
        orig = conn.request

        def request(*a, **kw):
            r = orig(*a, **kw)
            self.downloaded.append(r.content)
            return r

        conn.request = request


@pytest.mark.e2e
def test_split_session_equals_plain_and_keyholder_sees_no_masked_vector(consortium):
    # Prepare: three hospitals, h3 never uploads (a dropout: simply absent)
    from secure_afl.analytic import centralised_weights
    from secure_afl.keyholder.release import HTTPSource

    c, conn = _start(consortium)
    rec = _Recording(conn)
    data = _upload(c, ["h1", "h2"])
    # Execute
    res = c.keyholder.finalize(conn, min_clients=2)
    # Assert: the release is h1's and h2's (h3 absent), equal to the pooled plaintext solve
    X_all = np.concatenate([data[h][0] for h in ("h1", "h2")])
    y_all = np.concatenate([data[h][1] for h in ("h1", "h2")])
    W_joint = centralised_weights(X_all, y_all, c.classes)
    assert res.report["participants"] == ["h1", "h2"] and res.report["contributors"] == 2
    assert np.linalg.norm(res.W - W_joint) / np.linalg.norm(W_joint) <= 1e-9
    params = c.keyholder.params(c.session_id)
    # the key holder downloaded no masked vector, nor any 16-byte run of one
    masked = _masked_bodies(c)
    assert len(masked) == 2
    for body in masked.values():
        words = body[-8 * fixedpoint.n_words(params.layout.length):]
        for got in rec.downloaded:
            assert words[:16] not in got and words[-16:] not in got
    # and no second share under the same seeds: finalize run again gives back the one release, from the sum the
    # key holder kept, and a fresh share is refused
    with c.connect_keyholder() as again:
        assert np.array_equal(c.keyholder.finalize(again, min_clients=2).W, res.W)
        with pytest.raises(PolicyViolation) as second:
            c.keyholder.release_split(c.session_id, HTTPSource(again), min_clients=2)
    assert second.value.reason == "key_used"
    conn.close()


@pytest.mark.e2e
def test_curious_keyholder_gets_no_masked_vector_from_any_route(consortium):
    # Prepare: a run as the protocol gives it; then the key holder, holding every seed, asks for more
    c, conn = _start(consortium)
    data = _upload(c, ["h1", "h2"])
    c.keyholder.finalize(conn, min_clients=2)
    params = c.keyholder.params(c.session_id)
    victim = Layout(c.dim, c.classes).pack(c.stats(*data["h1"]))
    # Execute: the routes that serve uploads or the stored sum to the key holder
    recovered = []
    for path in (conn.path("/contributions/h1"), conn.path("/aggregate")):
        try:
            payload = conn.request("GET", path).content
        except Forbidden:
            continue
        tags = conn.request("GET", conn.path("/tags")).json()
        box = bytes.fromhex(tags["h1"]["box"])
        seed = split.open_seed(params, c.keyholder.secret_context(c.session_id), "h1",
                               tags["h1"]["payload_sha256"], box)
        F, n = split.field_of(params), split.main_words(params)
        words = get_backend(params).masked_words(payload) if path.endswith("h1") else \
            F.from_bytes(payload[-F.ENCODED_SIZE * n:], n)
        words = F.sub(words, F.expand_field(seed, words.shape[0], split.DOMAIN_SHARE))
        fb = tuple(params.backend_params["frac_bits"])
        recovered.append(fixedpoint.decode(flp.decode_signed(words).view(np.uint64), fb) if F is flp.GOLDILOCKS
                         else np.ldexp(F.decode_signed_float(words), -(fb[0] + fb[1])))
    conn.close()
    # Assert: every route refused; had one answered, the victim's statistics would be in ``recovered``
    assert not any(np.allclose(r[:victim.shape[0]], victim, rtol=1e-9, atol=1e-6) for r in recovered)
    assert recovered == []


@pytest.mark.e2e
def test_subset_attack_gets_garbage_and_a_victim_only_manifest_is_refused(consortium):
    # Prepare: h1, h2, h3 upload; the server is the attacker and keeps what it is given
    from secure_afl import pki
    from secure_afl.envelope import seal
    from secure_afl.keyholder.release import HTTPSource
    from secure_afl.signing import build_manifest

    c, conn = _start(consortium, min_clients=2)
    data = _upload(c, ["h1", "h2", "h3"])
    conn.request("POST", conn.path("/close"))
    params = c.keyholder.params(c.session_id)
    be = get_backend(params)
    manifest = conn.request("GET", conn.path("/manifest")).json()
    masked = _masked_bodies(c)
    by_h = {p["hospital"]: masked[p["payload_sha256"]] for p in manifest["participants"]}
    # Execute 1: the server signs a manifest naming only the victim, hoping for -PRG(s_h1)
    server_key = pki.load_party(c.pki_dir, "server", "aggregator").identity_key()
    enrolled = pki.enrolled_keys(pki.load_enrolments(c.pki_dir, role="hospital"))
    one = build_manifest(server_key, c.session_id, params.digest(),
                         [p for p in manifest["participants"] if p["hospital"] == "h1"],
                         hashlib.sha256(by_h["h1"]).digest(), 1, enrolled=enrolled)

    class Forged:
        def manifest(self):
            return one

        def tags(self):
            return conn.request("GET", conn.path("/tags")).json()

        def split_queries(self, queries):
            return HTTPSource(conn).split_queries(queries)

    F = split.field_of(params)  # the session's field (Field128 by default)
    got = None
    try:
        b1, _ = c.keyholder.release_split(c.session_id, Forged(), min_clients=2)
        got = F.from_bytes(b1)  # a share for the victim alone: with h1's masked vector, h1's statistics
    except InsufficientContributors:
        pass
    # Execute 2: the genuine share (for the cohort h1, h2, h3), combined with h2's and h3's masked vectors only
    body, statement = c.keyholder.release_split(c.session_id, HTTPSource(conn), min_clients=2)
    share = split.verify_share(params, manifest, body, statement, c.keyholder.party.identity_key().public_key())
    sub = F.add(be.masked_words(by_h["h2"]), be.masked_words(by_h["h3"]))
    conn.close()
    # Assert: the victim-only manifest got no share; the subset sum unmasks to garbage, refused by the bound
    assert got is None
    with pytest.raises(SanityCheckFailed):
        split.collect(params, seal(params, "aggregate", F.to_bytes(sub)), share)
    full = F.add(sub, be.masked_words(by_h["h1"]))
    ok = split.collect(params, seal(params, "aggregate", F.to_bytes(full)), share)
    assert np.all(np.isfinite(ok))  # the same share over the whole cohort does unmask


@pytest.mark.e2e
def test_forged_or_replayed_seed_statement_is_refused_naming_the_hospital(consortium):
    # Prepare
    from secure_afl.keyholder.release import HTTPSource

    c, conn = _start(consortium)
    _upload(c, ["h1", "h2"])
    conn.request("POST", conn.path("/close"))
    real = HTTPSource(conn)
    tags = real.tags()

    class Relay:  # the server relays the statements, so it chooses them
        def __init__(self, t):
            self.t = t

        def manifest(self):
            return real.manifest()

        def tags(self):
            return self.t

        def split_queries(self, queries):
            return real.split_queries(queries)

    # Execute / Assert: h2's statement relayed for h1 (another hospital's envelope)
    swapped = {"h1": {**tags["h2"]}, "h2": tags["h2"]}
    with pytest.raises(SecureAFLError, match="h1"):
        c.keyholder.release_split(c.session_id, Relay(swapped), min_clients=2)
    conn.close()


@pytest.mark.e2e
def test_upload_with_another_hospitals_seed_statement_is_refused(consortium):
    # Prepare: h1 protects normally; h2 replays h1's signed seed statement with its own payload
    c, conn = _start(consortium)
    h1, h2 = c.hospital("h1"), c.hospital("h2")
    X, y = c.data("h1")
    params = h1.fetch_params()
    p1, st1 = h1.protect(params, c.stats(X, y))
    p2, _ = h2.protect(params, c.stats(*c.data("h2")))
    # Execute / Assert: refused at the upload, naming the hospital
    with pytest.raises(SecureAFLError, match="h2"):
        h2.upload(params, p2, tag=st1)
    # h1's own upload with its statement is still accepted: the refusal changed nothing
    h1.upload(params, p1, tag=st1)
    h1.close()
    h2.close()
    conn.close()


@pytest.mark.e2e
def test_seed_statement_with_a_forged_signature_is_refused_at_upload(consortium):
    # Prepare: h1's honest statement, its fields untouched, signed by a key that is not h1's
    c, conn = _start(consortium)
    h1 = c.hospital("h1")
    params = h1.fetch_params()
    p1, st1 = h1.protect(params, c.stats(*c.data("h1")))
    unsigned = {k: v for k, v in st1.items() if k != "signature"}
    forged = sign_box_statement(Ed25519PrivateKey.generate(), domains.SPLIT_SEED, unsigned)
    # Execute / Assert: refused at the upload; the genuine statement is still accepted afterwards
    with pytest.raises(SecureAFLError):
        h1.upload(params, p1, tag=forged)
    h1.upload(params, p1, tag=st1)
    h1.close()
    conn.close()


def test_every_upload_draws_a_fresh_seed():
    # Prepare
    params, keys = _session()
    be, key, v = get_backend(params), Ed25519PrivateKey.generate(), _vectors(1)[0]
    # Execute: the same vector protected twice
    a, sa = be.protect(v, public_context=keys.public_context, hospital="h1", identity_key=key)
    b, sb = be.protect(v, public_context=keys.public_context, hospital="h1", identity_key=key)
    # Assert: different masks (their difference is not zero anywhere it could be by chance)
    diff = be.masked_words(a) - be.masked_words(b)
    assert np.count_nonzero(diff) >= diff.shape[0] - 2
    assert split.open_seed(params, keys.secret_context, "h1", sa["payload_sha256"], bytes.fromhex(sa["box"])) != \
        split.open_seed(params, keys.secret_context, "h1", sb["payload_sha256"], bytes.fromhex(sb["box"]))
