"""What the key holder checks before and after it reveals an aggregate.

Library code (no network), used by :mod:`secure_afl.keyholder`:

* :func:`check_aggregate_against_manifest` - the aggregate payload is the one
  the server-signed manifest names, for this session and parameters, the
  manifest reaches the release policy's quorum, and the aggregate's header
  claims as many contributors as the manifest lists;
* :func:`check_release_policy` - the signed policy's share cap and, under the
  Gram statement, the released Gram's positive semi-definiteness;
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

from secure_afl.analytic import ri_restore_gram
from secure_afl.cohort import ReleasePolicy, check_quorum
from secure_afl.envelope import open_envelope
from secure_afl._io import private_file
from secure_afl.exceptions import DecryptionRefused, PolicyViolation, SanityCheckFailed
from secure_afl.params import SessionParams
from secure_afl.signing import verify_manifest
from secure_afl.stats import SufficientStatistics

__all__ = ["check_aggregate_against_manifest", "sanity_check", "SanityReport", "ReleaseLedger",
           "check_class_minimum", "check_release_policy"]


def check_aggregate_against_manifest(params: SessionParams, aggregate: bytes, manifest: dict, server_pub,
                                     enrolled: dict, policy: ReleasePolicy) -> dict:
    """Verify the manifest (signatures, enrolment, the ``policy``'s quorum) and bind the aggregate to it.

    Raises :class:`DecryptionRefused` (wrapping the precise cause in
    ``__cause__``) so nothing is decrypted for an aggregate the manifest does
    not back.
    """
    m = verify_manifest(manifest, server_pub, enrolled, 1, session_id=params.session_id,
                        params_digest=params.digest(),
                        aggregate_sha256=hashlib.sha256(aggregate).digest())
    check_quorum(policy, len(m["participants"]))
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
    """The outcome of :func:`sanity_check`: the rounded integer counts and pass/fail per check.

    No float derived from the decryption is kept: what leaves the key holder
    from a check is whether it passed."""

    contributors: int
    n: int
    checks: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"contributors": int(self.contributors), "n": int(self.n), "checks": dict(self.checks)}


def sanity_check(stats: SufficientStatistics, params: SessionParams, expected_contributors: int, *,
                 abs_tol: float, count_tol: float | None = None, spectral_tol: float | None = None,
                 advisory: tuple = ()) -> SanityReport:
    """Is ``stats`` a plausible sum of ``expected_contributors`` hospitals' statistics?

    Hypothesis (H): every revealed entry is within ``abs_tol`` (e) of the true
    sum, the count slots (contributors, n, class counts) within ``count_tol``
    (e_n, default e), and the revealed Gram's error E has ||E||_2 <=
    ``spectral_tol`` (rho, default d e, which ||E||_2 <= ||E||_F <= d e
    always gives). Every check below holds for ANY honest cohort under (H):
    the key holder's flooding makes (H) hold except with probability 2^-40
    (``keyholder/flooding.py``), so an honest cohort is refused only with that
    probability, whatever its data (singular C, zero columns, one sample).
    Writing C, Q, c, n for the true sums and C', Q', c', n' for the revealed ones:

    * contributors: |K' - K| <= e_n (the true counter is K; a forwarded single
      ciphertext has 1). Needs e_n < 1/2, which also makes the next three exact.
    * counts_integral: |c'_j - round(c'_j)| <= e_n and c'_j >= -e_n: true counts are
      non-negative integers, and e_n < 1/2 makes round(c'_j) = c_j.
    * counts_sum: sum_j round(c'_j) = round(n') (true counts sum to n exactly).
    * n_bound: round(n') <= K n_max.
    * symmetric: |C'_ij - C'_ji| <= 2 e (C is symmetric).
    * psd: lambda_min(C') >= -rho - d u ||C'||_F: Weyl gives lambda_min(C') >=
      lambda_min(C) - ||E||_2 >= -rho, and eigvalsh is backward stable to d u ||C'||_F.
    * cauchy_schwarz, in a form that never takes the square root of a noisy
      value: C_ii <= C'_ii + e and C_ii >= 0, so
      |C'_ij| <= |C_ij| + e <= sqrt(C_ii C_jj) + e <= sqrt((C'_ii + e)^+ (C'_jj + e)^+) + e.
      Near-zero diagonals cost nothing here: the right side is at least e.
    * class_cauchy_schwarz: Q_ic sums x_ni over the c_c samples of class c, so
      Q_ic^2 <= c_c C_ii and |Q'_ic| <= sqrt(c_c (C'_ii + e)^+) + e.
    * norm_bound: trace(C) <= n B^2, so trace(C') <= n B^2 + d e.

    The restored C' = C'^r - K gamma I with the exact integer K adds one
    rounding per diagonal entry, u |C'^r_ii|, folded into e; the computed
    square roots and products get a relative slack of 8 u.
    Messages name the check, never a decrypted value.
    """
    K = int(expected_contributors)
    d = stats.dim
    u = 2.0 ** -53
    e = float(abs_tol) + u * float(np.max(np.abs(np.diag(stats.gram)))) if d else float(abs_tol)
    e_n = float(abs_tol if count_tol is None else count_tol)
    rho = d * e if spectral_tol is None else float(spectral_tol) + d * u * float(np.max(np.abs(np.diag(stats.gram))))
    checks = {}

    def need(name: str, ok: bool, what: str):
        checks[name] = bool(ok)
        if not ok and name not in advisory:  # advisory: recorded in the report, not a refusal
            raise SanityCheckFailed(
                f"the revealed sum fails the {name} check ({what}): it is not the sum of {K} hospitals' "
                "statistics within the session's declared bounds (a contribution broke the bounds, or the sum "
                "was not formed from the signed contributions)")

    if not e_n < 0.5:
        raise SanityCheckFailed("the count slots are revealed to within 1/2 or worse, so they cannot be checked; "
                                "the session's precision target or bounds are too loose", reason="imprecise_counts")
    need("contributors", abs(stats.contributors - K) <= e_n, "the contributor counter is not the manifest's count")
    counts = np.asarray(stats.class_counts, dtype=np.float64)
    rc = np.round(counts)
    need("counts_integral", bool(np.all(np.abs(counts - rc) <= e_n) and np.all(counts >= -e_n)),
         "class counts are not non-negative integers")
    n = int(np.round(stats.n))
    need("counts_sum", abs(stats.n - n) <= e_n and int(rc.sum()) == n, "the class counts do not sum to n")
    need("n_bound", n <= K * params.bounds.n_max, "n exceeds k n_max")
    C = ri_restore_gram(stats.gram, K, stats.gamma)
    need("symmetric", bool(np.all(np.abs(C - C.T) <= 2 * e)), "the Gram is not symmetric")
    evals = np.linalg.eigvalsh(0.5 * (C + C.T))
    need("psd", evals[0] >= -(rho + d * u * float(np.linalg.norm(C))), "the Gram is not positive semi-definite")
    up = np.sqrt(np.clip(np.diag(C) + e, 0.0, None))
    need("cauchy_schwarz", bool(np.all(np.abs(C) <= np.outer(up, up) * (1 + 8 * u) + e)),
         "an off-diagonal Gram entry exceeds its Cauchy-Schwarz bound")
    q_bound = np.outer(up, np.sqrt(np.clip(rc, 0.0, None))) * (1 + 8 * u) + e
    need("class_cauchy_schwarz", bool(np.all(np.abs(stats.cross) <= q_bound)),
         "a cross-term entry exceeds its per-class Cauchy-Schwarz bound")
    B2 = params.bounds.max_norm ** 2
    diag_mag = float(np.sum(np.abs(np.diag(C))))
    need("norm_bound", float(np.trace(C)) <= n * B2 * (1 + 8 * u) + d * e + d * u * diag_mag,
         "the Gram's trace exceeds n B^2: an embedding beyond the declared norm bound")
    return SanityReport(K, n, checks)


def check_release_policy(policy: ReleasePolicy, params: SessionParams, stats: SufficientStatistics) -> None:
    """What the signed ``policy`` asks of the decoded release ``stats`` itself (:class:`SanityCheckFailed`):

    * ``share_cap`` - with ``max_share`` < 1, one hospital (up to n_max samples) holds at most that share of the
      released n; else one hospital could steer W by more than the consortium signed for;
    * ``psd`` - under the Gram statement every summed upload proved its statistics a Gram matrix, so an honest
      sum cannot be indefinite beyond the backend's ``psd_tolerance`` (:mod:`secure_afl.protection`: what the
      low lanes and the rounding add): an indefinite one means the share or the masked sum is not the cohort's.
      An honest cohort never fails it, so this refusal is no veto (docs/VALIDITY.md, "The Gram statement").

    Messages name the check and the signed values, never a released entry but the rounded sample count."""
    cap = float(policy.max_share)
    if cap < 1.0 and params.bounds.n_max > cap * float(stats.n) * (1 + 2.0 ** -40):
        raise SanityCheckFailed(f"the release pools {round(stats.n)} samples: one hospital (n_max = "
                                f"{params.bounds.n_max}) could hold more than the session's max_share = {cap:g} "
                                "of them", reason="share_cap")
    if not policy.gram_proof:
        return
    from secure_afl.backends import get_backend

    tol = get_backend(params).psd_tolerance(stats.gram)
    if tol is not None and float(np.linalg.eigvalsh(stats.gram)[0]) < -tol:
        raise SanityCheckFailed("the released Gram is not positive semi-definite although every upload in it "
                                "proved its statistics a Gram matrix: the share or the masked sum is not "
                                "the cohort's", reason="psd")


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
        self.db.execute("CREATE TABLE IF NOT EXISTS commitments (key_id TEXT PRIMARY KEY, session_id TEXT, "
                        "statement_sha256 TEXT, masked_sum_sha256 TEXT, share_sent INTEGER, at REAL)")

    def close(self) -> None:
        self.db.close()

    def block(self, key_id: str, reason: str) -> None:
        """Never release under ``key_id`` again (a forgery was presented, or a check after decryption failed)."""
        self.db.execute("INSERT OR IGNORE INTO blocked VALUES (?, ?, ?)", (key_id, reason[:500], time.time()))

    def _check_not_blocked(self, key_id: str) -> None:
        row = self.db.execute("SELECT reason FROM blocked WHERE key_id=?", (key_id,)).fetchone()
        if row:
            raise PolicyViolation(f"key {key_id[:16]} is blocked ({row[0][:160]}); start a new session with a "
                                  "fresh key after finding what failed (a forged manifest or sum points at the "
                                  "server, a failed check after decryption at the server or an upload)",
                                  reason="key_blocked")

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

    def keep_commitment(self, key_id: str, session_id: str, statement_sha256: str, masked_sum_sha256: str) -> None:
        """split: the server's signed masked sum for this key's one share statement, recorded once its copy is
        on disk and before the share leaves. Every later release under the key uses exactly that sum; a
        second, different one is refused (the server could have formed it after seeing the share)."""
        row = self.commitment(key_id)
        if row is not None and (row["statement_sha256"], row["masked_sum_sha256"]) != (statement_sha256,
                                                                                        masked_sum_sha256):
            raise PolicyViolation(f"key {key_id[:16]} already kept the server's masked sum "
                                  f"{row['masked_sum_sha256'][:16]} for its share statement; another one "
                                  f"({masked_sum_sha256[:16]}) is refused", reason="key_used")
        self.db.execute("INSERT OR IGNORE INTO commitments VALUES (?, ?, ?, ?, 0, ?)",
                        (key_id, session_id, statement_sha256, masked_sum_sha256, time.time()))

    def mark_share_sent(self, key_id: str) -> None:
        """split: written before the share is sent (a crash after it still counts the share as gone)."""
        self.db.execute("UPDATE commitments SET share_sent=1 WHERE key_id=?", (key_id,))

    def commitment(self, key_id: str) -> dict | None:
        """split: the kept commitment of ``key_id`` (session, statement and masked-sum hashes, whether the share
        has left), or None."""
        row = self.db.execute("SELECT session_id, statement_sha256, masked_sum_sha256, share_sent FROM commitments "
                              "WHERE key_id=?", (key_id,)).fetchone()
        return None if row is None else {"session_id": row[0], "statement_sha256": row[1],
                                         "masked_sum_sha256": row[2], "share_sent": bool(row[3])}
