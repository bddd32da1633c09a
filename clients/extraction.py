"""Extraction for ``client embed``: run the backbone over a source, accumulate
C_k = X_k^T X_k, Q_k = X_k^T Y_k and counts in float64 on the device,
optionally keep X, and write one embeddings or statistics file that records
the extractor's fingerprint (:mod:`secure_afl.extractor`).
"""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from secure_afl.exceptions import InvalidInputError
from secure_afl.extractor import ExtractorFingerprint, parse_normalisation
from secure_afl.stats import StatisticsAccumulator, SufficientStatistics

from .backbones import (Backbone, DatasetError, EmbeddingError, DeviceUnavailable, Preprocessing,
                        check_backbone_name, hub_checkpoint_path, parse_weights, load_backbone,
                        resolve_preprocessing)
from .sources import ImageSource, n_classes_arg, parse_class_names, cifar_source, image_folder, npz_source
from .statsfile import write_embeddings_file, write_statistics_file


# --------------------------------------------------------------------------- extraction

class _LoaderDataset:
    """Map-style dataset for DataLoader: (uint8 CHW tensor after PIL resize + centre crop, label).

    The geometry runs in the loader's workers with the reference transforms (up to ToTensor), so a CPU
    extraction matches torchvision's preprocessing; in-memory images bound for CUDA skip this class and are
    resized on the device (:func:`_array_batches`).
    """

    def __init__(self, source: ImageSource, prep: Preprocessing):
        self.source, self.prep = source, prep
        self._tf = None

    def __len__(self):
        return len(self.source)

    def __getitem__(self, i):
        import torch

        if self._tf is None:
            from torchvision import transforms as T

            self._tf = T.Compose([
                T.Resize(self.prep.resize, interpolation=T.InterpolationMode(self.prep.interpolation)),
                T.CenterCrop(self.prep.crop)])
        arr = np.asarray(self._tf(self.source.pil(i)), dtype=np.uint8)
        return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1))), int(self.source.labels[i])


def _array_batches(source: ImageSource, batch_size: int, *, pin: bool):
    """(uint8 (B, 3, H, W), int64 (B,)) batches sliced from an in-memory (N, H, W, 3) source, in order.

    One copy per batch. A DataLoader would call a dataset once per image and collate, in the same thread
    that launches the GPU work; on an H100 that held resnet18 end to end below the serial sum of its phases.
    """
    import torch

    for s in range(0, len(source), batch_size):
        x = torch.from_numpy(np.ascontiguousarray(source.arrays[s:s + batch_size].transpose(0, 3, 1, 2)))
        y = torch.from_numpy(np.ascontiguousarray(source.labels[s:s + batch_size], dtype=np.int64))
        yield (x.pin_memory(), y.pin_memory()) if pin else (x, y)


def _resolve_device(device: str):
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable("--device cuda requested but torch.cuda.is_available() is False; use --device cpu")
    if device not in ("cpu", "cuda"):
        raise InvalidInputError(f"The 'device' parameter must be 'auto', 'cpu' or 'cuda'. Got {device!r} instead.")
    return torch.device(device)


def _prefetch_to(loader, device):
    """Yield (x, y) on ``device``; on CUDA copy batch i+1 on a side stream during batch i."""
    import torch

    if device.type != "cuda":
        yield from loader
        return
    stream = torch.cuda.Stream()

    def copy(batch):
        if batch is None:
            return None
        with torch.cuda.stream(stream):
            return tuple(t.to(device, non_blocking=True) for t in batch)

    it = iter(loader)
    nxt = copy(next(it, None))
    while nxt is not None:
        torch.cuda.current_stream().wait_stream(stream)
        cur = nxt
        for t in cur:
            t.record_stream(torch.cuda.current_stream())
        nxt = copy(next(it, None))
        yield cur


def _normalise(x, prep: Preprocessing, mean, std, resize: bool):
    """uint8 (B,3,H,W) -> float32 normalised, optionally resized + cropped first."""
    x = x.float()
    if resize:
        from torchvision.transforms.v2 import functional as TF
        from torchvision.transforms import InterpolationMode

        x = TF.resize(x, [prep.resize], interpolation=InterpolationMode(prep.interpolation), antialias=True)
        x = TF.center_crop(x, [prep.crop, prep.crop])
    return x.div_(255).sub_(mean).div_(std)


@dataclass
class Extraction:
    """Result of :func:`extract`; ``X`` is None when ``keep_embeddings`` was False."""

    X: np.ndarray | None
    y: np.ndarray
    classes: list
    statistics: SufficientStatistics
    dim: int
    seconds: float
    metadata: dict = field(default_factory=dict)


