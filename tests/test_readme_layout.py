"""docs/LAYOUT.md's Layout section names only what exists, names every top-level folder and every module of
the library and the parties; README.md and docs/BENCHMARKS.md stay within the sizes a reader can take in.

The section is a code block, one folder per line (a line starting with a
space continues the folder above); every file or folder named on a line
(``name.py``, ``name.md``, ``name/``, a ``*`` pattern) is looked up under that
folder.
"""

from __future__ import annotations

import re

from support.sourcetree import REPO, roots

README = REPO / "README.md"
LAYOUT = REPO / "docs" / "LAYOUT.md"
BENCHMARKS = REPO / "docs" / "BENCHMARKS.md"
# the library and the parties: every module of these folders has its line (a package's __init__.py excepted)
MODULE_FOLDERS = ("secure_afl", "server", "keyholder", "clients", "consortium", "flower", "transport", "cli")
_NAME = re.compile(r"[A-Za-z0-9_*.-]+(?:/[A-Za-z0-9_*.-]+)*/?")
_NOT_A_FOLDER = {"build", "dist"}


def layout_lines() -> list[tuple[str, str]]:
    """(folder, text naming its contents) for each folder of the Layout section."""
    text = LAYOUT.read_text()
    section = text[text.index("\n## Layout"):]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    out: list[tuple[str, str]] = []
    for line in block.splitlines():
        if line.startswith(" ") and out:
            out[-1] = (out[-1][0], out[-1][1] + " " + line.strip())
        elif line.strip():
            folder, _, rest = line.partition(" ")
            out.append((folder, rest))
    return out


def _named(text: str) -> list[str]:
    return [t for t in _NAME.findall(text) if t.endswith((".py", ".md", "/")) and not t.startswith("secure_afl.")]


def test_every_named_folder_and_file_exists():
    missing = []
    for folder, rest in layout_lines():
        base = REPO / folder
        if not base.is_dir():
            missing.append(folder)
            continue
        missing += [f"{folder}{name}" for name in _named(rest) if not list(base.glob(name.rstrip("/")))]
    assert not missing, f"docs/LAYOUT.md names what does not exist: {missing}"


def test_every_top_level_folder_is_named():
    named = {folder.strip("/").split("/")[0] for folder, _ in layout_lines()}
    top = {d.name for d in REPO.iterdir() if d.is_dir() and not d.name.startswith((".", "_"))
           and d.name not in _NOT_A_FOLDER and not d.name.endswith(".egg-info")}
    assert set(roots()) <= top  # the packages setup.py installs are folders of the repository
    assert top <= named, f"docs/LAYOUT.md omits {sorted(top - named)}"


def unnamed_modules(lines: list[tuple[str, str]]) -> list[str]:
    """Every module of MODULE_FOLDERS that the line of its own folder does not name."""
    named: dict[str, set[str]] = {}
    for folder, rest in lines:
        named.setdefault(folder.rstrip("/"), set()).update(_named(rest))
    return [f.relative_to(REPO).as_posix() for top in MODULE_FOLDERS for f in sorted((REPO / top).rglob("*.py"))
            if "__pycache__" not in f.parts and f.name != "__init__.py"
            and f.name not in named.get(f.parent.relative_to(REPO).as_posix(), set())]


def test_every_module_of_the_library_and_the_parties_is_named():
    missing = unnamed_modules(layout_lines())
    assert not missing, f"docs/LAYOUT.md names no line for {missing}"


def test_the_module_check_sees_a_missing_module():
    # the same check over the layout without one module's line, and with that module named under another folder
    lines = layout_lines()
    dropped = [(folder, rest.replace("intake.py", "")) for folder, rest in lines]
    assert unnamed_modules(dropped) == ["server/intake.py"]
    moved = [(folder, rest + (" intake.py" if folder == "keyholder/" else "")) for folder, rest in dropped]
    assert unnamed_modules(moved) == ["server/intake.py"]


def test_the_layout_check_sees_a_wrong_name():
    # a name that does not exist under its folder must be reported, or the first test proves nothing
    assert _named("stats.py nowhere.py sub/ (a note)") == ["stats.py", "nowhere.py", "sub/"]
    assert not list((REPO / "secure_afl").glob("nowhere.py"))


def test_readme_and_todays_benchmarks_stay_short():
    # the reference lives in docs/ and the dated benchmark log in docs/BENCHMARKS_HISTORY.md; README and
    # BENCHMARKS.md are what a reader reads first, so they stay at a size read in one sitting
    readme, bench = (len(p.read_text().splitlines()) for p in (README, BENCHMARKS))
    assert readme <= 250, f"README.md has {readme} lines (at most 250): move reference text to docs/"
    assert bench <= 500, f"docs/BENCHMARKS.md has {bench} lines (at most 500): move older runs to BENCHMARKS_HISTORY.md"
