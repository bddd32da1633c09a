"""Hospital-side embedding extraction with a frozen torchvision backbone.

Runs on: the hospital. Sees: its own images, labels and embeddings; nothing
leaves the machine. The output is either the embeddings (``--out``) or only
the local AFL statistics C_k = X_k^T X_k, Q_k = X_k^T Y_k, per-class counts
(``--stats-only``), accumulated in float64 batch by batch without ever holding
X_k when ``--stats-only`` is used. Both files are described in
:mod:`secure_afl.clients.statsfile`; ``client submit`` reads either one with
:func:`secure_afl.clients.statsfile.load_statistics_file`.

Pipeline
--------
* backbone: any classification model of ``torchvision.models``
  (``list_models(module=torchvision.models)``). The final classifier layer
  (``fc`` / ``classifier[-1]`` / ``heads.head`` / ..., found generically as
  the last ``Linear`` -- or 1x1 ``Conv2d`` for SqueezeNet -- that outputs the
  class logits) is replaced by ``Identity``; the embedding dimension d is
  measured by a dry forward (resnet18: 512, vgg16: 4096, vit_b_16: 768).
* preprocessing ``paper``: ``Resize(224)``, ``ToTensor``,
  ``Normalize((0.5,)*3, (0.5,)*3)`` (reference code), followed by a
  ``CenterCrop(224)`` that is a no-op for square images and only makes
  non-square images batchable. ``imagenet``: the weights' own transforms
  (resize, centre crop, mean/std), or Resize(256)/CenterCrop(224) with the
  standard ImageNet mean/std for random or local weights.
* CPU: images are decoded, resized and cropped by PIL in the loader workers
  to uint8 (exactly the reference torchvision transforms), then scaled and
  normalised in float32; the backbone runs in float32.
* CUDA: workers decode to uint8; pinned batches are copied with
  ``non_blocking`` on a side stream (the next batch is copied while the
  current one computes); fixed-size sources (CIFAR, npz) are resized on the
  GPU, ImageFolder images are resized by PIL in the workers (they differ in
  size and must be batched); normalisation runs on the GPU; the backbone runs
  in channels_last under bf16 autocast. The GPU path therefore differs from
  the CPU reference by the bf16 rounding of the backbone and, for CIFAR/npz,
  by resizing in float instead of PIL-uint8 (< 1/255 per pixel).
* statistics: ``float64`` on the compute device (``gram.addmm_(E^T, E)``,
  ``cross.index_add_``), whatever precision the backbone used.

Notes
-----
Privacy: the embeddings and statistics files are as sensitive as the images'
labels and content summaries; keep them on the hospital machine. Only the
protected statistics (``client submit``) leave it. Class names are taken from
folder names: do not name folders after patients.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from secure_afl.exceptions import InvalidInputError
from secure_afl.fingerprint import ExtractorFingerprint, parse_normalisation
from secure_afl.stats import SufficientStatistics

from .statsfile import load_statistics_file, write_embeddings_file, write_statistics_file

__all__ = [
    "EmbeddingError",
    "UnknownBackbone",
    "UnsupportedBackbone",
    "WeightsUnavailable",
    "InvalidWeightsFile",
    "DatasetError",
    "CorruptImage",
    "EmptyClassFolder",
    "DeviceUnavailable",
    "RandomWeightsWarning",
    "Preprocessing",
    "Backbone",
    "ImageSource",
    "Extraction",
    "TorchStatisticsAccumulator",
    "available_backbones",
    "load_backbone",
    "resolve_preprocessing",
    "image_folder",
    "cifar_source",
    "npz_source",
    "array_source",
    "extract",
    "embed_to_file",
    "load_statistics_file",
    "register",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
PAPER_MEAN = (0.5, 0.5, 0.5)
PAPER_STD = (0.5, 0.5, 0.5)
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


# --------------------------------------------------------------------------- errors

class EmbeddingError(InvalidInputError):
    """Base class of every refusal of ``client embed``."""

    reason = "embedding_error"


class UnknownBackbone(EmbeddingError):
    """The backbone name is not a torchvision classification model."""

    reason = "unknown_backbone"


class UnsupportedBackbone(EmbeddingError):
    """A torchvision model whose classifier head could not be removed generically."""

    reason = "unsupported_backbone"


class WeightsUnavailable(EmbeddingError):
    """Pretrained weights were asked for but are neither cached nor downloadable / on disk."""

    reason = "weights_unavailable"


class InvalidWeightsFile(EmbeddingError):
    """A weights file exists but is not a state dict of the requested backbone."""

    reason = "invalid_weights_file"


class DatasetError(EmbeddingError):
    """The image source is missing, empty or malformed."""

    reason = "bad_dataset"


class CorruptImage(DatasetError):
    """An image file could not be decoded."""

    reason = "corrupt_image"


class EmptyClassFolder(DatasetError):
    """An ImageFolder class directory holds no image."""

    reason = "empty_class_folder"


class DeviceUnavailable(EmbeddingError):
    """``--device cuda`` on a machine without a usable CUDA device."""

    reason = "device_unavailable"


class RandomWeightsWarning(UserWarning):
    """Random-init backbone: the embeddings are meaningless (tests only)."""


# --------------------------------------------------------------------------- backbones

def available_backbones() -> list[str]:
    """Names of torchvision classification models (``list_models(module=torchvision.models)``)."""
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


@dataclass
class Backbone:
    """A frozen backbone whose classifier head was replaced by ``Identity``.

    Attributes
    ----------
    name : torchvision model name.
    model : the ``torch.nn.Module`` in eval mode, on CPU, returning (N, dim).
    dim : embedding dimension d (measured by a dry forward).
    weights : what was loaded: ``"ResNet18_Weights.IMAGENET1K_V1"``, a file path or ``"random"``.
    weights_enum : the torchvision ``WeightsEnum`` member, or None.
    head : qualified name of the removed layer (``"fc"``, ``"classifier.6"``, ``"heads.head"``).
    """

    name: str
    model: object
    dim: int
    weights: str
    weights_enum: object = None
    head: str = ""


def _weights_enum_for(name: str):
    from torchvision.models import get_model_weights

    try:
        return get_model_weights(name)
    except (ValueError, KeyError):
        return None


def _check_backbone_name(name: str) -> None:
    names = available_backbones()
    if name not in names:
        close = [n for n in names if n.split("_")[0] == name.split("_")[0]][:6]
        sample = close or ["resnet18", "resnet50", "vgg16", "vit_b_16", "efficientnet_b0", "convnext_tiny"]
        raise UnknownBackbone(
            f"unknown backbone {name!r}: not a torchvision classification model. "
            f"Valid names include {', '.join(sample)} ({len(names)} in all; "
            "see torchvision.models.list_models(module=torchvision.models))."
        )


def _hub_checkpoint_path(weights_enum) -> Path:
    import torch

    filename = os.path.basename(urlparse(weights_enum.url).path)
    return Path(torch.hub.get_dir()) / "checkpoints" / filename


def _strip_head(model, num_classes: int) -> str:
    """Replace the layer producing the class logits by Identity; return its name.

    The head is the last ``Linear`` (in registration order) with
    ``out_features == num_classes``; models without one (SqueezeNet) use the
    last 1x1 ``Conv2d`` with ``out_channels == num_classes``. torchvision
    registers the head after any auxiliary classifier (GoogLeNet, Inception),
    so "last" is the main head.
    """
    import torch.nn as nn

    linear = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and m.out_features == num_classes]
    conv = [n for n, m in model.named_modules()
            if isinstance(m, nn.Conv2d) and m.out_channels == num_classes and tuple(m.kernel_size) == (1, 1)]
    names = linear or conv
    if not names:
        raise UnsupportedBackbone(
            f"no Linear/1x1-Conv2d layer with {num_classes} outputs in {type(model).__name__}; "
            "cannot locate the classifier head")
    head = names[-1]
    parent_name, _, child = head.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, nn.Identity())
    return head


def _read_state_dict(path: Path) -> dict:
    import torch

    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            sd = load_file(str(path), device="cpu")
        else:
            sd = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise InvalidWeightsFile(f"{path}: not a readable state-dict file ({type(exc).__name__}: {exc})") from None
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(sd, dict) and key in sd and isinstance(sd[key], dict):
            sd = sd[key]
    if not isinstance(sd, dict) or not sd or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise InvalidWeightsFile(f"{path}: expected a state dict (name -> tensor)")
    if all(k.startswith("module.") for k in sd):  # saved from DataParallel
        sd = {k[len("module."):]: v for k, v in sd.items()}
    return sd


def _parse_weights(name: str, weights):
    """-> ("random" | "enum" | "file", weights enum member or None, Path or None)."""
    spec = "random" if weights is None else str(weights)
    if spec.lower() == "random":
        return "random", None, None
    enum_cls = _weights_enum_for(name)
    if spec.upper() == "DEFAULT" or (enum_cls is not None and spec in enum_cls.__members__):
        if enum_cls is None:
            raise WeightsUnavailable(f"torchvision has no pretrained weights for {name}; pass --weights PATH")
        return "enum", (enum_cls.DEFAULT if spec.upper() == "DEFAULT" else enum_cls[spec]), None
    path = Path(spec).expanduser()
    if not path.is_file():
        members = ", ".join(["DEFAULT", *(enum_cls.__members__ if enum_cls else []), "random"])
        raise WeightsUnavailable(f"weights {spec!r} for {name}: no such file, and not one of {members}")
    return "file", None, path


def load_backbone(name: str, weights: str | None = "DEFAULT", *, input_size: int = 224,
                  seed: int | None = None) -> Backbone:
    """Build ``name`` with ``weights``, remove its classifier, measure d.

    Parameters
    ----------
    name : a torchvision classification model name, e.g. ``"resnet18"``.
    weights : ``"DEFAULT"`` (the torchvision enum's default; downloaded when
        online, else read from ``torch.hub.get_dir()/checkpoints``), a member
        name of the model's weights enum (``"IMAGENET1K_V2"``), a path to a
        ``.pth``/``.pt``/``.safetensors`` state dict (with or without the
        classifier), or ``"random"`` (random init; warns loudly, tests only).
    input_size : side of the dry-forward input used to measure d.
    seed : for ``"random"``: seeds the initialisation, so every hospital builds
        the same random backbone (statistics files require it).

    Raises
    ------
    UnknownBackbone, WeightsUnavailable, InvalidWeightsFile, UnsupportedBackbone
    """
    import torch
    from torchvision.models import get_model

    _check_backbone_name(name)
    kind, weights_enum, path = _parse_weights(name, weights)
    if kind == "random":
        warnings.warn(
            f"RANDOM-INIT {name}: embeddings from a random backbone are meaningless; use only for tests.",
            RandomWeightsWarning, stacklevel=2)

    if weights_enum is not None:
        cached = _hub_checkpoint_path(weights_enum)
        try:
            model = get_model(name, weights=weights_enum)
        except Exception as exc:  # URLError/OSError offline, RuntimeError on a corrupt cache file
            if cached.is_file():
                raise WeightsUnavailable(
                    f"cached weights file {cached} for {weights_enum} could not be loaded "
                    f"({type(exc).__name__}: {exc}); delete it to re-download, or pass --weights PATH") from None
            raise WeightsUnavailable(
                f"pretrained weights {weights_enum} for {name} are not available: no cached file {cached} "
                f"and the download from {weights_enum.url} failed ({type(exc).__name__}: {exc}). "
                f"Copy that file to {cached} (TORCH_HOME sets the cache root), or pass "
                "--weights PATH to a local .pth/.safetensors state dict.") from None
        num_classes = len(weights_enum.meta.get("categories") or []) or 1000
        head = _strip_head(model, num_classes)
        label = f"{weights_enum}"
    else:
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(int(seed))
            model = get_model(name, weights=None)
        head = _strip_head(model, 1000)  # torchvision builders default to num_classes=1000
        label = "random"
        if path is not None:
            sd = _read_state_dict(path)
            try:
                res = model.load_state_dict(sd, strict=False)
            except RuntimeError as exc:  # shape mismatch
                raise InvalidWeightsFile(f"{path} does not fit {name}: {exc}") from None
            stray = [k for k in res.unexpected_keys if not k.startswith(head + ".")]
            if res.missing_keys or stray:
                raise InvalidWeightsFile(
                    f"{path} is not a {name} state dict: missing {res.missing_keys[:4]}, "
                    f"unexpected {stray[:4]}")
            label = str(path)

    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        with torch.inference_mode():
            out = model(torch.zeros(1, 3, input_size, input_size))
    except Exception as exc:
        raise UnsupportedBackbone(
            f"{name} does not run on {input_size}x{input_size} inputs ({type(exc).__name__}: {exc})") from None
    if not isinstance(out, torch.Tensor) or out.ndim != 2:
        raise UnsupportedBackbone(f"{name} without its head returns {getattr(out, 'shape', type(out))}, not (N, d)")
    return Backbone(name, model, int(out.shape[1]), label, weights_enum, head)


# --------------------------------------------------------------------------- preprocessing

@dataclass(frozen=True)
class Preprocessing:
    """resize (shorter side) -> centre crop -> /255 -> (x - mean) / std."""

    name: str
    resize: int
    crop: int
    mean: tuple
    std: tuple
    interpolation: str = "bilinear"

    def reference_transform(self):
        """The equivalent torchvision (PIL) transform, for checks and docs."""
        from torchvision import transforms as T

        return T.Compose([
            T.Resize(self.resize, interpolation=T.InterpolationMode(self.interpolation)),
            T.CenterCrop(self.crop),
            T.ToTensor(),
            T.Normalize(self.mean, self.std),
        ])


def resolve_preprocessing(preset: str, weights_enum=None) -> Preprocessing:
    """``paper``: Resize(224) + Normalize(0.5, 0.5); ``imagenet``: the weights' transforms."""
    if preset == "paper":
        return Preprocessing("paper", 224, 224, PAPER_MEAN, PAPER_STD)
    if preset == "imagenet":
        if weights_enum is not None:
            t = weights_enum.transforms()
            return Preprocessing("imagenet", int(t.resize_size[0]), int(t.crop_size[0]),
                                 tuple(float(v) for v in t.mean), tuple(float(v) for v in t.std),
                                 t.interpolation.value)
        return Preprocessing("imagenet", 256, 224, IMAGENET_MEAN, IMAGENET_STD)
    raise InvalidInputError(f"The 'preset' parameter must be 'paper' or 'imagenet'. Got {preset!r} instead.")


