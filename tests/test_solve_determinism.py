"""W is a deterministic function of the released statistics on one install: the solve pins BLAS to one thread,
so processes started with different OpenMP / OpenBLAS thread counts write the same bytes, on ill-conditioned
data where the minimum-norm path is taken (n < d, C singular) and on the DP path's PSD repair."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

_SOLVE = r"""
import hashlib, sys
import numpy as np
from secure_afl.analytic import solve_from_sums
from secure_afl.stats import SufficientStatistics

from threadpoolctl import threadpool_limits

d, n, classes = 512, 453, 10
rng = np.random.default_rng(7)
X = rng.standard_normal((n, d)) * np.logspace(0, -3, d)
y = rng.integers(0, classes, n)
Y = np.eye(classes)[y]
with threadpool_limits(limits=1):  # the released statistics are exact: the same input bytes in every process
    gram, cross = X.T @ X, X.T @ Y
stats = SufficientStatistics(gram + 3 * np.eye(d), cross, float(n), Y.sum(axis=0), 3.0, 1.0)
W = solve_from_sums(stats)
if sys.argv[1] == "dp":
    from secure_afl.dp.solve import psd_repair
    W = np.concatenate([W.ravel(), psd_repair(gram - 1e-3 * np.eye(d)).ravel()])
print(hashlib.sha256(np.ascontiguousarray(W).tobytes()).hexdigest())
"""


def _solve_in_process(threads: int, what: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads),
           "MKL_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, "-c", _SOLVE, what], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.e2e
@pytest.mark.parametrize("what", ["solve", "dp"])
def test_the_solve_gives_the_same_bytes_whatever_the_thread_count(what):
    # Prepare: C = X^T X singular (453 rows, d = 512), spread over three decades
    # Execute: the same solve in processes started with 1, 2 and 4 BLAS threads
    digests = {t: _solve_in_process(t, what) for t in (1, 2, 4)}
    # Assert: one W
    assert len(set(digests.values())) == 1, digests
