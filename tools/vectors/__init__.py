"""The generators of the message-level vectors in vectors/: one module per protocol, one command for all.

    python -m secure_afl_tools.vectors                       # rewrite every generated file in vectors/
    python -m secure_afl_tools.vectors split --check         # exit 1 if regenerating split's files changes a byte
    python -m secure_afl_tools.vectors --out /tmp/vectors    # write them elsewhere (the tree's record kept)

Each module has ``OWNS`` (the folder or file of vectors/ it writes, every file in it) and ``files()`` (``{path
under vectors/: text}``, what those files must hold); split and secagg write one file per instance and one per
bad case (:mod:`secure_afl_tools.vectors.files` reads them). field128's answers come from Python integers alone
(no library code). The files in ``KEPT`` (PRG, Shamir, CKKS, the Goldilocks field and FLP answers, split's seed
box answer) were computed once by stand-alone code independent of the library and are checked by their tests,
not regenerated.
"""

from __future__ import annotations

import importlib

#: vector name -> the module that generates it
GENERATORS = {"secagg": "secure_afl_tools.vectors.secagg_messages", "split": "secure_afl_tools.vectors.split_messages",
              "field128": "secure_afl_tools.vectors.field128_vectors"}
#: the files of vectors/ no generator writes
KEPT = ("ckks_encode_decode.json", "ckks_invalid_params.json", "flp.json", "flp_signed.json", "prg.json",
        "shamir.json", "shamir_invalid.json", "split_seed_box.json")


def generator(name: str):
    return importlib.import_module(GENERATORS[name])
