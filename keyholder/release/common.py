"""What every release path shares: trust (pinned server key, signed roster), the release policy's floor,
the audit head's countersignature, the solve and its privacy record, the report, the model file, and the
source of the server's stored uploads.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from secure_afl import pki
from secure_afl.session.signed import load_signed
from secure_afl._io import write_file
from secure_afl.analytic import solve_from_sums
from secure_afl.audit_log import countersign_head
from secure_afl.cohort import ReleasePolicy, release_policy
from secure_afl.dp import dp_sanity_check, dp_solve
from secure_afl.encoding import canonical_json
from secure_afl.exceptions import DecryptionRefused, InvalidInputError, SecureAFLError
from secure_afl.keyholder_params import sign_session_params
from secure_afl.params import SessionParams
from secure_afl.protocol import context_publication
from secure_afl.release_checks import check_class_minimum, sanity_check
from secure_afl.session.signed import signed_path
from secure_afl.tagging import TAG_KEY_PARAM

from ..connection import KeyHolderConnection
from ..custody import KeyCustody



@dataclass
class FinalResult:
    W: np.ndarray
    stats: object
    params: SessionParams
    manifest: dict
    report: dict


class ReleaseBase(KeyCustody):
    """Trust, policy, audit countersignature and the solve: what each backend's release path builds on."""

    # -- online stages ----------------------------------------------------------------------
    def connect(self, server_url: str, session_id: str) -> KeyHolderConnection:
        return KeyHolderConnection(server_url, self.party, session_id)

    def publish(self, conn) -> dict:
        """Send the public context, the tag key and this key holder's signature over the parameters."""
        return conn.request("POST", conn.path("/context"), body=self.publication_body(conn.session_id)).json()

    def publication_body(self, session_id: str) -> bytes:
        """The publication any transport carries: public context, tag key, signature over the parameters."""

        params = self.params(session_id)
        return context_publication(self.public_context(session_id), params.backend_params[TAG_KEY_PARAM],
                                   sign_session_params(self.party.identity_key(), params))

    def close_round(self, conn) -> dict:
        return conn.request("POST", conn.path("/close")).json()

    def _trust(self, session_id: str, expected_hospitals: list[str] | None):

        try:
            server_pub = pki.pinned_identity(self.pki_dir, "server")
        except SecureAFLError as e:
            raise DecryptionRefused(f"not decrypting: no server identity to check the manifest against ({e})") from e
        enrolled = pki.enrolled_keys(pki.load_enrolments(self.pki_dir, role="hospital"))
        # the session's signed roster, not every hospital the CA issued: an upload signed by a spare or
        # withdrawn identity counts for nothing, whatever the server's manifest says
        roster = set(self._policy(session_id, 1).roster)
        enrolled = {k: v for k, v in enrolled.items() if k in roster}
        if expected_hospitals is not None:
            enrolled = {k: v for k, v in enrolled.items() if k in set(expected_hospitals)}
        return server_pub, enrolled

    def _policy(self, session_id: str, min_clients: int) -> ReleasePolicy:
        """The signed session's release policy with this caller's ``min_clients`` floor. Without the operator's
        signed definition in this key holder's PKI nothing is released (:class:`DecryptionRefused`): a floor
        the caller passes alone would know neither the roster, nor the colluder bound, nor the quorum."""
        if not signed_path(self.pki_dir, session_id).exists():
            raise DecryptionRefused(
                f"not releasing session {session_id}: its signed definition is not in {self.pki_dir} "
                "(the release policy comes from it alone; copy the operator's bundle first)")
        return release_policy(load_signed(self.pki_dir, session_id), min_clients=min_clients)

    def _floor(self, session_id: str, min_clients: int) -> int:
        """Uploads of the roster a release needs: the signed policy's quorum q (which already counts this
        caller's ``min_clients``)."""
        return self._policy(session_id, min_clients).quorum

    def countersign_audit_head(self, conn, manifest: dict) -> dict:
        """Countersign the server's close record (audit seq + head of this release) and hand it back,
        before anything is decrypted: the auditor then holds a head the server alone cannot rewrite."""

        close = conn.request("GET", conn.path("/audit/head")).json()["close"]
        cs = self.countersign_close(close, manifest)
        self.keep_audit_head(conn.session_id, close, cs)
        return conn.request("POST", conn.path("/audit/countersign"), body=canonical_json(cs)).json()

    def audit_head_path(self, session_id: str) -> Path:
        return self.keys_dir / f"{session_id}.audit-head.json"

    def keep_audit_head(self, session_id: str, close: dict, countersign: dict) -> Path:
        """Keep the countersigned head here, before the server gets it: auditors take it from the key holder
        (with the model and report), so a server that withholds or replaces its own copy is noticed."""

        import re

        if not isinstance(session_id, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", session_id):
            raise InvalidInputError(f"not a session id: {session_id!r}")
        path = self.audit_head_path(session_id)
        tmp = path.with_suffix(".tmp")
        write_file(tmp, json.dumps({"close": close, "countersign": countersign}, indent=1, sort_keys=True).encode(),
                   mode=0o644, exclusive=False)
        os.replace(tmp, path)
        return path

    def countersign_close(self, close: dict, manifest: dict) -> dict:
        """The countersignature over ``close``, checked against the pinned server key and the manifest;
        :class:`DecryptionRefused` if it does not hold (nothing is decrypted then)."""

        try:
            return countersign_head(self.party.identity_key(), self.party.name, close,
                                    pki.pinned_identity(self.pki_dir, "server"), manifest)
        except (SecureAFLError, AttributeError, TypeError) as e:
            raise DecryptionRefused(f"not decrypting: the audit close record does not hold ({e})") from e

    def _solve(self, params, stats, participants, lam: float, release_id: str):
        """W and the privacy record. Without DP: RI restoration and the solve; the release voids any
        composed epsilon. With DP: PSD repair and the calibrated ridge (RI restoration would cancel the
        noise), accounted in the privacy ledger (secure_afl.dp)."""
        from secure_afl.dp.ledger import PrivacyLedger

        if params.dp is None:
            W = solve_from_sums(stats, lam=lam)
            with PrivacyLedger(self.keys_dir / "privacy.sqlite3") as pl:
                pl.record(params.session_id, release_id, None, 0.0, float("inf"))
            return W, None
        from secure_afl.dp.mechanism import epsilon_from_rdp, release_rdp

        W, solve_info = dp_solve(stats, params, len(participants), lam=lam)
        rdp = release_rdp(params, len(participants))
        delta = float(params.dp["delta"])
        eps = epsilon_from_rdp(rdp, delta)
        with PrivacyLedger(self.keys_dir / "privacy.sqlite3") as pl:
            composed = pl.preview(release_id, rdp, delta)
            pl.record(params.session_id, release_id, rdp, delta, eps)
        return W, {**dict(params.dp), "epsilon": eps, "epsilon_composed": composed,
                   "contributors": len(participants), "solve": solve_info}

    @staticmethod
    def _report(params, participants, stats, lam, sanity, tol, agg_sha: str | None = None) -> dict:
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
