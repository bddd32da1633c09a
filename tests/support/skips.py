"""A security test that skips is a failure, unless the run asked for skips (``--allow-security-skips``).

A threat is closed only by a test that runs: a security test skipped because its extra (torch, flwr, ...)
is missing on some machine would otherwise leave CI green with the threat untested. A module that skips as
a whole at import (``pytest.importorskip`` at its top) is caught too, when it marks its tests ``security``.

Loaded by tests/conftest.py (its hooks are imported there) and, as a plugin (``-p support.skips``), by the
test of this rule.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

OPTION = "--allow-security-skips"
_SECURITY_MARK = re.compile(r"pytest\.mark\.security\b")


def pytest_addoption(parser):
    parser.addoption(OPTION, action="store_true",
                     help="let security-marked tests skip (by default a skipped security test fails the run)")


def _message(where: str, why) -> str:
    reason = why[2] if isinstance(why, tuple) and len(why) == 3 else str(why)
    return (f"security test {where} skipped ({reason}): install what it needs (`make test` installs every "
            f"extra), or pass {OPTION} to skip it on purpose")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if (rep.skipped and not hasattr(rep, "wasxfail") and item.get_closest_marker("security") is not None
            and not item.config.getoption(OPTION)):
        rep.outcome = "failed"
        rep.longrepr = _message(item.nodeid, rep.longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    rep = outcome.get_result()
    if not (rep.skipped and isinstance(collector, pytest.Module)) or collector.config.getoption(OPTION):
        return
    # the module skipped before its marks existed: its source says whether it holds security tests
    if _SECURITY_MARK.search(Path(collector.path).read_text(errors="replace")):
        rep.outcome = "failed"
        rep.longrepr = _message(collector.nodeid, rep.longrepr)
