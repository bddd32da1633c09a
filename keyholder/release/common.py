"""What every release path shares: the solve and its privacy record, the report, the statistics checks, and
the source of the server's stored uploads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from secure_afl.analytic import solve_from_sums
from secure_afl.dp import dp_sanity_check, dp_solve
from secure_afl.encoding import canonical_json
from secure_afl.exceptions import DecryptionRefused
from secure_afl.params import SessionParams
from secure_afl.release_checks import check_class_minimum, sanity_check


@dataclass
class FinalResult:
    W: np.ndarray
    stats: object
    params: SessionParams
    manifest: dict
    report: dict


def solve_and_account(rel, stats, participants, lam: float, release_id: str):
    """W and the privacy record of the release ``rel`` (:class:`SessionRelease`) makes. Without DP: RI
    restoration and the solve; the release voids any composed epsilon. With DP: PSD repair and the calibrated
    ridge (RI restoration would cancel the noise), accounted in the privacy ledger (secure_afl.dp)."""
    from secure_afl.dp.ledger import PrivacyLedger

    params = rel.params
    if params.dp is None:
        W = solve_from_sums(stats, lam=lam)
        with PrivacyLedger(rel.privacy_ledger) as pl:
            pl.record(params.session_id, release_id, None, 0.0, float("inf"))
        return W, None
    from secure_afl.dp.mechanism import epsilon_from_rdp, release_rdp

    W, solve_info = dp_solve(stats, params, len(participants), lam=lam)
    rdp = release_rdp(params, len(participants))
    delta = float(params.dp["delta"])
    eps = epsilon_from_rdp(rdp, delta)
    with PrivacyLedger(rel.privacy_ledger) as pl:
        composed = pl.preview(release_id, rdp, delta)
        pl.record(params.session_id, release_id, rdp, delta, eps)
    return W, {**dict(params.dp), "epsilon": eps, "epsilon_composed": composed,
               "contributors": len(participants), "solve": solve_info}


def release_report(params, participants, stats, lam, sanity, tol, agg_sha: str | None = None) -> dict:
    return {
        "session_id": params.session_id,
        "backend": params.backend,
        "participants": participants,
        "contributors": len(participants),
        "samples": int(round(stats.n)),
        "class_counts": [int(round(c)) for c in stats.class_counts],
        "gamma": params.gamma,
        # the ridge the key holder asked for, and the one W was solved with (ckks adds its flooding ridge)
        "lambda_requested": lam,
        "lambda_total": lam,
        "aggregate_sha256": agg_sha,
        "params_digest": params.digest().hex(),
        "sanity": sanity if isinstance(sanity, dict) else sanity.to_dict(),
        "error_bound_per_entry": tol,
    }


class HTTPSource:
    """The server's stored manifest, uploads and tag statements, fetched over the key holder's mTLS link."""

    def __init__(self, conn):
        self.conn = conn

    def manifest(self) -> dict:
        return self.conn.request("GET", self.conn.path("/manifest")).json()

    def contribution(self, hospital: str) -> bytes:
        return self.conn.request("GET", self.conn.path(f"/contributions/{hospital}")).content

    def tags(self) -> dict:
        return self.conn.request("GET", self.conn.path("/tags")).json()

    def split_verifier(self) -> dict:
        return self.conn.request("GET", self.conn.path("/split/verifier")).json()

    def split_statements(self, after: int = 0) -> dict:
        """The seed statements of the uploads after the first ``after`` the server accepted."""
        suffix = f"?after={int(after)}" if after else ""
        return self.conn.request("GET", self.conn.path("/split/statements") + suffix).json()

    def split_queries(self, queries: dict) -> dict:
        return self.conn.request("POST", self.conn.path("/split/queries"), body=canonical_json(queries)).json()


def statistics_checks(stats, params, participants, tol, *, count_tol=None, spectral_tol=None):
    """The statistics checks; with DP the noise-aware ones, after refusing a release carrying less noise
    than the session declared (fewer contributions than dp min_contributors)."""
    if params.dp is None:
        return sanity_check(stats, params, len(participants), abs_tol=tol, count_tol=count_tol,
                            spectral_tol=spectral_tol)

    check_dp_noise(params, len(participants))
    return {"checks": dp_sanity_check(stats, params, len(participants))}


def class_minimum(stats, params, min_class_count: int) -> None:
    """The rare-class refusal, for releases without DP only.

    It exists because a class with one sample releases that sample's embedding
    exactly in Q[:, c]. Under DP every entry, counts included, carries noise
    calibrated to one sample's influence, so nothing is released exactly; the
    noisy counts (standard deviation often larger than the class sizes) would
    only turn the rule into a random refusal."""
    if params.dp is None:
        check_class_minimum(stats, min_class_count)


def check_dp_noise(params, contributors: int) -> None:
    """Refuse a DP release summed from fewer noise shares than the session declared (t = min_contributors):
    it would carry less than the declared noise, so less privacy than accounted."""
    if params.dp is not None and contributors < int(params.dp["min_contributors"]):
        raise DecryptionRefused(f"{contributors} contributions carry less than the declared noise "
                                f"(dp min_contributors={params.dp['min_contributors']})", reason="dp_noise_short")
