"""``secure-afl bench upload-cost``: the server's CPU per accepted upload, against its floor, and where it goes.

The floor of one upload on this machine is what no server can skip: the TLS
connection that carries it (handshake with client certificate, record
decryption of the body), one SHA-256 of the body and one write + fsync of the
same bytes. It is measured here with the server's own TLS context
(:func:`secure_afl.pki.server_ssl_context`), a blocking socket and a file in
the server's data directory.

The real figure comes from the real path: a ``secure-afl server run`` child
process (uvicorn, mTLS, FastAPI) takes ``--uploads`` hospitals one after the
other (each: connect, fetch the session, upload, receipt), and its CPU
(utime + stime from ``/proc``) is read before and after each. The payloads are
protected before the clock starts, so only the server's share is counted.

Where the rest goes: after the HTTPS run the server is stopped, and the same
handler (:func:`secure_afl.server.intake.submit`: statement check, hashes, envelope
and sum, payload file, SQLite row, audit record, receipt) runs in this process
under cProfile with a CPU clock for ``--uploads`` more hospitals of the same
session; what HTTPS adds on top (TLS, HTTP parsing, the body's streaming and
digest in ``server/app.py``) is the difference between the two.
"""

from __future__ import annotations

import cProfile
import hashlib
import json
import os
import pstats
import socket
import ssl
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

__all__ = ["register", "run_upload_cost", "measure_floor"]


def measure_floor(pki_dir: Path, hospital: str, payload_bytes: int, data_dir: Path, repeats: int = 10) -> dict:
    """CPU of the unavoidable work for one upload of ``payload_bytes``: TLS (new mTLS connection, body
    received), one SHA-256, one write + fsync; the medians of ``repeats`` runs."""
    from secure_afl import pki

    server = pki.load_party(pki_dir, "server", "aggregator")
    client = pki.load_party(pki_dir, "hospital", hospital)
    sctx, cctx = server.server_ssl_context(), client.client_ssl_context()
    body = os.urandom(payload_bytes)
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    tls_cpu: list[float] = []

    def serve():
        for _ in range(repeats):
            conn, _ = lsock.accept()
            t = time.thread_time()
            with sctx.wrap_socket(conn, server_side=True) as s:
                left = payload_bytes
                while left:
                    chunk = s.recv(min(left, 1 << 16))
                    if not chunk:
                        break
                    left -= len(chunk)
                s.sendall(b"ok")
            tls_cpu.append(time.thread_time() - t)

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    for _ in range(repeats):
        with cctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="127.0.0.1") as c:
            c.sendall(body)
            c.recv(2)
    th.join(timeout=60)
    lsock.close()
    sha_cpu, fsync_cpu, fsync_wall = [], [], []
    path = Path(data_dir) / ".floor-probe"
    for _ in range(repeats):
        t = time.thread_time()
        hashlib.sha256(body).digest()
        sha_cpu.append(time.thread_time() - t)
        t, w = time.thread_time(), time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_cpu.append(time.thread_time() - t)
        fsync_wall.append(time.perf_counter() - w)
        path.unlink()
    med = lambda xs: float(np.median(xs))  # noqa: E731
    out = {"tls_cpu_s": med(tls_cpu), "sha256_cpu_s": med(sha_cpu), "write_fsync_cpu_s": med(fsync_cpu),
           "write_fsync_wall_s": med(fsync_wall)}
    out["floor_cpu_s"] = out["tls_cpu_s"] + out["sha256_cpu_s"] + out["write_fsync_cpu_s"]
    return out


def _prepare(backend: str, names: list[str], dim: int, classes: int, samples: int, seed: int, work: Path):
    """PKI, the signed session (min_clients above every upload here: it never closes) and its config."""
    from .harness import make_pki, server_section, write_session

    pki_dir = work / "pki"
    make_pki(pki_dir, names, name="secure-afl bench consortium", roster=True)
    cfg = {
        "session": {"id": f"upload-cost-{backend}", "backend": backend, "dim": dim, "classes": classes,
                    "gamma": 1.0, "min_clients": len(names), "min_class_count": 1, "deadline_s": 86400,
                    "hospitals": names},
        "bounds": {"max_norm": 1.0, "n_max": samples, "k_max": len(names)},
        "server": server_section(work, pki_dir),
    }
    write_session(work / "session.toml", pki_dir, cfg)
    return pki_dir, cfg


