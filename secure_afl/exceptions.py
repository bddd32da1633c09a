"""One exception class per refusal reason: the single error registry.

Everything raised on purpose by secure-afl derives from :class:`SecureAFLError`
so a caller can catch the whole family; value and type errors on public
parameters are additionally ``ValueError`` / ``TypeError`` so ordinary Python
code keeps working.

Each class carries its machine-readable ``reason``, the HTTP status the server
answers with and the exit code the command line ends with. The server's error
handler, the client transport (reason -> class) and the CLI all read these
attributes through :func:`error_class`, :func:`http_status` and
:func:`exit_code`; there is no other table, so a reason the server sends is
always turned back into the class the client catches.

Verification failures of cryptographic material (bad signature, bad AEAD tag,
failed decryption) collapse into :class:`InvalidContribution` /
:class:`InvalidSignature` without detail, so a peer cannot learn which check
failed. Format and policy refusals (wrong session, duplicate, bounds) carry a
reason because the sender already knows its own payload.

Exit codes of ``secure-afl`` (also in threat_model/OPERATIONS.md):

====  =====================================================================
0     success
1     unexpected internal error (a bug: the traceback is printed)
2     usage error (bad command line)
3     bad input: a file, parameter or statistics that do not fit the session,
      or an optional extra the command needs is not installed
4     refused by the session: closed, duplicate, wrong stage, unknown
      session, too few contributors, release policy
5     the server cannot be reached
6     keys and identities: wrong passphrase, unusable key file, bad
      signature, party not enrolled or not allowed
7     a security check failed: invalid contribution, implausible
      aggregate, decryption refused, broken audit chain
====  =====================================================================
"""

from __future__ import annotations

__all__ = [
    "SecureAFLError",
    "InvalidParameterError",
    "InvalidInputError",
    "MissingExtra",
    "AwaitingPublication",
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
    "InconsistentDealer",
    "InsufficientContributors",
    "OverlappingUnmaskRequest",
    "SecretKeyNotAllowed",
    "PolicyViolation",
    "SanityCheckFailed",
    "DecryptionRefused",
    "AuditChainBroken",
    "InvalidKey",
    "Unauthenticated",
    "UnknownParty",
    "Forbidden",
    "NotFound",
    "DeadlinePassed",
    "TooLarge",
    "RequestTimeout",
    "ServerBusy",
    "StateInUse",
    "InternalError",
    "ExtractorMismatch",
    "InsecureFileMode",
    "WeakPassphrase",
    "MissingEnrolment",
    "UnreadableRecord",
    "ServerUnreachable",
    "UntrustedServer",
    "ServiceError",
    "EXIT_OK",
    "EXIT_INTERNAL",
    "EXIT_USAGE",
    "EXIT_INPUT",
    "EXIT_REFUSED",
    "EXIT_UNREACHABLE",
    "EXIT_KEYS",
    "EXIT_SECURITY",
    "StaleRound",
    "error_class",
    "registered_reasons",
    "http_status",
    "exit_code",
]

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_INPUT = 3
EXIT_REFUSED = 4
EXIT_UNREACHABLE = 5
EXIT_KEYS = 6
EXIT_SECURITY = 7

_REGISTRY: dict[str, type] = {}


class SecureAFLError(Exception):
    """Base class; ``reason`` is a short machine-readable code.

    A subclass that defines its own ``reason`` is registered under it; two
    classes claiming one reason is an import-time error. A ``reason=`` given to
    the constructor only refines the record (e.g. the audit log's detail codes);
    the status and exit code then come from the class registered for that
    reason, if any.
    """

    reason = "error"
    http_status = 400
    exit_code = EXIT_INPUT

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "reason" in cls.__dict__:
            other = _REGISTRY.get(cls.reason)
            if other is not None and (other.__module__, other.__qualname__) != (cls.__module__, cls.__qualname__):
                raise TypeError(f"reason {cls.reason!r} is claimed by both {other.__name__} and {cls.__name__}")
            _REGISTRY[cls.reason] = cls

    def __init__(self, message: str = "", *, reason: str | None = None):
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class InvalidParameterError(SecureAFLError, ValueError, TypeError):
    """A public parameter has the wrong type or value (scikit-learn wording)."""

    reason = "invalid_parameter"
    http_status = 400
    exit_code = EXIT_INPUT


class InvalidInputError(SecureAFLError, ValueError):
    """Data handed to the library (embeddings, labels, vectors) is unusable."""

    reason = "invalid_input"
    http_status = 400
    exit_code = EXIT_INPUT


class LayoutMismatch(SecureAFLError, ValueError):
    """A packed vector was produced for another (d, C, version) layout."""

    reason = "layout_mismatch"
    http_status = 422
    exit_code = EXIT_INPUT


