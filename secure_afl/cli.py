"""``secure-afl`` console script.

Each subcommand lives in its own module that exposes ``register(parser)``;
the module is listed in ``_COMMANDS`` and imported only when the command line
names it, so ``secure-afl --help`` stays fast and a hospital without torch can
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
    ("client", "hospital-side commands", "secure_afl.clients.cli"),
    ("pki", "consortium CA, TLS certificates and Ed25519 identities", "secure_afl.pki"),
    ("audit", "verify the hash-chained audit log and receipts", "secure_afl.audit"),
    ("server", "the aggregation server", "secure_afl.server.cli"),
    ("keyholder", "the key holder: keys, release checks, decryption and the solve", "secure_afl.keyholder.cli"),
    ("demo", "end-to-end demo: PKI, server, key holder and K hospitals on 127.0.0.1", "secure_afl.demo"),
    ("attack", "run the threat-model attack demonstrations", "secure_afl.attacks"),
    ("compare", "AFL against FedAvg, FedProx and FedFac with secure sums", "secure_afl.baselines.compare"),
]


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The full parser; only the command named in ``argv`` (all if None) is imported."""
    parser = argparse.ArgumentParser(
        prog="secure-afl",
        description="Secure aggregation for Analytic Federated Learning (AFL).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = None
    if argv is not None:
        wanted = next((a for a in argv if not a.startswith("-")), "")
    for name, help_, module in _COMMANDS:
        p = sub.add_parser(name, help=help_, description=help_)
        if wanted is None or wanted == name:
            importlib.import_module(module).register(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    rc = args.func(args)
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