def run_upload_cost(backend: str, uploads: int, *, dim: int = 512, classes: int = 100, samples: int = 32,
                    seed: int = 0, workdir: str | None = None, top: int = 15) -> dict:
    from secure_afl import pki
    from .bench_service import ServerMeter, hospital_stats
    from secure_afl.clients.hospital import HospitalClient, protect_contribution
    from .harness import start_server
    from secure_afl.backends.session_params import dp_session_params
    from secure_afl.keyholder import KeyHolder
    from secure_afl.packing import Layout
    from secure_afl.params import KEYED_BACKENDS, Bounds
    from secure_afl.server import aggregator, intake
    from secure_afl.server.aggregator import open_server
    from secure_afl.server.config import load_config
    from secure_afl.signing import sign_upload

    if backend == "secagg":
        raise SystemExit("bench upload-cost: secagg uploads are a round of stages, not one request; "
                         "see `bench service --backend secagg`")
    if uploads < 1:
        raise SystemExit("--uploads must be >= 1")
    work = Path(workdir or tempfile.mkdtemp(prefix="secure-afl-upload-cost-"))
    work.mkdir(parents=True, exist_ok=True)
    names = [f"h{i:04d}" for i in range(2 * uploads)]
    pki_dir, cfg = _prepare(backend, names, dim, classes, samples, seed, work)
    sid, url = cfg["session"]["id"], f"https://127.0.0.1:{cfg['server']['port']}"
    kh = KeyHolder(pki_dir, "keyholder", work / "keyholder", passphrase=os.urandom(16).hex().encode())
    server = start_server(work / "session.toml", work / "server.log", url, kh.party)
    per_hospital, per_request, sizes = [], [], []
    try:
        meter = ServerMeter(server.proc.pid)
        conn = kh.connect(url, sid)
        if backend in KEYED_BACKENDS:
            kh.keygen(dp_session_params(load_config(work / "session.toml").dp, backend, sid, Layout(dim, classes),
                                        1.0, Bounds(1.0, samples, len(names))))
            kh.publish(conn)
        conn.close()
        # every payload protected first: the clock below runs only while the server works
        clients = []
        for i, n in enumerate(names[:uploads]):
            c = HospitalClient(url, sid, pki.load_party(pki_dir, "hospital", n), timeout=600)
            params = c.fetch_params()
            payload, tag = c.protect(params, hospital_stats(dim, classes, samples, seed, i))
            c.close()  # a fresh connection below: its TLS handshake is part of what the server pays
            clients.append((n, params, payload, tag))
        for n, params, payload, tag in clients:
            c = HospitalClient(url, sid, pki.load_party(pki_dir, "hospital", n), timeout=600)
            cpu0 = meter.cpu_s()
            c.fetch_params()  # connect (mTLS handshake), session info, signed parameters
            cpu1 = meter.cpu_s()
            c.upload(params, payload, tag=tag)
            cpu2 = meter.cpu_s()
            c.close()
            per_hospital.append(cpu2 - cpu0)
            per_request.append(cpu2 - cpu1)
            sizes.append(len(payload))
    finally:
        server.stop()

    # the same handler in this process, under cProfile, for the other half of the roster
    srv = open_server(load_config(work / "session.toml"))
    try:
        ctx = srv.public_context
        prepared = []
        for i, n in enumerate(names[uploads:], start=uploads):
            party = pki.load_party(pki_dir, "hospital", n)
            payload, tag = protect_contribution(party, srv.params, hospital_stats(dim, classes, samples, seed, i),
                                                public_context=ctx)
            prepared.append((n, party, payload, tag))
        prof = cProfile.Profile(time.thread_time)  # CPU seconds: fsync and SQLite commits' waits are not CPU
        cpu_submit = []
        for n, party, payload, tag in prepared:
            sha = hashlib.sha256(payload).digest()
            st = sign_upload(party.identity_key(), sid, srv.params.digest(), sha, n)
            t = time.thread_time()
            prof.enable()
            intake.submit(srv, n, st, payload, tag, payload_sha256=sha.hex())  # as server/app.py calls it
            prof.disable()
            cpu_submit.append(time.thread_time() - t)
    finally:
        aggregator.shutdown(srv)
    floor = measure_floor(pki_dir, names[0], int(np.mean(sizes)), work / "server")
    return {"backend": backend, "uploads": uploads, "dim": dim, "classes": classes,
            "payload_bytes": float(np.mean(sizes)),
            "server_cpu_s_per_hospital": float(np.mean(per_hospital)),
            "server_cpu_s_per_upload_request": float(np.mean(per_request)),
            "submit_cpu_s_per_upload": float(np.mean(cpu_submit)),
            "floor": floor, "handler_top": _rows(pstats.Stats(prof), uploads)[:top],
            "cpus": os.cpu_count(), "workdir": str(work)}


