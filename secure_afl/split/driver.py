"""In-memory driver of every split role: hospitals, server (leader and collector) and key holder, with no
transport, store or ledger between them. The tests and the benchmarks run the protocol through it; the real
parties (server/split_round.py, keyholder/) call the same roles around their transport and storage."""

from __future__ import annotations
import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from ..cohort import ReleasePolicy, cohort_after_refusals, default_colluders, quorum
from ..envelope import seal
from ..params import SessionParams
from . import roles
from .keys import SplitKeyPair
from .signed_messages import query_key, query_seed, refusal_evidence, sign_masked_sum, sign_share, signed_query_seed, \
    verify_leader_message, verify_masked_sum, verify_seed_statement, verify_share, verify_share_statement
from .proof import Circuit
from .statements import Unlucky
from ..dp.noise import noise_share
from .sizes import RETRIES, gram_enabled, noise_beside

__all__ = ["SplitRun", "run_split", "default_policy"]


@dataclass
class SplitRun:
    """What one in-memory run produced: the released float64 sum (None if nothing was released), each
    upload's verdict (None: valid, else the failed check), the messages on the wire and the seconds per role."""

    vector: np.ndarray | None
    verdicts: dict
    uploads: dict = field(default_factory=dict)         # hospital -> (payload, signed seed statement)
    server_messages: dict = field(default_factory=dict)  # hospital -> the server's signed verifier message
    share: tuple | None = None                          # (share bytes, the key holder's signed statement)
    timings: dict = field(default_factory=dict)
    server_pub: object = None                           # the server's and the key holder's identities
    keyholder_pub: object = None
    masked_sum: tuple | None = None                     # (sealed masked sum of the cohort, the server's statement)


def _shard_all(circuit: Circuit, keys: SplitKeyPair, vectors: Mapping, identities: Mapping, randbytes) -> dict:
    """Hospitals: each one's ``(payload, seed statement)``, a fresh draw per unlucky try."""
    uploads = {}
    for h, v in vectors.items():
        # under DP with the Gram statement the vector is the statistics before the noise, and the hospital's
        # share is drawn here, as its backend draws it (secure_afl.backends.split)
        noise = noise_share(circuit.params) if noise_beside(circuit.params) else None
        for _ in range(RETRIES):
            try:
                uploads[h] = roles.shard(circuit, v, hospital=h, public_context=keys.public_context,
                                         identity_key=identities[h], rand=randbytes(circuit.rand_size),
                                         noise=noise)
                break
            except Unlucky:
                continue
        else:
            raise Unlucky()
    return uploads


def _server_upload(circuit: Circuit, uploads: Mapping, enrolled: Mapping) -> tuple[dict, bytes]:
    """Server, at upload: each statement is its hospital's and its commitment is of the payload; the masked
    sum. -> (hospital -> payload hash, the sealed masked sum)."""
    params = circuit.params
    F = circuit.F
    total = F.zeros(circuit.main_len)
    shas = {}
    for h, (payload, st) in uploads.items():
        shas[h] = hashlib.sha256(payload).hexdigest()
        verify_seed_statement(st, enrolled[h], params, h, shas[h])
        roles.check_upload(circuit, payload, st)
        total = F.add(total, circuit.upload_share(payload)[:circuit.main_len])
    return shas, seal(params, "aggregate", F.to_bytes(total), contributors=len(uploads))


def _judge(circuit: Circuit, keys: SplitKeyPair, uploads: Mapping, shas: Mapping, enrolled: Mapping, messages,
           seeds: Mapping, server_pub) -> tuple[dict, dict]:
    """Key holder: the server's message checked, the seed opened, the verdict. -> (verdicts, evidence)."""
    statements = {h: st for h, (_, st) in uploads.items()}
    verdicts, own = {}, {}
    for h in uploads:
        _, leader = verify_leader_message(messages[h], server_pub, circuit, h, shas[h], seeds[h])
        seed = roles.open_statement_seed(circuit.params, keys.secret_context, statements, enrolled, h, shas[h])
        verdicts[h], own[h] = roles.helper_verdict(circuit, h, seed, statements[h], seeds[h], leader,
                                                   with_message=True)
    evidence = {h: refusal_evidence(v, None if own[h] is None else circuit.F.to_bytes(own[h]))
                for h, v in verdicts.items() if v is not None}
    return verdicts, evidence


def default_policy(params: SessionParams, hospitals: Sequence[str], *, min_clients: int = 1) -> ReleasePolicy:
    """The release policy a signed session of ``hospitals`` gets with every default (``session sign``): the
    default colluder bound (:func:`secure_afl.cohort.default_colluders`), ``max_refusals`` = that bound, and
    the session's own ``max_share`` and ``gram_proof``."""
    n = len(hospitals)
    c = default_colluders(n, min_clients)
    return ReleasePolicy(session_id=params.session_id, backend=params.backend, roster=tuple(hospitals),
                         min_clients=min_clients, colluders=c, quorum=quorum(n, c, min_clients), max_refusals=c,
                         min_class_count=1, deadline=None,
                         max_share=float(params.backend_params.get("max_share", 1.0)),
                         gram_proof=gram_enabled(params))


