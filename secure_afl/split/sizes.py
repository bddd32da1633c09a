"""split's settings: the proof's constants, the sizes a session's statement takes, and the fixed-point scale
that keeps every proven lane sum below ``2^WRAP_BITS < p/2`` (docs/VALIDITY.md).

Everything here is a function of the signed :class:`~secure_afl.params.SessionParams`: the hospital, the
server and the key holder derive the same sizes, and so the same statement, from the same parameters.
"""

from __future__ import annotations

import math

import numpy as np

from ..exceptions import InvalidParameterError
from ..hazmat import fixedpoint
from ..hazmat.fields import field_named
from ..hazmat.flp import P as P_FIELD
from ..packing import Layout
from ..params import Bounds, SessionParams

__all__ = ["FIELD_KEY", "DEFAULT_FIELD", "DEFAULT_GRAM_PROOF", "UNSIGNED_SPLIT", "split_choice", "field_of", "lanes_per_value", "main_words", "wrap_bits", "proof_scale", "REPS", "MAX_REPS", "SOUNDNESS_BITS", "LINEAR_REPS", "ROWS", "TAIL", "WRAP_BITS", "RETRIES", "GRAM_KEY", "GRAM_RHOS", "GRAM_QUERIES",
           "GRAM_MIN_F", "NOISE_L2_TAIL_BITS", "noise_l2_bound", "PROCESS_MIN_UPLOADS", "VERIFIER_WORKERS", "ADVISORY_CHECKS", "gram_enabled", "noise_beside", "noise_bound",
           "statement_sizes",
           "fits", "choose_frac_bits", "split_session_params", "session_params", "expected_abs_error",
           "proven_aggregate_bound", "psd_tolerance"]

#: repetitions of the bit proof (independent joint randomness and query point); a circuit whose bit vector is
#: long enough to need more for SOUNDNESS_BITS takes more (:attr:`secure_afl.split.proof.Circuit.reps`)
REPS = 3
#: the most repetitions a circuit takes before its session is refused
MAX_REPS = 8
#: the validity soundness every signable split session reaches: an invalid upload is accepted with probability
#: at most 2^-SOUNDNESS_BITS against a prover making 2^64 hash queries
SOUNDNESS_BITS = 64
#: independent random linear combinations of the affine relations (each misses a false one w.p. 1/p)
LINEAR_REPS = 2
#: projection rows per lane
ROWS = 130
#: projection threshold in units of the honest l2 bound
TAIL = 6
#: every lane sum of k_max proven uploads, and every integer relation, stays below 2^WRAP_BITS < p/2
WRAP_BITS = 62
#: fresh seeds an honest hospital tries before its vector is taken as outside the l2 bound
RETRIES = 8
#: backend_params key of the Gram statement (docs/VALIDITY.md, "The Gram statement"); absent means off
GRAM_KEY = "gram_proof"
#: backend_params key naming the field the proof runs over (:data:`secure_afl.hazmat.flp.FIELD_NAMES`)
FIELD_KEY = "field"
#: the Gram statement a new split session signs unless it says ``gram_proof = false``: with it no hospital can set
#: W exactly (docs/VALIDITY.md, "The Gram statement")
DEFAULT_GRAM_PROOF = True
#: what a signed split definition WITHOUT these keys means: it was signed before every split session wrote them,
#: when the default was two Goldilocks lanes and no Gram statement; it keeps that meaning when read
UNSIGNED_SPLIT = {FIELD_KEY: "goldilocks", GRAM_KEY: False}
#: Fiat-Shamir vectors rho the quadratic identity is checked on (each misses a false one w.p. 2/p)
GRAM_RHOS = 3
#: independent square-sum proofs, each queried at its own point
GRAM_QUERIES = 2
#: fewest fractional bits of the factor: below, snapping the statistics onto L L^T would cost more than float32
GRAM_MIN_F = 12


#: the field a new split session signs unless it names one: Field128, whose one exact word per value keeps the
#: lanes exact under the Gram statement (the release is secagg's and bfv's bit for bit) and, under DP, bounds the
#: noise share by projection rows instead of per-entry bits (docs/VALIDITY.md, "The Gram statement with
#: differential privacy")
DEFAULT_FIELD = "field128"


