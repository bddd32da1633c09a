"""Before any decryption: verify every signed upload and form the sum here, not at the server.

The server is not trusted to add: it could hand over any ciphertext as "the
aggregate" (one hospital's upload plus a fix-up, or chunks built from the
public key). So the key holder fetches the accepted uploads one by one and
keeps a contribution only if

* the server-signed manifest lists it and is valid under this key holder's
  own parameters and threshold (every participant enrolled, distinct, and its
  upload statement signed by its enrolled Ed25519 key over this session and
  parameter digest);
* the bytes served hash to the hospital-signed ``payload_sha256``;
* the envelope is bound to the parameter digest of the keygen record and every
  chunk deserialises as a fresh ciphertext under the key holder's own context.

Only then are the chunks added, here, and only a sum of at least
``min_clients`` verified, distinct hospitals reaches the decryption. Nothing
the server computed is ever decrypted.

A payload that is signed by its hospital but not a valid ciphertext names
that hospital (its signature is on the bytes), so a veto by malformed input
is attributable without decrypting anything smaller than the whole cohort.
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Mapping

from secure_afl.cohort import ReleasePolicy, check_quorum
from secure_afl.exceptions import DecryptionRefused, InsufficientContributors, SecureAFLError
from secure_afl.parallel import PayloadRefused, sum_payloads
from secure_afl.params import SessionParams
from secure_afl.signing import verify_manifest

__all__ = ["ServerForgery", "ContributionRejected", "verify_manifest_for", "resum_signed_contributions",
           "fetch_signed", "default_fetchers"]


class ServerForgery(DecryptionRefused):
    """What the server presented is not what the hospitals signed: treat the server as compromised."""

    reason = "server_forgery"


class ContributionRejected(DecryptionRefused):
    """A hospital-signed payload is not a valid contribution; ``hospital`` names it."""

    reason = "contribution_rejected"

    def __init__(self, message: str, hospital: str):
        super().__init__(message)
        self.hospital = hospital


def verify_manifest_for(params: SessionParams, manifest: dict, server_pub, enrolled: Mapping,
                        policy: ReleasePolicy) -> dict:
    """The manifest under the key holder's own parameters and release policy (no aggregate hash: it is unused):
    :class:`InsufficientContributors` below the policy's quorum, naming it and how it was reached."""
    try:
        m = verify_manifest(manifest, server_pub, enrolled, 1, session_id=params.session_id,
                            params_digest=params.digest())
    except InsufficientContributors:
        raise
    except SecureAFLError as e:
        raise ServerForgery(f"the server-signed manifest does not hold under this key holder's parameters "
                            f"and enrolments: {e}") from e
    check_quorum(policy, len(m["participants"]))
    return m


def default_fetchers() -> int:
    """Downloads in flight while the summing processes work: at least 2, else one per core."""
    return max(2, os.cpu_count() or 1)


def fetch_signed(participants: list[dict], fetch: Callable[[str], bytes], fetchers: int) -> Iterator[tuple[str, bytes]]:
    """``(hospital, payload)`` in manifest order, each hashed against its signed ``payload_sha256``.

    ``fetchers`` threads download and hash ahead of the consumer (the socket
    reads and SHA-256 release the GIL, so they overlap with the summing
    processes); at most ``2 * fetchers`` payloads are held at once, so memory
    stays O(fetchers L). The first mismatch in manifest order raises :class:`ServerForgery`;
    the downloads still queued are cancelled.
    """

    def one(p: dict) -> tuple[str, bytes]:
        hospital = p["hospital"]
        payload = fetch(hospital)
        if hashlib.sha256(payload).hexdigest() != p["payload_sha256"]:
            raise ServerForgery(f"the server served a payload for {hospital} that {hospital} did not sign")
        return hospital, payload

    if fetchers < 1:
        raise ValueError("fetchers must be >= 1")
    if fetchers == 1:
        yield from map(one, participants)
        return
    pool = ThreadPoolExecutor(max_workers=fetchers, thread_name_prefix="kh-fetch")
    pending: deque = deque()
    todo = iter(participants)
    try:
        for p in todo:
            pending.append(pool.submit(one, p))
            if len(pending) >= 2 * fetchers:
                break
        while pending:
            yield pending.popleft().result()
            nxt = next(todo, None)  # after the consumer took one, so the window stays 2 x fetchers
            if nxt is not None:
                pending.append(pool.submit(one, nxt))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def resum_signed_contributions(params: SessionParams, backend, ctx, manifest: dict,
                               fetch: Callable[[str], bytes], *, workers: int | None = None,
                               fetchers: int | None = None) -> tuple[list, list[str]]:
    """Sum the uploads of a manifest already verified by :func:`verify_manifest_for`
    (distinct enrolled hospitals, at least ``min_clients``) -> (summed chunks, participants).

    ``fetch(hospital)`` returns the payload bytes the server stored for that
    hospital (it is called from ``fetchers`` threads at once, default
    :func:`default_fetchers`); each is hashed against its signed digest as it
    arrives (:func:`fetch_signed`), then checked and added by one of ``workers`` processes
    (:func:`secure_afl.parallel.sum_payloads`; default: the machine's cores),
    which get the public half of the key holder's own context, never the
    secret. Raises :class:`ServerForgery` or :class:`ContributionRejected`;
    on either nothing was decrypted.
    """
    participants = manifest["participants"]
    signed = fetch_signed(participants, fetch, default_fetchers() if fetchers is None else fetchers)
    try:
        partials = sum_payloads(params, signed, public_context=backend.scheme.serialize_public(ctx),
                                workers=workers, count=len(participants))
    except PayloadRefused as e:
        raise ContributionRejected(f"{e.label}'s signed upload is not a valid contribution under the key "
                                   f"holder's own parameters ({e.cause}); the session cannot be released with it",
                                   e.label) from e
    finally:
        signed.close()  # stops downloads still in flight when the sum ended early
    total = None
    for body, n in partials:
        if n:
            total = backend.scheme.add_chunks(total, backend.load_partial(ctx, body))
    return total, sorted(p["hospital"] for p in participants)
