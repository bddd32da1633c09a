"""Image sources for ``client embed``: an ImageFolder tree, local CIFAR pickles,
an ``.npz`` of uint8 images, or arrays; each yields uint8 images and labels
in a fixed order, with the class names in label order.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from secure_afl.exceptions import InvalidInputError

from .backbones import CorruptImage, DatasetError, EmptyClassFolder

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


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
            raise CorruptImage(f"cannot decode image {path}: {type(exc).__name__}: {exc}; remove or replace that "
                               "file and run the command again (nothing was written)") from None


def parse_class_names(classes) -> list | None:
    if classes is None or isinstance(classes, (int, np.integer)):
        return None
    if isinstance(classes, str):
        if classes.isdigit():
            return None
        return [c.strip() for c in classes.split(",") if c.strip()]
    return [str(c) for c in classes]


def n_classes_arg(classes) -> int | None:
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
    names = parse_class_names(classes)
    n = n_classes_arg(classes)
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
    names = parse_class_names(classes)
    n = n_classes_arg(classes)
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