def split_choice(field: str | None = None, gram_proof: bool | None = None) -> dict:
    """``{field, gram_proof}`` with what is not given (None) filled in by the defaults above: the one rule
    ``session sign``, the library's :func:`split_session_params` and :func:`~secure_afl.backends.session_params.
    dp_session_params` apply."""
    return {FIELD_KEY: DEFAULT_FIELD if field is None else str(field),
            GRAM_KEY: DEFAULT_GRAM_PROOF if gram_proof is None else bool(gram_proof)}


def field_of(params: SessionParams):
    """The field object the session's signed parameters name (:func:`secure_afl.hazmat.flp.field_named`): a
    session signed before the field was part of them is refused by name."""
    return field_named(params.backend_params.get(FIELD_KEY))


def lanes_per_value(params: SessionParams) -> int:
    """Field words per packed value: two Goldilocks lanes (``hi``, ``lo``, each summed on its own), or ONE
    Field128 word holding the integer ``hi 2^f2 + lo`` that secagg and bfv sum (``round(v 2^(f1 + f2))``), so
    the released sum is theirs bit for bit. secagg's scale keeps an honest sum of k_max below ``2^(117 - log2
    k_max)``; the statement's projection bounds a proven word by ``2T < 2^(f1 + f2 + log2(honest l2) + 5)``,
    and :func:`fits` checks k_max of those below ``2^126``."""
    return 2 if field_of(params).P.bit_length() <= 64 else 1


def main_words(params: SessionParams) -> int:
    """The summed part of an upload: ``lanes_per_value * L`` field words."""
    return lanes_per_value(params) * params.layout.length


def wrap_bits(params: SessionParams) -> int:
    """Every proven lane sum and integer relation stays below ``2^wrap_bits < p/2``: 62 in Goldilocks
    (p > 2^63.99), 126 in Field128 (p > 2^127.99)."""
    return field_of(params).P.bit_length() - 2


def proof_scale(params: SessionParams, f1: int, f2: int) -> tuple[int, int]:
    """The ``(f1, f2)`` the statement reads its lanes at: the session's own with two lanes; ``(f1 + f2, 0)``
    with one word per value (the word is the value at scale ``2^(f1 + f2)``, and no low lane is left)."""
    return (int(f1), int(f2)) if lanes_per_value(params) == 2 else (int(f1) + int(f2), 0)


def gram_enabled(params: SessionParams) -> bool:
    return bool(params.backend_params.get(GRAM_KEY))


def noise_beside(params: SessionParams) -> bool:
    """Whether an upload carries its DP noise share beside its statistics (DP with the Gram statement): the
    hospital then hands the statistics BEFORE the noise to the backend, which draws and proves the share."""
    return params.backend == "split" and params.dp is not None and gram_enabled(params)


def gram_rounding(params: SessionParams, f: int) -> float:
    """Twice the bound E on how far the rounded first block column can push the Schur complement below gamma I
    (docs/VALIDITY.md), E = 2^-f (4 B^2 + 2 sqrt(2 d) B) sqrt(C n_max) + C d 2^-2f."""
    b, lay = params.bounds, params.layout
    B, d, C = float(b.max_norm), lay.dim, lay.n_classes
    return 2 * (2.0 ** -f * (4 * B * B + 2 * math.sqrt(2 * d) * B) * math.sqrt(C * b.n_max) + C * d * 2.0 ** (-2 * f))


def gram_jitter(params: SessionParams, f: int) -> float:
    """The diagonal the honest factorisation adds (0 when gamma covers it)."""
    return max(0.0, gram_rounding(params, f) - params.gamma)


