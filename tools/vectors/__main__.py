"""``python -m secure_afl_tools.vectors [NAME ...] [--check]``: regenerate the named vector files (all by default)."""

from __future__ import annotations

import argparse
import sys

from secure_afl_tools.vectors import GENERATORS, generator


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m secure_afl_tools.vectors",
                                 description="regenerate the message-level vectors in vectors/")
    ap.add_argument("names", nargs="*", metavar="NAME",
                    help=f"which files (default: all): {', '.join(GENERATORS)}")
    ap.add_argument("--check", action="store_true", help="exit 1 if regenerating would change a file")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.names) - set(GENERATORS))
    if unknown:
        ap.error(f"no vectors named {', '.join(unknown)}; known: {', '.join(GENERATORS)}")
    differs = 0
    for name in args.names or list(GENERATORS):
        gen = generator(name)
        text = gen.regenerate()
        if args.check:
            same = gen.PATH.exists() and gen.PATH.read_text() == text
            differs += not same
            print(f"{gen.PATH}: {'unchanged' if same else 'DIFFERS'}")
        else:
            gen.PATH.write_text(text)
            print(f"wrote {gen.PATH}")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
