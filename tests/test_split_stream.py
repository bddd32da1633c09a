"""split verdicts formed as the uploads arrive: the same verdicts and the same release as judging at the deadline.

The key holder judges each accepted upload while the session is open
(``KeyHolder.judge_split``): it derives the upload's query seed from its own
key and the hospital-signed commitment, the server forms its signed verifier
message at that seed, the key holder decides. These tests drive the real
server over HTTPS, a cheating hospital included, and a server whose messages
were formed at a seed of its own or for another upload.
"""

from __future__ import annotations

import hashlib
import hmac
import json

import numpy as np
import pytest

from secure_afl import pki
from secure_afl import domains, split
from secure_afl.backends import get_backend
from secure_afl.encoding import canonical_json
from secure_afl.exceptions import DecryptionRefused, PolicyViolation
from secure_afl.hazmat import flp
from secure_afl.keyholder.release import HTTPSource
from secure_afl.keyholder.split_stream import SplitJudge
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.release_checks import ReleaseLedger
from support.sessions import cheating_upload, honest_upload, open_split_session


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
def test_streaming_and_release_time_verdicts_and_sums_are_the_same(consortium, monkeypatch):
    results = {}
    for mode in ("streaming", "at release"):
        # Prepare: h1, h2 honest, h3 cheats; the same statistics in both sessions
        c, conn = open_split_session(consortium)
        opened = []  # the sealed seed key's openings (each one runs the passphrase KDF)
        monkeypatch.setattr(c.keyholder, "secret_context",
                            lambda sid, _orig=type(c.keyholder).secret_context.__get__(c.keyholder):
                            opened.append(sid) or _orig(sid))
        streamed = []
        for name, upload in (("h1", honest_upload), ("h2", honest_upload), ("h3", cheating_upload)):
            upload(c, name, seed={"h1": 1, "h2": 2, "h3": 3}[name])
            if mode == "streaming":  # judged while the session is open, upload by upload
                assert conn.info()["status"] != "released"
                streamed.append(c.keyholder.judge_split(conn))
        sent = _paths(conn)
        # Execute
        res = c.keyholder.finalize(conn, min_clients=2)
        conn.close()
        queries = [p for m, p in sent if m == "POST" and p.endswith("/split/queries")]
        # one opening per session in this process: the release takes the key the judge opened
        assert opened == [c.session_id]
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


def _keyless_hmac(params, hospital, payload_sha256, validity):
    return hmac.new(b"", domains.SPLIT_QUERY + _upload(params, hospital, payload_sha256, validity),
                    hashlib.sha256).digest()


def _keyless_hash(params, hospital, payload_sha256, validity):
    return hashlib.sha256(domains.SPLIT_QUERY + _upload(params, hospital, payload_sha256, validity)).digest()


def _upload(params, hospital, payload_sha256, validity) -> bytes:
    """The committed upload the query seed covers, as anyone holding the signed statement can write it."""
    return canonical_json({"session_id": params.session_id, "params_digest": params.digest().hex(),
                           "hospital": hospital, "payload_sha256": payload_sha256, "validity": validity})


class _Predicting(HTTPSource):
    """A server colluding with a hospital (it holds that hospital's mask seed), which forms its verifier message
    for the hospital's upload before the key holder's query for it exists, at the query seed it predicts.

    It forwards the queries of the other uploads to the real server and learns from them which derivation
    anyone can compute (no key, the query seed being the same every time, ...) gives the seeds it is sent;
    its message is the opposite of the key holder's own (which it computes from the seed it holds), so the
    two sum to zero and every check passes, whatever the upload."""

    GUESSES = {"hmac-no-key": _keyless_hmac, "sha256-no-key": _keyless_hash}

    def __init__(self, conn, params, server_key):
        super().__init__(conn)
        self.params, self.key, self.circuit = params, server_key, split.Circuit(params)
        self.seen: list = []  # (hospital, payload hash, validity, the query seed the key holder sent)
        self.formed: dict = {}

    def split_queries(self, queries):
        honest = {h: q for h, q in queries.items() if h not in self.formed}
        statements = self.split_statements()
        self.seen += [(h, q["payload_sha256"], statements[h]["validity"], bytes.fromhex(q["query_seed"]))
                      for h, q in honest.items()]
        got = super().split_queries(honest) if honest else {}
        return {**got, **{h: self.formed[h] for h in queries if h in self.formed}}

    def predict(self, hospital, payload_sha256, validity) -> bytes:
        for guess in self.GUESSES.values():
            if all(guess(self.params, h, sha, v) == qs for h, sha, v, qs in self.seen):
                return guess(self.params, hospital, payload_sha256, validity)
        return self.seen[-1][3]  # none fits: perhaps the same seed every time

    def form_before_the_query(self, hospital, payload, statement, seed):
        sha = hashlib.sha256(payload).hexdigest()
        qs = self.predict(hospital, sha, statement["validity"])
        c = self.circuit
        own = c.query(c.helper_share(seed), split.UploadCommitment.from_dict(statement["validity"]), hospital, qs,
                      leader=False)
        self.formed[hospital] = split.sign_verifier_message(self.params, hospital, sha, qs, flp.neg(own), self.key)


