"""ckks and bfv: verify and re-sum the signed uploads, decrypt that sum once (ckks: flood it first), check, solve,
certify."""

from __future__ import annotations

import dataclasses
import logging
import time

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
from .common import FinalResult, ReleaseBase, check_dp_noise, class_minimum, statistics_checks

log = logging.getLogger("secure_afl.keyholder")


class HERelease(ReleaseBase):
    def release_he(self, sid: str, source, *, min_clients: int, lam: float = 0.0, min_class_count: int = 1,
                   expected_hospitals: list[str] | None = None, workers: int | None = None,
                   secret: bytes | None = None) -> FinalResult:
        """ckks, bfv: verify and re-sum the signed uploads here, decrypt that sum once (ckks: flood it), check.

        ``workers`` processes check and re-sum the uploads (default: the machine's cores).
        ``source`` is whatever carried the uploads (the server over HTTPS, a Flower message): its
        ``manifest()``, ``contribution(hospital)`` and ``tags()`` are what the server stored, trusted
        for nothing beyond the signatures they carry.

        A forgery found before decryption, and ANY failure after it, blocks the
        key in the ledger: no later attempt decrypts under it. ``secret``: the opened secret context, when
        the caller opened it before changing anything (opened here first otherwise).
        """
        params = self.params(sid)  # the keygen record, never the server's word
        secret = self.secret_context(sid) if secret is None else secret
        key_id = params.backend_params["public_context_sha256"]
        ledger = ReleaseLedger(self.keys_dir / "releases.sqlite3")
        try:
            ledger.check_unused(key_id)
            t0 = time.perf_counter()
            try:
                manifest = source.manifest()
                server_pub, enrolled = self._trust(sid, expected_hospitals)
                # the signed quorum of the roster, before anything is decrypted
                m = verify_manifest_for(params, manifest, server_pub, enrolled, self._policy(sid, min_clients))
                # before anything is decrypted: a sum short of noise shares is never decrypted at all
                check_dp_noise(params, len(m["participants"]))
                backend = get_backend(params)
                ctx = backend.keyholder_context(secret)
                chunks, participants = resum_signed_contributions(params, backend, ctx, m, source.contribution,
                                                                   workers=workers)
                tags = source.tags()
            except (ServerForgery, ContributionRejected) as e:
                ledger.block(key_id, f"refused before decryption: {e}")
                raise
            verify_s = time.perf_counter() - t0
            res = self._decrypt_once(ledger, key_id, params, backend, ctx, chunks, participants, m, tags,
                                     enrolled, lam=lam, min_class_count=min_class_count)
            res.report["verify_and_resum_seconds"] = round(verify_s, 3)
            return res
        finally:
            ledger.close()

    def _decrypt_once(self, ledger, key_id, params, backend, ctx, chunks, participants, m, tags, enrolled, *,
                      lam: float, min_class_count: int) -> FinalResult:
        """Decrypt once; ckks: flood (``flooding.py``) before any check, so that nothing unflooded,
        not even a check's outcome, goes further; check; solve; certify.

        Every check's tolerance is the bound proved for the noise actually added
        (:func:`secure_afl.release_checks.sanity_check`), so an honest cohort passes
        except with probability 2^-40. Nothing that leaves here (report,
        exception message) carries a decrypted float: integers are rounded and
        range-checked, float checks report pass or fail.
        """

        K = len(participants)
        # the tags are summed in float64 here; allow that summation's own rounding
        tag_sum_err = plain_summation_error(K, params.bounds.aggregate_bound(params.gamma))
        if params.backend == "ckks":
            plan = flood_plan(backend, K)  # K <= k_max, so its counts are within 1/2 (checked at keygen)
        ledger.record_decryption(key_id, params.session_id, participants)
        try:
            if params.backend == "ckks":
                # flooded in the coefficient domain before the one decryption: nothing unflooded exists
                fl = flood_decryption(plan, backend, ctx, chunks, extra_tol=tag_sum_err)
                vector, tol, count_tol = fl.vector, fl.tol, fl.count_tol
                backend.check_range(vector, tol)
                sigma = fl.sigma
                spectral, noise_norms = release_norms(plan, fl, params.layout.dim, params.layout.n_classes,
                                                      FLOOD_TAIL)
                flood_info = fl.to_report()
            else:  # exact decryption (bfv): the noise is rounded away, nothing key-dependent to flood
                e_bound = he_module(params.backend).expected_abs_error(params, K) + tag_sum_err
                vector, tol, count_tol, sigma, spectral = backend.decrypt_sum(ctx, chunks), e_bound, e_bound, 0.0, None
                noise_norms = None
                flood_info = {"flood_sigma": 0.0, "error_bound_per_entry": tol}
            stats = Layout(params.layout.dim, params.layout.n_classes).unpack(vector, gamma=params.gamma)
            sanity = statistics_checks(stats, params, participants, tol, count_tol=count_tol, spectral_tol=spectral)
            tag_check = check_aggregate_tag(params, stats.tag, m, tags or {}, enrolled,
                                            self.tag_secret(params.session_id), tol)
            # integers stay integers: the checks above proved their error below 1/2
            stats = dataclasses.replace(stats, contributors=float(K), n=float(np.round(stats.n)),
                                        class_counts=np.round(stats.class_counts))
            class_minimum(stats, params, min_class_count)
            ridge = ridge_if_needed(stats, spectral) if sigma > 0 else 0.0
            W, privacy = self._solve(params, stats, participants, lam + ridge, "resummed:" + key_id)
            w_bound = certify_release(params, stats, W, K, lam=lam + ridge, flood_norms=noise_norms,
                                      ckks=backend.ckks_ if params.backend == "ckks" else None)
            bias = None
            if ridge > 0 and params.dp is None:
                # post-processing of the flooded release: how far the ridge moved W from the unregularised solve
                W0 = solve_from_sums(stats, lam=lam)
                bias = float(np.linalg.norm(W - W0) / max(np.linalg.norm(W), 1e-300))
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
        ledger.record(key_id, params.session_id, participants, "resummed:" + key_id)
        report = self._report(params, participants, stats, lam, sanity, tol)
        report.update({"dp": privacy, "tag_check": tag_check, "resummed_by_keyholder": True, **flood_info,
                       "flood_ridge": ridge, "ridge_rel_change": bias, "lambda_total": lam + ridge,
                       "w_error_bound": w_bound.to_dict(), "verdict": w_bound.verdict})
        return FinalResult(W, stats, params, m, report)


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


