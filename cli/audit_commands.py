"""``secure-afl audit verify | release | compare | report``.

* ``verify``: the hash-chained audit log, its head and the receipts (:mod:`secure_afl.audit_verify`);
* ``release``: a split release recomputed from what the server holds (its session state directory: the masked
  uploads, the hospitals' signed seed statements, the key holder's signed share statement and share, the
  server-signed masked sum) and the key holder's kept copy of that sum against the model file, naming the party
  at fault (:func:`secure_afl.split_release.audit_release`);
* ``compare``: a model against the plaintext solve of the hospitals' own statistics files
  (:func:`secure_afl.plaintext_compare.compare_with_plaintext`);
* ``report``: after ``verify``'s check, the HTML page an auditor keeps (:mod:`secure_afl.cli.auditor`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from secure_afl import pki
from secure_afl.audit_verify import load_receipts, verify_log
from secure_afl.encoding import parse_json
from secure_afl.exceptions import (EXIT_INPUT, EXIT_REFUSED, EXIT_SECURITY, AuditChainBroken, InvalidInputError, MalformedPayload,
                                   SecureAFLError)

__all__ = ["register"]


def _cmd_release(args) -> int:
    from secure_afl import pki
    from secure_afl.cohort import release_policy
    from secure_afl.model_file import read_model
    from secure_afl.params import SessionParams
    from secure_afl.server.store import Store
    from secure_afl.session.signed import load_signed
    from secure_afl.split_release import audit_release

    state = Path(args.state)
    if not (state / "state.sqlite3").is_file():
        raise InvalidInputError(f"{state} is not a server's session directory (no state.sqlite3)",
                                reason="file_not_found")
    W, meta = read_model(args.model)
    store = Store(state)
    try:
        raw_params, manifest, record = (store.get_meta(k) for k in ("params", "manifest", "split_result"))
        if raw_params is None or manifest is None or record is None:
            raise InvalidInputError(f"{state} holds no split release (no manifest, or the key holder's share was "
                                    "never taken)", reason="no_release")
        params = SessionParams.from_dict(raw_params)
        if params.backend != "split":
            raise InvalidInputError(f"session {params.session_id} runs {params.backend}; `audit release` recomputes "
                                    "split releases")
        rows = {r["hospital"]: r["payload_sha256"] for r in store.uploads()}
        uploads = {h: store.get_blob(sha) for h, sha in rows.items() if (store.payload_dir / sha).is_file()}
        tags = {h: tag for h, (_, tag) in store.upload_tags().items() if tag is not None}
        share = store.get_blob(record["share_sha256"])
        masked = store.get_blob(record["masked_sum_blob"])
        messages = store.verifier_messages()
    finally:
        store.close()
    kept = None
    if args.kept is not None:
        kept = parse_json(Path(args.kept).read_bytes(), f"the key holder's kept commitment {args.kept}")
        if not isinstance(kept, dict) or kept.get("session_id") != params.session_id:
            raise InvalidInputError(f"{args.kept} is not the key holder's kept commitment of session "
                                    f"{params.session_id}")
    enrolled = pki.enrolled_keys(pki.load_enrolments(args.pki, role="hospital"))
    result = audit_release(params, manifest, uploads, tags, share, record["share_statement"], record["masked_sum"],
                           masked, W, {"lambda": meta.lam, "participants": list(meta.participants),
                                       "session": meta.session, "params_digest": meta.params_digest,
                                       "share_statement_sha256": meta.share_statement_sha256,
                                       "masked_sum_sha256": meta.masked_sum_sha256},
                           server_pub=pki.pinned_identity(args.pki, "server"),
                           keyholder_pub=pki.pinned_identity(args.pki, "keyholder"), enrolled=enrolled,
                           policy=release_policy(load_signed(args.pki, params.session_id)), kept=kept,
                           verifier_messages=messages)
    for line in result.checked:
        print(f"ok: {line}")
    for line in result.mismatches:
        print(f"MISMATCH: {line}")
    if result.ok:
        print(f"OK: session {params.session_id}: the release and W recompute from the server's masked uploads, "
              "the signed masked sum " + ("the key holder kept " if kept is not None else "") +
              "and the key holder's signed share")
        return 0
    names = {"server": "the server (its signed masked sum is not the sum of the cohort's uploads, or not the one it "
                       "gave the key holder)",
             "keyholder": "the key holder (W is not the release of the server's signed sum with its share)"}
    print("AT FAULT: " + "; ".join(names[p] for p in result.at_fault) if result.at_fault else
          "AT FAULT: undetermined (see the mismatches)")
    return EXIT_SECURITY


def _cmd_compare(args) -> int:
    from secure_afl.clients.statsfile import load_statistics_file
    from secure_afl.model_file import read_model
    from secure_afl.plaintext_compare import compare_with_plaintext

    W, meta = read_model(args.model)
    files = []
    for path in args.stats:
        stats, names = load_statistics_file(path)
        files.append((str(path), stats, names))
    import sys
    import threading

    # ckks floods its one decryption: W then differs from the plaintext by that noise
    noisy = meta.backend == "ckks"
    t = threading.Timer(2.0, lambda: print(f"secure-afl audit compare: summing {len(files)} files and solving "
                                           "the plaintext in three summation orders ...", file=sys.stderr,
                                           flush=True))
    t.start()
    try:
        c = compare_with_plaintext(W, participants=list(meta.participants), classes=meta.classes, lam=meta.lam,
                                   samples=meta.samples, class_counts=meta.class_counts, bound=meta.w_rel_bound,
                                   files=files, noisy=noisy)
    finally:
        t.cancel()
    if c.w_rel_error is not None:
        print(f"W relative error against the plaintext solve: {c.w_rel_error:.3g}")
        print(f"the statistics' own difference between summation orders: {c.stats_order_diff:.3g} "
              f"(largest entry of C, Q), {c.order_variation:.3g} in W")
        print(f"tolerance: {c.tolerance_text()}")
    print(c.verdict())
    if c.equal:
        return 0
    if c.mismatches:
        return EXIT_INPUT
    # an approximate release without a bound is not a failed security check: nothing certified was broken
    return EXIT_REFUSED if not c.checked else EXIT_SECURITY


def _cmd_verify(args) -> int:
    # a broken chain prints BROKEN and ends with its exit code; anything else (no such file, a head
    # that is not JSON, a party missing from the PKI) is one line from secure_afl.cli with its exit code
    try:
        server_pub = pki.pinned_identity(args.pki, "server", args.server)
        head = args.head
        countersign = keyholder_pub = None
        if ":" not in head or Path(head).exists():
            bundle = parse_json(Path(head).read_bytes(), f"head file {head}")
            head = bundle
            if isinstance(bundle, dict) and "countersign" in bundle:
                countersign = bundle["countersign"]
                if isinstance(countersign, dict):
                    keyholder_pub = pki.pinned_identity(args.pki, "keyholder", countersign.get("keyholder"))
        receipts = load_receipts(args.receipts) if args.receipts else []
        result = verify_log(args.log, server_pub=server_pub, head=head, receipts=receipts,
                            countersign=countersign, keyholder_pub=keyholder_pub, session=args.session)
    except AuditChainBroken as exc:
        where = f" (record index {exc.index})" if exc.index is not None else ""
        print(f"BROKEN{where}: {exc} [{exc.reason}]")
        # a detail reason such as "malformed" names another class in the registry; BROKEN is always
        # a failed security check
        return AuditChainBroken.exit_code
    except (ValueError, TypeError) as exc:
        if isinstance(exc, SecureAFLError):
            raise
        raise MalformedPayload(str(exc)) from None
    if args.receipts and result.n_receipts == 0:
        # receipts were asked for: a check of none of them is no check (wrong folder, other sessions only)
        others = sorted({r.get("session_id") for r in receipts if isinstance(r.get("session_id"), str)})
        found = (f"{len(receipts)} receipts, of session {', '.join(others)}" if others else
                 f"{len(receipts)} receipts")
        raise InvalidInputError(f"no receipt of session {', '.join(result.sessions) or '(none)'} in "
                                f"{args.receipts} ({found}): pass the folder `client submit --receipts` wrote")
    print(result.summary())
    return 0


def _register_verify(parser: argparse.ArgumentParser):
    """``audit verify``; returns the subcommand table, to which ``secure_afl.cli.audit_commands`` adds its siblings."""
    sub = parser.add_subparsers(dest="audit_command", metavar="ACTION", required=True)
    p = sub.add_parser("verify", help="verify an audit log up to its expected head, and receipts against it")
    p.add_argument("log", help="audit log (JSON Lines)")
    p.add_argument("--pki", required=True,
                   help="consortium PKI directory or a party's PKI bundle (pins the server's and key holder's keys)")
    p.add_argument("--server", default=None, help="server name in the PKI (default: the only one)")
    p.add_argument("--head", required=True,
                   help="the expected head: audit-head.json (close record + key holder countersignature), "
                        "a receipt or manifest JSON file, or SEQ:HEX")
    p.add_argument("--receipts", default=None,
                   help="directory of receipt *.json files, or one receipt file; receipts of other sessions "
                        "are set aside, and at least one of this session's must be there")
    p.add_argument("--session", default=None,
                   help="the session you mean: the log must be its log (default: the session the log records, "
                        "named in the OK line)")
    p.set_defaults(func=_cmd_verify)
    return sub


def register(parser: argparse.ArgumentParser) -> None:
    sub = _register_verify(parser)
    p = sub.add_parser("release", help="split: recompute the masked sum, the release and W from what the server "
                                       "holds, and name whatever does not match the model")
    p.add_argument("--state", required=True,
                   help="the server's session directory (state.sqlite3 and the stored masked uploads); whoever "
                        "reads it is trusted as the server is")
    p.add_argument("--pki", required=True, help="consortium PKI directory or a party's PKI bundle (pins the server, "
                                                "the key holder and the hospitals)")
    p.add_argument("--model", required=True, help="the model file the key holder wrote")
    p.add_argument("--kept", default=None,
                   help="the key holder's kept copy of the server's commitment (<session>.split-commitment.json "
                        "beside its keys): the release is then judged on the sum the key holder was given, and "
                        "the server's state is checked against it")
    p.set_defaults(func=_cmd_release)
    p = sub.add_parser("compare", help="compare a model's W with the plaintext solve of the hospitals' own "
                                       "statistics files")
    p.add_argument("--model", required=True, help="the model file the key holder wrote")
    p.add_argument("--stats", required=True, nargs="+",
                   help="each hospital's statistics file (`client embed --stats-only`), one per participant")
    p.set_defaults(func=_cmd_compare)
    from .auditor import add_report

    add_report(sub)
