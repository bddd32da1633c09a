"""The server role in-process (real SQLite, payload files and audit log; no HTTP)."""

import hashlib

import numpy as np
import pytest

from secure_afl import pki
from secure_afl.backends import get_backend
from secure_afl.signing import sign_upload

from service_helpers import Consortium


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
    from secure_afl.server.aggregator import AggregationServer
    from secure_afl.server.config import load_config

    # Prepare: h1 accepted; the disk fails while h2's payload is written
    c = Consortium(tmp_path, backend="plain", hospitals=("h1", "h2"), min_clients=2)
    srv = AggregationServer(load_config(c.config))
    try:
        st1, p1, v1 = _upload(c, srv, "h1", 1)
        srv.submit("h1", st1, p1)
        st2, p2, v2 = _upload(c, srv, "h2", 2)
        real_put = srv.store.put_blob

        def disk_full(data):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(srv.store, "put_blob", disk_full)
        # Execute
        with pytest.raises(OSError):
            srv.submit("h2", st2, p2)
        monkeypatch.setattr(srv.store, "put_blob", real_put)
        # Assert: h2 not counted, not in the running sum; it can upload again (fresh statement) and the
        # released aggregate is exactly h1 + h2
        assert srv.store.upload_count() == 1
        st2b = sign_upload(pki.load_party(c.pki_dir, "hospital", "h2").identity_key(), c.session_id,
                           srv.params.digest(), hashlib.sha256(p2).digest(), "h2")
        srv.submit("h2", st2b, p2)
        srv.close("keyholder:keyholder")
        blob, manifest = srv.released()
        total = get_backend(srv.params).reveal(blob)
        assert np.array_equal(total, v1 + v2)
        assert [p["hospital"] for p in manifest["participants"]] == ["h1", "h2"]
    finally:
        srv.shutdown()
