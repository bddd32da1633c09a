"""Module-level functions for tests/test_workers.py (a spawned worker imports its function by name)."""

import os
import time


def pid_and_square(common, chunk):
    return os.getpid(), [common + x * x for x in chunk]


def fail_on(common, chunk):
    if common in chunk:
        raise ValueError(f"item {common} refused")
    return chunk


_warmed = []


def mark_warm():
    _warmed.append(os.getpid())


def was_warmed(common, chunk):
    return [os.getpid() in _warmed for _ in chunk]


def burn_cpu(seconds, chunk):
    """This thread's CPU for ``seconds`` (its own clock, so the same whatever else runs), then its pid."""
    t0 = time.thread_time()
    while time.thread_time() - t0 < seconds:
        pass
    return os.getpid(), list(chunk)
