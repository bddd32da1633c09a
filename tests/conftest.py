"""Shared test helpers.

``json_parametrize`` loads known-answer vectors from ``vectors/`` (pyca's
``@json_parametrize(("secret", "now", ...), "generate.json")`` style). A
vector file is either a list of cases or ``{"provenance": {...}, "vectors": [...]}``.
"""

from __future__ import annotations

import faulthandler
import json
import sys
from pathlib import Path

import pytest

VECTORS = Path(__file__).resolve().parent.parent / "vectors"


def load_vectors(filename: str) -> list[dict]:
    data = json.loads((VECTORS / filename).read_text())
    return data["vectors"] if isinstance(data, dict) else data


def json_parametrize(keys, filename: str):
    """``pytest.mark.parametrize`` over the cases of ``vectors/<filename>`` (missing keys -> None)."""
    if isinstance(keys, str):
        keys = tuple(k.strip() for k in keys.split(","))
    cases = load_vectors(filename)
    ids = [str(c.get("name", i)) for i, c in enumerate(cases)]
    return pytest.mark.parametrize(keys, [tuple(c.get(k) for k in keys) for c in cases], ids=ids)


@pytest.fixture
def consortium(tmp_path):
    """Make consortia (server, key holder, hospitals on 127.0.0.1) for one test; all stopped at its end."""
    from service_helpers import Consortium

    made = []

    def make(**kw):
        c = Consortium(tmp_path / f"c{len(made)}", **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


def pytest_unconfigure(config):
    """After the last test: if the interpreter has not exited 180 s later, print every thread's stack and exit 1.

    A thread left running (a queue's feeder, a server that was not stopped)
    otherwise holds the interpreter at exit until CI kills the whole job, with
    no sign of which one it was.
    """
    faulthandler.dump_traceback_later(180, exit=True, file=sys.stderr)
