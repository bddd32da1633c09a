"""``secure-afl server run --config session.toml``."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from secure_afl.exceptions import InvalidInputError, InvalidParameterError, ParameterMismatch, StateInUse
from secure_afl.pki import CA_KEY
from secure_afl.server.config import load_config
from secure_afl.session.definition import guarantee_lines


def _cmd_run(args) -> int:
    from .aggregator import open_server, shutdown
    from .app import create_app
    from secure_afl.server.tls_server import listen, reserve_open_files, serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg = load_config(args.config)
    if args.port is not None:
        cfg.port = args.port
    try:
        reserve_open_files(cfg.connection_limit)
    except InvalidParameterError as e:
        raise _naming_the_config(e, args.config)
    foreign = [] if args.allow_ca_key else foreign_private_keys(cfg.pki_dir, cfg.name, skip=cfg.data_dir)
    if foreign:
        # the operator's own PKI directory (even with the CA key moved offline it holds every party's keys): a
        # server started there serves beside keys that enrol or impersonate others, and usually from the
        # operator's state rather than the server's
        ca = Path(cfg.pki_dir) / CA_KEY
        first = ca if ca in foreign else foreign[0]
        what = "the consortium CA's private key" if first == ca else "a private key that is not the server's own"
        more = f" and {len(foreign) - 1} other private key{'s' if len(foreign) > 2 else ''}" if len(foreign) > 1 else ""
        raise InvalidInputError(f"{args.config}: the server's PKI directory {cfg.pki_dir} holds {what} ({first}"
                                f"){more}; run the server from its own bundle (secure-afl pki bundle), or pass "
                                "--allow-ca-key where one machine is both operator and server (a test bed)",
                                reason="ca_key_present" if first == ca else "private_key_present")
    sock = listen(cfg.host, cfg.port)  # a taken port refuses the start (exit 3) before anything is opened
    resumed = (Path(cfg.data_dir) / cfg.session_id / "audit.jsonl").exists()  # a restart, not a new session
    try:
        server = open_server(cfg)
    except StateInUse as e:
        sock.close()
        # the first server's audit log is locked by it: this one stops before it writes anything
        raise StateInUse(f"{args.config}: another server already runs session {cfg.session_id} on the state in "
                         f"{cfg.data_dir}; stop it first (this one changed nothing)") from e
    except (InvalidParameterError, ParameterMismatch) as e:
        sock.close()
        # a session that cannot run (e.g. secagg threshold vs neighbourhood vs min_clients, a session.toml
        # that is not the signed definition): the one-line error of every command, naming the file
        raise _naming_the_config(e, args.config)
    except BaseException:
        sock.close()
        raise
    app = create_app(server)
    if resumed:
        # what the operator would otherwise have to read out of the audit log to trust the restart
        who = sorted(row["hospital"] for row in server.store.uploads())
        print(f"resumed session {cfg.session_id} ({server.status}) from {server.dir}: {len(who)} upload"
              f"{'' if len(who) == 1 else 's'} accepted before the restart"
              + (f" ({', '.join(who)})" if who else ""), flush=True)

    log = logging.getLogger("secure_afl.server")
    log.info("serving session %s (%s) on https://%s:%d, mTLS %s, at most %d connections", cfg.session_id,
             cfg.backend, cfg.host, cfg.port, "on" if cfg.require_client_cert else "OFF", cfg.connection_limit)
    for name, line in guarantee_lines(server.definition):
        log.info("%s: %s", name, line)
    # uvicorn re-raises SIGTERM after its graceful shutdown; as an exception (not the default
    # handler) it lets the finally block write the pending refusal summaries and close the log
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    rc = 0
    try:
        serve(app, cfg, server.party, log_level=args.log_level, sock=sock)
    except SystemExit as e:  # SIGTERM (0), or uvicorn giving up at startup (non-zero, already logged)
        rc = e.code if isinstance(e.code, int) else 0
    finally:
        shutdown(server)
    return rc


#: files up to this size are read for a PEM private-key block whatever their name (keys are a few hundred bytes)
_SNIFF_BYTES = 16 * 1024


def foreign_private_keys(pki_dir, server_name: str, *, skip=None) -> list[Path]:
    """Every private key under ``pki_dir`` but the server's own TLS and identity keys, sorted: files holding a PEM
    ``PRIVATE KEY`` block, whatever they are called (the CA's ``ca.key``, another party's ``key.pem`` or
    ``identity.key``, a copy renamed). ``skip``: a folder not to search (the server's data, if it lies inside)."""
    d = Path(pki_dir)
    own_dir = d / f"server-{server_name}"
    own = {own_dir / "key.pem", own_dir / "identity.key"}
    skip = None if skip is None else Path(skip).resolve()
    found = []
    for root, dirs, files in os.walk(d):
        dirs[:] = sorted(x for x in dirs if skip is None or Path(root, x).resolve() != skip)
        for f in sorted(files):
            p = Path(root, f)
            if p in own:
                continue
            try:
                if p.stat().st_size > _SNIFF_BYTES and p.suffix not in (".key", ".pem"):
                    continue
                with open(p, "rb") as fh:
                    head = fh.read(_SNIFF_BYTES)
            except OSError:
                continue  # unreadable to the server: it cannot use it either
            if b"PRIVATE KEY-----" in head:
                found.append(p)
    return found


def _naming_the_config(e: Exception, config) -> Exception:
    e.args = (f"{config}: {e}",)
    return e


def _exit_on_sigterm(signum, frame):
    raise SystemExit(0)


def register(parser) -> None:
    sub = parser.add_subparsers(dest="server_command", metavar="COMMAND", required=True)
    p = sub.add_parser("run", help="run the aggregation server for one session",
                       description="Run the aggregation server (FastAPI + uvicorn, TLS, mTLS by default).")
    p.add_argument("--config", required=True, help="session.toml")
    p.add_argument("--port", type=int, help="override [server].port")
    p.add_argument("--allow-ca-key", action="store_true",
                   help="serve even though the PKI directory holds private keys other than the server's own "
                        "(the CA's, other parties'): one machine is both operator and server, as in a test bed; "
                        "refused otherwise")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=_cmd_run)
