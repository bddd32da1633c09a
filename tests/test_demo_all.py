"""`make demo`'s command: the recommended backend first, every stage shown, then every backend side by side."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from secure_afl.cli import main
from secure_afl_tools.demo import ALL_BACKENDS

ROOT = Path(__file__).resolve().parents[1]


def _make_demo_command() -> list[str]:
    """The arguments `make demo` gives `secure-afl`, read from the Makefile."""
    text = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^demo:.*\n\t(.*)$", text, re.M).group(1)
    return recipe.split("secure-afl", 1)[1].split()


@pytest.mark.e2e
@pytest.mark.slow
def test_make_demo_shows_the_exact_backend_first_and_every_backend_side_by_side(tmp_path, capsys):
    # Execute: what `make demo` runs, on three hospitals to keep it short
    rc = main(_make_demo_command() + ["--hospitals", "3", "--partition", "shards:2", "--workdir", str(tmp_path)])

    # Assert: every stage of the recommended exact backend (split) comes first, with its verdict
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    first = out[:out.index("The same hospitals and data through every other backend")]
    assert "[Stage 3] keys: fresh HPKE (ML-KEM-768 + X25519) seed key" in first and "session demo-split-0" in first
    assert "W: within certified bound (W* = C^+ Q)" in first
    # then one table, one row per backend, split first; each exact backend's W error within its certified bound
    table = out[out.index("Every backend on the same 3 hospitals"):].splitlines()
    header = re.split(r"\s{2,}", table[1].strip())
    assert header[:8] == ["backend", "result", "stats vs plaintext", "W error vs plaintext", "plaintext order var.",
                          "certified bound", "bytes / hospital", "session (s)"]
    rows = {line.split()[0]: re.split(r"\s{2,}", line.strip()) for line in table[3:3 + len(ALL_BACKENDS)]}
    assert list(rows) == list(ALL_BACKENDS) and ALL_BACKENDS[0] == "split"
    for backend in ("split", "secagg", "bfv"):
        cells = rows[backend]
        err, bound = float(cells[3]), float(cells[5])
        # exact: the released statistics are the plaintext sums up to what the plaintext's own float64 additions
        # of 3 hospitals round off (a few units in the last place), not to a tolerance
        ulps = cells[2].split()
        assert cells[1] == "exact" and ulps[1] == "ulp" and int(ulps[0]) <= 3 and err <= bound, cells
        assert cells[6].endswith(" MB"), cells
    assert rows["ckks"][1] == "approximate (flooded)" and rows["ckks"][2].endswith(" abs")
    # docs/RUNNING.md's table is this table: the same columns, the same backends and what each guarantees
    doc = (ROOT / "docs" / "RUNNING.md").read_text()
    lines = [ln for ln in doc[doc.index("## What the demo measures"):].splitlines() if ln.startswith("| ")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    assert cells[0] == header, cells[0]
    documented = {c[0]: c for c in cells[1:1 + len(ALL_BACKENDS)]}
    assert list(documented) == list(ALL_BACKENDS)
    assert all(documented[b][1] == rows[b][1] for b in ALL_BACKENDS), documented