# --------------------------------------------------------------------------- data sources

@dataclass
class ImageSource:
    """A labelled image collection, map-style.

    Either ``paths`` (files decoded by PIL on access) or ``arrays`` (N, H, W, 3)
    uint8. ``labels`` index into ``classes``.
    """

    kind: str
    classes: list
    labels: np.ndarray
    paths: list | None = None
    arrays: np.ndarray | None = None
    description: str = ""

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def fixed_size(self) -> bool:
        return self.arrays is not None

    def pil(self, i: int):
        """Image i as an RGB PIL image (raises CorruptImage)."""
        from PIL import Image

        if self.arrays is not None:
            return Image.fromarray(self.arrays[i])
        path = self.paths[i]
        try:
            with Image.open(path) as im:
                return im.convert("RGB")  # forces the full decode
        except Exception as exc:  # UnidentifiedImageError, truncated file (OSError), SyntaxError, bombs
            raise CorruptImage(f"cannot decode image {path}: {type(exc).__name__}: {exc}") from None


def _parse_class_names(classes) -> list | None:
    if classes is None or isinstance(classes, (int, np.integer)):
        return None
    if isinstance(classes, str):
        if classes.isdigit():
            return None
        return [c.strip() for c in classes.split(",") if c.strip()]
    return [str(c) for c in classes]


