"""Session parameters for any backend, with the DP noise declared and room made for it (the one derivation
every party runs: :meth:`secure_afl.session.definition.SessionDefinition.session_params`).

Here, above both the backends and :mod:`secure_afl.dp`: it needs each backend's parameters and the
mechanism's noise sizes.
"""

from __future__ import annotations

import math

from ..dp.mechanism import MECHANISMS, SKELLAM_SHARE_STEPS, TAIL, DPSpec, dp_config, noise_multiplier_for, sensitivity
from ..exceptions import InvalidParameterError
from ..hazmat.fixedpoint import choose_frac_bits
from ..params import HE_BACKENDS, Bounds, SessionParams
from ..secagg import secagg_session_params
from . import he_module

__all__ = ["dp_session_params", "padded_bounds"]


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

    if backend == "split":
        # the field and the Gram statement a split session runs under, what is not given filled in by the one rule
        from ..split.sizes import split_choice

        backend_kw = {**backend_kw, **split_choice(backend_kw.get("field"), backend_kw.get("gram_proof"))}
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
