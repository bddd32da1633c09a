"""The comparison on a hospital's real-image embeddings instead of the fixed random features.

``load_features`` reads an embeddings file as ``secure-afl client embed --out``
writes it (:func:`secure_afl.clients.statsfile.load_embeddings_file`: X, y,
classes, metadata) and splits it into training and test sets.

``embed_digits`` builds such a file without any download: sklearn's 8x8
digits are rendered as RGB PNG images into an ImageFolder tree, and the
clients' own extraction (:func:`secure_afl.clients.extraction.extract` with a
torchvision resnet18 from :func:`secure_afl.clients.backbones.load_backbone`)
embeds them on the CPU. The weights are a seeded random initialisation, so
every run and every hospital builds the same backbone; the embeddings are
meaningful only as a test of the path (what a hospital's pipeline would hand
to AFL and to the gradient baselines), not as a pretrained model's features.
The images are embedded at ``size`` pixels (the paper preset's
normalisation, with resize and crop at ``size`` instead of 224) so that the
1,797 images take seconds on two cores.

``features_section`` renders its tables as ``compare`` renders the study's, with the two helpers both use
(``partition_order``, ``mean_std``), kept here because ``compare`` imports this module and not the reverse.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import numpy as np

from secure_afl.exceptions import InvalidInputError

__all__ = ["load_features", "render_digits", "embed_digits", "features_section"]


def load_features(path, seed: int, *, test_size: float = 0.25):
    """``(Xtr, ytr, Xte, yte, C)`` from an embeddings file, stratified split by ``seed``.

    X is scaled by one constant, its largest row norm, so every ||x|| <= 1 as
    the baselines' step sizes assume (``compare``'s defaults were tuned on
    features of norm about 1). A common scale changes no prediction of the
    closed-form head (W scales inversely; RI restoration removes gamma
    exactly) and no file written with ``--normalisation l2:1`` at all.
    """
    from sklearn.model_selection import train_test_split

    from secure_afl.clients.statsfile import load_embeddings_file

    X, y, classes = load_embeddings_file(path)
    X = np.asarray(X, dtype=np.float64)
    peak = float(np.max(np.linalg.norm(X, axis=1)))
    if not peak > 0:
        raise InvalidInputError(f"{path}: every embedding is zero; nothing to learn from")
    X = X / peak
    C = len(classes)
    present = np.bincount(y, minlength=C)
    strat = y if present[present > 0].min() >= 2 else None
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=test_size, random_state=seed, stratify=strat)
    return Xtr, ytr.astype(np.int64), Xte, yte.astype(np.int64), C


def render_digits(root, *, size: int = 64, per_class: int | None = None) -> Path:
    """sklearn's digits as an ImageFolder tree ``root/<digit>/<index>.png`` (RGB, ``size`` px).

    The 8x8 images hold 0..16; they are scaled to 0..255 and enlarged with
    bilinear interpolation, the way a scanned image would reach the hospital's
    loader. ``per_class`` keeps only the first images of each class (tests).
    """
    from PIL import Image
    from sklearn.datasets import load_digits

    if not isinstance(size, int) or size < 8:
        raise InvalidInputError(f"The 'size' parameter must be an int >= 8. Got {size!r} instead.")
    ds = load_digits()
    root = Path(root)
    seen = np.zeros(10, dtype=np.int64)
    for i, (img, label) in enumerate(zip(ds.images, ds.target)):
        if per_class is not None and seen[label] >= per_class:
            continue
        seen[label] += 1
        folder = root / str(int(label))
        folder.mkdir(parents=True, exist_ok=True)
        pix = np.clip(np.round(img * (255.0 / 16.0)), 0, 255).astype(np.uint8)
        Image.fromarray(pix, mode="L").convert("RGB").resize((size, size), Image.BILINEAR).save(
            folder / f"{i:04d}.png")
    return root


def embed_digits(out, *, size: int = 64, seed: int = 0, per_class: int | None = None, batch_size: int = 64,
                 workers: int = 0):
    """Render the digits, embed them with a seeded random resnet18 on the CPU, write the embeddings file.

    Returns the :class:`~secure_afl.clients.extraction.Extraction`. The file
    carries the extractor's fingerprint like ``client embed``'s; embeddings
    are scaled to norm 1 (``--normalisation l2:1``).
    """
    from secure_afl.clients.backbones import (PAPER_MEAN, PAPER_STD, Preprocessing, RandomWeightsWarning,
                                              load_backbone)
    from secure_afl.clients.extraction import extract, weights_id
    from secure_afl.clients.sources import image_folder
    from secure_afl.clients.statsfile import write_embeddings_file
    from secure_afl.extractor import ExtractorFingerprint

    prep = Preprocessing("paper", size, size, PAPER_MEAN, PAPER_STD)
    with tempfile.TemporaryDirectory(prefix="digits-images-") as tmp:
        source = image_folder(render_digits(Path(tmp) / "digits", size=size, per_class=per_class))
        with warnings.catch_warnings():
            # the random weights are the point here (no download); the module docstring says what that means
            warnings.simplefilter("ignore", RandomWeightsWarning)
            bb = load_backbone("resnet18", "random", input_size=size, seed=seed)
        res = extract(source, bb, prep, device="cpu", batch_size=batch_size, workers=workers, progress=False,
                      l2_radius=1.0)
    fp = ExtractorFingerprint(backbone=bb.name, weights=weights_id("random", None, None, seed), preset=prep.name,
                              input_size=prep.crop, classes=tuple(res.classes), dim=bb.dim, normalisation="l2:1")
    res.metadata.update({"n_images": int(len(res.y)), "dataset": f"sklearn digits rendered at {size} px",
                         "extractor": fp.to_json()})
    write_embeddings_file(out, res.X, res.y, res.classes, res.metadata)
    return res


def features_section(blob: dict) -> list:
    """Markdown lines of the comparison on client-embedded features, for COMPARISON.md."""
    rows, cfg = blob["rows"], blob.get("config", {})
    specs = sorted({r["partition"] for r in rows}, key=partition_order)
    by = {}
    for r in rows:
        by.setdefault((r["method"], r["K"], r["partition"]), []).append(r)
    names = list(dict.fromkeys(r["method"] for r in rows))
    L = ["## Client-embedded images: an UNTUNED run, not on the protocol above", "", blob["intro"], "", "```",
          blob["command"], "```", ""]
    L += [f"**Untuned.** Every baseline runs at one fixed step (lr {cfg.get('lr_linear')} linear, "
          f"{cfg.get('lr_mlp')} MLP, {cfg.get('local_epochs')} local epoch, batch {cfg.get('batch_size')}), "
          f"{cfg.get('rounds')} rounds, with no validation grid, {cfg.get('seeds')} seed(s), every aggregation "
          f"through the `{cfg.get('backend')}` backend. The study above tunes each baseline's step, epochs and "
          "mu on validation data; nothing here was tuned, so the baselines' accuracies below are what these "
          "default steps give on these features, not what the baselines can reach, and the gaps to AFL are "
          "not comparable with the study's. AFL is also run through secure backends against plain below. The "
          "backbone is a seeded random initialisation (no download here), so the features test the pipeline, "
          "not a pretrained model.", ""]
    for K in sorted({r["K"] for r in rows}):
        L += [f"K = {K}: test accuracy, global / per-client (mean ± std over seeds):", "",
              "| method | " + " | ".join(specs) + f" | bytes / hospital / round ({cfg.get('backend')}) |",
              "|---|" + "---|" * (len(specs) + 1)]
        for m in names:
            cells = [f"{mean_std([r['global_acc'] for r in by.get((m, K, s), [])])} / "
                     f"{mean_std([r['client_acc'] for r in by.get((m, K, s), [])])}" if (m, K, s) in by else ""
                     for s in specs]
            bpr = [r["bytes_per_round"] for r in rows if r["method"] == m and r["K"] == K]
            L.append(f"| {m} | " + " | ".join(cells) + f" | {np.nanmean(bpr):,.0f} |")
        L.append("")
    closed = blob.get("closed_form_acc")
    if closed is not None:
        afl = sorted({round(r["global_acc"], 12) for r in rows if r["method"] == "AFL"})
        L += [f"AFL's global accuracy on every partition and seed: {', '.join(f'{a:.4f}' for a in afl)}; the "
              f"pooled closed form X^+ Y on the same training features: {closed:.4f}.", ""]
    gaps = []
    for spec in specs:
        best = max(((np.nanmean([r["global_acc"] for r in rs]), m) for (m, _, s2), rs in by.items()
                    if s2 == spec and m != "AFL"), default=None)
        afl_rs = [r["global_acc"] for r in rows if r["method"] == "AFL" and r["partition"] == spec]
        if best is not None and afl_rs:
            gaps.append(f"{spec}: {best[1]} {best[0]:.3f} against AFL's {np.mean(afl_rs):.3f}")
    if gaps:
        L += [f"Best untuned gradient baseline after {cfg.get('rounds')} rounds (global accuracy, mean over "
              "seeds): " + "; ".join(gaps) + ". At these fixed steps gradient descent is far from AFL on these "
              "features; whether tuned steps close the gap was not measured.", ""]
    if blob.get("verify"):
        L += ["Secure runs against the plain run (K = %d, %s):" % (blob["verify"][0]["K"],
                                                                  blob["verify"][0]["partition"]), "",
              "| backend | method | max abs parameter difference | prediction agreement | accuracy (secure / plain) "
              "| bytes / hospital |", "|---|---|---|---|---|---|"]
        for v in blob["verify"]:
            L.append(f"| {v['backend']} | {v['method']} | {v['max_abs_diff']:.2e} | {v['agreement']:.4f} | "
                     f"{v['acc_secure']:.4f} / {v['acc_plain']:.4f} | {v['bytes_per_round']:,.0f} |")
        L.append("")
    if blob.get("ablation"):
        L += ["RI ablation on these features (Dirichlet alpha = 0.1; N/A: the path fails):", "",
              "| K | gamma | AA law w/o RI | AA law w/ RI | sum form w/o RI | sum form w/ RI |",
              "|---|---|---|---|---|---|"]
        f = (lambda v: "N/A" if v is None else f"{v:.4f}")
        for a in blob["ablation"]:
            L.append(f"| {a['K']} | {a['gamma']:g} | {f(a['aa_without_ri'])} | {f(a['aa_with_ri'])} | "
                     f"{f(a['sum_without_ri'])} | {f(a['sum_with_ri'])} |")
        L.append("")
    return L


def partition_order(spec: str):
    """iid first, then Dirichlet from mild to strong skew, then shards."""
    if spec == "iid":
        return (0, 0.0)
    kind, _, arg = spec.partition(":")
    return (1, -float(arg)) if kind == "dirichlet" else (2, float(arg))


def mean_std(vals) -> str:
    """mean ± std over seeds; refused runs (NaN) counted apart."""
    vals = np.asarray(vals, dtype=float)
    bad = int(np.isnan(vals).sum())
    vals = vals[~np.isnan(vals)]
    if not vals.size:
        return "refused"
    txt = f"{vals.mean():.3f} ± {vals.std():.3f}" if vals.size > 1 else f"{vals.mean():.3f}"
    return txt + (f" ({bad} refused)" if bad else "")
