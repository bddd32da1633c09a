"""One exception class per kind of failure (pyca/cryptography style).

Everything raised on purpose by secure-afl derives from :class:`SecureAFLError`
so a caller can catch the whole family; value and type errors on public
parameters are additionally ``ValueError`` / ``TypeError`` so ordinary Python
code keeps working.

Verification failures of cryptographic material (bad signature, bad AEAD tag,
failed decryption) collapse into :class:`InvalidContribution` /
:class:`InvalidSignature` without detail, so a peer cannot learn which check
failed. Format and policy refusals (wrong session, duplicate, bounds) carry a
machine-readable ``reason`` because the sender already knows its own payload.
"""

from __future__ import annotations

__all__ = [
    "SecureAFLError",
    "InvalidParameterError",
    "InvalidInputError",
    "LayoutMismatch",
    "ParameterMismatch",
    "WrongSession",
    "BoundsExceeded",
    "MalformedPayload",
    "InvalidContribution",
    "InvalidSignature",
    "DuplicateContribution",
    "ReplayedContribution",
    "RoundAlreadyClosed",
    "StageError",
    "InsufficientShares",
    "InsufficientContributors",
    "OverlappingUnmaskRequest",
    "SecretKeyNotAllowed",
    "PolicyViolation",
    "SanityCheckFailed",
    "DecryptionRefused",
    "AuditChainBroken",
    "InvalidKey",
]


class SecureAFLError(Exception):
    """Base class; ``reason`` is a short machine-readable code."""

    reason = "error"

    def __init__(self, message: str = "", *, reason: str | None = None):
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class InvalidParameterError(SecureAFLError, ValueError, TypeError):
    """A public parameter has the wrong type or value (scikit-learn wording)."""

    reason = "invalid_parameter"


class InvalidInputError(SecureAFLError, ValueError):
    """Data handed to the library (embeddings, labels, vectors) is unusable."""

    reason = "invalid_input"


class LayoutMismatch(SecureAFLError, ValueError):
    """A packed vector was produced for another (d, C, version) layout."""

    reason = "layout_mismatch"


class ParameterMismatch(SecureAFLError, ValueError):
    """A payload was produced under other protection parameters."""

    reason = "parameter_mismatch"


class WrongSession(SecureAFLError, ValueError):
    """A payload or message belongs to another session."""

    reason = "wrong_session"


class BoundsExceeded(SecureAFLError, ValueError):
    """Statistics leave the declared bounds; protecting them could wrap."""

    reason = "bounds_exceeded"


class MalformedPayload(SecureAFLError, ValueError):
    """Bytes that do not parse as a payload of this format (or are truncated)."""

    reason = "malformed"


class InvalidContribution(SecureAFLError):
    """A contribution failed a cryptographic check. Deliberately detail-free."""

    reason = "invalid_contribution"


class InvalidSignature(SecureAFLError):
    """A signature did not verify. Deliberately detail-free."""

    reason = "bad_signature"


class DuplicateContribution(SecureAFLError):
    """A second contribution from a party that already contributed."""

    reason = "duplicate"


class ReplayedContribution(SecureAFLError):
    """A contribution (or nonce) that was already seen."""

    reason = "replay"


class RoundAlreadyClosed(SecureAFLError):
    """The round/accumulator was finalised; it accepts nothing more."""

    reason = "round_closed"


class StageError(SecureAFLError):
    """A protocol message arrived in the wrong stage."""

    reason = "wrong_stage"


class InsufficientShares(SecureAFLError):
    """Fewer than the threshold of Shamir shares: nothing can be revealed."""

    reason = "insufficient_shares"


class InsufficientContributors(SecureAFLError):
    """Fewer than min_clients contributed: the aggregate is not released."""

    reason = "insufficient_contributors"


class OverlappingUnmaskRequest(SecureAFLError):
    """An unmask request asks for both shares of the same client."""

    reason = "overlapping_unmask_request"


class SecretKeyNotAllowed(SecureAFLError):
    """A context holding a secret key was handed to a party that must not have one."""

    reason = "secret_key_context"


class PolicyViolation(SecureAFLError):
    """A release would break the disclosure policy (cohort, class minimum, overlap)."""

    reason = "policy_violation"


class SanityCheckFailed(SecureAFLError):
    """A revealed aggregate is not a plausible sum of statistics."""

    reason = "sanity_check_failed"


class DecryptionRefused(SecureAFLError):
    """The key holder refuses to decrypt (not an aggregate backed by a valid manifest)."""

    reason = "decryption_refused"


class AuditChainBroken(SecureAFLError):
    """The audit log's hash chain or a receipt does not verify."""

    reason = "audit_chain_broken"

    def __init__(self, message: str = "", *, index: int | None = None, reason: str | None = None):
        super().__init__(message, reason=reason)
        self.index = index


class InvalidKey(SecureAFLError):
    """Key material is unusable here: a wrong passphrase or key file, a sealed key
    for another session, or a public context where a secret one is needed.
    Deliberately detail-free about which."""

    reason = "invalid_key"
