"""The session's feature extractor: recorded by `client embed`, bound by the parameters, checked at submit.

Statistics extracted with other weights, another preprocessing or another
class order are refused by the hospital's own `client submit` (a real
process against a real server) with a line naming both sides, and nothing
reaches the server.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
from PIL import Image  # noqa: E402

from secure_afl.clients import embed as E  # noqa: E402
from secure_afl.clients.statsfile import recorded_extractor  # noqa: E402
from secure_afl.exceptions import EXIT_INPUT, InvalidInputError, ParameterMismatch  # noqa: E402
from secure_afl.extractor import ExtractorFingerprint  # noqa: E402
from support import Consortium  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
CLASSES = ["benign", "malignant", "normal"]


@pytest.fixture(scope="module")
def material(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp")
    rng = np.random.default_rng(0)
    for c in CLASSES:
        (root / "imgs" / c).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(root / "imgs" / c / f"{i}.png")
    weights = {}
    for seed in (1, 2):
        torch.manual_seed(seed)
        weights[seed] = root / f"resnet18-{seed}.pth"
        torch.save(torchvision.models.resnet18().state_dict(), weights[seed])
    old = torch.get_num_threads()
    torch.set_num_threads(2)

    def stats(name, *, weights_seed=1, preset="paper", classes=",".join(CLASSES)):
        out = root / f"{name}.npz"
        E.embed_to_file(images=str(root / "imgs"), backbone="resnet18", weights=str(weights[weights_seed]),
                        preset=preset, device="cpu", batch_size=6, stats_only=str(out), classes=classes,
                        progress=False, normalisation="l2:1")
        return out

    files = {"reference": stats("reference"), "other_weights": stats("w2", weights_seed=2),
             "other_preprocessing": stats("imagenet", preset="imagenet"),
             "other_class_order": stats("order", classes=",".join(reversed(CLASSES)))}
    torch.set_num_threads(old)
    return files


@pytest.fixture(scope="module")
def session(material, tmp_path_factory):
    declared = recorded_extractor(material["reference"])  # the consortium's reference run
    c = Consortium(tmp_path_factory.mktemp("s"), backend="plain", hospitals=("h1", "h2", "h3"), dim=512,
                   classes=3, min_clients=2, max_norm=1.0, extractor=declared).start()
    yield c
    c.stop()


def _submit(c: Consortium, name: str, path: Path):
    return subprocess.run([sys.executable, "-m", "secure_afl.cli", "client", "submit", "--server", c.url,
                           "--session", c.session_id, "--pki", str(c.pki_dir), "--name", name, "--stats",
                           str(path), "--receipts", str(c.root / "rc"), "--no-progress"],
                          capture_output=True, text=True, timeout=180)


def _contributions(c: Consortium) -> int:
    with c.connect_keyholder() as conn:
        return len(conn.status()["uploaded"])


def test_embed_records_every_fingerprint_field(material):
    fp = ExtractorFingerprint.from_dict(recorded_extractor(material["reference"]))
    digest = "sha256:" + hashlib.sha256((Path(material["reference"]).parent / "resnet18-1.pth").read_bytes()).hexdigest()
    assert (fp.backbone, fp.weights, fp.preset, fp.input_size, fp.classes, fp.dim, fp.normalisation) == (
        "resnet18", digest, "paper", 224, tuple(CLASSES), 512, "l2:1")


@pytest.mark.e2e
@pytest.mark.parametrize("variant, field", [("other_weights", "weights"), ("other_preprocessing", "preset"),
                                            ("other_class_order", "classes")])
def test_mismatched_extractor_is_refused_at_submit_and_nothing_is_stored(session, material, variant, field):
    # Prepare
    before = _contributions(session)

    # Execute
    out = _submit(session, "h2", material[variant])

    # Assert: one line, the differing field with both values, nothing stored
    lines = out.stderr.strip().splitlines()
    assert out.returncode == EXIT_INPUT and len(lines) == 1, out.stderr
    assert lines[0].startswith("secure-afl: error [extractor_mismatch]: ")
    session_fp = ExtractorFingerprint.from_dict(recorded_extractor(material["reference"]))
    file_fp = ExtractorFingerprint.from_dict(recorded_extractor(material[variant]))
    show = (lambda v: ",".join(v) if isinstance(v, tuple) else str(v))
    assert f"{field}: session {show(getattr(session_fp, field))} vs file {show(getattr(file_fp, field))}" in lines[0]
    assert _contributions(session) == before


@pytest.mark.e2e
def test_matching_extractor_is_accepted(session, material):
    # Execute
    out = _submit(session, "h1", material["reference"])

    # Assert
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["hospital"] == "h1"


@pytest.mark.e2e
def test_upload_signed_without_the_extractor_is_refused_by_the_server(session, material):
    # Prepare: a hospital client that drops the declared extractor from the parameters it signs
    from secure_afl.clients.statsfile import load_statistics_file

    client = session.hospital("h3")
    params = client.fetch_params()
    stripped = params.with_extractor(None)
    stats, _ = load_statistics_file(material["reference"], n_classes=3, max_norm=1.0)
    payload, _ = client.protect(stripped, stats)
    before = _contributions(session)

    # Execute / Assert: the signed statement carries the other digest, so the server refuses it
    assert params.extractor is not None and stripped.digest() != params.digest()
    with pytest.raises(ParameterMismatch, match="other session parameters"):
        client.upload(stripped, payload)
    client.close()
    assert _contributions(session) == before


def test_random_weights_need_a_seed_and_the_seed_is_recorded(tmp_path, material):
    imgs = Path(material["reference"]).parent / "imgs"
    with pytest.raises(InvalidInputError, match="--seed"):
        E.embed_to_file(images=str(imgs), backbone="resnet18", weights="random", device="cpu",
                        stats_only=str(tmp_path / "r.npz"), progress=False)
    runs = [E.embed_to_file(images=str(imgs), backbone="resnet18", weights="random", seed=7, device="cpu",
                            stats_only=str(tmp_path / f"r{i}.npz"), progress=False) for i in range(2)]
    assert recorded_extractor(tmp_path / "r0.npz")["weights"] == "random-seed:7"
    assert np.array_equal(runs[0].statistics.gram, runs[1].statistics.gram)