def gramsizes(params: SessionParams, f1: int) -> dict:
    """The factor's scale f = floor(f1 / 2) (A at 2^f1 = 2^t 2^2f), its words, and the bit widths of its range
    proof (m_f) and of the count slack (m_d)."""
    b, lay = params.bounds, params.layout
    d, C = lay.dim, lay.n_classes
    f = max(f1, 0) // 2
    jitter = gram_jitter(params, f)
    # ||L||_F^2 = trace(L L^T) <= trace(C^r) + d jitter + n <= n_max B^2 + d gamma + d jitter + n_max; the
    # factor is rounded towards zero, so its integer entries are no larger than the real ones
    l2 = math.sqrt(b.n_max * float(b.max_norm) ** 2 + d * (params.gamma + jitter) + b.n_max) * (1 + 2.0 ** -30)
    m_f = pow2_at_least(TAIL * (2.0 ** f * l2 + 1.0)) + 1
    out = {"f": f, "t": max(f1, 0) - 2 * f, "m": d + C, "n_f": C + d * C + d * (d + 1) // 2, "m_f": m_f,
           "m_d": bitlen(2 * (math.isqrt(b.n_max) + 1) << f), "jitter": jitter,
           "jitter_units": math.ceil(jitter * 2.0 ** max(f1, 0)), "n_z": 0, "m_z": 0, "z_log2": 0, "z_shift": 0,
           "noise_rows": False, "n_r": 0, "m_r": 0}
    if lanes_per_value(params) == 1 and params.dp is None:
        # one exact Field128 word per value: the lanes are NOT snapped; the residual R = 2^t (L L^T + D) - A
        # travels as words of its own (one per entry of A), each proven within 2T_R by projection rows, so
        # A >= -||R||_op >= -m 2T_R (docs/VALIDITY.md, "Exact lanes over Field128"). ||R||_F in released units:
        # the truncation, 2 ||L||_F ||E||_F + ||E||_F^2 with |E_ij| < 2^-f over n_f entries, plus the float64
        # Cholesky's backward error, (m + 1) u / (1 - (m + 1) u) ||L||_F^2, plus the jitter on the diagonal
        e = 2.0 ** -f * math.sqrt(out["n_f"])
        u = (out["m"] + 1) * 2.0 ** -53
        r_l2 = (2 * l2 * e + e * e + u / (1 - u) * l2 * l2 + math.sqrt(d) * jitter) * (1 + 2.0 ** -30)
        out["n_r"] = out["n_f"]
        out["m_r"] = pow2_at_least(TAIL * (2.0 ** max(f1, 0) * r_l2 + 1.0)) + 1
        out["r_l2"] = r_l2
        #: the proven floor on each upload's least eigenvalue (released units): Gershgorin on |R_ij| <= 2T_R
        out["slack"] = out["m"] * 2.0 ** (out["m_r"] - max(f1, 0))
    if params.dp is not None:
        # the noise share travels beside the lanes as words on the noise grid 2^-grid (grid units; in the lanes it
        # sits at 2^z_shift within a word: 2^f2 over one Field128 word, 1 beside two lanes), and the Gram identity
        # is of the lanes less it. Each entry is proven below 2^z_log2: in Goldilocks by its m_z bits
        # ([-2^(m_z - 1), 2^(m_z - 1)) holds every honest |z| <= tau); in Field128 by ROWS projection rows of
        # their own, |<r_j, z>| < T_z = 2^(m_z - 1) >= TAIL sqrt(l2_z), so |z_i| <= 2 T_z, whose square times n_z
        # stays below p there (docs/VALIDITY.md, "The Gram statement with differential privacy")
        grid = _grid(params)
        out["n_z"] = noised_count(params)
        out["z_shift"] = max(f1, 0) - grid
        out["noise_rows"] = lanes_per_value(params) == 1
        # and its squared l2 norm proven at most l2_z: |z|^2 in G groups of z_len entries (each group's sum of
        # squares below p, so exact, and proven below 2^m_g), and l2_z - (sum of the groups) in m_l bits
        cap = bitlen(noise_bound(params, grid))
        if out["noise_rows"]:
            l2 = noise_l2_bound(params, grid, out["n_z"], NOISE_L2_TAIL_BITS + 1)
            out["m_z"] = pow2_at_least(TAIL * (math.sqrt(l2) + 1.0)) + 1
            # the rows bound an entry only by about 12 times the share's l2 norm; the groups are made small
            # enough that each one's proven squared norm, 2^m_g <= 2^(2 (cap + 1)), bounds every entry below
            # 2^(cap + 1) <= 4 tau (cap the bit length of tau; Goldilocks' bits give 2^cap <= 2 tau, at four
            # times the upload): no entry can carry the whole l2 budget
            out.update(noise_groups(params, grid, out["n_z"], out["m_z"], cap_log2=cap + 1))
            out["z_log2"] = min(out["m_z"], (out["m_g"] + 1) // 2)
        else:
            out["m_z"] = cap + 1
            out["z_log2"] = cap
            out.update(noise_groups(params, grid, out["n_z"], out["z_log2"]))
    return out


def _grid(params: SessionParams) -> int:
    """The DP noise grid's fractional bits (the session's f1)."""
    from ..dp.mechanism import grid_bits

    return grid_bits(params)


def noise_groups(params: SessionParams, f1: int, n_z: int, z_log2: int, cap_log2: int | None = None) -> dict:
    """The fewest groups G of the noise share whose squared norms are each exact in F_p (``z_len T_z^2 < p``) and
    whose proven bounds sum, with the total's slack, below p (``G 2^m_g + 2^m_l <= p``; ``|z_i| <= 2^z_log2`` is
    the proven per-entry bound, in grid units ``2^-f1``); each bound is what an
    honest group exceeds with probability at most ``2^-(NOISE_L2_TAIL_BITS + 1 + log2 G)``, the total's
    ``2^-(NOISE_L2_TAIL_BITS + 1)``: an honest share fails one with probability below ``2^-NOISE_L2_TAIL_BITS``.
    ``cap_log2``: also every group's bound at most ``2^(2 cap_log2)``, so that it bounds each of its entries below
    ``2^cap_log2``. G is found by doubling, then bisection (each test is monotone in G up to the tail's
    ``log2 G``; the G returned is checked)."""
    t2 = 1 << (2 * z_log2)
    P = field_of(params).P  # the session's field: a group's squared norm must be exact in it
    l2 = noise_l2_bound(params, f1, n_z, NOISE_L2_TAIL_BITS + 1)
    m_l = bitlen(l2)

    def grouping(groups: int) -> dict | None:
        z_len = -(-n_z // groups)
        m_g = bitlen(noise_l2_bound(params, f1, z_len, NOISE_L2_TAIL_BITS + 1 + math.ceil(math.log2(groups))))
        ok = z_len * t2 < P and (groups << m_g) + (1 << m_l) <= P and (cap_log2 is None or m_g <= 2 * cap_log2)
        return {"l2_z": l2, "m_l": m_l, "z_groups": groups, "z_len": z_len, "m_g": m_g} if ok else None

    hi = 1
    while grouping(hi) is None:
        if hi >= n_z:
            raise InvalidParameterError("no grouping of the noise share keeps its squared norm exact in the field")
        hi = min(2 * hi, n_z)
    lo = hi // 2  # infeasible (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if grouping(mid) is not None else (mid, hi)
    return grouping(hi)


#: an honest noise share exceeds its proven l2 bound with probability at most 2^-NOISE_L2_TAIL_BITS
NOISE_L2_TAIL_BITS = 40


def noise_l2_bound(params: SessionParams, f1: int, n: int | None = None, tail_bits: int = NOISE_L2_TAIL_BITS) -> int:
    """The bound on ``|z|^2`` (grid units squared) of ``n`` entries (default all) of one hospital's noise share
    ``z`` that an honest share exceeds with probability at most ``2^-tail_bits`` (docs/VALIDITY.md, "The noise
    share's l2 bound"): the Chernoff bound of the entries' own distribution, a Skellam of variance s^2 (grid
    units) redrawn beyond tau (:func:`secure_afl.dp.mechanism.share_square_tail`), rounded up with a relative
    2^-30 for the float64 evaluation."""
    from ..dp.mechanism import share_square_tail

    n = noised_count(params) if n is None else int(n)
    s = dp_share_std(params) * 2.0 ** f1
    t = share_square_tail(s, int(noise_bound(params, f1)), n, float(tail_bits))
    return int(math.ceil(t * (1 + 2.0 ** -30))) + 1


def bitlen(x: int) -> int:
    return max(1, int(x).bit_length())


def pow2_at_least(x: float) -> int:
    """Least m with 2^m >= x (x > 0), computed without trusting float rounding at the edge."""
    m = max(0, math.ceil(math.log2(x)))
    while 2.0 ** m < x:
        m += 1
    while m > 0 and 2.0 ** (m - 1) >= x:
        m -= 1
    return m


def honest_l2(params: SessionParams) -> float:
    """An upper bound on ||packed vector||_2 for any honest hospital (docs/VALIDITY.md):
    ||C^r||_F <= tr(C) + sqrt(d) gamma <= n B^2 + sqrt(d) gamma (C is PSD), ||Q||_F <= n B, ||(n, counts)|| <= sqrt2 n,
    plus the contributors slot; a relative 2^-30 covers the float64 rounding of the statistics."""
    b = params.bounds
    B, n, d = float(b.max_norm), float(b.n_max), params.layout.dim
    return (n * B * B + math.sqrt(d) * params.gamma + n * B + math.sqrt(2.0) * n + 1.0) * (1 + 2.0 ** -30)


def noise_bound(params: SessionParams, f1: int | None = None) -> int:
    """tau: the hard bound on |entry| of one hospital's DP noise share in units of 2^-f1 (0 without DP)."""
    if params.dp is None:
        return 0
    from ..dp.mechanism import share_bound

    return share_bound(params, f1)


def dp_share_std(params: SessionParams) -> float:
    """One hospital's noise share's standard deviation per entry (real units)."""
    from ..dp.mechanism import share_std

    return float(share_std(params))


def noised_count(params: SessionParams) -> int:
    from ..dp.mechanism import noised_entries

    sl = noised_entries(params.layout)
    return sl.stop - sl.start


def statement_sizes(params: SessionParams, f1: int, f2: int) -> dict:
    lay, b = params.layout, params.bounds
    L = lay.length
    # tau in the statement's units: grid units shifted to the statement's scale (2^f2 within one Field128 word)
    tau = noise_bound(params) << max(f1 - _grid(params), 0) if params.dp is not None else 0
    # a noise share adds at most sqrt(m) tau to the high lane's l2 norm (m noised entries; none in the low lane)
    noise_l2 = math.sqrt(noised_count(params)) * tau if tau else 0.0
    m_hi = pow2_at_least(TAIL * (2.0 ** f1 * honest_l2(params) + math.sqrt(L) / 2 + noise_l2)) + 1
    B2 = float(b.max_norm) ** 2
    c_B = math.ceil(2.0 ** f1 * B2 * (1 + 2.0 ** -30))
    c_0 = math.ceil(2.0 ** f1 * lay.dim * params.gamma * (1 + 2.0 ** -30)) + lay.dim
    if gram_enabled(params):
        gram = gramsizes(params, f1)
        c_0 += lay.dim * gram["jitter_units"]  # the factorisation's diagonal jitter (0 when gamma covers it)
    else:
        gram = None
    if params.dp is None:
        m_n = bitlen(b.n_max)
        slack_max = c_B * b.n_max + c_0
        return {"m_hi": m_hi, "m_n": m_n, "m_s": bitlen(slack_max), "c_B": c_B,
                "c_0": c_0, "slack_max": slack_max, "tau": 0, "gram": gram, "lanes": lanes_per_value(params)}
    # DP (docs/VALIDITY.md, "With differential privacy"): n and the counts are grid values shifted by tau; the
    # trace relation is taken times 2^g so that n (now a grid value) needs no division: g = f1 unless the
    # diagonal's sum, within the projection bound, times 2^g would come near 2^62 (c_B rounds up: the bound is
    # looser by 2^-g B^2-units per grid step of n)
    n_top = b.n_max * (1 << f1) + 2 * tau
    d, C = lay.dim, lay.n_classes
    g = f1
    while g > 0 and (d * ((1 << m_hi) + tau)) << g >= 1 << (wrap_bits(params) - 2):
        g -= 1
    c_B = math.ceil(2.0 ** g * B2 * (1 + 2.0 ** -30))
    trace_c = (1 << g) * (c_0 + 2 * d * tau)
    slack_max = c_B * n_top + trace_c
    return {"m_hi": m_hi, "m_n": bitlen(n_top),
            "m_s": bitlen(slack_max), "m_e": bitlen(2 * (C + 1) * tau), "c_B": c_B, "c_0": c_0,
            "slack_max": slack_max, "tau": tau, "n_top": n_top, "trace_c": trace_c, "e_top": 2 * (C + 1) * tau,
            "g": g, "gram": gram, "lanes": lanes_per_value(params)}


def fits(params: SessionParams, f1: int, f2: int) -> str | None:
    """None if (f1, f2) (the statement's scale, :func:`proof_scale`) keeps every proven lane sum and every
    relation below ``2^wrap_bits`` (:func:`wrap_bits`), else why not."""
    if f1 < 0:
        return "f1 < 0 (counts would not be integers in the hi lane)"
    s = statement_sizes(params, f1, f2)
    k, d = params.bounds.k_max, params.layout.dim
    wrap = 1 << wrap_bits(params)
    if k * (1 << s["m_hi"]) >= wrap:  # per entry |hi| <= 2T = 2^m_hi
        return "k_max * 2T_hi"
    if k * (1 << max(f2 - 1, 0)) >= wrap:  # honest low lanes, |lo| <= 2^(f2 - 1); a dishonest one cannot wrap hi
        return "k_max honest low lanes"
    g = s["gram"]
    # the quadratic identity A = 2^t (L L^T + D), entrywise: |A_ij| <= 2T (less a noise entry, |z| <= 2^(m_z - 1),
    # under DP), |(L L^T)_ij| <= m (2T_f)^2, D < 2^m_d; below p/2 the identity mod p is the identity over the
    # integers
    if g is not None and (1 << s["m_hi"]) + (g["n_z"] and 1 << (g["z_log2"] + g["z_shift"])) + \
            (g["n_r"] and 1 << g["m_r"]) + \
            ((g["m"] << (2 * g["m_f"])) + (1 << g["m_d"]) << g["t"]) >= wrap:
        return "the Gram identity"
    if g is not None and params.dp is None and g["f"] < GRAM_MIN_F:
        return "the Gram factor's scale"
    if g is not None and params.dp is not None and lanes_per_value(params) == 2 and \
            gram_rounding(params, g["f"]) > 2 * math.sqrt(params.layout.dim) * dp_share_std(params):
        # under DP the factor's scale is half the noise grid's, below GRAM_MIN_F: allowed while the rounding it
        # costs stays below the spectral spread one noise share has, 2 sqrt(d) sigma (docs/VALIDITY.md, "The Gram
        # statement with differential privacy")
        return "the Gram factor's scale (its rounding exceeds one noise share's spectral spread 2 sqrt(d) sigma)"
    if params.dp is not None:
        # every term of each DP relation is an integer of magnitude below these (a diagonal entry's through
        # the projection bound 2T): their sums stay below 2^62
        C = params.layout.n_classes
        if (s["c_B"] << s["m_n"]) + s["trace_c"] + ((d * ((1 << s["m_hi"]) + s["tau"])) << s["g"]) + \
                (1 << s["m_s"]) >= wrap:
            return "the trace relation"
        if (C + 2) * (1 << s["m_n"]) + 2 * s["tau"] + 2 * (1 << s["m_e"]) + s["e_top"] >= wrap:
            return "the count relations"
        return None
    # the diagonal entries enter the trace relation as they are, each within the projection bound 2T
    if d * (1 << s["m_hi"]) + s["slack_max"] + (1 << s["m_s"]) >= wrap:
        return "the trace relation"
    # n and the counts: 2^f1 times a value of m_n bits, and C of them summed, stay integers below p/2
    if (1 << (f1 + s["m_n"])) >= wrap or params.layout.n_classes * (1 << s["m_n"]) >= wrap:
        return "the count relations"
    return None


def choose_frac_bits(params: SessionParams) -> tuple[int, int]:
    """The largest ``(f1, f2)``, at most the plain no-wrap choice, under which a proven upload cannot wrap.

    With DP, f1 is the noise grid's (already in ``params``, :func:`secure_afl.backends.session_params.dp_session_params`) and
    only f2 is lowered: the noise shares are integers on the grid 2^-f1."""
    f1, f2 = fixedpoint.choose_frac_bits(params.bounds, params.gamma, min_frac_bits=0)
    if lanes_per_value(params) == 1:
        # one word per value: secagg's own scale, so the release is theirs bit for bit, lowered (f2 first) only
        # where k_max proven words would not fit below 2^126; under DP f1 is the noise grid's and f2 secagg's
        # below it (what dp_session_params gave)
        if params.dp is not None:
            f1, f2 = (int(v) for v in params.backend_params["frac_bits"])
        while f2 > 1 and fits(params, *proof_scale(params, f1, f2)) is not None:
            f2 -= 1
        why = fits(params, *proof_scale(params, f1, f2))
        if why is not None:
            raise InvalidParameterError(f"no fixed-point scale lets a validity-proven split upload stay below "
                                        f"2^{wrap_bits(params)} ({why}); lower `max_norm`, `n_max` or `k_max`")
        return f1, f2
    if params.dp is not None:
        f1 = int(params.backend_params["frac_bits"][0])
    else:
        while f1 >= 0 and fits(params, f1, 1) is not None:  # hi-lane and trace conditions depend on f1 only
            f1 -= 1
    while f2 > 1 and fits(params, max(f1, 0), f2) is not None:  # now only the lo-lane condition can fail
        f2 -= 1
    why = fits(params, f1, f2)
    if why is not None:
        # the Gram statement is on by default: a session it does not fit may sign it off instead
        off = "; or sign [split] gram_proof = false" if gram_enabled(params) and "Gram" in why else ""
        raise InvalidParameterError(f"no fixed-point scale lets a validity-proven split upload stay below "
                                    f"2^{WRAP_BITS} ({why}); lower `max_norm`, `n_max` or `k_max`{off}")
    if f1 + f2 < fixedpoint.MIN_FRAC_BITS:
        raise InvalidParameterError(f"validity-proven split leaves {f1 + f2} fractional bits, below "
                                    f"{fixedpoint.MIN_FRAC_BITS}; lower `max_norm`, `n_max` or `k_max`")
    return f1, f2



#: uploads a verifier judges in its own process before it starts its worker processes (a spawned worker costs
#: about a second of interpreter start and imports, once per session: the pool is kept for every later upload)
PROCESS_MIN_UPLOADS = 32
#: worker processes per verifier (the server's and the key holder's), at most the cores: one upload costs each
#: verifier about as much CPU as the server's own upload handling, which runs in one process, so a few workers
#: keep up with any arrival rate while the other cores serve requests (and every worker's start-up, a second or
#: more of CPU, is paid per worker)
VERIFIER_WORKERS = 4


def split_session_params(session_id: str, layout: Layout, gamma: float, bounds: Bounds, *,
                         frac_bits: tuple | None = None, gram_proof: bool | None = None, max_share: float = 1.0,
                         field: str | None = None, **_) -> SessionParams:
    """Lane bits from the bounds (as secagg and bfv, lowered where a validity-proven upload needs the room:
    :func:`choose_frac_bits`); not yet bound to the key holder's seed key. ``gram_proof``: every upload also
    proves its statistics are a Gram matrix (docs/VALIDITY.md, "The Gram statement"). ``field``: the proof's
    and the sum's field (:data:`secure_afl.hazmat.fields.FIELD_NAMES`; ``field128``: one exact word per value).
    Either left None takes the session default (:func:`split_choice`; a caller with DP resolves the field with
    ``dp_on``, as :func:`~secure_afl.backends.session_params.dp_session_params` does)."""
    chosen = split_choice(field, gram_proof)
    field, gram_proof = chosen[FIELD_KEY], chosen[GRAM_KEY]
    field_named(field)  # an unknown name is refused here, naming the known ones
    base = SessionParams(session_id, "split", layout, gamma, bounds).with_backend_params(
        **{FIELD_KEY: str(field)})
    if gram_proof:  # absent when off, so the digest of a session without it is unchanged
        base = base.with_backend_params(**{GRAM_KEY: True})
    if float(max_share) < 1.0:
        base = base.with_backend_params(max_share=float(max_share))
    # the validity proof bounds an upload's entries only up to a factor (docs/VALIDITY.md): the lanes keep
    # room for k_max such uploads in F_p
    fb = choose_frac_bits(base) if frac_bits is None else fixedpoint.check_frac_bits(frac_bits, bounds, gamma)
    return base.with_backend_params(frac_bits=[int(f) for f in fb])


#: Common name (see :func:`secure_afl.backends.he_module`).
session_params = split_session_params


def expected_abs_error(params: SessionParams, n_clients: int | None = None, *,
                       magnitude: float | None = None) -> float:
    k = params.bounds.k_max if n_clients is None else int(n_clients)
    m = params.bounds.aggregate_bound(params.gamma) if magnitude is None else float(magnitude)
    return fixedpoint.abs_error_bound(tuple(params.backend_params["frac_bits"]), k, m)


#: release checks the proof does not establish (a hospital within its proven bounds can fail them): the
#: collector reports them instead of refusing the release
ADVISORY_CHECKS = ("symmetric", "psd", "cauchy_schwarz", "class_cauchy_schwarz", "norm_bound")


def psd_tolerance(params: SessionParams, gram: np.ndarray) -> float:
    """How far below 0 the smallest eigenvalue of a released Gram sum may be computed when every upload proved
    the Gram statement: the high-lane sum is exactly positive semi-definite (a sum of 2^t (L L^T + D)), so only
    what the release adds counts. The low lanes move each entry by less than ``2^(63 - f1 - f2)`` in all
    (whatever they hold), the decoding rounds each entry once (relative 2^-53), so the error E has
    ``||E||_2 <= ||E||_F <= d 2^(63 - f1 - f2) + 2^-53 ||C||_F``; eigvalsh adds at most ``d 2^-53 ||C||_F``."""
    f1, f2 = (int(v) for v in params.backend_params["frac_bits"])
    d = params.layout.dim
    fro = float(np.linalg.norm(gram))
    # one Field128 word per value has no low lane: the word sum is read exactly, only the rounding counts
    lo_lanes = d * 2.0 ** (63 - f1 - f2) if lanes_per_value(params) == 2 else 0.0
    noise = 0.0
    g = gramsizes(params, proof_scale(params, f1, f2)[0]) if gram_enabled(params) else None
    if g is not None and params.dp is not None:
        # under DP each upload's proven part is its statistics less its noise share, whose entries are proven
        # below 2^z_log2 grid steps (by Gershgorin a share moves the smallest eigenvalue by at most d times
        # that) and whose squared norm below l2_z (||Z||_op <= ||Z||_F <= sqrt(2 l2_z)): the smaller of the two
        noise = params.bounds.k_max * min(d * 2.0 ** g["z_log2"], math.sqrt(2.0 * g["l2_z"])) * 2.0 ** -f1
    if g is not None and g["n_r"]:
        # exact lanes: each upload's A is only proven >= -slack I (its residual's Gershgorin bound)
        noise += params.bounds.k_max * g["slack"]
    return lo_lanes + (2 * d + 1) * 2.0 ** -53 * fro + noise


def proven_aggregate_bound(params: SessionParams) -> float:
    """|entry| of a sum of k_max proven uploads (docs/VALIDITY.md): each high-lane entry is within 2T, and the
    low-lane sum, whatever the uploads hold there, is read as a centred value below 2^63."""
    f1, f2 = (int(v) for v in params.backend_params["frac_bits"])
    g1, g2 = proof_scale(params, f1, f2)
    s = statement_sizes(params, g1, g2)
    lo = 2.0 ** (63 - f1 - f2) if lanes_per_value(params) == 2 else 0.0  # one word: no low lane
    return float(params.bounds.k_max) * 2.0 ** (s["m_hi"] - g1) + lo
