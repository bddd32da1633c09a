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

from .common import FinalResult, ReleaseBase, class_minimum, statistics_checks


class RevealRelease(ReleaseBase):
    def reveal_and_solve(self, params: SessionParams, aggregate: bytes, manifest: dict, *, min_clients: int,
                         lam: float = 0.0, min_class_count: int = 1,
                         expected_hospitals: list[str] | None = None, unmask: dict | None = None) -> FinalResult:
        """plain / secagg: verify the manifest, reveal the server's aggregate, check and solve.

        Neither backend has a key whose decryption noise could leak it: plain
        is the reference mode, and secagg's masks cancel exactly, so the
        server's sum is unmasked here. ``unmask`` is the server's reconstructed
        material (survivors' self-mask seeds, dropped hospitals' mask keys); a
        wrong material yields garbage that the sanity checks refuse. ckks goes
        through :meth:`finalize`, which never decrypts a server-formed sum.
        """
        if params.backend in HE_BACKENDS:
            raise DecryptionRefused(f"a {params.backend} release is formed by re-summing the signed uploads (finalize); "
                                    "a server-formed aggregate is never decrypted")
        server_pub, enrolled = self._trust(params.session_id, expected_hospitals)
        try:
            m = check_aggregate_against_manifest(params, aggregate, manifest, server_pub, enrolled,
                                                 self._policy(params.session_id, min_clients))
        except SecureAFLError as e:
            raise DecryptionRefused(f"not decrypting: {e}") from e
        participants = sorted(p["hospital"] for p in m["participants"])
        agg_sha = hashlib.sha256(aggregate).hexdigest()
        key_id = f"session:{params.session_id}"
        ledger = ReleaseLedger(self.keys_dir / "releases.sqlite3")
        try:
            ledger.check(key_id, params.session_id, participants, agg_sha)
            backend = get_backend(params)
            if params.backend == "secagg":
                if unmask is None:
                    raise DecryptionRefused("secagg release needs the unmask material")
                vector = backend.reveal(aggregate, unmask=unmask)
                tol = abs_error_bound(tuple(params.backend_params["frac_bits"]), len(participants),
                                      params.bounds.aggregate_bound(params.gamma))
            else:
                vector = backend.reveal(aggregate)
                tol = 1e-9
            stats = Layout(params.layout.dim, params.layout.n_classes).unpack(vector, gamma=params.gamma)
            sanity = statistics_checks(stats, params, participants, tol)
            class_minimum(stats, params, min_class_count)
            W, privacy = self._solve(params, stats, participants, lam, agg_sha)
            w_bound = certify_release(params, stats, W, len(participants), lam=lam)
            ledger.record(key_id, params.session_id, participants, agg_sha)
        finally:
            ledger.close()
        report = self._report(params, participants, stats, lam, sanity, tol, agg_sha)
        report.update({"dp": privacy, "w_error_bound": w_bound.to_dict(), "verdict": w_bound.verdict})
        return FinalResult(W, stats, params, m, report)

