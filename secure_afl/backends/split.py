"""``split``: two-aggregator additive shares (the Prio3 / DAP shape); the server leads, the key holder helps.

Ring and encoding: the exact two-lane fixed point of secagg and bfv
(:mod:`secure_afl.hazmat.fixedpoint`), 2L lanes carried in the prime field
F_p, p = 2^64 - 2^32 + 1, so that the server and the key holder can check a
proof of the upload's validity on their shares
(:mod:`secure_afl.backends.split_validity`, docs/VALIDITY.md). The lanes'
scale leaves room for k_max *proven* uploads below 2^62 < p/2, so the centred
sum is the integer sum and the release is the one secagg and bfv give.

Hospital k, per upload, with a fresh 32-byte seed s_k (``w_k`` = lanes || validity bits || proofs)::

    y_k    = w_k + m_k,  m_k = expand_field(s_k)     (mod p; ChaCha20 words below p, their own domain)
    P_k    = seal(params, "contribution", y_k)      (what the server stores; it sums the lane part)
    box_k  = HPKE.SealBase(T_pub, info = SPLIT_SEED_HPKE || 0 || AD_k, aad = "", s_k)   (RFC 9180, one shot)
             KEM ML-KEM-768 + X25519 (hybrid), KDF HKDF-SHA256, AEAD ChaCha20-Poly1305:
             enc (1120 bytes: 1088 ML-KEM ciphertext, 32 X25519) || ct (32) || tag (16) = 1168 bytes
    AD_k   = canonical JSON {session_id, params_digest, hospital, payload_sha256 = SHA-256(P_k)}

The hybrid KEM keeps a recorded box closed unless BOTH ML-KEM-768 and X25519
fall: a later quantum attack on X25519 alone opens nothing. The associated
data rides in HPKE's ``info`` (the one context input ``cryptography`` exposes
for single-shot HPKE); it enters the key schedule, so a box opens under
exactly the AD it was sealed for, as an AEAD's associated data would.
    stmt_k = Ed25519_k("split-seed" statement over session, parameters, hospital, SHA-256(P_k), box_k,
                       validity commitment)

Server (leader): ``Y = sum_k y_k`` over the manifest's cohort, as secagg's
sum; it sees only words that are uniform given anything it holds (one
ChaCha20 stream per hospital, never reused).

Key holder (helper): it judges each upload's validity proof as it arrives
(:func:`keyholder_verdicts`, at a query seed of its own,
:func:`split_validity.query_seed`); at the release, from the server-signed
manifest and the signed seed statements only -- never a masked vector -- it
checks every signature and AD, applies its release policy and the
one-share-per-key ledger, and
releases ``S = -sum_{k in cohort} m_k`` (lane part), signed over the manifest's
digest, the cohort and the uploads whose validity proof failed (left out).

Collector (the server, as in secagg): ``Y + S = sum_k enc(x_k)`` and decodes.
``Y`` over any other set than the cohort leaves at least one hospital's
``PRG(s_k)`` un-cancelled (or an extra one subtracted): uniform words.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Mapping

import numpy as np
from cryptography.exceptions import InvalidSignature as _CryptoInvalidSignature
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.mlkem import MLKEM768PrivateKey, MLKEM768PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from .. import domains
from ..envelope import open_envelope, seal
from ..exceptions import InvalidContribution, InvalidSignature, \
    MalformedPayload, ParameterMismatch, SanityCheckFailed, SecureAFLError
from ..hazmat import fixedpoint, flp
from ..hazmat.prg import SEED_BYTES
from ..packing import Layout
from ..params import Bounds, SessionParams
from ..workers import map_chunks
from . import split_validity
from ..encoding import canonical_json
from ..signing import box_statement, sign_box_statement, verify_box_statement
from ..protection import Combiner, ProtectionBackend, check_vector

__all__ = ["SplitBackend", "SplitKeyPair", "session_params", "split_session_params", "generate_keys",
           "bind_public_context", "expected_abs_error", "seal_seed", "open_seed", "sign_seed_statement",
           "verify_seed_statement", "open_statement_seed", "manifest_digest", "keyholder_share",
           "sign_share", "verify_share", "collect", "SeedRefused", "PUBLIC_CONTEXT_KEY", "BOX_LEN", "ENC_LEN",
           "PUBLIC_KEY_LEN", "SECRET_KEY_LEN", "SEED_BOX_FORMAT", "seal_box", "open_box"]

PUBLIC_CONTEXT_KEY = "public_context_sha256"
#: RFC 9180 HPKE, hybrid KEM ML-KEM-768 + X25519, HKDF-SHA256, ChaCha20-Poly1305
_SUITE = hpke.Suite(hpke.KEM.MLKEM768_X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
SEED_BOX_FORMAT = "HPKE (RFC 9180) MLKEM768-X25519 / HKDF-SHA256 / ChaCha20-Poly1305"
_MLKEM_PUB, _MLKEM_SEED, _X25519 = 1184, 64, 32
#: the KEM's encapsulated key: 1088 bytes of ML-KEM-768 ciphertext and a 32-byte X25519 share
ENC_LEN = hpke.KEM.MLKEM768_X25519.enc_length()
BOX_LEN = ENC_LEN + SEED_BYTES + 16
#: the key holder's public seed key: ML-KEM-768 encapsulation key || X25519 public key
PUBLIC_KEY_LEN = _MLKEM_PUB + _X25519
#: its secret: the 64-byte ML-KEM-768 seed (d || z) || the X25519 private key
SECRET_KEY_LEN = _MLKEM_SEED + _X25519
#: the retired box (X25519 + HKDF-SHA256 + ChaCha20-Poly1305 by hand): refused by name, never opened
_RETIRED_BOX_LEN = 32 + SEED_BYTES + 16
_RETIRED_FORMAT = "X25519 + HKDF-SHA256 + ChaCha20-Poly1305 (the retired hand-built seed box, 80 bytes)"
_HPKE_INFO = domains.SPLIT_SEED_HPKE
_SEED_SIG_PREFIX = domains.SPLIT_SEED
_SHARE_SIG_PREFIX = domains.SPLIT_SHARE


class SeedRefused(InvalidContribution):
    """A participant's seed statement or box does not hold; ``hospital`` names it."""

    def __init__(self, message: str, hospital: str):
        super().__init__(message)
        self.hospital = hospital


