"""The auditor's document: one self-contained HTML page of a verified session.

``secure-afl audit report LOG --pki PKI --head HEAD --out report.html`` verifies
the log as ``audit verify`` does and, only if it verifies, writes what an
auditor keeps: the chain's verification, the signed session and the
guarantees it prints, each roster hospital's fate (uploaded, released,
refused with the evidence the log holds, silent), the release (W's certified
bound, differential privacy, the validity proofs' soundness), a timeline of
the uploads and the released per-class counts (aggregate only).

The page loads nothing: no script, no stylesheet or font from elsewhere, the
plots are inline SVG, and a Content-Security-Policy forbids any fetch, so it
shows the same thing offline in ten years. Everything on it is escaped text
from the verified log, the CA-signed definition and the key holder's report.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import html
import json
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SessionFacts", "session_facts", "render_report"]

_COLOURS = {"released": "#2e7d32", "uploaded": "#1565c0", "refused": "#c62828", "silent": "#757575",
            "left out": "#ef6c00"}
#: the page's one style block; the policy admits it by its hash and nothing else: no style attribute, no other
#: block, so text that escaped its escaping could still not restyle or hide the table of each hospital's fate
_STYLE = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;color:#222;line-height:1.4}"
          "h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.2em;border-bottom:1px solid #ccc;margin-top:1.6em}"
          "table{border-collapse:collapse;width:100%}td,th{border:1px solid #ddd;padding:.3em .5em;"
          "text-align:left;vertical-align:top;font-size:.92em}th{background:#f3f3f3;width:14em}"
          ".ok{background:#e8f5e9;border:1px solid #2e7d32;padding:.6em;border-radius:4px}"
          ".fate{font-weight:bold}.mono{font-family:monospace;font-size:.85em;word-break:break-all}"
          "ul.g li{margin:.3em 0}.small{color:#666;font-size:.85em}"
          + "".join(f'td[data-fate="{k}"]{{color:{c}}}' for k, c in _COLOURS.items()))
_CSP = ("default-src 'none'; style-src 'sha256-"
        + base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode() + "'; img-src data:")


@dataclass
class SessionFacts:
    """What the page shows, read from the verified log, the signed definition and the release report."""

    session_id: str
    backend: str
    verification: str
    head_seq: int
    head_hash: str
    countersigned_by: str | None
    log_sha256: str
    definition: dict
    guarantees: list[str]
    roster: list[str]
    created: float | None
    uploads: list[tuple[str, float, str]] = field(default_factory=list)  # (hospital, time, payload sha256)
    refused_uploads: list[tuple[str, float, str, str]] = field(default_factory=list)  # (actor, time, reason, msg)
    verdicts: dict[str, dict] = field(default_factory=dict)  # hospital -> the key holder's refusal record
    participants: list[str] | None = None
    release_time: float | None = None
    aggregate_sha256: str | None = None
    report: dict | None = None
    soundness_bits: float | None = None
    n_records: int = 0
    #: sha256 of the model file the auditor was handed (``audit report --model``), tying it to this page
    model_sha256: str | None = None
    model_path: str | None = None


def _ts(rec: dict) -> float | None:
    t = rec.get("time")
    if not isinstance(t, str):
        return None
    try:
        return _dt.datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def session_facts(log_path, verification, definition, *, report: dict | None = None,
                  guarantees: list[str] | None = None, soundness_bits: float | None = None,
                  model_path=None) -> SessionFacts:
    """Collect the facts of a log that :func:`secure_afl.audit_verify.verify_log` has verified (and, given
    ``model_path``, the sha256 of the model file delivered with it)."""
    data = Path(log_path).read_bytes()
    records = [json.loads(line) for line in data.splitlines() if line.strip()]
    body = dict(definition.body)
    roster = sorted(body.get("hospitals") or [])
    f = SessionFacts(session_id=body["id"], backend=body["backend"], verification=verification.summary(),
                     head_seq=verification.head_seq, head_hash=verification.head_hash,
                     countersigned_by=verification.countersigned_by,
                     log_sha256=hashlib.sha256(data).hexdigest(), definition=body, guarantees=list(guarantees or []),
                     roster=roster, created=None, report=report, soundness_bits=soundness_bits,
                     n_records=len(records))
    if model_path is not None:
        f.model_path = str(model_path)
        f.model_sha256 = hashlib.sha256(Path(model_path).read_bytes()).hexdigest()
    for rec in records:
        ev, actor, t, d = rec.get("event"), str(rec.get("actor")), _ts(rec), rec.get("details") or {}
        if ev == "session_created" and f.created is None:
            f.created = t
        elif ev == "upload" and rec.get("outcome") == "accepted":
            f.uploads.append((actor, t, str(d.get("payload_sha256", ""))))
        elif ev == "upload" and rec.get("outcome") == "refused":
            f.refused_uploads.append((actor, t, str(rec.get("reason")), str(d.get("message", ""))))
        elif ev == "split_validity" and rec.get("outcome") == "refused":
            f.verdicts[actor.partition(":")[2] or actor] = {**d, "seq": rec.get("seq"), "time": t}
        elif ev == "release" and rec.get("outcome") == "accepted":
            f.release_time, f.aggregate_sha256 = t, d.get("aggregate_sha256")
            f.participants = list(d.get("participants") or [])
    if report is not None and report.get("participants") is not None:
        f.participants = list(report["participants"])  # the key holder's cohort, refusals taken out
    return f


# -- rendering ---------------------------------------------------------------------------------------------
def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _fates(f: SessionFacts) -> list[tuple[str, str, str]]:
    """(hospital, fate, detail) for every roster hospital, in roster order."""
    uploaded = {h: (t, sha) for h, t, sha in f.uploads}
    refused_at_upload: dict[str, tuple] = {}
    for actor, t, reason, msg in f.refused_uploads:
        if actor in f.roster:
            refused_at_upload[actor] = (t, reason, msg)
    rows = []
    for h in f.roster:
        if h in f.verdicts:
            v = f.verdicts[h]
            msg = v.get("keyholder_message")
            evidence = (f"check {v.get('check')} failed ({v.get('attribution', 'refused')}), decided by "
                        f"{v.get('by')}; log record {v.get('seq')}"
                        + (f", the key holder's message in it sha256 "
                           f"{hashlib.sha256(str(msg).encode()).hexdigest()[:16]}…" if msg else ""))
            rows.append((h, "refused", evidence))
        elif h in uploaded and (f.participants is None or h in f.participants):
            t, sha = uploaded[h]
            fate = "released" if f.participants is not None else "uploaded"
            rows.append((h, fate, f"uploaded {_when(t)}, payload sha256 {sha[:16]}…"))
        elif h in uploaded:
            t, sha = uploaded[h]
            rows.append((h, "left out", f"uploaded {_when(t)} but not in the release"))
        elif h in refused_at_upload:
            t, reason, msg = refused_at_upload[h]
            rows.append((h, "refused", f"upload refused by the server at {_when(t)}: {reason}: {msg}"))
        else:
            rows.append((h, "silent", "no upload in the log"))
    return rows


def _timeline_svg(f: SessionFacts) -> str:
    """One row per roster hospital; a dot at each accepted upload, a cross at each refusal, the release as a
    vertical line; seconds from the session's creation."""
    events = [(h, t, "ok") for h, t, _ in f.uploads if t is not None]
    events += [(a, t, "no") for a, t, _, _ in f.refused_uploads if t is not None and a in f.roster]
    events += [(h, v["time"], "no") for h, v in f.verdicts.items() if v.get("time") is not None]
    t0 = f.created if f.created is not None else min((t for _, t, _ in events), default=0.0)
    t1 = max([t for _, t, _ in events] + ([f.release_time] if f.release_time else []) + [t0 + 1e-3])
    span = max(t1 - t0, 1e-3)
    W, left, right, row = 720, 90, 20, 22
    H = 40 + row * max(len(f.roster), 1) + 30
    x = lambda t: left + (t - t0) / span * (W - left - right)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img" '
           f'aria-label="timeline of the uploads" id="timeline">']
    out.append(f'<rect x="0" y="0" width="{W}" height="{H}" fill="#fafafa"/>')
    ys = {h: 30 + i * row for i, h in enumerate(f.roster)}
    for h, y in ys.items():
        out.append(f'<text x="{left - 8}" y="{y + 4}" font-size="12" text-anchor="end">{_e(h)}</text>')
        out.append(f'<line x1="{left}" y1="{y}" x2="{W - right}" y2="{y}" stroke="#ddd"/>')
    axis_y = 30 + row * max(len(f.roster), 1)
    out.append(f'<line x1="{left}" y1="{axis_y}" x2="{W - right}" y2="{axis_y}" stroke="#333"/>')
    for k in range(5):
        t = t0 + span * k / 4
        out.append(f'<text x="{x(t):.1f}" y="{axis_y + 16}" font-size="11" text-anchor="middle">'
                   f'{t - t0:.1f} s</text>')
    if f.release_time is not None:
        xr = x(f.release_time)
        out.append(f'<line x1="{xr:.1f}" y1="18" x2="{xr:.1f}" y2="{axis_y}" stroke="#2e7d32" '
                   'stroke-dasharray="4 3"/>')
        out.append(f'<text x="{xr - 4:.1f}" y="14" font-size="11" text-anchor="end" fill="#2e7d32">release</text>')
    for h, t, kind in events:
        if h not in ys:
            continue
        cx, cy = x(t), ys[h]
        if kind == "ok":
            out.append(f'<circle class="upload" cx="{cx:.1f}" cy="{cy}" r="5" fill="#1565c0">'
                       f'<title>{_e(h)} uploaded at {_e(_when(t))}</title></circle>')
        else:
            out.append(f'<path class="refusal" d="M{cx - 5:.1f},{cy - 5} l10,10 m0,-10 l-10,10" stroke="#c62828" '
                       f'stroke-width="2.5"><title>{_e(h)} refused at {_e(_when(t))}</title></path>')
    out.append("</svg>")
    return "".join(out)


