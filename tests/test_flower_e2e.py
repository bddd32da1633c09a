"""End-to-end: a real Flower deployment on 127.0.0.1 (SuperLink, three hospital SuperNodes and the
key holder's SuperNode, `flwr run`) carries one secure AFL round; W must match the plaintext solution
and the native service's W on the same data, and the audit story must hold."""

import json
import shutil
import time

import numpy as np
import pytest

from secure_afl import pki
from secure_afl.session.signed import load_signed, sign, sign_definition
from secure_afl.analytic import centralised_weights
from secure_afl.audit_verify import load_receipts, verify_log
from secure_afl.backends.ckks import ckks_session_params
from secure_afl.cli import main
from secure_afl.flower import PROJECT_DIR
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.keyholder import read_model

from support.flower import FlowerDeployment, hospital_data, native_w
from support import Consortium, w_error_bound

pytestmark = [pytest.mark.e2e, pytest.mark.flower]

HOSPITALS = ("h1", "h2", "h3")


def keygen(c):
    c.keyholder.keygen(ckks_session_params(c.session_id, Layout(c.dim, c.classes), 1.0,
                                           Bounds(c.max_norm, 1000, 8)))


SECAGG = {"threshold": 2, "stage_timeout_s": 60.0}


def consortium(root, backend):
    # secagg, 3 hospitals, t = 2: a consistency quorum of 3 is reachable only with min_clients <= 2
    if backend == "secagg":
        return Consortium(root, backend=backend, hospitals=HOSPITALS, min_clients=2, secagg=SECAGG)
    return Consortium(root, backend=backend, hospitals=HOSPITALS, min_clients=3)


@pytest.fixture
def deployment(tmp_path):
    d = FlowerDeployment(tmp_path / "flower")
    yield d
    d.stop()


@pytest.mark.parametrize("backend", ["plain", "ckks", "secagg"])
def test_flower_round_matches_plaintext_and_native_service(tmp_path, deployment, backend):
    # Prepare: one consortium for the Flower round, one for the native service, the same hospital data
    c = consortium(tmp_path / "fl", backend)
    data = hospital_data(c, seed=15)
    if backend == "ckks":
        keygen(c)
    server_config = deployment.start_parties(c, data, tmp_path, min_clients=3,
                                             hospital_config=lambda h: {"secagg-dir": tmp_path / h / "secagg"})
    # Execute
    t0 = time.perf_counter()
    out = deployment.run({"session-config": str(server_config), "node-wait-s": 120.0, "reply-timeout-s": 240.0},
                         timeout=420)
    wall = time.perf_counter() - t0
    # Assert
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:] + deployment.logs()
    assert (tmp_path / "model.safetensors").exists(), out.stdout[-4000:] + deployment.logs()
    W, meta = read_model(tmp_path / "model.safetensors")
    X_all = np.concatenate([d[0] for d in data.values()])
    y_all = np.concatenate([d[1] for d in data.values()])
    W_plain = centralised_weights(X_all, y_all, c.classes)
    W_native = native_w(consortium(tmp_path / "native", backend), data, keygen=keygen if backend == "ckks" else None)
    rel_plain = np.linalg.norm(W - W_plain) / np.linalg.norm(W_plain)
    rel_native = np.linalg.norm(W - W_native) / np.linalg.norm(W_native)
    print(f"flower {backend}: |W-W_plain|/|W_plain| = {rel_plain:.2e}, |W-W_native|/|W_native| = {rel_native:.2e},"
          f" flwr run {wall:.1f} s")
    report = json.loads((tmp_path / "report.json").read_text())
    if backend == "plain":
        assert rel_plain <= 1e-9 and rel_native <= 2e-9
    elif backend == "secagg":  # the masks cancel exactly: the same fixed-point sum, the same solve, the same W
        # the certified bound is against the exact W*; W_plain (float64 from the rows) carries its own error
        bound = report["w_error_bound"]
        print(f"flower secagg: certified rel bound {bound['rel_bound']:.2e}; "
              f"max |W-W_native| = {np.max(np.abs(W - W_native)):.1e}")
        assert bound["applies"] and rel_plain <= 2 * bound["rel_bound"] and np.array_equal(W, W_native)
        closed = [json.loads(line) for line in c.audit_path().read_text().splitlines()]
        closed = [r["details"] for r in closed if r["event"] == "secagg_stage_closed"]
        # the sealed secrets are gone; what stays is each hospital's record of having signed (no secret)
        assert [d["dropped"] for d in closed] == [[]] * 5 and not any(
            list((tmp_path / h / "secagg").glob("*.sealed")) for h in HOSPITALS)
        # ... kept in the hospital's own directory of its bundle, where `client submit` looks too
        assert all((tmp_path / "bundles" / f"hospital-{h}" / f"hospital-{h}" / "secagg-records"
                    / f"secagg-signed-{c.session_id}-{h}.record").exists() for h in HOSPITALS)
    else:  # each release is flooded independently: both within the key holder's reported bound of X^+Y
        bound = w_error_bound(X_all, W_plain, report["error_bound_per_entry"], c.classes, report["lambda_total"])
        assert report["flood_sigma"] > 0 and report["resummed_by_keyholder"]
        assert np.linalg.norm(W - W_plain) <= bound and np.linalg.norm(W_native - W_plain) <= bound
    assert meta.participants == tuple(HOSPITALS) and meta.backend == backend
    assert meta.session == c.session_id and len(meta.params_digest) == 64
    assert report["participants"] == list(HOSPITALS) and report["samples"] == len(y_all)
    assert (report.get("tag_check") is not None) == (backend == "ckks")
    # the auditor's check: the log up to the close record the key holder countersigned over Flower
    receipts = load_receipts(tmp_path / "receipts")
    head = json.loads((c.audit_path().parent / "audit-head.json").read_text())
    assert head["countersign"] is not None and head["countersign"]["keyholder"] == "keyholder"
    v = verify_log(c.audit_path(), server_pub=pki.load_party(c.pki_dir, "server", "aggregator").identity_pub(),
                   head=head, countersign=head["countersign"],
                   keyholder_pub=pki.load_party(c.pki_dir, "keyholder", "keyholder").identity_pub(),
                   receipts=receipts)
    assert v.n_receipts == 3 and v.n_refused == 0 and v.countersigned_by


