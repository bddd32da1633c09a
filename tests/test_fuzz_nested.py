"""Malformed and deeply nested JSON on every route, header and body: a 4xx with a reason, an audit record.

In process (the real app over the real server, SQLite and audit log) for
rate; a real-process portion over TLS checks the same through uvicorn and
that the server log holds no traceback. ``-m slow`` runs >= 100,000 cases.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
import tempfile
import time

import pytest
import asyncio

import httpx

from secure_afl import pki
from secure_afl.protocol import API, H_NONCE, H_PARTY, H_SIGNATURE, H_TAG, H_TIME, H_UPLOAD, sign_request
from secure_afl.server import aggregator, peer_auth, status
from secure_afl.server.aggregator import open_server
from secure_afl.server.app import create_app
from secure_afl.server.config import ServerConfig
from secure_afl.params import Bounds
from secure_afl.signing import sign_upload

from support import Consortium

pytestmark = pytest.mark.security

HOSPITALS = ("hosp-a", "hosp-b", "hosp-c")
SHAPES = ("list", "dict", "mixed", "unclosed", "in_value")
DEPTHS = (33, 40, 100, 1_000, 5_000, 20_000)


def nested(depth: int, shape: str, rng: random.Random) -> str:
    """A JSON-looking text nested ``depth`` levels deep."""
    if shape == "list":
        return "[" * depth + "1" + "]" * depth
    if shape == "dict":
        return '{"a":' * depth + "1" + "}" * depth
    if shape == "mixed":
        motif = [rng.choice(("[", '{"k":')) for _ in range(8)]
        opens = motif * (depth // 8) + motif[: depth % 8]
        return "".join(opens) + "0" + "".join("]" if o == "[" else "}" for o in reversed(opens))
    if shape == "unclosed":
        return "[" * depth
    # a plausible object whose one field is the deep part
    return '{"hospital":"hosp-a","payload_sha256":' + "[" * depth + '"x"' + "]" * depth + "}"


@pytest.fixture(scope="module")
def consortium(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    pki.init_ca(d, name="fuzz tests")
    pki.issue(d, "server", "aggregator")
    pki.issue(d, "keyholder", "keyholder")
    for h in HOSPITALS:
        pki.issue(d, "hospital", h)
    return d


def _config(consortium, data_dir, backend, sid):
    cfg = ServerConfig(session_id=sid, backend=backend, dim=4, classes=3, gamma=1.0,
                       bounds=Bounds(max_norm=2.0, n_max=100, k_max=8), min_clients=2, data_dir=data_dir,
                       pki_dir=consortium, hospitals=list(HOSPITALS), max_upload_bytes=1 << 20, deadline_s=3600,
                       secagg_threshold=2, secagg_neighbours=0)
    from secure_afl.session.signed import sign_definition

    (consortium / "sessions" / f"{sid}.json").unlink(missing_ok=True)
    sign_definition(cfg.definition, consortium)
    return cfg


class Target:
    """One in-process server (plain, ckks or secagg) and the requests that reach its parsers."""

    def __init__(self, consortium, data_dir, backend):
        self.pki = consortium
        self.server = open_server(_config(consortium, data_dir, backend, f"fz-{backend}"))
        self.app = create_app(self.server)
        self.client: httpx.AsyncClient | None = None  # bound to the event loop of a run
        self.sid = self.server.config.session_id
        self.backend = backend
        self.log = self.server.dir / "audit.jsonl"

    def close(self):
        aggregator.shutdown(self.server)

    def path(self, suffix=""):
        return f"{API}/sessions/{self.sid}{suffix}"

    def party(self, name, role="hospital"):
        return pki.load_party(self.pki, role, name)

    def signed(self, method, suffix, party, body=b"", extra=None):
        path = self.path(suffix)
        h = sign_request(party.identity_key(), f"{party.role}:{party.name}", method, path, body)
        h.update(extra or {})
        return self.client.request(method, path, content=body, headers=h)

    def upload(self, body: bytes, statement_header: str | None, tag_header: str | None = None):
        h = {}
        if statement_header is not None:
            h[H_UPLOAD] = statement_header
        if tag_header is not None:
            h[H_TAG] = tag_header
        return self.client.post(self.path("/uploads"), content=body, headers=h)

    def statement(self, body: bytes, name="hosp-a") -> str:
        digest = self.server.params.digest() if self.server.params else b"\0" * 32
        st = sign_upload(self.party(name).identity_key(), self.sid, digest, hashlib.sha256(body).digest(), name)
        return json.dumps(st, separators=(",", ":"))

    def envelope(self, header_text: str) -> bytes:
        hb = header_text.encode()
        return b"SAFLPAY1" + struct.pack("<I", len(hb)) + hb + b"\0" * 16


def _cases(target: Target):
    """(name, callable(text) -> response) for every place a JSON text enters this target."""
    out = [
        ("upload_statement_header", lambda t: target.upload(b"x", t)),
        ("upload_tag_header", lambda t: target.upload(b"x", target.statement(b"x"), t)),
        ("request_party_header", lambda t: target.client.get(target.path("/manifest"), headers={
            H_PARTY: t, H_TIME: "1", H_NONCE: "0" * 32, H_SIGNATURE: "00"})),
        ("request_signature_headers", lambda t: target.client.get(target.path("/manifest"), headers={
            H_PARTY: "hospital:hosp-a", H_TIME: t[:200], H_NONCE: t[:32], H_SIGNATURE: t[:128]})),
        ("countersign_body", lambda t: target.signed("POST", "/audit/countersign",
                                                     target.party("keyholder", "keyholder"), t.encode())),
        ("session_id_path", lambda t: target.client.get(f"{API}/sessions/{t[:2000]}")),
    ]
    if target.backend != "ckks":
        out.append(("envelope_header", lambda t: (lambda p: target.upload(p, target.statement(p)))(
            target.envelope(t))))
    if target.backend == "ckks":
        out.append(("context_body", lambda t: target.signed("POST", "/context",
                                                             target.party("keyholder", "keyholder"), t.encode())))
    if target.backend == "secagg":
        for stage in ("setup", "advertise_keys", "share_keys", "unmask", "consistency"):
            out.append((f"secagg_{stage}_body", lambda t, s=stage: target.signed(
                "POST", f"/secagg/{s}", target.party("hosp-a"), t.encode())))
    return out


def _run(targets, n_cases: int, seed: int) -> dict:
    """Drive the ASGI apps directly (httpx's ASGI transport, one event loop): no sockets, no portals."""

    async def go():
        for t in targets:
            t.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=t.app), base_url="http://fuzz")
        try:
            return await _cases_loop(targets, n_cases, seed)
        finally:
            for t in targets:
                await t.client.aclose()

    return asyncio.run(go())


