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
from typing import Callable, Mapping

from secure_afl.exceptions import DecryptionRefused, InsufficientContributors, SecureAFLError
from secure_afl.parallel import PayloadRefused, sum_payloads
from secure_afl.params import SessionParams
from secure_afl.signing import verify_manifest

__all__ = ["ServerForgery", "ContributionRejected", "verify_manifest_for", "resum_signed_contributions"]


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
                        min_clients: int) -> dict:
    """The manifest under the key holder's own parameters and threshold (no aggregate hash: it is unused)."""
    try:
        return verify_manifest(manifest, server_pub, enrolled, min_clients, session_id=params.session_id,
                               params_digest=params.digest())
    except InsufficientContributors:
        raise
    except SecureAFLError as e:
        raise ServerForgery(f"the server-signed manifest does not hold under this key holder's parameters "
                            f"and enrolments: {e}") from e


def resum_signed_contributions(params: SessionParams, backend, ctx, manifest: dict,
                               fetch: Callable[[str], bytes], *, workers: int | None = None) -> tuple[list, list[str]]:
    """Sum the uploads of a manifest already verified by :func:`verify_manifest_for`
    (distinct enrolled hospitals, at least ``min_clients``) -> (summed chunks, participants).

    ``fetch(hospital)`` returns the payload bytes the server stored for that
    hospital; each is hashed against its signed digest here, as it arrives,
    then checked and added by one of ``workers`` processes
    (:func:`secure_afl.parallel.sum_payloads`; default: the machine's cores),
    which get the public half of the key holder's own context, never the
    secret. Raises :class:`ServerForgery` or :class:`ContributionRejected`;
    on either nothing was decrypted.
    """
    participants = manifest["participants"]

    def signed_payloads():
        for p in participants:
            hospital = p["hospital"]
            payload = fetch(hospital)
            if hashlib.sha256(payload).hexdigest() != p["payload_sha256"]:
                raise ServerForgery(f"the server served a payload for {hospital} that {hospital} did not sign")
            yield hospital, payload

    try:
        partials = sum_payloads(params, signed_payloads(), public_context=backend.scheme.serialize_public(ctx),
                                workers=workers, count=len(participants))
    except PayloadRefused as e:
        raise ContributionRejected(f"{e.label}'s signed upload is not a valid contribution under the key "
                                   f"holder's own parameters ({e.cause}); the session cannot be released with it",
                                   e.label) from e
    total = None
    for body, n in partials:
        if n:
            total = backend.scheme.add_chunks(total, backend.load_partial(ctx, body))
    return total, sorted(p["hospital"] for p in participants)