@pytest.mark.e2e
def test_a_verifier_message_for_another_upload_is_refused(consortium):
    # Prepare: two honest uploads; the server answers the key holder's queries with each other's messages
    c, conn = open_split_session(consortium)
    honest_upload(c, "h1", 1)
    honest_upload(c, "h2", 2)
    ledger = ReleaseLedger(c.keyholder.keys_dir / "releases.sqlite3")
    # Execute: the key holder's streaming pass over that source
    try:
        with pytest.raises(DecryptionRefused, match="verifier message"):
            SplitJudge(c.keyholder, c.session_id).poll(_Swapping(conn), ledger)
    finally:
        ledger.close()
    # Assert: the key is blocked, so no release follows on anything this server presents
    with pytest.raises(PolicyViolation, match="blocked"):
        c.keyholder.finalize(conn, min_clients=2)
    conn.close()


@pytest.mark.e2e
@pytest.mark.parametrize("derivation", ["keyed", "hmac-no-key", "sha256-no-key", "constant"])
def test_a_message_formed_before_the_query_gets_an_invalid_upload_accepted_only_if_the_seed_is_predictable(
        consortium, monkeypatch, derivation):
    # Prepare: the key holder's query seed as the library derives it (keyed), or weakened as a regression would
    if derivation == "constant":
        monkeypatch.setattr(split, "query_seed", lambda *a: b"\x07" * 32)
    elif derivation != "keyed":
        monkeypatch.setattr(split, "query_seed", lambda key, *a: _Predicting.GUESSES[derivation](*a))
    # Goldilocks without the statement, signed explicitly: the forged messages below are Goldilocks words
    c, conn = open_split_session(consortium, split={"field": "goldilocks", "gram_proof": False})
    params = c.keyholder.params(c.session_id)
    source = _Predicting(conn, params, pki.load_party(c.pki_dir, "server", "aggregator").identity_key())
    judge, ledger = SplitJudge(c.keyholder, c.session_id), ReleaseLedger(c.keyholder.keys_dir / "releases.sqlite3")
    try:
        # an honest upload, judged while the session is open: the server sees the key holder's query for it
        honest_upload(c, "h1", 1)
        judge.poll(source, ledger)
        # Execute: h3's upload breaks the bounds; the server forms its message for it at once, then the key
        # holder's next pass asks for it
        payload, statement, seed = cheating_upload(c, "h3", 3)
        source.form_before_the_query("h3", payload, statement, seed)
        if derivation == "keyed":
            # Assert: the message is not at the key holder's seed: refused, the key blocked, no release
            with pytest.raises(DecryptionRefused, match="query seed"):
                judge.poll(source, ledger)
            with pytest.raises(PolicyViolation, match="blocked"):
                c.keyholder.finalize(conn, min_clients=2)
        else:
            # Assert: the seed was predicted, the upload that breaks the bounds is judged valid
            judge.poll(source, ledger)
            assert judge.records()["h3"]["verdict"] is None and "h3" in judge.judged()[0]
    finally:
        ledger.close()
        conn.close()


@pytest.mark.e2e
def test_the_server_answers_one_query_per_upload_and_none_for_an_upload_it_does_not_hold(consortium):
    # Prepare: one accepted upload, judged once (its query answered)
    from secure_afl.exceptions import SecureAFLError

    c, conn = open_split_session(consortium)
    honest_upload(c, "h1", 1)
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
    honest_upload(c, "h2", 2)
    res = c.keyholder.finalize(conn, min_clients=2)
    assert res.report["refused"] == {} and res.report["participants"] == ["h1", "h2"]
    conn.close()


@pytest.mark.e2e
def test_the_judge_reads_only_new_statements_and_the_release_judges_what_the_server_left_out(consortium):
    # Prepare: a server that leaves h2's statement out of every streaming answer (it may: what it relays
    # while the session is open is unsigned by it), then h3 uploads
    c, conn = open_split_session(consortium)
    honest_upload(c, "h1", 1)
    honest_upload(c, "h2", 2)
    source = HTTPSource(conn)
    assert sorted(source.split_statements()) == ["h1", "h2"] and list(source.split_statements(after=1)) == ["h2"]
    assert source.split_statements(after=2) == {}
    for bad in ("-1", "x", "1e3", "9" * 10):  # refused with a reason, audited, nothing changes
        with pytest.raises(Exception, match="after"):
            conn.request("GET", conn.path("/split/statements") + f"?after={bad}")
    sent = _paths(conn)
    judge = SplitJudge(c.keyholder, c.session_id)
    judge.unlock(c.keyholder.secret_context(c.session_id))

    class Omits(HTTPSource):
        def split_statements(self, after=0):
            return {h: st for h, st in super().split_statements(after).items() if h != "h2"}

    ledger = ReleaseLedger(c.keyholder.keys_dir / "releases.sqlite3")
    try:
        first = judge.poll(Omits(conn), ledger)
        honest_upload(c, "h3", 3)
        second = judge.poll(Omits(conn), ledger)
    finally:
        ledger.close()
    # Assert: the second pass asked only for what came after the first one's statement, so h3 is judged
    # there; h2 is not judged while open
    assert sorted(first) == ["h1"] and sorted(second) == ["h1", "h3"]
    statement_reads = [p for m, p in sent if m == "GET" and "/split/statements" in p]
    assert statement_reads[-1].endswith("?after=1")
    # an accepted upload's record keeps no server message (only a refusal's does)
    assert all(r["server_message"] is None for r in judge.records().values())
    # the release asks for every participant by name: h2 is judged then, and all three are released
    res = c.keyholder.finalize(conn, min_clients=2)
    assert res.report["refused"] == {} and res.report["participants"] == ["h1", "h2", "h3"]
    refusals = [json.loads(line) for line in c.audit_path().read_text().splitlines()]
    refusals = [r for r in refusals if r["event"] == "split_statements"]
    assert len(refusals) == 4 and all(r["outcome"] != "accepted" for r in refusals)
    conn.close()


