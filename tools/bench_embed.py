"""``secure-afl bench extract``: throughput of hospital-side embedding extraction.

Measures images/s of a backbone (default resnet18) at 224 px fed from
CIFAR-size (32x32x3) uint8 images, split into the phases of the pipeline of
:mod:`secure_afl.clients.embed`:

* ``decode``    uint8 (B, 32, 32, 3) array -> (B, 3, 32, 32) uint8 tensor batch on the CPU
                (pinned on CUDA);
* ``transfer``  host -> device copy (``non_blocking`` from pinned memory; no-op on CPU);
* ``preprocess`` resize to 224 + /255 + normalise on the device (float32);
* ``forward``   the backbone without its head (bf16 autocast + channels_last on CUDA,
                float32 on CPU);
* ``gram``      float64 accumulation C += E^T E, Q += E^T Y, counts on the device.

Phases are timed one after another (``torch.cuda.Event`` pairs on CUDA,
``perf_counter`` on CPU), so the per-phase figures add up to the serial time;
``pipelined_images_per_s`` is the end-to-end rate of :func:`embed.extract`
(which overlaps the copy of batch i+1 with the compute of batch i on CUDA)
on the same images. Random-init weights are used: the rate does not depend on
the weight values and no download is needed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

import numpy as np

from secure_afl.stats import StatisticsAccumulator
from secure_afl.clients import embed as E
from secure_afl.clients import extraction

__all__ = ["register", "run_extract_bench"]

_PHASES = ("decode", "transfer", "preprocess", "forward", "gram")


def run_extract_bench(*, device: str = "auto", batch_size: int = 64, images: int = 256,
                      backbone: str = "resnet18", n_classes: int = 10, warmup_batches: int = 1,
                      pipelined: bool = True, seed: int = 0) -> dict:
    """Run the phase-split benchmark and return a JSON-able dict of figures."""
    import torch


    dev = extraction._resolve_device(device)
    cuda = dev.type == "cuda"
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(images, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, n_classes, size=images).astype(np.int64)
    prep = E.resolve_preprocessing("paper")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", E.RandomWeightsWarning)
        bb = E.load_backbone(backbone, "random", input_size=prep.crop)
    model = bb.model.to(dev)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    mean = torch.tensor(prep.mean, device=dev).view(1, 3, 1, 1)
    std = torch.tensor(prep.std, device=dev).view(1, 3, 1, 1)
    acc = StatisticsAccumulator(bb.dim, n_classes)

    totals = dict.fromkeys(_PHASES, 0.0)

    def one_batch(s: int, timed: bool) -> None:
        t0 = time.perf_counter()
        xb = torch.from_numpy(np.ascontiguousarray(data[s:s + batch_size].transpose(0, 3, 1, 2)))
        yb = torch.from_numpy(labels[s:s + batch_size])
        if cuda:
            xb, yb = xb.pin_memory(), yb.pin_memory()
        t_decode = time.perf_counter() - t0
        if cuda:
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(5)]
            ev[0].record()
        else:
            marks = [time.perf_counter()]
        xd, yd = xb.to(dev, non_blocking=cuda), yb.to(dev, non_blocking=cuda)
        ev[1].record() if cuda else marks.append(time.perf_counter())
        x = extraction._normalise(xd, prep, mean, std, resize=True)
        if cuda:
            x = x.contiguous(memory_format=torch.channels_last)
        ev[2].record() if cuda else marks.append(time.perf_counter())
        if cuda:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                emb = model(x)
            emb = emb.float()
        else:
            emb = model(x)
        ev[3].record() if cuda else marks.append(time.perf_counter())
        acc.update(emb, yd)
        if cuda:
            ev[4].record()
            torch.cuda.synchronize(dev)
            spans = [ev[i].elapsed_time(ev[i + 1]) / 1e3 for i in range(4)]
        else:
            marks.append(time.perf_counter())
            spans = [marks[i + 1] - marks[i] for i in range(4)]
        if timed:
            totals["decode"] += t_decode
            for name, v in zip(_PHASES[1:], spans):
                totals[name] += v

    with torch.inference_mode():
        for b in range(warmup_batches):
            one_batch((b * batch_size) % images, timed=False)
        for s in range(0, images, batch_size):
            one_batch(s, timed=True)

    serial = sum(totals.values())
    result = {
        "benchmark": "extract",
        "backbone": backbone,
        "dim": bb.dim,
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if cuda else f"cpu ({torch.get_num_threads()} threads)",
        "precision": "bf16 autocast, channels_last; stats float64" if cuda else "float32; stats float64",
        "images": images,
        "batch_size": batch_size,
        "input": "32x32x3 uint8 -> 224x224",
        "torch_version": torch.__version__,
        "phases_s": {k: round(v, 6) for k, v in totals.items()},
        "phase_images_per_s": {k: (images / v if v > 0 else None) for k, v in totals.items()},
        "serial_images_per_s": images / serial,
    }
    if pipelined:
        src = E.array_source(data, labels, n_classes)
        res = E.extract(src, bb, prep, device=str(dev), batch_size=batch_size, workers=0,
                        keep_embeddings=False, progress=False)
        result["pipelined_images_per_s"] = images / res.seconds
    return result


def register(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``secure-afl bench extract``."""
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--batch-size", type=int, default=64, metavar="N")
    parser.add_argument("--images", type=int, default=256, metavar="N")
    parser.add_argument("--backbone", default="resnet18", metavar="NAME")
    parser.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads")
    parser.add_argument("--no-pipelined", action="store_true", help="skip the end-to-end extract() run")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the figures as JSON")
    parser.set_defaults(func=_cmd_extract)


def _cmd_extract(args) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.images < 1 or args.batch_size < 1:
        print("secure-afl bench extract: error: --images and --batch-size must be >= 1", file=sys.stderr)
        return 2
    r = run_extract_bench(device=args.device, batch_size=args.batch_size, images=args.images,
                          backbone=args.backbone, pipelined=not args.no_pipelined)
    print(f"extract {r['backbone']} (d={r['dim']}) on {r['device_name']}, {r['images']} images, "
          f"batch {r['batch_size']}, {r['input']}, {r['precision']}")
    for k in _PHASES:
        print(f"  {k:<10} {r['phases_s'][k]:9.4f} s  {r['phase_images_per_s'][k] or float('inf'):12.1f} img/s")
    print(f"  serial     {r['serial_images_per_s']:12.1f} img/s")
    if "pipelined_images_per_s" in r:
        print(f"  pipelined  {r['pipelined_images_per_s']:12.1f} img/s (embed.extract end to end)")
    if args.json:
        d = os.path.dirname(os.path.abspath(args.json))
        fd, tmp = tempfile.mkstemp(prefix=".bench.", suffix=".json", dir=d)
        with os.fdopen(fd, "w") as fh:
            json.dump(r, fh, indent=2)
        os.replace(tmp, args.json)
    return 0
