"""split: judge each upload's validity, then form this key holder's share over the cohort the verdicts leave,
signed and bound to the manifest; keep the refusals' evidence; account the release it enables; have the server
commit to the masked sum of exactly that cohort before the share leaves, keep that commitment, and form the
release from it."""

from __future__ import annotations
import base64
import binascii
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
import numpy as np

from secure_afl import split
from secure_afl.cohort import cohort_after_refusals
from secure_afl.exceptions import InvalidSignature, MalformedPayload, PolicyViolation, \
    SanityCheckFailed

from secure_afl.params import SessionParams
from secure_afl.protocol import H_TAG
from secure_afl.release_checks import ReleaseLedger
from secure_afl.split_release import form_release
from ..verify import ContributionRejected, ServerForgery, verify_manifest_for
from .common import FinalResult, HTTPSource, check_dp_noise, release_report
from .session_release import SessionRelease

log = logging.getLogger("secure_afl.keyholder")


@dataclass(frozen=True)
class KeptCommitment:
    """What this key holder keeps of one split release before its share leaves: the manifest, its own signed
    share statement and share, the server's signed masked-sum statement over that statement and the masked
    sum's bytes. The release is formed from exactly these, on the first run and on any retry."""

    manifest: dict
    statement: dict
    share: bytes
    signed: dict
    masked_sum: bytes


def kept_paths(keys_dir: Path, session_id: str) -> tuple[Path, Path]:
    """``(this key holder's share and statement (private), the server's commitment it verified (evidence))``."""
    return Path(keys_dir) / f"{session_id}.split-share.json", Path(keys_dir) / f"{session_id}.split-commitment.json"


def read_commitment(answer) -> tuple[dict, bytes]:
    """``(signed masked-sum statement, masked sum bytes)`` from the server's ``.../split/commit`` answer (parsed
    JSON); :class:`MalformedPayload` for anything else."""
    try:
        signed = answer["masked_sum"]
        masked = base64.b64decode(answer["aggregate"], validate=True)
        if not isinstance(signed, dict):
            raise ValueError
    except (KeyError, TypeError, ValueError, binascii.Error):
        raise MalformedPayload("the server's answer is not a signed masked sum") from None
    return signed, masked


def keep_share(rel: SessionRelease, body: bytes, statement: dict) -> None:
    """This key holder's share and signed statement, kept (private, fsynced) as soon as they are formed: the
    one share of this key, which the Flower path sends in a later message than the one that formed it."""
    from secure_afl._io import write_file

    write_file(kept_paths(rel.keys_dir, rel.session_id)[0], json.dumps(
        {"share_statement": statement, "share": base64.b64encode(body).decode()}, sort_keys=True).encode(), mode=0o600)


def kept_share(rel: SessionRelease) -> tuple[bytes, dict]:
    path = kept_paths(rel.keys_dir, rel.session_id)[0]
    try:
        kept = json.loads(path.read_bytes())
        return base64.b64decode(kept["share"], validate=True), kept["share_statement"]
    except (OSError, ValueError, KeyError, TypeError, binascii.Error):
        raise PolicyViolation(f"this key holder formed no share for session {rel.session_id} ({path} is missing or "
                              "unreadable)", reason="no_share") from None


def keep_commitment(rel: SessionRelease, manifest: dict, body: bytes, statement: dict, answer) -> KeptCommitment:
    """The server's answer to this key holder's share statement, checked and kept before the share leaves:
    the statement and share are its own for this manifest, the sum is signed by the server over exactly that
    statement (else :class:`ServerForgery`, recorded in the release ledger); the copy is written beside the
    keys (``<session>.split-commitment.json``) and then recorded in the release ledger, which from then on
    allows a release from that sum only."""
    from secure_afl._io import write_file

    params = rel.params
    try:
        split.verify_share(params, manifest, body, statement, rel.identity_key.public_key())
        signed, masked = read_commitment(answer)
        split.verify_masked_sum(params, statement, masked, signed, rel.server_identity)
    except (InvalidSignature, MalformedPayload) as e:
        raise refuse_server_sum(rel.release_ledger, params, e) from None
    path = kept_paths(rel.keys_dir, rel.session_id)[1]
    doc = {"session_id": rel.session_id, "manifest": manifest, "share_statement": statement, "masked_sum": signed,
           "aggregate": base64.b64encode(masked).decode()}
    write_file(path, json.dumps(doc, indent=1, sort_keys=True).encode(), mode=0o644)
    ledger = ReleaseLedger(rel.release_ledger)
    try:
        ledger.keep_commitment(params.backend_params[split.PUBLIC_CONTEXT_KEY], rel.session_id,
                               signed["share_statement_sha256"], signed["masked_sum_sha256"])
    finally:
        ledger.close()
    return KeptCommitment(manifest, statement, body, signed, masked)


