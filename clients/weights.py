"""``secure-afl client weights``: write the backbone weights file the operator and every hospital share.

Runs on: the consortium operator's machine, once; the file then goes to every
hospital with its bundle. torchvision's pretrained weights when this machine
has them in its torch hub cache (nothing is downloaded), otherwise a seeded
random initialisation, which makes a session run end to end but extracts no
useful features: the command says which one it wrote. The printed SHA-256 is
what ``client fingerprint`` puts into the session's ``[extractor]`` block, so
every hospital can check that it holds the same file.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from secure_afl.exceptions import InvalidInputError

__all__ = ["register", "write_weights"]


def write_weights(backbone: str, out, *, seed: int = 0, pretrained: str = "auto") -> tuple[str, str]:
    """Write ``backbone``'s state dict to ``out`` (never over an existing file); returns (source, sha256).

    ``pretrained``: ``"auto"`` (torchvision's default weights if cached here, else random), ``"no"``
    (the seeded random initialisation), ``"yes"`` (the cached pretrained weights, or an error).
    """
    import torch
    from torchvision.models import get_model, get_model_weights

    from .backbones import check_backbone_name, hub_checkpoint_path

    check_backbone_name(backbone)
    out = Path(out)
    if out.exists():
        raise InvalidInputError(f"{out} already exists: a shared weights file is written once (remove it first "
                                "to make another, and give every party the new one)", reason="file_exists")
    cached = None
    try:
        enum_cls = get_model_weights(backbone)
    except (ValueError, KeyError):  # a model torchvision has no pretrained weights for
        enum_cls = None
    if pretrained != "no" and enum_cls is not None:
        candidate = hub_checkpoint_path(enum_cls.DEFAULT)
        cached = candidate if candidate.is_file() else None
    if pretrained == "yes" and cached is None:
        where = hub_checkpoint_path(enum_cls.DEFAULT) if enum_cls is not None else "torchvision"
        raise InvalidInputError(f"no pretrained {backbone} weights on this machine ({where}); copy them there "
                                "(TORCH_HOME sets the cache root) or use --pretrained no", reason="weights_unavailable")
    if cached is not None:
        model = get_model(backbone, weights=None)
        model.load_state_dict(torch.load(str(cached), map_location="cpu", weights_only=True))
        source = f"torchvision's pretrained {enum_cls.DEFAULT} (from {cached})"
    else:
        torch.manual_seed(seed)
        model = get_model(backbone, weights=None)
        source = (f"a seeded random initialisation (seed {seed}; no pretrained weights on this machine): the "
                  "session runs, but the features are not useful for a real model")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    torch.save(model.state_dict(), str(tmp))
    os.replace(tmp, out)
    return source, hashlib.sha256(out.read_bytes()).hexdigest()


def _cmd_weights(args) -> int:
    if Path(args.out).exists():  # the common mistake, refused in its one line before the announcement below
        raise InvalidInputError(f"{args.out} already exists: a shared weights file is written once (remove it "
                                "first to make another, and give every party the new one)", reason="file_exists")
    # torch's import and the model's construction take seconds before the one result line
    print(f"secure-afl client weights: building {args.backbone} and writing its weights to {args.out} ...",
          file=sys.stderr, flush=True)
    source, digest = write_weights(args.backbone, args.out, seed=args.seed, pretrained=args.pretrained)
    print(f"{args.backbone} weights -> {args.out}: {source}", file=sys.stderr)
    print(f"sha256:{digest}")
    return 0


def register(parser) -> None:
    parser.add_argument("--backbone", required=True, metavar="NAME", help="torchvision model name, e.g. resnet18")
    parser.add_argument("--out", required=True, help="the weights file to write (a state dict, .pth)")
    parser.add_argument("--pretrained", choices=["auto", "yes", "no"], default="auto",
                        help="auto (default): torchvision's pretrained weights if this machine has them cached, "
                             "else a seeded random initialisation; nothing is downloaded")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random initialisation (default 0)")
    parser.set_defaults(func=_cmd_weights)
