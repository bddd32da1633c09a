"""The consortium operator's commands, in one place: the CA and bundles (``secure-afl pki``) and the
signed session definition (``secure-afl session``).

Runs on: the operator's machine, the only one that holds ``ca.key``. What
the commands do lives in the library (:mod:`secure_afl.pki.ca` issues,
:mod:`secure_afl.session` checks and signs); here is only the command line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from secure_afl.exceptions import InvalidInputError, InvalidParameterError
from secure_afl.pki import CA_KEY, ROLES, init_ca, issue, write_bundles
from secure_afl.secagg import consistency_quorum
from secure_afl.session.definition import dropout_line, guarantee_lines, secagg_shortfall
from secure_afl.session.schema import reference
from secure_afl.session.signed import load_signed, sign

__all__ = ["register_pki", "register_session"]


# -- secure-afl pki init | issue | bundle ------------------------------------------------------------
def _cmd_pki_init(args) -> int:
    ca = init_ca(args.dir, name=args.name, days=args.days)
    print(f"created {ca} and {Path(args.dir) / CA_KEY} (0600)")
    return 0


def _cmd_pki_issue(args) -> int:
    dns = None if args.dns is None else [s for s in args.dns.split(",") if s.strip()]
    try:
        party = issue(args.dir, args.role, args.name, dns=dns, days=args.days)
    except FileExistsError:
        raise InvalidInputError(f"{Path(args.dir) / f'{args.role}-{args.name}'} already exists") from None
    except FileNotFoundError as exc:
        raise InvalidInputError(f"{exc} (run `secure-afl pki init --dir {args.dir}` first)") from None
    print(f"created {party.directory}/{{cert.pem,key.pem,identity.key,identity.pub,enrolment.json}}")
    print(json.dumps(party.enrolment().to_dict(), sort_keys=True))
    return 0


def _cmd_pki_bundle(args) -> int:
    try:
        made = write_bundles(args.dir, args.out)
    except FileExistsError as exc:
        raise InvalidInputError(str(exc), reason="file_exists") from None
    for party, (path, added) in made.items():
        if added == ["new bundle"]:
            print(f"{party:<24} -> {path}/  (ca.pem, roster.json, {party}/)")
        elif added:
            print(f"{party:<24} -> {path}/  added {', '.join(added)}")
        else:
            print(f"{party:<24} -> {path}/  unchanged")
    print(f"hand each directory to its party only; {Path(args.dir) / CA_KEY} is in none of them")
    if any(added and added != ["new bundle"] for _, added in made.values()):
        print("a party that holds its bundle already copies the new files over it: "
              "cp -r BUNDLE/. pki/ (the /. copies the contents, never a nested folder)")
    return 0


def register_pki(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="pki_command", metavar="ACTION", required=True)
    p = sub.add_parser("init", help="create the consortium CA (DIR/ca.pem, DIR/ca.key)")
    p.add_argument("--dir", required=True, help="PKI directory")
    p.add_argument("--name", default="secure-afl consortium", help="consortium name (CA subject O)")
    p.add_argument("--days", type=int, default=3650, help="CA validity in days")
    p.set_defaults(func=_cmd_pki_init)

    p = sub.add_parser("issue", help="issue a TLS certificate and an Ed25519 identity for a party")
    p.add_argument("--dir", required=True, help="PKI directory holding the CA")
    p.add_argument("--role", required=True, choices=ROLES)
    p.add_argument("--name", required=True, help="party name, e.g. hosp-a")
    p.add_argument("--dns", default=None,
                   help="comma-separated SAN entries (default for server/keyholder: 127.0.0.1,localhost)")
    p.add_argument("--days", type=int, default=365, help="certificate validity in days")
    p.set_defaults(func=_cmd_pki_issue)

    p = sub.add_parser("bundle", help="one directory per party: CA, signed roster, its own keys only; run again, "
                                      "it adds new parties' bundles and the new roster and sessions to the others")
    p.add_argument("--dir", required=True, help="PKI directory holding the CA and every issued party")
    p.add_argument("--out", required=True, help="directory to create the bundles in")
    p.set_defaults(func=_cmd_pki_bundle)


# -- secure-afl session sign | show | reference -------------------------------------------------
def _cmd_session_sign(args) -> int:
    definition, written = sign(args.toml, args.pki, bundles_dir=args.bundles)
    b = definition.body
    extra = ""
    if b["secagg"]:
        n, t = len(b["hospitals"]), b["secagg"]["threshold"]
        extra = (f", threshold {t}, neighbours {b['secagg']['neighbours'] or 'all'}, quorum "
                 f"{consistency_quorum(n, t, b['min_clients'])} of {n}")
    print(f"signed session {b['id']} ({b['backend']}, {len(b['hospitals'])} hospitals, min_clients "
          f"{b['min_clients']}{extra})")
    print("what this session guarantees:")
    for name, line in guarantee_lines(definition):
        if (name == "quorum" and dropout_line(definition)[0] == 0) or (name == "isolation" and secagg_shortfall(definition)):
            # once, where warnings go (a terminal shows stdout and stderr together)
            print(f"secure-afl session sign: warning: {line}", file=sys.stderr)
        else:
            print(f"  {name}: {line}")
    for p in written:
        print(f"  -> {p}")
    return 0


def _cmd_session_show(args) -> int:
    if args.session_id and args.session and args.session_id != args.session:
        raise InvalidParameterError(f"two session ids: {args.session_id} and --session {args.session}")
    if args.session_id:  # the older spelling still works; every other command takes --session
        print("secure-afl session show: note: the id is given as --session ID (as everywhere else); the "
              "positional spelling will go", file=sys.stderr)
    sid = args.session or args.session_id
    if not sid:
        raise InvalidParameterError("session show needs --session ID")
    definition = load_signed(args.pki, sid)
    print(json.dumps(dict(definition.body), indent=2, sort_keys=True))
    for name, line in guarantee_lines(definition):  # stdout stays one JSON document
        print(f"{name}: {line}", file=sys.stderr)
    return 0


def _bundle_party(pki_dir, who: str | None):
    """The party whose keys this directory holds: the one of a bundle, or ``--as ROLE-NAME`` where there are
    several (the operator's own PKI directory)."""
    from secure_afl import pki

    d = Path(pki_dir)
    held = sorted(p.name for p in d.iterdir() if p.is_dir() and (p / "cert.pem").is_file()) if d.is_dir() else []
    if who is None:
        if len(held) != 1:
            raise InvalidParameterError(f"{d} holds {len(held)} parties' keys ({', '.join(held) or 'none'}): "
                                        "name the one to connect as with --as ROLE-NAME")
        who = held[0]
    role, _, name = who.partition("-")
    if role not in ROLES or not name:
        raise InvalidParameterError(f"--as {who}: expected ROLE-NAME with ROLE one of {', '.join(ROLES)}")
    return pki.load_party(d, role, name)


def _cmd_session_status(args) -> int:
    from secure_afl.transport.tls_client import ServiceClient

    party = _bundle_party(args.pki, args.as_party)
    with ServiceClient(args.server, party, args.session, timeout=30.0, retry_s=args.wait_server) as conn:
        # signed, over mTLS: the server answers the session's own parties only (server/status.py)
        st = conn.request("GET", conn.path("/status")).json()
    if args.json:
        print(json.dumps(st, indent=2, sort_keys=True))
        return 0
    if st.get("view") == "hospital":
        return _print_hospital_status(st)
    n = len(st["roster"])
    refused = st["refused"]

    def names(hs):
        return ", ".join(hs) if hs else "none"

    print(f"session {st['session_id']} ({st['backend']}): {st.get('phase', st['status'])}")
    print(f"  roster    {n}: {names(st['roster'])}")
    print(f"  uploaded  {len(st['uploaded'])}: {names(st['uploaded'])}")
    if st["backend"] == "split":
        print(f"  judged    {len(st['judged'])}: {names(st['judged'])} (uploads whose verifier message the key "
              "holder has asked for)")
    if st["valid"]:
        print(f"  released  {len(st['valid'])}: {names(st['valid'])}")
    print(f"  refused   {len(refused)}: " + (", ".join(f"{h} ({why})" for h, why in refused.items()) or "none"))
    print(f"  silent    {len(st['silent'])}: {names(st['silent'])}")
    _print_progress(st, n)
    return 0


def _print_hospital_status(st: dict) -> int:
    """A roster hospital's view: its own entry and the counts, no other hospital's name."""
    you, k = st["you"], st["counts"]
    print(f"session {st['session_id']} ({st['backend']}): {st['status']}")
    print(f"  you       {you['hospital']}: {you['state']}" + (f" ({you['reason']})" if you["reason"] else "") +
          (", judged" if you["judged"] else "") + (", in the release" if you["released"] else ""))
    print(f"  roster    {k['roster']}; uploaded {k['uploaded']}, refused {k['refused']}, silent {k['silent']}"
          + (f", released {k['valid']}" if k["valid"] else ""))
    _print_progress(st, k["roster"])
    return 0


def _print_progress(st: dict, n: int) -> None:
    import datetime as dt

    print(f"  quorum    {st['quorum']} of {n}; {st['still_needed']} more upload(s) needed; "
          f"{st['dropouts_left']} more hospital(s) may drop out or be refused")
    if st["deadline"] is None:
        print("  deadline  none (the key holder closes the session)")
    else:
        left = st["deadline"] - st["now"]
        at = dt.datetime.fromtimestamp(st["deadline"], dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        print(f"  deadline  {at} ({'in ' + _duration(left) if left > 0 else 'passed ' + _duration(-left) + ' ago'})")


def _duration(s: float) -> str:
    s = int(s)
    return f"{s // 3600} h {s % 3600 // 60} min" if s >= 3600 else f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"


def _cmd_session_reference(args) -> int:
    sys.stdout.write(reference())
    return 0


def register_session(parser) -> None:
    sub = parser.add_subparsers(dest="session_command", metavar="ACTION", required=True)
    p = sub.add_parser("sign", help="check session.toml strictly and sign its definition with the CA key")
    p.add_argument("toml", help="the session file (session.toml)")
    p.add_argument("--pki", required=True, help="the operator's PKI directory (holds ca.key)")
    p.add_argument("--bundles", default=None, help="also place the signed definition into every bundle here")
    p.set_defaults(func=_cmd_session_sign)
    p = sub.add_parser("show", help="print a signed session definition after checking its signature")
    p.add_argument("session_id", nargs="?", help=argparse.SUPPRESS)
    p.add_argument("--session", help="session id (its signed definition is in PKI/sessions/)")
    p.add_argument("--pki", required=True, help="a PKI directory or bundle")
    p.set_defaults(func=_cmd_session_show)
    p = sub.add_parser("status", help="the running session as the server sees it: who uploaded, was judged, "
                                      "refused or is silent; the quorum, dropouts left, the deadline (the key "
                                      "holder and the server's identity see every hospital, a roster hospital "
                                      "its own entry and the counts)")
    p.add_argument("--server", required=True, help="https://host:port of the aggregation server")
    p.add_argument("--session", required=True, help="session id")
    p.add_argument("--pki", required=True, help="a party's bundle: the server's, the key holder's or a roster "
                                                "hospital's")
    p.add_argument("--as", dest="as_party", metavar="ROLE-NAME",
                   help="the party to connect as, where --pki holds several (the operator's PKI directory)")
    p.add_argument("--json", action="store_true", help="the server's answer as JSON")
    p.add_argument("--wait-server", type=float, default=10.0, metavar="SECONDS",
                   help="keep trying to reach a server that does not answer this long (default 10)")
    p.set_defaults(func=_cmd_session_status)
    p = sub.add_parser("reference", help="print the session.toml reference (docs/SESSION.md) from the schema")
    p.set_defaults(func=_cmd_session_reference)