def check_same_commitment(rel: SessionRelease, kept: KeptCommitment, answer) -> None:
    """A masked sum handed over once a commitment is kept must be that commitment; any other is refused by name
    (:class:`ServerForgery`, recorded): after the share, the server can form a sum for any release it wants."""
    try:
        same = read_commitment(answer) == (kept.signed, kept.masked_sum)
    except MalformedPayload:
        same = False
    if not same:
        raise refuse_server_sum(rel.release_ledger, rel.params, InvalidSignature(
            "a second masked sum, not the one the server committed to before the share left"))


def kept_commitment(rel: SessionRelease) -> KeptCommitment | None:
    """The commitment the release ledger recorded for this session's key, read back from its kept copy and
    checked again; None if none was kept (the share has not left). A recorded commitment whose copy is gone or
    differs refuses the release: the only other sum would be one the server formed after it could have seen
    the share."""
    params = rel.params
    ledger = ReleaseLedger(rel.release_ledger)
    try:
        row = ledger.commitment(params.backend_params[split.PUBLIC_CONTEXT_KEY])
    finally:
        ledger.close()
    if row is None:
        return None
    path = kept_paths(rel.keys_dir, rel.session_id)[1]
    try:
        doc = json.loads(path.read_bytes())
        masked = base64.b64decode(doc["aggregate"], validate=True)
        manifest, statement, signed = doc["manifest"], doc["share_statement"], doc["masked_sum"]
    except (OSError, ValueError, KeyError, TypeError, binascii.Error):
        raise PolicyViolation(f"the release ledger records the server's committed masked sum for session "
                              f"{rel.session_id}, but its kept copy {path} is missing or unreadable: not releasing "
                              "from any other sum", reason="commitment_missing") from None
    body, own = kept_share(rel)
    if own != statement or (signed.get("share_statement_sha256"), signed.get("masked_sum_sha256")) != \
            (row["statement_sha256"], row["masked_sum_sha256"]):
        raise PolicyViolation(f"the kept commitment {path} is not the one the release ledger recorded: not "
                              "releasing from it", reason="commitment_missing")
    return KeptCommitment(manifest, statement, body, signed, masked)


