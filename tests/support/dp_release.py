"""Checks of a DP release of four hospitals (gamma 1 each), shared by the DP end-to-end tests of every backend."""

from __future__ import annotations

import numpy as np

from secure_afl.analytic import solve_from_sums, solve_head
from secure_afl.dp import psd_repair
from secure_afl.dp.solve import calibrated_ridge

RI = 4.0  # the ridge-identity term four hospitals of gamma 1 put on the Gram's diagonal


def check_four_share_noise(res, truth) -> float:
    """Assert that the released Gram (upper triangle, past ``truth`` and the RI term) and cross carry the noise of
    four shares of sigma^2 / 3, and return that standard deviation, sigma sqrt(4 / 3)."""
    dim = truth.gram.shape[0]
    iu = np.triu_indices(dim)
    resid = np.concatenate([(res.stats.gram - truth.gram - RI * np.eye(dim))[iu],
                            (res.stats.cross - truth.cross).ravel()])
    expected_sd = res.report["dp"]["sigma"] * np.sqrt(4 / 3)
    assert 0.5 < resid.std() / expected_sd < 1.6  # 39 entries: the ratio's 1e-6 two-sided range is (0.45, 1.75)
    return expected_sd


def check_noisy_solve(res, expected_sd: float) -> None:
    """Assert the collector's solve: PSD repair of the released Gram plus the calibrated ridge beyond the RI term,
    never RI restoration (which would solve the noisy sums as if they were exact)."""
    dim = res.stats.gram.shape[0]
    lam = calibrated_ridge(expected_sd, dim, 0.01)
    W_expected = solve_head(psd_repair(res.stats.gram), res.stats.cross, lam=max(0.0, lam - RI))
    assert np.allclose(res.W, W_expected, rtol=1e-9, atol=1e-12)
    W_ri = solve_from_sums(res.stats)
    assert np.linalg.norm(res.W - W_ri) > 1e-3 * np.linalg.norm(W_ri)
