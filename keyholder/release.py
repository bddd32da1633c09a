"""The key holder role: verify, re-sum, decrypt once, flood, check, restore and solve.

Runs on: a machine of a party that does not collude with the server. Sees:
the CKKS secret key (ckks), the hospitals' signed uploads (ciphertexts it
re-sums itself), the server-signed manifest, and the flooded aggregate of at
least ``min_clients`` hospitals: never one hospital's statistics. Produces the
model W and a report.

Stages (``secure-afl keyholder ...``, see ``cli.py``): ``keygen`` (fresh keys
and the keygen record, ``custody.py``), ``publish`` (public context, tag key
and the key holder's signature over the parameters), ``finalize`` (close,
verify and re-sum, ``verify.py``; decrypt once; flood, ``flooding.py``;
sanity-check, tag check, class minimum, RI restoration, solve).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from secure_afl import pki
from secure_afl.analytic import solve_from_sums
from secure_afl.cohort import ReleasePolicy, cohort_after_refusals, release_policy
from secure_afl.backends import HE_BACKENDS, get_backend, he_module
from secure_afl.certify import FLOOD_TAIL, certify_release, plain_summation_error
from secure_afl.hazmat.fixedpoint import abs_error_bound
from secure_afl.exceptions import DecryptionRefused, InsufficientContributors, InvalidInputError, InvalidSignature, \
    PolicyViolation, SecureAFLError
from secure_afl.packing import Layout
from secure_afl.params import KEYED_BACKENDS, SessionParams
from secure_afl.release_checks import ReleaseLedger, check_aggregate_against_manifest, check_class_minimum, sanity_check

from .connection import KeyHolderConnection
from .custody import KeyCustody
from .flooding import flood_decryption, flood_plan, release_norms
from .verify import ContributionRejected, ServerForgery, resum_signed_contributions, verify_manifest_for
from secure_afl import session
from secure_afl._io import write_file
from secure_afl.analytic import ri_restore_gram
from secure_afl.audit_log import countersign_head
from secure_afl import split
from secure_afl.dp import dp_sanity_check
from secure_afl.dp import dp_solve
from secure_afl.encoding import canonical_json
from secure_afl.keyholder_params import sign_session_params
from secure_afl.protocol import H_TAG
from secure_afl.protocol import context_publication
from secure_afl.session import signed_path
from secure_afl.tagging import TAG_KEY_PARAM
from secure_afl.tagging import check_aggregate_tag

__all__ = ["KeyHolder", "FinalResult", "HTTPSource", "write_model", "read_model"]

log = logging.getLogger("secure_afl.keyholder")


@dataclass
class FinalResult:
    W: np.ndarray
    stats: object
    params: SessionParams
    manifest: dict
    report: dict


def write_model(path, W: np.ndarray, metadata: dict) -> None:
    """safetensors file: tensor "W" (d, C) float64 plus string metadata; atomic."""
    from safetensors.numpy import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    save_file({"W": np.ascontiguousarray(W, dtype=np.float64)}, str(tmp), metadata=meta)
    os.replace(tmp, path)


def read_model(path) -> tuple[np.ndarray, "ModelMetadata"]:
    """W (d, C) float64 and what the file says about it (:class:`~secure_afl.keyholder.model.ModelMetadata`)."""
    from safetensors import SafetensorError, safe_open

    from .model import ModelMetadata

    if not Path(path).is_file():
        raise InvalidInputError(f"no model file {path}", reason="file_not_found")
    try:
        with safe_open(str(path), framework="numpy") as f:
            W, raw = f.get_tensor("W"), dict(f.metadata() or {})
    except (SafetensorError, OSError, KeyError) as e:
        raise InvalidInputError(f"{path} is not a model file ({e})", reason="invalid_model") from None
    return W, ModelMetadata.from_file(raw, str(path))


class KeyHolder(KeyCustody):
    """Key custody and release for one consortium key holder identity.

    Parameters
    ----------
    pki_dir : path
        Consortium PKI directory (CA, this key holder's files, enrolments).
    name : str
        This key holder's enrolled name.
    keys_dir : path
        Where per-session key files, keygen records and the release ledger live (0700).
    passphrase : bytes, optional
        Protects the secret contexts at rest; default: $SECURE_AFL_KEY_PASSPHRASE.
    """

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
        # withdrawn identity counts for nothing, whatever the server's manifest says. (finalize and the Flower
        # adapter have already required the signed definition; only library callers such as the key holder
        # benchmark run without one.)
        if signed_path(self.pki_dir, session_id).exists():
            roster = set(session.load_signed(self.pki_dir, session_id).hospitals)
            enrolled = {k: v for k, v in enrolled.items() if k in roster}
        if expected_hospitals is not None:
            enrolled = {k: v for k, v in enrolled.items() if k in set(expected_hospitals)}
        return server_pub, enrolled

    def _policy(self, session_id: str, min_clients: int) -> ReleasePolicy | None:
        """The signed session's release policy with this caller's ``min_clients`` floor, or None when no
        signed definition is here (library callers such as the key holder benchmark)."""
        if not signed_path(self.pki_dir, session_id).exists():
            return None
        return release_policy(session.load_signed(self.pki_dir, session_id), min_clients=min_clients)

    def _floor(self, session_id: str, min_clients: int) -> int:
        """Uploads of the roster a release needs: the signed quorum q (never less than ``min_clients``)."""
        policy = self._policy(session_id, min_clients)
        return min_clients if policy is None else max(min_clients, policy.quorum)

    def finalize(self, conn, *, min_clients: int, lam: float = 0.0, min_class_count: int = 1,
                 expected_hospitals: list[str] | None = None) -> FinalResult:
        """Close (if needed), fetch, verify, reveal, check, restore and solve.

        The release policy is the stricter of this key holder's and the session's
        (``min_clients``, ``min_class_count``): the server cannot relax it.
        """
        from secure_afl import session

        # the operator's signed definition, not the server's info, says what this session is: its backend,
        # its release policy and (plain, secagg) its parameters; ckks and bfv use this key holder's keygen record
        definition = session.load_signed(self.pki_dir, conn.session_id)
        # the sealed key is opened before anything changes state (the round closed, the key recorded as used):
        # a mistyped passphrase then leaves the session as it was, and the command can simply be rerun
        secret = self.secret_context(conn.session_id) if definition.backend in KEYED_BACKENDS else None
        info = conn.info()
        # the session's own floor, from the signed definition only; this key holder's may only raise it
        signed_class_count = definition["min_class_count"]
        policy = release_policy(definition, min_clients=min_clients, min_class_count=min_class_count)
        min_clients, min_class_count = policy.min_clients, policy.min_class_count
        if definition.backend == "split" and (min_class_count > signed_class_count or lam):
            # the collector (the server) checks and solves: it applies the signed session's policy, so a
            # stricter one asked here could not be enforced; refused before the round is closed
            raise PolicyViolation(
                f"a split release is solved by the collector under the session's min_class_count="
                f"{signed_class_count} and lambda 0, but this key holder asked for min_class_count={min_class_count}, "
                f"lambda={lam:g}: run finalize with --min-class-count {signed_class_count} or less and without "
                "--lambda (nothing was changed)"
                + (f", or have the operator sign a new session with min_class_count = {min_class_count}"
                   if min_class_count > signed_class_count else ""))
        if info["status"] != "released":
            self.close_round(conn)
            info = conn.info()
        self.countersign_audit_head(conn, conn.request("GET", conn.path("/manifest")).json())
        if definition.backend == "split":
            return self.finalize_split(conn, min_clients=min_clients, expected_hospitals=expected_hospitals,
                                       secret=secret)
        if definition.backend in HE_BACKENDS:
            return self.release_he(conn.session_id, HTTPSource(conn), min_clients=min_clients, lam=lam,
                                   min_class_count=min_class_count, expected_hospitals=expected_hospitals,
                                   secret=secret)
        params = definition.session_params()
        session.check_same(params.to_dict(), info.get("params") or {}, what="params.", source="the server")
        aggregate = conn.request("GET", conn.path("/aggregate")).content
        manifest = conn.request("GET", conn.path("/manifest")).json()
        unmask = None
        if params.backend == "secagg":
            unmask = conn.request("GET", conn.path("/secagg/unmask-material")).json()
        return self.reveal_and_solve(params, aggregate, manifest, min_clients=min_clients, lam=lam,
                                     min_class_count=min_class_count, expected_hospitals=expected_hospitals,
                                     unmask=unmask)

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
                m = verify_manifest_for(params, manifest, server_pub, enrolled, self._floor(sid, min_clients))
                # before anything is decrypted: a sum short of noise shares is never decrypted at all
                _check_dp_noise(params, len(m["participants"]))
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

    def finalize_split(self, conn, *, min_clients: int, expected_hospitals: list[str] | None = None,
                       secret: bytes | None = None) -> FinalResult:
        """split: post this key holder's share to the collector (the server), then read the released model.

        What is downloaded before the share leaves: the manifest and the seed statements. After it: the
        released aggregate and W the collector formed -- the release itself, nothing per hospital.
        """
        from secure_afl.encoding import canonical_json

        t0 = time.perf_counter()
        timings: dict = {}
        body, statement = self.release_split(conn.session_id, HTTPSource(conn), min_clients=min_clients,
                                             expected_hospitals=expected_hospitals, timings=timings, secret=secret)
        share_s = time.perf_counter() - t0  # manifest and seed statements fetched, checked, opened, expanded, summed
        conn.request("POST", conn.path("/split/share"), body=body,
                     headers={H_TAG: canonical_json(statement).decode()})
        out = conn.request("GET", conn.path("/split/result")).json()
        params = self.params(conn.session_id)
        vector = np.asarray(out["vector"], dtype=np.float64)
        stats = Layout(params.layout.dim, params.layout.n_classes).unpack(vector, gamma=params.gamma)
        manifest = conn.request("GET", conn.path("/manifest")).json()
        report = {**out["report"], "keyholder_share_seconds": round(share_s, 3),
                  **{k: round(v, 3) for k, v in timings.items()}}
        if params.dp is not None:  # the collector's solve beside this key holder's own accounting of the release
            report["dp"] = {**(report.get("dp") or {}), **self.split_privacy(params, manifest)}
        return FinalResult(np.asarray(out["W"], dtype=np.float64), stats, params, manifest, report)

    def split_privacy(self, params: SessionParams, manifest: dict) -> dict:
        """This key holder's privacy record of a split release it made (epsilon of the release, the ledger's
        composed epsilon now), read back from its privacy ledger."""
        from secure_afl.dp.ledger import PrivacyLedger
        from secure_afl.dp.mechanism import epsilon_from_rdp

        n = len(manifest["participants"])
        refusals = self.keys_dir / f"{params.session_id}.validity-refusals.json"
        if refusals.exists():  # this key holder's own record: the refused uploads' noise is not in the release
            n -= len(json.loads(refusals.read_text())["refused"])
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
            policy = self._policy(sid, min_clients)
            floor = min_clients if policy is None else max(min_clients, policy.quorum)
            try:  # the signed quorum of the roster, before any verdict or share is formed for this manifest
                m = verify_manifest_for(params, manifest, server_pub, enrolled, floor)
            except ServerForgery as e:
                ledger.block(key_id, f"refused before the share: {e}")
                raise
            _check_dp_noise(params, len(m["participants"]))
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
                share = split.keyholder_share(params, secret, m, statements, enrolled, refused=refused,
                                              judged=judge.judged(),
                                              sum_masks=split.pool.lane_masks(params, os.cpu_count() or 1))
                if timings is not None:
                    timings.update({"server_verifier_seconds": verifier_s,
                                    "judge_and_share_seconds": time.perf_counter() - t})
                if refused:  # both verifier messages the refusals rest on, kept with the key holder's record
                    self.keep_validity_evidence(sid, {h: raw[h] for h in refused}, refused, evidence)
                cohort = self._cohort(policy, floor, m, refused)
                # a refused upload's noise share leaves the release with it: the noise is the cohort's
                _check_dp_noise(params, len(cohort))
                # in the privacy ledger, as the release it enables (the collector cannot unmask without the
                # share, which leaves only after this), at the noise the cohort's shares sum to
                self.account_split_release(params, m["aggregate_sha256"], len(cohort))
            except split.SeedRefused as e:
                ledger.block(key_id, f"refused before the share: {e}")
                raise ContributionRejected(f"no share released: {e}", e.hospital) from e
            return split.sign_share(self.party.identity_key(), params, m, share, refused, evidence)
        finally:
            ledger.close()

    def split_verdicts(self, sid: str, source, manifest: dict, statements: dict, ledger, *,
                       expected_hospitals: list[str] | None = None, secret: bytes | None = None):
        """``(server messages, refused, evidence, judge)`` for the manifest's participants: the verdicts formed as the
        uploads arrived (:meth:`judge_split`), and those of any upload not judged yet (or judged under
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
        return {h: records[h]["server_message"] for h in hs}, refused, evidence, judge

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

    def _split_judge(self, sid: str, expected_hospitals):
        """One judge per session and trust set, kept between passes: its seed key is unsealed (a passphrase
        KDF run) once, not at every poll."""
        from .split_stream import SplitJudge

        judges = self.__dict__.setdefault("_split_judges", {})
        k = (sid, None if expected_hospitals is None else tuple(sorted(expected_hospitals)))
        if k not in judges:
            judges[k] = SplitJudge(self, sid, expected_hospitals=expected_hospitals)
        return judges[k]

    @staticmethod
    def _cohort(policy: ReleasePolicy | None, floor: int, manifest: dict, refused: dict) -> list[str]:
        """The cohort the share may cover, from the verdicts alone: the signed policy's refusal limit and quorum
        (:func:`secure_afl.cohort.cohort_after_refusals`) abort the release rather than shrink the cohort."""
        participants = [p["hospital"] for p in manifest["participants"]]
        if policy is not None:
            return cohort_after_refusals(policy, participants, refused)
        cohort = [h for h in participants if h not in refused]
        if len(cohort) < floor:
            raise InsufficientContributors(f"after refusing the invalid uploads of {sorted(refused)} only "
                                           f"{len(cohort)} remain, below min_clients={floor}")
        return cohort

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
            sanity = _sanity(stats, params, participants, tol, count_tol=count_tol, spectral_tol=spectral)
            tag_check = check_aggregate_tag(params, stats.tag, m, tags or {}, enrolled,
                                            self.tag_secret(params.session_id), tol)
            # integers stay integers: the checks above proved their error below 1/2
            stats = dataclasses.replace(stats, contributors=float(K), n=float(np.round(stats.n)),
                                        class_counts=np.round(stats.class_counts))
            _class_minimum(stats, params, min_class_count)
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
                                                 self._floor(params.session_id, min_clients))
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
            sanity = _sanity(stats, params, participants, tol)
            _class_minimum(stats, params, min_class_count)
            W, privacy = self._solve(params, stats, participants, lam, agg_sha)
            w_bound = certify_release(params, stats, W, len(participants), lam=lam)
            ledger.record(key_id, params.session_id, participants, agg_sha)
        finally:
            ledger.close()
        report = self._report(params, participants, stats, lam, sanity, tol, agg_sha)
        report.update({"dp": privacy, "w_error_bound": w_bound.to_dict(), "verdict": w_bound.verdict})
        return FinalResult(W, stats, params, m, report)


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

    def split_statements(self) -> dict:
        return self.conn.request("GET", self.conn.path("/split/statements")).json()

    def split_queries(self, queries: dict) -> dict:
        return self.conn.request("POST", self.conn.path("/split/queries"), body=canonical_json(queries)).json()


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