@pytest.mark.security
def test_flower_rogue_keyholder_node_cannot_open_the_session(tmp_path, deployment):
    """A SuperNode that calls itself the key holder, with keys from a PKI of its own, offers its own
    public context: hospitals would encrypt to it. The ServerApp must refuse the publication (audited)
    and no hospital may upload anything."""
    # Prepare
    c = Consortium(tmp_path / "fl", backend="ckks", hospitals=HOSPITALS, min_clients=3)
    data = hospital_data(c, seed=16)
    for h, (X, y) in data.items():
        np.savez(tmp_path / f"{h}.npz", X=X, y=y)
    rogue_pki = tmp_path / "rogue-pki"
    pki.init_ca(rogue_pki)
    pki.issue(rogue_pki, "keyholder", "keyholder")
    from secure_afl.keyholder import KeyHolder

    rogue = KeyHolder(rogue_pki, "keyholder", tmp_path / "rogue-keys", passphrase=b"rogue passphrase")
    rogue.keygen(ckks_session_params(c.session_id, Layout(c.dim, c.classes), 1.0, Bounds(c.max_norm, 1000, 8)))
    (tmp_path / "pass").write_bytes(b"rogue passphrase")
    deployment.start_superlink()
    for h in HOSPITALS:
        deployment.start_supernode(h, {"role": "hospital", "name": h, "pki-dir": c.pki_dir,
                                       "data": tmp_path / f"{h}.npz", "receipts-dir": tmp_path / "receipts"})
    deployment.start_supernode("rogue", {
        "role": "keyholder", "name": "keyholder", "pki-dir": rogue_pki, "keys-dir": tmp_path / "rogue-keys",
        "passphrase-file": tmp_path / "pass", "min-clients": 1, "out": tmp_path / "stolen.safetensors",
        "report": tmp_path / "stolen.json"})
    # Execute
    out = deployment.run({"session-config": str(c.config), "node-wait-s": 120.0, "reply-timeout-s": 240.0},
                         timeout=420)
    # Assert
    records = [json.loads(line) for line in c.audit_path().read_text().splitlines()]
    refused = [r for r in records if r.get("outcome") == "refused"]
    accepted_uploads = [r for r in records if r.get("event") == "upload" and r.get("outcome") == "accepted"]
    # a signature that does not verify proves no identity: the claimed key holder is audited as unauthenticated
    assert refused and refused[0]["actor"] == "unauthenticated", out.stdout[-3000:] + deployment.logs()
    assert refused[0]["event"] == "request" and refused[0]["details"]["path"].endswith(f"/{c.session_id}/context")
    assert accepted_uploads == [] and not (tmp_path / "stolen.safetensors").exists()
    assert not any(r.get("event") == "publish_context" and r.get("outcome") == "accepted" for r in records)
    assert refused[0]["reason"] == "bad_signature" and not (tmp_path / "receipts").exists()
    assert "secure-afl round refused: bad_signature" in out.stdout