def release_split(rel: SessionRelease, source, judge, *, timings: dict | None = None) -> tuple[bytes, dict]:
    """split: this key holder's share ``-sum PRG(s_k)`` over the manifest's cohort, signed and bound to it; the
    steps in the order their safety needs.

    ``source`` gives only ``manifest()`` and ``tags()`` (the hospitals' signed seed statements): no
    masked vector is ever fetched here, since with every seed in hand any masked vector would be
    readable. Checks: the manifest under this key holder's parameters, enrolments and threshold;
    each participant's seed statement signed by that hospital over the payload hash it also signed
    in the manifest; each box opening under the AD (session, parameters, hospital, payload hash).
    One share per key (the ledger): a second release under the same seeds is refused, and a forged
    manifest or box blocks the key. ``judge`` (:class:`secure_afl.keyholder.split_stream.SplitJudge`) holds
    the verdicts formed as the uploads arrived; any upload not judged yet is judged here by the same code
    (:func:`split_verdicts`). Returns ``(share bytes, signed share statement)``; ``timings``, if given,
    receives the seconds spent judging what was left and forming the share.
    """
    params = rel.params
    key_id = params.backend_params[split.PUBLIC_CONTEXT_KEY]
    ledger = ReleaseLedger(rel.release_ledger)
    try:
        # one share per key: a used or blocked seed key is refused before anything is fetched
        ledger.check_unused(key_id)
        manifest = source.manifest()
        try:  # the signed quorum of the roster, before any verdict or share is formed for this manifest
            m = verify_manifest_for(params, manifest, rel.server_identity, rel.enrolled, rel.policy)
        except ServerForgery as e:
            ledger.block(key_id, f"refused before the share: {e}")
            raise
        check_dp_noise(params, len(m["participants"]))
        statements = source.tags()
        t = time.perf_counter()
        # the manifest holds: only now are its seeds opened, for the verdicts not formed as the uploads arrived
        raw, refused, evidence = split_verdicts(rel, judge, source, m, statements, ledger)
        verifier_s = time.perf_counter() - t
        # before the share is formed: a crash or a refusal below still counts as this key's one share
        ledger.record_decryption(key_id, rel.session_id, [p["hospital"] for p in m["participants"]])
        try:
            t = time.perf_counter()
            # the share is the cohort's masks, started from the sum of those judged valid as they arrived
            # (under DP with the Gram statement a mask not judged as it arrived adds its part of the noise words'
            # permutation here, at this key holder's own query seed for the upload)
            qseeds = {h: bytes.fromhex(q["query_seed"]) for h, q in judge.queries(statements).items()} \
                if split.noise_beside(params) else None
            share = split.keyholder_share(params, judge.seed_key(), m, statements, rel.enrolled, refused=refused,
                                          judged=judge.judged(), sum_masks=split.pool.lane_masks(params, judge.pool),
                                          query_seeds=qseeds)
            if timings is not None:
                timings.update({"server_verifier_seconds": verifier_s,
                                "judge_and_share_seconds": time.perf_counter() - t})
            if refused:  # both verifier messages the refusals rest on, kept with the key holder's record
                keep_validity_evidence(rel.keys_dir, rel.session_id, {h: raw[h] for h in refused}, refused,
                                       evidence)
            # the signed policy's refusal limit and quorum abort the release rather than shrink the cohort
            cohort = cohort_after_refusals(rel.policy, [p["hospital"] for p in m["participants"]], refused)
            # a refused upload's noise share leaves the release with it: the noise is the cohort's
            check_dp_noise(params, len(cohort))
            # in the privacy ledger, as the release it enables (the collector cannot unmask without the
            # share, which leaves only after this), at the noise the cohort's shares sum to
            account_split_release(rel, m["aggregate_sha256"], len(cohort))
        except split.SeedRefused as e:
            ledger.block(key_id, f"refused before the share: {e}")
            raise ContributionRejected(f"no share released: {e}", e.hospital) from e
        # signed last, over the cohort and refusals it covers: the collector sums exactly this cohort
        return split.sign_share(rel.identity_key, params, m, share, refused, evidence)
    finally:
        ledger.close()
        judge.pool.close()  # this key's one share is formed or refused: the judge's processes are done


def finalize_split(rel: SessionRelease, conn, judge, *, lam: float = 0.0, min_class_count: int = 1) -> FinalResult:
    """split, commit before reveal: this key holder's signed share statement (no share) to the server, which
    signs and stores the masked sum of that statement's cohort; that sum checked and kept here
    (:func:`commit_split_share`); only then the share sent (:func:`send_split_share`) and the release formed
    from exactly the kept sum (:func:`release_from_sum`). A retry after the commitment was kept skips to
    the share and the kept sum: the server is never asked for a sum again.

    What is downloaded before the share leaves: the manifest, the seed statements and the committed masked sum
    of the cohort this key holder signed -- nothing per hospital, and no sum over any other set."""
    t0 = time.perf_counter()
    timings: dict = {}
    kept = kept_commitment(rel)
    if kept is None:
        kept = commit_split_share(rel, conn, judge, timings=timings)
    else:
        judge.pool.close()  # this key's share was formed in an earlier run
    share_s = time.perf_counter() - t0  # manifest and seed statements fetched, checked, opened, expanded, summed
    send_split_share(rel, conn, kept)
    res = release_from_sum(rel, kept.share, kept.statement, kept.signed, kept.masked_sum, kept.manifest, lam=lam,
                           min_class_count=min_class_count)
    res.report.update({"keyholder_share_seconds": round(share_s, 3),
                       **{k: round(v, 3) for k, v in timings.items()}})
    return res