def _counts_svg(names: list[str], counts: list[float]) -> str:
    W, left, top, bar = 720, 140, 10, 24
    H = top + bar * len(counts) + 20
    peak = max(max(counts, default=0), 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img" '
           f'aria-label="released per-class counts" id="class-counts">']
    for i, (name, n) in enumerate(zip(names, counts)):
        y = top + i * bar
        w = (W - left - 80) * n / peak
        out.append(f'<text x="{left - 8}" y="{y + 15}" font-size="12" text-anchor="end">{_e(name)}</text>')
        out.append(f'<rect class="bar" x="{left}" y="{y + 3}" width="{w:.1f}" height="{bar - 8}" fill="#5e35b1"/>')
        out.append(f'<text x="{left + w + 6:.1f}" y="{y + 15}" font-size="12">{n:g}</text>')
    out.append("</svg>")
    return "".join(out)


def _release_rows(f: SessionFacts) -> list[tuple[str, str]]:
    released = f.release_time is not None or f.aggregate_sha256 is not None
    rows = [("released", _when(f.release_time) if released else "not released in this log")]
    if f.aggregate_sha256:
        rows.append(("aggregate sha256", f.aggregate_sha256))
    rows.append(("model file sha256", f"{f.model_sha256} ({Path(f.model_path).name})" if f.model_sha256 else
                 "not given (--model MODEL.safetensors adds the delivered model file's sha256 to this page)"))
    r = f.report
    if r is None:
        rows.append(("key holder's report", "not given (--release REPORT.json adds W's bound, DP and the counts)"))
    else:
        rows.append(("contributors, samples", f"{r.get('contributors')} hospitals, {r.get('samples')} samples"))
        b = r.get("w_error_bound") or {}
        if b.get("applies"):
            rows.append(("W's certified bound", f"{b.get('verdict')}: ||W - W*|| / ||W*|| <= {b.get('rel_bound'):.3e} "
                                                f"(W* = {b.get('solution')} of the exact sums, condition number "
                                                f"{b.get('condition_number'):.3g})"))
        else:
            from secure_afl.certify import verdict_text

            # "at this noise" only where the release added noise (ckks flooding, DP); exact backends add none
            noisy = bool(r.get("flood_sigma") or r.get("dp"))
            rows.append(("W's certified bound", verdict_text(str(b.get("verdict") or r.get("verdict") or "none"),
                                                             f.backend, noisy)))
        dp = r.get("dp")
        rows.append(("differential privacy",
                     f"epsilon {dp['epsilon']:.4g} at delta {dp['delta']:g} ({dp.get('mechanism')} noise), "
                     f"{dp.get('epsilon_composed', dp['epsilon']):.4g} composed" if dp else
                     "none: the release is the exact aggregate"))
    if f.soundness_bits is not None:
        rows.append(("validity proofs' soundness",
                     f"an invalid upload passes with probability at most 2^-{f.soundness_bits:.1f} "
                     "(a prover making 2^64 hash queries)"))
    return rows