@pytest.mark.security
def test_flower_hospitals_refuse_a_server_that_is_not_the_pinned_one(tmp_path, deployment):
    """Someone runs the ServerApp with an aggregation-server identity of their own (the hospitals'
    public enrolments copied in, so it would accept their uploads). Flower connects the hospitals'
    SuperNodes to it all the same; the hospitals must notice the server is not the consortium's and
    upload nothing."""
    # Prepare
    c = Consortium(tmp_path / "fl", backend="plain", hospitals=HOSPITALS, min_clients=3)
    data = hospital_data(c, seed=17)
    for h, (X, y) in data.items():
        np.savez(tmp_path / f"{h}.npz", X=X, y=y)
    rogue = Consortium(tmp_path / "rogue", backend="plain", hospitals=(), min_clients=3, sign=False)
    for h in HOSPITALS:
        (rogue.pki_dir / f"hospital-{h}").mkdir()
        shutil.copy(c.pki_dir / f"hospital-{h}" / "enrolment.json", rogue.pki_dir / f"hospital-{h}")
    sign(rogue.config, rogue.pki_dir)  # its own CA: no hospital pins it
    deployment.start_superlink()
    for h in HOSPITALS:
        deployment.start_supernode(h, {"role": "hospital", "name": h, "pki-dir": c.pki_dir,
                                       "data": tmp_path / f"{h}.npz", "receipts-dir": tmp_path / "receipts"})
    deployment.start_supernode("keyholder", {
        "role": "keyholder", "name": "keyholder", "pki-dir": rogue.pki_dir, "keys-dir": tmp_path / "keys",
        "min-clients": 1, "out": tmp_path / "model.safetensors", "report": tmp_path / "report.json"})
    # Execute
    out = deployment.run({"session-config": str(rogue.config), "node-wait-s": 120.0, "reply-timeout-s": 240.0},
                         timeout=420)
    # Assert
    records = [json.loads(line) for line in rogue.audit_path().read_text().splitlines()]
    assert records and sorted(records[0]["details"]["hospitals"]) == list(HOSPITALS), deployment.logs()
    assert not any(r["event"] == "upload" and r["outcome"] == "accepted" for r in records), deployment.logs()
    assert not (tmp_path / "receipts").exists() and not (tmp_path / "model.safetensors").exists()
    assert "secure-afl round refused: insufficient_contributors" in out.stdout, out.stdout[-3000:]
    # the refusal is one log line, no traceback, and README's outcome check (grep for "round done") fails
    assert "Traceback" not in out.stdout + out.stderr and "secure-afl round done" not in out.stdout


ROGUE_SERVERAPP = '''
"""An aggregation server that hands out receipts it did not sign as issued."""
from flwr.serverapp import ServerApp

from secure_afl.flower import server_app
from secure_afl.server import intake

app = ServerApp()
_submit = intake.submit


def _forging_submit(session, hospital, statement, payload, tag=None):
    receipt = _submit(session, hospital, statement, payload, tag)
    return {**receipt, "seq": receipt["seq"] + 1000}


@app.main()
def main(grid, context):
    intake.submit = _forging_submit
    server_app.main(grid, context)
'''


