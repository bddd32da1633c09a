"""split verdicts formed as the uploads arrive: the same verdicts and the same release as judging at the deadline.

The key holder judges each accepted upload while the session is open
(``KeyHolder.judge_split``): it derives the upload's query seed from its own
key and the hospital-signed commitment, the server forms its signed verifier
message at that seed, the key holder decides. These tests drive the real
server over HTTPS, a cheating hospital included, and a server whose messages
were formed at a seed of its own or for another upload.
"""

from __future__ import annotations

import numpy as np
import pytest

from secure_afl import pki
from secure_afl.backends import get_backend, split, split_validity
from secure_afl.exceptions import DecryptionRefused, PolicyViolation
from secure_afl.keyholder.release import HTTPSource
from secure_afl.keyholder.split_stream import SplitJudge
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.release_checks import ReleaseLedger


def _start(consortium, hospitals=("h1", "h2", "h3")):
    c = consortium(backend="split", hospitals=hospitals, min_clients=2).start()
    conn = c.connect_keyholder()
    c.keyholder.keygen(split.split_session_params(c.session_id, Layout(c.dim, c.classes), 1.0,
                                                  Bounds(c.max_norm, 1000, 8)))
    c.keyholder.publish(conn)
    return c, conn


def _honest(c, name, seed):
    cl = c.hospital(name)
    cl.submit(c.stats(*c.data(name, seed=seed)))
    cl.close()


def _cheat(c, name, seed):
    """A hospital's modified software: a well-formed, signed upload with one Gram entry of 2^61 / 2^f1."""
    cl = c.hospital(name)
    params = cl.fetch_params()
    be = get_backend(params)
    ctx = cl.conn.request("GET", cl.conn.path("/context"), signed=False).content
    lanes = be.circuit.lanes(Layout(c.dim, c.classes).pack(c.stats(*c.data(name, seed=seed)))).copy()
    lanes[1] = 1 << 61
    body, s, com = be.circuit.prove(name, lanes=lanes, check=False)
    payload, statement = be.seal_upload(body, s, com, ctx, name, cl.party.identity_key())
    cl.upload(params, payload, tag=statement)
    cl.close()


def _paths(conn):
    """Record every (method, path) the key holder's client sends."""
    sent = []
    orig = conn.request

    def request(method, path, *a, **kw):
        sent.append((method, path))
        return orig(method, path, *a, **kw)

    conn.request = request
    return sent


@pytest.mark.e2e
def test_streaming_and_release_time_verdicts_and_sums_are_the_same(consortium):
    results = {}
    for mode in ("streaming", "at release"):
        # Prepare: h1, h2 honest, h3 cheats; the same statistics in both sessions
        c, conn = _start(consortium)
        streamed = []
        for name, upload in (("h1", _honest), ("h2", _honest), ("h3", _cheat)):
            upload(c, name, seed={"h1": 1, "h2": 2, "h3": 3}[name])
            if mode == "streaming":  # judged while the session is open, upload by upload
                assert conn.info()["status"] != "released"
                streamed.append(c.keyholder.judge_split(conn))
        sent = _paths(conn)
        # Execute
        res = c.keyholder.finalize(conn, min_clients=2)
        conn.close()
        queries = [p for m, p in sent if m == "POST" and p.endswith("/split/queries")]
        results[mode] = (res, streamed, queries)
    (s, streamed, s_queries), (r, _, r_queries) = results["streaming"], results["at release"]
    # Assert: verdicts formed before the deadline, each upload judged once, and the release asked nothing more
    assert streamed[-1] == {"h1": None, "h2": None, "h3": "linear"}
    assert streamed[0] == {"h1": None}
    assert s_queries == [] and len(r_queries) == 1
    # the same refusals, cohort and released sums, bit for bit
    assert s.report["refused"] == r.report["refused"] == {"h3": "linear"}
    assert s.report["participants"] == r.report["participants"] == ["h1", "h2"]
    lay = Layout(s.params.layout.dim, s.params.layout.n_classes)
    assert np.array_equal(lay.pack(s.stats), lay.pack(r.stats))
    assert np.array_equal(s.W, r.W)


