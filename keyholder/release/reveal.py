"""plain and secagg: verify the manifest, reveal the server's aggregate (secagg: unmask it), check and solve."""

from __future__ import annotations

import hashlib

from secure_afl.backends import HE_BACKENDS, get_backend
from secure_afl.exceptions import DecryptionRefused, SecureAFLError
from secure_afl.hazmat.fixedpoint import abs_error_bound
from secure_afl.certify import certify_release
from secure_afl.packing import Layout
from secure_afl.params import SessionParams
from secure_afl.release_checks import ReleaseLedger, check_aggregate_against_manifest

from .common import FinalResult, class_minimum, release_report, solve_and_account, statistics_checks
from .session_release import SessionRelease


def reveal_and_solve(rel: SessionRelease, aggregate: bytes, manifest: dict, *, lam: float = 0.0,
                     min_class_count: int = 1, unmask: dict | None = None) -> FinalResult:
    """plain / secagg: verify the manifest, reveal the server's aggregate, check and solve, in the order their
    safety needs.

    Neither backend has a key whose decryption noise could leak it: plain
    is the reference mode, and secagg's masks cancel exactly, so the
    server's sum is unmasked here. ``unmask`` is the server's reconstructed
    material (survivors' self-mask seeds, dropped hospitals' mask keys); a
    wrong material yields garbage that the sanity checks refuse. ckks goes
    through :func:`secure_afl.keyholder.release.he.release_he`, which never decrypts a server-formed sum.
    """
    params = rel.params
    if params.backend in HE_BACKENDS:
        raise DecryptionRefused(f"a {params.backend} release is formed by re-summing the signed uploads (finalize); "
                                "a server-formed aggregate is never decrypted")
    # the aggregate is the one the server signed over a manifest of the signed quorum of the roster, before
    # anything is revealed or recorded
    try:
        m = check_aggregate_against_manifest(params, aggregate, manifest, rel.server_identity, rel.enrolled,
                                             rel.policy)
    except SecureAFLError as e:
        raise DecryptionRefused(f"not decrypting: {e}") from e
    participants = sorted(p["hospital"] for p in m["participants"])
    agg_sha = hashlib.sha256(aggregate).hexdigest()
    key_id = f"session:{params.session_id}"
    ledger = ReleaseLedger(rel.release_ledger)
    try:
        # no second, overlapping cohort of this session: differencing two aggregates would expose a hospital
        ledger.check(key_id, params.session_id, participants, agg_sha)
        vector, tol = _reveal(params, aggregate, unmask, len(participants))
        stats = Layout(params.layout.dim, params.layout.n_classes).unpack(vector, gamma=params.gamma)
        sanity = statistics_checks(stats, params, participants, tol)
        class_minimum(stats, params, min_class_count)
        # the privacy ledger records the release as W is solved
        W, privacy = solve_and_account(rel, stats, participants, lam, agg_sha)
        w_bound = certify_release(params, stats, W, len(participants), lam=lam)
        # recorded once every check has passed: a refused aggregate does not hold back another cohort's
        ledger.record(key_id, params.session_id, participants, agg_sha)
    finally:
        ledger.close()
    report = release_report(params, participants, stats, lam, sanity, tol, agg_sha)
    report.update({"dp": privacy, "w_error_bound": w_bound.to_dict(), "verdict": w_bound.verdict})
    return FinalResult(W, stats, params, m, report)


def _reveal(params: SessionParams, aggregate: bytes, unmask: dict | None, contributors: int):
    """``(vector, error bound per entry)`` of the server's aggregate; secagg: unmasked with ``unmask``."""
    backend = get_backend(params)
    if params.backend == "secagg":
        if unmask is None:
            raise DecryptionRefused("secagg release needs the unmask material")
        return backend.reveal(aggregate, unmask=unmask), abs_error_bound(
            tuple(params.backend_params["frac_bits"]), contributors, params.bounds.aggregate_bound(params.gamma))
    return backend.reveal(aggregate), 1e-9
