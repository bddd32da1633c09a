"""``secure-afl audit report``: after the chain check of ``audit verify`` (:mod:`secure_afl.audit_verify`), the
page an auditor keeps (``audit report LOG --pki PKI --head HEAD --out report.html``,
:mod:`secure_afl.audit_report`)."""

from __future__ import annotations

import time
from pathlib import Path

from secure_afl import pki
from secure_afl.audit_report import render_report, session_facts
from secure_afl.audit_verify import load_receipts, verify_log
from secure_afl.encoding import parse_json
from secure_afl.exceptions import InvalidInputError
from secure_afl.session.definition import guarantee_lines, split_soundness

__all__ = ["add_report"]


def _cmd_report(args) -> int:
    from secure_afl.session.signed import load_signed

    from secure_afl._io import place_new, refuse_existing

    out = Path(args.out)
    refuse_existing(out, "--out")  # an earlier page (perhaps of another session) is never replaced
    if args.model is not None and not Path(args.model).is_file():
        raise InvalidInputError(f"--model {args.model}: no such file", reason="file_not_found")
    # the same verification as `audit verify`: a log that does not verify gets no report (BROKEN, exit 7)
    server_pub = pki.pinned_identity(args.pki, "server", args.server)
    head, countersign, keyholder_pub = args.head, None, None
    if ":" not in head or Path(head).exists():
        head = parse_json(Path(args.head).read_bytes(), f"head file {args.head}")
        if isinstance(head, dict) and isinstance(head.get("countersign"), dict):
            countersign = head["countersign"]
            keyholder_pub = pki.pinned_identity(args.pki, "keyholder", countersign.get("keyholder"))
    receipts = load_receipts(args.receipts) if args.receipts else []
    result = verify_log(args.log, server_pub=server_pub, head=head, receipts=receipts, countersign=countersign,
                        keyholder_pub=keyholder_pub, session=args.session)
    if len(result.sessions) != 1:
        raise InvalidInputError(f"{args.log} records {len(result.sessions)} sessions; a report is of one")
    definition = load_signed(args.pki, result.sessions[0])
    report = _release_report(args.release, definition.session_id) if args.release else None
    # the same lines `session sign` printed, and split's soundness, from the signed definition alone
    bits = split_soundness(definition.session_params())[0] if definition.backend == "split" else None
    facts = session_facts(args.log, result, definition, report=report,
                          guarantees=[line for _, line in guarantee_lines(definition)], soundness_bits=bits,
                          model_path=args.model)
    page = render_report(facts, generated=time.time())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    place_new(tmp, out, "--out")
    print(f"{result.summary()}\nreport of session {definition.session_id} -> {out} ({len(page)} bytes, "
          "self-contained: open it in any browser, offline)")
    if definition.backend == "split":
        from secure_afl.session.definition import split_validity

        print(f"validity: {split_validity(definition)}")
    return 0


def _release_report(path, session_id: str) -> dict:
    """The key holder's report as the page reads it, or :class:`InvalidInputError` (``malformed``) naming the
    first field the page formats as a number that is not one: a hand-edited or truncated report is refused
    before any page is written, never an internal error half-way through."""
    report = parse_json(Path(path).read_bytes(), f"release report {path}")
    if not isinstance(report, dict) or report.get("session_id") not in (None, session_id):
        raise InvalidInputError(f"{path} is not the release report of session {session_id}")

    def bad(field: str, value, what: str = "a number"):
        return InvalidInputError(f"{path}: the release report's {field} is {str(value)[:60]!r}, not {what}; "
                                 "give the report `keyholder finalize --report` wrote", reason="malformed")

    def number(field: str, value) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad(field, value)

    bound = report.get("w_error_bound")
    if bound is not None and not isinstance(bound, dict):
        raise bad("w_error_bound", bound, "an object")
    if bound and bound.get("applies"):
        for k in ("rel_bound", "condition_number"):
            number(f"w_error_bound.{k}", bound.get(k))
    dp = report.get("dp")
    if dp:
        if not isinstance(dp, dict):
            raise bad("dp", dp, "an object")
        for k in ("epsilon", "delta") + (("epsilon_composed",) if "epsilon_composed" in dp else ()):
            number(f"dp.{k}", dp.get(k))
    counts = report.get("class_counts")
    if counts is not None:
        if not isinstance(counts, list):
            raise bad("class_counts", counts, "a list of numbers")
        for i, c in enumerate(counts):
            number(f"class_counts[{i}]", c)
    return report


def add_report(sub) -> None:
    """Add ``audit report`` to the ``audit`` subcommand table ``sub`` (:mod:`secure_afl.cli.audit_commands`)."""
    p = sub.add_parser("report", help="verify an audit log as `audit verify` does, then write one self-contained "
                                      "HTML page an auditor keeps")
    p.add_argument("log", help="audit log (JSON Lines)")
    p.add_argument("--pki", required=True, help="consortium PKI directory or a party's PKI bundle")
    p.add_argument("--server", default=None, help="server name in the PKI (default: the only one)")
    p.add_argument("--head", required=True, help="the expected head, as for `audit verify` (the key holder's "
                                                 "countersigned audit-head.json)")
    p.add_argument("--receipts", default=None, help="receipts to check against the log, as for `audit verify`")
    p.add_argument("--session", default=None, help="the session you mean (default: the one the log records)")
    p.add_argument("--release", default=None, metavar="REPORT.json",
                   help="the key holder's release report (`keyholder finalize --report`): W's bound, DP, counts")
    p.add_argument("--model", default=None, metavar="MODEL.safetensors",
                   help="the model file delivered with the release: its sha256 goes on the page")
    p.add_argument("--out", required=True, help="the HTML file to create (never an existing one)")
    p.set_defaults(func=_cmd_report)
