"""What the walkthroughs tell a reader to run, checked where no test runs the lines themselves: the Flower
deployment (tests/test_flower_e2e.py starts it from its own helpers) and the audit head every walkthrough
verifies against."""

from __future__ import annotations

import re
from pathlib import Path

from secure_afl.params import KEYED_BACKENDS

ROOT = Path(__file__).resolve().parents[1]
FLOWER = (ROOT / "docs" / "FLOWER.md").read_text()


def _flower_block() -> list[str]:
    block = re.search(r"```sh\n(export FLWR_HOME.*?)```", FLOWER, re.S).group(1)
    return block.splitlines()


def test_flower_keygen_line_is_for_every_backend_that_has_a_key():
    line = next(ln for ln in _flower_block() if "keyholder keygen" in ln)
    comment = line.partition("#")[2]
    assert all(re.search(rf"\b{b}\b", comment) for b in KEYED_BACKENDS), line


def test_flower_walkthrough_stops_every_process_it_starts():
    lines = _flower_block()
    started = [ln for ln in lines if ln.rstrip().endswith("&") or ln.rstrip().endswith('" &')]
    assert started, "the walkthrough starts its SuperLink and SuperNodes in the background"
    assert lines[-1].startswith("kill $(jobs -p); wait"), lines[-1]


def test_every_walkthrough_audits_against_the_key_holders_countersigned_head():
    heads = []
    for path in (ROOT / "README.md", ROOT / "docs" / "RUNNING.md", ROOT / "docs" / "FLOWER.md"):
        text = path.read_text()
        for m in re.finditer(r"audit verify .*?--head (\S+)", text):
            head = m.group(1)
            if head == "audit-head.json":  # copied in just before: find where from
                copied = re.findall(r"cp (\S+) audit-head\.json", text[:m.start()])
                head = copied[-1] if copied else head
            heads.append((path.name, head))
    walkthroughs = [(n, h) for n, h in heads if "session" in h or "/" in h or h.endswith(".audit-head.json")]
    assert len(walkthroughs) >= 5, heads
    assert all("keyholder/keys/" in h and h.endswith(".audit-head.json") for _, h in walkthroughs), walkthroughs
