"""The parallel sum (secure_afl/parallel.py): real worker processes, real TenSEAL ciphertexts.

ckks and bfv sums are exact modular arithmetic, so any split must give the serial
ciphertext bit for bit; plain float64 sums may differ in the last bits when W > 1
(the order of additions changes) and must equal the serial fold when W = 1.
"""

from __future__ import annotations

import numpy as np
import pytest

from secure_afl.backends import get_backend
from secure_afl.backends.bfv import new_bfv_session
from secure_afl.backends.ckks import new_ckks_session
from secure_afl.envelope import open_envelope
from secure_afl.packing import Layout
from secure_afl.parallel import PayloadRefused, sum_payloads
from secure_afl.params import Bounds, SessionParams

LAYOUT = Layout(6, 3)
BOUNDS = Bounds(max_norm=1.0, n_max=50, k_max=20)
K = 11  # not a multiple of the worker counts: shares of unequal size


def _vectors(params, k, seed=0):
    rng = np.random.default_rng(seed)
    h = params.bounds.hospital_bound(params.gamma)
    return [rng.uniform(-h, h, LAYOUT.length) * 10.0 ** rng.uniform(-12, 0, LAYOUT.length) for _ in range(k)]


def _serial(backend, payloads, ctx):
    comb = backend.combiner(public_context=ctx) if ctx is not None else backend.combiner()
    for p in payloads:
        comb.add(p)
    return comb.aggregate()


def _parallel(backend, payloads, ctx, workers):
    parts = sum_payloads(backend.params, ((f"h{i}", p) for i, p in enumerate(payloads)), public_context=ctx,
                         workers=workers, count=len(payloads))
    assert len(parts) == min(workers, len(payloads))
    comb = backend.combiner(public_context=ctx) if ctx is not None else backend.combiner()
    for body, n in parts:
        comb.merge(body, n)
    assert comb.count == len(payloads)
    return comb.aggregate()


@pytest.fixture(scope="module")
def plain():
    params = SessionParams("par-plain", "plain", LAYOUT, 1.0, BOUNDS)
    be = get_backend(params)
    return be, [be.protect(v) for v in _vectors(params, K)], None


@pytest.fixture(scope="module", params=["ckks", "bfv"])
def he(request):
    make = new_ckks_session if request.param == "ckks" else new_bfv_session
    params, keys = make(f"par-{request.param}", LAYOUT, 1.0, BOUNDS)
    be = get_backend(params)
    pub = keys.public_context
    return be, [be.protect(v, public_context=pub) for v in _vectors(params, K, seed=1)], pub


def test_plain_one_worker_is_the_serial_fold_bit_for_bit(plain):
    be, payloads, _ = plain
    assert _parallel(be, payloads, None, 1) == _serial(be, payloads, None)


def test_plain_two_workers_within_the_float64_summation_bound(plain):
    from fractions import Fraction

    be, payloads, _ = plain
    rows = [np.frombuffer(open_envelope(be.params, p, "contribution").body, "<f8") for p in payloads]
    exact = np.array([float(sum(Fraction(float(x)) for x in col)) for col in zip(*rows)])
    magnitude = np.sum(np.abs(rows), axis=0)
    par = be.reveal(_parallel(be, payloads, None, 2))
    assert np.all(np.abs(par - exact) <= K * 2.0 ** -53 * magnitude)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_he_sum_is_the_serial_ciphertext_bit_for_bit(he, workers):
    be, payloads, pub = he
    assert _parallel(be, payloads, pub, workers) == _serial(be, payloads, pub)


def test_more_workers_than_payloads_leaves_none_idle(plain):
    be, payloads, _ = plain
    parts = sum_payloads(be.params, (("h", p) for p in payloads[:2]), workers=8, count=2)
    assert [n for _, n in parts] == [1, 1]


