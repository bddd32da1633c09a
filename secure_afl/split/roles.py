"""split's roles, as pure functions: no I/O, no randomness of their own (the caller draws it and passes it in).

* hospital, :func:`shard`: encode, prove validity, mask the whole body with the seed in ``rand``, seal the
  payload, box the seed to the key holder (HPKE draws its own ephemeral key inside ``cryptography``), sign;
* server (leader), :func:`check_upload` at upload and :func:`leader_prep` / :func:`leader_message` per upload
  at the key holder's query seed;
* key holder (helper), :func:`open_statement_seed` and :func:`helper_verdict` per upload, then
  :func:`keyholder_share` over the manifest's cohort;
* release, :func:`collect`: ``dec(Y_c + S)`` (the key holder, on the server-signed masked sum of its cohort;
  an auditor recomputing it), checked against what proven uploads can reach (the release policy's own checks,
  the share cap and the Gram's definiteness, are :func:`secure_afl.release_checks.check_release_policy`);
* anyone, :func:`joint_verdict` from the two published verifier messages; the refused hospital,
  :func:`dispute`.

Transport, storage, ledgers and worker pools are elsewhere (server/split_round.py, keyholder/split_stream.py,
keyholder/release/split_share.py, :mod:`secure_afl.split.pool`); :func:`secure_afl.split.driver.run_split` drives every
role in memory.
"""

from __future__ import annotations

import hashlib
from typing import Mapping

import numpy as np

from ..protection import check_vector
from ..envelope import open_envelope, seal
from ..exceptions import MalformedPayload, ParameterMismatch, SanityCheckFailed, SecureAFLError
from ..hazmat import fixedpoint, flp
from ..params import SessionParams
from .keys import PUBLIC_CONTEXT_KEY, check_public_key, open_seed, seal_seed
from .signed_messages import SeedRefused, UploadCommitment, seed_digest, sign_seed_statement, sign_verifier_message, \
    signed_query_seed, verify_leader_message, verify_seed_statement
from .noise_twist import noise_twist
from .proof import DOMAIN_SHARE, Circuit
from .sizes import field_of, main_words, noise_beside, proven_aggregate_bound

#: the refinement of :class:`SanityCheckFailed` when a masked sum and a share were not formed over one cohort
SHARE_MISMATCH = "share_mismatch"

__all__ = ["SHARE_MISMATCH", "bound_public_key", "shard", "seal_upload", "check_upload", "leader_prep", "leader_message",
           "open_statement_seed", "helper_verdict", "keyholder_share", "lane_masks", "cohort_masked_sum", "collect",
           "joint_verdict", "dispute"]


# -- hospital ---------------------------------------------------------------------------------------------
def bound_public_key(params: SessionParams, public_context: bytes) -> bytes:
    """The key holder's seed key, if it is the one the key holder signed into the parameters."""
    raw = check_public_key(public_context)
    bound = params.backend_params.get(PUBLIC_CONTEXT_KEY)
    if bound is None or hashlib.sha256(raw).hexdigest() != bound:
        raise ParameterMismatch("the seed key is not the one the key holder signed into the parameters")
    return raw


def seal_upload(params: SessionParams, body, seed: bytes, commitment: UploadCommitment, public_context: bytes,
                hospital: str, identity_key) -> tuple[bytes, dict]:
    """The sealed payload and signed seed statement for a proven body (the attack commands build bodies
    whose statement is false and seal them here, as a malicious hospital's software would)."""
    payload = seal(params, "contribution", field_of(params).to_bytes(body))
    sha = hashlib.sha256(payload).hexdigest()
    box = seal_seed(params, bound_public_key(params, public_context), hospital, sha, seed)
    return payload, sign_seed_statement(identity_key, params, hospital, sha, box, commitment.to_dict())


def shard(circuit: Circuit, vector, *, hospital: str, public_context: bytes, identity_key,
          rand: bytes, noise=None) -> tuple[bytes, dict]:
    """Hospital: ``(payload, signed seed statement)`` for one packed vector, with ``rand``
    (:attr:`Circuit.rand_size` fresh random bytes: the mask seed and the proofs' blinding).
    :class:`~secure_afl.split.statements.Unlucky` when this seed's projection rows leave the honest range
    (probability below 2^-16): the caller draws fresh ``rand`` and tries again. Under DP with the Gram
    statement, ``vector`` is the statistics before the noise and ``noise`` the hospital's share."""
    params = circuit.params
    v = check_vector(params, vector)
    key = bound_public_key(params, public_context)
    x, fw = circuit.witness(v, noise=noise)
    body, seed, commitment = circuit.prove_once(hospital, x, fw, rand)
    return seal_upload(params, body, seed, commitment, key, hospital, identity_key)


