"""Noise shares and the session parameters that make room for them.

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
contribution is bounded; :func:`dp_session_params` pads the declared n_max by
that tail (over min(B^2, 1), the least the per-hospital bound grows per unit of
n_max) so the ckks modulus and the no-wrap condition of the secagg / bfv lanes hold the
noisy sums.
"""

from __future__ import annotations

import math
import secrets

import numpy as np

from ..exceptions import BoundsExceeded, InvalidParameterError
from ..params import Bounds, SessionParams
from .mechanism import share_bound, share_std  # noqa: F401  (their home is mechanism)
from .mechanism import (MECHANISMS, SKELLAM_SHARE_STEPS, TAIL, DPSpec, grid_bits, dp_config, noise_multiplier_for, noised_entries,
                        sensitivity)
from secure_afl.backends import HE_BACKENDS, he_module
from secure_afl.backends.secagg import secagg_session_params
from secure_afl.hazmat.fixedpoint import choose_frac_bits

__all__ = ["share_std", "share_bound", "noise_share", "add_noise_share", "dp_session_params", "padded_bounds"]


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


def padded_bounds(bounds: Bounds, share_sd: float) -> Bounds:
    """Declared bounds with n_max raised so the per-hospital bound covers the noise tail."""
    grow = min(float(bounds.max_norm) ** 2, 1.0)
    return Bounds(bounds.max_norm, bounds.n_max + int(math.ceil(TAIL * share_sd / grow)) + 1, bounds.k_max)


def dp_session_params(spec: DPSpec | None, backend: str, session_id: str, layout, gamma: float, bounds: Bounds,
                      **backend_kw) -> SessionParams:
    """Session parameters for ``backend`` with the DP noise declared and room made for it.

    ``spec=None`` builds exactly the parameters without DP. The same call on the
    server and the key holder gives the same parameters (digest).
    """

    def build(b: Bounds, **kw) -> SessionParams:
        if backend == "plain":
            return SessionParams(session_id, "plain", layout, gamma, b)
        if backend in HE_BACKENDS or backend == "split":
            return he_module(backend).session_params(session_id, layout, gamma, b, **kw)
        return secagg_session_params(session_id, layout, gamma, b, **kw)

    if spec is None:
        return build(bounds, **backend_kw)
    if backend not in MECHANISMS:
        raise InvalidParameterError(f"differential privacy is not available for {backend} sessions; "
                                    f"use one of {sorted(MECHANISMS)}")
    if spec.min_contributors > bounds.k_max:
        raise InvalidParameterError(f"dp min_contributors={spec.min_contributors} exceeds k_max={bounds.k_max}")
    d2, _ = sensitivity(bounds, layout.dim)
    if MECHANISMS[backend] == "gaussian":
        cfg = dp_config(spec, backend, bounds, layout)
        return build(padded_bounds(bounds, cfg["sigma"] / math.sqrt(spec.min_contributors)), **backend_kw).with_dp(cfg)
    # grid 2^-f so that a share's noise is about SKELLAM_SHARE_STEPS steps (rounding << noise)
    z0 = spec.noise_multiplier or noise_multiplier_for(spec.epsilon, spec.delta)
    sd0 = z0 * d2 / math.sqrt(spec.min_contributors)
    f = max(0, int(math.floor(math.log2(SKELLAM_SHARE_STEPS / sd0))))
    cfg = dp_config(spec, backend, bounds, layout, frac_bits=f)
    pb = padded_bounds(bounds, cfg["sigma"] / math.sqrt(spec.min_contributors))
    if pb.hospital_bound(gamma) * 2.0 ** f + TAIL * SKELLAM_SHARE_STEPS * 2 >= 2.0 ** 53:
        raise InvalidParameterError("the declared bounds are too large for exact integer noise on the "
                                    "fixed-point grid; lower max_norm or n_max")
    # values on the grid 2^-f fill the high lane exactly (f1 = f); the low lane keeps its own width
    # (secagg and bfv share the two-lane encoding, so one grid serves both)
    params = build(pb, frac_bits=(f, choose_frac_bits(pb, gamma)[1]), **backend_kw).with_dp(cfg)
    if backend == "split":
        # a validity-proven upload (noise share included) must not wrap either: the low lane narrows to what
        # the proof's statement, widened by the noise bound, leaves; the grid (f1) stays the noise's
        from ..split.sizes import choose_frac_bits as proven_frac_bits
        params = build(pb, frac_bits=proven_frac_bits(params), **backend_kw).with_dp(cfg)
    return params