class MissingExtra(SecureAFLError):
    """The command needs an optional dependency this installation lacks; the message names the extra."""

    reason = "missing_extra"
    exit_code = EXIT_INPUT


class ParameterMismatch(SecureAFLError, ValueError):
    """A payload was produced under other protection parameters."""

    reason = "parameter_mismatch"
    http_status = 422
    exit_code = EXIT_INPUT


class WrongSession(SecureAFLError, ValueError):
    """A payload or message belongs to another session."""

    reason = "wrong_session"
    http_status = 422
    exit_code = EXIT_INPUT


class BoundsExceeded(SecureAFLError, ValueError):
    """Statistics leave the declared bounds; protecting them could wrap."""

    reason = "bounds_exceeded"
    http_status = 422
    exit_code = EXIT_INPUT


class MalformedPayload(SecureAFLError, ValueError):
    """Bytes that do not parse as a payload of this format (or are truncated)."""

    reason = "malformed"
    http_status = 400
    exit_code = EXIT_INPUT


class InvalidContribution(SecureAFLError):
    """A contribution failed a cryptographic check. Deliberately detail-free."""

    reason = "invalid_contribution"
    http_status = 422
    exit_code = EXIT_SECURITY


class InvalidSignature(SecureAFLError):
    """A signature did not verify. Deliberately detail-free."""

    reason = "bad_signature"
    http_status = 401
    exit_code = EXIT_KEYS


class DuplicateContribution(SecureAFLError):
    """A second contribution from a party that already contributed."""

    reason = "duplicate"
    http_status = 409
    exit_code = EXIT_REFUSED


class ReplayedContribution(SecureAFLError):
    """A contribution (or nonce) that was already seen."""

    reason = "replay"
    http_status = 409
    exit_code = EXIT_REFUSED


class StaleRound(ReplayedContribution):
    """A secagg message bound to another round of the same session (an aborted round's leftovers)."""

    reason = "stale_round"
    http_status = 409
    exit_code = EXIT_REFUSED


class RoundAlreadyClosed(SecureAFLError):
    """The round/accumulator was finalised; it accepts nothing more."""

    reason = "round_closed"
    http_status = 409
    exit_code = EXIT_REFUSED


class AwaitingPublication(SecureAFLError):
    """The session is not open yet: the key holder has not published its public context."""

    reason = "awaiting_publication"
    http_status = 409
    exit_code = EXIT_REFUSED


class StageError(SecureAFLError):
    """A protocol message arrived in the wrong stage."""

    reason = "wrong_stage"
    http_status = 409
    exit_code = EXIT_REFUSED


class InsufficientShares(SecureAFLError):
    """Fewer than the threshold of Shamir shares: nothing can be revealed."""

    reason = "insufficient_shares"
    http_status = 409
    exit_code = EXIT_REFUSED


class InconsistentDealer(InsufficientShares):
    """A dealer's shares miss its own signed check polynomial: the round aborts before any unmask, naming it.

    ``dealer`` is its client id; ``complaint`` the holder's transferable proof
    (:class:`~secure_afl.secagg.DealerComplaint`), when known.
    """

    reason = "inconsistent_dealer"

    def __init__(self, message: str = "", *, dealer: int | None = None, complaint=None):
        super().__init__(message)
        self.dealer = dealer
        self.complaint = complaint


class InsufficientContributors(SecureAFLError):
    """Fewer than min_clients contributed: the aggregate is not released."""

    reason = "insufficient_contributors"
    http_status = 409
    exit_code = EXIT_REFUSED


class OverlappingUnmaskRequest(SecureAFLError):
    """An unmask request asks for both shares of the same client."""

    reason = "overlapping_unmask_request"
    http_status = 409
    exit_code = EXIT_REFUSED


class SecretKeyNotAllowed(SecureAFLError):
    """A context holding a secret key was handed to a party that must not have one."""

    reason = "secret_key_context"
    http_status = 422
    exit_code = EXIT_KEYS


class PolicyViolation(SecureAFLError):
    """A release would break the disclosure policy (cohort, class minimum, overlap)."""

    reason = "policy_violation"
    http_status = 409
    exit_code = EXIT_REFUSED


class SanityCheckFailed(SecureAFLError):
    """A revealed aggregate is not a plausible sum of statistics."""

    reason = "sanity_check_failed"
    http_status = 422
    exit_code = EXIT_SECURITY


class DecryptionRefused(SecureAFLError):
    """The key holder refuses to decrypt (not an aggregate backed by a valid manifest)."""

    reason = "decryption_refused"
    http_status = 409
    exit_code = EXIT_SECURITY


class AuditChainBroken(SecureAFLError):
    """The audit log's hash chain or a receipt does not verify."""

    reason = "audit_chain_broken"
    http_status = 422
    exit_code = EXIT_SECURITY

    def __init__(self, message: str = "", *, index: int | None = None, reason: str | None = None):
        super().__init__(message, reason=reason)
        self.index = index


