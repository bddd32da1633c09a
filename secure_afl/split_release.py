"""split's release in one place, each party's part beside the others'.

* the server (:func:`cohort_masked_sum`, from :mod:`secure_afl.split.roles`): the masked sum of exactly the
  cohort the key holder's signed share statement names, which it signs and stores as its commitment before it
  has the share (:func:`secure_afl.split.sign_masked_sum`);
* the key holder (:func:`form_release`): its share (``-sum`` of that cohort's masks) added to the sum it kept,
  decoded, checked and solved;
* the auditor (:func:`audit_release`): from what the server holds (the masked uploads), the signed messages and
  the key holder's kept copy, the masked sum recomputed bit for bit, then the release and W, naming the party
  at fault.

This module sits beside :mod:`secure_afl.split`, not in it: the checks and the solve it runs
(:mod:`secure_afl.certify`, :mod:`secure_afl.dp`) reach the backends, which reach :mod:`secure_afl.split`.
"""

from __future__ import annotations
import hashlib
from dataclasses import dataclass, field
import numpy as np

from . import split
from .analytic import solve_from_sums
from .cohort import ReleasePolicy
from .certify import WBound, certify_release
from .envelope import open_envelope, seal
from .exceptions import DecryptionRefused, MalformedPayload, SecureAFLError
from .packing import Layout
from .params import SessionParams
from .release_checks import check_class_minimum, check_release_policy, sanity_check
from .stats import SufficientStatistics
from .split import cohort_masked_sum  # the server's part of the release, beside the key holder's and the auditor's

__all__ = ["SplitRelease", "form_release", "cohort_masked_sum", "ReleaseAudit", "audit_release"]


@dataclass
class SplitRelease:
    """One split release: the float64 sum, its statistics, W and what the checks and the solve said."""

    vector: np.ndarray
    stats: SufficientStatistics
    W: np.ndarray
    sanity: dict
    dp: dict | None
    bound: WBound
    tol: float


def form_release(params: SessionParams, masked_sum: bytes, share, contributors: int, policy: ReleasePolicy, *,
                 lam: float = 0.0, min_class_count: int = 1) -> SplitRelease:
    """``dec(masked_sum + share)`` over the ``contributors`` uploads of one cohort, checked and solved as the
    other backends' key holders check and solve theirs: first the signed ``policy``'s checks on the released
    statistics (:func:`~secure_afl.release_checks.check_release_policy`: the share cap, the Gram's
    definiteness under the Gram statement), then without DP the shape checks (those a proven upload can
    break by a 2^-30 relative slack are reported, not a veto: docs/VALIDITY.md), the rare-class refusal and
    RI restoration; with DP the noise-aware checks and the DP solve (PSD repair and the calibrated ridge).
    ``lam``: the ridge asked on top. :class:`~secure_afl.exceptions.SanityCheckFailed` when the sum and the
    share do not decode within what proven uploads can reach (they were not formed over the same uploads)."""
    vector = split.collect(params, masked_sum, share)
    stats = Layout(params.layout.dim, params.layout.n_classes).unpack(vector, gamma=params.gamma)
    check_release_policy(policy, params, stats)
    tol = split.expected_abs_error(params, contributors)
    if params.dp is None:
        sanity = sanity_check(stats, params, contributors, abs_tol=tol, advisory=split.ADVISORY_CHECKS).to_dict()
        check_class_minimum(stats, min_class_count)
        W, dp_info = solve_from_sums(stats, lam=lam), None
    else:
        from .dp import dp_sanity_check, dp_solve
        from .dp.mechanism import release_epsilon

        if contributors < int(params.dp["min_contributors"]):
            raise DecryptionRefused(f"{contributors} contributions carry less than the declared noise "
                                    f"(dp min_contributors={params.dp['min_contributors']})", reason="dp_noise_short")
        # a proven upload may exceed the declared per-entry bound (up to 2T, docs/VALIDITY.md) without wrapping:
        # the noisy bound is reported, as the non-DP shape checks are, so it cannot veto the release
        sanity = {"checks": dp_sanity_check(stats, params, contributors, advisory=("noisy_bound",))}
        W, solve_info = dp_solve(stats, params, contributors, lam=lam)
        dp_info = {**dict(params.dp), "epsilon": release_epsilon(params, contributors), "contributors": contributors,
                   "solve": solve_info}
    bound = certify_release(params, stats, W, contributors, lam=lam)
    return SplitRelease(vector, stats, W, sanity, dp_info, bound, tol)