# -- server (leader) ----------------------------------------------------------------------------------------
def check_upload(circuit: Circuit, payload: bytes, statement: Mapping) -> np.ndarray:
    """Server, at upload: the signed commitment is of this payload's words (else the rows and the joint
    randomness would not be bound to the data they test). Returns the payload's words, its share, which the
    server adds to its running sum without opening the envelope again."""
    share = circuit.upload_share(payload)
    circuit.check_commitment(share, UploadCommitment.from_dict(statement.get("validity")), leader=True)
    return share


def leader_prep(circuit: Circuit, hospital: str, payload: bytes, validity, query_seed: bytes, *,
                accepted: bool = False) -> np.ndarray:
    """The server's verifier message (unsigned) for one upload it accepted: :func:`check_upload` held for
    these bytes then (the server refuses the upload otherwise), so the commitment is not hashed again here.
    ``accepted``: the caller has matched the bytes' SHA-256 against the accepted upload's (the worker that
    reads the stored file does), so the envelope's own body digest is not computed again either."""
    share = circuit.upload_share(payload, accepted=accepted)
    return circuit.query(share, UploadCommitment.from_dict(validity), hospital, query_seed, leader=True)


def leader_message(circuit: Circuit, hospital: str, payload: bytes, statement: Mapping, identity_key,
                   query_seed: bytes) -> dict:
    """Server: its verifier message for one upload at the key holder's query seed for it, signed over the
    session, hospital and payload hash so the key holder can hold it to it."""
    qs = bytes(query_seed)
    msg = leader_prep(circuit, hospital, payload, statement.get("validity"), qs)
    return sign_verifier_message(circuit.params, hospital, hashlib.sha256(payload).hexdigest(), qs, msg,
                                 identity_key)


# -- key holder (helper) ------------------------------------------------------------------------------------
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


def helper_verdict(circuit: Circuit, hospital: str, seed: bytes, statement: Mapping, query_seed: bytes,
                   leader_msg: np.ndarray, *, share: np.ndarray | None = None, with_message: bool = False):
    """Key holder: None if ``hospital``'s upload is valid, else the check it failed. ``share``: this seed's
    :meth:`Circuit.helper_share` when the caller has already expanded it (the release sums its lane part).
    ``with_message``: ``(verdict, this key holder's own verifier message or None)``, the message it publishes
    beside the server's when it refuses."""
    commitment = UploadCommitment.from_dict(statement.get("validity"))
    try:
        circuit.check_commitment(None, commitment, leader=False, seed=seed)
    except MalformedPayload:
        return ("commitment", None) if with_message else "commitment"
    share = circuit.helper_share(seed) if share is None else share
    own = circuit.query(share, commitment, hospital, query_seed, leader=False)
    verdict = circuit.decide(leader_msg, own)
    return (verdict, own) if with_message else verdict


def lane_masks(n: int, seeds, field=flp.GOLDILOCKS) -> np.ndarray:
    """``-sum`` of the lane masks (the first ``n`` words of each body's mask) of ``seeds``, in ``field`` (the
    session's, :func:`secure_afl.split.sizes.field_of`)."""
    F = field
    total = F.zeros(n)
    for seed in seeds:
        total = F.sub(total, F.expand_field(seed, n, DOMAIN_SHARE))
    return total