def extract(source: ImageSource, backbone: Backbone, prep: Preprocessing, *, device: str = "auto",
            batch_size: int = 64, workers: int = 0, keep_embeddings: bool = True, n_classes: int | None = None,
            dtype: str = "float32", progress: bool = True, l2_radius: float | None = None) -> Extraction:
    """Run the backbone over ``source``; accumulate float64 statistics; optionally keep X.

    ``l2_radius``: every embedding is scaled to this norm first, so the
    session's bound B can be exactly ``l2_radius`` whatever the backbone.

    Rows of X follow the source order (ImageFolder: sorted class, then sorted path).
    Raises :class:`CorruptImage` on the first undecodable file.
    """
    import torch
    from torch.utils.data import DataLoader

    if not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidInputError(f"The 'batch_size' parameter must be an int >= 1. Got {batch_size!r} instead.")
    if not isinstance(workers, int) or workers < 0:
        raise InvalidInputError(f"The 'workers' parameter must be an int >= 0. Got {workers!r} instead.")
    if dtype not in ("float32", "float64"):
        raise InvalidInputError(f"The 'dtype' parameter must be 'float32' or 'float64'. Got {dtype!r} instead.")
    dev = _resolve_device(device)
    C = len(source.classes) if n_classes is None else int(n_classes)
    if C < len(source.classes) or (len(source) and int(source.labels.max()) >= C):
        raise InvalidInputError(f"n_classes={C} is smaller than the source's {len(source.classes)} classes")
    cuda = dev.type == "cuda"
    resize_on_device = cuda and source.fixed_size
    if resize_on_device:
        loader = _array_batches(source, batch_size, pin=True)
    else:
        loader = DataLoader(_LoaderDataset(source, prep), batch_size=batch_size, shuffle=False,
                            num_workers=workers, pin_memory=cuda, persistent_workers=False,
                            prefetch_factor=4 if workers else None)
    model = backbone.model.to(dev)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    mean = torch.tensor(prep.mean, dtype=torch.float32, device=dev).view(1, 3, 1, 1)
    std = torch.tensor(prep.std, dtype=torch.float32, device=dev).view(1, 3, 1, 1)
    acc = StatisticsAccumulator(backbone.dim, C)  # float64 sums on the device of the first batch
    N = len(source)
    X = None
    if keep_embeddings:
        X = torch.empty((N, backbone.dim), dtype=getattr(torch, dtype), pin_memory=cuda)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=N, unit="img", desc=f"embed {backbone.name}", file=sys.stderr, dynamic_ncols=True)
    t0 = time.perf_counter()
    pos = 0
    try:
        with torch.inference_mode():
            for xb, yb in _prefetch_to(loader, dev):
                x = _normalise(xb, prep, mean, std, resize_on_device)
                if cuda:
                    x = x.contiguous(memory_format=torch.channels_last)
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        emb = model(x)
                    emb = emb.float()
                else:
                    emb = model(x)
                if l2_radius is not None:
                    # just under R in float64, so neither rounding nor a float32 X can exceed B = R
                    emb = emb.double()
                    emb = emb * (l2_radius * (1 - 1e-6) / emb.norm(dim=1, keepdim=True).clamp_min(1e-300))
                try:
                    acc.update(emb, yb)
                except InvalidInputError as exc:
                    raise EmbeddingError(f"the backbone's output was refused: {exc}") from None
                if X is not None:
                    X[pos:pos + emb.shape[0]].copy_(emb, non_blocking=cuda)
                pos += emb.shape[0]
                if bar is not None:
                    bar.update(emb.shape[0])
        if cuda:
            torch.cuda.synchronize(dev)
    except DatasetError as exc:  # raised in a loader worker: keep the type, drop the worker traceback
        raise type(exc)(_worker_message(str(exc))) from None
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - t0
    stats = acc.finalize()
    meta = {
        "backbone": backbone.name, "weights": backbone.weights, "preset": prep.name,
        "dim": backbone.dim, "head_removed": backbone.head, "device": str(dev),
        "autocast": "bfloat16" if cuda else "none", "source": source.kind,
        "torch_version": torch.__version__, "torchvision_version": _tv_version(),
        "max_row_norm": acc.max_row_norm,
    }
    return Extraction(X.numpy() if X is not None else None, source.labels.copy(), list(source.classes)
                      + [str(i) for i in range(len(source.classes), C)], stats, backbone.dim, seconds, meta)


