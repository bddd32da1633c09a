"""The message-level vector files on disk, and the one way to read them.

    vectors/<protocol>/<instance>.json    one instance: its fixed keys, session parameters and honest messages,
                                          and ``bad_cases``, the names of its bad cases in order
    vectors/<protocol>/bad_<case>.json    one bad case: the instance it mutates (``instance``), the mutation
                                          (``mutation``), the refusal it must meet (``expect``) and its bytes

Every file is self-contained past its instance: a bad case carries its own payload or message, and names the
instance whose keys and parameters it is judged under. Each file records its protocol's format ``version``
(``VERSIONS``); a file of another version is refused by name, never read as if it were current, since its
messages were formed under other derivations.
"""

from __future__ import annotations

import json
from pathlib import Path

from secure_afl.exceptions import InvalidInputError

__all__ = ["ROOT", "BAD", "VERSIONS", "render", "load", "instances", "instance", "bad_case", "bad_cases", "listing"]

#: the tree's vectors/ folder: the shipped files, and the record regeneration keeps randomised values from
ROOT = Path(__file__).resolve().parents[2] / "vectors"
#: the prefix of a bad case's file name
BAD = "bad_"
#: each protocol's file format, stamped by its generator and required by the loader
VERSIONS = {
    # 2 since the session's parameters name the proof's field and the joint and query randomness bind it (with
    # the repetition count and a label of their own)
    "split": 2,
    # the round's messages as round.json's fields, each bad case a file naming the message it replaces
    "secagg": 1,
}


def render(obj: dict) -> str:
    """A file's text: sorted keys, one space of indent (diffs stay line by line), a final newline."""
    return json.dumps(obj, indent=1, sort_keys=True) + "\n"


def load(path: Path, protocol: str) -> dict:
    """The file at ``path``, refused by name when it is of another version of ``protocol``'s vectors."""
    data = json.loads(Path(path).read_text())
    want = VERSIONS[protocol]
    if data.get("version") != want:
        raise InvalidInputError(f"{Path(path).name} is version {data.get('version')} of the {protocol} vectors; this "
                                f"tree reads version {want}: regenerate it with "
                                f"`python -m secure_afl_tools.vectors {protocol}`")
    return data


def listing(folder: Path) -> list[str]:
    """Every file under ``folder``, as sorted paths relative to it (empty when there is no folder)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def instances(protocol: str, root: Path = ROOT) -> list[str]:
    """The names of ``protocol``'s instances, sorted."""
    return sorted(p.stem for p in (Path(root) / protocol).glob("*.json") if not p.name.startswith(BAD))


def instance(protocol: str, name: str, root: Path = ROOT) -> dict:
    return load(Path(root) / protocol / f"{name}.json", protocol)


def bad_case(protocol: str, name: str, root: Path = ROOT) -> dict:
    return load(Path(root) / protocol / f"{BAD}{name}.json", protocol)


def bad_cases(protocol: str, name: str, root: Path = ROOT) -> list[dict]:
    """The bad cases of instance ``name``, in its order; one that names another instance is refused."""
    out = []
    for case in instance(protocol, name, root)["bad_cases"]:
        bad = bad_case(protocol, case, root)
        if bad.get("instance") != name:
            raise InvalidInputError(f"{BAD}{case}.json mutates the {protocol} instance {bad.get('instance')!r}, "
                                    f"not {name!r} that lists it")
        out.append(bad)
    return out
