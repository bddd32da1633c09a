"""`secure-afl audit compare` decides by one rule, printed with its tolerance: its verdict never contradicts the
figures it prints, and an approximate release without a bound gets no verdict and not the security exit code."""

from __future__ import annotations

import re

import numpy as np
import pytest

from secure_afl.analytic import solve_from_sums
from secure_afl.cli import main
from secure_afl.clients.statsfile import write_statistics_file
from secure_afl.exceptions import EXIT_REFUSED, EXIT_SECURITY
from secure_afl.model_file import write_model
from secure_afl.stats import StatisticsAccumulator, SufficientStatistics

D, K = 24, 3  # d above the samples: C singular, so no certified bound


def _files(tmp_path):
    rng = np.random.default_rng(7)
    files, parts = [], []
    for h in ("h1", "h2", "h3"):
        X = rng.normal(size=(5, D))
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        acc = StatisticsAccumulator(D, K, max_norm=1.0)
        acc.update(X, np.arange(5) % K)
        s = acc.finalize(gamma=0.0)
        parts.append(s)
        files.append(write_statistics_file(tmp_path / f"{h}.npz", s, [f"c{i}" for i in range(K)]))
    C = sum(p.gram for p in parts)
    Q = sum(p.cross for p in parts)
    counts = sum(p.class_counts for p in parts)
    W = solve_from_sums(SufficientStatistics(C, Q, 15.0, counts, 3.0, 0.0), lam=0.0)
    return files, W, counts


def _model(path, W, counts, backend):
    write_model(path, W, {"session": "s", "params_digest": "00" * 32, "backend": backend, "gamma": 0.0,
                          "lambda": 0.0, "classes": K, "participants": ["h1", "h2", "h3"], "samples": 15,
                          "class_counts": [int(c) for c in counts]})


def _compare(capsys, model, files):
    rc = main(["audit", "compare", "--model", str(model), "--stats", *map(str, files)])
    return rc, capsys.readouterr().out


@pytest.mark.parametrize("scale", [0.0, 1e-15, 1e-3])
def test_the_verdict_is_the_printed_rule_on_the_printed_figures(tmp_path, capsys, scale):
    # Prepare: an exact release's W, moved by a relative amount from none to far beyond rounding
    files, W, counts = _files(tmp_path)
    rng = np.random.default_rng(1)
    moved = W + scale * np.linalg.norm(W) * rng.normal(size=W.shape) / np.sqrt(W.size)
    _model(tmp_path / "m.safetensors", moved, counts, "split")

    # Execute
    rc, out = _compare(capsys, tmp_path / "m.safetensors", files)

    # Assert: the printed error against the printed tolerance gives the printed verdict and the exit code
    err = float(re.search(r"^W relative error against the plaintext solve: (\S+)$", out, re.M).group(1))
    tol = float(re.search(r"^tolerance: (\S+) \(no certified bound", out, re.M).group(1))
    if err <= tol:
        assert rc == 0 and f"equal: W relative error {err:.3g} <= tolerance {tol:.3g}" in out
    else:
        assert rc == EXIT_SECURITY and f"NOT EQUAL: W relative error {err:.3g} > tolerance {tol:.3g}" in out
    assert (rc == 0) == (scale != 1e-3)


def test_a_ckks_release_without_a_bound_gets_no_verdict_and_not_the_security_code(tmp_path, capsys):
    # Prepare: a flooded-looking W (relative noise 1e-6) of a ckks release of a singular C
    files, W, counts = _files(tmp_path)
    noisy = W + 1e-6 * np.linalg.norm(W) * np.random.default_rng(2).normal(size=W.shape) / np.sqrt(W.size)
    _model(tmp_path / "m.safetensors", noisy, counts, "ckks")

    # Execute
    rc, out = _compare(capsys, tmp_path / "m.safetensors", files)

    # Assert
    assert rc == EXIT_REFUSED and rc != EXIT_SECURITY
    assert "tolerance: none (the release added noise" in out and out.rstrip().splitlines()[-1].startswith(
        "NO VERDICT: an approximate release without a certified bound")
