"""split: judge each upload's validity, then form this key holder's share over the cohort the verdicts leave,
signed and bound to the manifest; keep the refusals' evidence; account the release it enables; form the release
from the server-signed masked sum over exactly that cohort."""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
from pathlib import Path

import numpy as np

from secure_afl import split
from secure_afl.cohort import ReleasePolicy, cohort_after_refusals
from secure_afl.exceptions import InvalidSignature, MalformedPayload, PolicyViolation, \
    SanityCheckFailed
from secure_afl.hazmat import flp
from secure_afl.params import SessionParams
from secure_afl.protocol import H_TAG
from secure_afl.release_checks import ReleaseLedger
from secure_afl.split_release import form_release

from ..verify import ContributionRejected, ServerForgery, verify_manifest_for
from .common import FinalResult, HTTPSource, ReleaseBase, check_dp_noise

log = logging.getLogger("secure_afl.keyholder")


def read_split_answer(answer) -> tuple[dict, bytes, dict, bytes]:
    """``(share statement, share bytes, signed masked-sum statement, masked sum bytes)`` from the server's
    ``.../split/result`` answer (parsed JSON); :class:`MalformedPayload` for anything else."""
    try:
        st, signed = answer["share_statement"], answer["masked_sum"]
        share = base64.b64decode(answer["share"], validate=True)
        masked = base64.b64decode(answer["aggregate"], validate=True)
        if not isinstance(st, dict) or not isinstance(signed, dict):
            raise ValueError
    except (KeyError, TypeError, ValueError, binascii.Error):
        raise MalformedPayload("the server's answer is not a share statement, share and signed masked sum") from None
    return st, share, signed, masked


