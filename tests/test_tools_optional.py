"""The tools are their own distribution: without them every party's command still runs, and each tools
command ends with one line saying how to install them (the console script in a hospital's install)."""

from __future__ import annotations

import sys

import pytest

import secure_afl
from secure_afl.cli import COMMANDS, TOOLS_PACKAGE, main
from secure_afl.exceptions import EXIT_INPUT

TOOLS_COMMANDS = [name for name, _, module in COMMANDS if module.startswith(TOOLS_PACKAGE + ".")]


class _NoTools:
    """An installation without secure-afl-tools, as the import system sees it: the package is not found."""

    def find_spec(self, name, path=None, target=None):
        if name == TOOLS_PACKAGE or name.startswith(TOOLS_PACKAGE + "."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


@pytest.fixture
def without_tools(monkeypatch):
    for name in [n for n in sys.modules if n == TOOLS_PACKAGE or n.startswith(TOOLS_PACKAGE + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delattr(secure_afl, "tools", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_NoTools(), *sys.meta_path])


def test_the_tools_commands_are_the_ones_the_docs_name():
    assert sorted(TOOLS_COMMANDS) == ["attack", "bench", "compare", "demo", "reproduce"]


@pytest.mark.parametrize("command", TOOLS_COMMANDS)
def test_a_tools_command_without_the_tools_says_how_to_install_them(without_tools, command, capsys):
    assert main([command]) == EXIT_INPUT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("secure-afl: error [missing_tools]: ") and "pip install ./tools" in lines[0]
    assert f"`secure-afl {command}`" in lines[0]


def test_a_party_command_runs_without_the_tools(without_tools, capsys):
    assert main(["session", "reference"]) == 0
    assert capsys.readouterr().out.startswith("# session.toml reference")
