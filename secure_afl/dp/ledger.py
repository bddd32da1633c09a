"""The key holder's privacy ledger: every DP release it makes composes.

The data of a consortium's patients may enter many sessions released by the
same key holder (its identity key is the consortium's release key), so the
ledger adds the Renyi curves of all its releases, whatever the session, and
reports the composed epsilon at the session's delta. Releasing the same
aggregate again adds nothing (it reveals nothing new). A release without DP
makes the composed guarantee void, and the ledger says so.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import numpy as np

from .mechanism import ORDERS, epsilon_from_rdp

__all__ = ["PrivacyLedger"]


class PrivacyLedger:
    def __init__(self, path):
        self.path = Path(path)
        self.db = sqlite3.connect(self.path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS dp_releases (aggregate_sha256 TEXT PRIMARY KEY, "
                        "session_id TEXT, rdp TEXT, delta REAL, epsilon REAL, released_at REAL)")

    def close(self) -> None:
        self.db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def composed_rdp(self, extra=None) -> np.ndarray:
        total = np.zeros_like(ORDERS)
        for (rdp,) in self.db.execute("SELECT rdp FROM dp_releases"):
            curve = json.loads(rdp)
            total = total + (np.inf if curve is None else np.asarray(curve, dtype=np.float64))
        if extra is not None:
            total = total + np.asarray(extra, dtype=np.float64)
        return total

    def preview(self, aggregate_sha256: str, rdp, delta: float) -> float:
        """Composed epsilon if this release were recorded now."""
        seen = self.db.execute("SELECT 1 FROM dp_releases WHERE aggregate_sha256=?", (aggregate_sha256,)).fetchone()
        curve = self.composed_rdp(None if seen else (np.full_like(ORDERS, np.inf) if rdp is None else rdp))
        return float("inf") if not np.all(np.isfinite(curve)) else epsilon_from_rdp(curve, delta)

    def record(self, session_id: str, aggregate_sha256: str, rdp, delta: float, epsilon: float) -> None:
        """Record one release; ``rdp=None`` for a release without DP (no finite guarantee)."""
        self.db.execute("INSERT OR IGNORE INTO dp_releases VALUES (?, ?, ?, ?, ?, ?)",
                        (aggregate_sha256, session_id, json.dumps(None if rdp is None else [float(x) for x in rdp]),
                         float(delta), float(epsilon), time.time()))

    def releases(self) -> list[dict]:
        return [{"session_id": s, "aggregate_sha256": a, "delta": d, "epsilon": e}
                for a, s, d, e in self.db.execute(
                    "SELECT aggregate_sha256, session_id, delta, epsilon FROM dp_releases ORDER BY released_at")]
