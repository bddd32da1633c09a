"""The suite passes on a machine that has never run it: no font cache, no model cache, no user cache.

matplotlib's first import on such a machine lists the installed fonts (``fc-list``) to build its cache; the
suite's rule against one-process tests starting processes must let that probe through, or every plotting
test fails there (and keeps failing: the cache is never written). The check runs a plotting test in a
pytest of its own, under a HOME nobody has used.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.e2e
def test_a_plotting_test_passes_under_an_empty_matplotlib_cache(tmp_path):
    pytest.importorskip("matplotlib")  # the bench extra: `make test` installs it
    # Prepare: a home with nothing in it and no cache variable pointing elsewhere
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "TORCH_HOME", "MPLBACKEND")}
    env["HOME"] = str(home)

    # Execute
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/test_bench.py::test_bench_dp_prints_a_table_and_writes_a_png"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    # Assert: it passed, and it really started from an empty cache (matplotlib built one in the new home)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "1 passed" in out.stdout
    assert list(home.rglob("fontlist-*.json")), "matplotlib did not build its font cache in the empty home"


def test_ci_starts_from_empty_caches():
    """.ci/run points every cache a test could lean on at a directory of its own run."""
    text = (ROOT / ".ci" / "run").read_text()
    exported = text[text.index("export "):text.index("\nmake test")]
    for var in ("HOME", "XDG_CACHE_HOME", "MPLCONFIGDIR", "TORCH_HOME"):
        assert f'{var}="$CI_HOME' in exported, var
    assert 'CI_HOME="$(mktemp -d)"' in text
