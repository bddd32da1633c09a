"""``secure-afl client fingerprint``: the ``[extractor]`` block of session.toml for a backbone.

Runs on: the consortium operator's machine (or any hospital, to check). It
builds the backbone exactly as ``client embed`` does, measures d, hashes the
weights file and prints the TOML block the session declares; ``client embed``
records the same fields, and ``client submit`` refuses statistics whose
fields differ.
"""

from __future__ import annotations

import json
import sys
from secure_afl.clients.backbones import check_backbone_name, parse_weights, load_backbone, resolve_preprocessing
from secure_afl.clients.extraction import weights_id
from secure_afl.exceptions import InvalidInputError
from secure_afl.extractor import ExtractorFingerprint, parse_normalisation


def _cmd_fingerprint(args) -> int:


    check_backbone_name(args.backbone)
    kind, wenum, wpath = parse_weights(args.backbone, args.weights)
    if kind == "random" and args.seed is None:
        raise InvalidInputError("--weights random needs --seed N (it becomes part of the fingerprint)")
    radius = parse_normalisation(args.normalisation)
    prep = resolve_preprocessing(args.preset, wenum)
    # building the backbone (torch's import included) takes seconds; stdout is the TOML block itself
    print(f"secure-afl client fingerprint: building {args.backbone} ({args.weights} weights) to measure its "
          "feature dimension and hash its weights ...", file=sys.stderr, flush=True)
    bb = load_backbone(args.backbone, args.weights, input_size=prep.crop, seed=args.seed)
    classes = [c.strip() for c in args.classes.split(",") if c.strip()]
    fp = ExtractorFingerprint(bb.name, weights_id(kind, wenum, wpath, args.seed), prep.name, prep.crop,
                              tuple(classes), bb.dim, "none" if radius is None else f"l2:{radius:g}")
    print("[extractor]")
    for key, value in fp.to_dict().items():
        print(f"{key} = {json.dumps(value)}")
    return 0


def register(parser) -> None:
    parser.add_argument("--backbone", required=True, metavar="NAME", help="torchvision model name, e.g. resnet18")
    parser.add_argument("--weights", default="DEFAULT", metavar="DEFAULT|PATH|random")
    parser.add_argument("--seed", type=int, default=None, metavar="N", help="with --weights random")
    parser.add_argument("--preset", choices=["paper", "imagenet"], default="paper")
    parser.add_argument("--classes", required=True, metavar="A,B,C", help="class names in label order")
    parser.add_argument("--normalisation", default="none", metavar="none|l2:R")
    parser.set_defaults(func=_cmd_fingerprint)
