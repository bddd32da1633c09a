"""End-to-end: a ``split`` session through a real Flower deployment on 127.0.0.1 (SuperLink, three hospital
SuperNodes, the key holder's SuperNode, `flwr run`): the key holder answers with its share from the seed
statements alone, the ServerApp's server combines it, and W equals the native service's bit for bit."""

import json
import time

import numpy as np
import pytest

from secure_afl import pki
from secure_afl.session.signed import load_signed
from secure_afl.analytic import centralised_weights
from secure_afl.audit_verify import load_receipts, verify_log
from secure_afl.keyholder import read_model

from support import Consortium
from support.flower import FlowerDeployment, hospital_data, native_w

pytestmark = [pytest.mark.e2e, pytest.mark.flower]

HOSPITALS = ("h1", "h2", "h3")


def _keygen(c):
    c.keyholder.keygen(load_signed(c.pki_dir, c.session_id).session_params())


def _started(tmp_path, deployment, *, seed: int, min_clients: int, max_refusals: int = 1):
    """A split consortium with its key holder's keys, and the Flower parties started on its hospitals' data:
    (consortium, data, the ServerApp's session config)."""
    c = Consortium(tmp_path / "fl", backend="split", hospitals=HOSPITALS, min_clients=min_clients,
                   extra_session={"min_class_count": 1, "max_refusals": max_refusals})
    data = hospital_data(c, seed=seed, names=HOSPITALS)
    _keygen(c)
    return c, data, deployment.start_parties(c, data, tmp_path, min_clients=min_clients)


@pytest.fixture
def deployment(tmp_path):
    d = FlowerDeployment(tmp_path / "flower")
    yield d
    d.stop()


def test_flower_split_round_matches_the_native_service_bit_for_bit(tmp_path, deployment):
    # Prepare: the same hospital data for a Flower round and a native round, each with its own consortium
    c, data, server_config = _started(tmp_path, deployment, seed=21, min_clients=3)

    # Execute
    t0 = time.perf_counter()
    out = deployment.run({"session-config": str(server_config), "node-wait-s": 120.0, "reply-timeout-s": 240.0},
                         timeout=420)
    wall = time.perf_counter() - t0

    # Assert: the model the key holder wrote is the exact release, the same as the native service's
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:] + deployment.logs()
    W, meta = read_model(tmp_path / "model.safetensors")
    report = json.loads((tmp_path / "report.json").read_text())
    X_all = np.concatenate([d[0] for d in data.values()])
    y_all = np.concatenate([d[1] for d in data.values()])
    W_plain = centralised_weights(X_all, y_all, c.classes)
    W_native = native_w(Consortium(tmp_path / "native", backend="split", hospitals=HOSPITALS, min_clients=3,
                                    extra_session={"min_class_count": 1}), data, keygen=_keygen)
    rel_plain = np.linalg.norm(W - W_plain) / np.linalg.norm(W_plain)
    print(f"flower split: |W-W_plain|/|W_plain| = {rel_plain:.2e}, flwr run {wall:.1f} s")
    bound = report["w_error_bound"]
    assert np.array_equal(W, W_native) and bound["applies"] and rel_plain <= 2 * bound["rel_bound"]
    assert report["backend"] == "split" and report["masked_sum_sha256"]
    assert report["participants"] == list(HOSPITALS) and report["samples"] == len(y_all)
    assert meta.backend == "split" and meta.participants == tuple(HOSPITALS)
    # the server took exactly one share, and the audit log (countersigned over Flower) holds with the receipts
    records = [json.loads(line) for line in c.audit_path().read_text().splitlines()]
    assert [r["outcome"] for r in records if r["event"] == "split_collect"] == ["accepted"]
    head = json.loads((c.audit_path().parent / "audit-head.json").read_text())
    v = verify_log(c.audit_path(), server_pub=pki.load_party(c.pki_dir, "server", "aggregator").identity_pub(),
                   head=head, countersign=head["countersign"],
                   keyholder_pub=pki.load_party(c.pki_dir, "keyholder", "keyholder").identity_pub(),
                   receipts=load_receipts(tmp_path / "receipts"))
    assert v.n_receipts == 3 and v.n_refused == 0 and v.countersigned_by


