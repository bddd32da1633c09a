"""The release policy: how many hospitals of the signed roster a release needs, from the signed session only.

A server that may collude with up to ``c`` hospitals (the session's signed
colluder bound) chooses which uploads reach a release: it can leave honest
hospitals out (a small manifest), and in split it can make honest uploads
fail the joint validity check (a forged verifier message). Either way the
colluders' own statistics are known to the coalition, so a release over
``k`` hospitals of which ``c`` collude reveals the sum of ``k - c`` honest
ones; with ``k - c = 1`` that is one hospital's exact statistics.

The rule, for every backend (the secagg consistency quorum, applied to the
release itself): a release needs at least

    q = max(floor((n + c) / 2) + 1, min_clients + c)

hospitals of the signed roster (``n`` its size) after every refusal. Then at
least ``min_clients`` honest hospitals are behind any release, and two
releases over different cohorts of one session cannot both be formed without
``2 (q - c) > n - c`` distinct honest uploads, more than exist. Split
refusals are further capped by the session's signed ``max_refusals``: past
it, the release aborts instead of shrinking the cohort.

The policy also carries what the signed session asks of the released
statistics themselves (split only, the one backend whose schema has them):
``max_share``, the largest share of the pooled samples one hospital may hold,
and ``gram_proof``, under which every upload proved its statistics a Gram
matrix so the released sum must be positive semi-definite.
:func:`secure_afl.release_checks.check_release_policy` applies both to a
decoded release; the split release (:func:`secure_afl.split_release.form_release`,
which the key holder, the Flower path and the auditor all go through) calls it.

Nothing relayed by the server enters :func:`release_policy`: its only inputs
are the signed definition and the stricter floors a party may ask for
itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .exceptions import InsufficientContributors, InvalidParameterError

__all__ = ["ReleasePolicy", "quorum", "default_colluders", "isolation_coalition", "release_policy", "cohort_after_refusals",
           "check_quorum", "JOINT_CHECK", "HOSPITAL_PROVEN"]

#: the attribution of a refusal whose evidence does not pin the hospital: the server formed one of the two
#: verifier messages, so a failed joint check is the hospital's or the server's
JOINT_CHECK = "failed the joint check (hospital or server)"
#: the attribution of a refusal the hospital's own signed statement proves (its commitment fails on its seed)
HOSPITAL_PROVEN = "the hospital's signed statement fails on its own seed"


def quorum(n: int, colluders: int, min_clients: int) -> int:
    """``max(floor((n + c) / 2) + 1, min_clients + c)``: hospitals of the roster every release needs."""
    return max((n + colluders) // 2 + 1, min_clients + colluders)


def default_colluders(n: int, min_clients: int) -> int:
    """The default colluder bound c of a non-secagg session of ``n`` hospitals: the largest
    ``c <= min_clients - 1`` whose quorum fits the roster (``quorum(n, c, min_clients) <= n``).

    Privacy comes before liveness: a larger c makes a release need more hospitals, so isolating one
    hospital takes ``q - 1`` colluders beside the server, and the default never trades that for a dropout
    the consortium did not ask for. On a small roster the quorum may then be the whole roster (no hospital
    may drop out, as ``session sign`` prints); an operator who wants dropouts signs a smaller c explicitly.
    :class:`InvalidParameterError` when no c fits (``n < min_clients``), naming the smallest roster that works.
    """
    if n < min_clients:
        raise InvalidParameterError(
            f"a roster of {n} hospital{'s' if n != 1 else ''} cannot release with min_clients = {min_clients}: "
            f"the smallest roster that works has {min_clients} hospitals (or lower min_clients to {n})")
    return max(c for c in range(min_clients) if quorum(n, c, min_clients) <= n)


def isolation_coalition(n: int, colluders: int, min_clients: int, *, secagg_threshold: int | None = None) -> int:
    """Colluding hospitals the server needs beside it to learn one hospital's statistics alone.

    A release is formed over at least q roster hospitals, so a coalition of q - 1 hospitals (with the
    server choosing the cohort) differences the release down to the remaining one. Under secagg the
    victim's masks are also opened by ``threshold`` of its share holders, whichever is fewer.
    """
    k = quorum(n, colluders, min_clients) - 1
    return k if secagg_threshold is None else min(k, int(secagg_threshold))


@dataclass(frozen=True)
class ReleasePolicy:
    """What a release of one session must satisfy; see the module docstring."""

    session_id: str
    backend: str
    roster: tuple[str, ...]
    min_clients: int
    colluders: int
    quorum: int
    max_refusals: int
    min_class_count: int
    deadline: float | None

    signed_min_clients: int = 0
    #: the signed [split] max_share (1.0: no cap) and gram_proof (as read: SessionDefinition.split_settings),
    #: checked on the decoded release
    max_share: float = 1.0
    gram_proof: bool = False

    def why_quorum(self) -> str:
        """How :attr:`quorum` was reached, with the values actually used (one phrase)."""
        n, c, mc = len(self.roster), self.colluders, self.signed_min_clients or self.min_clients
        text = f"max(floor((n + c) / 2) + 1, min_clients + c) with n = {n}, c = {c}, signed min_clients = {mc}"
        if self.quorum > quorum(n, c, mc):
            text += f", raised to this party's own floor of {self.quorum}"
        return text

    @property
    def dropout_tolerance(self) -> int:
        """Roster hospitals that may be missing (silent, dropped or refused) and the session still releases."""
        return len(self.roster) - self.quorum


def release_policy(definition, *, min_clients: int = 0, min_class_count: int = 0) -> ReleasePolicy:
    """The release policy of a signed session ``definition``; ``min_clients`` (contributors, as
    ``keyholder finalize --min-clients`` counts them) and ``min_class_count`` are a party's own stricter
    floors: they can only raise the signed ones."""
    b = definition.body
    n, c = len(b["hospitals"]), int(b["colluders"])
    mc = max(int(b["min_clients"]), int(min_clients))
    sp = definition.split_settings() if b["backend"] == "split" else {}
    return ReleasePolicy(
        session_id=b["id"], backend=b["backend"], roster=tuple(b["hospitals"]), min_clients=mc, colluders=c,
        quorum=max(quorum(n, c, int(b["min_clients"])), int(min_clients)), max_refusals=int(b["max_refusals"]),
        min_class_count=max(int(b["min_class_count"]), int(min_class_count)), deadline=b.get("deadline"),
        signed_min_clients=int(b["min_clients"]), max_share=float(sp.get("max_share", 1.0)),
        gram_proof=bool(sp.get("gram_proof")))


def check_quorum(policy: ReleasePolicy, contributors: int) -> None:
    """:class:`InsufficientContributors` when a manifest of ``contributors`` uploads is below the quorum, naming
    the quorum enforced and how it was reached (a party's own raised floor included)."""
    if contributors < policy.quorum:
        raise InsufficientContributors(f"{contributors} contributions, fewer than the release quorum "
                                       f"q = {policy.quorum} ({policy.why_quorum()})")


def cohort_after_refusals(policy: ReleasePolicy, participants, refused: Mapping[str, str]) -> list[str]:
    """The cohort a release may go ahead with: ``participants`` (already checked against the signed roster)
    less ``refused``; :class:`InsufficientContributors` when the refusals pass the signed limit or leave
    fewer than the quorum (the release aborts: the cohort never shrinks below it)."""
    everyone = list(participants)
    out = set(refused) - set(everyone)
    if out:
        raise InsufficientContributors(f"refusals name {sorted(out)}, not in the release's cohort")
    roster = set(policy.roster)
    cohort = [h for h in everyone if h not in refused and h in roster]
    if len(refused) > policy.max_refusals:
        raise InsufficientContributors(
            f"{len(refused)} uploads refused ({', '.join(sorted(refused))}), more than the session's signed "
            f"max_refusals = {policy.max_refusals}: the release is aborted rather than formed over a cohort the "
            "server could have chosen")
    if len(cohort) < policy.quorum:
        raise InsufficientContributors(
            f"{len(cohort)} roster hospitals remain after {len(refused)} refusals"
            f"{' (' + ', '.join(sorted(refused)) + ')' if refused else ''}, below the release quorum "
            f"q = {policy.quorum} ({policy.why_quorum()})")
    return cohort
