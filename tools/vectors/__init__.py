"""The generators of the message-level vectors in vectors/: one module per file, named after it, one command
for all.

    python -m secure_afl_tools.vectors                  # rewrite every generated file
    python -m secure_afl_tools.vectors split --check    # exit 1 if regenerating split's file changes a byte

Each module has ``PATH`` (the file it writes) and ``regenerate()`` (the text the file must hold). field128's
answers come from Python integers alone (no library code). The other
files in vectors/ (PRG, Shamir, CKKS, the Goldilocks field and FLP answers) were computed once by stand-alone code
independent of the library and are checked by their tests, not regenerated.
"""

from __future__ import annotations

import importlib

#: vector name -> the module that generates it
GENERATORS = {"secagg": "secure_afl_tools.vectors.secagg_messages", "split": "secure_afl_tools.vectors.split_messages",
              "field128": "secure_afl_tools.vectors.field128_vectors"}


def generator(name: str):
    return importlib.import_module(GENERATORS[name])
