"""End-to-end: real server processes on 127.0.0.1, real TLS, real SQLite, real ciphertexts."""

import json
import subprocess
import sys

import numpy as np
import pytest

from secure_afl.keyholder.flooding import SECURITY
from secure_afl.analytic import centralised_weights, solve_from_sums
from secure_afl.audit_verify import load_receipts
from secure_afl.cli import main
from secure_afl.exceptions import DuplicateContribution, InsufficientContributors
from secure_afl.exceptions import DeadlinePassed
from secure_afl.keyholder import read_model

from support import plain_reference, run_hospitals as _run_hospitals, verify_countersigned as _verify_countersigned, w_error_bound

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("backend", ["plain", "ckks", "bfv"])
def test_full_session_equals_plaintext(consortium, backend):
    # Prepare
    c = consortium(backend=backend, hospitals=("h1", "h2", "h3"), min_clients=3).start()
    conn = c.connect_keyholder()
    if backend in ("ckks", "bfv"):
        from secure_afl.backends import he_module
        from secure_afl.packing import Layout
        from secure_afl.params import Bounds

        c.keyholder.keygen(he_module(backend).session_params(c.session_id, Layout(c.dim, c.classes), 1.0,
                                                             Bounds(c.max_norm, 1000, 8)))
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
    if backend != "ckks":
        assert np.linalg.norm(res.W - W_joint) / np.linalg.norm(W_joint) <= 1e-9
        bound = res.report["w_error_bound"]
        assert bound["applies"] and np.linalg.norm(res.W - W_joint) / np.linalg.norm(W_joint) <= 2 * bound["rel_bound"]
    else:
        # flooded release: within the reported per-entry bound, and the flooding noise is really there
        bound = w_error_bound(X_all, W_joint, res.report["error_bound_per_entry"], c.classes,
                              res.report["lambda_total"])
        assert np.linalg.norm(res.W - W_joint) <= bound
        assert res.report["flood_sigma"] > 0 and np.linalg.norm(res.W - W_joint) > 1e-9
        # a key decrypts once: a second finalize is refused, with no second decryption
        from secure_afl.exceptions import PolicyViolation

        with c.connect_keyholder() as again, pytest.raises(PolicyViolation) as second:
            c.keyholder.finalize(again, min_clients=3)
        assert second.value.reason == "key_used"
    assert res.report["participants"] == ["h1", "h2", "h3"]
    v = _verify_countersigned(c)
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
    assert meta.backend == "plain" and meta.participants == ("h1", "h2")
    assert len(load_receipts(tmp_path / "rc")) == 2
    assert main(["audit", "verify", str(c.audit_path()), "--pki", str(c.pki_dir),
                 "--head", str(c.audit_path().parent / "audit-head.json"), "--receipts", str(tmp_path / "rc")]) == 0


def test_release_refused_below_min_clients(consortium):
    c = consortium(backend="plain", hospitals=("h1", "h2", "h3"), min_clients=3).start()
    cl = c.hospital("h1")
    cl.submit(c.stats(*c.data("h1")))
    cl.close()
    conn = c.connect_keyholder()
    with pytest.raises(InsufficientContributors):
        c.keyholder.close_round(conn)
    view = conn.status()
    conn.close()
    assert view["status"] == "open" and view["uploaded"] == ["h1"], view


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
    X_all = np.concatenate([data[h][0] for h in sorted(data)])
    assert np.linalg.norm(res.W - ref) <= w_error_bound(X_all, ref, res.report["error_bound_per_entry"], c.classes,
                                                          res.report["lambda_total"])
    assert res.report["participants"] == ["h1", "h2", "h3", "h4"]
    v = _verify_countersigned(c)
    assert v.n_receipts == 4


def test_uploads_after_deadline_refused(consortium):
    # a deadline the operator signed and that has passed (no waiting for one to pass)
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2,
                   extra_session={"deadline": "2020-01-01T00:00:00Z"}).start()
    cl = c.hospital("h1")
    with pytest.raises(DeadlinePassed) as ei:
        cl.submit(c.stats(*c.data("h1")))
    cl.close()
    assert ei.value.reason == "deadline_passed" and ei.value.status_code == 410
    conn = c.connect_keyholder()
    assert conn.status()["uploaded"] == []
    conn.close()