@dataclass(frozen=True)
class SplitKeyPair:
    """The key holder's per-session hybrid seed key (ML-KEM-768 + X25519): :data:`SECRET_KEY_LEN` secret bytes,
    :data:`PUBLIC_KEY_LEN` public bytes (the public context)."""

    secret_context: bytes
    public_context: bytes


def split_session_params(session_id: str, layout: Layout, gamma: float, bounds: Bounds, *,
                         frac_bits: tuple | None = None, gram_proof: bool = False, max_share: float = 1.0,
                         **_) -> SessionParams:
    """Lane bits from the bounds (as secagg and bfv, lowered where a validity-proven upload needs the room:
    :func:`split_validity.choose_frac_bits`); not yet bound to the key holder's seed key. ``gram_proof``: every
    upload also proves its statistics are a Gram matrix (docs/VALIDITY.md, "The Gram statement")."""
    base = SessionParams(session_id, "split", layout, gamma, bounds)
    if gram_proof:  # absent when off, so the digest of a session without it is unchanged
        base = base.with_backend_params(**{split_validity.GRAM_KEY: True})
    if float(max_share) < 1.0:
        base = base.with_backend_params(max_share=float(max_share))
    # the validity proof bounds an upload's entries only up to a factor (docs/VALIDITY.md): the lanes keep
    # room for k_max such uploads in F_p
    fb = split_validity.choose_frac_bits(base) if frac_bits is None else \
        fixedpoint.check_frac_bits(frac_bits, bounds, gamma)
    return base.with_backend_params(frac_bits=[int(f) for f in fb])


