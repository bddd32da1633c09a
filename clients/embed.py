"""``secure-afl client embed``: hospital-side embedding extraction with a frozen torchvision backbone.

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
Code
----
:mod:`.backbones` (models, weights, presets, errors), :mod:`.sources` (image
sources), :mod:`.extraction` (the run and the file); this module is the
command line and the names callers import.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

from secure_afl.extractor import ExtractorFingerprint

from .backbones import (Backbone, CorruptImage, DatasetError, DeviceUnavailable, EmbeddingError,
                        EmptyClassFolder, InvalidWeightsFile, Preprocessing, RandomWeightsWarning,
                        UnknownBackbone, UnsupportedBackbone, WeightsUnavailable, available_backbones,
                        load_backbone, resolve_preprocessing)
from .extraction import Extraction, embed_to_file, extract
from .sources import ImageSource, array_source, cifar_source, image_folder, npz_source
from .statsfile import load_statistics_file


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
    parser.add_argument("--name", metavar="HOSPITAL", help="the hospital the file is made for, recorded in it: "
                                                           "`client submit --name` refuses another hospital's file")
    parser.add_argument("--force", action="store_true", help="replace an existing output file (a statistics file "
                                                             "already submitted cannot be submitted again anyway)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=_cmd_embed)


def _cmd_embed(args) -> int:
    from secure_afl._io import refuse_existing

    # before the backbone loads and minutes of embedding: a file made earlier (perhaps already submitted) stays
    target = args.stats_only or args.out
    refuse_existing(target, "--stats-only" if args.stats_only else "--out",
                    hint=" or pass --force to replace it" if not args.force else "", force=args.force)
    if args.no_progress:  # no bar to show that it works: one line before the backbone loads
        print(f"secure-afl client embed: embedding {args.images or args.cifar_root or args.npz} with "
              f"{args.backbone} -> {target} (a line when done)", file=sys.stderr, flush=True)
    with warnings.catch_warnings():
        warnings.simplefilter("always", RandomWeightsWarning)
        warnings.showwarning = _loud_warning
        res = embed_to_file(
            images=args.images, cifar_root=args.cifar_root, npz=args.npz, split=args.split,
            backbone=args.backbone, weights=args.weights, preset=args.preset, device=args.device,
            batch_size=args.batch_size, workers=args.workers, out=args.out, stats_only=args.stats_only,
            classes=args.classes, gamma=args.gamma, dtype=args.dtype, progress=not args.no_progress,
            seed=args.seed, normalisation=args.normalisation, hospital=args.name)
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
