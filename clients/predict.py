"""``secure-afl predict``: apply a released model to new images or embeddings.

Runs on: whoever deploys W (a hospital, the consortium). W only means something on embeddings from the
session's feature extractor, so the model's recorded extractor (backbone, weights, preprocessing, input size,
dimension, normalisation) is compared with the one the embeddings were made with, and a difference is refused
(``extractor_mismatch``) instead of printing meaningless classes. Images are embedded here exactly as
``client embed`` would, with the model's preprocessing and normalisation.

Output: a CSV with one row per sample (its index, the image it came from (an embeddings file's rows are
named FILE#row), its label when the file or folder has one, the predicted class name and its score); with labels whose names the model knows, the accuracy is printed.
"""

from __future__ import annotations

import argparse
import csv
import tempfile
from pathlib import Path

import numpy as np

from secure_afl.exceptions import ExtractorMismatch, InvalidInputError

__all__ = ["register", "predict_file"]

# what makes two feature extractors the same; the class list is the model's own business
_SAME_FEATURES = ("backbone", "weights", "preset", "input_size", "dim", "normalisation")


def _check_features(model_extractor, recorded: dict | None, source: str) -> None:
    from secure_afl.extractor import ExtractorFingerprint

    if model_extractor is None:
        return  # a session without a declared extractor: nothing to compare against (said by the caller)
    if recorded is None:
        raise ExtractorMismatch(f"{source} records no feature extractor, and the model needs embeddings from "
                                f"{model_extractor.backbone} weights {model_extractor.weights}: make them with "
                                "`secure-afl client embed --out`, or pass --images")
    mine = ExtractorFingerprint.from_dict(recorded)
    diffs = [f"{f}: model {getattr(model_extractor, f)} vs {getattr(mine, f)}"
             for f in _SAME_FEATURES if getattr(model_extractor, f) != getattr(mine, f)]
    if diffs:
        raise ExtractorMismatch(f"{source} comes from another feature extractor than the model's ("
                                + "; ".join(diffs) + "): its predictions would be meaningless; embed with the "
                                "session's backbone and weights file")


def predict_file(model, *, embeddings=None, images=None, backbone=None, weights=None, seed=None, out=None,
                 progress: bool = False) -> dict:
    """Predict every sample of an embeddings file or an ``images/<class>/`` folder with the model file ``model``.

    Returns ``{"n", "predicted" (class indices), "accuracy" (None without known labels), "classes"}``;
    writes ``out`` (CSV) when given.
    """
    from secure_afl.model_file import read_model

    from .statsfile import load_embeddings_file, recorded_extractor

    W, meta = read_model(model)
    if (embeddings is None) == (images is None):
        raise InvalidInputError("give exactly one of --embeddings FILE and --images DIR")
    with tempfile.TemporaryDirectory(prefix="secure-afl-predict-") as tmp:
        if images is not None:
            from .sources import image_folder

            # the order embed_to_file reads them in (sorted class folders, sorted files), so row i is files[i]
            root = Path(images)
            files = [str(Path(p).relative_to(root)) for p in image_folder(root).paths]
            path = _embed(meta, images, backbone, weights, seed, Path(tmp) / "embeddings.npz", progress)
            source = f"the images of {images}"
        else:
            path, source = embeddings, str(embeddings)
            files = None
        X, y, file_classes = load_embeddings_file(path)
        _check_features(meta.extractor, recorded_extractor(path), source)
    if X.shape[1] != W.shape[0]:
        raise ExtractorMismatch(f"{source} holds d = {X.shape[1]} features; the model expects d = {W.shape[0]}")
    names = list(meta.class_names) if meta.class_names else [str(i) for i in range(W.shape[1])]
    scores = np.asarray(X, dtype=np.float64) @ W
    predicted = np.argmax(scores, axis=1)
    # labels count only where their class name is one of the model's
    index = {c: i for i, c in enumerate(names)}
    truth = np.array([index.get(file_classes[k], -1) for k in y]) if len(file_classes) else None
    known = truth is not None and bool(np.all(truth >= 0))
    accuracy = float(np.mean(predicted == truth)) if known else None
    if out is not None:
        out = Path(out)
        tmp_out = out.with_name(out.name + ".tmp")
        with open(tmp_out, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["index", "file", "label", "predicted", "score"])
            for i, (k, p) in enumerate(zip(y, predicted)):
                # an embeddings file keeps no image names: its row is named by the file and the row number
                name = files[i] if files is not None else f"{Path(embeddings).name}#{i}"
                w.writerow([i, name, file_classes[k], names[p], f"{scores[i, p]:.6g}"])
        tmp_out.replace(out)
    return {"n": int(len(predicted)), "predicted": predicted, "accuracy": accuracy, "classes": names,
            "session": meta.session}