def commit_split_share(rel: SessionRelease, conn, judge, *, timings: dict | None = None) -> KeptCommitment:
    """This key holder's share and signed statement (:func:`release_split`), kept; the statement alone posted
    to ``.../split/commit``; the server's signed masked sum over it checked and kept (:func:`keep_commitment`).
    The share has not left when this returns."""
    from secure_afl.encoding import canonical_json

    source = HTTPSource(conn)
    if kept_paths(rel.keys_dir, rel.session_id)[0].exists():
        # formed and kept by an earlier run that stopped before any commitment: the share has not left
        body, statement = kept_share(rel)
        judge.pool.close()
    else:
        body, statement = release_split(rel, source, judge, timings=timings)
        keep_share(rel, body, statement)
    answer = conn.request("POST", conn.path("/split/commit"), body=canonical_json(statement)).json()
    return keep_commitment(rel, source.manifest(), body, statement, answer)


def mark_share_sent(rel: SessionRelease) -> None:
    ledger = ReleaseLedger(rel.release_ledger)
    try:
        ledger.mark_share_sent(rel.params.backend_params[split.PUBLIC_CONTEXT_KEY])
    finally:
        ledger.close()


def send_split_share(rel: SessionRelease, conn, kept: KeptCommitment) -> None:
    """The share, sent for the statement the server committed to, once the ledger counts it as gone."""
    from secure_afl.encoding import canonical_json

    mark_share_sent(rel)
    conn.request("POST", conn.path("/split/share"), body=kept.share,
                 headers={H_TAG: canonical_json(kept.statement).decode()})


def release_from_sum(rel: SessionRelease, body: bytes, statement: dict, signed: dict, masked_sum: bytes,
                     manifest: dict, *, lam: float = 0.0, min_class_count: int = 1) -> FinalResult:
    """split: the release from this key holder's own share and signed statement and the server-signed masked
    sum it kept before the share left (:class:`KeptCommitment`), as every other backend's key holder forms its release: the sum must be the server's, over exactly
    the cohort and refusals of ``statement``, for that statement and its manifest (else
    :class:`ServerForgery`, naming what differs, recorded in the release ledger); then the share is added,
    the sum decoded, checked and solved here. The cohort, contributors and refusals in the report and the
    model file are the statement's, never the server's."""
    params = rel.params
    try:
        # this key holder's own statement and share, as kept: its signature and share hash, so the share added
        # below is the one it formed
        split.verify_share(params, manifest, body, statement, rel.identity_key.public_key())
        split.verify_masked_sum(params, statement, masked_sum, signed, rel.server_identity)
        cohort, refused = list(statement["cohort"]), dict(statement["refused"])
        share = split.field_of(params).from_bytes(body, what="this key holder's share")
        try:
            res = form_release(params, masked_sum, share, len(cohort), rel.policy, lam=lam,
                               min_class_count=min_class_count)
        except SanityCheckFailed as e:
            if e.reason != split.SHARE_MISMATCH:  # a release check (the share cap, the Gram), not the sum
                raise
            raise InvalidSignature(f"the server-signed masked sum does not decode with this key holder's share "
                                   f"({e}): it is not the sum of the cohort's masked uploads") from None
    except (InvalidSignature, MalformedPayload) as e:
        raise refuse_server_sum(rel.release_ledger, params, e) from None
    report = release_report(params, cohort, res.stats, lam, res.sanity, res.tol, statement["aggregate_sha256"])
    report.update({"dp": res.dp, "w_error_bound": res.bound.to_dict(), "verdict": res.bound.verdict,
                   "share_sha256": statement["share_sha256"], "refused": refused,
                   "masked_sum_sha256": signed["masked_sum_sha256"],
                   "share_statement_sha256": signed["share_statement_sha256"]})
    if params.dp is not None:  # this key holder's own accounting of the release, made before its share left
        report["dp"] = {**(report.get("dp") or {}), **split_privacy(rel, manifest, refused)}
    return FinalResult(res.W, res.stats, params, manifest, report)