def _rows(stats, uploads: int) -> list[dict]:
    rows = []
    for (fname, line, func), (cc, nc, tt, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(fname).name}:{line}({func})" if line else func, "calls": nc,
                     "tottime_s_per_upload": tt / uploads, "cumtime_s_per_upload": ct / uploads})
    rows.sort(key=lambda r: -r["tottime_s_per_upload"])
    return rows


def format_report(r: dict) -> str:
    f, ms = r["floor"], lambda s: f"{1e3 * s:8.2f} ms"  # noqa: E731
    http = r["server_cpu_s_per_hospital"] - r["submit_cpu_s_per_upload"]
    top = lambda rows: [f"  {ms(row['tottime_s_per_upload'])}  {row['calls'] / r['uploads']:6.1f} calls  "  # noqa: E731
                        f"{row['function']}" for row in rows]
    lines = [
        f"bench upload-cost: {r['backend']}, d = {r['dim']}, C = {r['classes']}, {r['payload_bytes'] / 1e6:.2f} MB "
        f"per upload, {r['uploads']} uploads over HTTPS + {r['uploads']} in-process, {r['cpus']} CPUs",
        f"server CPU per hospital (connect, session, upload, receipt) {ms(r['server_cpu_s_per_hospital'])}",
        f"  of which the upload request                            {ms(r['server_cpu_s_per_upload_request'])}",
        f"  the handler alone (submit, in-process, cProfile'd)      {ms(r['submit_cpu_s_per_upload'])}",
        f"  HTTPS around it (TLS, HTTP, body streaming + digest)   {ms(http)}",
        f"floor: TLS (mTLS connection + body) {ms(f['tls_cpu_s'])} + SHA-256 {ms(f['sha256_cpu_s'])} + "
        f"write+fsync {ms(f['write_fsync_cpu_s'])} CPU ({1e3 * f['write_fsync_wall_s']:.2f} ms wall) = "
        f"{ms(f['floor_cpu_s'])}",
        f"server CPU per hospital / floor: {r['server_cpu_s_per_hospital'] / f['floor_cpu_s']:.2f}x",
        "the handler's CPU per upload, by function (cProfile tottime on a CPU clock; C functions by name):",
        *top(r["handler_top"]),
    ]
    return "\n".join(lines)


def _cmd(args) -> int:
    import shutil

    workdir = args.workdir or tempfile.mkdtemp(prefix="secure-afl-upload-cost-")
    try:
        r = run_upload_cost(args.backend, args.uploads, dim=args.dim, classes=args.classes, samples=args.samples,
                            seed=args.seed, workdir=workdir, top=args.top)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print(format_report(r))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2, sort_keys=True) + "\n")
    return 0


def register(parser) -> None:
    parser.add_argument("--backend", choices=["plain", "ckks", "bfv", "split"], default="split")
    parser.add_argument("--uploads", type=int, default=20, help="hospitals over HTTPS (and as many in-process)")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--samples", type=int, default=32, help="samples per hospital")
    parser.add_argument("--top", type=int, default=15, help="functions listed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", help="keep PKI, server state and logs here (default: a temp dir, removed)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON here")
    parser.set_defaults(func=_cmd)