def keyholder_share(params: SessionParams, secret_key: bytes, manifest: Mapping, statements: Mapping,
                    enrolled: Mapping, *, refused: Mapping | None = None,
                    judged: tuple[Mapping, np.ndarray] | None = None, sum_masks=None,
                    query_seeds: Mapping | None = None) -> np.ndarray:
    """``-sum m_k (mod p)`` over EXACTLY the (already verified) manifest's participants not in ``refused``
    (hospital -> the check its upload failed: left out of the sum, for the server to subtract from the
    masked sum).

    ``statements``: hospital -> signed seed statement, as the server relayed
    them; each is checked against the hospital's enrolled key and the
    hospital-signed payload hash in the manifest before its box is opened,
    here, for every participant: the first statement or box that fails raises
    naming its hospital.

    ``judged``: ``(hospital -> SHA-256 of the seed, sum)`` with ``sum`` the
    ``-sum m_k`` :func:`secure_afl.split.pool.keyholder_verdicts` formed over those uploads as they
    were judged. The share starts from it and expands only the masks where
    the cohort and that set differ (a judged upload under another seed counts
    as not judged), so its total is the same as summing every mask here.

    ``sum_masks(n, seeds)``: how the masks left to add are summed (None: :func:`lane_masks` in the session's
    field; the key holder passes its worker pool's, :func:`secure_afl.split.pool.lane_masks`).

    ``query_seeds``: hospital -> this key holder's query seed for its upload, needed under DP with the Gram
    statement, where each mask added here also adds its part of the post-commitment permutation of the noise
    words (:mod:`secure_afl.split.noise_twist`; the judged sum carries it already).
    """
    F = field_of(params)
    if sum_masks is None:
        def sum_masks(n, seeds):
            return lane_masks(n, seeds, F)
    if not isinstance(statements, Mapping):
        raise MalformedPayload("the relayed seed statements are not a mapping")
    refused = dict(refused or {})
    covered, total = ({}, None) if judged is None else (dict(judged[0]), judged[1])
    n = main_words(params)
    total = F.zeros(n) if total is None else np.asarray(total, dtype=F.dtype).copy()
    cohort = {}
    for p in manifest["participants"]:
        h = p["hospital"]
        seed = open_statement_seed(params, secret_key, statements, enrolled, h, p["payload_sha256"])
        if h not in refused:
            cohort[h] = seed
    add = {h: seed for h, seed in cohort.items() if covered.get(h) != seed_digest(seed)}
    if any(h not in cohort or seed_digest(cohort[h]) != d for h, d in covered.items()):
        # a judged upload the cohort does not take (left out of the manifest, or under another seed): its
        # mask is in the running sum, and its seed is not in this manifest to take it out again; sum afresh
        total, add = F.zeros(n), dict(cohort)
    total = F.add(total, sum_masks(n, list(add.values())))
    circuit = Circuit(params) if add and noise_beside(params) else None
    for h, seed in add.items() if circuit is not None else ():
        qs = (query_seeds or {}).get(h)
        if qs is None:
            raise MalformedPayload(f"no query seed for {h}: the noise words' permutation needs each upload's")
        total = F.add(total, noise_twist(circuit, circuit.helper_share(seed), bytes(qs)))
    return total


# -- release ------------------------------------------------------------------------------------------------
def cohort_masked_sum(params: SessionParams, aggregate: bytes, refused_payloads, contributors: int,
                      twisted=()) -> bytes:
    """Server: the sealed masked sum of one cohort, the manifest's masked sum less the masked words of the
    uploads the key holder refused, sealed as the server's running sum seals it (so an auditor summing the
    cohort's uploads afresh gets these bytes exactly). The one computation of it: the server's commitment,
    the in-memory driver and the audit's comparison all rest on it.

    ``twisted``: ``(payload, query seed)`` of every cohort upload under DP with the Gram statement (none
    otherwise): each adds the server's part of ``lanes - z + pi(z)`` (:mod:`secure_afl.split.noise_twist`)."""
    F, n = field_of(params), main_words(params)
    env = open_envelope(params, aggregate, "aggregate")
    if len(env.body) != F.ENCODED_SIZE * n:
        raise MalformedPayload("the masked sum has the wrong length")
    words = F.from_bytes(env.body, n, what="the masked sum")
    twisted = list(twisted) if noise_beside(params) else []
    circuit = Circuit(params) if refused_payloads or twisted else None
    for payload in refused_payloads:
        words = F.sub(words, circuit.upload_share(payload)[:circuit.main_len])
    for payload, qs in twisted:
        words = F.add(words, noise_twist(circuit, circuit.upload_share(payload), bytes(qs)))
    return seal(params, "aggregate", F.to_bytes(words), contributors=int(contributors))


def collect(params: SessionParams, masked_aggregate: bytes, share: np.ndarray, subtract=()) -> np.ndarray:
    """``dec(Y - sum subtract + S)`` over F_p: the float64 sum, refused if it leaves the declared aggregate bound
    (the share and the sum were not formed over the same uploads). Nothing else: what the signed policy asks of
    the released statistics is checked by the release (:func:`secure_afl.release_checks.check_release_policy`).

    ``subtract``: the masked words of the uploads the key holder refused (they are in ``Y`` but not in ``S``)."""
    env = open_envelope(params, masked_aggregate, "aggregate")
    F, n = field_of(params), main_words(params)
    share = np.asarray(share, dtype=np.uint64) if F is flp.GOLDILOCKS else np.asarray(share)
    if len(env.body) != F.ENCODED_SIZE * n or share.shape != (n,) or share.dtype != F.dtype:
        raise MalformedPayload("masked aggregate or share has the wrong length or is not of the session's field")
    words = F.add(F.from_bytes(env.body, n, what="the masked sum"), share)
    for w in subtract:
        words = F.sub(words, w)
    fb = tuple(int(f) for f in params.backend_params["frac_bits"])
    # every proven lane sum is below 2^wrap_bits < p/2 (choose_frac_bits): the centred value is exact
    if F is flp.GOLDILOCKS:
        v = fixedpoint.decode(flp.decode_signed(words).view(np.uint64), fb)
    else:
        # one word per value: the centred integer S = S_hi 2^f2 + S_lo rounded once to float64 (as
        # fixedpoint.decode rounds it), then scaled by 2^-(f1 + f2), exactly
        v = np.ldexp(F.decode_signed_float(words), -(fb[0] + fb[1]))
    # what k_max validity-proven uploads can reach (proven_aggregate_bound): past it the share and sum do not match
    limit = proven_aggregate_bound(params) * (1 + 2.0 ** -50)
    if not np.all(np.isfinite(v)) or float(np.max(np.abs(v))) > limit:
        raise SanityCheckFailed("masked sum + key holder's share leaves the declared aggregate bound: the "
                                "share was not formed for these masked vectors", reason=SHARE_MISMATCH)
    return v