#: Common name (see :func:`secure_afl.backends.he_module`).
session_params = split_session_params


def generate_keys(params: SessionParams) -> SplitKeyPair:
    """Key holder: a FRESH hybrid ML-KEM-768 + X25519 key for this session's seed boxes."""
    mk, xk = MLKEM768PrivateKey.generate(), X25519PrivateKey.generate()
    return SplitKeyPair(mk.private_bytes_raw() + xk.private_bytes_raw(),
                        mk.public_key().public_bytes_raw() + xk.public_key().public_bytes_raw())


def _check_public_key(public_context: bytes) -> bytes:
    if not isinstance(public_context, (bytes, bytearray)):
        raise MalformedPayload("a split public context is a byte string")
    raw = bytes(public_context)
    if len(raw) == 32:
        raise MalformedPayload(f"a 32-byte X25519 seed key is the retired {_RETIRED_FORMAT} format; this "
                               f"session's seed key is {PUBLIC_KEY_LEN} bytes for {SEED_BOX_FORMAT}")
    if len(raw) != PUBLIC_KEY_LEN:
        raise MalformedPayload(f"a split public context is one {PUBLIC_KEY_LEN}-byte ML-KEM-768 + X25519 key")
    try:  # a small-order X25519 point would drop the classical half: refuse it here, not at the first upload
        MLKEM768PublicKey.from_public_bytes(raw[:_MLKEM_PUB])
        X25519PrivateKey.generate().exchange(X25519PublicKey.from_public_bytes(raw[_MLKEM_PUB:]))
    except ValueError:
        raise InvalidContribution() from None
    return raw


def _public_key(raw: bytes) -> hpke.MLKEM768X25519PublicKey:
    return hpke.MLKEM768X25519PublicKey(MLKEM768PublicKey.from_public_bytes(raw[:_MLKEM_PUB]),
                                        X25519PublicKey.from_public_bytes(raw[_MLKEM_PUB:]))


def _private_key(raw: bytes) -> hpke.MLKEM768X25519PrivateKey:
    raw = bytes(raw)
    if len(raw) != SECRET_KEY_LEN:
        raise MalformedPayload(f"a split secret context is {SECRET_KEY_LEN} bytes (ML-KEM-768 seed || X25519 key)")
    return hpke.MLKEM768X25519PrivateKey(MLKEM768PrivateKey.from_seed_bytes(raw[:_MLKEM_SEED]),
                                         X25519PrivateKey.from_private_bytes(raw[_MLKEM_SEED:]))


def bind_public_context(params: SessionParams, public_context: bytes) -> SessionParams:
    return params.with_backend_params(
        **{PUBLIC_CONTEXT_KEY: hashlib.sha256(_check_public_key(public_context)).hexdigest()})


def expected_abs_error(params: SessionParams, n_clients: int | None = None, *,
                       magnitude: float | None = None) -> float:
    k = params.bounds.k_max if n_clients is None else int(n_clients)
    m = params.bounds.aggregate_bound(params.gamma) if magnitude is None else float(magnitude)
    return fixedpoint.abs_error_bound(tuple(params.backend_params["frac_bits"]), k, m)


# -- seed boxes ---------------------------------------------------------------------------------
def _ad(params: SessionParams, hospital: str, payload_sha256: str) -> bytes:
    return canonical_json({"session_id": params.session_id, "params_digest": params.digest().hex(),
                           "hospital": hospital, "payload_sha256": payload_sha256})


def _info(ad: bytes) -> bytes:
    return _HPKE_INFO + b"\0" + ad


def _refuse_retired(box_len: int, what: str) -> None:
    if box_len == _RETIRED_BOX_LEN:
        raise MalformedPayload(f"{what} is sealed in the retired {_RETIRED_FORMAT} format; this session takes "
                               f"{SEED_BOX_FORMAT} boxes of {BOX_LEN} bytes")


