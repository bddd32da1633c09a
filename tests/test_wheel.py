"""The built wheels, installed into fresh virtual environments: the party's wheel is the whole product and
carries no tool (no demo, no attack demonstration, no benchmark); the tools' wheel adds them.

The environment has no editable install and never sees the source tree: the
wheel goes into its own site-packages and the commands run from a temporary
directory. The dependencies are not downloaded again: a ``.pth`` file points
at the site-packages of the interpreter running the tests, after the wheel's
own, and those hold secure_afl's metadata at most, never the package itself
(an editable install's import hook lives in a ``.pth`` there, which a path
added this way does not run; the test checks what was imported all the same).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.wheel]

from support.sourcetree import REPO, main_roots, separate_roots

TOOLS_PACKAGE = "secure_afl_tools"
# What a demo-only installation (`make demo`) lacks; the demo must never import them.
EXTRAS_ONLY = ("torch", "torchvision", "flwr", "PIL", "matplotlib")

# Installed into the fresh environment: hides EXTRAS_ONLY from every process that has
# SECURE_AFL_TEST_HIDE set (the demo and the server process it starts).
_HIDE = '''
import os, sys
_hidden = tuple(filter(None, os.environ.get("SECURE_AFL_TEST_HIDE", "").split(",")))
class _Hide:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _hidden:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden: not installed by make demo)", name=name)
if _hidden:
    sys.meta_path.insert(0, _Hide())
'''


def _source_modules(roots: dict[str, str]) -> set[str]:
    """Every module of the source tree under ``roots`` (folder -> package), under its installed name."""
    out = set()
    for root, pkg in roots.items():
        for f in (REPO / root).rglob("*.py"):
            parts = f.relative_to(REPO / root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.add(".".join((pkg, *parts)))
    return out


def _build(src: Path, out: Path, name: str) -> Path:
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(out), str(src)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    # the build backend's own warnings (a deprecated field, a package left out of the list), not pip's
    warnings = [line for line in (build.stdout + build.stderr).splitlines() if re.search(r"[A-Za-z]+Warning\b", line)]
    assert not warnings, "\n".join(warnings)
    (wheel,) = out.glob(f"{name}-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """The party's wheel (secure_afl) and the tools' wheel (secure_afl_tools), built from a clean copy."""
    root = tmp_path_factory.mktemp("wheels")
    # from a copy without build outputs: setuptools would otherwise ship whatever a stale build/ holds
    src = root / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                                               "__pycache__", ".hypothesis", ".pytest_cache"))
    return {"secure_afl": _build(src, root / "dist", "secure_afl"),
            "secure_afl_tools": _build(src / "tools", root / "dist-tools", "secure_afl_tools")}


def _environment(root: Path, wheels: list[Path]):
    """(python, bin dir, cwd, env) of a fresh virtual environment holding only ``wheels``."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    deps = [p for p in dict.fromkeys(site.getsitepackages() + [p for p in sys.path if p.endswith("site-packages")])
            if Path(p).is_dir()]
    (purelib / "_test_dependencies.pth").write_text("\n".join(deps) + "\n")
    (purelib / "sitecustomize.py").write_text(_HIDE)
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps",
                              *map(str, wheels)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

    cwd = root / "run"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "SECURE_AFL_TEST_HIDE")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    return py, venv / "bin", cwd, env


@pytest.fixture(scope="module")
def wheel_env(wheels, tmp_path_factory):
    """A hospital's installation: the party's wheel alone."""
    return _environment(tmp_path_factory.mktemp("party"), [wheels["secure_afl"]])


@pytest.fixture(scope="module")
def tools_env(wheels, tmp_path_factory):
    """A demo or benchmark machine: the party's wheel and the tools' wheel."""
    return _environment(tmp_path_factory.mktemp("tools"), [wheels["secure_afl"], wheels["secure_afl_tools"]])


