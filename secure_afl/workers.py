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


def _start_worker(parent: int, warm) -> None:
    """Worker start-up: leave when the process that started this one is gone (a killed server or key holder
    must not leave its verifiers behind, holding opened seeds in memory); then ``warm()`` (imports, compiled
    kernels) before the first batch."""
    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)
    threading.Thread(target=watch, daemon=True, name="parent-watch").start()
    if warm is not None:
        warm()


def _ready() -> int:
    return os.getpid()


class WorkerPool:
    """Up to ``workers`` spawned processes, started once and kept for every later batch.

    :meth:`map_chunks` runs ``fn(common, chunk)`` over contiguous chunks of the items, one chunk per worker, and
    returns the results in chunk order. A verifier that streams (a poll every second, a few uploads each time)
    pays the interpreter start-up (a second or more of CPU per process) once, not at every batch, and a batch
    of any size is spread over ``min(workers, len(items))`` of them (a single item too: the caller, a server's
    request thread, stays free). Once the pool has been handed ``start_after`` items in all, or its batches
    have taken ``start_after_s`` seconds of the calling thread's CPU (about what starting a worker costs: past
    it, the workers pay for themselves whatever comes next), it starts its processes and runs ``warm`` in each;
    until they are all up, batches run in the calling process, so no batch waits for an interpreter to start
    and a small or cheap session never starts one.

    ``fn`` must be a module-level function (a spawned interpreter imports it by name) and ``common`` and the
    items picklable. The first exception a chunk raises is raised here. Thread-safe; :meth:`close` (or leaving
    ``with``) stops the workers without waiting for them to exit (a later batch starts them again), and each
    worker also stops when its parent process is gone.
    """

    def __init__(self, workers: int | None = None, *, start_after: int = 32, start_after_s: float | None = None,
                 warm=None):
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError("workers must be an int >= 1")
        self.workers = workers or os.cpu_count() or 1
        self.start_after = int(start_after)
        self.start_after_s = None if start_after_s is None else float(start_after_s)
        self._warm = warm
        self._seen = 0
        self._inline_s = 0.0  # the calling threads' CPU seconds in batches run here
        self._pool: ProcessPoolExecutor | None = None
        self._starting: list = []
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        """The worker processes are up (every one has run ``warm``)."""
        with self._lock:
            return self._pool is not None and all(f.done() for f in self._starting)

    @property
    def launched(self) -> bool:
        """The worker processes were asked to start (they may still be coming up)."""
        with self._lock:
            return self._pool is not None

    def start(self, *, wait: bool = True, timeout: float | None = None) -> None:
        """Start the workers now, whatever ``start_after`` says (a benchmark's setup, tests); ``wait``: until
        they are up."""
        with self._lock:
            self._start_locked()
            starting = list(self._starting)
        if wait:
            for f in starting:
                f.result(timeout)

    def _start_if_due_locked(self) -> None:
        if self.workers > 1 and (self._seen >= self.start_after or (
                self.start_after_s is not None and self._inline_s >= self.start_after_s)):
            self._start_locked()

    def _start_locked(self) -> None:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=mp.get_context("spawn"),
                                             initializer=_start_worker, initargs=(os.getpid(), self._warm))
            # one task per worker spawns them all now; a start-up failure surfaces at a later batch
            self._starting = [self._pool.submit(_ready) for _ in range(self.workers)]

    def map_chunks(self, fn, common, items) -> list:
        items = list(items)
        with self._lock:
            self._seen += len(items)
            self._start_if_due_locked()
            pool, starting = self._pool, list(self._starting)
        ready = pool is not None and all(f.done() for f in starting)
        for f in starting if ready else ():
            f.result()
        if not ready or not items:
            cpu0 = time.thread_time()
            try:
                return [fn(common, items)]
            finally:
                with self._lock:  # started now, not at the next batch: they warm while the caller waits for it
                    self._inline_s += time.thread_time() - cpu0
                    self._start_if_due_locked()
        size = -(-len(items) // min(self.workers, len(items)))
        chunks = [items[i:i + size] for i in range(0, len(items), size)]
        return list(pool.map(fn, [common] * len(chunks), chunks))

    def close(self) -> None:
        """Stop the workers: queued chunks are cancelled and each worker leaves after its chunk in flight. Not
        waited for: a worker's interpreter takes 0.3 s (quiet) to 1.3 s (a loaded 2-core VM) to finalise, which
        a key holder closing its pool before its share leaves would add to every release."""
        with self._lock:
            pool, self._pool, self._starting = self._pool, None, []
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