def test_secagg_dropouts_at_every_round(consortium):
    # Prepare: 10 hospitals, threshold 2 (quorum 6 of the 10 of the signed roster, whoever advertised);
    # one goes silent before each of four stages
    names = tuple(f"h{i:02d}" for i in range(1, 11))
    c = consortium(backend="secagg", hospitals=names, min_clients=4, k_max=16,
                   secagg={"threshold": 2, "stage_timeout_s": 6.0}).start()
    data = {h: c.data(h, n=30) for h in names}
    stop = {"h10": "advertise_keys", "h09": "share_keys", "h08": "masked_input", "h07": "unmask"}
    # Execute
    results, errors = _run_hospitals(c, data, stop)
    conn = c.connect_keyholder()
    res = c.keyholder.finalize(conn, min_clients=5)
    conn.close()
    # Assert: the survivors are those whose masked input was summed (h07 uploaded, then went silent)
    assert not errors, errors
    survivors = [f"h{i:02d}" for i in range(1, 8)]
    assert res.report["participants"] == survivors
    X = np.concatenate([data[h][0] for h in survivors])
    y = np.concatenate([data[h][1] for h in survivors])
    W_joint = centralised_weights(X, y, c.classes)
    assert np.linalg.norm(res.W - W_joint) / np.linalg.norm(W_joint) <= 1e-9
    ref = plain_reference(c, {h: data[h] for h in survivors})
    assert np.array_equal(np.round(res.stats.class_counts), ref.class_counts)
    log = [json.loads(line) for line in c.audit_path().read_text().splitlines()]
    closed = [r["details"] for r in log if r["event"] == "secagg_stage_closed"]
    assert [d["dropped"] for d in closed] == [[], ["h10"], ["h09"], ["h08"], ["h07"]]


def test_secagg_threshold_breaking_dropout_aborts_and_reveals_nothing(consortium):
    # Prepare: 4 hospitals, threshold 3; two vanish before the masked input
    c = consortium(backend="secagg", hospitals=("h1", "h2", "h3", "h4"), min_clients=2,
                   secagg={"threshold": 3, "stage_timeout_s": 2.0, "max_rounds": 1}).start()
    data = {h: c.data(h) for h in c.hospitals}
    # Execute
    results, errors = _run_hospitals(c, data, {"h3": "masked_input", "h4": "masked_input"})
    conn = c.connect_keyholder()
    info = conn.info()
    # Assert
    assert info["secagg"]["stage"] == "aborted"
    assert {type(e).__name__ for e in errors.values()} <= {"InsufficientShares", "StageError"}
    with pytest.raises(Exception) as ei:
        c.keyholder.close_round(conn)
    assert ei.value.reason in ("wrong_stage", "insufficient_contributors")
    with pytest.raises(Exception) as ei:
        conn.request("GET", conn.path("/secagg/unmask-material"))
    assert ei.value.status_code == 409
    conn.close()


def test_images_to_upload_in_two_commands(consortium, tmp_path):
    """`client embed --stats-only` (real torchvision resnet18, random init) then `client submit --stats`."""
    from PIL import Image

    # Prepare: two hospitals, each an ImageFolder with two classes of 32x32 images
    c = consortium(backend="plain", hospitals=("h1", "h2"), dim=512, classes=2, min_clients=2, max_norm=1e4)
    c.start()
    rng = np.random.default_rng(0)
    for h in c.hospitals:
        for cls in ("benign", "malignant"):
            d = tmp_path / h / cls
            d.mkdir(parents=True)
            for i in range(3):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(d / f"{i}.png")
    import torch
    import torchvision

    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18(num_classes=1000).state_dict(), tmp_path / "w.pth")
    # Execute
    for h in c.hospitals:
        assert main(["client", "embed", "--images", str(tmp_path / h), "--backbone", "resnet18", "--weights",
                     str(tmp_path / "w.pth"), "--device", "cpu", "--workers", "0", "--no-progress",
                     "--stats-only", str(tmp_path / f"{h}-stats.npz")]) == 0
        assert main(["client", "submit", "--server", c.url, "--session", c.session_id, "--pki", str(c.pki_dir),
                     "--name", h, "--stats", str(tmp_path / f"{h}-stats.npz"), "--receipts",
                     str(tmp_path / "rc"), "--no-progress"]) == 0
    conn = c.connect_keyholder()
    res = c.keyholder.finalize(conn, min_clients=2)
    conn.close()
    # Assert
    assert res.report["samples"] == 12 and res.report["class_counts"] == [6, 6]
    assert res.W.shape == (512, 2)


def test_secagg_sigkill_mid_round_then_restart_finishes_exactly(consortium):
    from secure_afl.clients.secagg_client import SecAggParticipant

    # Prepare: h4 pauses before its masked input, so the round waits there
    c = consortium(backend="secagg", hospitals=("h1", "h2", "h3", "h4"), min_clients=2,
                   secagg={"threshold": 3, "stage_timeout_s": 60.0}).start()
    data = {h: c.data(h) for h in c.hospitals}
    import threading

    others = {}
    threads = []
    for h in ("h1", "h2", "h3"):
        def go(h=h):
            cl = c.hospital(h)
            try:
                others[h] = cl.submit(c.stats(*data[h]), timeout=180)
            except Exception as e:  # asserted below
                others[h] = e
            finally:
                cl.close()
        threads.append(threading.Thread(target=go, daemon=True))
    for t in threads:
        t.start()
    h4 = c.hospital("h4")
    p4 = SecAggParticipant(h4, h4.fetch_params(), c.stats(*data["h4"]))
    assert p4.run(pause_before="masked_input", timeout=120) is None
    conn = c.connect_keyholder()
    conn.wait_until(lambda s: len(s["uploaded"]) == 3, timeout=60, what="three masked inputs", read=conn.status)
    # Execute: kill -9 in the middle of the masked-input stage, restart, let h4 go on
    c.kill9()
    c.start()
    receipt = p4.run(timeout=120)
    for t in threads:
        t.join(timeout=180)
    h4.close()
    res = c.keyholder.finalize(conn, min_clients=4)
    conn.close()
    # Assert: nothing lost, the sum is exact over all four
    assert all(isinstance(r, dict) for r in others.values()), others
    assert receipt is not None
    assert res.report["participants"] == ["h1", "h2", "h3", "h4"]
    X = np.concatenate([d[0] for d in data.values()])
    y = np.concatenate([d[1] for d in data.values()])
    W_joint = centralised_weights(X, y, c.classes)
    assert np.linalg.norm(res.W - W_joint) / np.linalg.norm(W_joint) <= 1e-9
    log = [json.loads(line) for line in c.audit_path().read_text().splitlines()]
    assert any(r["event"] == "server_restarted" for r in log)