def _bad_payloads(be, payloads, pub):
    """Payload 5 is the wrong kind of envelope (an aggregate, not a contribution); the rest are honest."""
    agg = _serial(be, payloads[:2], pub)
    return payloads[:5] + [agg] + payloads[5:]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_refused_payload_stops_the_sum_and_is_named(he, workers):
    be, payloads, pub = he
    bad = _bad_payloads(be, payloads, pub)
    with pytest.raises(PayloadRefused) as e:
        sum_payloads(be.params, ((f"h{i}", p) for i, p in enumerate(bad)), public_context=pub,
                     workers=workers, count=len(bad))
    assert e.value.label == "h5" and e.value.cause == "MalformedPayload"  # wrong envelope kind


def test_plain_bounds_are_checked_for_every_payload_in_a_worker(plain):
    be, payloads, _ = plain
    from secure_afl.envelope import seal

    over = np.zeros(LAYOUT.length)
    over[3] = 2 * be.params.bounds.hospital_bound(be.params.gamma)
    bad = payloads[:7] + [seal(be.params, "contribution", over.astype("<f8").tobytes())] + payloads[7:]
    with pytest.raises(PayloadRefused) as e:
        sum_payloads(be.params, ((f"h{i}", p) for i, p in enumerate(bad)), workers=2, count=len(bad))
    assert e.value.label == "h7" and e.value.cause == "BoundsExceeded"


def _tampered_partial_refused(be, payloads, pub):
    from secure_afl.exceptions import SecureAFLError

    (body, n), = sum_payloads(be.params, (("h", p) for p in payloads[:3]), public_context=pub, workers=1)
    comb = be.combiner(public_context=pub) if pub is not None else be.combiner()
    with pytest.raises(SecureAFLError):
        comb.merge(body[:-7], n)
    assert comb.count == 0


def test_a_merge_of_a_truncated_plain_partial_is_refused(plain):
    _tampered_partial_refused(*plain)


def test_a_merge_of_a_truncated_he_partial_is_refused(he):
    _tampered_partial_refused(*he)


# A child interpreter that sums payloads of ~176 KB each (more than a pipe buffer) with two workers.
_CHILD = r"""
import sys, threading, multiprocessing as mp
import numpy as np
from secure_afl.backends import get_backend
from secure_afl.envelope import seal
from secure_afl.packing import Layout
from secure_afl.params import Bounds, SessionParams
from secure_afl.parallel import PayloadRefused, sum_payloads

layout = Layout(200, 10)
params = SessionParams("par-exit", "plain", layout, 1.0, Bounds(max_norm=1.0, n_max=50, k_max=40))
be = get_backend(params)
honest = be.protect(np.zeros(layout.length))
over = np.zeros(layout.length)
over[0] = 2 * params.bounds.hospital_bound(params.gamma)
bad = seal(params, "contribution", over.astype("<f8").tobytes())

def refused_first():
    yield "h0", bad
    for i in range(1, 40):
        yield f"h{i}", honest

def stalls():
    yield "h0", honest
    yield "h1", honest
    print(" ".join(str(p.pid) for p in mp.active_children()), flush=True)
    threading.Event().wait()
    yield "never", honest

if sys.argv[1] == "refused":
    try:
        sum_payloads(params, refused_first(), workers=2, count=40)
    except PayloadRefused as e:
        print("refused", e.label, flush=True)
else:
    sum_payloads(params, stalls(), workers=2, count=40)
"""


def _child(mode: str):
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-c", _CHILD, mode], stdout=subprocess.PIPE, text=True)


@pytest.mark.e2e
def test_a_refused_sum_leaves_nothing_that_blocks_interpreter_exit():
    import subprocess

    child = _child("refused")
    try:
        out, _ = child.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail("the interpreter did not exit after a refused sum (queued payloads held it)")
    assert out.split() == ["refused", "h0"] and child.returncode == 0


@pytest.mark.e2e
def test_workers_exit_when_the_summing_process_is_killed():
    import time
    from pathlib import Path

    child = _child("stall")
    try:
        pids = [int(p) for p in child.stdout.readline().split()]
        assert len(pids) == 2, "the child did not report its two workers"
    finally:
        child.kill()
        child.wait(timeout=30)

    def running(pid):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            return False
        return "\nState:\tZ" not in status

    deadline = time.monotonic() + 30
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)  # polling a process table, not synchronising with a peer
    alive = [p for p in pids if running(p)]
    for p in alive:
        import os
        import signal

        os.kill(p, signal.SIGKILL)
    assert not alive, f"summing workers {alive} outlived the killed parent"