async def _cases_loop(targets, n_cases: int, seed: int) -> dict:
    rng = random.Random(seed)
    stats = {"cases": 0, "status": {}, "five_xx": 0, "by_case": {}}
    plans = [(t, name, fn) for t in targets for name, fn in _cases(t)]
    t0 = time.perf_counter()
    for i in range(n_cases):
        target, name, fn = plans[i % len(plans)]
        depth = DEPTHS[i % len(DEPTHS)] if i < 4 * len(plans) * len(DEPTHS) else rng.randint(33, 30_000)
        text = nested(depth, SHAPES[(i // len(plans)) % len(SHAPES)], rng)
        lines_before = target.server.audit.next_seq
        resp = await fn(text)
        peer_auth.flush_refusals(target.server)  # the per-peer summary, so each case shows as a record
        stats["cases"] += 1
        stats["status"][resp.status_code] = stats["status"].get(resp.status_code, 0) + 1
        stats["by_case"][name] = stats["by_case"].get(name, 0) + 1
        if resp.status_code >= 500:
            stats["five_xx"] += 1
        assert 400 <= resp.status_code < 500, (name, depth, resp.status_code, resp.text[:300])
        assert isinstance(resp.json().get("error"), str), (name, resp.text[:300])
        # refused where the input enters, not by the last-resort handler
        assert resp.json().get("detail") != "input nested too deeply", (name, depth)
        assert target.server.audit.next_seq > lines_before, (name, depth, "no audit record")
    stats["seconds"] = time.perf_counter() - t0
    stats["rate"] = stats["cases"] / stats["seconds"]
    return stats


def _targets(consortium, base):
    return [Target(consortium, os.path.join(base, b), b) for b in ("plain", "ckks", "secagg")]


def _check_logs(targets):
    from secure_afl.audit_verify import verify_log

    for t in targets:
        verify_log(t.log, server_pub=t.party("aggregator", "server").identity_pub(),
                   head=f"{t.server.audit.next_seq - 1}:{t.server.audit.head}")


def _fuzz(consortium, root: str, cases: int, seed: int):
    """``cases`` nested-JSON cases over the servers of :func:`_targets` under ``root``, then every audit log
    verified; the servers are closed however it ends. Returns (the run's figures, the targets)."""
    targets = _targets(consortium, root)
    try:
        stats = _run(targets, cases, seed=seed)
        _check_logs(targets)
    finally:
        for t in targets:
            t.close()
    return stats, targets


def test_nested_json_on_every_route_is_a_4xx_with_an_audit_record(consortium, tmp_path):
    # Prepare / Execute: a plain, a ckks (awaiting its context) and a secagg server, in process; every route x
    # header/body x shape x depth
    # Assert: (per case inside _run) 4xx, a reason, an audit record; logs verify; every place hit
    stats, targets = _fuzz(consortium, str(tmp_path), 400, seed=1)
    print(f"\nnested-JSON fuzz: {stats['cases']} cases, {stats['rate']:.0f} cases/s, 5xx {stats['five_xx']}, "
          f"statuses {stats['status']}")
    assert stats["five_xx"] == 0
    assert set(stats["by_case"]) == {name for t in targets for name, _ in _cases(t)}
    assert {"envelope_header", "context_body", "secagg_setup_body", "secagg_consistency_body"} <= set(stats["by_case"])


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_nested_json_fuzz_100k_cases(consortium, tmp_path):
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else str(tmp_path)
    with tempfile.TemporaryDirectory(dir=base) as d:
        stats, _ = _fuzz(consortium, d, 100_000, seed=2)
    print(f"\nnested-JSON fuzz: {stats['cases']} cases in {stats['seconds']:.0f} s ({stats['rate']:.0f} cases/s), "
          f"5xx {stats['five_xx']}, statuses {stats['status']}")
    assert stats["cases"] >= 100_000 and stats["five_xx"] == 0


@pytest.mark.e2e
def test_nested_json_against_the_real_server_process(tmp_path):
    # Prepare: a real server over mTLS; h1's connection
    import httpx

    c = Consortium(tmp_path, backend="plain", hospitals=("h1", "h2"), min_clients=2,
                   extra_server={"refusal_interval_s": 3600.0}).start()
    h1 = pki.load_party(c.pki_dir, "hospital", "h1")
    ctx = pki.client_ssl_context(h1.ca_file, cert_file=h1.cert_file, key_file=h1.key_file)
    rng = random.Random(3)
    path = f"{API}/sessions/{c.session_id}"
    statuses = []
    try:
        with httpx.Client(base_url=c.url, verify=ctx, timeout=30) as cl:
            digest = bytes.fromhex(cl.get(path).json()["params_digest"])

            def statement(body):
                st = sign_upload(h1.identity_key(), c.session_id, digest, hashlib.sha256(body).digest(), "h1")
                return json.dumps(st, separators=(",", ":"))

            # Execute: headers up to the HTTP layer's header cap, envelope headers up to the envelope's cap
            for i in range(40):
                text = nested([33, 200, 2_000, 5_000][i % 4], SHAPES[i % len(SHAPES)], rng)
                kind = i % 3
                if kind == 0:
                    r = cl.post(path + "/uploads", content=b"x", headers={H_UPLOAD: text})
                elif kind == 1:
                    r = cl.post(path + "/uploads", content=b"x", headers={H_UPLOAD: statement(b"x"), H_TAG: text})
                else:
                    hb = text.encode()
                    body = b"SAFLPAY1" + struct.pack("<I", len(hb)) + hb
                    r = cl.post(path + "/uploads", content=body, headers={H_UPLOAD: statement(body)})
                statuses.append(r.status_code)
                assert 400 <= r.status_code < 500 and "error" in r.json(), (i, r.status_code, r.text[:200])
            # a header beyond the HTTP layer's cap never reaches the application: refused there
            r = cl.post(path + "/uploads", content=b"x", headers={H_UPLOAD: nested(40_000, "dict", rng)})
            assert 400 <= r.status_code < 500
    finally:
        c.stop()

    # Assert: every case accounted in the audit log (records or the per-peer summary), no traceback
    records = [json.loads(x) for x in c.audit_path().read_text().splitlines()]
    refused = sum(r["outcome"] == "refused" and r["event"] != "refusals_suppressed" for r in records)
    suppressed = sum(r["details"]["count"] for r in records if r["event"] == "refusals_suppressed")
    assert refused + suppressed >= len(statuses)
    log_text = (tmp_path / "server.log").read_text()
    assert "Traceback" not in log_text, log_text[-2000:]


def test_an_unexpected_error_is_an_audited_json_answer_not_a_traceback(consortium, tmp_path, monkeypatch):
    # Prepare: the session-info route fails inside the server role (fault injection)
    t = Target(consortium, str(tmp_path / "s"), "plain")

    def broken(session):
        raise KeyError("injected")

    monkeypatch.setattr(status, "session_info", broken)

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=t.app), base_url="http://x") as cl:
            return await cl.get(t.path())

    try:
        before = t.server.audit.next_seq
        # Execute
        resp = asyncio.run(go())
        peer_auth.flush_refusals(t.server)
        # Assert
        assert resp.status_code == 500 and resp.json()["error"] == "internal"
        assert t.server.audit.next_seq > before
    finally:
        t.close()


def test_parse_json_refuses_depth_duplicates_and_constants():
    from secure_afl.exceptions import MalformedPayload
    from secure_afl.encoding import MAX_JSON_DEPTH, parse_json

    assert parse_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
    assert parse_json('["' + "[" * 100 + '"]') == ["[" * 100]  # brackets inside strings do not nest
    for bad in ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), '{"a":1,"a":1}', "[NaN]", "[Infinity]",
                b"\xff", "{"):
        with pytest.raises(MalformedPayload):
            parse_json(bad)


def test_body_must_match_the_digest_its_signature_covers(consortium, tmp_path):
    # Prepare: the key holder signs one publish body; another body is sent under those headers
    t = Target(consortium, str(tmp_path / "s"), "ckks")
    kh = t.party("keyholder", "keyholder")
    path = t.path("/context")
    headers = sign_request(kh.identity_key(), "keyholder:keyholder", "POST", path, b'{"signed":1}')

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=t.app), base_url="http://x") as cl:
            return await cl.post(path, content=b'{"other":2}', headers=headers)

    try:
        # Execute
        resp = asyncio.run(go())
        # Assert: refused as a bad signature, audited under the (authenticated) key holder
        assert resp.status_code == 401 and resp.json()["error"] == "bad_signature"
        rec = json.loads(t.log.read_text().splitlines()[-1])
        assert rec["outcome"] == "refused" and rec["actor"] == "keyholder:keyholder"
    finally:
        t.close()