def test_flower_split_refuses_an_invalid_upload_by_name_and_releases_the_rest(tmp_path, deployment):
    from pathlib import Path

    # Prepare: h3 runs modified software (tests/support/flower_cheat): its upload claims class 1 = -1 with a
    # proof of that false statement; h1, h2 are honest. min_clients 2 leaves room for one refusal.
    c, data, server_config = _started(tmp_path, deployment, seed=22, min_clients=2)

    # Execute
    out = deployment.run({"session-config": str(server_config), "node-wait-s": 120.0, "reply-timeout-s": 240.0},
                         timeout=420, project=Path(__file__).resolve().parent / "support" / "flower_cheat")

    # Assert: h3 refused by name in the key holder's release, W is h1 + h2's, the refusal in the audit log
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:] + deployment.logs()
    assert (tmp_path / "model.safetensors").exists(), deployment.logs()
    W, _ = read_model(tmp_path / "model.safetensors")
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["refused"] == {"h3": "linear"} and report["participants"] == ["h1", "h2"]
    X12 = np.concatenate([data[h][0] for h in ("h1", "h2")])
    y12 = np.concatenate([data[h][1] for h in ("h1", "h2")])
    W12 = centralised_weights(X12, y12, c.classes)
    assert np.linalg.norm(W - W12) <= 2 * report["w_error_bound"]["rel_bound"] * np.linalg.norm(W12)
    records = [json.loads(line) for line in c.audit_path().read_text().splitlines()]
    assert [r["actor"] for r in records if r["event"] == "split_validity"] == ["hospital:h3"]
    evidence = json.loads((c.root / "keys" / f"{c.session_id}.validity-refusals.json").read_text())
    assert set(evidence["server_messages"]) == {"h3"}


def test_flower_split_a_sum_re_masked_after_the_share_never_reaches_the_model(tmp_path, deployment):
    from pathlib import Path

    from secure_afl import split
    from secure_afl.release_checks import ReleaseLedger

    # Prepare: the ServerApp runs modified software (tests/support/flower_server_cheat): once the share is in, it
    # relays a second masked sum, enc(v*) - share, signed over the key holder's own share statement
    c, data, server_config = _started(tmp_path, deployment, seed=21, min_clients=3)

    # Execute
    out = deployment.run({"session-config": str(server_config), "node-wait-s": 120.0, "reply-timeout-s": 240.0},
                         timeout=420, project=Path(__file__).resolve().parent / "support" / "flower_server_cheat")

    # Assert: the key holder refused the second sum by name and released from the one committed before its share:
    # W is the native service's on the same data, bit for bit
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:] + deployment.logs()
    assert (tmp_path / "model.safetensors").exists(), out.stdout[-6000:] + deployment.logs()
    W, meta = read_model(tmp_path / "model.safetensors")
    W_native = native_w(Consortium(tmp_path / "native", backend="split", hospitals=HOSPITALS, min_clients=3,
                                    extra_session={"min_class_count": 1}), data, keygen=_keygen)
    assert np.array_equal(W, W_native)
    kept = json.loads((c.root / "keys" / f"{c.session_id}.split-commitment.json").read_text())
    assert meta.masked_sum_sha256 == kept["masked_sum"]["masked_sum_sha256"]
    ledger = ReleaseLedger(c.root / "keys" / "releases.sqlite3")
    try:
        reason = ledger.blocked_reason(c.keyholder.params(c.session_id).backend_params[split.PUBLIC_CONTEXT_KEY])
    finally:
        ledger.close()
    assert reason and "a second masked sum" in reason
