"""The server's running sum: one combiner per session's parameters, summed again from the stored uploads after a
restart (by every core), and how many processes add uploads at once.

A mixin of :class:`server.aggregator.AggregationServer`, which sets what it reads: ``config``, ``store``,
``params``, ``public_context``, ``_combiner`` and the upload and release bookkeeping it finishes after a crash.
"""

from __future__ import annotations

from secure_afl.backends import HE_BACKENDS
from secure_afl.parallel import ParallelCombiner, default_workers, sum_payloads
from secure_afl.params import KEYED_BACKENDS, SessionParams

__all__ = ["RunningSum"]


class RunningSum:
    """Parameters and the running sum, rebuilt from what is durably stored."""

    def _rebuild(self) -> None:
        """In-memory state (parameters, running sum) from what is durably stored."""
        stored = self.store.get_meta("params")
        if stored is not None:
            self.params = SessionParams.from_dict(stored)
        elif self.config.backend not in KEYED_BACKENDS:
            self.params = self._base_params()
            self.store.set_meta("params", self.params.to_dict())
        ctx = self.store.get_meta("public_context_sha256")
        if ctx is not None:
            self.public_context = self.store.get_blob(ctx)
        if self.params is not None:
            self._combiner = self._new_combiner()
            rows = self.store.uploads()
            if self._combiner is not None and rows and self.store.get_meta("manifest") is None:
                self._resum_stored(rows)  # once released, the aggregate is stored: nothing to add
            for row in rows:
                if row["audit_seq"] is None:  # killed between commit and receipt: finish the bookkeeping
                    self._finish_acceptance(row["hospital"], row["payload_sha256"], recovered=True)
        if self.store.get_meta("manifest") is not None:
            self._finish_release(self.config.name)

    def _resum_stored(self, rows: list) -> None:
        """The running sum of the stored uploads, deserialised and added by all cores (after a restart
        the server may hold K uploads to add again; one process would use one core)."""

        stored = ((row["hospital"], self.store.get_blob(row["payload_sha256"])) for row in rows)
        ctx = self.public_context if self.params.backend in HE_BACKENDS else None
        for body, n in sum_payloads(self.params, stored, public_context=ctx, count=len(rows)):
            self._combiner.merge(body, n)

    def _new_combiner(self):

        if self._combiner is not None:
            self._combiner.shutdown()
        ctx = self.public_context if self.params.backend in HE_BACKENDS else None
        return ParallelCombiner(self.params, public_context=ctx, workers=self.combine_workers)

    @property
    def combine_workers(self) -> int:
        """Processes that check and add uploads at once: ``[server] combine_workers``, or by default the cores
        when the session's uploads are ciphertexts worth it (k_max uploads of >= 64 MB in all), else 1."""
        if self.config.combine_workers:
            return self.config.combine_workers
        if self.params is None or self.params.backend not in HE_BACKENDS:
            return 1  # adding float64 or uint64 vectors costs less than handing them to another process

        # a ciphertext carries at least ~30 bytes per value (docs/BENCHMARKS.md)
        return default_workers(self.config.bounds.k_max, 30 * self.params.layout.length)
