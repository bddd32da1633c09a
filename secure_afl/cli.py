"""``secure-afl`` console script.

Each subcommand lives in its own module that exposes ``register(subparsers)``;
the module is listed in ``_COMMANDS`` and imported only when the command line
needs it, so ``secure-afl --help`` stays fast and a hospital without torch can
still run every command but ``client embed``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# (command name, help, module providing register(subparser))
_COMMANDS = [
    ("reproduce", "reproduce the papers' verification experiments", "secure_afl.reproduce"),
    ("bench", "benchmarks that print figures", "secure_afl.bench"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="secure-afl",
        description="Secure aggregation for Analytic Federated Learning (AFL).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_, module in _COMMANDS:
        p = sub.add_parser(name, help=help_, description=help_)
        importlib.import_module(module).register(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    rc = args.func(args)
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
