"""The suite's own rules, checked on its source: tests use the public API and the one support package.

A test that imports a private name of the product claims a property of code no
user calls; a test that imports another test module couples the two (and their
collection order). Shared helpers live in tests/support/.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _imports(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, []


def _sources():
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_test_imports_a_private_name_of_the_product():
    offences = []
    for path in _sources():
        for line, module, names in _imports(path):
            if not module.startswith("secure_afl"):
                continue
            private = [n for n in names if n.startswith("_")] + [p for p in module.split(".") if p.startswith("_")
                                                                  and p != "__init__"]
            if private:
                offences.append(f"{path.relative_to(TESTS)}:{line}: {module} {private}")
    assert not offences, "tests import private names:\n" + "\n".join(offences)


def test_no_test_imports_another_test_module():
    test_modules = {p.stem for p in TESTS.glob("test_*.py")} | {"conftest"}
    offences = [f"{path.relative_to(TESTS)}:{line}: {module}" for path in _sources()
                for line, module, _ in _imports(path) if module.split(".")[0] in test_modules]
    assert not offences, "tests import other test modules (move shared code to tests/support):\n" + "\n".join(offences)


# calls that cannot make a test fail: a test made only of these (and no assert, no pytest.raises) checks nothing
_INERT = {"print", "len", "max", "min", "sum", "sorted", "str", "repr", "format", "float", "int", "round"}


def test_every_test_can_fail():
    offences = []
    for path in _sources():
        if not path.name.startswith("test_"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            asserts = any(isinstance(n, ast.Assert) for n in ast.walk(node))
            calls = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
                     for n in ast.walk(node) if isinstance(n, ast.Call)}
            if not asserts and not (calls - _INERT):
                offences.append(f"{path.relative_to(TESTS)}:{node.lineno}: {node.name}")
    assert not offences, "tests that assert nothing and call nothing that can fail:\n" + "\n".join(offences)


def test_no_test_sleeps_for_real_time_to_pass():
    """Waiting for the clock makes a test slow and flaky: sign an instant that has passed, or poll."""
    offences = [f"{path.relative_to(TESTS)}:{n.lineno}" for path in _sources() if path.name.startswith("test_")
                for n in ast.walk(ast.parse(path.read_text(), filename=str(path)))
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "sleep"
                and n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, (int, float))
                and n.args[0].value >= 1]
    assert not offences, "tests sleep a second or more:\n" + "\n".join(offences)