@pytest.mark.security
def test_flower_hospitals_keep_no_receipt_the_server_did_not_sign(tmp_path, deployment):
    """A ServerApp that alters the receipts it sends (so a hospital would later hold no proof that the
    audit log names its upload): each hospital's ClientApp must refuse the receipt and keep nothing."""
    # Prepare: the project file of the Flower app, with the ServerApp swapped for the forging one
    c = Consortium(tmp_path / "fl", backend="plain", hospitals=HOSPITALS, min_clients=3)
    data = hospital_data(c, seed=18)
    for h, (X, y) in data.items():
        np.savez(tmp_path / f"{h}.npz", X=X, y=y)
    project = tmp_path / "rogue-project"
    project.mkdir()
    (project / "rogue_serverapp.py").write_text(ROGUE_SERVERAPP)
    (project / "pyproject.toml").write_text((PROJECT_DIR / "pyproject.toml").read_text().replace(
        '"secure_afl.flower.server_app:app"', '"rogue_serverapp:app"'))
    deployment.start_superlink()
    for h in HOSPITALS:
        deployment.start_supernode(h, {"role": "hospital", "name": h, "pki-dir": c.pki_dir,
                                       "data": tmp_path / f"{h}.npz", "receipts-dir": tmp_path / "receipts"})
    deployment.start_supernode("keyholder", {
        "role": "keyholder", "name": "keyholder", "pki-dir": c.pki_dir, "keys-dir": c.root / "keys",
        "min-clients": 3, "out": tmp_path / "model.safetensors", "report": tmp_path / "report.json"})
    # Execute
    out = deployment.run({"session-config": str(c.config), "node-wait-s": 120.0, "reply-timeout-s": 240.0},
                         timeout=420, project=project)
    # Assert: the round itself went through (the forgery is only in the receipts), no receipt was kept
    assert "secure-afl round done" in out.stdout, out.stdout[-3000:] + deployment.logs()
    records = [json.loads(line) for line in c.audit_path().read_text().splitlines()]
    assert sum(r["event"] == "upload" and r["outcome"] == "accepted" for r in records) == 3
    assert not (tmp_path / "receipts").exists() or load_receipts(tmp_path / "receipts") == []


