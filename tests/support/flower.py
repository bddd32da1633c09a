"""A local Flower deployment on 127.0.0.1: one SuperLink, one SuperNode per party, `flwr run`."""

from __future__ import annotations

import os
import socket
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from support import free_port
from secure_afl import pki
from secure_afl.flower import PROJECT_DIR

BIN = Path(sys.executable).parent
_NODE = "SECURE_AFL_TEST_FLOWER_NODE"


def hospital_data(c, seed, names=("h1", "h2", "h3")) -> dict:
    """Each hospital's rows (a random count, inside the consortium's norm bound) and labels."""
    rng = np.random.default_rng(seed)
    data = {}
    for h in names:
        n = int(rng.integers(30, 60))
        X = rng.standard_normal((n, c.dim))
        X *= (0.9 * c.max_norm / np.linalg.norm(X, axis=1, keepdims=True)) * rng.uniform(0.1, 1, (n, 1))
        data[h] = (X, rng.integers(0, c.classes, n))
    return data


def submit_all(c, data) -> None:
    """Every hospital's native client at once (secagg hospitals take part in the rounds together)."""
    errors = {}

    def go(h):
        cl = c.hospital(h)
        try:
            cl.submit(c.stats(*data[h]), **({"timeout": 120} if c.backend == "secagg" else {}))
        except Exception as e:  # asserted on below
            errors[h] = e
        finally:
            cl.close()

    threads = [threading.Thread(target=go, args=(h,), daemon=True) for h in data]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not errors, errors


def native_w(c, data, keygen=None):
    """W from the native service on ``data``: the server process, the key holder's keys published when
    ``keygen(c)`` makes them, every hospital's upload, the release (all three hospitals)."""
    c.start()
    try:
        conn = c.connect_keyholder()
        if keygen is not None:
            keygen(c)
            c.keyholder.publish(conn)
        submit_all(c, data)
        res = c.keyholder.finalize(conn, min_clients=3)
        conn.close()
        return res.W
    finally:
        c.stop()