class _Swapping(HTTPSource):
    """The server's answers to the key holder's queries, h1's and h2's messages exchanged."""

    def split_queries(self, queries):
        got = super().split_queries(queries)
        if {"h1", "h2"} <= set(got):
            got["h1"], got["h2"] = got["h2"], got["h1"]
        return got


class _OwnSeed(HTTPSource):
    """A server that formed its messages at query seeds of its own (as it did before the key holder's)."""

    def __init__(self, conn, be, server_key, blobs):
        super().__init__(conn)
        self.be, self.key, self.blobs = be, server_key, blobs

    def split_queries(self, queries):
        import os

        statements = self.split_statements()
        return {h: split_validity.leader_message(self.be, h, self.blobs[h], statements[h], self.key, os.urandom(32))
                for h in queries}


@pytest.mark.e2e
@pytest.mark.parametrize("attack", ["another upload's message", "a message at the server's own seed"])
def test_a_verifier_message_for_another_upload_or_formed_before_the_query_is_refused(consortium, attack):
    # Prepare: two honest uploads; the server answers the key holder's queries with messages it should not
    c, conn = _start(consortium)
    _honest(c, "h1", 1)
    _honest(c, "h2", 2)
    params = c.keyholder.params(c.session_id)
    if attack == "another upload's message":
        source = _Swapping(conn)
    else:
        import glob  # the stored uploads, read from the server's own disk
        import hashlib

        blobs = {}
        for f in glob.glob(str(c.root / "server" / "**" / "*"), recursive=True):
            try:
                data = open(f, "rb").read()
            except (IsADirectoryError, PermissionError):
                continue
            blobs[hashlib.sha256(data).hexdigest()] = data
        st = HTTPSource(conn).split_statements()
        by_h = {h: blobs[s["payload_sha256"]] for h, s in st.items()}
        server_key = pki.load_party(c.pki_dir, "server", "aggregator").identity_key()
        source = _OwnSeed(conn, get_backend(params), server_key, by_h)
    ledger = ReleaseLedger(c.keyholder.keys_dir / "releases.sqlite3")
    # Execute: the key holder's streaming pass over that source
    try:
        with pytest.raises(DecryptionRefused, match="verifier message"):
            SplitJudge(c.keyholder, c.session_id).poll(source, ledger)
    finally:
        ledger.close()
    # Assert: the key is blocked, so no release follows on anything this server presents
    with pytest.raises(PolicyViolation, match="blocked"):
        c.keyholder.finalize(conn, min_clients=2)
    conn.close()


@pytest.mark.e2e
def test_the_server_answers_one_query_per_upload_and_none_for_an_upload_it_does_not_hold(consortium):
    # Prepare: one accepted upload, judged once (its query answered)
    from secure_afl.exceptions import SecureAFLError

    c, conn = _start(consortium)
    _honest(c, "h1", 1)
    c.keyholder.judge_split(conn)
    source = HTTPSource(conn)
    sha = source.split_statements()["h1"]["payload_sha256"]
    kept = source.split_queries({})  # nothing asked, nothing formed
    # Execute / Assert: another query seed for the same upload, and a query for an upload that is not there
    with pytest.raises(SecureAFLError, match="another query seed"):
        source.split_queries({"h1": {"payload_sha256": sha, "query_seed": "00" * 32}})
    with pytest.raises(SecureAFLError, match="no accepted upload of h2"):
        source.split_queries({"h2": {"payload_sha256": sha, "query_seed": "00" * 32}})
    # the message formed at the key holder's seed is unchanged, and the release goes on from it
    assert kept == {} and len(conn.request("GET", conn.path("/split/verifier")).json()) == 1
    _honest(c, "h2", 2)
    res = c.keyholder.finalize(conn, min_clients=2)
    assert res.report["refused"] == {} and res.report["participants"] == ["h1", "h2"]
    conn.close()
