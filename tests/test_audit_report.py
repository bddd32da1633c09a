"""`secure-afl audit report`: the auditor's HTML page of a real split session, rendered in headless Chromium.

The session: six roster hospitals, four honest uploads, one cheat the key holder refuses at the release (the
log keeps its evidence), one silent. The page must load offline in a real browser (a screenshot and a DOM
dump), show each hospital's fate, the guarantees, the release and both plots, and fetch nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support.sessions import cheating_upload, honest_upload, open_split_session

pytestmark = pytest.mark.e2e

HOSPITALS = ("h1", "h2", "h3", "h4", "h5", "h6")


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("no chromium on this machine (Debian's package `chromium`; .ci/run installs it)")
    return exe


def _browser(exe: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    # a throwaway profile, no sandbox (containers run as root), nothing but the file itself; tall enough for
    # the whole page (the signed guarantees take a line each)
    return subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--user-data-dir={cwd / 'profile'}", "--window-size=1100,3200", *args],
                          capture_output=True, text=True, timeout=180, cwd=cwd)


@pytest.fixture
def released_session(consortium, tmp_path):
    c, conn = open_split_session(consortium, HOSPITALS)
    for i, h in enumerate(("h1", "h2", "h4", "h5")):
        honest_upload(c, h, i + 1)
    cheating_upload(c, "h3", 3)
    res = c.keyholder.finalize(conn, min_clients=2)
    conn.close()
    (tmp_path / "report.json").write_text(json.dumps(res.report, default=float))
    return c, res


def test_the_audit_report_renders_offline_in_chromium_and_shows_each_hospitals_fate(released_session, tmp_path):
    exe = _chromium()
    c, res = released_session
    head = c.root / "keys" / f"{c.session_id}.audit-head.json"
    page = tmp_path / "report.html"

    # Execute: the auditor's command, then the page in a real browser (screenshot and DOM)
    made = subprocess.run([sys.executable, "-m", "secure_afl.cli", "audit", "report", str(c.audit_path()),
                           "--pki", str(c.pki_dir), "--head", str(head), "--release", str(tmp_path / "report.json"),
                           "--out", str(page)], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items()})
    assert made.returncode == 0, made.stderr
    shot = _browser(exe, f"--screenshot={tmp_path / 'report.png'}", page.as_uri(), cwd=tmp_path)
    dom = _browser(exe, "--dump-dom", page.as_uri(), cwd=tmp_path)

    # Assert: the page loaded (a failed load dumps Chromium's error page, not ours) ...
    assert shot.returncode == 0 and dom.returncode == 0, shot.stderr[-2000:] + dom.stderr[-2000:]
    d = dom.stdout
    assert f"<h1>Audit report: session {c.session_id} (split)</h1>" in d, d[:2000]
    # ... fetches nothing: no script, stylesheet, image or frame from anywhere, and a policy forbidding it
    text = page.read_text()
    assert not re.search(r"<(script|link|img|iframe|object|embed)\b", text, re.I)
    assert not re.search(r"\b(src|href)\s*=", text, re.I) and "url(" not in text
    assert "default-src 'none'" in text
    # the chain verified, the signed guarantees, each hospital's fate with the refusal's evidence
    assert re.search(r'id="verdict">OK: session t-split: \d+ records', d)
    assert "may drop out, go silent or be refused and session t-split still releases" in d
    fates = dict(re.findall(r'<tr data-hospital="(h\d)"><td>h\d</td><td class="fate"[^>]*>([a-z ]+)</td>', d))
    assert fates == {"h1": "released", "h2": "released", "h3": "refused", "h4": "released", "h5": "released",
                     "h6": "silent"}
    row = re.search(r'<tr data-hospital="h3">.*?</tr>', d).group(0)
    assert "check linear failed" in row and "keyholder:keyholder" in row and "log record" in row
    # the release: W's certified bound from the key holder's report, no DP, the proofs' soundness
    assert f"{res.report['w_error_bound']['rel_bound']:.3e}" in d and "within certified bound" in d
    assert "none: the release is the exact aggregate" in d and "2^-" in d
    # the plots: one dot per accepted upload, a cross for the refusal, one bar per class with the released count
    timeline = re.search(r'<svg[^>]*id="timeline".*?</svg>', d, re.S).group(0)
    assert timeline.count('class="upload"') == 5 and timeline.count('class="refusal"') == 1
    bars = re.search(r'<svg[^>]*id="class-counts".*?</svg>', d, re.S).group(0)
    assert bars.count('class="bar"') == c.classes
    assert [int(n) for n in re.findall(r">(\d+)</text>", bars)] == [int(n) for n in res.report["class_counts"]]
    # the screenshot is the page drawn: the released green, the refused red and the bars' purple are on it
    from PIL import Image

    img = np.asarray(Image.open(tmp_path / "report.png").convert("RGB")).reshape(-1, 3)
    colours = {tuple(p) for p in np.unique(img, axis=0)}
    for rgb in ((0x2e, 0x7d, 0x32), (0xc6, 0x28, 0x28), (0x5e, 0x35, 0xb1)):
        assert rgb in colours, rgb


def test_a_log_that_does_not_verify_gets_no_report(released_session, tmp_path):
    # Prepare: one record of the verified log altered
    c, _ = released_session
    log = tmp_path / "audit.jsonl"
    lines = c.audit_path().read_text().splitlines()
    rec = json.loads(lines[2])
    rec["actor"] = "h6"  # the upload claimed for another hospital
    lines[2] = json.dumps(rec)
    log.write_text("\n".join(lines) + "\n")
    page = tmp_path / "report.html"

    # Execute
    out = subprocess.run([sys.executable, "-m", "secure_afl.cli", "audit", "report", str(log), "--pki",
                          str(c.pki_dir), "--head", str(c.root / "keys" / f"{c.session_id}.audit-head.json"),
                          "--out", str(page)], capture_output=True, text=True, timeout=300)

    # Assert: refused as `audit verify` refuses it (a security check: exit 7), and no page written
    assert out.returncode == 7, out.stdout + out.stderr
    assert not page.exists()


def test_the_page_ties_the_model_file_counts_uploads_and_explains_the_records_after_the_head(released_session,
                                                                                              tmp_path):
    # Prepare: the released model as the key holder delivers it, and the auditor's inputs
    import hashlib

    from secure_afl.model_file import model_metadata, write_model

    c, res = released_session
    model = tmp_path / "model.safetensors"
    write_model(model, res.W, model_metadata(res.params, res.report, 0.0))
    head = c.root / "keys" / f"{c.session_id}.audit-head.json"
    page = tmp_path / "page.html"
    args = [sys.executable, "-m", "secure_afl.cli", "audit", "report", str(c.audit_path()), "--pki", str(c.pki_dir),
            "--head", str(head), "--release", str(tmp_path / "report.json"), "--model", str(model)]

    # Execute: the page, then the same command onto the page it wrote
    made = subprocess.run([*args, "--out", str(page)], capture_output=True, text=True, timeout=300)
    again = subprocess.run([*args, "--out", str(page)], capture_output=True, text=True, timeout=300)

    # Assert: the model's sha256; uploads counted as uploads; the records after the head explained; the bounds
    # as a table; no noise wording for split, which adds none; the page is not replaced by the second run
    assert made.returncode == 0, made.stderr
    text = page.read_text()
    assert hashlib.sha256(model.read_bytes()).hexdigest() in text
    assert "<th>uploads</th><td class=\"mono\">5 accepted, 0 refused</td>" in text
    assert "records after the head" in text and "(the release the key holder countersigned)" in text
    assert re.search(r'<table id="bounds"><tr><th>bound</th><th>value</th></tr><tr><td>k_max</td>', text)
    assert "at this noise" not in text
    assert again.returncode == 3 and "[output_exists]" in again.stderr and page.read_text() == text