def _n_classes_arg(classes) -> int | None:
    if isinstance(classes, (int, np.integer)):
        return int(classes)
    if isinstance(classes, str) and classes.isdigit():
        return int(classes)
    return None


def image_folder(root, *, classes=None) -> ImageSource:
    """ImageFolder tree: ``root/<class>/<image>``; classes in sorted order.

    ``classes`` (list or comma-separated names) fixes the label order across
    hospitals instead; every sub-folder must be named in it, names without a
    folder get count 0.
    """
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"image folder {root} does not exist")
    folders = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise DatasetError(f"{root} has no class sub-folders (expected {root}/<class>/<image>)")
    names = _parse_class_names(classes)
    n = _n_classes_arg(classes)
    if names is None:
        if n is not None and n != len(folders):
            raise DatasetError(f"--classes {n} but {root} has {len(folders)} class folders; "
                               "pass the class names (comma-separated) to fix a larger label space")
        names = folders
    else:
        unknown = sorted(set(folders) - set(names))
        if unknown:
            raise DatasetError(f"class folders {unknown} of {root} are not in the given class list {names}")
    index = {c: i for i, c in enumerate(names)}
    paths, labels = [], []
    for c in folders:
        files = sorted(p for p in (root / c).rglob("*") if p.is_file() and p.suffix.lower() in IMG_EXTENSIONS)
        if not files:
            raise EmptyClassFolder(f"class folder {root / c} holds no image ({', '.join(IMG_EXTENSIONS)}); "
                                   "add images or remove the folder")
        paths += [str(p) for p in files]
        labels += [index[c]] * len(files)
    return ImageSource("imagefolder", list(names), np.asarray(labels, dtype=np.int64), paths=paths,
                       description=str(root))


