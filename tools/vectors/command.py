"""``python -m secure_afl_tools.vectors [NAME ...] [--out DIR] [--check]``: regenerate the named vectors (all by
default) into DIR (the tree's vectors/ by default)."""

from __future__ import annotations

import argparse
from pathlib import Path

from secure_afl_tools.vectors import GENERATORS, generator
from secure_afl_tools.vectors.files import ROOT, listing


def owned(out: Path, owns: str) -> list[str]:
    """The files under ``out`` that generator's ``owns`` covers, as paths relative to ``out``."""
    if (out / owns).is_dir() or not owns.endswith(".json"):
        return [f"{owns}/{p}" for p in listing(out / owns)]
    return [owns] if (out / owns).is_file() else []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m secure_afl_tools.vectors",
                                 description="regenerate the message-level vectors in vectors/")
    ap.add_argument("names", nargs="*", metavar="NAME",
                    help=f"which vectors (default: all): {', '.join(GENERATORS)}")
    ap.add_argument("--out", type=Path, default=ROOT, metavar="DIR",
                    help="the folder to write (or check) the files in (default: the tree's vectors/); the recorded "
                         "randomised values (seed boxes, a DP noise share) are kept from the tree's vectors/")
    ap.add_argument("--check", action="store_true", help="exit 1 if regenerating would change, add or leave a file")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.names) - set(GENERATORS))
    if unknown:
        ap.error(f"no vectors named {', '.join(unknown)}; known: {', '.join(GENERATORS)}")
    differs = 0
    for name in args.names or list(GENERATORS):
        gen = generator(name)
        texts = gen.files(ROOT)
        for rel, text in texts.items():
            path = args.out / rel
            if args.check:
                same = path.is_file() and path.read_text() == text
                differs += not same
                print(f"{path}: {'unchanged' if same else 'DIFFERS' if path.exists() else 'MISSING'}")
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                print(f"wrote {path}")
        # a file left from an earlier generation is named, not deleted: this run did not write it
        for rel in sorted(set(owned(args.out, gen.OWNS)) - set(texts)):
            differs += 1
            print(f"{args.out / rel}: no longer generated (delete it by hand)")
    return 1 if differs else 0

