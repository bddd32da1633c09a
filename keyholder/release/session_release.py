"""One key holder's release of one session: the policy, the trust set and the key it is bound to, fixed before
the release has any effect.

:func:`open_release` reads them in the order that keeps a refusal free of effects: the operator's signed
definition (the release policy: roster, quorum, refusal limit), then this PKI's pins (the server's identity, the
roster's enrolled hospital keys), and only then the sealed key (each opening runs the passphrase KDF). Nothing
is written, fetched or sent while it runs, so a missing definition, an unpinned server or a mistyped passphrase
leaves the session as it was. Each release path (``he``, ``split_share``, ``reveal``) reads its inputs from the
:class:`SessionRelease` it is handed and from nothing the server says.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from secure_afl import pki
from secure_afl.cohort import ReleasePolicy, release_policy
from secure_afl.exceptions import DecryptionRefused, SecureAFLError
from secure_afl.params import KEYED_BACKENDS, SessionParams
from secure_afl.session.signed import load_signed, signed_path

from ..custody import KeyCustody

__all__ = ["SessionRelease", "open_release", "signed_policy", "trust_set"]


@dataclass(frozen=True)
class SessionRelease:
    """What one release of ``session_id`` is bound to; read by every step of its path, never changed by one."""

    session_id: str
    #: the keygen record (ckks, bfv, split) or the signed definition's parameters (plain, secagg)
    params: SessionParams
    #: the signed release policy (roster, quorum, refusal limit) with this caller's ``min_clients`` floor
    policy: ReleasePolicy
    #: the server's pinned identity: the manifest, the masked sum and the audit close must carry its signature
    server_identity: object
    #: hospital -> enrolled identity key, for the signed roster only (and the caller's expected hospitals)
    enrolled: Mapping[str, object]
    #: this key holder's signing key (the split share statement)
    identity_key: object
    #: where this key holder's release ledger, privacy ledger and evidence live
    keys_dir: Path
    #: the opened key: the HE secret context (ckks, bfv) or the seed key (split); None for plain and secagg
    secret: bytes | None = None
    #: the opened tag key (ckks, bfv): the aggregate tag is checked with it after the one decryption
    tag_key: bytes | None = None

    @property
    def release_ledger(self) -> Path:
        """One decryption or share per key, blocked keys, the cohorts released (:class:`ReleaseLedger`)."""
        return self.keys_dir / "releases.sqlite3"

    @property
    def privacy_ledger(self) -> Path:
        """Every release's privacy loss, composed across sessions (:class:`secure_afl.dp.ledger.PrivacyLedger`)."""
        return self.keys_dir / "privacy.sqlite3"


def signed_policy(pki_dir, session_id: str, *, min_clients: int = 0, min_class_count: int = 0) -> ReleasePolicy:
    """The signed session's release policy with this caller's floors. Without the operator's signed definition
    in this key holder's PKI nothing is released (:class:`DecryptionRefused`): a floor the caller passes alone
    would know neither the roster, nor the colluder bound, nor the quorum."""
    if not signed_path(pki_dir, session_id).exists():
        raise DecryptionRefused(
            f"not releasing session {session_id}: its signed definition is not in {pki_dir} "
            "(the release policy comes from it alone; copy the operator's bundle first)")
    return release_policy(load_signed(pki_dir, session_id), min_clients=min_clients, min_class_count=min_class_count)


def trust_set(pki_dir, policy: ReleasePolicy, expected_hospitals=None) -> tuple[object, dict]:
    """``(server identity, hospital -> enrolled key)`` from this key holder's PKI, for ``policy``'s roster."""
    try:
        server_pub = pki.pinned_identity(pki_dir, "server")
    except SecureAFLError as e:
        raise DecryptionRefused(f"not decrypting: no server identity to check the manifest against ({e})") from e
    enrolled = pki.enrolled_keys(pki.load_enrolments(pki_dir, role="hospital"))
    # the session's signed roster, not every hospital the CA issued: an upload signed by a spare or
    # withdrawn identity counts for nothing, whatever the server's manifest says
    roster = set(policy.roster)
    enrolled = {k: v for k, v in enrolled.items() if k in roster}
    if expected_hospitals is not None:
        enrolled = {k: v for k, v in enrolled.items() if k in set(expected_hospitals)}
    return server_pub, enrolled


def open_release(custody: KeyCustody, session_id: str, *, min_clients: int, min_class_count: int = 0,
                 expected_hospitals=None, params: SessionParams | None = None, unseal: bool = True,
                 secret: bytes | None = None) -> SessionRelease:
    """The release of ``session_id`` by the key holder whose keys ``custody`` holds, before any effect.

    ``params``: the session's parameters where they come from the signed definition (plain, secagg); the
    keygen record otherwise. ``unseal``: open the sealed key (ckks and bfv: with the tag key); False for a
    step that needs none (split's release from the masked sum). ``secret``: the key, already opened by the
    caller (a judge that opened it while the session was open).
    """
    # the policy first: without the signed definition nothing is released, and no key needs opening
    policy = signed_policy(custody.pki_dir, session_id, min_clients=min_clients, min_class_count=min_class_count)
    # whom to believe, from this PKI alone, before anything the server sends is read
    server_pub, enrolled = trust_set(custody.pki_dir, policy, expected_hospitals)
    if params is None:
        params = custody.params(session_id)  # the keygen record, never the server's word
    tag_key = None
    if unseal and params.backend in KEYED_BACKENDS:
        # last, and before anything changes state: a mistyped passphrase leaves the session as it was
        secret = custody.secret_context(session_id) if secret is None else secret
        if params.backend != "split":
            tag_key = custody.tag_secret(session_id)
    return SessionRelease(session_id=session_id, params=params, policy=policy, server_identity=server_pub,
                          enrolled=enrolled, identity_key=custody.party.identity_key(), keys_dir=custody.keys_dir,
                          secret=secret if unseal else None, tag_key=tag_key)