class _CifarUnpickler(pickle.Unpickler):
    """Only numpy arrays and builtins: a CIFAR pickle needs nothing else."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    }

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"forbidden global {module}.{name} in a CIFAR file")


def _load_cifar_pickle(path: Path) -> dict:
    try:
        with open(path, "rb") as fh:
            d = _CifarUnpickler(fh, encoding="bytes").load()
    except FileNotFoundError:
        raise DatasetError(f"CIFAR file {path} is missing") from None
    except Exception as exc:
        raise DatasetError(f"{path} is not a CIFAR python pickle ({type(exc).__name__}: {exc})") from None
    if not isinstance(d, dict):
        raise DatasetError(f"{path} is not a CIFAR python pickle (no dict)")
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in d.items()}


def cifar_source(root, *, split: str = "train") -> ImageSource:
    """Read the CIFAR-10/100 *python* pickles from a local folder (no download).

    ``root`` may be the batch folder itself or contain ``cifar-10-batches-py``
    / ``cifar-100-python``. CIFAR-10: ``data_batch_1..5`` / ``test_batch`` with
    ``labels`` and ``batches.meta``; CIFAR-100: ``train`` / ``test`` with
    ``fine_labels`` and ``meta``.
    """
    if split not in ("train", "test"):
        raise InvalidInputError(f"The 'split' parameter must be 'train' or 'test'. Got {split!r} instead.")
    root = Path(root)
    for cand in (root, root / "cifar-10-batches-py", root / "cifar-100-python"):
        if (cand / "batches.meta").is_file():
            files = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
            meta, label_key, names_key = cand / "batches.meta", "labels", "label_names"
            break
        if (cand / "meta").is_file():
            files = [split]
            meta, label_key, names_key = cand / "meta", "fine_labels", "fine_label_names"
            break
    else:
        raise DatasetError(f"{root} holds no CIFAR python batches (batches.meta or meta not found)")
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in _load_cifar_pickle(meta)[names_key]]
    data, labels = [], []
    for f in files:
        d = _load_cifar_pickle(cand / f)
        if "data" not in d or label_key not in d:
            raise DatasetError(f"{cand / f} lacks 'data' or '{label_key}'")
        x = np.asarray(d["data"])
        if x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3 * 32 * 32:
            raise DatasetError(f"{cand / f}: data must be (N, 3072) uint8, got {x.shape} {x.dtype}")
        data.append(x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels.append(np.asarray(d[label_key], dtype=np.int64))
    arrays = np.ascontiguousarray(np.concatenate(data))
    y = np.concatenate(labels)
    if y.shape[0] != arrays.shape[0] or y.min() < 0 or y.max() >= len(names):
        raise DatasetError(f"CIFAR labels in {cand} do not match the data / {len(names)} classes")
    return ImageSource("cifar", names, y, arrays=arrays, description=f"{cand} [{split}]")


def array_source(images, y, classes=None, *, kind: str = "arrays", description: str = "") -> ImageSource:
    """(N, H, W, 3) uint8 images and integer labels."""
    images = np.asarray(images)
    y = np.asarray(y)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3 or images.shape[0] == 0:
        raise DatasetError(f"images must be (N>0, H, W, 3) uint8; got {images.shape} {images.dtype}")
    if y.shape != (images.shape[0],) or y.dtype.kind not in "iu" or y.min() < 0:
        raise DatasetError(f"y must be (N,) non-negative integers; got {y.shape} {y.dtype}")
    names = _parse_class_names(classes)
    n = _n_classes_arg(classes)
    if names is None:
        names = [str(i) for i in range(n if n is not None else int(y.max()) + 1)]
    if y.max() >= len(names):
        raise DatasetError(f"label {int(y.max())} outside the {len(names)} classes")
    return ImageSource(kind, names, y.astype(np.int64), arrays=np.ascontiguousarray(images),
                       description=description)


def npz_source(path, *, classes=None) -> ImageSource:
    """An .npz with ``images`` (N, H, W, 3) uint8, ``y`` and optionally ``classes``."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as z:
            if "images" not in z.files or "y" not in z.files:
                raise DatasetError(f"{path} must hold 'images' and 'y'")
            images, y = z["images"], z["y"]
            stored = [str(c) for c in z["classes"]] if "classes" in z.files else None
    except DatasetError:
        raise
    except Exception as exc:
        raise DatasetError(f"{path}: not a readable .npz ({type(exc).__name__}: {exc})") from None
    if classes is None and stored is not None:
        classes = stored
    return array_source(images, y, classes, kind="npz", description=str(path))


