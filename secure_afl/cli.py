"""``secure-afl`` console script.

Each subcommand lives in its own module that exposes ``register(parser)``;
the module is listed in ``_COMMANDS`` and imported only when the command line
names it, so ``secure-afl --help`` stays fast and a hospital without torch can
still run every command but ``client embed``.

An expected failure (any :class:`~secure_afl.exceptions.SecureAFLError`, a
missing or unreadable file) ends the command with one line on stderr and the
exit code documented in :mod:`secure_afl.exceptions`; ``--debug`` shows the
traceback instead. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .exceptions import EXIT_INPUT, EXIT_REFUSED, SecureAFLError, exit_code

# (command name, help, module providing register(subparser))
_COMMANDS = [
    ("reproduce", "reproduce the papers' verification experiments", "secure_afl.reproduce"),
    ("bench", "benchmarks that print figures", "secure_afl.bench"),
    ("client", "hospital-side commands", "secure_afl.clients.cli"),
    ("pki", "consortium CA, TLS certificates and Ed25519 identities", "secure_afl.pki"),
    ("session", "the operator's signed session definition every party pins", "secure_afl.session"),
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
    parser.add_argument("--debug", action="store_true", help="show the traceback of an expected error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = None
    if argv is not None:
        wanted = next((a for a in argv if not a.startswith("-")), "")
    for name, help_, module in _COMMANDS:
        p = sub.add_parser(name, help=help_, description=help_)
        if wanted is None or wanted == name:
            importlib.import_module(module).register(p)
    return parser


def one_line(exc: BaseException) -> str:
    """``secure-afl: error [reason]: message`` on a single line."""
    reason = getattr(exc, "reason", None) or type(exc).__name__
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"secure-afl: error [{reason}]: {text}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except (SecureAFLError, OSError, TimeoutError) as exc:
        if args.debug:
            raise
        print(one_line(exc), file=sys.stderr)
        if isinstance(exc, SecureAFLError):
            return exit_code(exc)
        return EXIT_REFUSED if isinstance(exc, TimeoutError) else EXIT_INPUT
    except KeyboardInterrupt:
        print("secure-afl: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
