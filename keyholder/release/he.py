"""ckks and bfv: verify and re-sum the signed uploads, decrypt that sum once (ckks: flood it first), check, solve,
certify."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import NamedTuple

import numpy as np

from secure_afl.analytic import ri_restore_gram, solve_from_sums
from secure_afl.backends import get_backend, he_module
from secure_afl.certify import FLOOD_TAIL, certify_release, plain_summation_error
from secure_afl.exceptions import DecryptionRefused, SecureAFLError
from secure_afl.packing import Layout
from secure_afl.release_checks import ReleaseLedger
from secure_afl.tagging import check_aggregate_tag

from ..flooding import flood_decryption, flood_plan, release_norms
from ..verify import ContributionRejected, ServerForgery, resum_signed_contributions, verify_manifest_for
from .common import FinalResult, check_dp_noise, class_minimum, release_report, solve_and_account, statistics_checks
from .session_release import SessionRelease

log = logging.getLogger("secure_afl.keyholder")


class _Decrypted(NamedTuple):
    """The one decryption's vector and what its checks and its solve need of the noise in it."""

    vector: np.ndarray
    tol: float
    count_tol: float
    sigma: float
    spectral: float | None
    noise_norms: object
    flood_info: dict


def release_he(rel: SessionRelease, source, *, lam: float = 0.0, min_class_count: int = 1,
               workers: int | None = None) -> FinalResult:
    """ckks, bfv: verify and re-sum the signed uploads here, decrypt that sum once (ckks: flood it), check, solve,
    certify. The steps in the order their safety needs.

    ``workers`` processes check and re-sum the uploads (default: the machine's cores).
    ``source`` is whatever carried the uploads (the server over HTTPS, a Flower message): its
    ``manifest()``, ``contribution(hospital)`` and ``tags()`` are what the server stored, trusted
    for nothing beyond the signatures they carry.

    A forgery found before decryption, and ANY failure after it, blocks the
    key in the ledger: no later attempt decrypts under it.
    """
    params = rel.params
    key_id = params.backend_params["public_context_sha256"]
    ledger = ReleaseLedger(rel.release_ledger)
    try:
        # a key decrypts once: a used or blocked key is refused before anything is fetched
        ledger.check_unused(key_id)
        t0 = time.perf_counter()
        # the manifest under the signed quorum, every upload checked and summed here: nothing the server computed
        # is decrypted, and a forgery blocks the key before any decryption
        m, backend, ctx, chunks, participants, tags = _verified_sum(rel, source, ledger, key_id, workers)
        verify_s = time.perf_counter() - t0
        K = len(participants)
        # the tags are summed in float64 here; allow that summation's own rounding
        tag_sum_err = plain_summation_error(K, params.bounds.aggregate_bound(params.gamma))
        plan = flood_plan(backend, K) if params.backend == "ckks" else None  # K <= k_max: checked at keygen
        # recorded before the one decryption: a crash or a failed check below still counts as this key's one
        ledger.record_decryption(key_id, params.session_id, participants)
        try:
            # ckks: flooded in the coefficient domain before the one decryption: nothing unflooded exists,
            # not even a check's outcome
            dec = _decrypt_once(params, backend, ctx, chunks, plan, K, tag_sum_err)
            # every check's tolerance is the bound proved for the noise actually added, so an honest cohort
            # passes except with probability 2^-40; the tag check needs the tag key opened with the release
            stats, sanity, tag_check = _checks(rel, dec, m, tags, participants, min_class_count)
            # the privacy ledger records the release as W is solved (the solve is the release)
            W, privacy, ridge, w_bound, bias = _solve_and_certify(rel, backend, stats, dec, participants, lam, key_id)
        except SecureAFLError as e:  # its message names the check, never a decrypted value
            ledger.block(key_id, f"check after decryption failed: {type(e).__name__}: {e}")
            raise
        except BaseException as e:
            ledger.block(key_id, f"release failed after decryption: {type(e).__name__}")
            if not isinstance(e, Exception):
                raise
            # an unexpected error's text could quote decrypted values: the traceback stays in this log only
            log.exception("release failed after decryption")
            raise DecryptionRefused(f"the release failed after decryption ({type(e).__name__}); the key is "
                                    "blocked, details in the key holder's log", reason="release_failed") from None
        # the cohort released under this key: a later release covering any of it is refused (differencing)
        ledger.record(key_id, params.session_id, participants, "resummed:" + key_id)
        # nothing that leaves here (report, exception message) carries a decrypted float: integers are rounded
        # and range-checked, float checks report pass or fail
        report = release_report(params, participants, stats, lam, sanity, dec.tol)
        report.update({"dp": privacy, "tag_check": tag_check, "resummed_by_keyholder": True, **dec.flood_info,
                       "flood_ridge": ridge, "ridge_rel_change": bias, "lambda_total": lam + ridge,
                       "w_error_bound": w_bound.to_dict(), "verdict": w_bound.verdict,
                       "verify_and_resum_seconds": round(verify_s, 3)})
        return FinalResult(W, stats, params, m, report)
    finally:
        ledger.close()


