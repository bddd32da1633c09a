"""The server role in-process (real SQLite, payload files and audit log; no HTTP)."""

import hashlib
import threading

import numpy as np
import pytest

from secure_afl import pki
from secure_afl.backends import get_backend
from secure_afl.signing import sign_upload

from support import Consortium
from secure_afl.server import aggregator, closing, intake, peer_auth


def _upload(c, srv, name, seed):
    party = pki.load_party(c.pki_dir, "hospital", name)
    lay = srv.params.layout
    X, y = c.data(name, seed=seed)
    s = c.stats(X, y)
    s.gram += np.eye(c.dim)  # gamma = 1, as a hospital client adds it
    payload = get_backend(srv.params).protect(lay.pack(s))
    st = sign_upload(party.identity_key(), c.session_id, srv.params.digest(), hashlib.sha256(payload).digest(), name)
    return st, payload, lay.pack(s)


def test_storage_failure_leaves_nothing_half_accepted(tmp_path, monkeypatch):
    from secure_afl.server.aggregator import open_server
    from secure_afl.server.config import load_config

    # Prepare: h1 accepted; the disk fails while h2's payload is written
    c = Consortium(tmp_path, backend="plain", hospitals=("h1", "h2"), min_clients=2)
    srv = open_server(load_config(c.config))
    try:
        st1, p1, v1 = _upload(c, srv, "h1", 1)
        intake.submit(srv, "h1", st1, p1)
        st2, p2, v2 = _upload(c, srv, "h2", 2)
        real_put = srv.store.put_blob

        def disk_full(data, digest=None):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(srv.store, "put_blob", disk_full)
        # Execute
        with pytest.raises(OSError):
            intake.submit(srv, "h2", st2, p2)
        monkeypatch.setattr(srv.store, "put_blob", real_put)
        # Assert: h2 not counted, not in the running sum; it can upload again (fresh statement) and the
        # released aggregate is exactly h1 + h2
        assert srv.store.upload_count() == 1
        st2b = sign_upload(pki.load_party(c.pki_dir, "hospital", "h2").identity_key(), c.session_id,
                           srv.params.digest(), hashlib.sha256(p2).digest(), "h2")
        intake.submit(srv, "h2", st2b, p2)
        closing.close(srv, "keyholder:keyholder")
        blob, manifest = closing.released(srv)
        total = get_backend(srv.params).reveal(blob)
        assert np.array_equal(total, v1 + v2)
        assert [p["hospital"] for p in manifest["participants"]] == ["h1", "h2"]
    finally:
        aggregator.shutdown(srv)


def _open_with_h1(tmp_path, hospitals):
    """A plain session in-process with h1's upload accepted; (consortium, server, h1's vector)."""
    from secure_afl.server.aggregator import open_server
    from secure_afl.server.config import load_config

    c = Consortium(tmp_path, backend="plain", hospitals=hospitals, min_clients=2)
    srv = open_server(load_config(c.config))
    st1, p1, v1 = _upload(c, srv, "h1", 1)
    intake.submit(srv, "h1", st1, p1)
    return c, srv, v1


class _HeldAdd:
    """Wraps the server's combiner: the first add waits (outside the server lock, where the summing workers run)
    until the test lets it go, so a close or a second upload can be made to meet it."""

    def __init__(self, combiner):
        self._real = combiner.add
        self.entered, self.go = threading.Event(), threading.Event()
        self._first = True

    def __call__(self, payload):
        if self._first:
            self._first = False
            self.entered.set()
            assert self.go.wait(60)
        return self._real(payload)


def test_close_waits_for_an_upload_being_added_and_takes_no_new_one(tmp_path, monkeypatch):
    from secure_afl.exceptions import RoundAlreadyClosed

    # Prepare: h1 accepted; h2's contribution is being added when the key holder closes
    c, srv, v1 = _open_with_h1(tmp_path, ("h1", "h2", "h3"))
    try:
        held = _HeldAdd(srv.combiner)
        monkeypatch.setattr(srv.combiner, "add", held)
        waiting = threading.Event()
        real_wait = srv.drained.wait_for

        def wait_for(pred, timeout=None):
            waiting.set()
            return real_wait(pred, timeout)

        monkeypatch.setattr(srv.drained, "wait_for", wait_for)
        st2, p2, v2 = _upload(c, srv, "h2", 2)
        results = {}
        a = threading.Thread(target=lambda: results.setdefault("h2", intake.submit(srv, "h2", st2, p2)))
        a.start()
        assert held.entered.wait(60)
        b = threading.Thread(target=lambda: results.setdefault("close", closing.close(srv, "keyholder:keyholder")))
        b.start()

        # Execute: while the close waits for h2, h3 tries to upload; then h2's add finishes
        assert waiting.wait(60)
        st3, p3, _ = _upload(c, srv, "h3", 3)
        with pytest.raises(RoundAlreadyClosed, match="being closed"):
            intake.submit(srv, "h3", st3, p3)
        held.go.set()
        a.join(60)
        b.join(60)

        # Assert: h2 accepted and released, h3 not; the aggregate is exactly h1 + h2
        blob, manifest = closing.released(srv)
        assert "h2" in results and [p["hospital"] for p in manifest["participants"]] == ["h1", "h2"]
        assert np.array_equal(get_backend(srv.params).reveal(blob), v1 + v2)
        assert srv.store.upload_count() == 2
    finally:
        aggregator.shutdown(srv)


