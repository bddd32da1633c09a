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
    # the default split session's validity: the Gram statement in Field128, in the session table and the lines
    assert "<th>validity statement</th><td>Gram statement on (field128, exact lanes)</td>" in d
    assert "validity: Gram statement on (field128, exact lanes): every upload proves" in d
    assert "validity: Gram statement on (field128, exact lanes)" in made.stdout
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


_INJECT = ('</td></tr></table><style>#fates{display:none}</style><b id="injected">x</b>'
           '<p style="display:none">hidden</p>')


@pytest.mark.security
def test_text_from_the_log_is_shown_as_text_and_the_policy_admits_only_the_pages_own_style(tmp_path):
    # Prepare: a page whose server-written refusal text, key holder's verdict, verdict line and guarantee each
    # carry markup that would close the table of fates, restyle it and add an element, were it not escaped
    exe = _chromium()
    from secure_afl.audit_report import SessionFacts, render_report

    t0 = 1.7e9
    facts = SessionFacts(session_id="s-esc", backend="plain", verification="OK: " + _INJECT, head_seq=3,
                         head_hash="ab" * 32, countersigned_by=None, log_sha256="cd" * 32,
                         definition={"id": "s-esc", "backend": "plain"}, guarantees=[_INJECT],
                         roster=["h1", "h2", "h3"], created=t0, uploads=[("h1", t0 + 5, "ef" * 32)],
                         refused_uploads=[("h2", t0 + 9, "malformed", _INJECT)],
                         verdicts={"h3": {"check": _INJECT, "by": "keyholder:keyholder", "seq": 7, "time": t0 + 20}})
    page = tmp_path / "page.html"
    page.write_text(render_report(facts, generated=t0 + 30))
    # the same page with markup let through raw, as unescaped text would put it
    raw = tmp_path / "raw.html"
    raw.write_text(page.read_text().replace("</body>", _INJECT + "</body>"))

    # Execute: both pages in a real browser, its console (CSP violations) on stderr
    dom = _browser(exe, "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri(), cwd=tmp_path)
    dom_raw = _browser(exe, "--enable-logging=stderr", "--v=0", "--dump-dom", raw.as_uri(), cwd=tmp_path)

    # Assert: the markup is text on the page: no element, no style block but the page's own, every fate shown
    assert dom.returncode == 0, dom.stderr[-2000:]
    d = dom.stdout
    assert '<b id="injected">' not in d and d.count("<style>") == 1 and "&lt;b id=\"injected\"&gt;" in d
    assert all(f'<tr data-hospital="{h}">' in d for h in ("h1", "h2", "h3"))
    assert re.search(r'<tr data-hospital="h2">.*?&lt;/table&gt;.*?</tr>', d)
    # the policy names its one style block by hash, no 'unsafe-inline', and the browser applied it unblocked
    text = page.read_text()
    assert "'unsafe-inline'" not in text and "style-src 'sha256-" in text
    assert not re.search(r"<[a-z][^<>]*\sstyle=", text)  # no style attribute: the policy would block it
    assert "Content Security Policy" not in dom.stderr, dom.stderr[-2000:]
    # markup that did get through raw could still neither add a style block nor restyle an element
    blocked = [line for line in dom_raw.stderr.splitlines() if "Content Security Policy" in line]
    assert len(blocked) == 2 and all("has been blocked" in line for line in blocked), dom_raw.stderr[-2000:]


def test_a_malformed_release_report_is_refused_by_name_and_no_page_is_written(released_session, tmp_path):
    # Prepare: the key holder's report with one number the page formats replaced, field by field
    c, res = released_session
    head = c.root / "keys" / f"{c.session_id}.audit-head.json"
    good = json.loads((tmp_path / "report.json").read_text())
    cases = {"w_error_bound.rel_bound": lambda r: r["w_error_bound"].update(rel_bound="tiny"),
             "class_counts[1]": lambda r: r.update(class_counts=[1, "many", 3]),
             "w_error_bound": lambda r: r.update(w_error_bound=[1, 2])}
    for field, spoil in cases.items():
        bad = json.loads(json.dumps(good))
        spoil(bad)
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        page = tmp_path / "report.html"
        # Execute
        out = subprocess.run([sys.executable, "-m", "secure_afl.cli", "audit", "report", str(c.audit_path()),
                              "--pki", str(c.pki_dir), "--head", str(head), "--release", str(tmp_path / "bad.json"),
                              "--out", str(page)], capture_output=True, text=True, timeout=300)
        # Assert: one line naming the file and the field, the input exit code (not an internal error); no page
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 3 and len(lines) == 1, (field, out.stderr)
        assert lines[0].startswith("secure-afl: error [malformed]: ") and f"report's {field} is" in lines[0]
        assert "bad.json" in lines[0] and not page.exists()


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
