"""What the key holder checks before and after it reveals an aggregate.

Library code (no network), used by :mod:`secure_afl.keyholder`:

* :func:`check_aggregate_against_manifest` - the aggregate payload is the one
  the server-signed manifest names, for this session and parameters, and its
  header claims as many contributors as the manifest lists;
* :func:`sanity_check` - the revealed sum is a plausible sum of statistics
  (a forwarded single contribution, a poisoned or garbage aggregate fails);
* :class:`ReleaseLedger` - refuses a second release under the same key whose
  cohort overlaps an earlier one (differencing two releases would expose the
  hospitals in the symmetric difference).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from dataclasses import dataclass, field

import numpy as np

from .analytic import ri_restore_gram
from .envelope import open_envelope
from ._io import private_file
from .exceptions import DecryptionRefused, PolicyViolation, SanityCheckFailed
from .params import SessionParams
from .signing import verify_manifest
from .stats import SufficientStatistics

__all__ = ["check_aggregate_against_manifest", "sanity_check", "SanityReport", "ReleaseLedger",
           "check_class_minimum"]


def check_aggregate_against_manifest(params: SessionParams, aggregate: bytes, manifest: dict, server_pub,
                                     enrolled: dict, min_clients: int) -> dict:
    """Verify the manifest (signatures, enrolment, count) and bind the aggregate to it.

    Raises :class:`DecryptionRefused` (wrapping the precise cause in
    ``__cause__``) so nothing is decrypted for an aggregate the manifest does
    not back.
    """
    m = verify_manifest(manifest, server_pub, enrolled, min_clients, session_id=params.session_id,
                        params_digest=params.digest(),
                        aggregate_sha256=hashlib.sha256(aggregate).digest())
    env = open_envelope(params, aggregate, "aggregate")
    claimed = env.header.get("contributors")
    if isinstance(claimed, list):  # secagg names the surviving client ids
        claimed = len(set(claimed)) if all(isinstance(c, int) for c in claimed) else None
    if claimed != len(m["participants"]):
        raise DecryptionRefused(
            f"aggregate header claims {claimed!r} contributors but the manifest lists {len(m['participants'])}")
    return m


@dataclass
class SanityReport:
    contributors: float
    n: float
    min_eigenvalue: float
    max_eigenvalue: float
    max_cauchy_schwarz_excess: float
    checks: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"contributors": self.contributors, "n": self.n, "min_eigenvalue": self.min_eigenvalue,
                "max_eigenvalue": self.max_eigenvalue,
                "max_cauchy_schwarz_excess": self.max_cauchy_schwarz_excess, "checks": self.checks}


def sanity_check(stats: SufficientStatistics, params: SessionParams, expected_contributors: int, *,
                 abs_tol: float) -> SanityReport:
    """Is ``stats`` a plausible sum of ``expected_contributors`` hospitals' statistics?

    With C = C^r - K gamma I restored, checks (each within ``abs_tol``, the
    backend's error bound per entry):

    * the contributor counter equals K (a forwarded single ciphertext has 1);
    * counts are non-negative integers summing to n, and n <= K n_max;
    * C is symmetric and PSD: lambda_min(C) >= -d abs_tol;
    * |C_ij| <= sqrt(C_ii C_jj) (Cauchy-Schwarz for a Gram matrix);
    * |Q_ic|^2 <= counts_c C_ii (Cauchy-Schwarz per class);
    * trace(C) <= n B^2 (every embedding within the declared norm bound).
    """
    K = expected_contributors
    tol = float(abs_tol)
    d = stats.dim
    checks = {}

    def need(name: str, ok: bool, detail: str):
        checks[name] = bool(ok)
        if not ok:
            raise SanityCheckFailed(f"aggregate fails the {name} check: {detail}")

    need("contributors", abs(stats.contributors - K) <= 0.5,
         f"counter says {stats.contributors:.3f}, manifest says {K}")
    counts = stats.class_counts
    need("counts_integral", np.all(np.abs(counts - np.round(counts)) <= max(tol, 1e-6) * 10 + 1e-3)
         and np.all(counts > -0.5), "class counts are not non-negative integers")
    need("counts_sum", abs(counts.sum() - stats.n) <= 0.5 + tol * counts.size, f"sum(counts)={counts.sum():.3f} != n={stats.n:.3f}")
    need("n_bound", stats.n <= K * params.bounds.n_max + 0.5, f"n={stats.n:.0f} > K n_max")
    C = ri_restore_gram(stats.gram, round(stats.contributors), stats.gamma)
    need("symmetric", np.allclose(C, C.T, atol=tol * 10, rtol=0), "Gram is not symmetric")
    evals = np.linalg.eigvalsh(0.5 * (C + C.T))
    scale = max(float(evals[-1]), 1.0)
    need("psd", evals[0] >= -(d * tol + 1e-9 * scale), f"lambda_min = {evals[0]:.3e}")
    diag = np.clip(np.diag(C), 0, None)
    bound = np.sqrt(np.outer(diag, diag))
    excess = float(np.max(np.abs(C) - bound))
    need("cauchy_schwarz", excess <= tol * 10 + 1e-9 * scale, f"max excess {excess:.3e}")
    q_excess = float(np.max(stats.cross ** 2 - np.outer(diag, np.clip(counts, 0, None))))
    need("class_cauchy_schwarz", q_excess <= tol * 10 * (1 + np.abs(stats.cross).max()) + 1e-9 * scale,
         f"max excess {q_excess:.3e}")
    B2 = params.bounds.max_norm ** 2
    need("norm_bound", np.trace(C) <= stats.n * B2 * (1 + 1e-9) + d * tol, "trace(C) > n B^2")
    return SanityReport(float(stats.contributors), float(stats.n), float(evals[0]), float(evals[-1]), excess, checks)


def check_class_minimum(stats: SufficientStatistics, min_class_count: int) -> None:
    """Refuse a release in which a present class has fewer than ``min_class_count`` samples.

    A class with 1 sample releases that sample's embedding exactly (Q[:, c]).
    Absent classes (count 0) release nothing about any patient.
    """
    counts = np.round(stats.class_counts)
    rare = [int(c) for c in np.flatnonzero((counts > 0) & (counts < min_class_count))]
    if rare:
        raise PolicyViolation(f"classes {rare[:10]} have fewer than min_class_count={min_class_count} samples; "
                              "the aggregate would disclose them. Merge or drop those classes, or enrol more data.")


class ReleaseLedger:
    """The key holder's record of what it released under which key (SQLite)."""

    def __init__(self, path):
        # the ledger names every released cohort: as private as the keys (WAL/SHM files copy its mode)
        self.path = private_file(path, "release ledger")
        self.db = sqlite3.connect(self.path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS releases (key_id TEXT, session_id TEXT, participants TEXT, "
                        "aggregate_sha256 TEXT, released_at REAL)")
        self.db.execute("CREATE TABLE IF NOT EXISTS blocked (key_id TEXT PRIMARY KEY, reason TEXT, at REAL)")
        self.db.execute("CREATE TABLE IF NOT EXISTS decryptions (key_id TEXT, session_id TEXT, participants TEXT, "
                        "at REAL)")

    def close(self) -> None:
        self.db.close()

    def block(self, key_id: str, reason: str) -> None:
        """Never release under ``key_id`` again (a forgery was presented, or a check after decryption failed)."""
        self.db.execute("INSERT OR IGNORE INTO blocked VALUES (?, ?, ?)", (key_id, reason[:500], time.time()))

    def _check_not_blocked(self, key_id: str) -> None:
        row = self.db.execute("SELECT reason FROM blocked WHERE key_id=?", (key_id,)).fetchone()
        if row:
            raise PolicyViolation(f"key {key_id[:16]} is blocked ({row[0][:160]}); start a new session with a "
                                  "fresh key after investigating the server", reason="key_blocked")

    def check_unused(self, key_id: str) -> None:
        """A CKKS key decrypts once: each decryption leaks a little of the key (bounded by the
        flooding for ONE query), and a second decryption of the same sum would average the noise away."""
        self._check_not_blocked(key_id)
        row = self.db.execute("SELECT session_id FROM decryptions WHERE key_id=?", (key_id,)).fetchone()
        if row:
            raise PolicyViolation(f"key {key_id[:16]} already decrypted a release (session {row[0]}); a key "
                                  "decrypts once. Start a new session with a fresh key.", reason="key_used")

    def record_decryption(self, key_id: str, session_id: str, participants: list[str]) -> None:
        """Written BEFORE the decryption, so a crash or a failed check still counts it."""
        self.check_unused(key_id)
        self.db.execute("INSERT INTO decryptions VALUES (?, ?, ?, ?)",
                        (key_id, session_id, json.dumps(sorted(participants)), time.time()))

    def decryption_count(self, key_id: str) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM decryptions WHERE key_id=?", (key_id,)).fetchone()[0])

    def blocked_reason(self, key_id: str) -> str | None:
        row = self.db.execute("SELECT reason FROM blocked WHERE key_id=?", (key_id,)).fetchone()
        return row[0] if row else None

    def check(self, key_id: str, session_id: str, participants: list[str], aggregate_sha256: str) -> None:
        self._check_not_blocked(key_id)
        mine = set(participants)
        for sess, parts, agg in self.db.execute(
                "SELECT session_id, participants, aggregate_sha256 FROM releases WHERE key_id=?", (key_id,)):
            if agg == aggregate_sha256:
                continue  # the same release again reveals nothing new
            other = set(json.loads(parts))
            if other & mine:
                raise PolicyViolation(
                    f"a release under key {key_id[:16]} for session {sess} already covered "
                    f"{len(other & mine)} of these hospitals; differencing the two aggregates would expose "
                    "the hospitals in their difference. Use a fresh key (new session) for a new cohort.")

    def record(self, key_id: str, session_id: str, participants: list[str], aggregate_sha256: str) -> None:
        self.db.execute("INSERT INTO releases VALUES (?, ?, ?, ?, ?)",
                        (key_id, session_id, json.dumps(sorted(participants)), aggregate_sha256, time.time()))
