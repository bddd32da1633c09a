"""One session's server state, declared in one place: every field the server's stages read or write.

:class:`ServerSession` is what :func:`server.aggregator.open_server` builds; each stage is a module of functions
over it (who is calling: ``peer_auth``; the running sum: ``running_sum``; uploads: ``intake``; what an accepted
upload and a release leave behind: ``audit_records``; the release: ``closing``; split's collector: ``split_round``;
secagg's rounds: ``secagg_round``). A stage keeps nothing of its own: what it needs between calls is a field
here, so a reader sees the whole state of a session in this file, and tests/test_layering.py refuses a module
that sets a field this file does not declare.

Stages of a session, visible in :attr:`ServerSession.status`::

    awaiting_context (ckks, bfv, split) -> open -> released

What is durable lives in :attr:`ServerSession.store` (SQLite and payload files) and the audit log; the fields
below the store are the in-memory state rebuilt from them after a restart (``running_sum.rebuild``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from secure_afl.audit_log import AuditLog
from secure_afl.cohort import ReleasePolicy
from secure_afl.params import SessionParams

from .config import ServerConfig
from .refusals import RefusalLog
from .session_parties import SessionRoster
from .store import Store

__all__ = ["SecAggState", "ServerSession", "SplitState"]


@dataclass(eq=False)
class StatusSummary:
    """The last refusal of each authenticated hospital's upload, folded from the audit log record by record
    (every existing one when the log is opened, then each one appended: ``status.observe_record``), so the
    status view costs nothing in the log's length. Only authenticated actors are kept: a hospital name is one
    of the roster's, so the map holds at most one entry per roster hospital."""

    #: guards ``refused``: the log appends from request threads while a status request reads it
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: hospital -> the reason its last upload was refused
    refused: dict = field(default_factory=dict)


@dataclass(eq=False)
class SecAggState:
    """The secagg rounds' state (server/secagg_round.py); durable messages and stage closings are in the store."""

    #: the roster's hospitals in sorted order: client id ``i`` is ``names[i - 1]`` (also the Shamir x)
    names: tuple[str, ...]
    #: hospital name -> SecAgg client id, computed once: every poll and audit record looks ids up
    client_ids: dict[str, int]
    #: the longest pause between a waiting hospital's polls (``secagg_round.poll_interval``)
    poll_s: float
    #: the current round (:class:`secure_afl.secagg.SecAggServerRound`), replayed from the store on rebuild
    round: object | None = None
    #: set at shutdown: the stage clock's thread stops
    stop: threading.Event = field(default_factory=threading.Event)
    #: the stage clock (``secagg_round.tick_loop``)
    ticker: threading.Thread | None = None


@dataclass(eq=False)
class SplitState:
    """split's collector state (server/split_round.py); the verifier messages and the share are in the store."""

    #: the worker processes that form the server's verifier messages, started on the first query, kept after
    verifier_pool: object | None = None


@dataclass(eq=False, repr=False)  # its repr would print the whole roster and key objects into a log
class ServerSession:
    """One session on the aggregation server: its set-up, its durable records and its in-memory state."""

    config: ServerConfig
    #: this session's directory under ``[server] data_dir``: SQLite, payloads, audit log, audit-head.json
    dir: Path
    store: Store
    #: the server's enrolled party (identity key, TLS certificate)
    party: object
    #: the server's Ed25519 identity key: receipts, manifests, close records, secagg requests, split sums
    key: object
    identity_pub_hex: str
    audit: AuditLog
    #: the operator-signed session definition, equal to the server's own settings
    definition: object
    release_policy: ReleasePolicy
    #: roster hospital -> enrolment
    enrolled: dict
    roster: SessionRoster
    #: each roster hospital's last upload refusal, folded from the audit log as it grows (the status view)
    status_summary: StatusSummary
    refusals: RefusalLog
    #: guards every field below and the store's multi-step changes
    lock: threading.RLock
    #: notified when an upload in flight finishes: close and a rebuild of the sum wait on it for ``in_flight``
    drained: threading.Condition
    #: uploads past their checks whose contribution a summing worker is adding outside the lock
    in_flight: set[str] = field(default_factory=set)
    #: True while close waits for ``in_flight`` to drain: nothing new starts
    closing: bool = False
    #: the backend that admits uploads, built once per session parameters
    door: object | None = None
    #: None until the key holder's public context opens a keyed session
    params: SessionParams | None = None
    public_context: bytes | None = None
    #: the running sum (:class:`secure_afl.parallel.ParallelCombiner`); None before the session opens and
    #: for secagg, whose round owns the sum
    combiner: object | None = None
    #: secagg's rounds, for a secagg session only
    secagg: SecAggState | None = None
    #: split's collector, for a split session only
    split: SplitState | None = None

    @property
    def status(self) -> str:
        if self.store.get_meta("manifest") is not None:
            return "released"
        if self.params is None:
            return "awaiting_context"
        return "open"

    @property
    def deadline(self) -> float | None:
        """The upload deadline: ``[server] deadline``, or ``deadline_s`` after the session was created."""
        c = self.config
        if c.deadline is not None:
            return c.deadline
        if c.deadline_s is not None:
            return float(self.store.get_meta("created_at")) + c.deadline_s
        return None
