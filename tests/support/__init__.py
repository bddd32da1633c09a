"""Helpers shared by the tests; the only module a test imports besides the package under test.

``Consortium`` is a small consortium on 127.0.0.1 (PKI, config, a real server
process); :mod:`support.flower` a local Flower deployment (imports flwr);
:mod:`support.secagg_adversary` a malicious secagg server; :mod:`support.reaper`
ends every process a test run started, however the run ends.
"""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import numpy as np

from secure_afl import pki
from secure_afl.session.signed import sign as sign_session
from secure_afl.audit_verify import load_receipts, verify_log
from secure_afl.clients.hospital import HospitalClient
from secure_afl.tools.demo import ServerProcess
from secure_afl.server.config import write_config
from secure_afl.keyholder import KeyHolder
from secure_afl.stats import StatisticsAccumulator


def free_port() -> int:
    """A port nothing listens on now (the OS's pick; a race with other programs is possible but harmless here)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Consortium:
    def __init__(self, root: Path, *, backend: str, hospitals=("h1", "h2", "h3"), dim=6, classes=3,
                 min_clients=2, max_norm=4.0, n_max=1000, k_max=8, extra_session=None, secagg=None,
                 extra_server=None, extractor=None, dp=None, sign=True):
        self.root = Path(root)
        self.backend = backend
        self.hospitals = list(hospitals)
        self.dim, self.classes = dim, classes
        self.session_id = f"t-{backend}"
        self.pki_dir = self.root / "pki"
        if not (self.pki_dir / "ca.pem").exists():
            pki.init_ca(self.pki_dir)
            pki.issue(self.pki_dir, "server", "aggregator")
            pki.issue(self.pki_dir, "keyholder", "keyholder")
            for h in self.hospitals:
                pki.issue(self.pki_dir, "hospital", h)
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.min_clients = min_clients
        cfg = {
            "session": {"id": self.session_id, "backend": backend, "dim": dim, "classes": classes, "gamma": 1.0,
                        "hospitals": self.hospitals, **(extra_session or {})},
            "bounds": {"max_norm": max_norm, "n_max": n_max, "k_max": k_max},
            "server": {"host": "127.0.0.1", "port": self.port, "data_dir": str(self.root / "server"),
                       "pki_dir": str(self.pki_dir), "name": "aggregator", "keyholder": "keyholder",
                       **(extra_server or {})},
        }
        if min_clients is not None:  # None: the session.toml default
            cfg["session"]["min_clients"] = min_clients
        if secagg:
            cfg["secagg"] = secagg
        if dp:
            cfg["dp"] = dp
        if extractor:
            cfg["extractor"] = extractor
        self.config = self.root / "session.toml"
        write_config(self.config, cfg)
        if sign:
            sign_session(self.config, self.pki_dir)  # the operator signs what every party pins
        self.server = None
        self.keyholder = KeyHolder(self.pki_dir, "keyholder", self.root / "keys", passphrase=b"test passphrase")
        self.max_norm = max_norm

    def start(self):
        self.server = ServerProcess(self.config, self.root / "server.log").start()
        kh = self.keyholder.party
        self.server.wait_ready(self.url, kh.ca_file, (kh.cert_file, kh.key_file), timeout=60)
        return self

    def stop(self):
        if self.server:
            self.server.stop()

    def kill9(self):
        self.server.kill()

    def hospital(self, name) -> HospitalClient:
        return HospitalClient(self.url, self.session_id, pki.load_party(self.pki_dir, "hospital", name),
                              receipts_dir=self.root / "receipts", timeout=60)

    def data(self, name, n=40, seed=None):
        rng = np.random.default_rng(seed if seed is not None else abs(hash(name)) % 2**32)
        X = rng.standard_normal((n, self.dim))
        X *= (0.9 * self.max_norm / np.linalg.norm(X, axis=1, keepdims=True)) * rng.uniform(0.1, 1, (n, 1))
        y = rng.integers(0, self.classes, n)
        return X, y

    def stats(self, X, y):
        acc = StatisticsAccumulator(self.dim, self.classes, max_norm=self.max_norm)
        acc.update(X, y)
        return acc.finalize(gamma=0.0)

    def connect_keyholder(self):
        return self.keyholder.connect(self.url, self.session_id)

    def audit_path(self) -> Path:
        return self.root / "server" / self.session_id / "audit.jsonl"


def w_error_bound(X, W, entry_bound: float, n_classes: int, ridge: float = 0.0) -> float:
    """||W_released - W||_F allowed by a per-entry bound E on the released C and Q and a ridge (perturbation
    theory): ||dW|| <= (||dQ||_F + (||dC||_2 + ridge) ||W||_F) / (sigma_min(C) - ||dC||_2),
    ||dC||_2 <= d E, ||dQ||_F <= sqrt(dC) E."""
    C = X.T @ X
    d = C.shape[0]
    dC, dQ = d * entry_bound, np.sqrt(d * n_classes) * entry_bound
    smin = float(np.linalg.eigvalsh(C)[0])
    assert smin > dC, "the bound needs a well-conditioned Gram"
    return (dQ + (dC + ridge) * np.linalg.norm(W)) / (smin - dC)


def run_hospitals(c: Consortium, data: dict, stop_before: dict) -> tuple[dict, dict]:
    """Every hospital of ``c`` submits its statistics in its own thread; ``stop_before[h]`` makes h drop out
    before that stage. Returns (results, errors) by hospital."""
    results, errors = {}, {}

    def go(h):
        cl = c.hospital(h)
        try:
            results[h] = cl.submit(c.stats(*data[h]), stop_before=stop_before.get(h), timeout=120)
        except Exception as e:  # collected and asserted on by the caller
            errors[h] = e
        finally:
            cl.close()

    threads = [threading.Thread(target=go, args=(h,), daemon=True) for h in c.hospitals]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    return results, errors


def verify_countersigned(c: Consortium):
    """The auditor's check: the log up to the key holder's countersigned head, with every receipt."""
    bundle = json.loads((c.audit_path().parent / "audit-head.json").read_text())
    return verify_log(c.audit_path(), server_pub=pki.load_party(c.pki_dir, "server", "aggregator").identity_pub(),
                      head=bundle, countersign=bundle["countersign"],
                      keyholder_pub=pki.load_party(c.pki_dir, "keyholder", "keyholder").identity_pub(),
                      receipts=load_receipts(c.root / "receipts"))


VECTORS = Path(__file__).resolve().parents[2] / "vectors"


def load_vectors(filename: str) -> list[dict]:
    """The cases of ``vectors/<filename>``: a list, or ``{"provenance": {...}, "vectors": [...]}``."""
    data = json.loads((VECTORS / filename).read_text())
    return data["vectors"] if isinstance(data, dict) else data


def json_parametrize(keys, filename: str):
    """``pytest.mark.parametrize`` over the cases of ``vectors/<filename>`` (missing keys -> None)."""
    import pytest

    if isinstance(keys, str):
        keys = tuple(k.strip() for k in keys.split(","))
    cases = load_vectors(filename)
    ids = [str(c.get("name", i)) for i, c in enumerate(cases)]
    return pytest.mark.parametrize(keys, [tuple(c.get(k) for k in keys) for c in cases], ids=ids)
