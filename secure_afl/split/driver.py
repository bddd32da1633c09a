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

from ..envelope import seal
from ..hazmat import fixedpoint, flp
from ..params import SessionParams
from . import roles
from .keys import SplitKeyPair
from .signed_messages import query_key, query_seed, refusal_evidence, sign_share, verify_leader_message, \
    verify_seed_statement, verify_share
from .proof import Circuit
from .statements import Unlucky
from .sizes import RETRIES

__all__ = ["SplitRun", "run_split"]


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


def _shard_all(circuit: Circuit, keys: SplitKeyPair, vectors: Mapping, identities: Mapping, randbytes) -> dict:
    """Hospitals: each one's ``(payload, seed statement)``, a fresh draw per unlucky try."""
    uploads = {}
    for h, v in vectors.items():
        for _ in range(RETRIES):
            try:
                uploads[h] = roles.shard(circuit, v, hospital=h, public_context=keys.public_context,
                                         identity_key=identities[h], rand=randbytes(circuit.rand_size))
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
    total = np.zeros(fixedpoint.n_words(params.layout.length), dtype=np.uint64)
    shas = {}
    for h, (payload, st) in uploads.items():
        shas[h] = hashlib.sha256(payload).hexdigest()
        verify_seed_statement(st, enrolled[h], params, h, shas[h])
        roles.check_upload(circuit, payload, st)
        total = flp.add(total, circuit.upload_share(payload)[:circuit.main_len])
    return shas, seal(params, "aggregate", flp.to_bytes(total), contributors=len(uploads))


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
    evidence = {h: refusal_evidence(v, None if own[h] is None else flp.to_bytes(own[h]))
                for h, v in verdicts.items() if v is not None}
    return verdicts, evidence


def run_split(params: SessionParams, keys: SplitKeyPair, vectors: Mapping[str, np.ndarray] | Sequence, *,
              uploads: Mapping[str, tuple] | None = None, identities: Mapping | None = None,
              server_key=None, keyholder_key=None, randbytes: Callable[[int], bytes] = os.urandom,
              tamper: Callable | None = None) -> SplitRun:
    """Run one split round in memory.

    ``params``: bound to ``keys`` (:func:`secure_afl.split.keys.bind_public_context`). ``vectors``: hospital ->
    packed float64 vector (a sequence: hospitals ``h1..hK``). ``uploads``: hospital -> ``(payload, seed
    statement)`` already formed (a cheater's, :func:`secure_afl.split.roles.seal_upload`), taken as they are
    beside the honest ones. ``identities``: hospital -> Ed25519 key (fresh ones otherwise). ``randbytes`` draws
    every hospital's randomness (the roles take it as bytes). ``tamper(hospital, server_message) -> message``
    lets a test stand in for a server that alters its verifier messages.
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
    share = roles.keyholder_share(params, keys.secret_context, manifest, {h: st for h, (_, st) in uploads.items()},
                                  enrolled, refused=refused)
    body, share_st = sign_share(keyholder_key, params, manifest, share, refused, evidence)
    lap("keyholder")
    # collector: the share for exactly this manifest; the refused uploads' masked words taken out
    words = verify_share(params, manifest, body, share_st, keyholder_key.public_key())
    out = [circuit.upload_share(uploads[h][0])[:circuit.main_len] for h in refused]
    vector = roles.collect(params, aggregate, words, subtract=out) if len(refused) < len(uploads) else None
    lap("collect")
    return SplitRun(vector, verdicts, uploads, messages, (body, share_st), timings, server_key.public_key(),
                    keyholder_key.public_key())
