"""``secure-afl`` console script (installed as secure_afl.cli, above the library, the parties and the tools).

Each subcommand lives in its own module that exposes ``register(parser)``;
the module is listed in ``COMMANDS`` and imported only when the command line
names it, so ``secure-afl --help`` stays fast and a hospital without torch can
still run every command but ``client embed``. The tools' commands (demo,
attack, bench, compare, reproduce) come with the separate secure-afl-tools
distribution (tools/): without it they end with one line saying how to
install it.

An expected failure (any :class:`~secure_afl.exceptions.SecureAFLError`, a
missing or unreadable file) ends the command with one line on stderr and the
exit code documented in :mod:`secure_afl.exceptions`; ``--debug`` shows the
traceback instead. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from secure_afl.exceptions import EXIT_INPUT, EXIT_REFUSED, EXIT_USAGE, InvalidParameterError, MissingExtra, SecureAFLError, exit_code

# optional dependencies -> the extra of pyproject.toml that installs them (`make demo` installs none)
_EXTRAS = {"torch": "embed", "torchvision": "embed", "PIL": "embed", "flwr": "flower", "matplotlib": "bench"}

# (command name, help, "module" providing register(subparser), or "module:function" naming another function)
COMMANDS = [
    ("reproduce", "reproduce the papers' verification experiments", "secure_afl_tools.reproduce"),
    ("bench", "benchmarks that print figures", "secure_afl_tools.bench"),
    ("client", "hospital-side commands", "secure_afl.clients.cli"),
    ("pki", "consortium CA, TLS certificates and Ed25519 identities", "secure_afl.consortium.cli:register_pki"),
    ("session", "the operator's signed session definition every party pins",
     "secure_afl.consortium.cli:register_session"),
    ("audit", "verify the audit log and receipts, a split release, a model against plaintext; the auditor's "
              "HTML report", "secure_afl.cli.audit_commands"),
    ("server", "the aggregation server", "secure_afl.server.cli"),
    ("keyholder", "the key holder: keys, release checks, decryption and the solve", "secure_afl.keyholder.cli"),
    ("predict", "apply a model file to an image folder or an embeddings file", "secure_afl.clients.predict"),
    ("demo", "end-to-end demo: PKI, server, key holder and K hospitals on 127.0.0.1", "secure_afl_tools.demo"),
    ("attack", "run the threat-model attack demonstrations", "secure_afl_tools.attacks"),
    ("compare", "AFL against FedAvg, FedProx and FedFac with secure sums", "secure_afl_tools.baselines.compare"),
]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:  # the installed distribution's, which is what a bug report needs; the source tree's otherwise
        return version("secure-afl")
    except PackageNotFoundError:
        from secure_afl import __version__

        return __version__


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The full parser; only the command named in ``argv`` (all if None) is imported."""
    parser = argparse.ArgumentParser(
        prog="secure-afl",
        description="Secure aggregation for Analytic Federated Learning (AFL).",
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of an expected error")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = None
    if argv is not None:
        wanted = next((a for a in argv if not a.startswith("-")), "")
    for name, help_, module in COMMANDS:
        p = sub.add_parser(name, help=help_, description=help_)
        if wanted is None or wanted == name:
            mod, _, func = module.partition(":")
            getattr(importlib.import_module(mod), func or "register")(p)
    return parser


# an operating-system error's reason and message in the user's terms, never a Python class name
_OS_REASONS = [(FileNotFoundError, "file_not_found", "no such file"),
               (IsADirectoryError, "is_a_directory", "a directory where a file is expected"),
               (NotADirectoryError, "not_a_directory", "not a directory"),
               (PermissionError, "permission_denied", "permission denied"),
               (FileExistsError, "file_exists", "already exists"),
               (TimeoutError, "timed_out", "timed out")]


def _os_reason(exc: OSError) -> tuple[str, str]:
    reason, what = next(((r, w) for cls, r, w in _OS_REASONS if isinstance(exc, cls)), ("os_error", None))
    if exc.filename is not None:
        return reason, f"{what or exc.strerror or 'cannot use'}: {exc.filename}"
    return reason, " ".join(str(exc).split()) or what or "operating-system error"


def one_line(exc: BaseException) -> str:
    """``secure-afl: error [reason]: message`` on a single line."""
    if isinstance(exc, OSError) and not isinstance(exc, SecureAFLError):
        reason, text = _os_reason(exc)
    else:
        reason = getattr(exc, "reason", None) or "error"
        text = " ".join(str(exc).split()) or "failed"
    return f"secure-afl: error [{reason}]: {text}"


try:
    from tomllib import TOMLDecodeError as _TOMLDecodeError
except ImportError:  # Python 3.10
    from tomli import TOMLDecodeError as _TOMLDecodeError


def _toml_error(exc: Exception, args) -> InvalidParameterError:
    """A session.toml that does not parse, named with the file it came from."""
    where = next((str(v) for k in ("config", "session_config") if (v := getattr(args, k, None))), "session.toml")
    return InvalidParameterError(f"{where} is not valid TOML: {exc}", reason="invalid_toml")


def _missing_extra(exc: ModuleNotFoundError) -> MissingExtra | None:
    extra = _EXTRAS.get((exc.name or "").partition(".")[0])
    if extra is None:
        return None
    return MissingExtra(f"this command needs {exc.name}, which the '{extra}' extra installs: "
                        f"pip install 'secure-afl[{extra}]'")


# the separate distribution that holds secure_afl_tools (not in a hospital's install)
TOOLS_PACKAGE = "secure_afl_tools"
TOOLS_INSTALL = "pip install ./tools (the secure-afl-tools distribution in a clone of the repository; `make demo` does it)"


def _missing_tools(exc: ModuleNotFoundError, argv: list[str]) -> MissingExtra | None:
    name = exc.name or ""
    if name != TOOLS_PACKAGE and not name.startswith(TOOLS_PACKAGE + "."):
        return None
    command = next((a for a in argv if not a.startswith("-")), "this command")
    return MissingExtra(f"`secure-afl {command}` needs the tools, which this installation lacks: {TOOLS_INSTALL}",
                        reason="missing_tools")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not [a for a in argv if a != "--debug"]:  # a bare call: the command list, not only "required: COMMAND"
        build_parser([""]).print_help()
        return EXIT_USAGE
    try:  # a command module that imports an extra at its top fails here, and says which extra
        parser = build_parser(argv)
    except ModuleNotFoundError as exc:
        if (err := _missing_tools(exc, argv) or _missing_extra(exc)) is None or "--debug" in argv:
            raise
        print(one_line(err), file=sys.stderr)
        return exit_code(err)
    args = parser.parse_args(argv)
    try:
        try:
            rc = args.func(args)
        except _TOMLDecodeError as exc:
            raise _toml_error(exc, args) from exc
    except (SecureAFLError, OSError, TimeoutError) as exc:
        if args.debug:
            raise
        print(one_line(exc), file=sys.stderr)
        if isinstance(exc, SecureAFLError):
            return exit_code(exc)
        return EXIT_REFUSED if isinstance(exc, TimeoutError) else EXIT_INPUT
    except ModuleNotFoundError as exc:
        if (err := _missing_extra(exc)) is None or args.debug:
            raise
        print(one_line(err), file=sys.stderr)
        return exit_code(err)
    except KeyboardInterrupt:
        # what has left this machine is the server's to say: a signed receipt in --receipts, or `session
        # status`, tells whether an interrupted upload arrived (a second one is refused if it did)
        print("secure-afl: interrupted; whatever was sent before this is the server's record: check for a receipt "
              "(client submit) or `secure-afl session status` before running the command again", file=sys.stderr)
        return 130
    return int(rc or 0)