@pytest.mark.security
def test_second_upload_of_a_hospital_while_its_first_is_being_added_is_refused(tmp_path, monkeypatch):
    from secure_afl.exceptions import DuplicateContribution

    # Prepare: h2's first upload is being added
    c, srv, v1 = _open_with_h1(tmp_path, ("h1", "h2"))
    try:
        held = _HeldAdd(srv.combiner)
        monkeypatch.setattr(srv.combiner, "add", held)
        st2, p2, v2 = _upload(c, srv, "h2", 2)
        a = threading.Thread(target=intake.submit, args=(srv, "h2", st2, p2))
        a.start()
        assert held.entered.wait(60)

        # Execute: the same hospital sends another contribution (a fresh statement) meanwhile
        st2b, p2b, _ = _upload(c, srv, "h2", 22)
        with pytest.raises(DuplicateContribution, match="being added"):
            intake.submit(srv, "h2", st2b, p2b)
        held.go.set()
        a.join(60)

        # Assert: one contribution of h2, the first, in the release
        closing.close(srv, "keyholder:keyholder")
        blob, manifest = closing.released(srv)
        assert [p["hospital"] for p in manifest["participants"]] == ["h1", "h2"]
        assert np.array_equal(get_backend(srv.params).reveal(blob), v1 + v2)
    finally:
        aggregator.shutdown(srv)


def _audit(srv) -> list[dict]:
    import json

    return [json.loads(line) for line in (srv.dir / "audit.jsonl").read_text().splitlines()]


def test_an_upload_over_the_servers_cap_is_refused_by_the_state_machine_itself(tmp_path):
    # the HTTP gate caps the body as it streams; a caller of the state machine (the Flower ServerApp, a test
    # harness) passes bytes already in memory, so the cap is also the state machine's own
    import dataclasses

    from secure_afl.exceptions import TooLarge
    from secure_afl.server.aggregator import open_server
    from secure_afl.server.config import load_config

    # Prepare: the smallest cap the configuration allows, and a signed upload one byte over it
    c = Consortium(tmp_path, backend="plain", hospitals=("h1", "h2"), min_clients=2)
    srv = open_server(load_config(c.config))
    try:
        srv.config = dataclasses.replace(srv.config, max_upload_bytes=1024)
        party = pki.load_party(c.pki_dir, "hospital", "h1")
        big = b"\x01" * 1025
        st = sign_upload(party.identity_key(), c.session_id, srv.params.digest(), hashlib.sha256(big).digest(), "h1")
        # Execute / Assert: refused by name, nothing stored, audited; a real upload under the cap is accepted
        with pytest.raises(TooLarge, match="exceeds the cap"):
            intake.submit(srv, "h1", st, big)
        assert srv.store.upload_count() == 0 and not srv.store.has_upload("h1")
        peer_auth.flush_refusals(srv)
        assert any(r["event"] == "upload" and r["outcome"] == "refused" and r["actor"] == "h1" for r in _audit(srv))
        st_real, payload, _ = _upload(c, srv, "h1", 1)
        assert len(payload) <= 1024
        intake.submit(srv, "h1", st_real, payload)
        assert srv.store.upload_count() == 1
    finally:
        aggregator.shutdown(srv)


def test_a_ckks_upload_before_the_key_holders_context_is_refused_as_not_open(tmp_path):
    from secure_afl.exceptions import StageError
    from secure_afl.server.aggregator import open_server
    from secure_afl.server.config import load_config

    # Prepare: a ckks session whose key holder has not published its public context yet
    c = Consortium(tmp_path, backend="ckks", hospitals=("h1", "h2"), min_clients=2)
    srv = open_server(load_config(c.config))
    try:
        assert srv.params is None
        party = pki.load_party(c.pki_dir, "hospital", "h1")
        payload = b"\x00" * 4096
        # no parameters digest exists before the context: the statement names the session, the body's hash
        st = sign_upload(party.identity_key(), c.session_id, bytes(32), hashlib.sha256(payload).digest(), "h1")
        # Execute / Assert: a typed refusal naming the stage (not an internal error), nothing stored, audited
        with pytest.raises(StageError, match="not open yet"):
            intake.submit(srv, "h1", st, payload)
        assert srv.store.upload_count() == 0
        peer_auth.flush_refusals(srv)
        assert any(r["event"] == "upload" and r["outcome"] == "refused" for r in _audit(srv))
    finally:
        aggregator.shutdown(srv)


def test_an_upload_after_the_release_is_refused_by_the_state_machine_and_the_manifest_is_unchanged(tmp_path):
    # the hospital's command line looks at the session's stage first; a caller that does not (or a hospital that
    # uploads while the key holder closes) meets the state machine's own refusal
    from secure_afl.exceptions import RoundAlreadyClosed
    from secure_afl.server.aggregator import open_server
    from secure_afl.server.config import load_config

    # Prepare: two of three hospitals uploaded and the key holder closed the session
    c = Consortium(tmp_path, backend="plain", hospitals=("h1", "h2", "h3"), min_clients=2)
    srv = open_server(load_config(c.config))
    try:
        for i, name in enumerate(("h1", "h2")):
            st, payload, _ = _upload(c, srv, name, i + 1)
            intake.submit(srv, name, st, payload)
        closing.close(srv, "keyholder:keyholder")
        blob, manifest = closing.released(srv)
        st3, p3, _ = _upload(c, srv, "h3", 3)
        # Execute / Assert: refused by name; the released aggregate and its manifest are what they were
        with pytest.raises(RoundAlreadyClosed, match="was released"):
            intake.submit(srv, "h3", st3, p3)
        assert closing.released(srv) == (blob, manifest)
        assert srv.store.upload_count() == 2 and not srv.store.has_upload("h3")
    finally:
        aggregator.shutdown(srv)