class InvalidKey(SecureAFLError):
    """Key material is unusable here: a wrong passphrase or key file, a sealed key
    for another session, or a public context where a secret one is needed.
    Deliberately detail-free about which."""

    reason = "invalid_key"
    http_status = 400
    exit_code = EXIT_KEYS


class Unauthenticated(SecureAFLError):
    """A request that must be signed carries no usable signature."""

    reason = "unauthenticated"
    http_status = 401
    exit_code = EXIT_KEYS


class UnknownParty(SecureAFLError):
    """The caller is not enrolled in this session."""

    reason = "unknown_party"
    http_status = 403
    exit_code = EXIT_KEYS


class Forbidden(SecureAFLError):
    """An enrolled party asks for something its role may not do."""

    reason = "forbidden"
    http_status = 403
    exit_code = EXIT_KEYS


class NotFound(SecureAFLError):
    """No such session, receipt or published context."""

    reason = "not_found"
    http_status = 404
    exit_code = EXIT_REFUSED


class DeadlinePassed(SecureAFLError):
    """The session's upload deadline has passed."""

    reason = "deadline_passed"
    http_status = 410
    exit_code = EXIT_REFUSED


class TooLarge(SecureAFLError):
    """A body larger than the session's upload cap."""

    reason = "too_large"
    http_status = 413
    exit_code = EXIT_INPUT


class RequestTimeout(SecureAFLError):
    """A request body that did not arrive within the server's read or body timeout."""

    reason = "timeout"
    http_status = 408
    exit_code = EXIT_REFUSED


class ServerBusy(SecureAFLError):
    """Every slot for reading request bodies is taken; retry later."""

    reason = "busy"
    http_status = 429
    exit_code = EXIT_REFUSED


class StateInUse(SecureAFLError):
    """Another process already writes this state (a second ``server run`` on the same session directory)."""

    reason = "state_in_use"
    exit_code = EXIT_REFUSED


class InternalError(SecureAFLError):
    """An unexpected server-side failure, answered with a reason and audited instead of a traceback."""

    reason = "internal"
    http_status = 500
    exit_code = EXIT_INTERNAL


class ExtractorMismatch(ParameterMismatch):
    """Statistics extracted with another backbone, weights, preprocessing or class order than the session's."""

    reason = "extractor_mismatch"
    http_status = 422
    exit_code = EXIT_INPUT


class InsecureFileMode(SecureAFLError):
    """A secret file or ledger is readable by its group or by everyone."""

    reason = "insecure_file_mode"
    http_status = 400
    exit_code = EXIT_KEYS


class WeakPassphrase(InvalidParameterError):
    """A passphrase too short to protect a secret key at rest."""

    reason = "weak_passphrase"
    http_status = 400
    exit_code = EXIT_KEYS


class MissingEnrolment(SecureAFLError):
    """A party the session names has no enrolment in the consortium roster."""

    reason = "missing_enrolment"
    http_status = 400
    exit_code = EXIT_INPUT


class UnreadableRecord(SecureAFLError):
    """A party's own durable record exists but cannot be read: what it held is unknown, so nothing that
    record guards goes ahead (a secagg hospital that may have signed a survivor set signs no other)."""

    reason = "unreadable_record"
    http_status = 400
    exit_code = EXIT_INPUT


class ServerUnreachable(SecureAFLError):
    """The server did not answer (not running, wrong address, network down)."""

    reason = "unreachable"
    http_status = 503
    exit_code = EXIT_UNREACHABLE


class UntrustedServer(SecureAFLError):
    """The server's TLS certificate was not issued by this party's consortium CA (another consortium's
    server, or a wrong address). Never retried: the same certificate comes back on every attempt."""

    reason = "untrusted_server"
    http_status = 421
    exit_code = EXIT_KEYS


class ServiceError(SecureAFLError):
    """A refusal by the server whose reason this version does not know."""

    exit_code = EXIT_REFUSED


def error_class(reason: str) -> type[SecureAFLError]:
    """The class registered for ``reason``; :class:`ServiceError` for an unknown one."""
    return _REGISTRY.get(reason, ServiceError)


def registered_reasons() -> dict[str, type[SecureAFLError]]:
    """A copy of the registry (reason -> class), for documentation and tests."""
    return dict(_REGISTRY)


def http_status(exc: SecureAFLError) -> int:
    """The 4xx the server answers ``exc`` with (by reason first, so a refined reason keeps its status)."""
    return _REGISTRY.get(exc.reason, type(exc)).http_status


def exit_code(exc: SecureAFLError) -> int:
    """The documented ``secure-afl`` exit code for ``exc``."""
    return _REGISTRY.get(exc.reason, type(exc)).exit_code