# -- anyone -------------------------------------------------------------------------------------------------
def joint_verdict(params: SessionParams, hospital: str, payload_sha256: str, server_message: Mapping,
                  keyholder_message_hex: str, server_pub) -> str | None:
    """Anyone: the verdict the two published verifier messages give (None: valid, else the failed check),
    after checking the server's signature over its message for exactly this upload."""
    circuit = Circuit(params)
    _, leader = verify_leader_message(server_message, server_pub, circuit, hospital, payload_sha256,
                                      signed_query_seed(server_message, hospital))
    helper = circuit.F.from_bytes(bytes.fromhex(keyholder_message_hex), circuit.verifier_len,
                            what=f"the key holder's verifier message for {hospital}")
    return circuit.decide(leader, helper)


def dispute(params: SessionParams, hospital: str, payload: bytes, statement: Mapping, seed,
            server_message: Mapping, keyholder_message_hex: str | None, server_pub) -> dict:
    """The refused hospital: who is at fault, from its own upload (``payload`` and signed seed ``statement``,
    whose hash its receipt acknowledges), its own mask ``seed`` (kept sealed beside the receipt: the bytes, or a
    function that opens them, called only when the server's message holds) and the two published messages (the
    server's signed verifier message; the key holder's, in its signed share statement, None where it refused on
    the commitment).

    Each verifier message is a deterministic function of the upload, the seed and the query seed the server
    signed, so the hospital recomputes both:

    * the server's signed message differs from the one recomputed from the payload alone: the **server**
      (provable to anyone given the payload; the seed is not opened);
    * else the two published messages give "valid", or the key holder's message differs from the recomputed
      one (or it refused on a commitment this seed meets): the **key holder**, whose share statement signed
      that message and refusal;
    * else both messages are true and the verdict is a failure: the **hospital**'s upload is invalid (as it is
      when the upload's own words or seed miss the commitment it signed).

    Returns ``{"at_fault": "server" | "keyholder" | "hospital", "server_message_true", "keyholder_message_true",
    "verdict", "seed_opened"}`` (``verdict``: what the published messages give; None: valid)."""
    circuit = Circuit(params)
    sha = hashlib.sha256(payload).hexdigest()
    qs, leader = verify_leader_message(server_message, server_pub, circuit, hospital, sha,
                                       signed_query_seed(server_message, hospital))
    out = {"server_message_true": None, "keyholder_message_true": None, "verdict": None, "seed_opened": False}
    commitment = UploadCommitment.from_dict(statement.get("validity"))
    try:
        own_leader = leader_prep(circuit, hospital, payload, statement.get("validity"), qs)
    except MalformedPayload:
        return {**out, "at_fault": "hospital", "verdict": "commitment"}
    out["server_message_true"] = bool(np.array_equal(np.asarray(own_leader), np.asarray(leader)))
    if not out["server_message_true"]:
        return {**out, "at_fault": "server"}
    seed = bytes(seed() if callable(seed) else seed)
    out["seed_opened"] = True
    try:
        circuit.check_commitment(None, commitment, leader=False, seed=seed)
    except MalformedPayload:
        return {**out, "at_fault": "hospital", "verdict": "commitment"}
    own_helper = circuit.query(circuit.helper_share(seed), commitment, hospital, qs, leader=False)
    if keyholder_message_hex is None:  # a commitment refusal, but the seed meets the commitment
        return {**out, "at_fault": "keyholder", "keyholder_message_true": False, "verdict": "commitment"}
    helper = circuit.F.from_bytes(bytes.fromhex(keyholder_message_hex), circuit.verifier_len,
                            what=f"the key holder's verifier message for {hospital}")
    out["verdict"] = circuit.decide(leader, helper)
    out["keyholder_message_true"] = bool(np.array_equal(np.asarray(own_helper), np.asarray(helper)))
    if out["verdict"] is None or not out["keyholder_message_true"]:
        return {**out, "at_fault": "keyholder"}
    return {**out, "at_fault": "hospital"}