def _worker_message(msg: str) -> str:
    """The original message of an exception re-raised by a DataLoader worker."""
    if "Original Traceback" not in msg:
        return msg
    last = [line for line in msg.strip().splitlines() if line.strip()][-1]
    head, sep, tail = last.partition(": ")
    return tail if sep and " " not in head else last


def _tv_version() -> str:
    import torchvision

    return torchvision.__version__


def embed_to_file(*, images=None, cifar_root=None, npz=None, split: str | None = None, backbone: str,
                  weights: str = "DEFAULT", preset: str = "paper", device: str = "auto", batch_size: int = 64,
                  workers: int = 0, out=None, stats_only=None, classes=None, gamma: float = 0.0,
                  dtype: str = "float32", progress: bool = True, seed: int | None = None,
                  normalisation: str = "none", hospital: str | None = None) -> Extraction:
    """Library form of ``secure-afl client embed``: open the source, extract, write one file atomically.

    Exactly one of ``images`` / ``cifar_root`` / ``npz`` and exactly one of
    ``out`` (embeddings file) / ``stats_only`` (statistics file). ``gamma``
    is recorded in the statistics file as metadata; ``gram`` never includes it.
    The file records the extractor's fingerprint (:mod:`secure_afl.extractor`)
    under the metadata key ``extractor``; random weights need ``seed``. It also records the source it was made
    from (``source_path``: the images folder, CIFAR root or npz, as an absolute path) and, given ``hospital``, the
    hospital it was made for (``hospital``), which ``client submit`` checks against its ``--name``.
    """
    if sum(v is not None for v in (images, cifar_root, npz)) != 1:
        raise InvalidInputError("give exactly one of images=, cifar_root=, npz=")
    if (out is None) == (stats_only is None):
        raise InvalidInputError("give exactly one of out= (embeddings) and stats_only= (statistics)")
    if split is not None and cifar_root is None:
        raise InvalidInputError("--split applies to --cifar-root only")
    if not (isinstance(gamma, (int, float)) and np.isfinite(gamma) and gamma >= 0):
        raise InvalidInputError(f"The 'gamma' parameter must be a float >= 0. Got {gamma!r} instead.")
    # Open the data first: cheap, and bad inputs fail before the backbone loads.
    if images is not None:
        source = image_folder(images, classes=classes)
    elif cifar_root is not None:
        source = cifar_source(cifar_root, split=split or "train")
    else:
        source = npz_source(npz, classes=parse_class_names(classes))
    n_classes = n_classes_arg(classes)
    if parse_class_names(classes) is not None and cifar_root is not None:
        raise InvalidInputError("class names cannot be overridden for CIFAR; pass a number of classes")
    if n_classes is not None and n_classes < len(source.classes):
        raise InvalidInputError(f"--classes {n_classes} is smaller than the {len(source.classes)} classes found")
    check_backbone_name(backbone)
    kind, wenum, wpath = parse_weights(backbone, weights)
    if kind == "random" and seed is None:
        raise InvalidInputError("--weights random needs --seed N: an unseeded random backbone differs on every "
                                "run, so no two hospitals' statistics could be summed")
    l2_radius = parse_normalisation(normalisation)
    prep = resolve_preprocessing(preset, wenum)
    bb = load_backbone(backbone, weights, input_size=prep.crop, seed=seed)
    res = extract(source, bb, prep, device=device, batch_size=batch_size, workers=workers,
                  keep_embeddings=stats_only is None, n_classes=n_classes, dtype=dtype, progress=progress,
                  l2_radius=l2_radius)
    fingerprint = ExtractorFingerprint(
        backbone=bb.name, weights=weights_id(kind, wenum, wpath, seed), preset=prep.name, input_size=prep.crop,
        classes=tuple(res.classes), dim=bb.dim,
        normalisation="none" if l2_radius is None else f"l2:{l2_radius:g}")
    from pathlib import Path

    res.metadata.update({"n_images": len(source), "dataset": source.description,
                         "extractor": fingerprint.to_json(),
                         "source_path": str(Path(images or cifar_root or npz).resolve()),
                         **({"hospital": str(hospital)} if hospital else {})})
    if stats_only is not None:
        write_statistics_file(stats_only, res.statistics, res.classes, {**res.metadata, "gamma": float(gamma)})
    else:
        write_embeddings_file(out, res.X, res.y, res.classes, res.metadata)
    return res


def weights_id(kind: str, weights_enum, path, seed) -> str:
    """What the fingerprint names the weights by: the file's SHA-256, or the random seed."""
    if kind == "random":
        return f"random-seed:{int(seed)}"
    f = Path(path) if kind == "file" else hub_checkpoint_path(weights_enum)
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()

