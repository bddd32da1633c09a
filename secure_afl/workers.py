"""Spawned worker processes for per-item work that holds the GIL (see :class:`WorkerPool`).

Kept apart from :mod:`secure_afl.parallel` (the streaming sum of payloads), which imports the backends:
the backends call this module, so it imports nothing of the package.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor

__all__ = ["WorkerPool"]


def _watch_parent(parent: int) -> None:
    """Worker start-up: leave when the process that started this one is gone (a killed server or key holder
    must not leave its verifiers behind, holding opened seeds in memory)."""
    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)
    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


class WorkerPool:
    """Up to ``workers`` spawned processes, started once and kept for every later batch.

    :meth:`map_chunks` runs ``fn(common, chunk)`` over contiguous chunks of the items, one chunk per worker, and
    returns the results in chunk order. A verifier that streams (a poll every second, a few uploads each time)
    pays the interpreter start-up (about a second per process) once, not at every batch, and a batch of any
    size is spread over ``min(workers, len(items))`` of them (a single item too: the caller, a server's request
thread, stays free). Until the pool has been handed ``start_after``
    items in all, it works in the calling process: a small session never starts a process.

    ``fn`` must be a module-level function (a spawned interpreter imports it by name) and ``common`` and the
    items picklable. The first exception a chunk raises is raised here. Thread-safe; :meth:`close` (or leaving
    ``with``) stops the workers (a later batch starts them again), and each worker also stops when its parent
    process is gone.
    """

    def __init__(self, workers: int | None = None, *, start_after: int = 32):
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError("workers must be an int >= 1")
        self.workers = workers or os.cpu_count() or 1
        self.start_after = int(start_after)
        self._seen = 0
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        return self._pool is not None

    def map_chunks(self, fn, common, items) -> list:
        items = list(items)
        with self._lock:
            self._seen += len(items)
            if self._pool is None and self.workers > 1 and self._seen >= self.start_after:
                self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=mp.get_context("spawn"),
                                                 initializer=_watch_parent, initargs=(os.getpid(),))
            pool = self._pool
        if pool is None or not items:
            return [fn(common, items)]
        size = -(-len(items) // min(self.workers, len(items)))
        chunks = [items[i:i + size] for i in range(0, len(items), size)]
        return list(pool.map(fn, [common] * len(chunks), chunks))

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