def test_the_share_from_a_judged_sum_is_the_cohorts_whatever_the_sum_covers():
    # Prepare: three honest uploads, sealed and signed as hospitals do
    import hashlib

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from secure_afl.hazmat import flp
    from secure_afl.stats import local_statistics

    lay = Layout(6, 3)
    params = split.split_session_params("judged-sum", lay, 1.0, Bounds(4.0, 1000, 8), field="goldilocks",
                                        gram_proof=False)  # the Goldilocks lanes this test sums
    keys = split.generate_keys(params)
    params = split.bind_public_context(params, keys.public_context)
    be = get_backend(params)
    rng = np.random.default_rng(5)
    manifest, statements, enrolled, seeds = {"participants": []}, {}, {}, {}
    for h in ("h1", "h2", "h3"):
        X = rng.normal(size=(20, lay.dim))
        X *= 2.0 / np.linalg.norm(X, axis=1, keepdims=True)
        ident = Ed25519PrivateKey.generate()
        payload, st = be.protect(lay.pack(local_statistics(X, rng.integers(0, 3, 20), 3, gamma=1.0)),
                                 public_context=keys.public_context, hospital=h, identity_key=ident)
        sha = hashlib.sha256(payload).hexdigest()
        manifest["participants"].append({"hospital": h, "payload_sha256": sha})
        statements[h], enrolled[h] = st, ident.public_key()
        seeds[h] = split.open_seed(params, keys.secret_context, h, sha, bytes.fromhex(st["box"]))
    n = 2 * lay.length

    def judged(hs):
        total = np.zeros(n, dtype=np.uint64)
        for h in hs:
            total = flp.add(total, flp.neg(flp.expand_field(seeds[h], n, split.DOMAIN_SHARE)))
        return {h: split.seed_digest(seeds[h]) for h in hs}, total

    def share(**kw):
        return split.keyholder_share(params, keys.secret_context, manifest, statements, enrolled, **kw)

    # Execute / Assert: from nothing, from a sum over part of the cohort, over all of it, over more than the
    # cohort (h3 refused after it was summed), and under a stale seed: always the cohort's masks
    fresh, without_h3 = share(), share(refused={"h3": "linear"})
    assert np.array_equal(share(judged=judged(["h1"])), fresh)
    assert np.array_equal(share(judged=judged(["h1", "h2", "h3"])), fresh)
    assert np.array_equal(share(refused={"h3": "linear"}, judged=judged(["h1", "h2", "h3"])), without_h3)
    stale = judged(["h1", "h2"])
    stale[0]["h2"] = split.seed_digest(b"\0" * 32)
    assert np.array_equal(share(judged=stale), fresh)
    assert not np.array_equal(without_h3, fresh)


@pytest.mark.e2e
def test_keyholder_judge_command_prints_each_verdict_once_the_upload_is_in(consortium, tmp_path):
    # Prepare: an honest upload and a cheat, the session still open
    import os
    import subprocess
    import sys

    c, conn = open_split_session(consortium)
    honest_upload(c, "h1", 1)
    cheating_upload(c, "h3", 3)
    phrase = tmp_path / "passphrase"
    phrase.write_bytes(b"test passphrase")
    phrase.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k != "SECURE_AFL_KEY_PASSPHRASE"}
    # Execute: one pass of the command an operator runs beside the server
    out = subprocess.run([sys.executable, "-m", "secure_afl.cli", "keyholder", "judge", "--pki", str(c.pki_dir),
                          "--keys", str(c.root / "keys"), "--passphrase-file", str(phrase), "--server", c.url,
                          "--session", c.session_id, "--once"], capture_output=True, text=True, timeout=300, env=env)
    # Assert: both verdicts, formed while the session is open; the release takes them as they are
    assert out.returncode == 0, out.stderr
    assert "h1: valid" in out.stdout and "h3: refused (linear)" in out.stdout
    assert conn.info()["status"] != "released"
    honest_upload(c, "h2", 2)
    res = c.keyholder.finalize(conn, min_clients=2)
    assert res.report["refused"] == {"h3": "linear"} and res.report["participants"] == ["h1", "h2"]
    conn.close()
