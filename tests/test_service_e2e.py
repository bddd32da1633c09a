"""End-to-end: real server processes on 127.0.0.1, real TLS, real SQLite, real ciphertexts."""

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from secure_afl import pki
from secure_afl.analytic import centralised_weights, solve_from_sums
from secure_afl.audit import load_receipts, verify_log
from secure_afl.cli import main
from secure_afl.exceptions import DuplicateContribution, InsufficientContributors
from secure_afl.clients.transport import ServiceError
from secure_afl.server.keyholder import read_model

from service_helpers import Consortium

pytestmark = pytest.mark.e2e


@pytest.fixture
def consortium(tmp_path, request):
    made = []

    def make(**kw):
        c = Consortium(tmp_path / f"c{len(made)}", **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


def plain_reference(c, data):
    total = None
    for X, y in data.values():
        s = c.stats(X, y)
        total = s if total is None else total + s
    return total


@pytest.mark.parametrize("backend", ["plain", "ckks"])
def test_full_session_equals_plaintext(consortium, backend):
    # Prepare
    c = consortium(backend=backend, hospitals=("h1", "h2", "h3"), min_clients=3).start()
    conn = c.connect_keyholder()
    if backend == "ckks":
        from secure_afl.backends.ckks import ckks_session_params
        from secure_afl.packing import Layout
        from secure_afl.params import Bounds

        c.keyholder.keygen(ckks_session_params(c.session_id, Layout(c.dim, c.classes), 1.0, Bounds(c.max_norm, 1000, 8)))
        c.keyholder.publish(conn)
    data = {h: c.data(h) for h in c.hospitals}
    # Execute
    for h, (X, y) in data.items():
        cl = c.hospital(h)
        cl.submit(c.stats(X, y))
        cl.close()
    res = c.keyholder.finalize(conn, min_clients=3)
    conn.close()
    # Assert
    X_all = np.concatenate([d[0] for d in data.values()])
    y_all = np.concatenate([d[1] for d in data.values()])
    W_joint = centralised_weights(X_all, y_all, c.classes)
    tol = 1e-9 if backend == "plain" else 1e-6
    assert np.linalg.norm(res.W - W_joint) / np.linalg.norm(W_joint) <= tol
    assert res.report["participants"] == ["h1", "h2", "h3"]
    v = verify_log(c.audit_path(), server_pub=pki.load_party(c.pki_dir, "server", "aggregator").identity_pub(),
                   receipts=load_receipts(c.root / "receipts"))
    assert v.n_receipts == 3 and v.n_refused == 0


def test_client_submit_cli_and_keyholder_cli(consortium, tmp_path):
    # Prepare: a real `secure-afl client submit` process per hospital
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2).start()
    data = {h: c.data(h) for h in c.hospitals}
    for h, (X, y) in data.items():
        np.savez(tmp_path / f"{h}.npz", X=X, y=y)
        # Execute
        out = subprocess.run([sys.executable, "-m", "secure_afl.cli", "client", "submit", "--server", c.url,
                              "--session", c.session_id, "--pki", str(c.pki_dir), "--name", h,
                              "--embeddings", str(tmp_path / f"{h}.npz"), "--receipts", str(tmp_path / "rc"),
                              "--no-progress"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout.strip().splitlines()[-1])["hospital"] == h
    rc = main(["keyholder", "finalize", "--pki", str(c.pki_dir), "--keys", str(c.root / "keys"),
               "--server", c.url, "--session", c.session_id, "--min-clients", "2",
               "--out", str(tmp_path / "model.safetensors"), "--report", str(tmp_path / "report.json")])
    # Assert
    assert rc == 0
    W, meta = read_model(tmp_path / "model.safetensors")
    X_all = np.concatenate([d[0] for d in data.values()])
    y_all = np.concatenate([d[1] for d in data.values()])
    assert W.dtype == np.float64 and W.shape == (c.dim, c.classes)
    assert np.allclose(W, centralised_weights(X_all, y_all, c.classes), rtol=1e-9, atol=1e-10)
    assert meta["backend"] == "plain" and json.loads(meta["participants"]) == ["h1", "h2"]
    assert len(load_receipts(tmp_path / "rc")) == 2
    assert main(["audit", "verify", str(c.audit_path()), "--receipts", str(tmp_path / "rc")]) == 0


def test_release_refused_below_min_clients(consortium):
    c = consortium(backend="plain", hospitals=("h1", "h2", "h3"), min_clients=3).start()
    cl = c.hospital("h1")
    cl.submit(c.stats(*c.data("h1")))
    cl.close()
    conn = c.connect_keyholder()
    with pytest.raises(InsufficientContributors):
        c.keyholder.close_round(conn)
    info = conn.info()
    conn.close()
    assert info["status"] == "open" and info["contributions"] == 1


def test_sigkill_mid_session_loses_nothing(consortium):
    # Prepare: two uploads accepted, then kill -9 the server
    c = consortium(backend="ckks", hospitals=("h1", "h2", "h3", "h4"), min_clients=4).start()
    from secure_afl.backends.ckks import ckks_session_params
    from secure_afl.packing import Layout
    from secure_afl.params import Bounds

    conn = c.connect_keyholder()
    c.keyholder.keygen(ckks_session_params(c.session_id, Layout(c.dim, c.classes), 1.0, Bounds(c.max_norm, 1000, 8)))
    c.keyholder.publish(conn)
    conn.close()
    data = {h: c.data(h) for h in c.hospitals}
    for h in ("h1", "h2"):
        cl = c.hospital(h)
        cl.submit(c.stats(*data[h]))
        cl.close()
    # Execute
    c.kill9()
    c.start()
    cl = c.hospital("h1")
    with pytest.raises(DuplicateContribution):
        cl.submit(c.stats(*data["h1"]))
    cl.close()
    for h in ("h3", "h4"):
        cl = c.hospital(h)
        cl.submit(c.stats(*data[h]))
        cl.close()
    conn = c.connect_keyholder()
    res = c.keyholder.finalize(conn, min_clients=4)
    conn.close()
    # Assert
    ref = solve_from_sums(plain_reference(c, data))
    assert np.linalg.norm(res.W - ref) / np.linalg.norm(ref) <= 1e-6
    assert res.report["participants"] == ["h1", "h2", "h3", "h4"]
    v = verify_log(c.audit_path(), server_pub=pki.load_party(c.pki_dir, "server", "aggregator").identity_pub(),
                   receipts=load_receipts(c.root / "receipts"))
    assert v.n_receipts == 4


def test_uploads_after_deadline_refused(consortium):
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2,
                   extra_session={"deadline_s": 3}).start()
    time.sleep(3.5)
    cl = c.hospital("h1")
    with pytest.raises(ServiceError) as ei:
        cl.submit(c.stats(*c.data("h1")))
    cl.close()
    assert ei.value.reason == "deadline_passed" and ei.value.status_code == 410
    conn = c.connect_keyholder()
    assert conn.info()["contributions"] == 0
    conn.close()