def seal_box(public_context: bytes, ad: bytes, seed: bytes) -> bytes:
    """HPKE single-shot SealBase of ``seed`` to the hybrid seed key, ``info = SPLIT_SEED_HPKE || 0 || ad``."""
    return _SUITE.encrypt(bytes(seed), _public_key(_check_public_key(public_context)), info=_info(ad))


def open_box(secret_key: bytes, ad: bytes, box: bytes, what: str = "a seed box") -> bytes:
    """Inverse of :func:`seal_box`: the seed, or :class:`MalformedPayload` (a retired or mis-sized box) or
    :class:`InvalidContribution` (another key or another ``ad``)."""
    box = bytes(box)
    _refuse_retired(len(box), what)
    if len(box) != BOX_LEN:
        raise MalformedPayload(f"{what} has the wrong length")
    try:
        seed = _SUITE.decrypt(box, _private_key(secret_key), info=_info(ad))
    except (InvalidTag, ValueError):
        seed = None
    if seed is None or len(seed) != SEED_BYTES:
        raise InvalidContribution(f"{what} does not open under this key and associated data")
    return seed


def seal_seed(params: SessionParams, public_context: bytes, hospital: str, payload_sha256: str,
              seed: bytes) -> bytes:
    """Hospital: the HPKE box of ``seed`` to the key holder's seed key, AD = (session, params, hospital, hash)."""
    return seal_box(public_context, _ad(params, hospital, payload_sha256), seed)


def open_seed(params: SessionParams, secret_key: bytes, hospital: str, payload_sha256: str, box: bytes) -> bytes:
    """Key holder: the seed in ``box``, if it was sealed for this session, hospital and payload hash;
    else :class:`InvalidContribution` naming the hospital."""
    try:
        return open_box(secret_key, _ad(params, hospital, payload_sha256), box, f"{hospital}'s seed box")
    except InvalidContribution:
        raise InvalidContribution(f"{hospital}'s seed box does not open for this session, hospital and "
                                  "payload (replayed from another upload, or tampered)") from None


def _seed_statement(params: SessionParams, hospital: str, payload_sha256: str, box: bytes,
                    validity: Mapping) -> dict:
    return box_statement("split-seed", 3, params, hospital, payload_sha256, box, validity=dict(validity))


def sign_seed_statement(identity_key, params: SessionParams, hospital: str, payload_sha256: str,
                        box: bytes, validity: Mapping) -> dict:
    """Hospital: the signed statement sent with the upload (in the upload's tag header); ``validity`` is the
    commitment (:class:`split_validity.UploadCommitment` as a dict) its proof's randomness is drawn from."""
    return sign_box_statement(identity_key, _SEED_SIG_PREFIX,
                              _seed_statement(params, hospital, payload_sha256, box, validity))


