"""split's signed messages, one module: what the hospital, the server and the key holder sign to each other.

* the hospital's seed statement (``split-seed``, v3): the payload hash, the sealed seed box and the validity
  commitment (:class:`UploadCommitment`) the proof's randomness is drawn from;
* the server's verifier message (``split-verifier``, v1): its share of the proof's check for one upload, at
  the key holder's query seed for it (:func:`query_seed`);
* the key holder's share statement (``split-share``, v3): the manifest, the cohort its share covers, the
  uploads it refused and, for each, the evidence (:func:`refusal_evidence`);
* the server's masked sum (``split-sum``, v1): the hash of the masked uploads' sum over exactly one share
  statement's cohort, bound to that statement, the manifest and the session. The key holder adds its share to
  it and forms the release itself; the signature makes the sum the server's word, which an auditor holding the
  masked uploads recomputes (:mod:`secure_afl.split_release`).

Each message's signed bytes are its domain prefix (:mod:`secure_afl.domains`) and its canonical JSON.
"""

from __future__ import annotations
import hashlib
import hmac
from dataclasses import dataclass
from typing import Mapping
import numpy as np
from cryptography.exceptions import InvalidSignature as _CryptoInvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from .. import domains
from ..encoding import canonical_json
from ..exceptions import InvalidContribution, InvalidSignature, MalformedPayload
from ..params import SessionParams
from ..cohort import HOSPITAL_PROVEN, JOINT_CHECK
from ..signing import box_statement, sign_box_statement, verify_box_statement
from .keys import BOX_LEN, refuse_retired
from .sizes import field_of, main_words

__all__ = ["UploadCommitment", "seed_digest", "SeedRefused", "sign_seed_statement", "verify_seed_statement",
           "verifier_statement", "sign_verifier_message", "verify_leader_message", "signed_query_seed",
           "query_key", "query_seed", "manifest_digest", "refusal_evidence", "share_statement", "sign_share",
           "verify_share_statement", "verify_share", "share_statement_digest", "masked_sum_statement", "sign_masked_sum", "verify_masked_sum"]

#: the prefix of the validity proof's Fiat-Shamir hashes (and of a seed's digest)
FS_PREFIX = domains.SPLIT_VALIDITY
_SEED_SIG_PREFIX = domains.SPLIT_SEED
_SHARE_SIG_PREFIX = domains.SPLIT_SHARE
_VERIFIER_SIG_PREFIX = domains.SPLIT_VERIFIER
_QUERY_PREFIX = domains.SPLIT_QUERY
_SUM_SIG_PREFIX = domains.SPLIT_SUM


# -- the hospital's seed statement -----------------------------------------------------------------------
@dataclass(frozen=True)
class UploadCommitment:
    """What the hospital signs beside its payload hash: the hashes Fiat-Shamir derives the rows and
    joint randomness from. ``seed_sha256`` binds the mask seed (the key holder checks it on the opened seed)."""

    main_sha256: str
    aux_sha256: str
    seed_sha256: str

    def to_dict(self) -> dict:
        return {"main_sha256": self.main_sha256, "aux_sha256": self.aux_sha256, "seed_sha256": self.seed_sha256}

    @classmethod
    def from_dict(cls, d) -> "UploadCommitment":
        try:
            vals = [d["main_sha256"], d["aux_sha256"], d["seed_sha256"]]
            if not all(isinstance(v, str) and len(v) == 64 and int(v, 16) >= 0 for v in vals):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise MalformedPayload("the validity commitment needs three hex SHA-256 digests") from None
        return cls(*vals)


def seed_digest(seed: bytes) -> str:
    return hashlib.sha256(FS_PREFIX + domains.SPLIT_FS_SEED + bytes(seed)).hexdigest()


class SeedRefused(InvalidContribution):
    """A participant's seed statement or box does not hold; ``hospital`` names it."""

    def __init__(self, message: str, hospital: str):
        super().__init__(message)
        self.hospital = hospital


def _seed_statement(params: SessionParams, hospital: str, payload_sha256: str, box: bytes,
                    validity: Mapping) -> dict:
    return box_statement("split-seed", 3, params, hospital, payload_sha256, box, validity=dict(validity))


