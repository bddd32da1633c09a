"""The server's running sum: one combiner per session's parameters, summed again from the stored uploads after a
restart (by every core), and how many processes add uploads at once.

Functions over :class:`server.session_state.ServerSession`; they read ``config`` and ``store`` and set
``params``, ``public_context`` and ``combiner`` (secagg: the round, through ``secagg_round.replay_round``), and
finish the upload and release bookkeeping a crash interrupted (``audit_records``).
"""

from __future__ import annotations

from secure_afl.backends import HE_BACKENDS
from secure_afl.parallel import ParallelCombiner, default_workers, sum_payloads
from secure_afl.params import KEYED_BACKENDS, SessionParams

from . import audit_records, secagg_round
from .session_state import ServerSession

__all__ = ["combine_workers", "new_combiner", "rebuild"]


def rebuild(session: ServerSession) -> None:
    """In-memory state (parameters, running sum) from what is durably stored."""
    stored = session.store.get_meta("params")
    if stored is not None:
        session.params = SessionParams.from_dict(stored)
    elif session.config.backend not in KEYED_BACKENDS:
        session.params = session.definition.session_params()
        session.store.set_meta("params", session.params.to_dict())
    ctx = session.store.get_meta("public_context_sha256")
    if ctx is not None:
        session.public_context = session.store.get_blob(ctx)
    if session.params is not None:
        session.combiner = new_combiner(session)
        rows = session.store.uploads()
        if session.combiner is not None and rows and session.store.get_meta("manifest") is None:
            _resum_stored(session, rows)  # once released, the aggregate is stored: nothing to add
        for row in rows:
            if row["audit_seq"] is None:  # killed between commit and receipt: finish the bookkeeping
                audit_records.finish_acceptance(session, row["hospital"], row["payload_sha256"], recovered=True)
    if session.store.get_meta("manifest") is not None:
        audit_records.finish_release(session, session.config.name)
    if session.secagg is not None:  # the round owns the sum: its masked inputs are the stored uploads
        secagg_round.replay_round(session)


def _resum_stored(session: ServerSession, rows: list) -> None:
    """The running sum of the stored uploads, deserialised and added by all cores (after a restart
    the server may hold K uploads to add again; one process would use one core)."""
    stored = ((row["hospital"], session.store.get_blob(row["payload_sha256"])) for row in rows)
    ctx = session.public_context if session.params.backend in HE_BACKENDS else None
    for body, n in sum_payloads(session.params, stored, public_context=ctx, count=len(rows)):
        session.combiner.merge(body, n)


def new_combiner(session: ServerSession):
    """A fresh running sum for the session's parameters (the old one's workers stopped); None for secagg,
    whose round owns the sum."""
    if session.combiner is not None:
        session.combiner.shutdown()
    if session.secagg is not None:
        return None
    ctx = session.public_context if session.params.backend in HE_BACKENDS else None
    return ParallelCombiner(session.params, public_context=ctx, workers=combine_workers(session))


def combine_workers(session: ServerSession) -> int:
    """Processes that check and add uploads at once: ``[server] combine_workers``, or by default the cores
    when the session's uploads are ciphertexts worth it (k_max uploads of >= 64 MB in all), else 1."""
    if session.config.combine_workers:
        return session.config.combine_workers
    if session.params is None or session.params.backend not in HE_BACKENDS:
        return 1  # adding float64 or uint64 vectors costs less than handing them to another process

    # a ciphertext carries at least ~30 bytes per value (docs/BENCHMARKS.md)
    return default_workers(session.config.bounds.k_max, 30 * session.params.layout.length)
