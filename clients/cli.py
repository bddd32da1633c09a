"""``secure-afl client ...``: the hospital-side command group.

Each subcommand module exposes ``register(parser)`` (adds its arguments and
``set_defaults(func=...)``) and is imported only when the parser is built;
torch is imported only when a command that needs it runs. To add a command,
append ``(name, help, module)`` to ``_SUBCOMMANDS``.

Runs on: the hospital.
"""

from __future__ import annotations

import argparse
import importlib

__all__ = ["register"]

# (subcommand, help, module providing register(parser))
_SUBCOMMANDS = [
    ("embed", "extract backbone embeddings or local AFL statistics from images",
     "secure_afl.clients.embed"),
    ("submit", "compute, protect, sign and upload this hospital's statistics",
     "secure_afl.clients.submit"),
    ("fingerprint", "print the session.toml [extractor] block for a backbone, weights and class list",
     "secure_afl.clients.fingerprint"),
    ("dispute", "split: who is at fault for a refused upload -- the server, the key holder or this hospital",
     "secure_afl.clients.dispute"),
    ("weights", "write the backbone weights file every party shares (pretrained if cached here, else seeded "
                "random)", "secure_afl.clients.weights"),
]


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="client_command", metavar="SUBCOMMAND", required=True)
    for name, help_, module in _SUBCOMMANDS:
        p = sub.add_parser(name, help=help_, description=help_)
        importlib.import_module(module).register(p)
