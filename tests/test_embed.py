"""Hospital-side embedding extraction: real torchvision models, real files, CPU.

Random-init resnet18 (seeded, saved as a .pth state dict and loaded through
``--weights PATH``) on a handful of 32x32 images, so the whole module runs in
a few seconds on two cores without any download.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
from PIL import Image  # noqa: E402
from torchvision import transforms as T  # noqa: E402

from secure_afl.cli import main  # noqa: E402
from secure_afl.clients import embed as E  # noqa: E402
from secure_afl.clients import extraction  # noqa: E402
from secure_afl.clients.statsfile import (  # noqa: E402
    StatisticsFileError,
    load_statistics_file,
    read_metadata,
)
from secure_afl.exceptions import InvalidInputError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

CLASS_DIRS = ["zebra", "apple", "Mango"]  # created unsorted; sorted order is Mango, apple, zebra
PAPER = T.Compose([T.Resize(224), T.ToTensor(), T.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])


@pytest.fixture(scope="module", autouse=True)
def _threads():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)


def _write_folder(root: Path, per_class=(3, 2, 3), seed=0) -> list[tuple[str, Path]]:
    rng = np.random.default_rng(seed)
    out = []
    for c, k in zip(CLASS_DIRS, per_class):
        (root / c).mkdir(parents=True)
        for i in range(k):
            p = root / c / f"img{k - i}.png"  # names not created in sorted order either
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(p)
            out.append((c, p))
    return out


@pytest.fixture(scope="module")
def weights_pth(tmp_path_factory) -> Path:
    torch.manual_seed(1234)
    model = torchvision.models.resnet18()
    path = tmp_path_factory.mktemp("w") / "resnet18_random.pth"
    torch.save(model.state_dict(), path)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("imgs")
    _write_folder(root)
    return root


def _reference_embeddings(weights_pth: Path, folder: Path):
    """Plain torchvision: resnet18 + state dict, fc -> Identity, paper transforms."""
    model = torchvision.models.resnet18()
    model.load_state_dict(torch.load(weights_pth, weights_only=True))
    model.fc = torch.nn.Identity()
    model.eval()
    classes = sorted(p.name for p in folder.iterdir())
    xs, ys = [], []
    for ci, c in enumerate(classes):
        for p in sorted((folder / c).iterdir()):
            xs.append(PAPER(Image.open(p).convert("RGB")))
            ys.append(ci)
    with torch.inference_mode():
        X = model(torch.stack(xs)).numpy()
    return X, np.array(ys), classes


@pytest.fixture(scope="module")
def reference(weights_pth, folder):
    return _reference_embeddings(weights_pth, folder)


@pytest.fixture(scope="module")
def cli_embeddings(weights_pth, folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "emb.npz"
    rc = main(["client", "embed", "--images", str(folder), "--backbone", "resnet18",
               "--weights", str(weights_pth), "--device", "cpu", "--batch-size", "3", "--workers", "0",
               "--out", str(out), "--no-progress"])
    assert rc == 0
    return out


def _assert_close_embeddings(X, ref):
    scale = np.abs(ref).max()
    np.testing.assert_allclose(X, ref, rtol=1e-4, atol=1e-5 * scale)


# ----------------------------------------------------------------------------- embeddings


def test_cli_embeddings_equal_plain_torchvision_forward(cli_embeddings, reference):
    # Prepare
    X_ref, y_ref, classes_ref = reference
    # Execute
    with np.load(cli_embeddings, allow_pickle=False) as z:
        X, y, classes = z["X"], z["y"], list(z["classes"])
    meta = read_metadata(cli_embeddings)
    # Assert
    assert X.dtype == np.float32 and X.shape == (8, 512)
    _assert_close_embeddings(X, X_ref)
    np.testing.assert_array_equal(y, y_ref)
    assert classes == classes_ref == ["Mango", "apple", "zebra"]
    assert meta["backbone"] == "resnet18" and meta["preset"] == "paper" and meta["dim"] == 512
    assert meta["weights"].endswith("resnet18_random.pth") and meta["head_removed"] == "fc"
    assert meta["format"] == "secure-afl/embeddings/v1"


def test_library_extract_equals_reference_and_streams_exact_statistics(weights_pth, folder, reference):
    # Prepare
    X_ref, y_ref, _ = reference
    src = E.image_folder(folder)
    prep = E.resolve_preprocessing("paper")
    bb = E.load_backbone("resnet18", str(weights_pth), input_size=prep.crop)
    # Execute
    res = E.extract(src, bb, prep, device="cpu", batch_size=5, workers=0, progress=False)
    # Assert
    assert bb.dim == 512 and bb.head == "fc"
    _assert_close_embeddings(res.X, X_ref)
    X64 = res.X.astype(np.float64)
    Y = np.eye(3)[res.y]
    st = res.statistics
    assert st.gram.dtype == np.float64 and st.gamma == 0.0
    np.testing.assert_allclose(st.gram, X64.T @ X64, rtol=1e-12, atol=1e-12 * np.abs(st.gram).max())
    np.testing.assert_allclose(st.cross, X64.T @ Y, rtol=1e-12, atol=1e-12 * np.abs(st.cross).max())
    np.testing.assert_array_equal(st.class_counts, [3.0, 2.0, 3.0])
    assert st.n == 8


def test_stats_only_file_equals_gram_of_written_embeddings(cli_embeddings, weights_pth, folder, tmp_path):
    # Prepare
    stats_path = tmp_path / "stats.npz"
    with np.load(cli_embeddings, allow_pickle=False) as z:
        X64, y = z["X"].astype(np.float64), z["y"]
    # Execute
    res = E.embed_to_file(images=str(folder), backbone="resnet18", weights=str(weights_pth), device="cpu",
                          batch_size=3, stats_only=str(stats_path), gamma=0.25, progress=False)
    st, classes = load_statistics_file(stats_path)
    st_from_emb, classes_emb = load_statistics_file(cli_embeddings)
    # Assert
    assert res.X is None  # X never materialised with --stats-only
    with np.load(stats_path, allow_pickle=False) as z:
        assert "X" not in z.files and z["gram"].dtype == np.float64
    scale = np.abs(X64.T @ X64).max()
    np.testing.assert_allclose(st.gram, X64.T @ X64, rtol=1e-6, atol=1e-6 * scale)
    np.testing.assert_allclose(st.cross, X64.T @ np.eye(3)[y], rtol=1e-6, atol=1e-6 * scale)
    np.testing.assert_allclose(st.gram, st_from_emb.gram, rtol=1e-6, atol=1e-6 * scale)
    np.testing.assert_array_equal(st.class_counts, st_from_emb.class_counts)
    assert st.gamma == 0.0 and st.n == 8
    assert classes == classes_emb == ["Mango", "apple", "zebra"]
    meta = read_metadata(stats_path)
    assert meta["gamma"] == 0.25 and meta["format"] == "secure-afl/statistics/v1"
    np.testing.assert_allclose(meta["max_row_norm"], np.linalg.norm(X64, axis=1).max(), rtol=1e-6)


def test_image_folder_class_order_is_sorted_and_deterministic(tmp_path):
    # Prepare
    files = _write_folder(tmp_path / "a")
    _write_folder(tmp_path / "b", seed=1)
    # Execute
    s1, s2 = E.image_folder(tmp_path / "a"), E.image_folder(tmp_path / "b")
    fixed = E.image_folder(tmp_path / "a", classes="apple,zebra,Mango,unseen")
    # Assert
    assert s1.classes == s2.classes == ["Mango", "apple", "zebra"]
    assert [Path(p).name for p in s1.paths] == ["img1.png", "img2.png", "img3.png", "img1.png", "img2.png",
                                              "img1.png", "img2.png", "img3.png"]
    np.testing.assert_array_equal(s1.labels, [0, 0, 0, 1, 1, 2, 2, 2])
    assert len(files) == 8
    assert fixed.classes == ["apple", "zebra", "Mango", "unseen"]
    np.testing.assert_array_equal(fixed.labels, [2, 2, 2, 0, 0, 1, 1, 1])
    with pytest.raises(E.DatasetError, match="not in the given class list"):
        E.image_folder(tmp_path / "a", classes="apple,zebra")


# ----------------------------------------------------------------------------- errors, nothing partial


def _no_output_left(directory: Path, name: str) -> bool:
    return not (directory / name).exists() and not any(p.name.startswith(f".{name}.") for p in directory.iterdir())


@pytest.mark.parametrize("kind", ["garbage", "truncated"])
def test_corrupt_image_is_typed_error_and_leaves_nothing(weights_pth, tmp_path, kind, capsys):
    # Prepare
    root = tmp_path / "imgs"
    _write_folder(root, per_class=(2, 2, 2))
    bad = root / "apple" / "img0.png"
    if kind == "garbage":
        bad.write_bytes(b"this is not an image at all" * 10)
    else:
        buf = io.BytesIO()
        Image.fromarray(np.full((32, 32, 3), 7, np.uint8)).save(buf, format="PNG")
        bad.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    outdir = tmp_path / "out"
    outdir.mkdir()
    (outdir / "kept.npz").write_bytes(b"previous complete file")
    # Execute / Assert (library)
    with pytest.raises(E.CorruptImage, match="img0.png") as info:
        E.embed_to_file(images=str(root), backbone="resnet18", weights=str(weights_pth), device="cpu",
                        batch_size=4, out=str(outdir / "emb.npz"), progress=False)
    assert isinstance(info.value, InvalidInputError) and info.value.reason == "corrupt_image"
    assert _no_output_left(outdir, "emb.npz")
    # Execute / Assert (CLI; an existing file is not replaced by a failed run, even one told to replace it)
    rc = main(["client", "embed", "--images", str(root), "--backbone", "resnet18", "--weights",
               str(weights_pth), "--device", "cpu", "--workers", "2", "--no-progress",
               "--stats-only", str(outdir / "kept.npz"), "--force"])
    err = capsys.readouterr().err
    assert rc == 3 and "corrupt_image" in err and "img0.png" in err and "Traceback" not in err
    assert (outdir / "kept.npz").read_bytes() == b"previous complete file"
    assert sorted(p.name for p in outdir.iterdir()) == ["kept.npz"]


def test_empty_class_folder_is_typed_error(tmp_path, weights_pth):
    # Prepare
    root = tmp_path / "imgs"
    _write_folder(root, per_class=(1, 1, 1))
    (root / "empty").mkdir()
    # Execute / Assert
    with pytest.raises(E.EmptyClassFolder, match="empty"):
        E.embed_to_file(images=str(root), backbone="resnet18", weights=str(weights_pth), device="cpu",
                        out=str(tmp_path / "x.npz"), progress=False)
    assert _no_output_left(tmp_path, "x.npz")


def test_unknown_backbone_lists_valid_names(folder, tmp_path, capsys):
    # Execute / Assert
    with pytest.raises(E.UnknownBackbone, match="resnet18") as info:
        E.load_backbone("resnet19", "random")
    assert isinstance(info.value, InvalidInputError) and "list_models" in str(info.value)
    rc = main(["client", "embed", "--images", str(folder), "--backbone", "not_a_net", "--weights", "random",
               "--device", "cpu", "--out", str(tmp_path / "o.npz"), "--no-progress"])
    assert rc == 3 and "unknown_backbone" in capsys.readouterr().err
    assert _no_output_left(tmp_path, "o.npz")


def test_offline_default_weights_without_cache_names_the_file(folder, tmp_path, monkeypatch):
    # Prepare: empty hub cache; downloads go to a closed local port (a real, failing connection)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    for var in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    expected = tmp_path / "torch_home" / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    # Execute / Assert
    with pytest.raises(E.WeightsUnavailable) as info:
        E.embed_to_file(images=str(folder), backbone="resnet18", weights="DEFAULT", device="cpu",
                        out=str(tmp_path / "o.npz"), progress=False)
    msg = str(info.value)
    assert str(expected) in msg and "--weights PATH" in msg
    assert not expected.exists() and _no_output_left(tmp_path, "o.npz")


def test_missing_or_mismatched_weights_file(tmp_path, weights_pth):
    # Execute / Assert
    with pytest.raises(E.WeightsUnavailable, match="no such file"):
        E.load_backbone("resnet18", str(tmp_path / "missing.pth"))
    with pytest.raises(E.InvalidWeightsFile):
        E.load_backbone("mobilenet_v3_small", str(weights_pth))
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(E.InvalidWeightsFile, match="junk.pth"):
        E.load_backbone("resnet18", str(junk))


def test_weights_without_head_and_safetensors_load(tmp_path, weights_pth):
    # Prepare: a backbone-only state dict (fc of another class count), in safetensors
    from safetensors.torch import save_file

    sd = torch.load(weights_pth, weights_only=True)
    sd["fc.weight"], sd["fc.bias"] = torch.zeros(7, 512), torch.zeros(7)
    path = tmp_path / "w.safetensors"
    save_file(sd, str(path))
    # Execute
    a = E.load_backbone("resnet18", str(path))
    b = E.load_backbone("resnet18", str(weights_pth))
    # Assert
    x = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        torch.testing.assert_close(a.model(x), b.model(x))


def test_random_weights_warn_loudly():
    with pytest.warns(E.RandomWeightsWarning, match="RANDOM-INIT"):
        bb = E.load_backbone("squeezenet1_1", "random", input_size=64)
    assert bb.dim == 512 and bb.head == "classifier.1"


# ----------------------------------------------------------------------------- CIFAR / npz sources


def _write_cifar10(root: Path, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    root.mkdir(parents=True)
    names = [n.encode() for n in ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                                  "ship", "truck"]]
    with open(root / "batches.meta", "wb") as fh:
        pickle.dump({b"label_names": names, b"num_vis": 3072}, fh, protocol=2)
    train_x, train_y = [], []
    for i in range(1, 6):
        x = rng.integers(0, 256, (2, 3072), dtype=np.uint8)
        y = [int(v) for v in rng.integers(0, 10, 2)]
        with open(root / f"data_batch_{i}", "wb") as fh:
            pickle.dump({b"batch_label": b"training batch", b"data": x, b"labels": y}, fh, protocol=2)
        train_x.append(x)
        train_y += y
    tx = rng.integers(0, 256, (3, 3072), dtype=np.uint8)
    ty = [1, 0, 9]
    with open(root / "test_batch", "wb") as fh:
        pickle.dump({b"data": tx, b"labels": ty}, fh, protocol=2)
    return np.concatenate(train_x), np.array(train_y), tx, np.array(ty)


def test_cifar10_pickle_reader(tmp_path):
    # Prepare
    rng = np.random.default_rng(3)
    train_x, train_y, test_x, test_y = _write_cifar10(tmp_path / "cifar-10-batches-py", rng)
    # Execute
    train = E.cifar_source(tmp_path, split="train")
    test = E.cifar_source(tmp_path / "cifar-10-batches-py", split="test")
    # Assert
    assert train.arrays.shape == (10, 32, 32, 3) and train.arrays.dtype == np.uint8
    np.testing.assert_array_equal(train.arrays, train_x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(train.labels, train_y)
    np.testing.assert_array_equal(test.labels, test_y)
    assert train.classes[:3] == ["airplane", "automobile", "bird"] and len(train.classes) == 10
    # pixel (row 0, col 1) of image 0: R at 1, G at 1024 + 1, B at 2048 + 1 (CIFAR row-major planes)
    np.testing.assert_array_equal(test.arrays[0, 0, 1], test_x[0, [1, 1025, 2049]])


def test_cifar100_reader_and_cli_stats_only(tmp_path, weights_pth):
    # Prepare: CIFAR-100 layout (train/test/meta with fine labels)
    root = tmp_path / "cifar-100-python"
    root.mkdir()
    rng = np.random.default_rng(4)
    with open(root / "meta", "wb") as fh:
        pickle.dump({b"fine_label_names": [f"c{i}".encode() for i in range(100)],
                     b"coarse_label_names": [b"x"] * 20}, fh, protocol=2)
    x = rng.integers(0, 256, (3, 3072), dtype=np.uint8)
    for split in ("train", "test"):
        with open(root / split, "wb") as fh:
            pickle.dump({b"data": x, b"fine_labels": [5, 99, 5], b"coarse_labels": [0, 1, 0]}, fh, protocol=2)
    out = tmp_path / "stats.npz"
    # Execute
    rc = main(["client", "embed", "--cifar-root", str(tmp_path), "--split", "test", "--backbone", "resnet18",
               "--weights", str(weights_pth), "--device", "cpu", "--workers", "0", "--no-progress",
               "--stats-only", str(out)])
    st, classes = load_statistics_file(out)
    # Assert
    assert rc == 0
    assert st.gram.shape == (512, 512) and st.cross.shape == (512, 100) and len(classes) == 100
    assert st.n == 3 and st.class_counts[5] == 2 and st.class_counts[99] == 1
    assert np.any(st.cross[:, 99] != 0) and np.all(st.cross[:, 0] == 0)


def test_cifar_pickle_with_foreign_globals_is_refused(tmp_path):
    # Prepare: a pickle that would call os.system when loaded with plain pickle
    root = tmp_path / "c"
    root.mkdir()

    class Evil:
        def __reduce__(self):
            import os
            return (os.system, ("true",))

    with open(root / "batches.meta", "wb") as fh:
        pickle.dump({b"label_names": [b"a"], b"x": Evil()}, fh, protocol=2)
    # Execute / Assert
    with pytest.raises(E.DatasetError, match="forbidden global"):
        E.cifar_source(root)


def test_npz_source_with_class_count_and_bad_files(tmp_path, weights_pth):
    # Prepare
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    np.savez(tmp_path / "d.npz", images=images, y=np.array([0, 2, 2, 1]))
    # Execute
    res = E.embed_to_file(npz=str(tmp_path / "d.npz"), backbone="resnet18", weights=str(weights_pth),
                          device="cpu", batch_size=4, classes="5", out=str(tmp_path / "e.npz"), progress=False)
    st, classes = load_statistics_file(tmp_path / "e.npz")
    # Assert: the plain reference forward on the same arrays
    ref_model = torchvision.models.resnet18()
    ref_model.load_state_dict(torch.load(weights_pth, weights_only=True))
    ref_model.fc = torch.nn.Identity()
    with torch.inference_mode():
        ref = ref_model.eval()(torch.stack([PAPER(Image.fromarray(im)) for im in images])).numpy()
    _assert_close_embeddings(res.X, ref)
    assert classes == ["0", "1", "2", "3", "4"] and st.cross.shape == (512, 5)
    np.testing.assert_array_equal(st.class_counts, [1, 1, 2, 0, 0])
    # bad inputs
    np.savez(tmp_path / "bad.npz", images=images.astype(np.float32), y=np.zeros(4, int))
    with pytest.raises(E.DatasetError, match="uint8"):
        E.npz_source(tmp_path / "bad.npz")
    with pytest.raises(StatisticsFileError):
        load_statistics_file(tmp_path / "bad.npz")


# ----------------------------------------------------------------------------- presets


def test_imagenet_preset_loader_matches_weights_transforms_on_non_square_image(tmp_path):
    # Prepare
    from torchvision.models import ResNet18_Weights

    prep = E.resolve_preprocessing("imagenet", ResNet18_Weights.DEFAULT)
    root = tmp_path / "imgs"
    (root / "c").mkdir(parents=True)
    img = Image.fromarray(np.random.default_rng(6).integers(0, 256, (300, 260, 3), dtype=np.uint8))
    img.save(root / "c" / "a.png")
    src = E.image_folder(root)
    mean = torch.tensor(prep.mean).view(1, 3, 1, 1)
    std = torch.tensor(prep.std).view(1, 3, 1, 1)
    # Execute: CPU loader stage (PIL resize/crop to uint8) + normalisation stage
    x_u8, _ = extraction._LoaderDataset(src, prep)[0]
    ours = extraction._normalise(x_u8[None], prep, mean, std, resize=False)[0]
    # Assert
    assert (prep.resize, prep.crop, prep.mean) == (256, 224, (0.485, 0.456, 0.406))
    assert x_u8.dtype == torch.uint8 and x_u8.shape == (3, 224, 224)
    torch.testing.assert_close(ours, ResNet18_Weights.DEFAULT.transforms()(img), rtol=0, atol=1e-6)
    torch.testing.assert_close(ours, prep.reference_transform()(img), rtol=0, atol=1e-6)
    paper = E.resolve_preprocessing("paper")
    assert (paper.resize, paper.crop, paper.mean, paper.std) == (224, 224, (0.5,) * 3, (0.5,) * 3)


def test_in_memory_images_reach_the_device_as_whole_batches_in_source_order():
    # Arrange: 10 images of an odd size, batches of 4, so the last batch is short
    rng = np.random.default_rng(3)
    imgs = rng.integers(0, 256, (10, 5, 7, 3), dtype=np.uint8)
    y = rng.integers(0, 4, 10)
    src = E.array_source(imgs, y, 4)
    # Execute
    batches = list(extraction._array_batches(src, 4, pin=False))
    # Assert: the same uint8 CHW tensors and int64 labels a per-image DataLoader would collate
    assert [b[0].shape[0] for b in batches] == [4, 4, 2]
    x, labels = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    assert x.dtype == torch.uint8 and x.shape == (10, 3, 5, 7) and x.is_contiguous()
    np.testing.assert_array_equal(x.numpy(), imgs.transpose(0, 3, 1, 2))
    assert labels.dtype == torch.int64 and labels.tolist() == y.tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CI has none)")
def test_cuda_extraction_of_in_memory_images_keeps_source_order_and_exact_statistics():
    # Arrange: 37 CIFAR-size images in batches of 8 (a short last batch), and the same images reversed
    rng = np.random.default_rng(11)
    imgs = rng.integers(0, 256, (37, 32, 32, 3), dtype=np.uint8)
    y = rng.integers(0, 5, 37)
    prep = E.resolve_preprocessing("paper")
    bb = E.load_backbone("resnet18", "random", input_size=prep.crop, seed=0)
    # Execute
    fwd = extraction.extract(E.array_source(imgs, y, 5), bb, prep, device="cuda", batch_size=8,
                             dtype="float64", progress=False)
    rev = extraction.extract(E.array_source(imgs[::-1].copy(), y[::-1].copy(), 5), bb, prep, device="cuda",
                             batch_size=8, dtype="float64", progress=False)
    # Assert: row i is image i whatever batch it rode in (bf16 autocast: batch-dependent kernels, so a tolerance)
    assert fwd.X.shape == (37, 512)
    np.testing.assert_allclose(fwd.X, rev.X[::-1], rtol=0, atol=2e-2 * np.abs(fwd.X).max())
    # and the float64 statistics are the sums over exactly those rows
    Y = np.eye(5)[y]
    np.testing.assert_allclose(fwd.statistics.gram, fwd.X.T @ fwd.X, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(fwd.statistics.cross, fwd.X.T @ Y, rtol=1e-12, atol=1e-9)
    assert fwd.metadata["device"].startswith("cuda") and fwd.metadata["autocast"] == "bfloat16"