# ---------------------------------------------------------------------------------------------------------------
# ParallelCombiner: the server's running sum in worker processes
# ---------------------------------------------------------------------------------------------------------------
def _pooled(be, ctx, workers):
    from secure_afl.parallel import ParallelCombiner

    return ParallelCombiner(be.params, public_context=ctx, workers=workers)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_pooled_sum_from_concurrent_threads_is_the_serial_ciphertext(he, workers):
    from concurrent.futures import ThreadPoolExecutor

    # Prepare
    be, payloads, ctx = he
    comb = _pooled(be, ctx, workers)

    # Execute: every payload added from its own thread, up to six at once
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(comb.add, payloads))

    # Assert
    assert comb.count == K
    assert comb.aggregate() == _serial(be, payloads, ctx)


def test_pooled_sum_merges_what_was_summed_before_it(he):
    # Prepare: the first five summed elsewhere (a restart's re-sum of the stored uploads), the rest pooled
    be, payloads, ctx = he
    before = sum_payloads(be.params, ((str(i), p) for i, p in enumerate(payloads[:5])), public_context=ctx,
                          workers=1)
    comb = _pooled(be, ctx, 2)
    for body, n in before:
        comb.merge(body, n)

    # Execute
    for p in payloads[5:]:
        comb.add(p)

    # Assert
    assert comb.count == K and comb.aggregate() == _serial(be, payloads, ctx)


@pytest.mark.security
def test_pooled_sum_refuses_a_tampered_ciphertext_and_keeps_the_rest(he):
    from secure_afl.exceptions import SecureAFLError

    # Prepare: one payload with a flipped byte inside its ciphertext
    be, payloads, ctx = he
    bad = bytearray(payloads[3])
    bad[len(bad) // 2] ^= 0x40
    comb = _pooled(be, ctx, 2)

    # Execute
    for p in payloads[:3]:
        comb.add(p)
    with pytest.raises(SecureAFLError) as refused:
        comb.add(bytes(bad))
    for p in payloads[3:]:
        comb.add(p)

    # Assert: the refusal names a reason, and the sum is exactly the K good payloads
    assert refused.value.reason != "error"
    assert comb.count == K and comb.aggregate() == _serial(be, payloads, ctx)


def test_a_lost_worker_stops_the_pool_with_a_retryable_refusal(he):
    import os
    import signal

    from secure_afl.parallel import WorkerLost

    # Prepare: a pool with both workers started
    be, payloads, ctx = he
    comb = _pooled(be, ctx, 2)
    comb.add(payloads[0])
    comb.add(payloads[1])

    # Execute: one worker is killed
    os.kill(comb._procs[0].pid, signal.SIGKILL)
    comb._procs[0].join(timeout=30)
    with pytest.raises(WorkerLost):
        for p in payloads[2:]:  # bounded: at most K - 2 adds before the dead worker is picked
            comb.add(p)

    # Assert: nothing more is taken, and the error is the 'busy' a client sends again after
    assert comb.lost and WorkerLost.reason == "busy" and WorkerLost.http_status == 429
    with pytest.raises(WorkerLost):
        comb.add(payloads[-1])
    with pytest.raises(WorkerLost):
        comb.aggregate()
    comb.shutdown()


def test_bench_combine_reports_each_worker_count_and_one_aggregate(capsys):
    from secure_afl.cli import main

    # Execute: the benchmark command on a small layout
    rc = main(["bench", "combine", "--dim", "6", "--classes", "3", "--uploads", "9", "--k-max", "20",
               "--workers", "1", "2", "--distinct", "2"])

    # Assert: both counts timed, and their aggregates compared (the exit code says they matched)
    out = capsys.readouterr().out
    assert rc == 0 and "1 summing process(es)" in out and "2 summing process(es)" in out
    assert "same aggregate ciphertext for every count: True" in out
