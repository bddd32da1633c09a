"""Using the model: ``read_model`` returns typed metadata, ``secure-afl predict`` applies W to embeddings of the
session's extractor and refuses embeddings of any other; ``client weights`` writes the shared weights file."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from secure_afl.analytic import centralised_weights
from secure_afl.cli import main
from secure_afl.clients.statsfile import write_embeddings_file
from secure_afl.exceptions import EXIT_INPUT
from secure_afl.extractor import ExtractorFingerprint
from secure_afl.keyholder import ModelMetadata, read_model, write_model

CLASSES = ("benign", "malignant", "normal")
EXTRACTOR = ExtractorFingerprint("resnet18", "sha256:" + "ab" * 32, "paper", 224, CLASSES, 8, "l2:1")


def _model(tmp_path, X, y):
    W = centralised_weights(X, y, len(CLASSES))
    meta = {"session": "cohort-split", "params_digest": "cd" * 32, "backend": "split", "gamma": 1.0,
            "lambda": 0.0, "classes": 3, "participants": ["hosp-a", "hosp-b"], "class_names": list(CLASSES),
            "extractor": EXTRACTOR.to_dict(), "extractor_sha256": EXTRACTOR.digest()}
    write_model(tmp_path / "model.safetensors", W, meta)
    return W


def _data(seed=0, n=60):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((len(CLASSES), 8)) * 3
    y = rng.integers(0, len(CLASSES), n)
    X = centres[y] + 0.3 * rng.standard_normal((n, 8))
    return X / np.linalg.norm(X, axis=1, keepdims=True), y


def test_read_model_returns_typed_metadata(tmp_path):
    # Prepare
    X, y = _data()
    W = _model(tmp_path, X, y)

    # Execute
    W2, meta = read_model(tmp_path / "model.safetensors")

    # Assert: values, not JSON strings
    assert isinstance(meta, ModelMetadata)
    np.testing.assert_array_equal(W2, W)
    assert meta.participants == ("hosp-a", "hosp-b") and meta.class_names == CLASSES and meta.classes == 3
    assert meta.extractor == EXTRACTOR and meta.lam == 0.0 and meta.gamma == 1.0 and meta.session == "cohort-split"


def test_predict_applies_the_model_to_embeddings_of_its_extractor(tmp_path, capsys):
    # Prepare: embeddings made with the model's extractor (what `client embed --out` records)
    X, y = _data()
    W = _model(tmp_path, X, y)
    Xn, yn = _data(seed=0, n=30)
    write_embeddings_file(tmp_path / "new.npz", Xn, yn, CLASSES, {"extractor": EXTRACTOR.to_json()})

    # Execute
    rc = main(["predict", "--model", str(tmp_path / "model.safetensors"), "--embeddings", str(tmp_path / "new.npz"),
               "--out", str(tmp_path / "p.csv")])

    # Assert: one row per sample, the argmax of X W by class name, and the accuracy against the labels
    out = capsys.readouterr().out
    assert rc == 0
    rows = list(csv.DictReader(open(tmp_path / "p.csv")))
    expected = np.argmax(Xn @ W, axis=1)
    assert [r["predicted"] for r in rows] == [CLASSES[k] for k in expected]
    assert [r["label"] for r in rows] == [CLASSES[k] for k in yn]
    assert [r["file"] for r in rows] == [f"new.npz#{i}" for i in range(30)]
    accuracy = float(np.mean(expected == yn))
    assert out.startswith("30 samples, model of session cohort-split: ")
    assert f"accuracy against the labels {accuracy:.4f}" in out


def test_predict_refuses_embeddings_of_another_extractor(tmp_path, capsys):
    # Prepare: the same kind of embeddings, but from another weights file
    X, y = _data()
    _model(tmp_path, X, y)
    other = ExtractorFingerprint("resnet18", "sha256:" + "ef" * 32, "paper", 224, CLASSES, 8, "l2:1")
    write_embeddings_file(tmp_path / "new.npz", X, y, CLASSES, {"extractor": other.to_json()})

    # Execute
    rc = main(["predict", "--model", str(tmp_path / "model.safetensors"), "--embeddings", str(tmp_path / "new.npz"),
               "--out", str(tmp_path / "p.csv")])

    # Assert
    err = capsys.readouterr().err.strip()
    assert rc == EXIT_INPUT and not (tmp_path / "p.csv").exists()
    assert err == (f"secure-afl: error [extractor_mismatch]: {tmp_path / 'new.npz'} comes from another feature "
                   f"extractor than the model's (weights: model sha256:{'ab' * 32} vs sha256:{'ef' * 32}): its "
                   "predictions would be meaningless; embed with the session's backbone and weights file")


def test_client_weights_writes_a_seeded_random_backbone_without_a_model_cache(tmp_path, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    # Prepare: a machine with no torch cache at all
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty-torch-home"))

    # Execute
    rc = main(["client", "weights", "--backbone", "resnet18", "--out", str(tmp_path / "resnet18.pth")])

    # Assert: the random initialisation, said as such, and the printed fingerprint is the file's
    out = capsys.readouterr()
    import hashlib

    digest = hashlib.sha256((tmp_path / "resnet18.pth").read_bytes()).hexdigest()
    assert rc == 0 and out.out.strip() == f"sha256:{digest}"
    assert "a seeded random initialisation (seed 0; no pretrained weights on this machine)" in out.err
    # what it does is said before the seconds it takes, not only with the result
    assert out.err.splitlines()[0].startswith("secure-afl client weights: building resnet18 and writing")
    state = torch.load(str(tmp_path / "resnet18.pth"), weights_only=True)
    torch.manual_seed(0)
    import torchvision

    expected = torchvision.models.resnet18().state_dict()
    assert all(torch.equal(state[k], expected[k]) for k in expected)
    # a second run never overwrites the file every party already holds
    assert main(["client", "weights", "--backbone", "resnet18", "--out", str(tmp_path / "resnet18.pth")]) == 3
    err = capsys.readouterr().err
    assert "[file_exists]" in err and len(err.strip().splitlines()) == 1, err


def _image_model(tmp_path, weights_id: str, dim: int = 512):
    """A model of a session whose extractor is resnet18 with the given weights id, and an images/<class>/ tree."""
    from PIL import Image

    rng = np.random.default_rng(3)
    ext = ExtractorFingerprint("resnet18", weights_id, "paper", 224, CLASSES, dim, "l2:1")
    meta = {"session": "cohort-split", "params_digest": "cd" * 32, "backend": "split", "gamma": 1.0,
            "lambda": 0.0, "classes": 3, "participants": ["hosp-a", "hosp-b"], "class_names": list(CLASSES),
            "extractor": ext.to_dict(), "extractor_sha256": ext.digest()}
    write_model(tmp_path / "model.safetensors", rng.standard_normal((dim, len(CLASSES))), meta)
    for c in CLASSES:
        (tmp_path / "images" / c).mkdir(parents=True)
        for name in ("b.png", "a.png"):
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(tmp_path / "images" / c / name)


def test_predict_refuses_another_weights_file_before_embedding_any_image(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    # Prepare: the model names one weights file; the one given is another (not even a checkpoint: loading
    # it, as embedding would, fails another way)
    _image_model(tmp_path, "sha256:" + "ab" * 32)
    (tmp_path / "other.pth").write_bytes(b"not the session's weights")

    # Execute
    rc = main(["predict", "--model", str(tmp_path / "model.safetensors"), "--images", str(tmp_path / "images"),
               "--weights", str(tmp_path / "other.pth"), "--no-progress"])

    # Assert: the fingerprint's refusal, naming both hashes, before any image was read
    import hashlib

    err = capsys.readouterr().err
    assert rc == EXIT_INPUT and "[extractor_mismatch]" in err, err
    assert hashlib.sha256(b"not the session's weights").hexdigest() in err and "ab" * 32 in err
    assert "nothing was embedded" in err


def test_predict_names_the_image_of_every_row(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    # Prepare: the model of a seeded random resnet18, two images per class folder
    _image_model(tmp_path, "random-seed:0")

    # Execute
    rc = main(["predict", "--model", str(tmp_path / "model.safetensors"), "--images", str(tmp_path / "images"),
               "--out", str(tmp_path / "p.csv"), "--no-progress"])

    # Assert: each row names its image (relative to the folder) and its label is that image's folder
    assert rc == 0, capsys.readouterr().err
    rows = list(csv.DictReader(open(tmp_path / "p.csv")))
    assert sorted(r["file"] for r in rows) == sorted(f"{c}/{n}" for c in CLASSES for n in ("a.png", "b.png"))
    assert all(r["file"].split("/")[0] == r["label"] for r in rows)