@pytest.mark.security
def test_hospital_refuses_secagg_request_not_signed_by_pinned_server(consortium):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from secure_afl.clients.secagg_client import SecAggParticipant
    from secure_afl.exceptions import InvalidContribution

    # Prepare: the hospital pins another key than the one the server signs with
    c = consortium(backend="secagg", hospitals=("h1", "h2", "h3"), min_clients=2,
                   secagg={"threshold": 2, "stage_timeout_s": 30.0}).start()
    h = c.hospital("h1")
    p = SecAggParticipant(h, h.fetch_params(), c.stats(*c.data("h1")))
    h.server_pub = Ed25519PrivateKey.generate().public_key()
    # Execute / Assert: nothing is answered
    with pytest.raises(InvalidContribution):
        p.run(timeout=30)
    assert p.client.stage == "setup"
    h.close()


@pytest.mark.smoke  # `make test`'s one real session per backend
@pytest.mark.parametrize("backend", ["plain", "ckks", "bfv", "secagg", "split"])
def test_demo_command_passes_verification(backend, tmp_path, capsys):
    # Execute: the real demo (PKI, server process, key holder, hospitals) on the embedded data
    rc = main(["demo", "--backend", backend, "--hospitals", "3", "--partition", "shards:2",
               "--report", str(tmp_path / "r.json"), "--model-out", str(tmp_path / "w.safetensors")])
    # Assert
    report = json.loads((tmp_path / "r.json").read_text())
    out = capsys.readouterr().out
    assert rc == 0 and ("W: within certified bound" in out or "W: no bound (C singular at this noise)" in out)
    assert "PASSED" not in out and "exceeds bound" not in out
    assert {"backend", "hospitals", "samples", "dim", "classes", "verification", "accuracy", "bytes_uploaded",
            "timings_s"} <= set(report)
    v = report["verification"]
    assert v["passed"] and report["accuracy"]["plaintext"] > 0.8
    if backend == "ckks":  # flooded release: statistics within the reported bound, margin over the release
        assert report["flooding"]["flood_sigma"] > 0
        assert report["flooding"]["flood_security"] == SECURITY
        assert v["statistics_within_bound"] and v["verdict"] in ("within certified bound",
                                                                  "no bound (C singular at this noise)")
    else:
        assert v["prediction_agreement"] == 1.0
        assert v["weights_rel_error_vs_plaintext"] <= v["allowed_rel_error"]
        assert v["certified_bound_secure"]["applies"]
        assert report["accuracy"]["secure"] == report["accuracy"]["plaintext"]
    W, meta = read_model(tmp_path / "w.safetensors")
    assert W.shape == (report["dim"], report["classes"]) and meta.backend == backend


def test_secagg_hospitals_waiting_in_a_stage_leave_connection_slots_to_the_others(consortium):
    """Six hospitals, a server that serves two connections at once: a waiting hospital that kept its
    connection alive would hold a slot for the whole stage, the other four would be turned away (503)
    until the stage closed without them, and the round would abort."""
    # Prepare
    names = tuple(f"h{i}" for i in range(1, 7))
    c = consortium(backend="secagg", hospitals=names, min_clients=3, k_max=16,
                   secagg={"stage_timeout_s": 120.0, "max_rounds": 1},
                   extra_server={"max_connections": 2}).start()
    data = {h: c.data(h, n=20) for h in names}
    # Execute
    results, errors = _run_hospitals(c, data, {})
    conn = c.connect_keyholder()
    res = c.keyholder.finalize(conn, min_clients=6)
    conn.close()
    # Assert: every hospital got through every stage; W is the plaintext W of all six
    assert not errors, errors
    assert res.report["participants"] == list(names)
    X = np.concatenate([data[h][0] for h in names])
    y = np.concatenate([data[h][1] for h in names])
    W_joint = centralised_weights(X, y, c.classes)
    assert np.linalg.norm(res.W - W_joint) / np.linalg.norm(W_joint) <= 1e-9