def refuse_server_sum(release_ledger: Path, params: SessionParams, err: Exception) -> ServerForgery:
    """The server's masked sum is refused: recorded against the session's seed key (its one share has
    left; nothing more is released under it) and logged, and returned as :class:`ServerForgery`."""
    reason = f"the server's masked sum was refused: {err}"
    log.error("split %s: %s", params.session_id, reason)
    ledger = ReleaseLedger(release_ledger)
    try:
        ledger.block(params.backend_params[split.PUBLIC_CONTEXT_KEY], reason)
    finally:
        ledger.close()
    return ServerForgery(f"not releasing: {reason}")


def split_privacy(rel: SessionRelease, manifest: dict, refused: dict) -> dict:
    """This key holder's privacy record of a split release it made (epsilon of the release, the ledger's
    composed epsilon now), read back from its privacy ledger; ``refused``: its signed statement's refusals
    (their noise is not in the release)."""
    from secure_afl.dp.ledger import PrivacyLedger
    from secure_afl.dp.mechanism import epsilon_from_rdp

    params = rel.params
    n = len(manifest["participants"]) - len(refused)
    with PrivacyLedger(rel.privacy_ledger) as pl:
        rows = {r["aggregate_sha256"]: r for r in pl.releases()}
        composed = pl.composed_rdp()
    rec = rows.get(manifest["aggregate_sha256"])
    if rec is None:
        raise PolicyViolation("this split release is not in the key holder's privacy ledger")
    eps_all = float("inf") if not np.all(np.isfinite(composed)) else \
        epsilon_from_rdp(composed, float(params.dp["delta"]))
    return {**dict(params.dp), "epsilon": rec["epsilon"], "epsilon_composed": eps_all, "contributors": n}


def split_verdicts(rel: SessionRelease, judge, source, manifest: dict, statements: dict, ledger):
    """``(the server's messages behind the refusals, refused, evidence)`` for the manifest's participants: the
    verdicts ``judge`` formed as the uploads arrived, and those of any upload not judged yet (or judged under
    another statement), formed now by the same code (keyholder/split_stream.py). A seed statement or box
    that fails blocks the key and refuses the release naming its hospital, as a forged server message
    does."""
    if rel.secret is not None:
        judge.unlock(rel.secret)
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
    return {h: records[h]["server_message"] for h in refused}, refused, evidence


def account_split_release(rel: SessionRelease, release_id: str, contributors: int) -> dict | None:
    """Record the release a split share enables in the privacy ledger, as :func:`solve_and_account` records a
    secagg or bfv release: with DP, its Renyi curve at the noise of ``contributors`` shares; without,
    a release that voids the composed guarantee. Returns the privacy record (None without DP)."""
    from secure_afl.dp.ledger import PrivacyLedger
    from secure_afl.dp.mechanism import epsilon_from_rdp, release_rdp

    params = rel.params
    with PrivacyLedger(rel.privacy_ledger) as pl:
        if params.dp is None:
            pl.record(params.session_id, release_id, None, 0.0, float("inf"))
            return None
        rdp = release_rdp(params, contributors)
        delta = float(params.dp["delta"])
        eps = epsilon_from_rdp(rdp, delta)
        composed = pl.preview(release_id, rdp, delta)
        pl.record(params.session_id, release_id, rdp, delta, eps)
    return {**dict(params.dp), "epsilon": eps, "epsilon_composed": composed, "contributors": contributors}


def keep_validity_evidence(keys_dir: Path, session_id: str, messages: dict, refused: dict, evidence: dict) -> Path:
    """Both verifier messages behind each refusal: the server-signed one and this key holder's own (also
    in its signed share statement). Anyone holding the two recomputes the verdict
    (:func:`secure_afl.split.roles.joint_verdict`); the refused hospital, from its own payload
    and seed, recomputes each message and so finds which party's message is false
    (:func:`secure_afl.split.roles.dispute`)."""
    from secure_afl._io import write_file

    path = Path(keys_dir) / f"{session_id}.validity-refusals.json"
    write_file(path, json.dumps({"refused": refused, "server_messages": messages, "keyholder": evidence},
                                indent=1, sort_keys=True).encode(), mode=0o644, exclusive=False)
    return path
