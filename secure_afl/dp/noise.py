"""Noise shares (the session parameters that make room for them: :mod:`secure_afl.backends.session_params`).

Each hospital adds its share of the session's noise to its packed statistics
before protecting them, so nobody (server, key holder, a peer) ever sees the
noise-free sum. With t = ``min_contributors`` each share has 1/t of the
declared variance sigma^2: K >= t surviving shares sum to variance
(K / t) sigma^2 >= sigma^2, whichever hospitals dropped out, and the key holder
accounts the release at the noise actually summed (:func:`release_rdp`).

* gaussian (plain, ckks): N(0, sigma^2 / t) per entry, float64;
* skellam (secagg, bfv, split): Poisson(mu/t) - Poisson(mu/t) integers, placed on
  the fixed-point grid 2^-f *after* rounding the noised statistics to that
  grid, so the two-lane encoding these backends share carries exactly these
  integers in its high lane (checked: every value stays below 2^53, where
  float64 holds grid points exactly), and the exact sum -- in Z_(2^64) for
  secagg and split, modulo the BFV plaintext prime for bfv -- adds them exactly. The
  entries that are not noised (the contributor counter, the bfv tag slots)
  are left off the grid: the key holder checks the tags at the lanes' full
  precision.

A share entry beyond TAIL standard deviations is redrawn, so a noisy
contribution is bounded; :func:`secure_afl.backends.session_params.dp_session_params`
pads the declared n_max by that tail (over min(B^2, 1), the least the per-hospital bound grows per unit of
n_max) so the ckks modulus and the no-wrap condition of the secagg / bfv lanes hold the
noisy sums.
"""

from __future__ import annotations

import secrets

import numpy as np

from ..exceptions import BoundsExceeded, InvalidParameterError
from ..params import SessionParams
from .mechanism import share_bound, share_std  # noqa: F401  (their home is mechanism)
from .mechanism import TAIL, grid_bits, noised_entries

__all__ = ["share_std", "share_bound", "noise_share", "add_noise_share"]


def _rng(rng):
    # fresh OS entropy per share: a hospital's noise must not be predictable from anything public
    return rng if rng is not None else np.random.default_rng(secrets.randbits(128))


def noise_share(params: SessionParams, rng=None) -> np.ndarray:
    """One hospital's noise share over the whole packed layout (zero outside the noised entries).

    gaussian: float64 values; skellam: integers (as float64) in units of 2^-f.
    """
    dp = params.dp
    if dp is None:
        raise InvalidParameterError("the session has no differential privacy configured")
    rng = _rng(rng)
    sl = noised_entries(params.layout)
    m = sl.stop - sl.start
    out = np.zeros(params.layout.length, dtype=np.float64)
    if dp["mechanism"] == "gaussian":
        sd = share_std(params)
        draw = lambda k: rng.normal(0.0, sd, size=k)  # noqa: E731
    else:
        sd = share_std(params) * 2.0 ** grid_bits(params)
        lam = sd * sd / 2.0
        tau = share_bound(params)

        def draw(k):
            return (rng.poisson(lam, size=k) - rng.poisson(lam, size=k)).astype(np.float64)
    limit = TAIL * sd if dp["mechanism"] == "gaussian" else tau  # integers: the same cut, stated exactly
    z = draw(m)
    while True:
        far = np.abs(z) > limit
        if not far.any():
            break
        z[far] = draw(int(far.sum()))
    out[sl] = z
    return out


def add_noise_share(params: SessionParams, vector: np.ndarray, rng=None) -> np.ndarray:
    """The hospital's hook: its packed statistics plus its noise share (unchanged when DP is off)."""
    if params.dp is None:
        return vector
    share = noise_share(params, rng)
    if params.dp["mechanism"] == "gaussian":
        return vector + share
    f = grid_bits(params)
    sl = noised_entries(params.layout)
    out = np.array(vector, dtype=np.float64)
    grid = np.rint(np.ldexp(out[sl], f)) + share[sl]
    if grid.size and float(np.max(np.abs(grid))) >= 2.0 ** 53:
        raise BoundsExceeded("noisy statistics leave the exact float64 range of the fixed-point grid")
    out[sl] = np.ldexp(grid, -f)
    return out