def _installed_modules(env) -> dict:
    py, _, cwd, environ = env
    code = """
import importlib, json, pkgutil, sys
names = []
for top in ("secure_afl", "secure_afl_tools"):  # the party's package and, where installed, the tools' own
    try:
        pkg = importlib.import_module(top)
    except ModuleNotFoundError:
        continue
    names += [top] + [m.name for m in pkgutil.walk_packages(pkg.__path__, top + ".")]
files = {n: importlib.import_module(n).__file__ for n in names}
print(json.dumps({"files": files, "path": sys.path,
                  "finders": [type(f).__module__ for f in sys.meta_path]}))
"""
    out = subprocess.run([str(py), "-c", code], cwd=cwd, env=environ, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-5000:]
    got = json.loads(out.stdout.splitlines()[-1])
    venv = py.parent.parent
    outside = {n: f for n, f in got["files"].items() if not Path(f).is_relative_to(venv)}
    assert not outside, outside
    assert not any(Path(p).resolve() == REPO for p in got["path"] if p)
    assert not any("editable" in f for f in got["finders"])
    return got["files"]


def test_every_module_imports_from_the_installed_wheel(wheel_env):
    # discovery left nothing out, and added nothing: in particular no tool
    assert set(_installed_modules(wheel_env)) == _source_modules(main_roots())


def test_the_party_wheel_carries_no_tool_and_no_attack(wheels):
    import zipfile

    names = zipfile.ZipFile(wheels["secure_afl"]).namelist()
    tools = [n for n in names if n.startswith("secure_afl_tools/") or "attack" in n.rpartition("/")[2]]
    assert not tools, tools
    assert "secure_afl/cli/__init__.py" in names and "secure_afl/transport/tls_client.py" in names
    # the tools' wheel holds the tools only: secure_afl itself comes from the party's wheel
    extra = [n for n in zipfile.ZipFile(wheels["secure_afl_tools"]).namelist()
             if not n.startswith(("secure_afl_tools/", "secure_afl_tools-"))]
    assert not extra, extra


def test_a_tools_command_in_the_party_install_says_how_to_install_the_tools(wheel_env):
    _, bin_dir, cwd, env = wheel_env
    out = subprocess.run([str(bin_dir / "secure-afl"), "demo", "--backend", "plain"], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 3, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stderr.startswith("secure-afl: error [missing_tools]: ") and len(out.stderr.splitlines()) == 1
    assert "pip install ./tools" in out.stderr


def test_the_tools_wheel_adds_every_tool(tools_env):
    assert set(_installed_modules(tools_env)) == _source_modules({**main_roots(), **separate_roots()})


def test_the_wheel_ships_the_flower_project_file(wheel_env):
    py, _, cwd, env = wheel_env
    out = subprocess.run([str(py), "-c", "from secure_afl.flower import PROJECT_DIR; "
                                         "print((PROJECT_DIR / 'pyproject.toml').read_text())"],
                         cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout == (REPO / "flower" / "project" / "pyproject.toml").read_text() + "\n"


@pytest.mark.parametrize("backend", ["plain", "ckks", "bfv", "secagg"])
def test_demo_from_the_wheel_without_the_extras(tools_env, backend, tmp_path):
    _, bin_dir, cwd, env = tools_env
    out = subprocess.run([str(bin_dir / "secure-afl"), "demo", "--backend", backend, "--hospitals", "3",
                          "--report", str(tmp_path / "r.json")], cwd=cwd,
                         env={**env, "SECURE_AFL_TEST_HIDE": ",".join(EXTRAS_ONLY)},
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "W: within certified bound" in out.stdout or "W: no bound (C singular at this noise)" in out.stdout
    assert "exceeds bound" not in out.stdout
    assert json.loads((tmp_path / "r.json").read_text())["verification"]["passed"]


def test_an_extras_command_without_its_extra_names_the_extra(wheel_env, tmp_path):
    _, bin_dir, cwd, env = wheel_env
    np.savez(tmp_path / "images.npz", images=np.zeros((2, 8, 8, 3), np.uint8), y=np.array([0, 1]))
    out = subprocess.run([str(bin_dir / "secure-afl"), "client", "embed", "--backbone", "resnet18", "--weights",
                          "random", "--seed", "0", "--npz", str(tmp_path / "images.npz"),
                          "--out", str(tmp_path / "e.npz")], cwd=cwd,
                         env={**env, "SECURE_AFL_TEST_HIDE": ",".join(EXTRAS_ONLY)},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 3, out.stdout[-3000:] + out.stderr[-3000:]
    assert "secure-afl: error [missing_extra]: " in out.stderr and "pip install 'secure-afl[embed]'" in out.stderr
