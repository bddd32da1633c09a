"""The one consortium harness of the tests, the demo, the attack demonstrations and the benchmarks.

Every caller that plays a whole deployment starts the same way: a CA, the
server and the key holder, one certificate per hospital, a session definition
the operator signs (written as ``session.toml`` when a real server process
reads it, or only signed when the parties run in process), then a real
``secure-afl server run`` process on 127.0.0.1. Written once here so that the
tests and the tools cannot drift apart in how they make one. Every wait is a
bounded polling loop, and every process started here is stopped again: by
:meth:`ServerProcess.stop`, or on leaving a ``with`` block.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from secure_afl import pki
from secure_afl.session.definition import normalise
from secure_afl.session.schema import parse
from secure_afl.session.signed import sign, sign_definition
from secure_afl.pki import client_ssl_context
from secure_afl.keyholder.split_stream import POLL_S
from secure_afl.server.config import write_config

SERVER, KEYHOLDER = "aggregator", "keyholder"


def free_port() -> int:
    """A port nothing listens on now (the OS's pick; a race with other programs is possible but harmless here)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A real ``secure-afl server run`` child process, always stopped (``stop``, or leaving ``with``)."""

    def __init__(self, config: Path, log_path: Path):
        self.config, self.log_path = config, log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ServerProcess":
        self._log = open(self.log_path, "ab")
        # one machine plays the operator and the server here: the server reads the CA's own directory
        self.proc = subprocess.Popen([sys.executable, "-m", "secure_afl.cli", "server", "run", "--config",
                                      str(self.config), "--allow-ca-key"], stdout=self._log,
                                     stderr=subprocess.STDOUT)
        return self

    def wait_ready(self, url: str, ca_file, cert=None, timeout: float = 60.0) -> None:
        """Poll ``/v1/health`` over (m)TLS until it answers 200, the process exits, or ``timeout`` passes."""
        import httpx

        ctx = client_ssl_context(ca_file, cert_file=cert[0], key_file=cert[1]) if cert else client_ssl_context(ca_file)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(f"{url}/v1/health", verify=ctx, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready after {timeout} s; see {self.log_path}")

    def kill(self, sig=signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        if getattr(self, "_log", None):
            self._log.close()

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def make_pki(pki_dir, hospitals, *, name: str | None = None, roster: bool = False):
    """A CA named ``name`` (the library's default name if None), the server ``aggregator``, the key holder
    ``keyholder`` and each hospital; what already exists in ``pki_dir`` is kept (a re-run adds what is missing).

    ``roster`` also writes the CA-signed roster (the parties then pin the
    hospitals from it). Returns the server's files and ``{hospital: files}``.
    """
    pki_dir = Path(pki_dir)

    def party(role, who):
        return pki.issue(pki_dir, role, who) if not (pki_dir / f"{role}-{who}").exists() \
            else pki.load_party(pki_dir, role, who)

    if not (pki_dir / "ca.pem").exists():
        pki.init_ca(pki_dir, **({} if name is None else {"name": name}))
    server = party("server", SERVER)
    party("keyholder", KEYHOLDER)
    parties = {h: party("hospital", h) for h in hospitals}
    if roster:
        pki.write_roster(pki_dir, pki_dir / pki.ROSTER)
    return server, parties


def server_section(work, pki_dir, port: int | None = None) -> dict:
    """The ``[server]`` section of a server on 127.0.0.1 keeping its data under ``work/server``."""
    return {"host": "127.0.0.1", "port": free_port() if port is None else port, "data_dir": str(Path(work) / "server"),
            "pki_dir": str(pki_dir), "name": SERVER, "keyholder": KEYHOLDER}


def write_session(config, pki_dir, sections: dict) -> Path:
    """Write ``sections`` as the session config at ``config`` and sign it as the operator (what every party pins)."""
    write_config(config, sections)
    sign(config, pki_dir)
    return Path(config)


def sign_session(pki_dir, sections: dict):
    """Sign the definition in ``sections`` (``session`` and ``bounds``) without a config file: parties in process."""
    return sign_definition(normalise(parse(sections)), pki_dir)


def secagg_quorum(hospitals: int) -> int:
    """The largest min_clients a secagg round of ``hospitals`` can still reach (its share threshold allowing)."""
    from secure_afl.secagg import default_threshold, max_min_clients, recommended_neighbours

    k = recommended_neighbours(hospitals)
    thr = default_threshold((hospitals - 1 if k is None else k) + 1)
    return max(1, min(hospitals - thr + 1, max_min_clients(hospitals, thr)))


def start_server(config, log, url: str, party, timeout: float = 120) -> ServerProcess:
    """A ``secure-afl server run`` process for ``config``, ready at ``url`` as ``party`` sees it over mTLS;
    stopped again when it does not come up, so no process is left behind."""
    proc = ServerProcess(config, log).start()
    try:
        proc.wait_ready(url, party.ca_file, (party.cert_file, party.key_file), timeout=timeout)
    except BaseException:
        proc.stop()
        raise
    return proc


class Consortium:
    """A small consortium on 127.0.0.1: its PKI, its signed ``session.toml``, a real server process (``start``,
    stopped by ``stop`` or on leaving ``with``), the key holder and a client per hospital.

    The tests' consortium fixture; ``data`` and ``stats`` draw hospital data inside the session's bounds.

    ``colluders``: the colluder bound the operator signs (not secagg, whose bound is its threshold's).
    ``"dropout"`` (the fixture's choice) signs the largest bound that still lets one hospital drop out: the
    fixture's tests release over part of a small roster (2 of 3 hospitals at min_clients 2), which the
    session default forbids there (it makes such a session need every hospital); on larger rosters the two
    agree. None signs the session's default (secure_afl.cohort.default_colluders), which
    tests/test_cohort.py and tests/test_session_promises.py hold.
    """

    def __init__(self, root: Path, *, backend: str, hospitals=("h1", "h2", "h3"), dim=6, classes=3,
                 min_clients=2, max_norm=4.0, n_max=1000, k_max=8, extra_session=None, secagg=None,
                 extra_server=None, extractor=None, dp=None, split=None, sign=True, colluders="dropout"):
        from secure_afl.keyholder import KeyHolder

        self.root = Path(root)
        self.backend = backend
        self.hospitals = list(hospitals)
        self.dim, self.classes = dim, classes
        self.session_id = f"t-{backend}"
        self.pki_dir = self.root / "pki"
        make_pki(self.pki_dir, self.hospitals)
        server = server_section(self.root, self.pki_dir)
        self.port = server["port"]
        self.url = f"https://127.0.0.1:{self.port}"
        self.min_clients = min_clients
        cfg = {
            "session": {"id": self.session_id, "backend": backend, "dim": dim, "classes": classes, "gamma": 1.0,
                        "hospitals": self.hospitals, **(extra_session or {})},
            "bounds": {"max_norm": max_norm, "n_max": n_max, "k_max": k_max},
            "server": {**server, **(extra_server or {})},
        }
        if min_clients is not None:  # None: the session.toml default
            cfg["session"]["min_clients"] = min_clients
        if colluders is not None and backend != "secagg":
            if colluders == "dropout":
                from secure_afl.cohort import quorum

                n, mc = len(self.hospitals), 3 if min_clients is None else min_clients
                colluders = max([0] + [c for c in range(mc) if n - quorum(n, c, mc) >= 1])
            cfg["session"].setdefault("colluders", colluders)
        for key, section in (("secagg", secagg), ("dp", dp), ("extractor", extractor), ("split", split)):
            if section:
                cfg[key] = section
        self.config = self.root / "session.toml"
        if sign:
            write_session(self.config, self.pki_dir, cfg)  # the operator signs what every party pins
        else:
            write_config(self.config, cfg)
        self.server: ServerProcess | None = None
        self.keyholder = KeyHolder(self.pki_dir, KEYHOLDER, self.root / "keys", passphrase=b"test passphrase")
        self.max_norm = max_norm

    def start(self, timeout: float = 60) -> "Consortium":
        self.server = start_server(self.config, self.root / "server.log", self.url, self.keyholder.party,
                                   timeout=timeout)
        return self

    def stop(self) -> None:
        if self.server:
            self.server.stop()

    def __enter__(self) -> "Consortium":
        return self.start() if self.server is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    def kill9(self) -> None:
        self.server.kill()

    def hospital(self, name):
        from secure_afl.clients.hospital import HospitalClient

        return HospitalClient(self.url, self.session_id, pki.load_party(self.pki_dir, "hospital", name),
                              receipts_dir=self.root / "receipts", timeout=60)

    def data(self, name, n=40, seed=None):
        rng = np.random.default_rng(seed if seed is not None else abs(hash(name)) % 2**32)
        X = rng.standard_normal((n, self.dim))
        X *= (0.9 * self.max_norm / np.linalg.norm(X, axis=1, keepdims=True)) * rng.uniform(0.1, 1, (n, 1))
        y = rng.integers(0, self.classes, n)
        return X, y

    def stats(self, X, y):
        from secure_afl.stats import StatisticsAccumulator

        acc = StatisticsAccumulator(self.dim, self.classes, max_norm=self.max_norm)
        acc.update(X, y)
        return acc.finalize(gamma=0.0)

    def connect_keyholder(self):
        return self.keyholder.connect(self.url, self.session_id)

    def audit_path(self) -> Path:
        return self.root / "server" / self.session_id / "audit.jsonl"


#: scheduling priority a benchmark's hospital processes lower themselves by (os.nice) where SCHED_IDLE is refused
HOSPITAL_NICE = 10


def behind_the_parties() -> None:
    """Called first in a benchmark's hospital worker process (its threads inherit it): let the server and the key
    holder run first.

    In a deployment the hospitals are other machines; a benchmark runs them on the cores the server and the
    key holder need while the session is open. A lower priority leaves the parties the CPU they would have; a
    hospital's own CPU time, which the benchmarks report, does not change. The hospitals take the idle class
    (``SCHED_IDLE``: a core the parties leave idle), not a nice level: the kernel weighs each runnable thread,
    so 200 hospital threads at nice 10 (weight 110 each) outweighed four verifier workers at nice 0 (1024
    each) about 5 to 1, and at K = 1000, d = 512 the judging fell up to 12 s behind the uploads' last burst."""
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            return
        except OSError:  # refused (a container's policy): the nice level is the fallback
            pass
    if hasattr(os, "nice"):
        os.nice(HOSPITAL_NICE)


class Judging:
    """split: the key holder judging each upload as it arrives, on its own connection, in a thread (what
    ``secure-afl keyholder judge`` does); what is left when the uploads stop, :meth:`catch_up` or the release
    judges.

    ``with Judging(kh, url, session_id, enabled=...) as j:`` around the uploads; afterwards ``j.uploads`` is
    how many were judged, and a failure (a blocked key: the release would be refused) is raised on leaving or
    at :meth:`stop`."""

    def __init__(self, kh, url: str, session_id: str, *, enabled: bool = True, interval_s: float = POLL_S):
        self.kh, self.url, self.session_id, self.interval_s = kh, url, session_id, interval_s
        self.uploads, self.passes, self.error = 0, 0, None
        #: hospital -> wall-clock time (time.time(), the audit log's clock) of the pass that judged it first
        self.judged_at: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True) if enabled else None

    def _loop(self) -> None:
        conn = self.kh.connect(self.url, self.session_id)
        try:
            while not self._stop.wait(self.interval_s):
                self._pass(conn)
        except Exception as e:  # raised by __exit__
            self.error = e
        finally:
            conn.close()

    def _pass(self, conn) -> None:
        records = self.kh.judge_split(conn)
        now = time.time()
        for h in records:
            self.judged_at.setdefault(h, now)
        self.uploads = len(records)
        self.passes += 1

    def __enter__(self):
        if self._thread is not None:
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the loop once its pass in flight is done (a benchmark times that pass with the judging after
        the uploads); its failure is raised here."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.error is not None:
            err, self.error = self.error, None
            raise RuntimeError(f"the key holder's judging failed: {err}") from err

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.stop()
        else:  # the loop stops; the failure in flight is the one to see
            self._stop.set()
            if self._thread is not None:
                self._thread.join()

    def catch_up(self, uploads: int, timeout_s: float = 600.0) -> int:
        """After the uploads (the loop stopped): judge, pass after pass, until ``uploads`` are judged or a pass
        judges nothing new (a statement that does not verify is left to the release, which refuses it by
        name), as a session whose deadline falls after the last upload does before its release. Returns the
        passes made; raises past ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        conn = self.kh.connect(self.url, self.session_id)
        passes, before = 0, -1
        try:
            while self.uploads < uploads and self.uploads != before:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the key holder judged {self.uploads} of {uploads} uploads in {timeout_s:g} s")
                before = self.uploads
                self._pass(conn)
                passes += 1
        finally:
            conn.close()
        return passes