# --------------------------------------------------------------------------- statistics on device

class TorchStatisticsAccumulator:
    """C += E^T E, Q += E^T onehot(y), counts += bincount(y), in float64 on ``device``."""

    def __init__(self, dim: int, n_classes: int, device="cpu"):
        import torch

        self.dim, self.n_classes = int(dim), int(n_classes)
        self.gram = torch.zeros(dim, dim, dtype=torch.float64, device=device)
        self.cross_t = torch.zeros(n_classes, dim, dtype=torch.float64, device=device)  # Q^T
        self.counts = torch.zeros(n_classes, dtype=torch.int64, device=device)
        self.max_sq_norm = torch.zeros((), dtype=torch.float64, device=device)  # max ||x_i||^2

    @property
    def max_row_norm(self) -> float:
        """max_i ||x_i||_2: lets ``client submit`` check the declared bound B on a statistics file."""
        return float(self.max_sq_norm.sqrt())

    def update(self, emb, y) -> None:
        import torch

        e = emb.to(torch.float64)
        self.gram.addmm_(e.T, e)
        self.cross_t.index_add_(0, y, e)
        self.counts += torch.bincount(y, minlength=self.n_classes)
        self.max_sq_norm = torch.maximum(self.max_sq_norm, (e * e).sum(dim=1).max())

    def finalize(self) -> SufficientStatistics:
        gram = self.gram.cpu().numpy()
        cross = self.cross_t.T.cpu().numpy().copy()
        counts = self.counts.cpu().numpy().astype(np.float64)
        if not (np.all(np.isfinite(gram)) and np.all(np.isfinite(cross))):
            raise EmbeddingError("the backbone produced NaN/inf embeddings")
        if counts.sum() == 0:
            raise EmbeddingError("no samples were accumulated")
        gram = 0.5 * (gram + gram.T)
        return SufficientStatistics(gram, cross, float(counts.sum()), counts, 1.0, 0.0)