def _sanity(stats, params, participants, tol, *, count_tol=None, spectral_tol=None):
    """The statistics checks; with DP the noise-aware ones, after refusing a release carrying less noise
    than the session declared (fewer contributions than dp min_contributors)."""
    if params.dp is None:
        return sanity_check(stats, params, len(participants), abs_tol=tol, count_tol=count_tol,
                            spectral_tol=spectral_tol)

    _check_dp_noise(params, len(participants))
    return {"checks": dp_sanity_check(stats, params, len(participants))}


def _class_minimum(stats, params, min_class_count: int) -> None:
    """The rare-class refusal, for releases without DP only.

    It exists because a class with one sample releases that sample's embedding
    exactly in Q[:, c]. Under DP every entry, counts included, carries noise
    calibrated to one sample's influence, so nothing is released exactly; the
    noisy counts (standard deviation often larger than the class sizes) would
    only turn the rule into a random refusal."""
    if params.dp is None:
        check_class_minimum(stats, min_class_count)


def _check_dp_noise(params, contributors: int) -> None:
    """Refuse a DP release summed from fewer noise shares than the session declared (t = min_contributors):
    it would carry less than the declared noise, so less privacy than accounted."""
    if params.dp is not None and contributors < int(params.dp["min_contributors"]):
        raise DecryptionRefused(f"{contributors} contributions carry less than the declared noise "
                                f"(dp min_contributors={params.dp['min_contributors']})", reason="dp_noise_short")