class SplitRelease(ReleaseBase):
    def finalize_split(self, conn, *, min_clients: int, expected_hospitals: list[str] | None = None,
                       secret: bytes | None = None, lam: float = 0.0, min_class_count: int = 1) -> FinalResult:
        """split: post this key holder's share statement (and share) to the server, take the server-signed
        masked sum over exactly that statement's cohort, and form the release here (:meth:`release_from_sum`).

        What is downloaded before the share leaves: the manifest and the seed statements. After it: the masked
        sum of the cohort this key holder signed -- nothing per hospital, and no sum over any other set.
        """
        t0 = time.perf_counter()
        timings: dict = {}
        body, statement = self.post_split_share(conn, min_clients=min_clients, expected_hospitals=expected_hospitals,
                                                timings=timings, secret=secret)
        share_s = time.perf_counter() - t0  # manifest and seed statements fetched, checked, opened, expanded, summed
        res = self.take_split_release(conn, body, statement, lam=lam, min_class_count=min_class_count)
        res.report.update({"keyholder_share_seconds": round(share_s, 3),
                           **{k: round(v, 3) for k, v in timings.items()}})
        return res

    def post_split_share(self, conn, *, min_clients: int, expected_hospitals: list[str] | None = None,
                         timings: dict | None = None, secret: bytes | None = None) -> tuple[bytes, dict]:
        """This key holder's share and signed statement (:meth:`release_split`), posted to the server."""
        from secure_afl.encoding import canonical_json

        body, statement = self.release_split(conn.session_id, HTTPSource(conn), min_clients=min_clients,
                                             expected_hospitals=expected_hospitals, timings=timings, secret=secret)
        conn.request("POST", conn.path("/split/share"), body=body,
                     headers={H_TAG: canonical_json(statement).decode()})
        return body, statement

    def take_split_release(self, conn, body: bytes, statement: dict, *, lam: float = 0.0,
                           min_class_count: int = 1) -> FinalResult:
        """The server's signed masked sum over ``statement``'s cohort, fetched, and the release formed from it and
        this key holder's own share (:meth:`release_from_sum`)."""
        try:
            _, _, signed, masked = read_split_answer(conn.request("GET", conn.path("/split/result")).json())
        except (MalformedPayload, ValueError) as e:
            raise self.refuse_server_sum(conn.session_id, e) from None
        return self.release_from_sum(conn.session_id, body, statement, signed, masked,
                                     conn.request("GET", conn.path("/manifest")).json(), lam=lam,
                                     min_class_count=min_class_count)

    def release_from_sum(self, sid: str, body: bytes, statement: dict, signed: dict, masked_sum: bytes,
                         manifest: dict, *, lam: float = 0.0, min_class_count: int = 1) -> FinalResult:
        """split: the release from this key holder's own share and signed statement and the server-signed masked
        sum, as every other backend's key holder forms its release: the sum must be the server's, over exactly
        the cohort and refusals of ``statement``, for that statement and its manifest (else
        :class:`ServerForgery`, naming what differs, recorded in the release ledger); then the share is added,
        the sum decoded, checked and solved here. The cohort, contributors and refusals in the report and the
        model file are the statement's, never the server's."""
        from secure_afl import pki

        params = self.params(sid)
        try:
            # this key holder's own statement (the Flower path relays it back through the server): its signature
            # and share hash, so the share added below is the one it formed
            split.verify_share(params, manifest, body, statement, self.party.identity_key().public_key())
            split.verify_masked_sum(params, statement, masked_sum, signed, pki.pinned_identity(self.pki_dir, "server"))
            cohort, refused = list(statement["cohort"]), dict(statement["refused"])
            share = flp.from_bytes(body, what="this key holder's share")
            try:
                rel = form_release(params, masked_sum, share, len(cohort), self._policy(sid, 1), lam=lam, min_class_count=min_class_count)
            except SanityCheckFailed as e:
                if e.reason != split.SHARE_MISMATCH:  # a release check (the share cap, the Gram), not the sum
                    raise
                raise InvalidSignature(f"the server-signed masked sum does not decode with this key holder's share "
                                       f"({e}): it is not the sum of the cohort's masked uploads") from None
        except (InvalidSignature, MalformedPayload) as e:
            raise self.refuse_server_sum(sid, e) from None
        report = self._report(params, cohort, rel.stats, lam, rel.sanity, rel.tol, statement["aggregate_sha256"])
        report.update({"dp": rel.dp, "w_error_bound": rel.bound.to_dict(), "verdict": rel.bound.verdict,
                       "share_sha256": statement["share_sha256"], "refused": refused,
                       "masked_sum_sha256": signed["masked_sum_sha256"]})
        if params.dp is not None:  # this key holder's own accounting of the release, made before its share left
            report["dp"] = {**(report.get("dp") or {}), **self.split_privacy(params, manifest, refused)}
        return FinalResult(rel.W, rel.stats, params, manifest, report)

    def refuse_server_sum(self, sid: str, err: Exception) -> "ServerForgery":
        """The server's masked sum is refused: recorded against this session's seed key (its one share has
        left; nothing more is released under it) and logged, and returned as :class:`ServerForgery`."""
        reason = f"the server's masked sum was refused: {err}"
        log.error("split %s: %s", sid, reason)
        ledger = ReleaseLedger(self.keys_dir / "releases.sqlite3")
        try:
            ledger.block(self.params(sid).backend_params[split.PUBLIC_CONTEXT_KEY], reason)
        finally:
            ledger.close()
        return ServerForgery(f"not releasing: {reason}")

    def split_privacy(self, params: SessionParams, manifest: dict, refused: dict) -> dict:
        """This key holder's privacy record of a split release it made (epsilon of the release, the ledger's
        composed epsilon now), read back from its privacy ledger; ``refused``: its signed statement's refusals
        (their noise is not in the release)."""
        from secure_afl.dp.ledger import PrivacyLedger
        from secure_afl.dp.mechanism import epsilon_from_rdp

        n = len(manifest["participants"]) - len(refused)
        with PrivacyLedger(self.keys_dir / "privacy.sqlite3") as pl:
            rows = {r["aggregate_sha256"]: r for r in pl.releases()}
            composed = pl.composed_rdp()
        rec = rows.get(manifest["aggregate_sha256"])
        if rec is None:
            raise PolicyViolation("this split release is not in the key holder's privacy ledger")
        eps_all = float("inf") if not np.all(np.isfinite(composed)) else \
            epsilon_from_rdp(composed, float(params.dp["delta"]))
        return {**dict(params.dp), "epsilon": rec["epsilon"], "epsilon_composed": eps_all, "contributors": n}

    def release_split(self, sid: str, source, *, min_clients: int,
                      expected_hospitals: list[str] | None = None, timings: dict | None = None,
                      secret: bytes | None = None) -> tuple[bytes, dict]:
        """split: this key holder's share ``-sum PRG(s_k)`` over the manifest's cohort, signed and bound to it.

        ``source`` gives only ``manifest()`` and ``tags()`` (the hospitals' signed seed statements): no
        masked vector is ever fetched here, since with every seed in hand any masked vector would be
        readable. Checks: the manifest under this key holder's parameters, enrolments and threshold;
        each participant's seed statement signed by that hospital over the payload hash it also signed
        in the manifest; each box opening under the AD (session, parameters, hospital, payload hash).
        One share per key (the ledger): a second release under the same seeds is refused, and a forged
        manifest or box blocks the key. The verdicts are those formed as the uploads arrived
        (:meth:`judge_split`), and, for any upload not judged yet, formed here by the same code
        (:meth:`split_verdicts`). Returns ``(share bytes, signed share statement)``; ``timings``, if given,
        receives the seconds spent judging what was left and forming the share.
        """

        params = self.params(sid)  # the keygen record, never the server's word
        # the sealed seed key is opened once (each opening runs the passphrase KDF, scrypt) and before the
        # ledger records this key's one share: a wrong passphrase changes nothing
        secret = self.secret_context(sid) if secret is None else secret
        key_id = params.backend_params[split.PUBLIC_CONTEXT_KEY]
        ledger = ReleaseLedger(self.keys_dir / "releases.sqlite3")
        try:
            ledger.check_unused(key_id)
            manifest = source.manifest()
            server_pub, enrolled = self._trust(sid, expected_hospitals)
            policy, floor = self._policy(sid, min_clients), self._floor(sid, min_clients)
            try:  # the signed quorum of the roster, before any verdict or share is formed for this manifest
                m = verify_manifest_for(params, manifest, server_pub, enrolled, policy)
            except ServerForgery as e:
                ledger.block(key_id, f"refused before the share: {e}")
                raise
            check_dp_noise(params, len(m["participants"]))
            statements = source.tags()
            t = time.perf_counter()
            raw, refused, evidence, judge = self.split_verdicts(sid, source, m, statements, ledger,
                                                                expected_hospitals=expected_hospitals, secret=secret)
            verifier_s = time.perf_counter() - t
            # before the share is formed: a crash or a refusal below still counts as this key's one share
            ledger.record_decryption(key_id, sid, [p["hospital"] for p in m["participants"]])

            try:
                # the verdicts are in (most formed as the uploads arrived): the share is the cohort's masks,
                # started from the sum of those judged valid
                t = time.perf_counter()
                share = split.keyholder_share(params, judge.seed_key(), m, statements, enrolled, refused=refused,
                                              judged=judge.judged(),
                                              sum_masks=split.pool.lane_masks(params, judge.pool))
                if timings is not None:
                    timings.update({"server_verifier_seconds": verifier_s,
                                    "judge_and_share_seconds": time.perf_counter() - t})
                if refused:  # both verifier messages the refusals rest on, kept with the key holder's record
                    self.keep_validity_evidence(sid, {h: raw[h] for h in refused}, refused, evidence)
                cohort = self._cohort(policy, floor, m, refused)
                # a refused upload's noise share leaves the release with it: the noise is the cohort's
                check_dp_noise(params, len(cohort))
                # in the privacy ledger, as the release it enables (the collector cannot unmask without the
                # share, which leaves only after this), at the noise the cohort's shares sum to
                self.account_split_release(params, m["aggregate_sha256"], len(cohort))
            except split.SeedRefused as e:
                ledger.block(key_id, f"refused before the share: {e}")
                raise ContributionRejected(f"no share released: {e}", e.hospital) from e
            return split.sign_share(self.party.identity_key(), params, m, share, refused, evidence)
        finally:
            ledger.close()
            self._close_split_judge(sid, expected_hospitals)  # this key's one share is formed or refused

    def split_verdicts(self, sid: str, source, manifest: dict, statements: dict, ledger, *,
                       expected_hospitals: list[str] | None = None, secret: bytes | None = None):
        """``(the server's messages behind the refusals, refused, evidence, judge)`` for the manifest's
        participants: the verdicts formed as the uploads arrived (:meth:`judge_split`), and those of any
        upload not judged yet (or judged under
        another statement), formed now by the same code (keyholder/split_stream.py). A seed statement or box
        that fails blocks the key and refuses the release naming its hospital, as a forged server message
        does."""
        judge = self._split_judge(sid, expected_hospitals)
        if secret is not None:
            judge.unlock(secret)
        if not isinstance(statements, dict):
            statements = {}
        try:
            records = judge.judge(source, [(p["hospital"], p["payload_sha256"], statements.get(p["hospital"]))
                                           for p in manifest["participants"]], ledger, strict=True)
        except split.SeedRefused as e:
            ledger.block(judge.key_id, f"refused before the share: {e}")
            raise ContributionRejected(f"no share released: {e}", e.hospital) from e
        hs = [p["hospital"] for p in manifest["participants"]]
        refused = {h: records[h]["verdict"] for h in hs if records[h]["verdict"] is not None}
        own = {h: records[h].get("keyholder_message") for h in refused}
        evidence = {h: split.refusal_evidence(refused[h], None if own[h] is None else bytes.fromhex(own[h]))
                    for h in refused}
        return {h: records[h]["server_message"] for h in refused}, refused, evidence, judge

    def judge_split(self, conn, *, expected_hospitals: list[str] | None = None) -> dict:
        """While a split session is open: judge every upload accepted so far and not judged yet (one pass;
        call it as often as uploads arrive). Returns hospital -> verdict (None: valid, else the failed check)."""
        judge = self._split_judge(conn.session_id, expected_hospitals)
        ledger = ReleaseLedger(self.keys_dir / "releases.sqlite3")
        try:
            ledger.check_unused(judge.key_id)
            records = judge.poll(HTTPSource(conn), ledger)
        finally:
            ledger.close()
        return {h: r["verdict"] for h, r in records.items()}

    def split_queries(self, sid: str, statements: dict) -> dict:
        """hospital -> ``{payload_sha256, query_seed}`` for each upload whose signed seed statement holds (the
        query a transport without a round trip per upload, such as Flower, carries to the server)."""
        return self._split_judge(sid, None).queries(statements)

    def opened_split_secret(self, sid: str) -> bytes | None:
        """The session's seed key if a judge in this process has opened it already (a key holder that judged
        the uploads as they arrived and now releases runs the passphrase KDF once, not twice); else None."""
        for (s, _), judge in self.__dict__.get("_split_judges", {}).items():
            if s == sid and judge.unlocked:
                return judge.secret()
        return None

    def _split_judge(self, sid: str, expected_hospitals):
        """One judge per session and trust set, kept between passes: its seed key is unsealed (a passphrase
        KDF run) once, not at every poll."""
        from ..split_stream import SplitJudge

        judges = self.__dict__.setdefault("_split_judges", {})
        k = (sid, None if expected_hospitals is None else tuple(sorted(expected_hospitals)))
        if k not in judges:
            judges[k] = SplitJudge(self, sid, expected_hospitals=expected_hospitals)
        return judges[k]

    def _close_split_judge(self, sid: str, expected_hospitals) -> None:
        """Stop the session's judge's worker processes, if it has any (never builds one)."""
        k = (sid, None if expected_hospitals is None else tuple(sorted(expected_hospitals)))
        judge = self.__dict__.get("_split_judges", {}).get(k)
        if judge is not None:
            judge.pool.close()

    @staticmethod
    def _cohort(policy: ReleasePolicy, floor: int, manifest: dict, refused: dict) -> list[str]:
        """The cohort the share may cover, from the verdicts alone: the signed policy's refusal limit and quorum
        (:func:`secure_afl.cohort.cohort_after_refusals`) abort the release rather than shrink the cohort."""
        return cohort_after_refusals(policy, [p["hospital"] for p in manifest["participants"]], refused)

    def account_split_release(self, params: SessionParams, release_id: str, contributors: int) -> dict | None:
        """Record the release a split share enables in the privacy ledger, as :meth:`_solve` records a
        secagg or bfv release: with DP, its Renyi curve at the noise of ``contributors`` shares; without,
        a release that voids the composed guarantee. Returns the privacy record (None without DP)."""
        from secure_afl.dp.ledger import PrivacyLedger
        from secure_afl.dp.mechanism import epsilon_from_rdp, release_rdp

        with PrivacyLedger(self.keys_dir / "privacy.sqlite3") as pl:
            if params.dp is None:
                pl.record(params.session_id, release_id, None, 0.0, float("inf"))
                return None
            rdp = release_rdp(params, contributors)
            delta = float(params.dp["delta"])
            eps = epsilon_from_rdp(rdp, delta)
            composed = pl.preview(release_id, rdp, delta)
            pl.record(params.session_id, release_id, rdp, delta, eps)
        return {**dict(params.dp), "epsilon": eps, "epsilon_composed": composed, "contributors": contributors}
    def keep_validity_evidence(self, session_id: str, messages: dict, refused: dict, evidence: dict) -> Path:
        """Both verifier messages behind each refusal: the server-signed one and this key holder's own (also
        in its signed share statement). Anyone holding the two recomputes the verdict
        (:func:`secure_afl.split.roles.joint_verdict`); the refused hospital, from its own payload
        and seed, recomputes each message and so finds which party's message is false
        (:func:`secure_afl.split.roles.dispute`)."""
        from secure_afl._io import write_file

        path = self.keys_dir / f"{session_id}.validity-refusals.json"
        write_file(path, json.dumps({"refused": refused, "server_messages": messages, "keyholder": evidence},
                                    indent=1, sort_keys=True).encode(), mode=0o644, exclusive=False)
        return path