def sign_seed_statement(identity_key, params: SessionParams, hospital: str, payload_sha256: str,
                        box: bytes, validity: Mapping) -> dict:
    """Hospital: the signed statement sent with the upload (in the upload's tag header); ``validity`` is the
    commitment (:class:`UploadCommitment` as a dict) its proof's randomness is drawn from."""
    return sign_box_statement(identity_key, _SEED_SIG_PREFIX,
                              _seed_statement(params, hospital, payload_sha256, box, validity))


def verify_seed_statement(statement: Mapping, identity_pub, params: SessionParams, hospital: str,
                          payload_sha256: str) -> bytes:
    """Server at upload, key holder at release: the statement is ``hospital``'s, for this payload; -> box."""
    validity = UploadCommitment.from_dict(statement.get("validity")).to_dict()
    box_hex = statement.get("box") if isinstance(statement, Mapping) else None
    if isinstance(box_hex, str):
        refuse_retired(len(box_hex) // 2, f"{hospital}'s seed statement's box")
    return verify_box_statement(statement, identity_pub, _SEED_SIG_PREFIX,
                                lambda box: _seed_statement(params, hospital, payload_sha256, box, validity),
                                BOX_LEN, f"{hospital}'s seed statement")


# -- the server's verifier message ---------------------------------------------------------------------


def verifier_statement(params: SessionParams, hospital: str, payload_sha256: str, query_seed: bytes,
                        message: np.ndarray) -> dict:
    return {"type": "split-verifier", "v": 1, "session_id": params.session_id,
            "params_digest": params.digest().hex(), "hospital": hospital, "payload_sha256": payload_sha256,
            "query_seed": bytes(query_seed).hex(), "message": field_of(params).to_bytes(message).hex()}


def sign_verifier_message(params: SessionParams, hospital: str, payload_sha256: str, query_seed: bytes, message,
                 identity_key) -> dict:
    st = verifier_statement(params, hospital, payload_sha256, query_seed, message)
    return {**st, "signature": identity_key.sign(_VERIFIER_SIG_PREFIX + canonical_json(st)).hex()}


def query_key(secret_context: bytes) -> bytes:
    """Key holder: its per-session query key, derived from its secret seed key (which never leaves it)."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=domains.SPLIT_QUERY_KEY).derive(bytes(secret_context))


def query_seed(key: bytes, params: SessionParams, hospital: str, payload_sha256: str, validity) -> bytes:
    """Key holder: one upload's query seed, ``HMAC-SHA256(query key, SPLIT_QUERY || upload)`` over the
    hospital-signed commitment: fixed only once the upload is, and unknown to anyone without the key holder's
    key until the key holder hands it to the server (docs/VALIDITY.md, "Verifying as uploads arrive")."""
    upload = canonical_json({"session_id": params.session_id, "params_digest": params.digest().hex(),
                             "hospital": hospital, "payload_sha256": payload_sha256,
                             "validity": UploadCommitment.from_dict(validity).to_dict()})
    return hmac.new(bytes(key), _QUERY_PREFIX + upload, hashlib.sha256).digest()


_QUERY_PREFIX = domains.SPLIT_QUERY


def verify_leader_message(statement, server_pub, circuit, hospital: str,
                          payload_sha256: str, expected_query_seed: bytes) -> tuple[bytes, np.ndarray]:
    """Key holder: the server's message for exactly this upload, at the query seed this key holder derived for
    it -> (query seed, message); else :class:`InvalidSignature` (unsigned, forged, replayed from another upload
    or session, or formed at a query seed of the server's own: before the key holder's query existed)."""
    try:
        qs = bytes.fromhex(statement["query_seed"])
        msg = circuit.F.from_bytes(bytes.fromhex(statement["message"]), circuit.verifier_len,
                             what=f"the server's verifier message for {hospital}")
        sig = bytes.fromhex(statement["signature"])
    except (KeyError, TypeError, ValueError):
        raise InvalidSignature(f"the server's verifier message for {hospital} is missing or malformed") from None
    if not _hmac_compare(qs, expected_query_seed):
        raise InvalidSignature(f"the server's verifier message for {hospital} was not formed at this key "
                               "holder's query seed for that upload (formed before it, or for another upload)")
    st = verifier_statement(circuit.params, hospital, payload_sha256, qs, msg)
    if {k: statement.get(k) for k in st} != st:
        raise InvalidSignature(f"the server's verifier message for {hospital} is for another upload or session")
    try:
        server_pub.verify(sig, _VERIFIER_SIG_PREFIX + canonical_json(st))
    except _CryptoInvalidSignature:
        raise InvalidSignature(f"the server's verifier message for {hospital} is not signed by the server") from None
    return qs, msg


def _hmac_compare(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(bytes(a), bytes(b))


def signed_query_seed(server_message, hospital: str) -> bytes:
    """The query seed the server signed its message at. Only the key holder can derive an upload's query seed
    (:func:`query_seed`); anyone else recomputes a verdict at the seed the server signed, which is the one the
    key holder formed its own message at whenever the two agree (a message formed at another seed fails
    :meth:`Circuit.decide`, except with the proof's soundness error)."""
    try:
        return bytes.fromhex(server_message["query_seed"])
    except (KeyError, TypeError, ValueError):
        raise InvalidSignature(f"the server's verifier message for {hospital} is missing or malformed") from None


# -- the key holder's share statement and its evidence -------------------------------------------------


def manifest_digest(manifest: Mapping) -> str:
    return hashlib.sha256(canonical_json(dict(manifest))).hexdigest()


def refusal_evidence(check: str, keyholder_message: bytes | None) -> dict:
    """What the key holder publishes for one refusal: the check, its own verifier message (with the server's
    signed one, anyone recomputes the verdict: :func:`secure_afl.split.roles.joint_verdict`), and who the evidence
    points at. Only a commitment that fails on the hospital's own sealed seed involves no server-formed
    message; every other failure is of the joint check, the hospital's or the server's."""
    return {"check": check, "keyholder_message": None if keyholder_message is None else keyholder_message.hex(),
            "attribution": HOSPITAL_PROVEN if check == "commitment" else JOINT_CHECK}


def share_statement(params: SessionParams, manifest: Mapping, share_sha256: str, refused: Mapping,
                     evidence: Mapping | None = None) -> dict:
    everyone = {p["hospital"] for p in manifest["participants"]}
    if not isinstance(refused, Mapping) or not set(refused) <= everyone or \
            not all(isinstance(v, str) for v in refused.values()):
        raise MalformedPayload("the refused uploads are not a mapping of the manifest's hospitals to a check")
    evidence = {} if evidence is None else evidence
    if not isinstance(evidence, Mapping) or set(evidence) - set(refused):
        raise MalformedPayload("the refusal evidence is not a mapping of refused hospitals")
    return {"type": "split-share", "v": 3, "session_id": params.session_id, "params_digest": params.digest().hex(),
            "manifest_sha256": manifest_digest(manifest), "aggregate_sha256": manifest["aggregate_sha256"],
            "cohort": sorted(everyone - set(refused)), "refused": dict(sorted(refused.items())),
            "evidence": {h: dict(evidence[h]) for h in sorted(evidence)}, "share_sha256": share_sha256}


def sign_share(identity_key, params: SessionParams, manifest: Mapping, share: np.ndarray,
               refused: Mapping | None = None, evidence: Mapping | None = None) -> tuple[bytes, dict]:
    """Key holder: ``(share bytes, signed statement)`` bound to the manifest, its masked aggregate, the cohort
    it covers, the uploads it refused (hospital -> failed check), which the collector leaves out, and for each
    refusal this key holder's own verifier message (:func:`refusal_evidence`)."""
    body = field_of(params).to_bytes(share)
    st = share_statement(params, manifest, hashlib.sha256(body).hexdigest(), refused or {}, evidence)
    return body, {**st, "signature": identity_key.sign(_SHARE_SIG_PREFIX + canonical_json(st)).hex()}


def verify_share_statement(params: SessionParams, manifest: Mapping, statement: Mapping, keyholder_pub) -> None:
    """Server, before it commits to a masked sum: ``statement`` is the key holder's, signed over exactly this
    manifest, a cohort and refusals of its participants, and a share hash -- the share itself not yet seen."""
    if not isinstance(statement, Mapping) or not isinstance(statement.get("share_sha256"), str) or \
            len(statement["share_sha256"]) != 64:
        raise MalformedPayload("the share statement carries no share hash")
    st = share_statement(params, manifest, statement["share_sha256"], statement.get("refused"),
                         statement.get("evidence"))
    if {k: statement.get(k) for k in st} != st:
        raise InvalidSignature("the key holder's share statement is for another manifest or cohort")
    try:
        keyholder_pub.verify(bytes.fromhex(statement["signature"]), _SHARE_SIG_PREFIX + canonical_json(st))
    except (_CryptoInvalidSignature, KeyError, TypeError, ValueError):
        raise InvalidSignature("the key holder's share is not signed by the key holder") from None


def verify_share(params: SessionParams, manifest: Mapping, body: bytes, statement: Mapping,
                 keyholder_pub) -> np.ndarray:
    """Collector: the key holder's share for exactly this manifest -> words (``statement["refused"]`` names
    the uploads it does not cover)."""
    verify_share_statement(params, manifest, statement, keyholder_pub)
    if not hmac.compare_digest(hashlib.sha256(body).hexdigest(), statement["share_sha256"]):
        raise InvalidSignature("the key holder's share is for another manifest, cohort or body")
    F = field_of(params)
    if len(body) != F.ENCODED_SIZE * main_words(params):
        raise MalformedPayload("the key holder's share has the wrong length")
    return F.from_bytes(body, what="the key holder's share")


# -- the server's masked sum over one share statement's cohort ---------------------------------------------


def share_statement_digest(statement: Mapping) -> str:
    """SHA-256 of the key holder's signed share statement (signature included: Ed25519 is deterministic, so one
    statement has one digest)."""
    return hashlib.sha256(canonical_json(dict(statement))).hexdigest()


def masked_sum_statement(params: SessionParams, share_statement: Mapping, masked_sum: bytes) -> dict:
    """What the server signs over the masked sum it hands the key holder: the session, the manifest and the
    share statement it answers, that statement's cohort and refusals, and the sealed sum's hash. A sum over
    any other set of uploads would let the key holder, who holds every seed, difference out a refused upload;
    the cohort in the signature is what makes that the server's provable word."""
    try:
        cohort, refused = list(share_statement["cohort"]), sorted(share_statement["refused"])
        manifest_sha = str(share_statement["manifest_sha256"])
    except (KeyError, TypeError):
        raise MalformedPayload("the share statement names no manifest, cohort or refusals") from None
    return {"type": "split-sum", "v": 1, "session_id": params.session_id, "params_digest": params.digest().hex(),
            "manifest_sha256": manifest_sha, "share_statement_sha256": share_statement_digest(share_statement),
            "cohort": cohort, "refused": refused, "masked_sum_sha256": hashlib.sha256(bytes(masked_sum)).hexdigest()}


def sign_masked_sum(identity_key, params: SessionParams, share_statement: Mapping, masked_sum: bytes) -> dict:
    """Server: its signed statement over the masked sum of exactly ``share_statement``'s cohort."""
    st = masked_sum_statement(params, share_statement, masked_sum)
    return {**st, "signature": identity_key.sign(_SUM_SIG_PREFIX + canonical_json(st)).hex()}


def verify_masked_sum(params: SessionParams, share_statement: Mapping, masked_sum: bytes, signed: Mapping,
                      server_pub) -> None:
    """Key holder and auditor: ``signed`` is the server's statement over these sum bytes, for exactly this share
    statement (its manifest, cohort and refusals) in this session; :class:`InvalidSignature` naming the first
    field that differs otherwise (a stale sum from another session or statement, another cohort, other bytes,
    or no server signature)."""
    if not isinstance(signed, Mapping):
        raise InvalidSignature("the server's masked sum carries no signed statement")
    want = masked_sum_statement(params, share_statement, masked_sum)
    what = {"type": "is not a masked-sum statement", "v": "is of another version",
            "session_id": "is for another session", "params_digest": "is for other parameters",
            "manifest_sha256": "is for another manifest",
            "share_statement_sha256": "answers another share statement (stale or replayed)",
            "cohort": "is over another cohort than the share statement's",
            "refused": "leaves out other uploads than the share statement refused",
            "masked_sum_sha256": "does not match the masked sum's bytes"}
    for k, v in want.items():
        if signed.get(k) != v:
            raise InvalidSignature(f"the server's masked sum {what[k]}")
    try:
        server_pub.verify(bytes.fromhex(signed["signature"]), _SUM_SIG_PREFIX + canonical_json(want))
    except (_CryptoInvalidSignature, KeyError, TypeError, ValueError):
        raise InvalidSignature("the server's masked sum is not signed by the server") from None