def verify_seed_statement(statement: Mapping, identity_pub, params: SessionParams, hospital: str,
                          payload_sha256: str) -> bytes:
    """Server at upload, key holder at release: the statement is ``hospital``'s, for this payload; -> box."""
    validity = split_validity.UploadCommitment.from_dict(statement.get("validity")).to_dict()
    box_hex = statement.get("box") if isinstance(statement, Mapping) else None
    if isinstance(box_hex, str):
        _refuse_retired(len(box_hex) // 2, f"{hospital}'s seed statement's box")
    return verify_box_statement(statement, identity_pub, _SEED_SIG_PREFIX,
                                lambda box: _seed_statement(params, hospital, payload_sha256, box, validity),
                                BOX_LEN, f"{hospital}'s seed statement")


# -- the key holder's share ------------------------------------------------------------------------
def manifest_digest(manifest: Mapping) -> str:
    return hashlib.sha256(canonical_json(dict(manifest))).hexdigest()


def open_statement_seed(params: SessionParams, secret_key: bytes, statements: Mapping, enrolled: Mapping,
                        hospital: str, payload_sha256: str) -> bytes:
    """Key holder: ``hospital``'s seed, from its statement checked against its enrolled key and the payload
    hash it signed in the manifest; :class:`SeedRefused` naming it otherwise."""
    st = statements.get(hospital)
    try:
        if not isinstance(st, Mapping):
            raise MalformedPayload(f"no seed statement for {hospital}, a participant of the manifest")
        box = verify_seed_statement(st, enrolled[hospital], params, hospital, payload_sha256)
        return open_seed(params, secret_key, hospital, payload_sha256, box)
    except SecureAFLError as e:
        raise SeedRefused(f"{hospital}'s seed: {e}", hospital) from e


def keyholder_verdicts(params: SessionParams, items, *, workers: int = 1,
                       messages: dict | None = None) -> tuple[dict, np.ndarray]:
    """Key holder: ``(hospital -> None or the check its upload failed, -sum m_k (mod p) over the accepted)``
    for ``items`` of ``(hospital, opened seed, validity commitment, query seed, the server's checked
    verifier message)`` (:func:`split_validity.verify_leader_message`). Each verdict is independent of the
    others and needs that upload's whole mask, whose lane part is summed as it is judged: no seed is expanded
    twice, and the sum over the accepted uploads is what the release's share starts from.

    The verdicts run in ``workers`` spawned processes when there are enough uploads to pay for starting them
    (:data:`split_validity.PROCESS_MIN_UPLOADS` per worker): their table lookups and small field operations
    hold the GIL, so threads would not scale. The opened seeds go to this key holder's own worker processes
    over pipes, nowhere else; the result does not depend on how the uploads are split.

    ``messages``, if given, receives for each refused upload this key holder's own verifier message (bytes),
    which it publishes beside the server's (:func:`refusal_evidence`)."""
    items = [(h, bytes(seed), validity, bytes(qs), flp.to_bytes(msg)) for h, seed, validity, qs, msg in items]
    w = workers if len(items) >= split_validity.PROCESS_MIN_UPLOADS * max(1, workers) else 1
    total = np.zeros(fixedpoint.n_words(params.layout.length), dtype=np.uint64)
    refused: dict[str, str] = {}
    for partial, refused_here, own in map_chunks(_share_chunk, params.to_dict(), items, w):
        total = flp.add(total, partial)
        refused.update(refused_here)
        if messages is not None:
            messages.update(own)
    return {h: refused.get(h) for h, *_ in items}, total


def refusal_evidence(check: str, keyholder_message: bytes | None) -> dict:
    """What the key holder publishes for one refusal: the check, its own verifier message (with the server's
    signed one, anyone recomputes the verdict: :func:`split_validity.joint_verdict`), and who the evidence
    points at. Only a commitment that fails on the hospital's own sealed seed involves no server-formed
    message; every other failure is of the joint check, the hospital's or the server's."""
    from secure_afl.cohort import HOSPITAL_PROVEN, JOINT_CHECK

    return {"check": check, "keyholder_message": None if keyholder_message is None else keyholder_message.hex(),
            "attribution": HOSPITAL_PROVEN if check == "commitment" else JOINT_CHECK}


def keyholder_share(params: SessionParams, secret_key: bytes, manifest: Mapping, statements: Mapping,
                    enrolled: Mapping, *, refused: Mapping | None = None,
                    judged: tuple[Mapping, np.ndarray] | None = None, workers: int = 1) -> np.ndarray:
    """``-sum m_k (mod p)`` over EXACTLY the (already verified) manifest's participants not in ``refused``
    (hospital -> the check its upload failed: left out of the sum, for the collector to subtract from the
    masked sum).

    ``statements``: hospital -> signed seed statement, as the server relayed
    them; each is checked against the hospital's enrolled key and the
    hospital-signed payload hash in the manifest before its box is opened,
    here, for every participant: the first statement or box that fails raises
    naming its hospital.

    ``judged``: ``(hospital -> SHA-256 of the seed, sum)`` with ``sum`` the
    ``-sum m_k`` :func:`keyholder_verdicts` formed over those uploads as they
    were judged. The share starts from it and expands only the masks where
    the cohort and that set differ (a judged upload under another seed counts
    as not judged), so its total is the same as summing every mask here.
    """
    if not isinstance(statements, Mapping):
        raise MalformedPayload("the relayed seed statements are not a mapping")
    refused = dict(refused or {})
    covered, total = ({}, None) if judged is None else (dict(judged[0]), judged[1])
    n = fixedpoint.n_words(params.layout.length)
    total = np.zeros(n, dtype=np.uint64) if total is None else np.asarray(total, dtype=np.uint64).copy()
    cohort = {}
    for p in manifest["participants"]:
        h = p["hospital"]
        seed = open_statement_seed(params, secret_key, statements, enrolled, h, p["payload_sha256"])
        if h not in refused:
            cohort[h] = seed
    add = [seed for h, seed in cohort.items() if covered.get(h) != split_validity.seed_digest(seed)]
    if any(h not in cohort or split_validity.seed_digest(cohort[h]) != d for h, d in covered.items()):
        # a judged upload the cohort does not take (left out of the manifest, or under another seed): its
        # mask is in the running sum, and its seed is not in this manifest to take it out again; sum afresh
        total, add = np.zeros(n, dtype=np.uint64), list(cohort.values())
    for partial in map_chunks(_mask_chunk, params.to_dict(), add,
                              workers if len(add) >= split_validity.PROCESS_MIN_UPLOADS * max(1, workers) else 1):
        total = flp.add(total, partial)
    return total


def _mask_chunk(params_dict: dict, seeds: list) -> np.ndarray:
    """``-sum`` of the lane masks of ``seeds`` (one worker's part of :func:`keyholder_share`)."""
    n = fixedpoint.n_words(SessionParams.from_dict(params_dict).layout.length)
    total = np.zeros(n, dtype=np.uint64)
    for seed in seeds:
        total = flp.add(total, flp.neg(flp.expand_field(seed, n, split_validity.DOMAIN_SHARE)))
    return total


def _share_chunk(params_dict: dict, items: list) -> tuple[np.ndarray, dict, dict]:
    """One worker's part of :func:`keyholder_verdicts`: ``-sum m_k`` over its accepted uploads, its refusals,
    and its own verifier message for each refused one."""
    params = SessionParams.from_dict(params_dict)
    n = fixedpoint.n_words(params.layout.length)
    total = np.zeros(n, dtype=np.uint64)
    refused: dict[str, str] = {}
    messages: dict[str, bytes] = {}
    circuit = split_validity.Circuit(params) if items else None
    for h, seed, validity, query_seed, message in items:
        mask = circuit.helper_share(seed)  # -m over the whole body: the verdict's share, the lanes first
        msg = flp.from_bytes(message, circuit.verifier_len, what=f"the server's verifier message for {h}")
        reason, own = split_validity.helper_verdict(circuit, h, seed, {"validity": validity}, query_seed, msg,
                                                    share=mask, with_message=True)
        if reason is None:
            total = flp.add(total, mask[:n])
        else:
            refused[h] = reason
            if own is not None:
                messages[h] = flp.to_bytes(own)
    return total, refused, messages


def _share_statement(params: SessionParams, manifest: Mapping, share_sha256: str, refused: Mapping,
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
    body = np.asarray(share, dtype=np.uint64).astype("<u8", copy=False).tobytes()
    st = _share_statement(params, manifest, hashlib.sha256(body).hexdigest(), refused or {}, evidence)
    return body, {**st, "signature": identity_key.sign(_SHARE_SIG_PREFIX + canonical_json(st)).hex()}


def verify_share(params: SessionParams, manifest: Mapping, body: bytes, statement: Mapping,
                 keyholder_pub) -> np.ndarray:
    """Collector: the key holder's share for exactly this manifest -> words (``statement["refused"]`` names
    the uploads it does not cover)."""
    st = _share_statement(params, manifest, hashlib.sha256(body).hexdigest(), statement.get("refused"),
                          statement.get("evidence"))
    if {k: statement.get(k) for k in st} != st:
        raise InvalidSignature("the key holder's share is for another manifest, cohort or body")
    try:
        keyholder_pub.verify(bytes.fromhex(statement["signature"]), _SHARE_SIG_PREFIX + canonical_json(st))
    except (_CryptoInvalidSignature, KeyError, TypeError, ValueError):
        raise InvalidSignature("the key holder's share is not signed by the key holder") from None
    if len(body) != 8 * fixedpoint.n_words(params.layout.length):
        raise MalformedPayload("the key holder's share has the wrong length")
    return flp.from_bytes(body, what="the key holder's share")


def collect(params: SessionParams, masked_aggregate: bytes, share: np.ndarray, subtract=()) -> np.ndarray:
    """``dec(Y - sum subtract + S)`` over F_p: the float64 sum, refused if it leaves the declared aggregate bound.

    ``subtract``: the masked words of the uploads the key holder refused (they are in ``Y`` but not in ``S``)."""
    env = open_envelope(params, masked_aggregate, "aggregate")
    n = fixedpoint.n_words(params.layout.length)
    if len(env.body) != 8 * n or np.asarray(share).shape != (n,):
        raise MalformedPayload("masked aggregate or share has the wrong length")
    words = flp.add(flp.from_bytes(env.body, n, what="the masked sum"), np.asarray(share, dtype=np.uint64))
    for w in subtract:
        words = flp.sub(words, w)
    # every proven lane sum is below 2^62 < p/2 (split_validity.choose_frac_bits): the centred value is exact
    v = fixedpoint.decode(flp.decode_signed(words).view(np.uint64), tuple(params.backend_params["frac_bits"]))
    # what k_max validity-proven uploads can reach (split_validity): past it the share and sum do not match
    limit = split_validity.proven_aggregate_bound(params) * (1 + 2.0 ** -50)
    if not np.all(np.isfinite(v)) or float(np.max(np.abs(v))) > limit:
        raise SanityCheckFailed("masked sum + key holder's share leaves the declared aggregate bound: the "
                                "share was not formed for these masked vectors")
    cap = float(params.backend_params.get("max_share", 1.0))
    n_released = float(v[params.layout.slices["n"]][0])
    if cap < 1.0 and params.bounds.n_max > cap * n_released * (1 + 2.0 ** -40):
        raise SanityCheckFailed(f"the release pools {round(n_released)} samples: one hospital (n_max = "
                                f"{params.bounds.n_max}) could hold more than the session's max_share = {cap:g} "
                                "of them", reason="share_cap")
    if split_validity.gram_enabled(params):
        # every summed upload proved its statistics a Gram matrix: an honest sum cannot be indefinite, so this
        # refusal is no veto (docs/VALIDITY.md, "The Gram statement")
        d = params.layout.dim
        gram = np.zeros((d, d))
        iu = np.triu_indices(d)
        gram[iu] = v[params.layout.slices["gram"]]
        gram.T[iu] = v[params.layout.slices["gram"]]
        if float(np.linalg.eigvalsh(gram)[0]) < -split_validity.psd_tolerance(params, gram):
            raise SanityCheckFailed("the released Gram is not positive semi-definite although every upload in it "
                                    "proved its statistics a Gram matrix: the share or the masked sum is not "
                                    "the cohort's", reason="psd")
    return v


# -- the backend ----------------------------------------------------------------------------------------
class _SplitCombiner(Combiner):
    """``Y = sum y_k mod 2^64`` (O(L) memory); the server cannot read any y_k or Y."""

    def __init__(self, backend: "SplitBackend"):
        super().__init__()
        self._b = backend
        self._sum = np.zeros(fixedpoint.n_words(backend.params.layout.length), dtype=np.uint64)

    def _add(self, payload: bytes) -> None:
        self._sum = flp.add(self._sum, self._b.masked_words(payload))

    def _partial(self) -> bytes:
        return self._sum.astype("<u8", copy=False).tobytes()

    def _merge(self, body: bytes) -> None:
        if len(body) != 8 * self._sum.shape[0]:
            raise MalformedPayload("split partial sum has the wrong length")
        self._sum = flp.add(self._sum, flp.from_bytes(body, what="split partial sum"))

    def _aggregate(self) -> bytes:
        return seal(self._b.params, "aggregate", self._partial(), contributors=self.count)


class SplitBackend(ProtectionBackend):
    """``split`` behind the common interface (module docstring for the protocol).

    * hospital: ``protect(vector, public_context=T_pub, hospital=name, identity_key=k)`` -> ``(payload,
      signed seed statement)``
    * server:   ``combiner()``; collector: :func:`collect`
    * key holder: :func:`keyholder_share`, :func:`sign_share`
    """

    name = "split"

    def __init__(self, params: SessionParams):
        super().__init__(params)
        fixedpoint.check_frac_bits(params.backend_params.get("frac_bits"), params.bounds, params.gamma)
        self.circuit = split_validity.Circuit(params)

    @property
    def frac_bits(self) -> tuple:
        return tuple(self.params.backend_params["frac_bits"])

    def _check_key(self, public_context: bytes) -> bytes:
        raw = _check_public_key(public_context)
        bound = self.params.backend_params.get(PUBLIC_CONTEXT_KEY)
        if bound is None or hashlib.sha256(raw).hexdigest() != bound:
            raise ParameterMismatch("the seed key is not the one the key holder signed into the parameters")
        return raw

    def protect(self, vector, *, public_context: bytes, hospital: str, identity_key, seed: bytes | None = None,
                **kw) -> tuple[bytes, dict]:
        """Hospital: encode, prove validity, mask the whole body with a FRESH seed, seal the seed, sign.

        ``seed`` is for tests of fixed vectors only; by default ``os.urandom(32)`` per try
        (:meth:`split_validity.Circuit.prove`).
        """
        v = check_vector(self.params, vector)
        key = self._check_key(public_context)
        body, seed, commitment = self.circuit.prove(hospital, v, seed=seed)
        return self.seal_upload(body, seed, commitment, key, hospital, identity_key)

    def seal_upload(self, body, seed: bytes, commitment, public_context: bytes, hospital: str,
                    identity_key) -> tuple[bytes, dict]:
        """The sealed payload and signed seed statement for a proven body (the attack commands build bodies
        whose statement is false and seal them here, as a malicious hospital's software would)."""
        payload = seal(self.params, "contribution", flp.to_bytes(body))
        sha = hashlib.sha256(payload).hexdigest()
        box = seal_seed(self.params, self._check_key(public_context), hospital, sha, seed)
        return payload, sign_seed_statement(identity_key, self.params, hospital, sha, box, commitment.to_dict())

    def upload_share(self, payload: bytes) -> np.ndarray:
        """The server's share of an upload: every word (main vector, bits, proofs), each a field element."""
        return self.circuit.upload_share(payload)

    def masked_words(self, payload: bytes) -> np.ndarray:
        """The masked main vector (2L field elements), the part that is summed."""
        return self.upload_share(payload)[:self.circuit.main_len]

    def combiner(self, **kw) -> Combiner:
        return _SplitCombiner(self)

    def reveal(self, aggregate: bytes, *, share: np.ndarray, **kw) -> np.ndarray:
        """Collector: the float64 sum from the masked aggregate and the key holder's (verified) share."""
        return collect(self.params, aggregate, share)