@pytest.mark.security
def test_flower_secagg_survives_a_crash_after_share_keys_and_refuses_an_impostor(tmp_path, deployment):
    """Six enrolled hospitals, t = 2 (quorum 4 of the signed 6). h5's SuperNode is an impostor (a PKI of its own, the consortium's
    public enrolments copied in): its answers carry no valid h5 signature, so the server refuses them
    (audited) and h5 is dropped at setup. h4's SuperNode crashes once it has shared its keys: its masked
    input never arrives. The round must still finish, exactly, on h1-h3 and h6, with the native audit story."""
    # Prepare
    names = ("h1", "h2", "h3", "h4", "h5", "h6")
    c = Consortium(tmp_path / "fl", backend="secagg", hospitals=names, min_clients=2,
                   secagg={"threshold": 2, "stage_timeout_s": 40.0})
    data = hospital_data(c, seed=19, names=names)
    for h, (X, y) in data.items():
        np.savez(tmp_path / f"{h}.npz", X=X, y=y)
    rogue_pki = tmp_path / "rogue-pki"
    pki.init_ca(rogue_pki)
    pki.issue(rogue_pki, "hospital", "h5")
    for role_dir in ["server-aggregator", "keyholder-keyholder"] + [f"hospital-{h}" for h in names if h != "h5"]:
        (rogue_pki / role_dir).mkdir()
        shutil.copy(c.pki_dir / role_dir / "enrolment.json", rogue_pki / role_dir)
    # the impostor's own CA signs the same definition, so its node answers (and the server must refuse it)
    sign_definition(load_signed(c.pki_dir, c.session_id), rogue_pki)
    deployment.start_superlink()
    for h in names:
        deployment.start_supernode(h, {"role": "hospital", "name": h, "pki-dir": rogue_pki if h == "h5" else c.pki_dir,
                                       "data": tmp_path / f"{h}.npz", "receipts-dir": tmp_path / "receipts",
                                       "secagg-dir": tmp_path / h / "secagg"})
    deployment.start_supernode("keyholder", {
        "role": "keyholder", "name": "keyholder", "pki-dir": c.pki_dir, "keys-dir": c.root / "keys",
        "min-clients": 3, "out": tmp_path / "model.safetensors", "report": tmp_path / "report.json"})
    # Execute: h4 crashes as soon as the server has stored its share_keys answer
    run = deployment.start_run({"session-config": str(c.config), "node-wait-s": 120.0, "reply-timeout-s": 240.0})
    deadline = time.monotonic() + 300
    while run.poll() is None and time.monotonic() < deadline and not any(
            r["event"] == "secagg_share_keys" and r["actor"] == "h4" and r["outcome"] == "accepted"
            for r in _audit(c)):
        time.sleep(0.05)  # bounded: watching the server's audit log for h4's stored answer
    deployment.kill_node("h4")
    stdout, _ = run.communicate(timeout=420)
    # Assert
    assert (tmp_path / "model.safetensors").exists(), stdout[-3000:] + deployment.logs()
    W, meta = read_model(tmp_path / "model.safetensors")
    survivors = ["h1", "h2", "h3", "h6"]
    X = np.concatenate([data[h][0] for h in survivors])
    y = np.concatenate([data[h][1] for h in survivors])
    W_plain = centralised_weights(X, y, c.classes)
    report = json.loads((tmp_path / "report.json").read_text())
    rel = np.linalg.norm(W - W_plain) / np.linalg.norm(W_plain)
    print(f"flower secagg, h4 crashed, h5 impostor: |W-W_plain|/|W_plain| = {rel:.2e} "
          f"(certified {report['w_error_bound']['rel_bound']:.2e})")
    assert report["participants"] == survivors and list(meta.participants) == survivors
    assert rel <= 2 * report["w_error_bound"]["rel_bound"]
    records = _audit(c)
    assert [r["details"]["dropped"] for r in records if r["event"] == "secagg_stage_closed"] == [
        ["h5"], [], [], ["h4"], []]
    impostor = [r for r in records if r["outcome"] == "refused" and r["event"] == "request"]
    assert impostor and {r["actor"] for r in impostor} == {"unauthenticated"}
    assert {r["reason"] for r in impostor} == {"bad_signature"}
    assert not any(r["actor"] == "h5" and r["outcome"] == "accepted" for r in records)
    # the ServerApp starts the round itself: no hospital is named for a poll it did not sign
    assert [r["actor"] for r in records if r["event"] == "secagg_round_opened"] == ["aggregator"]
    head = json.loads((c.audit_path().parent / "audit-head.json").read_text())
    v = verify_log(c.audit_path(), server_pub=pki.load_party(c.pki_dir, "server", "aggregator").identity_pub(),
                   head=head, countersign=head["countersign"],
                   keyholder_pub=pki.load_party(c.pki_dir, "keyholder", "keyholder").identity_pub(),
                   receipts=load_receipts(tmp_path / "receipts"))
    assert v.n_receipts == 4 and v.countersigned_by
    assert main(["audit", "verify", str(c.audit_path()), "--pki", str(c.pki_dir), "--head",
                 str(c.audit_path().parent / "audit-head.json"), "--receipts", str(tmp_path / "receipts")]) == 0


def _audit(c):
    """The audit log's complete lines (the server may be appending one)."""
    path = c.audit_path()
    return [json.loads(line) for line in path.read_text().split("\n")[:-1]] if path.exists() else []