# --------------------------------------------------------------------------- extraction

class _LoaderDataset:
    """Map-style dataset for DataLoader: (uint8 CHW tensor, label).

    ``geometry`` True: PIL resize + centre crop in the worker (reference
    transforms up to ToTensor); False: the raw image (resized on the device).
    """

    def __init__(self, source: ImageSource, prep: Preprocessing, geometry: bool):
        self.source, self.prep, self.geometry = source, prep, geometry
        self._tf = None

    def __len__(self):
        return len(self.source)

    def __getitem__(self, i):
        import torch

        if not self.geometry:
            arr = self.source.arrays[i]
        else:
            if self._tf is None:
                from torchvision import transforms as T

                self._tf = T.Compose([
                    T.Resize(self.prep.resize, interpolation=T.InterpolationMode(self.prep.interpolation)),
                    T.CenterCrop(self.prep.crop)])
            arr = np.asarray(self._tf(self.source.pil(i)), dtype=np.uint8)
        return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1))), int(self.source.labels[i])


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
    ds = _LoaderDataset(source, prep, geometry=not resize_on_device)
    loader = DataLoader(ds, batch_size=batch_size, shuffle=False, num_workers=workers, pin_memory=cuda,
                        persistent_workers=False, prefetch_factor=4 if workers else None)
    model = backbone.model.to(dev)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    mean = torch.tensor(prep.mean, dtype=torch.float32, device=dev).view(1, 3, 1, 1)
    std = torch.tensor(prep.std, dtype=torch.float32, device=dev).view(1, 3, 1, 1)
    acc = TorchStatisticsAccumulator(backbone.dim, C, dev)
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
                acc.update(emb, yb)
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
                  normalisation: str = "none") -> Extraction:
    """Library form of ``secure-afl client embed``: open the source, extract, write one file atomically.

    Exactly one of ``images`` / ``cifar_root`` / ``npz`` and exactly one of
    ``out`` (embeddings file) / ``stats_only`` (statistics file). ``gamma``
    is recorded in the statistics file as metadata; ``gram`` never includes it.
    The file records the extractor's fingerprint (:mod:`secure_afl.fingerprint`)
    under the metadata key ``extractor``; random weights need ``seed``.
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
        source = npz_source(npz, classes=_parse_class_names(classes))
    n_classes = _n_classes_arg(classes)
    if _parse_class_names(classes) is not None and cifar_root is not None:
        raise InvalidInputError("class names cannot be overridden for CIFAR; pass a number of classes")
    if n_classes is not None and n_classes < len(source.classes):
        raise InvalidInputError(f"--classes {n_classes} is smaller than the {len(source.classes)} classes found")
    _check_backbone_name(backbone)
    kind, wenum, wpath = _parse_weights(backbone, weights)
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
        backbone=bb.name, weights=_weights_id(kind, wenum, wpath, seed), preset=prep.name, input_size=prep.crop,
        classes=tuple(res.classes), dim=bb.dim,
        normalisation="none" if l2_radius is None else f"l2:{l2_radius:g}")
    res.metadata.update({"n_images": len(source), "dataset": source.description,
                         "extractor": fingerprint.to_json()})
    if stats_only is not None:
        write_statistics_file(stats_only, res.statistics, res.classes, {**res.metadata, "gamma": float(gamma)})
    else:
        write_embeddings_file(out, res.X, res.y, res.classes, res.metadata)
    return res


def _weights_id(kind: str, weights_enum, path, seed) -> str:
    """What the fingerprint names the weights by: the file's SHA-256, or the random seed."""
    if kind == "random":
        return f"random-seed:{int(seed)}"
    f = Path(path) if kind == "file" else _hub_checkpoint_path(weights_enum)
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


