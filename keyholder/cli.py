"""``secure-afl keyholder keygen | publish | judge | finalize``."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from secure_afl._io import read_private_file
from secure_afl.exceptions import SecureAFLError

from .connection import KeyHolderConnection
from .custody import PASSPHRASE_ENV
from .split_stream import POLL_S
from secure_afl.model_file import model_metadata
from .release import KeyHolder, write_model
from secure_afl.session.signed import load_signed
from secure_afl.certify import verdict_text
from secure_afl.params import KEYED_BACKENDS

__all__ = ["register"]


def _keyholder(args) -> KeyHolder:
    passphrase = None
    if getattr(args, "passphrase_file", None):
        passphrase = read_private_file(args.passphrase_file, "passphrase file").strip()
    return KeyHolder(args.pki, args.name, args.keys, passphrase=passphrase)


def _cmd_keygen(args) -> int:

    definition = load_signed(args.pki, args.session)  # the operator's, from this key holder's bundle
    if definition.backend not in KEYED_BACKENDS:
        print(f"session {definition.session_id} uses {definition.backend}; only {', '.join(KEYED_BACKENDS)} "
              "sessions need key-holder keys")
        return 2
    kh = _keyholder(args)
    public = kh.keygen(definition.session_params())  # the one derivation every party makes
    print(f"fresh {definition.backend.upper()} keys for session {definition.session_id}: public context "
          f"{kh.public_path(definition.session_id)} ({len(public)} bytes, sha256 "
          f"{hashlib.sha256(public).hexdigest()[:16]}...)")
    return 0


def _connect(kh: KeyHolder, args) -> KeyHolderConnection:
    # what the key holder waits for, and for how long, is said on stderr instead of a silent pause
    logging.basicConfig(level=logging.WARNING, format="secure-afl: %(message)s")
    return KeyHolderConnection(args.server, kh.party, args.session, retry_s=args.wait_server)


def _cmd_publish(args) -> int:
    kh = _keyholder(args)
    kh.check_unlock(args.session)  # a mistyped passphrase fails here, before hospitals encrypt to the key
    with _connect(kh, args) as conn:
        info = kh.publish(conn)
    print(f"session {info['session_id']} is {info['status']}; params digest {info['params_digest']}")
    return 0


def _cmd_judge(args) -> int:
    """split: judge each upload as it arrives, until the round is released (or once with --once)."""
    import time

    kh = _keyholder(args)
    kh.check_unlock(args.session)
    seen: dict = {}
    roster = set(kh.split_judge(args.session).enrolled)
    # the first pass opens the key and fetches every upload so far (seconds): said before, not after
    print(f"secure-afl keyholder judge: judging the uploads of session {args.session} on {args.server}"
          + (" once" if args.once else f" as they arrive (every {args.interval:g} s, until the release)")
          + ", one line per upload", flush=True)
    with _connect(kh, args) as conn:
        while True:
            released = conn.info()["status"] == "released"  # read first: a last pass after it takes the rest
            try:
                verdicts = kh.judge_split(conn)
            except SecureAFLError as exc:
                # the release used the session's key (finalize beside this loop, or before it started): the
                # session this command watches is done, which is its success, not an error
                if exc.reason != "key_used" or conn.info()["status"] != "released":
                    raise
                print(f"session {args.session} is released; nothing more to judge", flush=True)
                break
            for h in sorted(set(verdicts) - set(seen)):
                print(f"{h}: {'valid' if verdicts[h] is None else 'refused (' + verdicts[h] + ')'}", flush=True)
            if set(verdicts) >= roster > set(seen):  # said once: no one is left to wait for
                print(f"every hospital of the roster ({len(roster)}) has uploaded and is judged: nothing is left to "
                      f"wait for; `secure-afl keyholder finalize` can release now", flush=True)
            seen = verdicts
            if args.once or released:
                break
            time.sleep(args.interval)
    print(f"{len(seen)} uploads judged, {sum(v is not None for v in seen.values())} refused")
    return 0


def _check_writable(path, what: str) -> None:
    """Refuse an output path that exists already or cannot be written, before anything is released: a release
    happens once, so a model that cannot be saved after it, or one it would replace, could not be made again."""
    from secure_afl._io import refuse_existing

    p = Path(path)
    refuse_existing(p, what)
    p.parent.mkdir(parents=True, exist_ok=True)
    probe = p.with_name(p.name + ".tmp")
    probe.write_bytes(b"")
    probe.unlink()


def _check_keys_dir(args) -> None:
    """A mistyped ``--keys`` names the directory keygen wrote, not a new empty one made on the way."""
    from secure_afl.exceptions import InvalidKey

    definition = load_signed(args.pki, args.session)
    if definition.backend in KEYED_BACKENDS and not Path(args.keys).is_dir():
        raise InvalidKey(f"no key directory {args.keys}: pass the --keys directory `keyholder keygen --session "
                         f"{args.session}` wrote (nothing was changed)")


def _cmd_finalize(args) -> int:
    from secure_afl._io import write_file

    # everything this command can get wrong locally is refused before the round is closed or a key is used
    args.out = args.out or f"model-{args.session}.safetensors"
    _check_writable(args.out, "--out")
    if args.report:
        _check_writable(args.report, "--report")
    _check_keys_dir(args)
    kh = _keyholder(args)

    def announce(n: int) -> None:
        # the release runs without a word otherwise (seconds to minutes with many uploads); on stdout, with
        # the result, so that a refusal stays the one line on stderr; said once the key is open and this key
        # holder's own floor holds, so it never announces a release that is then refused locally
        print(f"secure-afl keyholder finalize: closing session {args.session} on {args.server} and releasing its "
              f"{n} uploads: checking each one, opening the aggregate once, solving W ...", flush=True)

    with _connect(kh, args) as conn:
        res = kh.finalize(conn, min_clients=args.min_clients, lam=args.lam, min_class_count=args.min_class_count,
                          announce=announce)
    write_model(args.out, res.W, model_metadata(res.params, res.report, args.lam))
    if args.report:
        write_file(args.report, json.dumps(res.report, indent=2).encode(), mode=0o644)
    flood = (f"; decryption flooded (sigma {res.report['flood_sigma']:.2e} per entry, "
             f"{res.report['flood_security']} over the whole release), per-entry bound "
             f"{res.report['error_bound_per_entry']:.2e}, ridge {res.report['flood_ridge']:.2e}"
             if res.report.get("flood_sigma") else "")
    print(f"model W {res.W.shape} from {res.report['contributors']} hospitals, {res.report['samples']} samples "
          f"-> {args.out}{flood}")
    print(format_w_bound(res.report["w_error_bound"], res.params.backend,
                         noisy=bool(res.report.get("flood_sigma") or res.report.get("dp"))))
    print(f"countersigned audit head -> {kh.audit_head_path(res.params.session_id)} (publish it with the model: "
          "auditors verify the server's log against this copy, which the server alone cannot replace, rather "
          "than the server's own audit-head.json)")
    if res.report.get("dp"):
        p = res.report["dp"]
        print(f"differential privacy: epsilon {p['epsilon']:.4g} at delta {p['delta']:g} for this release, "
              f"{p['epsilon_composed']:.4g} composed over this key holder's releases ({p['mechanism']} noise)")
    return 0


def format_w_bound(b: dict, backend: str = "ckks", noisy: bool | None = None) -> str:
    """One line: the verdict (the same words as the demo's) and, with a bound, the bound and what it bounds."""

    if not b["applies"]:
        return f"W: {verdict_text(b['verdict'], backend, noisy)}"
    prob = f", except with probability {b['probability']:.1e}" if b.get("probability") else ""
    note = f"; note: {b['warning']}" if b["warning"] else ""
    return (f"W: {b['verdict']}: ||W - W*|| / ||W*|| <= {b['rel_bound']:.3e} with W* = {b['solution']} of the "
            f"exact sums (cond = {b['condition_number']:.3g}{prob}){note}")


def register(parser) -> None:
    sub = parser.add_subparsers(dest="keyholder_command", metavar="COMMAND", required=True)

    def common(p, online: bool):
        p.add_argument("--pki", required=True, help="consortium PKI directory")
        p.add_argument("--name", default="keyholder", help="this key holder's enrolled name")
        p.add_argument("--keys", required=True, help="key directory (secret contexts, release ledger)")
        p.add_argument("--passphrase-file", help=f"file with the at-rest passphrase (default: ${PASSPHRASE_ENV})")
        if online:
            p.add_argument("--server", required=True, help="https://host:port of the aggregation server")
            p.add_argument("--session", required=True)
            p.add_argument("--wait-server", type=float, default=30.0, metavar="SECONDS",
                           help="keep trying to reach a server that does not answer this long (default 30)")

    p = sub.add_parser("keygen", help="fresh keys for one session, secret sealed at rest here: split, a hybrid "
                                      "ML-KEM-768 + X25519 key for the hospitals' mask seeds; bfv, ckks, a lattice "
                                      "key pair; plain and secagg need none")
    common(p, False)
    p.add_argument("--session", required=True, help="session id: its signed definition is in PKI/sessions/")
    p.set_defaults(func=_cmd_keygen)
    p = sub.add_parser("publish", help="publish the session's public key (split: the seed key; bfv, ckks: the "
                                       "public context), tag key and signed parameters to the server")
    common(p, True)
    p.set_defaults(func=_cmd_publish)
    p = sub.add_parser("judge", help="split: judge each upload's validity proof as it arrives (the release then "
                                      "only sums); runs until the round is released")
    common(p, True)
    p.add_argument("--interval", type=float, default=POLL_S, metavar="SECONDS",
                   help=f"poll interval (default {POLL_S:g})")
    p.add_argument("--once", action="store_true", help="one pass over the uploads accepted so far")
    p.set_defaults(func=_cmd_judge)
    p = sub.add_parser("finalize", help="close the session and release it once: split, judge what is left, open "
                                        "the manifest's seeds and post the masks' share (the server answers with "
                                        "the masked sum; this key holder unmasks it and solves); bfv, ckks, "
                                        "re-sum the signed uploads and decrypt once (ckks "
                                        "floods); secagg, plain, check the sum; then check, solve, write the model")
    common(p, True)
    p.add_argument("--min-clients", type=int, required=True, help="this key holder's own release threshold")
    p.add_argument("--min-class-count", type=int, default=1, help="refuse a release with a rarer present class")
    p.add_argument("--lambda", dest="lam", type=float, default=0.0, help="optional final ridge (default 0)")
    p.add_argument("--out", help="model file (.safetensors) to create; never an existing one (default: "
                                 "model-SESSION.safetensors)")
    p.add_argument("--report", help="report JSON to create; never an existing one")
    p.set_defaults(func=_cmd_finalize)