ROGUE_SECAGG_SERVERAPP = '''
"""An aggregation server that forges its secagg requests ({forgery})."""
import base64

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.serverapp import ServerApp

from secure_afl.flower import server_app
from secure_afl.protocol import SECAGG_REQUEST_PREFIX
from secure_afl.server import secagg_round, status

app = ServerApp()
_request = secagg_round.secagg_request
_other_key = Ed25519PrivateKey.generate()


def _signed_by_another_key(session, hospital):
    r = _request(session, hospital)
    if "request" in r:
        raw = base64.b64decode(r["request"])
        r = {{**r, "signature": _other_key.sign(SECAGG_REQUEST_PREFIX + raw).hex()}}
    return r


_state = secagg_round.secagg_state


def _numbered_backwards(enrolled):
    state = _state(enrolled)
    state.names = tuple(sorted(enrolled, reverse=True))
    state.client_ids = {{name: i + 1 for i, name in enumerate(state.names)}}
    return state


_info = status.session_info


def _with_a_sybil(session):
    d = _info(session)
    sybil = {{**d["secagg"]["client_ids"], "zz-sybil": len(session.enrolled) + 1}}
    d["secagg"] = {{**d["secagg"], "client_ids": sybil}}
    return d


@app.main()
def main(grid, context):
    if "{forgery}" == "signature":
        secagg_round.secagg_request = _signed_by_another_key
    elif "{forgery}" == "sybil":
        status.session_info = _with_a_sybil
    else:
        secagg_round.secagg_state = _numbered_backwards
    server_app.main(grid, context)
'''


@pytest.mark.security
@pytest.mark.parametrize("forgery", ["signature", "numbering", "sybil"])
def test_flower_secagg_hospitals_answer_no_forged_request(tmp_path, deployment, forgery):
    """A ServerApp that signs its secagg requests with a key that is not the consortium server's, that
    numbers the hospitals in another order than the sorted enrolment (choosing who sits where in the
    neighbour graph), or that announces a participant the consortium never enrolled: every hospital's
    ClientApp must refuse at setup, so the round aborts with nothing shared, masked or revealed."""
    # Prepare
    c = Consortium(tmp_path / "fl", backend="secagg", hospitals=HOSPITALS, min_clients=2,
                   secagg={"threshold": 2, "stage_timeout_s": 10.0})
    data = hospital_data(c, seed=21)
    for h, (X, y) in data.items():
        np.savez(tmp_path / f"{h}.npz", X=X, y=y)
    project = tmp_path / "rogue-project"
    project.mkdir()
    (project / "rogue_serverapp.py").write_text(ROGUE_SECAGG_SERVERAPP.format(forgery=forgery))
    (project / "pyproject.toml").write_text((PROJECT_DIR / "pyproject.toml").read_text().replace(
        '"secure_afl.flower.server_app:app"', '"rogue_serverapp:app"'))
    deployment.start_superlink()
    for h in HOSPITALS:
        deployment.start_supernode(h, {"role": "hospital", "name": h, "pki-dir": c.pki_dir,
                                       "data": tmp_path / f"{h}.npz", "receipts-dir": tmp_path / "receipts",
                                       "secagg-dir": tmp_path / h / "secagg"})
    deployment.start_supernode("keyholder", {
        "role": "keyholder", "name": "keyholder", "pki-dir": c.pki_dir, "keys-dir": c.root / "keys",
        "min-clients": 2, "out": tmp_path / "model.safetensors", "report": tmp_path / "report.json"})
    # Execute
    out = deployment.run({"session-config": str(c.config), "node-wait-s": 120.0, "reply-timeout-s": 240.0},
                         timeout=420, project=project)
    # Assert: no hospital answered anything; the round aborted at setup
    records = _audit(c)
    assert not any(r["event"].startswith("secagg_") and r["event"] != "secagg_round_opened"
                   and r["outcome"] == "accepted" for r in records), out.stdout[-3000:] + deployment.logs()
    closed = [r for r in records if r["event"] == "secagg_stage_closed"]
    assert len(closed) == 1 and closed[0]["outcome"] == "refused" and closed[0]["details"]["stage"] == "setup", \
        (records, out.stdout[-3000:] + deployment.logs())
    assert "secure-afl round refused: insufficient_shares" in out.stdout, out.stdout[-3000:]
    assert not (tmp_path / "model.safetensors").exists() and not (tmp_path / "receipts").exists()