# --------------------------------------------------------------------------- CLI

def register(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``secure-afl client embed``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "Writes either the embeddings (--out: X, y, classes, metadata) or only the float64 statistics\n"
        "(--stats-only: gram = X^T X without gamma, cross = X^T Y, counts, n, classes). `secure-afl client\n"
        "submit` accepts either file. Nothing partial is left behind on failure.")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--images", metavar="DIR", help="ImageFolder tree DIR/<class>/<image> (sorted class order)")
    src.add_argument("--cifar-root", metavar="DIR", help="local CIFAR-10/100 python pickles (no download)")
    src.add_argument("--npz", metavar="FILE", help=".npz with images (N,H,W,3) uint8 and y")
    parser.add_argument("--split", choices=["train", "test"], default=None, help="CIFAR split (default train)")
    parser.add_argument("--backbone", required=True, metavar="NAME", help="torchvision model name, e.g. resnet18")
    parser.add_argument("--weights", default="DEFAULT", metavar="DEFAULT|PATH|random",
                        help="DEFAULT torchvision weights (hub cache / download), a weights-enum member name, "
                             "a local .pth/.safetensors state dict, or random (tests only)")
    parser.add_argument("--seed", type=int, default=None, metavar="N",
                        help="seed of the random initialisation (required with --weights random; recorded)")
    parser.add_argument("--normalisation", default="none", metavar="none|l2:R",
                        help="l2:R scales every embedding to norm R, so the session's B can be R (recorded)")
    parser.add_argument("--preset", choices=["paper", "imagenet"], default="paper")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--batch-size", type=int, default=128, metavar="N")
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1), metavar="N",
                        help="DataLoader decode workers (0: decode in the main process)")
    out = parser.add_mutually_exclusive_group(required=True)
    out.add_argument("--out", metavar="FILE.npz", help="write the embeddings file")
    out.add_argument("--stats-only", metavar="FILE", help="write only the statistics file (X is never held)")
    parser.add_argument("--classes", default=None, metavar="C",
                        help="number of classes of the consortium's label space, or comma-separated class "
                             "names fixing the label order (ImageFolder/npz)")
    parser.add_argument("--gamma", type=float, default=0.0, metavar="G",
                        help="RI gamma recorded in the statistics file (metadata; not added to gram)")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32", help="dtype of X in --out")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=_cmd_embed)


