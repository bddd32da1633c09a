"""A security test that skips (its extra missing) fails the run unless skipping was asked for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

_CASES = '''
import pytest

@pytest.mark.security
def test_needs_an_extra():
    pytest.importorskip("no_such_extra_module")

def test_ordinary_skip():
    pytest.skip("not a security test")
'''

_MODULE = '''
import pytest

pytest.importorskip("no_such_extra_module")

@pytest.mark.security
def test_never_collected():
    pass
'''


def _pytest(tmp_path, target, *extra):
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    security: security tests\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "support.skips",
                           "-rfs", str(target), *extra], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.e2e
def test_a_skipped_security_test_fails_unless_skips_are_allowed(tmp_path):
    # Prepare: one security test and one ordinary test that both skip, and a security module that skips whole
    (tmp_path / "test_cases.py").write_text(_CASES)
    (tmp_path / "test_module.py").write_text(_MODULE)

    # Execute
    strict_tests = _pytest(tmp_path, tmp_path / "test_cases.py")
    strict_module = _pytest(tmp_path, tmp_path / "test_module.py")
    allowed = _pytest(tmp_path, tmp_path, "--allow-security-skips")

    # Assert: by default both security skips fail (named, with the way out); the ordinary skip stays a skip
    assert strict_tests.returncode == 1, strict_tests.stdout
    assert "security test test_cases.py::test_needs_an_extra skipped" in strict_tests.stdout
    assert "--allow-security-skips to skip it on purpose" in strict_tests.stdout
    assert "1 failed, 1 skipped" in strict_tests.stdout
    assert strict_module.returncode != 0, strict_module.stdout
    assert "security test test_module.py skipped" in strict_module.stdout
    # asked for: everything skips
    assert allowed.returncode == 0, allowed.stdout
    assert "3 skipped" in allowed.stdout
