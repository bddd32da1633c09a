"""split's work in worker processes: the server's verifier messages, the key holder's verdicts and mask sums.

Each upload's work is independent of the others' and holds the GIL (table lookups, small field operations),
so many uploads are spread over ``workers`` spawned processes (:func:`secure_afl.workers.map_chunks`) once
there are :data:`~secure_afl.split.sizes.PROCESS_MIN_UPLOADS` per worker to pay for starting them. The
results do not depend on how the uploads are split. The roles themselves are in :mod:`secure_afl.split.roles`.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..exceptions import MalformedPayload
from ..hazmat import fixedpoint, flp
from ..params import SessionParams
from ..workers import map_chunks
from . import roles, sizes
from .signed_messages import sign_verifier_message
from .proof import Circuit

__all__ = ["leader_messages", "keyholder_verdicts", "lane_masks"]


def _workers(n_items: int, workers: int) -> int:
    return workers if n_items >= sizes.PROCESS_MIN_UPLOADS * max(1, workers) else 1


def leader_messages(params: SessionParams, uploads, identity_key, *, workers: int = 1) -> dict:
    """Server: hospital -> its signed verifier message, for every ``(hospital, payload file, payload_sha256,
    statement, query seed)`` in ``uploads`` (the query seed the key holder sent for that upload).

    Each worker reads the payload file and checks it is the upload the key holder named. Only this process
    holds ``identity_key`` and signs."""
    items = [(h, str(path), sha, statement.get("validity"), bytes(qs)) for h, path, sha, statement, qs in uploads]
    messages = {h: msg for chunk in map_chunks(_leader_chunk, params.to_dict(), items,
                                               _workers(len(items), workers)) for h, msg in chunk}
    return {h: sign_verifier_message(params, h, sha, qs, flp.from_bytes(messages[h]), identity_key)
            for h, _, sha, _, qs in items}


def _leader_chunk(params_dict: dict, items: list) -> list:
    """One worker's part of :func:`leader_messages`: (hospital, unsigned message bytes) per upload."""
    circuit = Circuit(SessionParams.from_dict(params_dict))
    out = []
    for h, path, sha, validity, qs in items:
        with open(path, "rb") as f:
            payload = f.read()
        if hashlib.sha256(payload).hexdigest() != sha:
            raise MalformedPayload(f"the stored upload of {h} is not the one the manifest names")
        out.append((h, flp.to_bytes(roles.leader_prep(circuit, h, payload, validity, qs))))
    return out


def keyholder_verdicts(params: SessionParams, items, *, workers: int = 1,
                       messages: dict | None = None) -> tuple[dict, np.ndarray]:
    """Key holder: ``(hospital -> None or the check its upload failed, -sum m_k (mod p) over the accepted)``
    for ``items`` of ``(hospital, opened seed, validity commitment, query seed, the server's checked
    verifier message)`` (:func:`secure_afl.split.signed_messages.verify_leader_message`). Each verdict needs that
    upload's whole mask, whose lane part is summed as it is judged: no seed is expanded twice, and the sum
    over the accepted uploads is what the release's share starts from. The opened seeds go to this key
    holder's own worker processes over pipes, nowhere else.

    ``messages``, if given, receives for each refused upload this key holder's own verifier message (bytes),
    which it publishes beside the server's (:func:`secure_afl.split.signed_messages.refusal_evidence`)."""
    items = [(h, bytes(seed), validity, bytes(qs), flp.to_bytes(msg)) for h, seed, validity, qs, msg in items]
    total = np.zeros(fixedpoint.n_words(params.layout.length), dtype=np.uint64)
    refused: dict[str, str] = {}
    for partial, refused_here, own in map_chunks(_share_chunk, params.to_dict(), items,
                                                 _workers(len(items), workers)):
        total = flp.add(total, partial)
        refused.update(refused_here)
        if messages is not None:
            messages.update(own)
    return {h: refused.get(h) for h, *_ in items}, total


def _share_chunk(params_dict: dict, items: list) -> tuple[np.ndarray, dict, dict]:
    """One worker's part of :func:`keyholder_verdicts`: ``-sum m_k`` over its accepted uploads, its refusals,
    and its own verifier message for each refused one."""
    params = SessionParams.from_dict(params_dict)
    n = fixedpoint.n_words(params.layout.length)
    total = np.zeros(n, dtype=np.uint64)
    refused: dict[str, str] = {}
    messages: dict[str, bytes] = {}
    circuit = Circuit(params) if items else None
    for h, seed, validity, query_seed, message in items:
        mask = circuit.helper_share(seed)  # -m over the whole body: the verdict's share, the lanes first
        msg = flp.from_bytes(message, circuit.verifier_len, what=f"the server's verifier message for {h}")
        reason, own = roles.helper_verdict(circuit, h, seed, {"validity": validity}, query_seed, msg,
                                           share=mask, with_message=True)
        if reason is None:
            total = flp.add(total, mask[:n])
        else:
            refused[h] = reason
            if own is not None:
                messages[h] = flp.to_bytes(own)
    return total, refused, messages


def lane_masks(params: SessionParams, workers: int = 1):
    """``sum_masks`` for :func:`secure_afl.split.roles.keyholder_share` over ``workers`` processes."""
    def sum_masks(n: int, seeds) -> np.ndarray:
        seeds = list(seeds)
        total = np.zeros(n, dtype=np.uint64)
        for partial in map_chunks(_mask_chunk, params.to_dict(), seeds, _workers(len(seeds), workers)):
            total = flp.add(total, partial)
        return total
    return sum_masks


def _mask_chunk(params_dict: dict, seeds: list) -> np.ndarray:
    """One worker's part of :func:`lane_masks`."""
    return roles.lane_masks(fixedpoint.n_words(SessionParams.from_dict(params_dict).layout.length), seeds)
