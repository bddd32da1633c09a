"""The product's source tree read as text and syntax trees (no import): modules, their imports, their literals.

The repository folders that become packages, and under which installed name,
come from setup.py itself (its ``ROOTS`` literal), so a test built on this
module follows the layout without a list of its own.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@lru_cache(maxsize=1)
def main_roots() -> dict[str, str]:
    """Repository folder -> installed package name, as setup.py declares them (the secure-afl distribution)."""
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "ROOTS" for t in node.targets):
            return {folder: name for name, folder in ast.literal_eval(node.value).items()}
    raise AssertionError("setup.py declares no ROOTS")


@lru_cache(maxsize=1)
def separate_roots() -> dict[str, str]:
    """Repository folder -> installed package name for the distributions of their own (tools/pyproject.toml):
    a folder with a pyproject.toml whose ``[tool.setuptools] package-dir`` maps a package onto it."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    out = {}
    for pyproject in sorted(REPO.glob("*/pyproject.toml")):
        package_dir = tomllib.loads(pyproject.read_text()).get("tool", {}).get("setuptools", {}).get("package-dir", {})
        for name, folder in package_dir.items():
            out[(pyproject.parent / folder).resolve().relative_to(REPO).as_posix()] = name
    return out


@lru_cache(maxsize=1)
def roots() -> dict[str, str]:
    """Repository folder -> installed package name, for every distribution built from the repository."""
    return {**main_roots(), **separate_roots()}


@dataclass(frozen=True)
class Module:
    name: str           # installed dotted name
    path: Path          # file in the repository
    is_package: bool    # an __init__.py

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]

    def tree(self) -> ast.Module:
        return ast.parse(self.path.read_text(), filename=str(self.path))


@lru_cache(maxsize=1)
def modules() -> dict[str, Module]:
    """Every module of the product under its installed name."""
    out = {}
    for folder, pkg in roots().items():
        for f in sorted((REPO / folder).rglob("*.py")):
            if "__pycache__" in f.parts:
                continue
            parts = f.relative_to(REPO / folder).with_suffix("").parts
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts = parts[:-1]
            name = ".".join((pkg, *parts))
            out[name] = Module(name, f, is_pkg)
    return out


def resolve(module: Module, node: ast.ImportFrom) -> str:
    """The absolute module an ``from ... import`` names."""
    if not node.level:
        return node.module or ""
    base = module.package.split(".")
    if node.level > 1:
        base = base[: -(node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def internal_imports(module: Module):
    """(line, imported module, top_level) for every import of a product module by ``module``.

    ``from pkg import name`` counts as an import of ``pkg.name`` when that is a
    module, else of ``pkg``. ``top_level`` is False for an import inside a
    function or class body (or under ``if TYPE_CHECKING``).
    """
    known = modules()
    tree = module.tree()
    top = {id(n) for n in tree.body}
    for stmt in tree.body:  # try/except ImportError at module level is still module level
        if isinstance(stmt, ast.Try):
            top |= {id(n) for n in stmt.body} | {id(n) for h in stmt.handlers for n in h.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = resolve(module, node)
            for a in node.names:
                target = f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                if target in known:
                    yield node.lineno, target, id(node) in top
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known:
                    yield node.lineno, a.name, id(node) in top


def docstring_nodes(tree: ast.AST) -> set[int]:
    """ids of the Constant nodes that are docstrings (module, class, function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.add(id(body[0].value))
    return out


_MODULE_STRING = re.compile(r"secure_afl(?:_tools)?(?:\.\w+)+(?::\w+)?|secure_afl_tools(?::\w+)?")


def _launched(tree: ast.AST) -> set[int]:
    """ids of string constants that follow ``"-m"`` in a list or tuple: a module a new process runs, not an import."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)):
            for prev, cur in zip(node.elts, node.elts[1:]):
                if isinstance(prev, ast.Constant) and prev.value == "-m" and isinstance(cur, ast.Constant):
                    out.add(id(cur))
    return out


def _logger_names(tree: ast.AST) -> set[int]:
    """ids of the string arguments of ``getLogger(...)`` calls (a logger's name, not an import)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and (
                getattr(node.func, "attr", None) == "getLogger" or getattr(node.func, "id", None) == "getLogger"):
            out.add(id(node.args[0]))
    return out


def string_imports_in(tree: ast.AST, known) -> list[tuple[int, str]]:
    """(line, module) for every string that names a product module the way an import by string does:
    ``importlib.import_module("secure_afl.x.y")``, a ``"secure_afl.x.y"`` or ``"secure_afl.x.y:attr"`` entry
    of a command table. Docstrings, logger names and ``python -m`` arguments are not imports."""
    skip = docstring_nodes(tree) | _launched(tree) | _logger_names(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip \
                and _MODULE_STRING.fullmatch(node.value):
            name = node.value.partition(":")[0]
            if name in known:
                out.append((node.lineno, name))
    return out


def string_imports(module: Module) -> list[tuple[int, str]]:
    return string_imports_in(module.tree(), modules())


def all_imports(module: Module):
    """(line, imported module) for every import of a product module: statements anywhere in the file, and
    strings that import by name (:func:`string_imports`)."""
    yield from ((line, target) for line, target, _ in internal_imports(module))
    yield from string_imports(module)
