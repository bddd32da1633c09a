"""Helpers shared by the tests; the only module a test imports besides the package under test.

``Consortium`` and ``free_port`` come from the one consortium harness the
tools share (secure_afl_tools.harness: PKI, signed config, a real server
process on 127.0.0.1); :mod:`support.flower` a local Flower deployment (imports flwr);
:mod:`support.secagg_adversary` a malicious secagg server; :mod:`support.reaper`
ends every process a test run started, however the run ends.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np

from secure_afl import pki
from secure_afl.audit_verify import load_receipts, verify_log
from secure_afl.server.config import write_config
from secure_afl_tools.harness import Consortium, free_port

__all__ = ["Consortium", "free_port", "write_config", "w_error_bound", "run_hospitals", "verify_countersigned", "load_vectors",
           "json_parametrize", "VECTORS"]


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


def plain_reference(c: Consortium, data: dict, names=None):
    """The plaintext sum of the named hospitals' statistics (every hospital of ``data`` by default; ``data``:
    hospital -> (X, y)): what a release must equal, summed here from the data the hospitals protect."""
    total = None
    for h in (list(data) if names is None else names):
        s = c.stats(*data[h])
        total = s if total is None else total + s
    return total


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
