"""WorkerPool: the verifiers' spawned processes, kept for a session's later batches (secure_afl/workers.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from secure_afl.workers import WorkerPool
from support.pool_fns import burn_cpu, fail_on, mark_warm, pid_and_square, was_warmed


def _run(pool, items, common=0):
    parts = pool.map_chunks(pid_and_square, common, items)
    return [p for p, _ in parts], [v for _, vals in parts for v in vals]


def test_a_pool_works_in_the_calling_process_until_its_workers_are_up():
    with WorkerPool(2, start_after=10) as pool:
        pids, values = _run(pool, range(6))
        assert pids == [os.getpid()] and values == [x * x for x in range(6)] and not pool.started
        # 12 items seen: the workers start, and this batch does not wait for them
        pids, values = _run(pool, range(6), common=1)
        assert values == [1 + x * x for x in range(6)]
        pool.start()  # waits until they are up
        pids, values = _run(pool, range(6), common=2)
        assert pool.started and os.getpid() not in pids and len(pids) == 2  # two chunks, in the workers
        assert values == [2 + x * x for x in range(6)]  # chunk order kept


def test_a_pool_starts_its_workers_once_its_batches_cost_the_calling_thread_start_after_s_of_cpu():
    # Prepare: an item count that is never reached; 0.2 s of the caller's CPU is
    with WorkerPool(2, start_after=10**6, start_after_s=0.2) as pool:
        # Execute: cheap batches (microseconds of CPU), then one of 0.25 s
        for _ in range(3):
            _run(pool, range(6))
        cheap_launched = pool.launched
        pid, items = pool.map_chunks(burn_cpu, 0.25, [1, 2, 3])[0]
        # Assert: the cheap batches started nothing; the costly one ran here and started the workers as it
        # ended, not at the next batch (they come up while the caller waits for one)
        assert not cheap_launched
        assert pid == os.getpid() and items == [1, 2, 3] and pool.launched
        pool.start()
        pids, values = _run(pool, range(4))
        assert os.getpid() not in pids and values == [x * x for x in range(4)]


def test_the_workers_are_kept_between_batches_and_a_batch_is_spread_over_them():
    with WorkerPool(2) as pool:
        pool.start()
        seen = set()
        for batch in ([1, 2, 3, 4, 5], [6, 7], [8]):
            pids, values = _run(pool, batch)
            assert values == [x * x for x in batch] and len(pids) == min(2, len(batch))  # one chunk per worker
            seen.update(pids)
        # at most two processes served every batch: none was started again (which one takes a chunk is the
        # executor's choice)
        assert 1 <= len(seen) <= 2 and os.getpid() not in seen


def test_warm_runs_in_each_worker_before_its_first_batch():
    with WorkerPool(2, warm=mark_warm) as pool:
        pool.start()
        assert [w for part in pool.map_chunks(was_warmed, None, [1, 2]) for w in part] == [True, True]


def test_a_chunks_exception_is_raised_to_the_caller_and_the_pool_still_serves():
    with WorkerPool(2) as pool:
        pool.start()
        with pytest.raises(ValueError, match="item 3 refused"):
            pool.map_chunks(fail_on, 3, [1, 2, 3, 4])
        assert [x for part in pool.map_chunks(fail_on, 9, [1, 2, 3, 4]) for x in part] == [1, 2, 3, 4]


@pytest.mark.e2e
def test_workers_leave_when_their_parent_is_killed(tmp_path):
    # a verifier killed without a shutdown (SIGKILL, a crash) must not leave its workers running
    script = ("import os, sys; sys.path.insert(0, %r)\n"
              "from secure_afl.workers import WorkerPool\n"
              "from support.pool_fns import pid_and_square\n"
              "pool = WorkerPool(2)\n"
              "pool.start()\n"
              "print(' '.join(str(p) for p, _ in pool.map_chunks(pid_and_square, 0, [1, 2])), flush=True)\n"
              "os.kill(os.getpid(), 9)\n") % os.path.dirname(__file__)
    out = tmp_path / "pids"
    with open(out, "w") as fh:  # a file, not a pipe: orphaned workers would hold a pipe open
        subprocess.run([sys.executable, "-c", script], stdout=fh, stderr=subprocess.STDOUT, timeout=120)
    pids = [int(p) for p in out.read_text().split()]
    assert len(pids) == 2, out.read_text()
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def test_close_returns_and_its_workers_leave():
    # a key holder closes its pool before its share leaves: the workers (opened seeds in memory) must go, and
    # the release does not wait for their interpreters to finish
    pool = WorkerPool(2)
    pool.start()
    pids, _ = _run(pool, [1, 2])
    assert len(pids) == 2 and os.getpid() not in pids
    pool.close()
    assert not pool.launched
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)
    pids, values = _run(pool, [3])  # a later batch runs (here, until the workers are up again)
    assert values == [9]
    pool.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_workers_must_be_a_positive_int():
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError):
            WorkerPool(bad)