def render_report(f: SessionFacts, *, generated: float | None = None) -> str:
    """The page, as one string of HTML."""
    fates = _fates(f)
    tally = {k: sum(1 for _, fate, _ in fates if fate == k) for k in _COLOURS}
    b = f.definition
    session_rows = [("id", b.get("id")), ("backend", b.get("backend")), ("dimension d, classes C",
                    f"{b.get('dim')}, {b.get('classes')}"), ("min_clients", b.get("min_clients")),
                    ("colluders tolerated", b.get("colluders")), ("max_refusals", b.get("max_refusals")),
                    ("roster", ", ".join(f.roster)),
                    ("deadline", b.get("deadline") or (f"{b['deadline_s']:g} s after the server's first start"
                                                       if b.get("deadline_s") else "none"))]
    if b.get("backend") == "split":
        from secure_afl.session.definition import SessionDefinition, split_validity

        session_rows.append(("validity statement", split_validity(SessionDefinition(b))))
    if b.get("extractor"):
        ex = b["extractor"]
        session_rows.append(("feature extractor", f"{ex.get('backbone')} {ex.get('weights')}, {ex.get('preset')}, "
                                                  f"normalisation {ex.get('normalisation')}"))
    names = None
    if f.report is not None and f.report.get("class_counts") is not None:
        counts = [float(c) for c in f.report["class_counts"]]
        ex = b.get("extractor") or {}
        names = list(ex.get("classes") or []) if len(ex.get("classes") or []) == len(counts) else \
            [f"class {i}" for i in range(len(counts))]
    p = []
    p.append("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">")
    p.append(f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">')
    p.append(f"<title>Audit report: session {_e(f.session_id)}</title>")
    p.append(f"<style>{_STYLE}</style></head><body>")
    p.append(f"<h1>Audit report: session {_e(f.session_id)} ({_e(f.backend)})</h1>")
    p.append(f'<p class="small">Written {_e(_when(generated))} by <code>secure-afl audit report</code> from a log '
             f"whose chain verified; log sha256 <span class=\"mono\">{_e(f.log_sha256)}</span>.</p>")
    p.append('<h2 id="chain">The chain</h2>')
    p.append(f'<p class="ok" id="verdict">{_e(f.verification)}</p>')
    after = f.n_records - 1 - f.head_seq
    tail = ("none: the head is the log's last record" if after <= 0 else
            f"{after} (records {f.head_seq + 1} to {f.n_records - 1}): written after the head, such as the key "
            "holder's countersignature and later requests; the server's signature on each and the hash chain from "
            "the head cover them, the countersignature does not")
    n_up, n_ref = len(f.uploads), len(f.refused_uploads)
    p.append("<table>" + "".join(f"<tr><th>{_e(k)}</th><td class=\"mono\">{_e(v)}</td></tr>" for k, v in (
        ("records", f"{f.n_records} (every event of the session, not only uploads)"),
        ("uploads", f"{n_up} accepted, {n_ref} refused"),
        ("head record", f"{f.head_seq} (the release the key holder countersigned)"), ("head hash", f.head_hash),
        ("records after the head", tail),
        ("countersigned by", f.countersigned_by or "no countersignature given"))) + "</table>")
    p.append('<h2 id="session">The signed session</h2>')
    p.append("<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in session_rows) + "</table>")
    bounds = b.get("bounds") if isinstance(b.get("bounds"), dict) else {}
    p.append('<p>The signed bounds every upload is checked against:</p><table id="bounds"><tr><th>bound</th>'
             "<th>value</th></tr>" + "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>"
                                             for k, v in sorted(bounds.items())) + "</table>")
    p.append('<p>What the operator signed, as every party pins it (signature checked against the consortium CA):</p>'
             '<ul class="g" id="guarantees">' + "".join(f"<li>{_e(g)}</li>" for g in f.guarantees) + "</ul>")
    p.append('<h2 id="hospitals">Each roster hospital</h2>')
    p.append("<p>" + ", ".join(f"{n} {_e(k)}" for k, n in tally.items() if n) + "</p>")
    p.append('<table id="fates"><tr><th>hospital</th><th>fate</th><th>detail and evidence</th></tr>'
             + "".join(f'<tr data-hospital="{_e(h)}"><td>{_e(h)}</td><td class="fate" data-fate="'
                       f'{_e(fate)}">{_e(fate)}</td><td>{_e(detail)}</td></tr>' for h, fate, detail in fates)
             + "</table>")
    p.append('<h2 id="release">The release</h2>')
    p.append("<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in _release_rows(f))
             + "</table>")
    p.append('<h2 id="plots">Timeline of the uploads</h2>')
    p.append("<p class=\"small\">Seconds from the session's creation; dot: accepted upload, cross: refusal.</p>")
    p.append(_timeline_svg(f))
    p.append("<h2>Released per-class counts</h2>")
    if names is not None:
        p.append("<p class=\"small\">The aggregate's class counts over the released cohort (no hospital's own).</p>")
        p.append(_counts_svg(names, counts))
    else:
        p.append("<p>Not shown: the key holder's report was not given.</p>")
    p.append("</body></html>\n")
    return "".join(p)