def _cmd_embed(args) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("always", RandomWeightsWarning)
        warnings.showwarning = _loud_warning
        res = embed_to_file(
            images=args.images, cifar_root=args.cifar_root, npz=args.npz, split=args.split,
            backbone=args.backbone, weights=args.weights, preset=args.preset, device=args.device,
            batch_size=args.batch_size, workers=args.workers, out=args.out, stats_only=args.stats_only,
            classes=args.classes, gamma=args.gamma, dtype=args.dtype, progress=not args.no_progress,
            seed=args.seed, normalisation=args.normalisation)
    target = args.stats_only or args.out
    rate = len(res.y) / res.seconds if res.seconds > 0 else float("inf")
    print(f"{len(res.y)} images, d={res.dim}, {len(res.classes)} classes, {rate:.1f} img/s on "
          f"{res.metadata['device']} -> {target}", file=sys.stderr)
    peak = float(res.metadata["max_row_norm"])
    print(f"largest embedding norm {peak:.6g}: the session's bound B ([bounds] max_norm) must be >= {peak:.6g}"
          + ("" if args.normalisation != "none" else
             "; or re-run with --normalisation l2:R to make every norm R (then B = R)"), file=sys.stderr)
    print("feature extractor (the session's [extractor] must match):", file=sys.stderr)
    print(_extractor_toml(ExtractorFingerprint.from_dict(json.loads(res.metadata["extractor"]))), file=sys.stderr)
    return 0


def _extractor_toml(fp: ExtractorFingerprint) -> str:
    d = fp.to_dict()
    return "[extractor]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in d.items())


def _loud_warning(message, category, filename, lineno, file=None, line=None):
    print(f"\n*** WARNING: {message} ***\n", file=sys.stderr)
