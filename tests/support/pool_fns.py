"""Module-level functions for tests/test_workers.py (a spawned worker imports its function by name)."""

import os


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
