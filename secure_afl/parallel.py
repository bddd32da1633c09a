"""Sum N stored payloads with W worker processes: deserialise and add in parallel, memory O(W L).

Deserialising a contribution (and checking it: envelope binding, framing,
ciphertext level and scale, plaintext bounds) costs far more than adding it,
and both run under the GIL, so one process uses one core whatever the thread
count. Here the parent hands payload ``i`` to worker ``i mod W``; each worker
runs the backend's own streaming :class:`~secure_afl.backends.Combiner` over
its share and sends back ONE serialised partial sum; the caller adds the W
partials in worker order (:meth:`Combiner.merge`). At most ``_QUEUE_DEPTH``
payloads wait per worker, so memory is O(W L), never O(K L).

Results
-------
* ckks, bfv: ciphertext addition is exact arithmetic modulo the coefficient
  modulus, so any split gives the same ciphertext, bit for bit, as the serial
  fold (tests/test_parallel.py checks it).
* plain: float64 addition is not associative; W > 1 changes the order of
  additions, so the sum can differ from the serial fold in the last bits
  (within the float64 summation bound K * 2^-53 * sum |x|). W = 1 runs the
  serial fold in this process, bit for bit.

Every payload is checked by the combiner before it is added; the first one
refused stops the sum and raises :class:`PayloadRefused` naming it, and no
partial sum is returned. The key holder's secret context never reaches a
worker: workers get the public context (adding needs no secret).

Workers are started with ``spawn`` (a fresh interpreter): the callers run
threads (the server's event loop and its pool), and forking a threaded
process can copy a held lock into the child.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import queue as queue_mod
import threading
import time
from typing import Iterable, Iterator

from .exceptions import InvalidContribution, MalformedPayload, SecureAFLError, ServerBusy, error_class
from .params import SessionParams
from secure_afl.backends import get_backend

__all__ = ["PayloadRefused", "sum_payloads", "default_workers", "ParallelCombiner", "WorkerLost"]

#: Payloads queued per worker beyond the one it is adding (bounds the parent's memory).
_QUEUE_DEPTH = 2
#: A worker costs an interpreter start and imports (a second or more): below this many bytes to
#: deserialise, one process finishes first.
_PARALLEL_MIN_BYTES = 64 << 20
_POLL_S = 0.5


class PayloadRefused(InvalidContribution):
    """A payload in the sum is not a valid contribution; ``label`` names it, ``cause`` is the refusal."""

    def __init__(self, message: str, label: str, cause: str):
        super().__init__(message)
        self.label = label
        self.cause = cause


def default_workers(n: int, payload_bytes: int) -> int:
    """The machine's cores for ``n`` payloads of about ``payload_bytes``; 1 when the sum is too small to pay
    for starting workers."""
    if n * payload_bytes < _PARALLEL_MIN_BYTES:
        return 1
    return max(1, min(os.cpu_count() or 1, n))


def _combiner(params: SessionParams, public_context: bytes | None):

    backend = get_backend(params)
    return backend.combiner(public_context=public_context) if public_context is not None else backend.combiner()


def _fold(params: SessionParams, public_context: bytes | None, items: Iterator[tuple[str, bytes]]) -> tuple[bytes, int]:
    """The serial fold: the running sum of ``items`` as one partial body, and how many it holds."""
    comb = _combiner(params, public_context)
    for label, payload in items:
        try:
            comb.add(payload)
        except SecureAFLError as e:
            raise PayloadRefused(f"{label}: {type(e).__name__}: {e}", label, type(e).__name__) from e
    return comb.partial(), comb.count


def _exit_with_parent(parent_pid: int, poll_s: float = 1.0) -> None:
    """End this process when ``parent_pid`` is no longer its parent.

    A worker blocked on its inbox never sees end-of-file when the parent is
    killed (it holds both ends of the queue's pipe itself), and ``daemon=True``
    only acts on a parent's orderly exit; without this, a killed server or key
    holder leaves workers running forever.
    """

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _worker(index: int, params_dict: dict, public_context: bytes | None, inbox, outbox, parent_pid: int) -> None:
    _exit_with_parent(parent_pid)

    def items():
        while True:
            item = inbox.get()
            if item is None:
                return
            yield item

    try:
        body, count = _fold(SessionParams.from_dict(params_dict), public_context, items())
        outbox.put((index, "ok", body, count))
    except PayloadRefused as e:
        outbox.put((index, "refused", e.label, e.cause, str(e)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises
        outbox.put((index, "failed", "", type(e).__name__, str(e)[:500]))


def sum_payloads(params: SessionParams, payloads: Iterable[tuple[str, bytes]], *,
                 public_context: bytes | None = None, workers: int | None = None,
                 count: int | None = None) -> list[tuple[bytes, int]]:
    """Check and sum ``(label, payload)`` pairs -> ``[(partial body, n), ...]``, one per worker, in worker order.

    ``payloads`` is consumed lazily (it may fetch each payload as it goes);
    ``count`` is its length when known. ``workers`` defaults to
    :func:`default_workers` (sized from ``count`` and the first payload);
    ``workers=1`` folds in this process. ckks/bfv need ``public_context``.
    Merge the partials with :meth:`Combiner.merge`. Raises :class:`PayloadRefused`.
    """
    payloads = iter(payloads)
    if workers is None:
        first = next(payloads, None)
        if first is None:
            return [_fold(params, public_context, iter(()))]
        payloads = itertools.chain([first], payloads)
        workers = default_workers(count if count is not None else 1, len(first[1]))
    if count is not None:
        workers = min(workers, max(1, count))
    if workers < 1:
        raise ValueError("workers must be >= 1")
    if workers == 1:
        return [_fold(params, public_context, payloads)]

    ctx = mp.get_context("spawn")
    outbox = ctx.Queue()
    inboxes = [ctx.Queue(maxsize=_QUEUE_DEPTH) for _ in range(workers)]
    procs = [ctx.Process(target=_worker, args=(i, params.to_dict(), public_context, q, outbox, os.getpid()),
                         daemon=True)
             for i, q in enumerate(inboxes)]
    for p in procs:
        p.start()
    partials: dict[int, tuple[bytes, int]] = {}

    def receive(timeout: float | None) -> None:
        try:
            msg = outbox.get(timeout=timeout) if timeout else outbox.get_nowait()
        except queue_mod.Empty:
            for p in procs:
                if not p.is_alive() and p.exitcode not in (0, None):
                    raise RuntimeError(f"a summing worker died (exit code {p.exitcode})") from None
            return
        index, kind = msg[0], msg[1]
        if kind == "refused":
            raise PayloadRefused(msg[4], msg[2], msg[3])
        if kind == "failed":
            raise RuntimeError(f"a summing worker failed: {msg[3]}: {msg[4]}")
        partials[index] = (msg[2], msg[3])

    def put(i: int, item) -> None:
        while True:
            try:
                inboxes[i].put(item, timeout=_POLL_S)
                return
            except queue_mod.Full:
                receive(None)  # a worker that refused a payload stops taking more: find out why

    try:
        for i, item in enumerate(payloads):
            put(i % workers, item)
        for i in range(workers):
            put(i, None)
        while len(partials) < workers:
            receive(_POLL_S)
    finally:
        if len(partials) < workers:
            # A refused or failed sum leaves payloads queued for workers that stopped reading; each
            # queue's feeder thread would then block at interpreter exit, waiting to flush them.
            for q in (*inboxes, outbox):
                q.cancel_join_thread()
            for p in procs:
                if p.is_alive():
                    p.terminate()
        for p in procs:
            p.join(timeout=10)
        for q in (*inboxes, outbox):
            q.close()
    return [partials[i] for i in range(workers)]


# ---------------------------------------------------------------------------------------------------------------
# The server's running sum on all cores
# ---------------------------------------------------------------------------------------------------------------
_STOP = b"\0stop"
_PARTIAL = b""


def _pool_worker(params_dict: dict, public_context: bytes | None, conn, parent_pid: int) -> None:
    """One summing process of a :class:`ParallelCombiner`: check and add what it is sent, answer each."""
    _exit_with_parent(parent_pid)
    comb = _combiner(SessionParams.from_dict(params_dict), public_context)
    while True:
        try:
            msg = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if msg == _STOP:
            return
        if msg == _PARTIAL:
            conn.send(("partial", comb.partial(), comb.count))
            continue
        try:
            comb.add(msg)  # all-or-nothing: a refused payload leaves the running sum as it was
            conn.send(("ok",))
        except SecureAFLError as e:
            conn.send(("refused", e.reason, str(e)))
        except (TypeError, ValueError, KeyError) as e:
            conn.send(("refused", MalformedPayload.reason, f"unusable contribution: {type(e).__name__}"))


class WorkerLost(ServerBusy):
    """A summing process of a :class:`ParallelCombiner` stopped: its share of the running sum is gone.

    The pool takes nothing more; the owner rebuilds the sum from what it stored. Answered as ``busy``:
    the upload was not accepted and may be sent again.
    """


class ParallelCombiner:
    """A running sum spread over ``workers`` processes: up to W contributions checked and added at once.

    The server's upload path deserialises and checks every ciphertext before
    adding it, under the GIL: one process sums at one core's pace whatever the
    thread count. Here each worker process holds a running sum of its share
    of the contributions (one contribution's worth of memory, so O(W L) in all,
    not O(K L)); :meth:`add` hands a payload to an idle worker and blocks the
    calling thread, not the others, until that worker has added it or refused
    it (all-or-nothing, as :meth:`Combiner.add`). :meth:`aggregate` adds the W
    partial sums to the sum merged so far (:meth:`merge`, e.g. the stored
    uploads summed again after a restart) and seals the total.

    ckks/bfv: ciphertext addition is exact modular arithmetic, so the total is
    the serial fold's ciphertext bit for bit whatever worker added what.

    Thread-safe. Workers start on the first :meth:`add` (spawned interpreters:
    a session that never receives an upload starts none); ``workers=1`` adds
    in the calling process, one contribution at a time.
    """

    def __init__(self, params: SessionParams, *, public_context: bytes | None = None, workers: int = 2):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError("workers must be an int >= 1")
        self._params = params
        self._ctx = public_context
        self._workers = workers
        self._base = _combiner(params, public_context)
        self._lock = threading.Lock()
        self._idle: queue_mod.Queue | None = None
        self._conns: list = []
        self._procs: list = []
        self._added = 0
        self._lost: str | None = None

    @property
    def count(self) -> int:
        """Contributions in the sum: merged ones and those the workers accepted."""
        return self._base.count + self._added

    @property
    def sums_here(self) -> bool:
        """One worker: the fold runs in this process, so :meth:`add` may take what the caller's own check
        already opened (a backend's combiner that accepts it), where a summing worker needs the bytes."""
        return self._workers == 1

    @property
    def lost(self) -> str | None:
        """Why the pool stopped taking contributions (a worker died), or None."""
        return self._lost

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        for _ in range(self._workers):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_pool_worker, args=(self._params.to_dict(), self._ctx, child, os.getpid()),
                            daemon=True)
            p.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(p)
        self._idle = queue_mod.Queue()
        for i in range(self._workers):
            self._idle.put(i)

    def _call(self, i: int, msg: bytes):
        try:
            self._conns[i].send_bytes(msg)
            return self._conns[i].recv()
        except (EOFError, OSError, BrokenPipeError):
            self._lost = f"summing worker {i} stopped (exit code {self._procs[i].exitcode})"
            raise WorkerLost(f"{self._lost}; the server sums its stored uploads again, send this one again") \
                from None

    def add(self, payload: bytes) -> None:
        """Check ``payload`` and add it in a worker; raises the refusal (the sum unchanged) or :class:`WorkerLost`."""
        with self._lock:
            if self._lost:
                raise WorkerLost(self._lost)
            if self._workers == 1:  # no process to start for one: the fold runs here, one add at a time
                self._base.add(payload)
                return
            if self._idle is None:
                self._start()
        i = self._idle.get()
        try:
            answer = self._call(i, bytes(payload))
        finally:
            self._idle.put(i)
        if answer[0] == "refused":
            raise error_class(answer[1])(answer[2])
        with self._lock:
            self._added += 1

    def merge(self, body: bytes, count: int) -> None:
        """Add another combiner's partial sum of ``count`` contributions (not thread-safe with :meth:`aggregate`)."""
        self._base.merge(body, count)

    def aggregate(self) -> bytes:
        """The sealed total: every worker's partial merged into the base sum; the workers then stop.

        Call it once no :meth:`add` is in flight (the server waits for its uploads in flight first).
        """
        if self._lost:
            raise WorkerLost(self._lost)
        if self._idle is not None:
            held = [self._idle.get() for _ in range(self._workers)]  # every worker idle: nothing in flight
            try:
                for i in sorted(held):
                    answer = self._call(i, _PARTIAL)
                    self._base.merge(answer[1], answer[2])
            finally:
                self.shutdown()
        return self._base.aggregate()

    def shutdown(self) -> None:
        """Stop the workers (their partial sums are dropped)."""
        for conn in self._conns:
            try:
                conn.send_bytes(_STOP)
            except (OSError, BrokenPipeError):
                pass
        for p in self._procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []
        if self._idle is not None:
            self._lost = self._lost or "the pool was shut down"
