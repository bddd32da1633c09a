"""Backbones and preprocessing for ``client embed``: a frozen torchvision model
without its classifier head, the weights it was built from, and the image
transform presets. The typed errors of the whole extraction live here too.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from secure_afl.exceptions import InvalidInputError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
PAPER_MEAN = (0.5, 0.5, 0.5)
PAPER_STD = (0.5, 0.5, 0.5)


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


def check_backbone_name(name: str) -> None:
    names = available_backbones()
    if name not in names:
        close = [n for n in names if n.split("_")[0] == name.split("_")[0]][:6]
        sample = close or ["resnet18", "resnet50", "vgg16", "vit_b_16", "efficientnet_b0", "convnext_tiny"]
        raise UnknownBackbone(
            f"unknown backbone {name!r}: not a torchvision classification model. "
            f"Valid names include {', '.join(sample)} ({len(names)} in all; "
            "see torchvision.models.list_models(module=torchvision.models))."
        )


def hub_checkpoint_path(weights_enum) -> Path:
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


def parse_weights(name: str, weights):
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

    check_backbone_name(name)
    kind, weights_enum, path = parse_weights(name, weights)
    if kind == "random":
        warnings.warn(
            f"RANDOM-INIT {name}: embeddings from a random backbone are meaningless; use only for tests.",
            RandomWeightsWarning, stacklevel=2)

    if weights_enum is not None:
        cached = hub_checkpoint_path(weights_enum)
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

