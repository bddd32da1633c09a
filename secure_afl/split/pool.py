"""split's work in worker processes: the server's verifier messages, the key holder's verdicts and mask sums.

Each upload's work is independent of the others' and holds the GIL (table lookups, small field operations),
so the uploads are spread over the processes of a :class:`secure_afl.workers.WorkerPool` the verifier keeps
for its session (``pool=None``: this process). The results do not depend on how the uploads are split. The
roles themselves are in :mod:`secure_afl.split.roles`.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from ..exceptions import MalformedPayload
from ..hazmat import field128_kernels, ternary
from ..params import SessionParams
from ..workers import WorkerPool
from . import roles, sizes
from .noise_twist import noise_twist
from .signed_messages import sign_verifier_message
from .proof import Circuit

__all__ = ["verifier_pool", "leader_messages", "keyholder_verdicts", "lane_masks"]

_circuits: dict[bytes, Circuit] = {}


#: CPU seconds of a verifier's own process on uploads after which it starts its workers: about what one worker's
#: start costs (a spawned interpreter, the imports and the compiled kernels: 1.1 s of CPU, 1.7 s to be up for
#: two, on the 2-core VM). At d = 512, C = 100 that is the sixth upload, where the upload count alone waited
#: for the 32nd: a burst of uploads then met a verifier still working on one core in its own process.
PROCESS_START_S = 1.0


def verifier_pool() -> WorkerPool:
    """A verifier's pool for one session: :data:`~secure_afl.split.sizes.VERIFIER_WORKERS` processes (at most
    the cores, at least one), started once the session has
    :data:`~secure_afl.split.sizes.PROCESS_MIN_UPLOADS` uploads or its uploads have cost the verifier's own
    process :data:`PROCESS_START_S` of CPU, each with the compiled projection loaded.

    The server's pool takes every core too, not all but one: the key holder waits on the server's verifier
    messages before it judges, so a core the server leaves to its own process (whose upload intake is a few
    per cent of an upload's verification) idled while the uploads were judged, and the server's half of
    judging (0.175 of 0.29 s per upload at d = 512, C = 100) ran on one core."""
    return WorkerPool(max(1, min(sizes.VERIFIER_WORKERS, os.cpu_count() or 1)),
                      start_after=sizes.PROCESS_MIN_UPLOADS, start_after_s=PROCESS_START_S, warm=_warm)


def _warm() -> None:
    """A worker's compiled kernels, loaded before its first batch: the projection's and Field128's."""
    ternary.warm()
    field128_kernels.load()


def _map(pool: WorkerPool | None, fn, common, items) -> list:
    return [fn(common, items)] if pool is None else pool.map_chunks(fn, common, items)


def _circuit(params_dict: dict) -> Circuit:
    """This process's circuit for the session (a worker serves many batches of one session)."""
    params = SessionParams.from_dict(params_dict)
    key = params.digest()
    circuit = _circuits.get(key)
    if circuit is None:  # the local reference: a request thread beside this one may replace the entry
        circuit = Circuit(params)
        _circuits.clear()
        _circuits[key] = circuit
    return circuit


def leader_messages(params: SessionParams, uploads, identity_key, *, pool: WorkerPool | None = None) -> dict:
    """Server: hospital -> its signed verifier message, for every ``(hospital, payload file, payload_sha256,
    statement, query seed)`` in ``uploads`` (the query seed the key holder sent for that upload).

    Each worker reads the payload file and checks it is the upload the key holder named. Only this process
    holds ``identity_key`` and signs."""
    items = [(h, str(path), sha, statement.get("validity"), bytes(qs)) for h, path, sha, statement, qs in uploads]
    messages = {h: msg for chunk in _map(pool, _leader_chunk, params.to_dict(), items) for h, msg in chunk}
    F = sizes.field_of(params)
    return {h: sign_verifier_message(params, h, sha, qs, F.from_bytes(messages[h]), identity_key)
            for h, _, sha, _, qs in items}


def _leader_chunk(params_dict: dict, items: list) -> list:
    """One worker's part of :func:`leader_messages`: (hospital, unsigned message bytes) per upload."""
    circuit = _circuit(params_dict)
    out = []
    for h, path, sha, validity, qs in items:
        with open(path, "rb") as f:
            payload = f.read()
        if hashlib.sha256(payload).hexdigest() != sha:
            raise MalformedPayload(f"the stored upload of {h} is not the one the manifest names")
        out.append((h, circuit.F.to_bytes(roles.leader_prep(circuit, h, payload, validity, qs, accepted=True))))
    return out


def keyholder_verdicts(params: SessionParams, items, *, pool: WorkerPool | None = None,
                       messages: dict | None = None) -> tuple[dict, np.ndarray]:
    """Key holder: ``(hospital -> None or the check its upload failed, -sum m_k (mod p) over the accepted)``
    for ``items`` of ``(hospital, opened seed, validity commitment, query seed, the server's checked
    verifier message)`` (:func:`secure_afl.split.signed_messages.verify_leader_message`). Each verdict needs that
    upload's whole mask, whose lane part is summed as it is judged: no seed is expanded twice, and the sum
    over the accepted uploads is what the release's share starts from. The opened seeds go to this key
    holder's own worker processes over pipes, nowhere else.

    ``messages``, if given, receives for each refused upload this key holder's own verifier message (bytes),
    which it publishes beside the server's (:func:`secure_afl.split.signed_messages.refusal_evidence`)."""
    F = sizes.field_of(params)
    items = [(h, bytes(seed), validity, bytes(qs), F.to_bytes(msg)) for h, seed, validity, qs, msg in items]
    total = F.zeros(sizes.main_words(params))
    refused: dict[str, str] = {}
    for partial, refused_here, own in _map(pool, _share_chunk, params.to_dict(), items):
        total = F.add(total, partial)
        refused.update(refused_here)
        if messages is not None:
            messages.update(own)
    return {h: refused.get(h) for h, *_ in items}, total


def _share_chunk(params_dict: dict, items: list) -> tuple[np.ndarray, dict, dict]:
    """One worker's part of :func:`keyholder_verdicts`: ``-sum m_k`` over its accepted uploads, its refusals,
    and its own verifier message for each refused one."""
    circuit = _circuit(params_dict)
    n = circuit.main_len
    total = circuit.F.zeros(n)
    refused: dict[str, str] = {}
    messages: dict[str, bytes] = {}
    for h, seed, validity, query_seed, message in items:
        mask = circuit.helper_share(seed)  # -m over the whole body: the verdict's share, the lanes first
        msg = circuit.F.from_bytes(message, circuit.verifier_len, what=f"the server's verifier message for {h}")
        reason, own = roles.helper_verdict(circuit, h, seed, {"validity": validity}, query_seed, msg,
                                           share=mask, with_message=True)
        if reason is None:
            total = circuit.F.add(total, mask[:n])
            twist = noise_twist(circuit, mask, query_seed)  # the key holder's part of lanes - z + pi(z)
            if twist is not None:
                total = circuit.F.add(total, twist)
        else:
            refused[h] = reason
            if own is not None:
                messages[h] = circuit.F.to_bytes(own)
    return total, refused, messages


def lane_masks(params: SessionParams, pool: WorkerPool | None = None):
    """``sum_masks`` for :func:`secure_afl.split.roles.keyholder_share` over ``pool``'s processes."""
    def sum_masks(n: int, seeds) -> np.ndarray:
        seeds = list(seeds)
        F = sizes.field_of(params)
        total = F.zeros(n)
        for partial in _map(pool, _mask_chunk, params.to_dict(), seeds):
            total = F.add(total, partial)
        return total
    return sum_masks


def _mask_chunk(params_dict: dict, seeds: list) -> np.ndarray:
    """One worker's part of :func:`lane_masks`."""
    params = SessionParams.from_dict(params_dict)
    return roles.lane_masks(sizes.main_words(params), seeds, sizes.field_of(params))