def _embed(meta, images, backbone, weights, seed, out: Path, progress: bool) -> Path:
    from .extraction import embed_to_file

    ext = meta.extractor
    if ext is None:
        raise InvalidInputError("this model records no feature extractor (its session declared none), so it "
                                "cannot say how to embed images: pass --embeddings from your own extractor")
    if backbone is not None and backbone != ext.backbone:
        raise ExtractorMismatch(f"--backbone {backbone}, but the model was trained on {ext.backbone} features")
    if weights is None:
        if not ext.weights.startswith("random-seed:"):
            raise InvalidInputError(f"--images needs --weights FILE: the model's {ext.backbone} weights file "
                                    f"({ext.weights})")
        weights, seed = "random", int(ext.weights.partition(":")[2])
    _check_weights(ext, weights, seed)
    embed_to_file(images=images, backbone=ext.backbone, weights=weights, seed=seed, preset=ext.preset, out=out,
                  normalisation=ext.normalisation, progress=progress, workers=0)
    return out


def _check_weights(ext, weights, seed) -> None:
    """The weights file against the model's fingerprint, before a single image is embedded (minutes on a
    large folder, all of it wasted on features the model cannot read)."""
    from .backbones import parse_weights
    from .extraction import weights_id

    kind, wenum, wpath = parse_weights(ext.backbone, weights)
    given = weights_id(kind, wenum, wpath, seed)
    if given != ext.weights:
        raise ExtractorMismatch(f"--weights {weights} is {given}, but the model was trained on {ext.backbone} "
                                f"weights {ext.weights}: pass the session's weights file (nothing was embedded)")


def _cmd_predict(args) -> int:
    if args.out:
        from secure_afl._io import refuse_existing

        refuse_existing(args.out, "--out")  # before any image is embedded
    res = predict_file(args.model, embeddings=args.embeddings, images=args.images, backbone=args.backbone,
                       weights=args.weights,
                       seed=args.seed, out=args.out, progress=not args.no_progress)
    counts = np.bincount(res["predicted"], minlength=len(res["classes"]))
    print(f"{res['n']} samples, model of session {res['session']}: "
          + ", ".join(f"{c} {n}" for c, n in zip(res["classes"], counts))
          + (f"; accuracy against the labels {res['accuracy']:.4f}" if res["accuracy"] is not None else "")
          + (f" -> {args.out}" if args.out else ""))
    return 0


def register(parser) -> None:
    parser.add_argument("--model", required=True, help="model file (.safetensors) from `keyholder finalize`")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--embeddings", metavar="FILE.npz", help="embeddings written by `client embed --out`")
    src.add_argument("--images", metavar="DIR", help="images/<class>/<image>, embedded here with the model's "
                                                       "extractor")
    parser.add_argument("--backbone", metavar="NAME", help="with --images: must be the model's (checked)")
    parser.add_argument("--weights", metavar="FILE", help="with --images: the session's weights file")
    parser.add_argument("--seed", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", metavar="FILE.csv", help="write one row per sample (index, file, label, "
                                                          "predicted, score)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=_cmd_predict)