def _verified_sum(rel: SessionRelease, source, ledger, key_id: str, workers):
    """``(manifest, backend, context, summed chunks, participants, tags)``: the server's manifest under this
    key holder's parameters, trust set and the signed quorum, and the sum of the uploads it lists, each checked
    against its hospital's signature. A forgery or an invalid signed upload blocks the key."""
    params = rel.params
    try:
        m = verify_manifest_for(params, source.manifest(), rel.server_identity, rel.enrolled, rel.policy)
        # before anything is decrypted: a sum short of noise shares is never decrypted at all
        check_dp_noise(params, len(m["participants"]))
        backend = get_backend(params)
        ctx = backend.keyholder_context(rel.secret)
        chunks, participants = resum_signed_contributions(params, backend, ctx, m, source.contribution,
                                                          workers=workers)
        tags = source.tags()
    except (ServerForgery, ContributionRejected) as e:
        ledger.block(key_id, f"refused before decryption: {e}")
        raise
    return m, backend, ctx, chunks, participants, tags


def _decrypt_once(params, backend, ctx, chunks, plan, K: int, tag_sum_err: float) -> _Decrypted:
    """The one decryption; ckks: flooded first (``flooding.py``), bfv: exact (the noise is rounded away,
    nothing key-dependent to flood)."""
    if params.backend == "ckks":
        fl = flood_decryption(plan, backend, ctx, chunks, extra_tol=tag_sum_err)
        backend.check_range(fl.vector, fl.tol)
        spectral, noise_norms = release_norms(plan, fl, params.layout.dim, params.layout.n_classes, FLOOD_TAIL)
        return _Decrypted(fl.vector, fl.tol, fl.count_tol, fl.sigma, spectral, noise_norms, fl.to_report())
    e_bound = he_module(params.backend).expected_abs_error(params, K) + tag_sum_err
    return _Decrypted(backend.decrypt_sum(ctx, chunks), e_bound, e_bound, 0.0, None, None,
                      {"flood_sigma": 0.0, "error_bound_per_entry": e_bound})


def _checks(rel: SessionRelease, dec: _Decrypted, m: dict, tags, participants, min_class_count: int):
    """``(statistics, sanity record, tag check)``: the statistics checks, the aggregate tag, the class minimum."""
    params = rel.params
    stats = Layout(params.layout.dim, params.layout.n_classes).unpack(dec.vector, gamma=params.gamma)
    sanity = statistics_checks(stats, params, participants, dec.tol, count_tol=dec.count_tol,
                               spectral_tol=dec.spectral)
    tag_check = check_aggregate_tag(params, stats.tag, m, tags or {}, rel.enrolled, rel.tag_key, dec.tol)
    # integers stay integers: the checks above proved their error below 1/2
    stats = dataclasses.replace(stats, contributors=float(len(participants)), n=float(np.round(stats.n)),
                                class_counts=np.round(stats.class_counts))
    class_minimum(stats, params, min_class_count)
    return stats, sanity, tag_check


def _solve_and_certify(rel: SessionRelease, backend, stats, dec: _Decrypted, participants, lam: float, key_id: str):
    """``(W, privacy record, flooding ridge, W's certified error bound, the ridge's relative change of W)``."""
    params = rel.params
    ridge = ridge_if_needed(stats, dec.spectral) if dec.sigma > 0 else 0.0
    W, privacy = solve_and_account(rel, stats, participants, lam + ridge, "resummed:" + key_id)
    w_bound = certify_release(params, stats, W, len(participants), lam=lam + ridge, flood_norms=dec.noise_norms,
                              ckks=backend.ckks_ if params.backend == "ckks" else None)
    bias = None
    if ridge > 0 and params.dp is None:
        # post-processing of the flooded release: how far the ridge moved W from the unregularised solve
        W0 = solve_from_sums(stats, lam=lam)
        bias = float(np.linalg.norm(W - W0) / max(np.linalg.norm(W), 1e-300))
    return W, privacy, ridge, w_bound, bias


def ridge_if_needed(stats, spectral: float) -> float:
    """Ridge rho when the released C's smallest eigenvalue is below 2 rho (rho bounds the flooding's
    spectral norm), else none.

    Post-processing of the flooded release. Weyl gives lambda_min(C') >= lambda_min(C) - rho >= -rho,
    so C' + rho I is positive semi-definite like the true C, and the solve cannot amplify the noise
    along directions it made negative. Above 2 rho the unregularised system keeps
    lambda_min(C) >= lambda_min(C') - rho >= rho > 0, so W is certified against C^+ Q itself and no
    ridge bias is paid."""

    C = ri_restore_gram(stats.gram, round(stats.contributors), stats.gamma)
    lam_min = float(np.linalg.eigvalsh(0.5 * (C + C.T))[0])
    return float(spectral) if lam_min < 2.0 * spectral else 0.0


