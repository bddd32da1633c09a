"""BLAS on one thread for the duration of a block, counted across the threads of one process.

Two users need it. The split projection: each product is too small to share, and a BLAS pool per process
spinning on every core multiplied a hospital's CPU time on a many-core machine. The solve of W: a symmetric
eigendecomposition's blocked reductions sum in an order that depends on the thread count, so on a singular
Gram (n < d) the minimum-norm W moved by 1e-8 relative between a one- and a two-thread process. On one thread
W is a deterministic function of the released statistics on a given install, whatever the machine's core count
or OMP_NUM_THREADS / OPENBLAS_NUM_THREADS, which is what lets the exact backends agree bit for bit and an auditor
recompute W bit for bit.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

__all__ = ["one_blas_thread"]

_lock = threading.Lock()
_state: dict = {"users": 0, "limit": None, "controller": None}


@contextmanager
def one_blas_thread():
    """BLAS (and the LAPACK built on it) on one thread inside the block; the process's own setting comes back
    when the last thread inside leaves."""
    from threadpoolctl import ThreadpoolController

    with _lock:
        if _state["users"] == 0:
            if _state["controller"] is None:
                _state["controller"] = ThreadpoolController()
            _state["limit"] = _state["controller"].limit(limits=1, user_api="blas")
        _state["users"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["users"] -= 1
            if _state["users"] == 0:
                _state["limit"].restore_original_limits()