class FlowerDeployment:
    """Real Flower processes (insecure transport, loopback only); every one is stopped by :meth:`stop`."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.home = self.root / "flwr-home"
        self.home.mkdir(exist_ok=True)
        self.port = free_port()
        (self.home / "config.toml").write_text(
            '[superlink]\ndefault = "local-deployment"\n\n'
            f'[superlink.local-deployment]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n')
        self.env = {**os.environ, "FLWR_HOME": str(self.home), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
        self.procs: list[subprocess.Popen] = []

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "wb")
        # the mark reaches every process this one starts (SuperExec, ClientApps), for kill_node
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**self.env, _NODE: name},
                             cwd=self.root, start_new_session=True)
        log.close()
        self.procs.append(p)
        return p

    def start_superlink(self) -> None:
        p = self._spawn("superlink", [str(BIN / "flower-superlink"), "--insecure", "--port", str(self.port),
                                      "--disable-runtime-dependency-installation"])
        deadline = time.monotonic() + 60
        while True:  # bounded: until the SuperLink's HTTP port accepts connections
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if p.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the SuperLink did not start:\n" + self.logs()) from None
                time.sleep(0.2)

    def start_supernode(self, name: str, node_config: dict) -> None:
        cfg = " ".join(f"{k}={v}" if isinstance(v, (int, float)) else f'{k}="{v}"' for k, v in node_config.items())
        self._spawn(f"supernode-{name}", [str(BIN / "flower-supernode"), "--insecure",
                                          "--superlink", f"127.0.0.1:{self.port}", "--port", str(free_port()),
                                          "--node-config", cfg])

    def start_parties(self, c, data: dict, work: Path, *, min_clients: int, hospital_config=None) -> Path:
        """The consortium ``c`` as README's Flower deployment runs it: each party with its own bundle, never the
        operator's pki/; the SuperLink, a SuperNode per hospital in ``data`` (its rows in an .npz, plus
        ``hospital_config(name)`` when given) and the key holder's. Returns the ServerApp's session config."""
        work = Path(work)
        for h, (X, y) in data.items():
            np.savez(work / f"{h}.npz", X=X, y=y)
        (work / "pass").write_bytes(b"test passphrase")  # the passphrase of the consortium's key holder
        bundles = pki.make_bundles(c.pki_dir, work / "bundles")
        server_config = work / "server-session.toml"
        server_config.write_text(c.config.read_text().replace(str(c.pki_dir), str(bundles["server-aggregator"])))
        self.start_superlink()
        for h in data:
            self.start_supernode(h, {"role": "hospital", "name": h, "pki-dir": bundles[f"hospital-{h}"],
                                     "data": work / f"{h}.npz", "receipts-dir": work / "receipts",
                                     **(hospital_config(h) if hospital_config else {})})
        self.start_supernode("keyholder", {
            "role": "keyholder", "name": "keyholder", "pki-dir": bundles["keyholder-keyholder"],
            "keys-dir": c.root / "keys", "passphrase-file": work / "pass", "min-clients": min_clients,
            "min-class-count": 1, "out": work / "model.safetensors", "report": work / "report.json"})
        return server_config

    def run(self, run_config: dict, timeout: float, project: Path = PROJECT_DIR) -> subprocess.CompletedProcess:
        """``flwr run`` of the project with ``--stream``: returns when the ServerApp has finished."""
        p = self.start_run(run_config, project)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            raise
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    def start_run(self, run_config: dict, project: Path = PROJECT_DIR) -> subprocess.Popen:
        overrides = " ".join(f'{k}="{v}"' if isinstance(v, str) else f"{k}={v}" for k, v in run_config.items())
        return subprocess.Popen([str(BIN / "flwr"), "run", str(project), "local-deployment", "--stream",
                                 "--run-config", overrides], env=self.env, cwd=self.root, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def kill_node(self, name: str) -> None:
        """SIGKILL one SuperNode and every process it started: a site that crashes mid-round."""
        for pid in self._marked(f"{_NODE}=supernode-{name}".encode()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.root.glob("*.log"))

    def _ours(self) -> list[int]:
        """Every live process started with this deployment's FLWR_HOME (SuperExec and app processes
        detach into sessions of their own, so a process group does not reach them)."""
        return self._marked(f"FLWR_HOME={self.home}".encode())

    @staticmethod
    def _marked(mark: bytes) -> list[int]:
        pids = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and int(d.name) != os.getpid():
                try:
                    if mark in (d / "environ").read_bytes().split(b"\0"):
                        pids.append(int(d.name))
                except OSError:
                    pass
        return pids

    def stop(self) -> None:
        for pid in self._ours():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        while self._ours() and time.monotonic() < deadline:
            time.sleep(0.2)  # bounded: detached app processes exit on SIGTERM
        for pid in self._ours():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class InProcessGrid:
    """Carries a ServerApp's messages to the ClientApp handlers of each node, and their replies back, in this
    process: each hospital with its own node context, as a SuperNode would hand them to its ClientApp.

    ``hold(message, context)``, when given, sees each message first: it may wait (the order two runs reach a
    stage in) or return the reply itself (a message it had another node's handler answer)."""

    def __init__(self, contexts: dict, hold=None):
        from itertools import count

        self.contexts, self.replies, self.hold = contexts, {}, hold
        self._ids = count()
        self.answered: list[str] = []  # the stage of every message a hospital answered without an error
        self.errors: dict[tuple[str, str], str] = {}  # (hospital, stage) -> why its handler refused

    def push_messages(self, messages):
        from secure_afl.flower import client_app
        from secure_afl.flower.records import RECEIPT, SECAGG, unpack_str

        out = []
        for m in messages:
            mid = f"m{id(self)}-{next(self._ids)}"
            m.metadata.__dict__["_message_id"] = mid  # what the SuperLink assigns
            ctx = self.contexts[m.metadata.dst_node_id]
            handler = {SECAGG: client_app.secagg, RECEIPT: client_app.receipt}[m.metadata.message_type]
            reply = self.hold(m, ctx) if self.hold is not None else None
            if reply is None:
                reply = handle(handler, m, ctx)
            stage = unpack_str(m.content, "stage") if m.metadata.message_type == SECAGG else "receipt"
            if reply.has_error():
                self.errors[(str(ctx.node_config["name"]), stage)] = reply.error.reason
            elif m.metadata.message_type == SECAGG:
                self.answered.append(stage)
            self.replies[mid] = reply
            out.append(mid)
        return out

    def pull_messages(self, ids):
        return [self.replies.pop(i) for i in ids if i in self.replies]


def handle(handler, message, context):
    """A ClientApp handler's reply; its exception reaches the ServerApp as an error reply, as Flower sends it."""
    from flwr.app import Error, Message

    try:
        return handler(message, context)
    except Exception as e:
        return Message(Error(code=1, reason=f"{type(e).__name__}: {e}"), reply_to=message)


def node_contexts(c, run_id: int, data: dict, hospitals) -> dict:
    """One hospital node context per hospital of ``c`` (node ids 1..n), as its SuperNode's --node-config gives;
    each run's SuperNodes with their own sealed-state directories (two SuperNodes never share one)."""
    from flwr.app import Context, RecordDict

    return {i + 1: Context(run_id=run_id, node_id=i + 1, state=RecordDict(), run_config={}, node_config={
        "role": "hospital", "name": h, "pki-dir": str(c.pki_dir), "data": str(data[h]),
        "secagg-dir": str(c.root / "secagg" / f"run-{run_id}" / h), "receipts-dir": str(c.root / "receipts" / h)})
        for i, h in enumerate(hospitals)}