@dataclass
class ReleaseAudit:
    """What :func:`audit_release` found: ``mismatches`` names each part that does not hold (empty: everything
    recomputed), ``checked`` what held, ``w_max_diff`` the largest entry of |W(recomputed) - W(model)|,
    ``at_fault`` the parties the mismatches point at (``server``, ``keyholder``), in that order."""

    mismatches: list
    checked: list
    w_max_diff: float | None = None
    at_fault: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


def audit_release(params: SessionParams, manifest: dict, uploads: dict, seed_statements: dict, share: bytes,
                  share_statement: dict, signed_sum: dict, masked_sum: bytes, W, model_meta: dict, *, server_pub,
                  keyholder_pub, enrolled: dict, policy: ReleasePolicy, kept: dict | None = None,
                  verifier_messages: dict | None = None) -> ReleaseAudit:
    """Recompute a split release from what the server holds, the signed messages around it and (``kept``) the
    key holder's kept copy of the server's commitment, and name whatever does not match and who is at fault.

    ``uploads``: hospital -> the masked payload the server stored (uniform words without the key holder's
    seeds); ``seed_statements``: hospital -> its signed seed statement; ``share`` and ``share_statement``: the
    key holder's share and its signed statement, as the server stored them; ``signed_sum`` and ``masked_sum``:
    the server's stored signed statement and sealed masked sum; ``kept``: the key holder's
    ``<session>.split-commitment.json`` (its share statement, the server-signed sum statement it was given and
    the sum's bytes, base64); ``W`` and ``model_meta``: the model file; ``policy``: the signed session's
    release policy (its checks on the released statistics run as the key holder's did);
    ``verifier_messages``: hospital -> the server's signed verifier message (under DP with the Gram statement
    each cohort upload's noise words are permuted at the query seed the server signed it at,
    :mod:`secure_afl.split.noise_twist`).

    The sum the release is judged on is the one the key holder was given: its kept copy when there is one,
    else the server's stored one. The server is at fault when that sum, signed by it for the key holder's
    statement, is not bit for bit the sum of exactly the cohort's stored uploads (each the payload its hospital
    signed), or when its state holds another signed sum or statement than the key holder kept. The key holder
    is at fault when its kept copy is not signed by the server, when W is not the release of that sum with its
    share (same code, so bit for bit: the solve is deterministic, :mod:`secure_afl.analytic`), or when the
    model names another cohort, session, statement or sum. What this cannot check is that the share is the
    cohort's masks: only the key holder holds the seeds, and the share is its signed word."""
    from .backends import get_backend

    bad, ok, fault = [], [], []

    def blame(party: str, line: str) -> None:
        bad.append(f"{line} [at fault: {'the server' if party == 'server' else 'the key holder'}]")
        if party not in fault:
            fault.append(party)

    cohort = list(share_statement.get("cohort") or []) if isinstance(share_statement, dict) else []
    try:
        words = split.verify_share(params, manifest, share, share_statement, keyholder_pub)
        ok.append("the share statement is the key holder's, over this manifest and share")
    except SecureAFLError as e:
        blame("server", f"share statement: the server's state holds no share of the key holder's for it ({e})")
        words = None
    given, given_signed = bytes(masked_sum), signed_sum
    if kept is not None:
        try:
            import base64

            given, given_signed = base64.b64decode(kept["aggregate"], validate=True), kept["masked_sum"]
            if kept.get("share_statement") != share_statement:
                blame("server", "the key holder's kept share statement is not the one the server's state holds")
            split.verify_masked_sum(params, share_statement, given, given_signed, server_pub)
            ok.append("the key holder's kept copy is the server's signed masked sum for this share statement")
            if given != bytes(masked_sum) or given_signed != signed_sum:
                blame("server", "masked sum: the server's state holds another signed sum than the one it gave the "
                                "key holder (two commitments for one share statement)")
        except (KeyError, TypeError, ValueError, SecureAFLError) as e:
            blame("keyholder", f"kept copy: not the server's signed masked sum for this share statement ({e})")
            given, given_signed = bytes(masked_sum), signed_sum
    by_h = {p["hospital"]: p["payload_sha256"] for p in manifest.get("participants", [])}
    backend = get_backend(params)
    F = split.field_of(params)
    total = F.zeros(split.main_words(params))
    circuit = split.Circuit(params) if split.noise_beside(params) else None
    for h in cohort:
        payload = uploads.get(h)
        sha = None if payload is None else hashlib.sha256(payload).hexdigest()
        if payload is None or sha != by_h.get(h):
            blame("server", f"upload of {h}: {'missing' if payload is None else 'not the payload the manifest lists'}")
            continue
        try:
            split.verify_seed_statement(seed_statements.get(h) or {}, enrolled[h], params, h, sha)
        except (KeyError, SecureAFLError) as e:
            blame("server", f"upload of {h}: its signed seed statement does not hold ({e})")
            continue
        total = F.add(total, backend.masked_words(payload))
        if split.noise_beside(params):
            try:
                msg = (verifier_messages or {})[h]
                qs = split.verify_leader_message(msg, server_pub, circuit, h, sha, split.signed_query_seed(msg, h))[0]
            except (KeyError, SecureAFLError) as e:
                blame("server", f"upload of {h}: no signed verifier message of the server's for it ({e})")
                continue
            total = F.add(total, split.noise_twist(circuit, circuit.upload_share(payload), qs))
    recomputed = seal(params, "aggregate", F.to_bytes(total), contributors=len(cohort))
    if recomputed != given:
        blame("server", "masked sum: the server's signed sum is not the sum of the cohort's stored masked uploads "
                        "(forged or over another set)")
    else:
        ok.append(f"the masked sum is, bit for bit, the sum of the {len(cohort)} cohort uploads")
    try:
        split.verify_masked_sum(params, share_statement, given, given_signed, server_pub)
        ok.append("the server signed that masked sum for this share statement")
    except SecureAFLError as e:
        blame("server", f"masked-sum statement: {e}")
    diff = None
    if words is not None:
        try:
            lam = float(model_meta.get("lambda", 0.0))
            rel = form_release(params, given, words, len(cohort), policy, lam=lam)
            W = np.asarray(W, dtype=np.float64)
            if W.shape != rel.W.shape:
                blame("keyholder", f"model: W has shape {W.shape}, the release's is {rel.W.shape}")
            else:
                diff = float(np.max(np.abs(W - rel.W))) if W.size else 0.0
                # bit for bit on the key holder's install; another install's linear algebra may round apart
                if diff > 1e-9 * max(1.0, float(np.max(np.abs(rel.W)))):
                    blame("keyholder", f"model: W is not the release of the server's sum with the key holder's "
                                       f"share (differs by up to {diff:.3g})")
                else:
                    ok.append("W recomputed from the sum the key holder was given and its share, " +
                              ("bit for bit" if diff == 0.0 else f"within {diff:.2g} (another install's rounding)"))
        except SecureAFLError as e:
            line = f"release: the sum and the share do not form a release ({e})"
            if "server" in fault:  # what follows from the server's sum
                bad.append(line)
            else:  # the sum is the cohort's: the share is not its masks
                blame("keyholder", line)
    if list(model_meta.get("participants") or []) != cohort:
        blame("keyholder", f"model: names participants {model_meta.get('participants')}, the share statement's "
                           f"cohort is {cohort}")
    if model_meta.get("session") != params.session_id or model_meta.get("params_digest") != params.digest().hex():
        blame("keyholder", "model: for another session or parameters")
    for k, want in (("share_statement_sha256", split.share_statement_digest(share_statement)
                     if isinstance(share_statement, dict) else None),
                    ("masked_sum_sha256", hashlib.sha256(given).hexdigest())):
        if model_meta.get(k) is not None and model_meta[k] != want:
            blame("keyholder", f"model: its {k} is not the one the key holder was given")
    return ReleaseAudit(bad, ok, diff, fault)