def run_split(params: SessionParams, keys: SplitKeyPair, vectors: Mapping[str, np.ndarray] | Sequence, *,
              uploads: Mapping[str, tuple] | None = None, identities: Mapping | None = None,
              server_key=None, keyholder_key=None, randbytes: Callable[[int], bytes] = os.urandom,
              tamper: Callable | None = None, policy: ReleasePolicy | None = None) -> SplitRun:
    """Run one split round in memory.

    ``params``: bound to ``keys`` (:func:`secure_afl.split.keys.bind_public_context`). ``vectors``: hospital ->
    packed float64 vector (a sequence: hospitals ``h1..hK``). ``uploads``: hospital -> ``(payload, seed
    statement)`` already formed (a cheater's, :func:`secure_afl.split.roles.seal_upload`), taken as they are
    beside the honest ones. ``identities``: hospital -> Ed25519 key (fresh ones otherwise). ``randbytes`` draws
    every hospital's randomness (the roles take it as bytes). ``tamper(hospital, server_message) -> message``
    lets a test stand in for a server that alters its verifier messages. ``policy``: the session's release
    policy (:func:`secure_afl.cohort.release_policy` of its signed definition; :func:`default_policy` over the
    run's hospitals otherwise), applied to the verdicts by the key holder and the server as the parties apply
    it: refusals past ``max_refusals`` or a cohort below the quorum raise
    :class:`~secure_afl.exceptions.InsufficientContributors` and nothing is released.
    """
    if not isinstance(vectors, Mapping):
        vectors = {f"h{k + 1}": v for k, v in enumerate(vectors)}
    identities = dict(identities or {})
    for h in list(vectors) + list(uploads or {}):
        identities.setdefault(h, Ed25519PrivateKey.generate())
    server_key = server_key or Ed25519PrivateKey.generate()
    keyholder_key = keyholder_key or Ed25519PrivateKey.generate()
    enrolled = {h: k.public_key() for h, k in identities.items()}
    circuit = Circuit(params)
    clock, timings = time.perf_counter(), {}

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name], clock = now - clock, now

    uploads = {**(uploads or {}), **_shard_all(circuit, keys, vectors, identities, randbytes)}
    lap("shard")
    shas, aggregate = _server_upload(circuit, uploads, enrolled)
    lap("server_upload")
    # the key holder's query seeds -> the server's signed verifier messages (formed at them)
    qkey = query_key(keys.secret_context)
    seeds = {h: query_seed(qkey, params, h, shas[h], uploads[h][1]["validity"]) for h in uploads}
    messages = {h: roles.leader_message(circuit, h, payload, st, server_key, seeds[h])
                for h, (payload, st) in uploads.items()}
    if tamper is not None:
        messages = {h: tamper(h, msg) for h, msg in messages.items()}
    lap("server_prep")
    verdicts, evidence = _judge(circuit, keys, uploads, shas, enrolled, messages, seeds, server_key.public_key())
    refused = {h: v for h, v in verdicts.items() if v is not None}
    manifest = {"participants": [{"hospital": h, "payload_sha256": shas[h]} for h in uploads],
                "aggregate_sha256": hashlib.sha256(aggregate).hexdigest()}
    policy = default_policy(params, list(uploads)) if policy is None else policy
    # the key holder: no share for a cohort the policy does not allow
    cohort_after_refusals(policy, list(uploads), refused)
    share = roles.keyholder_share(params, keys.secret_context, manifest, {h: st for h, (_, st) in uploads.items()},
                                  enrolled, refused=refused, query_seeds=seeds)
    body, share_st = sign_share(keyholder_key, params, manifest, share, refused, evidence)
    lap("keyholder")
    # commit before reveal. Server: the share statement (no share yet) for exactly this manifest and the policy,
    # then the signed masked sum of its cohort (the refused uploads' masked words taken out), as the real server
    # forms it (one function)
    verify_share_statement(params, manifest, share_st, keyholder_key.public_key())
    cohort_after_refusals(policy, list(uploads), refused)
    # (under DP with the Gram statement, each cohort upload's noise words permuted at the query seed the server
    # signed its message at)
    masked = roles.cohort_masked_sum(params, aggregate, [uploads[h][0] for h in refused], len(share_st["cohort"]),
                                     [(uploads[h][0], signed_query_seed(messages[h], h)) for h in share_st["cohort"]])
    signed = sign_masked_sum(server_key, params, share_st, masked)
    # key holder: the server's sum for its own statement, kept; only then the share, which the server checks
    verify_masked_sum(params, share_st, masked, signed, server_key.public_key())
    verify_share(params, manifest, body, share_st, keyholder_key.public_key())
    # decoded and checked against the share only: the signed policy's checks on the released statistics (share
    # cap, the Gram's definiteness) belong to the release that solves W (secure_afl.split_release.form_release)
    vector = roles.collect(params, masked, share)
    lap("collect")
    return SplitRun(vector, verdicts, uploads, messages, (body, share_st), timings, server_key.public_key(),
                    keyholder_key.public_key(), (masked, signed))
