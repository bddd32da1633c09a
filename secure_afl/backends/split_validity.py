"""``split`` upload validity: a proof, checked by the server and the key holder on their shares, that one
hospital's upload lies within the session's declared bounds.

Full statement, encoding and soundness: docs/VALIDITY.md. In short, with
``x`` the upload's 2L fixed-point lanes (``hi`` then ``lo``, centred integers
carried in F_p, p = 2^64 - 2^32 + 1) and ``b`` the prover's auxiliary bits,
the verifiers accept iff every entry of ``b`` is a bit (the fully linear proof
of :class:`secure_afl.hazmat.flp.BitProof`, repeated ``REPS`` times) and these
affine relations hold in F_p (checked as one verifier-chosen random linear
combination, so only its value, zero for an honest upload, is revealed):

* ``lo`` of n, every class count and the contributors slot is 0; both lanes of
  the tag slots are 0; ``hi`` of contributors is ``2^f1``;
* ``hi_n = 2^f1 sum 2^i bn_i``, ``n_max - sum 2^i bn_i = sum 2^i bn'_i``:
  n is an integer in ``[0, n_max]``;
* ``hi_count_c = 2^f1 sum 2^i bc_(c,i)`` and ``sum_c count_c = n``: every class
  count is a non-negative integer, so also ``<= n``;
* ``c_B n + c_0 - sum_i hi_(C_ii) = sum 2^i bs_i``: trace(C^r) <= n B^2 + d gamma,
  up to the fixed point's rounding (the sum cannot wrap: each diagonal entry is
  within the projection bound below, and ``d 2T`` stays below ``2^62``);
* for ``k = ROWS`` rows ``r_j in {-1, 0, 1}^L`` (0 with probability 1/2),
  drawn from a hash of the committed upload, ``<r_j, hi> + T = sum 2^i bp_(j,i)``
  with ``T = 2^(m - 1)``: every row's projection of the high lane lies in ``[-T, T)``.

A high-lane entry with centred ``|x_i| > 2T`` keeps each row's projection out of
``[-T, T]`` with probability at least 1/2 (fix the other coordinates: of the
values ``s``, ``s + x_i``, ``s - x_i`` no two that differ by ``x_i`` both lie
there), so ``k`` rows bound every entry by ``2T`` except with probability
``2^-k`` per hash query. ``T`` is ``TAIL`` times the l2 norm an honest lane
cannot exceed (Hoeffding: an honest row leaves ``[-T, T)`` with probability
below ``2 exp(-TAIL^2 / 2)``; the honest prover then draws a fresh seed).

The low lane is not range-proven, and need not be: the collector reads the
low-lane sum through its centred representative, below ``p/2 < 2^63`` whatever
the uploads hold, so it moves each released entry by less than
``2^(63 - f1 - f2)`` in all (:func:`proven_aggregate_bound`) and cannot reach
the high lane. Only n, the counts, the contributors slot and the tag, whose low
lanes must be 0, are pinned there.

With DP (``params.dp``) each hospital's Skellam share is in the upload, so n and the counts are grid values,
not integers: the statement is widened by the share's hard bound ``tau`` (grid units, :func:`noise_bound`):
n and every count in ``[-tau, n_max 2^f1 + tau]``, ``|sum counts - n| <= (C + 1) tau``, the trace slack
shifted by the noise, ``T`` grown by ``sqrt(m) tau`` (docs/VALIDITY.md, "With differential privacy").
Without DP the statement above is unchanged.

No diagonal entry is proven non-negative on its own: within the projection bound an off-diagonal entry
already makes ``C_k`` indefinite, so a per-entry sign would bound nothing the rest leaves open, at three
quarters of the proof's bits (docs/VALIDITY.md, "What the statement leaves out").

Sharing: the hospital's fresh seed ``s`` gives ``m = expand_field(s)`` over
the whole body ``w = x || b || proofs``; the server holds ``w + m`` (the upload),
the key holder ``-m`` (from the seed it opens). Both shares are uniform alone.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from typing import Mapping

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from .. import domains
from ..domains import SPLIT_SHARE_XOF as DOMAIN_SHARE, SPLIT_ROW_XOF as _ROW_DOMAIN, \
    SPLIT_PROOF_XOF as _PROOF_DOMAIN, SPLIT_GRAM_ROW_XOF as _FROW_DOMAIN, SPLIT_RHO_XOF as _RHO_DOMAIN, \
    SPLIT_JOINT_XOF as _JOINT_DOMAIN, SPLIT_QUERY_XOF as _QUERY_DOMAIN, SPLIT_GRAM_QUERY_XOF as _GQUERY_DOMAIN
from ..exceptions import BoundsExceeded, InvalidInputError, InvalidParameterError, \
    MalformedPayload
from ..hazmat import fixedpoint, flp, ternary
from ..hazmat.flp_square import SquareSumProof
from ..workers import map_chunks
from ..params import SessionParams
from ..encoding import canonical_json
from ..envelope import open_envelope

__all__ = ["Circuit", "UploadCommitment", "choose_frac_bits", "REPS", "ROWS", "TAIL",
           "ADVISORY_CHECKS", "proven_aggregate_bound", "check_upload", "leader_message", "verify_leader_message",
           "helper_verdict", "leader_messages", "PROCESS_MIN_UPLOADS", "seed_digest", "describe",
           "WRAP_BITS", "DOMAIN_SHARE", "soundness_bits", "LINEAR_REPS", "noise_bound", "query_key", "query_seed",
           "GRAM_KEY", "GRAM_RHOS", "GRAM_QUERIES", "gram_enabled", "psd_tolerance"]

#: repetitions of the bit proof (independent joint randomness and query point)
REPS = 3
#: independent random linear combinations of the affine relations (each misses a false one w.p. 1/p)
LINEAR_REPS = 2
#: projection rows per lane
ROWS = 130
#: projection threshold in units of the honest l2 bound
TAIL = 6
#: every lane sum of k_max proven uploads, and every integer relation, stays below 2^WRAP_BITS < p/2
WRAP_BITS = 62
_FS_PREFIX = domains.SPLIT_VALIDITY
_RETRIES = 8
#: backend_params key of the Gram statement (docs/VALIDITY.md, "The Gram statement"); absent means off
GRAM_KEY = "gram_proof"
#: Fiat-Shamir vectors rho the quadratic identity is checked on (each misses a false one w.p. 2/p)
GRAM_RHOS = 3
#: independent square-sum proofs, each queried at its own point
GRAM_QUERIES = 2
#: fewest fractional bits of the factor: below, snapping the statistics onto L L^T would cost more than float32
_GRAM_MIN_F = 12


def gram_enabled(params: SessionParams) -> bool:
    return bool(params.backend_params.get(GRAM_KEY))


def _gram_jitter(params: SessionParams, f: int) -> float:
    """The diagonal the honest factorisation adds (0 when gamma covers it): twice the bound E on how far the
    rounded first block column can push the Schur complement below gamma I (docs/VALIDITY.md),
    E = 2^-f (4 B^2 + 2 sqrt(2 d) B) sqrt(C n_max) + C d 2^-2f."""
    b, lay = params.bounds, params.layout
    B, d, C = float(b.max_norm), lay.dim, lay.n_classes
    e = 2.0 ** -f * (4 * B * B + 2 * math.sqrt(2 * d) * B) * math.sqrt(C * b.n_max) + C * d * 2.0 ** (-2 * f)
    return max(0.0, 2 * e - params.gamma)


def _gram_sizes(params: SessionParams, f1: int) -> dict:
    """The factor's scale f = floor(f1 / 2) (A at 2^f1 = 2^t 2^2f), its words, and the bit widths of its range
    proof (m_f) and of the count slack (m_d)."""
    b, lay = params.bounds, params.layout
    d, C = lay.dim, lay.n_classes
    f = max(f1, 0) // 2
    jitter = _gram_jitter(params, f)
    # ||L||_F^2 = trace(L L^T) <= trace(C^r) + d jitter + n <= n_max B^2 + d gamma + d jitter + n_max; the
    # factor is rounded towards zero, so its integer entries are no larger than the real ones
    l2 = math.sqrt(b.n_max * float(b.max_norm) ** 2 + d * (params.gamma + jitter) + b.n_max) * (1 + 2.0 ** -30)
    m_f = _pow2_at_least(TAIL * (2.0 ** f * l2 + 1.0)) + 1
    return {"f": f, "t": max(f1, 0) - 2 * f, "m": d + C, "n_f": C + d * C + d * (d + 1) // 2, "m_f": m_f,
            "m_d": _bitlen(2 * (math.isqrt(b.n_max) + 1) << f), "jitter": jitter,
            "jitter_units": math.ceil(jitter * 2.0 ** max(f1, 0))}


def _bitlen(x: int) -> int:
    return max(1, int(x).bit_length())


def _pow2_at_least(x: float) -> int:
    """Least m with 2^m >= x (x > 0), computed without trusting float rounding at the edge."""
    m = max(0, math.ceil(math.log2(x)))
    while 2.0 ** m < x:
        m += 1
    while m > 0 and 2.0 ** (m - 1) >= x:
        m -= 1
    return m


def _honest_l2(params: SessionParams) -> float:
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


def _noised_count(params: SessionParams) -> int:
    from ..dp.mechanism import noised_entries

    sl = noised_entries(params.layout)
    return sl.stop - sl.start


def _sizes(params: SessionParams, f1: int, f2: int) -> dict:
    lay, b = params.layout, params.bounds
    L = lay.length
    tau = noise_bound(params, f1)
    # a noise share adds at most sqrt(m) tau to the high lane's l2 norm (m noised entries; none in the low lane)
    noise_l2 = math.sqrt(_noised_count(params)) * tau if tau else 0.0
    m_hi = _pow2_at_least(TAIL * (2.0 ** f1 * _honest_l2(params) + math.sqrt(L) / 2 + noise_l2)) + 1
    B2 = float(b.max_norm) ** 2
    c_B = math.ceil(2.0 ** f1 * B2 * (1 + 2.0 ** -30))
    c_0 = math.ceil(2.0 ** f1 * lay.dim * params.gamma * (1 + 2.0 ** -30)) + lay.dim
    if gram_enabled(params):
        if params.dp is not None:
            raise InvalidParameterError("the Gram statement (gram_proof) is not available with [dp]: the noise share "
                                        "is in the proven statistics; run the session without one of them")
        gram = _gram_sizes(params, f1)
        c_0 += lay.dim * gram["jitter_units"]  # the factorisation's diagonal jitter (0 when gamma covers it)
    else:
        gram = None
    if params.dp is None:
        m_n = _bitlen(b.n_max)
        slack_max = c_B * b.n_max + c_0
        return {"m_hi": m_hi, "m_n": m_n, "m_s": _bitlen(slack_max), "c_B": c_B,
                "c_0": c_0, "slack_max": slack_max, "tau": 0, "gram": gram}
    # DP (docs/VALIDITY.md, "With differential privacy"): n and the counts are grid values shifted by tau; the
    # trace relation is taken times 2^g so that n (now a grid value) needs no division: g = f1 unless the
    # diagonal's sum, within the projection bound, times 2^g would come near 2^62 (c_B rounds up: the bound is
    # looser by 2^-g B^2-units per grid step of n)
    n_top = b.n_max * (1 << f1) + 2 * tau
    d, C = lay.dim, lay.n_classes
    g = f1
    while g > 0 and (d * ((1 << m_hi) + tau)) << g >= 1 << (WRAP_BITS - 2):
        g -= 1
    c_B = math.ceil(2.0 ** g * B2 * (1 + 2.0 ** -30))
    trace_c = (1 << g) * (c_0 + 2 * d * tau)
    slack_max = c_B * n_top + trace_c
    return {"m_hi": m_hi, "m_n": _bitlen(n_top),
            "m_s": _bitlen(slack_max), "m_e": _bitlen(2 * (C + 1) * tau), "c_B": c_B, "c_0": c_0,
            "slack_max": slack_max, "tau": tau, "n_top": n_top, "trace_c": trace_c, "e_top": 2 * (C + 1) * tau,
            "g": g, "gram": None}


def _fits(params: SessionParams, f1: int, f2: int) -> str | None:
    """None if (f1, f2) keeps every proven lane sum and every relation below 2^WRAP_BITS, else why not."""
    if f1 < 0:
        return "f1 < 0 (counts would not be integers in the hi lane)"
    s = _sizes(params, f1, f2)
    k, d = params.bounds.k_max, params.layout.dim
    wrap = 1 << WRAP_BITS
    if k * (1 << s["m_hi"]) >= wrap:  # per entry |hi| <= 2T = 2^m_hi
        return "k_max * 2T_hi"
    if k * (1 << max(f2 - 1, 0)) >= wrap:  # honest low lanes, |lo| <= 2^(f2 - 1); a dishonest one cannot wrap hi
        return "k_max honest low lanes"
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
    g = s["gram"]
    # the quadratic identity A = 2^t (L L^T + D), entrywise: |A_ij| <= 2T, |(L L^T)_ij| <= m (2T_f)^2, D < 2^m_d;
    # below p/2 the identity mod p is the identity over the integers
    if g is not None and (1 << s["m_hi"]) + ((g["m"] << (2 * g["m_f"])) + (1 << g["m_d"]) << g["t"]) >= wrap:
        return "the Gram identity"
    if g is not None and g["f"] < _GRAM_MIN_F:
        return "the Gram factor's scale"
    # n and the counts: 2^f1 times a value of m_n bits, and C of them summed, stay integers below p/2
    if (1 << (f1 + s["m_n"])) >= wrap or params.layout.n_classes * (1 << s["m_n"]) >= wrap:
        return "the count relations"
    return None


def choose_frac_bits(params: SessionParams) -> tuple[int, int]:
    """The largest ``(f1, f2)``, at most the plain no-wrap choice, under which a proven upload cannot wrap.

    With DP, f1 is the noise grid's (already in ``params``, :func:`secure_afl.dp.dp_session_params`) and
    only f2 is lowered: the noise shares are integers on the grid 2^-f1."""
    f1, f2 = fixedpoint.choose_frac_bits(params.bounds, params.gamma, min_frac_bits=0)
    if params.dp is not None:
        f1 = int(params.backend_params["frac_bits"][0])
    else:
        while f1 >= 0 and _fits(params, f1, 1) is not None:  # hi-lane and trace conditions depend on f1 only
            f1 -= 1
    while f2 > 1 and _fits(params, max(f1, 0), f2) is not None:  # now only the lo-lane condition can fail
        f2 -= 1
    why = _fits(params, f1, f2)
    if why is not None:
        raise InvalidParameterError(f"no fixed-point scale lets a validity-proven split upload stay below "
                                    f"2^{WRAP_BITS} ({why}); lower `max_norm`, `n_max` or `k_max`")
    if f1 + f2 < fixedpoint.MIN_FRAC_BITS:
        raise InvalidParameterError(f"validity-proven split leaves {f1 + f2} fractional bits, below "
                                    f"{fixedpoint.MIN_FRAC_BITS}; lower `max_norm`, `n_max` or `k_max`")
    return f1, f2


def soundness_bits(circuit: "Circuit", hash_queries_log2: int = 64) -> float:
    """-log2 of the bound on accepting an invalid upload, for a prover making 2^q hash queries (docs/VALIDITY.md)."""
    q = 2.0 ** hash_queries_log2
    p = float(flp.P)
    bp = circuit.bits
    per_query = 2.0 ** -ROWS + (bp.length / p) ** REPS
    query_point = ((2 * bp.n - 2) / (p - bp.n)) ** REPS
    linear = (1.0 / p) ** LINEAR_REPS
    if circuit.gram is not None:
        # the factor's range rows; GRAM_RHOS vectors rho, each missing a nonzero symmetric A - 2^t (L L^T + D)
        # with probability <= 2/p (Schwartz-Zippel, degree 2); the square-sum proofs' query points; two more
        # random combinations
        sq = circuit.sq
        per_query += 2.0 ** -ROWS + (2.0 / p) ** GRAM_RHOS
        query_point += ((2 * sq.n - 2) / (p - sq.n)) ** GRAM_QUERIES
        linear *= 3
    return -math.log2(q * per_query + query_point + linear)


@dataclass(frozen=True)
class UploadCommitment:
    """What the hospital signs beside its payload hash: the hashes Fiat-Shamir derives the rows and
    joint randomness from. ``seed_sha256`` binds the mask seed (the key holder checks it on the opened seed)."""

    main_sha256: str
    aux_sha256: str
    seed_sha256: str

    def to_dict(self) -> dict:
        return {"main_sha256": self.main_sha256, "aux_sha256": self.aux_sha256, "seed_sha256": self.seed_sha256}

    @classmethod
    def from_dict(cls, d) -> "UploadCommitment":
        try:
            vals = [d["main_sha256"], d["aux_sha256"], d["seed_sha256"]]
            if not all(isinstance(v, str) and len(v) == 64 and int(v, 16) >= 0 for v in vals):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise MalformedPayload("the validity commitment needs three hex SHA-256 digests") from None
        return cls(*vals)


def seed_digest(seed: bytes) -> str:
    return hashlib.sha256(_FS_PREFIX + b"seed\0" + bytes(seed)).hexdigest()


class Circuit:
    """The validity statement for one session (module docstring); sizes, prover and verifier."""

    def __init__(self, params: SessionParams):
        self.params = params
        lay = params.layout
        f1, f2 = (int(v) for v in params.backend_params["frac_bits"])
        why = _fits(params, f1, f2)
        if why is not None:
            raise InvalidParameterError(f"frac_bits {[f1, f2]} let a proven upload wrap ({why}); use "
                                        "split_validity.choose_frac_bits")
        self.f1, self.f2 = f1, f2
        s = _sizes(params, f1, f2)
        self.sizes = s
        self.L = lay.length
        self.d, self.C = lay.dim, lay.n_classes
        sl = lay.slices
        self.i_n = sl["n"].start
        self.i_counts = np.arange(sl["counts"].start, sl["counts"].stop)
        self.i_contrib = sl["contributors"].start
        self.i_tag = np.arange(sl["tag"].start, sl["tag"].stop)
        r, c = np.triu_indices(self.d)
        self.i_diag = np.nonzero(r == c)[0]
        #: DP: the noise share's hard bound tau (grid units) the statement is widened by; 0 without DP
        self.dp = params.dp is not None
        self.tau = s["tau"]
        # bit blocks: (name, count, width)
        if self.dp:
            self.blocks = [("n", 1, s["m_n"]), ("n_gap", 1, s["m_n"]), ("counts", self.C, s["m_n"]),
                           ("count_gap", self.C, s["m_n"]), ("sum", 1, s["m_e"]), ("sum_gap", 1, s["m_e"]),
                           ("slack", 1, s["m_s"]), ("proj", ROWS, s["m_hi"])]
        else:
            self.blocks = [("n", 1, s["m_n"]), ("n_gap", 1, s["m_n"]), ("counts", self.C, s["m_n"]),
                           ("slack", 1, s["m_s"]), ("proj", ROWS, s["m_hi"])]
        #: the Gram statement's sizes (None when the session does not prove it)
        self.gram = s["gram"]
        if self.gram is not None:
            self.blocks += [("gram_slack", self.C, self.gram["m_d"]), ("proj_f", ROWS, self.gram["m_f"])]
        self.offsets = {}
        off = 0
        for name, cnt, width in self.blocks:
            self.offsets[name] = (off, cnt, width)
            off += cnt * width
        self.n_bits = off
        self.bits = flp.BitProof(self.n_bits)
        self.main_len = 2 * self.L
        # body: lanes (summed) | factor words (Gram statement) | bits | bit proofs | square-sum proofs; the
        # commitment's main hash covers the lanes and the factor
        self.n_f = 0 if self.gram is None else self.gram["n_f"]
        self.commit_len = self.main_len + self.n_f
        self.sq = None if self.gram is None else SquareSumProof(self.gram["m"], GRAM_RHOS)
        self.proof_len = REPS * self.bits.proof_len + (0 if self.sq is None else GRAM_QUERIES * self.sq.proof_len)
        self.total = self.commit_len + self.n_bits + self.proof_len
        #: the projection threshold: every proven high-lane entry is within 2T
        self.T = 1 << (s["m_hi"] - 1)
        # relations: lo zero (n, counts, contributors: C + 2), tag zero (8), contributors hi, n, n_gap, counts (C),
        # counts sum, trace, projections (ROWS)
        self.n_relations = (self.C + 2) + 2 * len(self.i_tag) + 1 + 2 + self.C + 1 + 1 + ROWS
        if self.dp:  # count upper ends (C), and the count sum's two-sided range: one relation more
            self.n_relations += self.C + 1
        self.verifier_len = LINEAR_REPS + REPS * self.bits.verifier_len
        if self.gram is not None:
            self.T_f = 1 << (self.gram["m_f"] - 1)
            # two more groups, each checked by its own random combinations so a refusal names the check: the
            # factor's range rows, and the quadratic identities (one per query and rho)
            self.n_range_relations = ROWS
            self.n_gram_relations = GRAM_QUERIES * GRAM_RHOS
            self.verifier_len += 2 * LINEAR_REPS + GRAM_QUERIES * self.sq.verifier_len
            d, C = self.d, self.C
            self._tril = np.tril_indices(d)

    # -- Fiat-Shamir --------------------------------------------------------------------------------------
    def fs_seed(self, hospital: str, main_sha256: str, seed_sha256: str) -> bytes:
        return hashlib.sha256(_FS_PREFIX + canonical_json({
            "session_id": self.params.session_id, "params_digest": self.params.digest().hex(),
            "hospital": hospital, "main_sha256": main_sha256, "seed_sha256": seed_sha256})).digest()

    def joint_rand(self, fs: bytes, aux_sha256: str) -> list[int]:
        key = hashlib.sha256(fs + b"joint\0" + bytes.fromhex(aux_sha256)).digest()
        return [int(v) for v in flp.expand_field(key, REPS, _JOINT_DOMAIN)]

    def query_rand(self, fs: bytes, aux_sha256: str, query_seed: bytes) -> tuple[list[int], np.ndarray]:
        """Query points (off the FLP domain) and the linear-check coefficients, from the verifiers' seed."""
        if not isinstance(query_seed, (bytes, bytearray)) or len(query_seed) != 32:
            raise MalformedPayload("a query seed is 32 bytes")
        key = hashlib.sha256(bytes(query_seed) + fs + bytes.fromhex(aux_sha256)).digest()
        stream = flp.expand_field(key, 4 * REPS + LINEAR_REPS * self.n_relations, _QUERY_DOMAIN)
        pts = [int(v) for v in stream[:4 * REPS] if pow(int(v), self.bits.n, flp.P) != 1][:REPS]
        if len(pts) < REPS:  # pragma: no cover - probability about (N/p)^(3 REPS)
            raise InvalidInputError("query points fell on the interpolation domain; draw another query seed")
        return pts, stream[4 * REPS:].reshape(LINEAR_REPS, self.n_relations)

    # -- projection ----------------------------------------------------------------------------------------
    def project(self, x, fs: bytes) -> np.ndarray:
        """``<r_j, hi>`` mod p for the ROWS rows, shape (ROWS,).

        Exact in float32: the high lane is cut into its 8 bytes and summed over at most ``_PROJ_CHUNK``
        entries at a time, so every partial sum is an integer of magnitude at most ``255 * 2^16 < 2^24``
        whatever order the BLAS adds in; chunk sums are then added as int64 and the bytes recombined mod p."""
        hi = np.asarray(x, dtype=np.uint64)[:self.L]
        L = self.L
        row_bytes = -(-L // 4)
        limbs = np.ascontiguousarray(hi, dtype="<u8").view(np.uint8).reshape(L, 8).T.astype(np.float32)
        key = hashlib.sha256(fs + b"rows\0").digest()
        enc = Cipher(algorithms.ChaCha20(key, b"\x00\x00\x00\x00" + _ROW_DOMAIN), mode=None).encryptor()
        if _COMPILED and ternary.worth_it():  # the same rows, summed by a compiled loop that releases the GIL
            raw = np.frombuffer(enc.update(bytes(ROWS * row_bytes)), dtype=np.uint8).reshape(ROWS, row_bytes)
            return ternary.project(raw, hi)
        sums = np.zeros((ROWS, 8), dtype=np.int64)
        block = 16
        for j0 in range(0, ROWS, block):
            nb = min(block, ROWS - j0)
            raw = np.frombuffer(enc.update(bytes(nb * row_bytes)), dtype=np.uint8).reshape(nb, row_bytes)
            R = np.take(_TRITS, raw).view(np.float32).reshape(nb, 4 * row_bytes)
            for c0 in range(0, L, _PROJ_CHUNK):
                c1 = min(L, c0 + _PROJ_CHUNK)
                sums[j0:j0 + nb] += (R[:, c0:c1] @ limbs[:, c0:c1].T).astype(np.int64)
        out = np.zeros(ROWS, dtype=np.uint64)
        for i in range(8):
            out = flp.add(out, flp.scale(flp.encode_signed(sums[:, i]), 1 << (8 * i)))
        return out

    # -- the Gram statement (docs/VALIDITY.md, "The Gram statement") -----------------------------------------
    # A = [[diag(counts), Q^T], [Q, C^r]] in the high lane (classes first, so the factor's first block is
    # diagonal), proven to equal 2^t (L L^T + diag(delta, 0)) with L lower triangular, delta >= 0.
    def rhos(self, fs: bytes, aux_sha256: str) -> np.ndarray:
        """(GRAM_RHOS, m): the Fiat-Shamir vectors, fixed by the lanes, the factor and the bits (delta)."""
        key = hashlib.sha256(fs + b"gram\0" + bytes.fromhex(aux_sha256)).digest()
        return flp.expand_field(key, GRAM_RHOS * self.gram["m"], _RHO_DOMAIN).reshape(GRAM_RHOS, self.gram["m"])

    def _factor_blocks(self, fw: np.ndarray):
        d, C = self.d, self.C
        l21 = fw[C:C + d * C].reshape(d, C)
        l22 = np.zeros((d, d), dtype=np.uint64)
        l22[self._tril] = fw[C + d * C:]
        return fw[:C], l21, l22

    def factor_vectors(self, fw, rhos) -> np.ndarray:
        """``L^T rho`` for each rho (linear in the factor words: the verifiers apply it to their shares)."""
        l11, l21, l22 = self._factor_blocks(np.asarray(fw, dtype=np.uint64))
        out = []
        for rho in rhos:
            rc, rf = rho[:self.C], rho[self.C:].reshape(-1, 1)
            out.append(np.concatenate([flp.add(flp.mul(l11, rc), flp.sum_mod(flp.mul(l21, rf), axis=0)),
                                       flp.sum_mod(flp.mul(l22, rf), axis=0)]))
        return np.stack(out)

    def kappa(self, rho) -> np.ndarray:
        """The high-lane coefficients of ``rho^T A rho`` (A read from the packed triu(C^r), Q and counts)."""
        sl = self.params.layout.slices
        rc, rf = rho[:self.C], rho[self.C:]
        r, c = np.triu_indices(self.d)
        k = np.zeros(self.L, dtype=np.uint64)
        g = flp.mul(rf[r], rf[c])
        k[sl["gram"]] = np.where(r == c, g, flp.add(g, g))
        q = flp.mul(rf.reshape(-1, 1), rc.reshape(1, -1)).ravel()
        k[sl["cross"]] = flp.add(q, q)
        k[sl["counts"]] = flp.mul(rc, rc)
        return k

    def project_factor(self, fw, fs: bytes) -> np.ndarray:
        """``<r_j, factor>`` mod p for ROWS rows of their own (the high-lane projection's method: byte limbs,
        float32 products exact below 2^24, recombined mod p)."""
        words = np.asarray(fw, dtype=np.uint64)
        n = words.shape[0]
        row_bytes = -(-n // 4)
        limbs = np.ascontiguousarray(words, dtype="<u8").view(np.uint8).reshape(n, 8).T.astype(np.float32)
        key = hashlib.sha256(fs + b"factor-rows\0").digest()
        enc = Cipher(algorithms.ChaCha20(key, b"\x00\x00\x00\x00" + _FROW_DOMAIN), mode=None).encryptor()
        sums = np.zeros((ROWS, 8), dtype=np.int64)
        for j0 in range(0, ROWS, 16):
            nb = min(16, ROWS - j0)
            raw = np.frombuffer(enc.update(bytes(nb * row_bytes)), dtype=np.uint8).reshape(nb, row_bytes)
            R = np.take(_TRITS, raw).view(np.float32).reshape(nb, 4 * row_bytes)
            for c0 in range(0, n, _PROJ_CHUNK):
                c1 = min(n, c0 + _PROJ_CHUNK)
                sums[j0:j0 + nb] += (R[:, c0:c1] @ limbs[:, c0:c1].T).astype(np.int64)
        out = np.zeros(ROWS, dtype=np.uint64)
        for i in range(8):
            out = flp.add(out, flp.scale(flp.encode_signed(sums[:, i]), 1 << (8 * i)))
        return out

    def _gram_query(self, share: np.ndarray, fs: bytes, aux_sha256: str, query_seed: bytes, *,
                    leader: bool) -> np.ndarray:
        """``[range combinations] ++ [identity combinations] ++ GRAM_QUERIES square-sum queries``."""
        g, one = self.gram, 1 if leader else 0
        hi = share[:self.L]
        fw = share[self.main_len:self.commit_len]
        bits = share[self.commit_len:self.commit_len + self.n_bits]
        off = self.commit_len + self.n_bits + REPS * self.bits.proof_len
        sq = share[off:].reshape(GRAM_QUERIES, self.sq.proof_len)
        key = hashlib.sha256(bytes(query_seed) + fs + bytes.fromhex(aux_sha256) + b"gram").digest()
        stream = flp.expand_field(key, 4 * GRAM_QUERIES + LINEAR_REPS * (ROWS + self.n_gram_relations),
                                  _GQUERY_DOMAIN)
        pts = [int(v) for v in stream[:4 * GRAM_QUERIES] if pow(int(v), self.sq.n, flp.P) != 1][:GRAM_QUERIES]
        if len(pts) < GRAM_QUERIES:  # pragma: no cover - probability about (N/p)^4
            raise InvalidInputError("query points fell on the interpolation domain; draw another query seed")
        co = stream[4 * GRAM_QUERIES:]
        c_range = co[:LINEAR_REPS * ROWS].reshape(LINEAR_REPS, ROWS)
        c_gram = co[LINEAR_REPS * ROWS:].reshape(LINEAR_REPS, self.n_gram_relations)
        rng = flp.sub(flp.add(self.project_factor(fw, fs), np.uint64(self.T_f * one)), self._decompose(bits, "proj_f"))
        delta = self._decompose(bits, "gram_slack")
        rhos = self.rhos(fs, aux_sha256)
        lhs = [flp.dot(self.kappa(rho), hi) for rho in rhos]
        slack = [flp.dot(flp.mul(rho[:self.C], rho[:self.C]), delta) for rho in rhos]
        two_t = 1 << g["t"]
        quad = []
        for q in range(GRAM_QUERIES):
            outs = self.sq.outputs(sq[q])
            quad += [(lhs[r] - two_t * (int(outs[r]) + slack[r])) % flp.P for r in range(GRAM_RHOS)]
        quad = np.array(quad, dtype=np.uint64)
        v = self.factor_vectors(fw, rhos)
        msg = [np.array([flp.dot(row, rng) for row in c_range], dtype=np.uint64),
               np.array([flp.dot(row, quad) for row in c_gram], dtype=np.uint64)]
        msg += [self.sq.query(v, sq[q], t) for q, t in enumerate(pts)]
        return np.concatenate(msg)

    def factorise(self, vector) -> tuple[np.ndarray, np.ndarray]:
        """Hospital: ``(lanes, factor words)`` with the Gram, cross and count entries of the lanes exactly
        ``2^t L L^T`` (low lanes 0) for the rounded factor L at scale 2^f: l_c = floor(sqrt(count_c) 2^f),
        the rest of L the Cholesky factor of the statistics (plus the session's jitter where gamma does not
        cover the rounding), rounded towards zero so no diagonal grows. :class:`BoundsExceeded` if the
        statistics are not positive semi-definite (not the Gram of any rows)."""
        g = self.gram
        f, t = g["f"], g["t"]
        v = np.asarray(vector, dtype=np.float64)
        lay = self.params.layout
        st = lay.unpack(v)
        counts = np.asarray(st.class_counts, dtype=np.float64)
        if not np.all(np.isfinite(v)) or np.any(counts < 0) or np.any(counts != np.round(counts)):
            raise BoundsExceeded("the class counts must be non-negative integers")
        s2f = 1 << (2 * f)
        cnt = [int(c) for c in counts]
        l11 = np.array([math.isqrt(c * s2f) for c in cnt], dtype=np.int64)
        Q = np.asarray(st.cross, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            l21 = np.where(l11 > 0, np.trunc(Q * float(s2f) / np.maximum(l11, 1)), 0.0)
        if np.any(l11 == 0) and np.any(Q[:, l11 == 0] != 0):
            raise BoundsExceeded("a class with no samples has a nonzero cross-term column")
        lr = l21 / 2.0 ** f
        S = np.asarray(st.gram, dtype=np.float64) + g["jitter"] * np.eye(self.d) - lr @ lr.T
        try:
            chol = np.linalg.cholesky(0.5 * (S + S.T))
        except np.linalg.LinAlgError:
            raise BoundsExceeded("the statistics are not positive semi-definite: no rows have this Gram matrix "
                                 "and these cross terms") from None
        l21 = l21.astype(np.int64)
        l22 = np.trunc(chol * 2.0 ** f).astype(np.int64)
        gram = _exact_gram(np.concatenate([l21, l22], axis=1))
        x = self.lanes(v).copy()
        sl = lay.slices
        r, c = np.triu_indices(self.d)
        idx = np.concatenate([np.arange(sl["gram"].start, sl["gram"].stop), np.arange(sl["cross"].start,
                              sl["cross"].stop), np.arange(sl["counts"].start, sl["counts"].stop)])
        vals = np.concatenate([gram[r, c], (l21 * l11.reshape(1, -1)).ravel(),
                               np.array(cnt, dtype=np.int64) * s2f]) << t
        x[idx] = flp.encode_signed(vals)
        x[self.L + idx] = 0
        fw = flp.encode_signed(np.concatenate([l11, l21.ravel(), l22[self._tril]]))
        return x, fw

    # -- prover ------------------------------------------------------------------------------------------
    def lanes(self, vector) -> np.ndarray:
        """Fixed-point lanes of a packed float64 vector as field elements (2L)."""
        return flp.encode_signed(fixedpoint.encode(np.asarray(vector, dtype=np.float64),
                                                   (self.f1, self.f2)).view(np.int64))

    @staticmethod
    def _bits_of(values, width: int) -> np.ndarray:
        """Bits of non-negative ints (Python ints), little-endian, ``width`` (< 64) each; wraps mod 2^width."""
        v = np.array([int(x) % (1 << width) for x in values], dtype=np.uint64)
        return ((v[:, None] >> np.arange(width, dtype=np.uint64)) & np.uint64(1)).ravel()

    def _hi_ints(self, x: np.ndarray) -> dict:
        """The centred high lane of n, the counts and the diagonal, as Python integers (what the bits encode)."""
        idx = np.concatenate([[self.i_n], self.i_counts, self.i_diag])
        return dict(zip(idx.tolist(), flp.decode_signed(x[idx]).tolist()))

    def _aux(self, x: np.ndarray, fs: bytes, *, check: bool, factor=None) -> np.ndarray:
        if self.dp:
            return self._aux_dp(x, fs, check=check)
        hi = self._hi_ints(x)
        s = self.sizes
        scale = 1 << self.f1
        n = int(hi[self.i_n]) // scale
        counts = [int(hi[i]) // scale for i in self.i_counts]
        diag = [int(hi[i]) for i in self.i_diag]
        slack = s["c_B"] * n + s["c_0"] - sum(diag)
        if check:
            lo = flp.decode_signed(x[self.L:])
            problems = []
            if any(int(hi[i]) % scale for i in [self.i_n, *self.i_counts]) or \
                    any(int(lo[i]) for i in [self.i_n, *self.i_counts]):
                problems.append("n and class counts must be integers")
            if not 0 <= n <= self.params.bounds.n_max or min(counts) < 0 or sum(counts) != n:
                problems.append("counts must lie in [0, n_max] and sum to n")
            if min(diag) < 0 or not 0 <= slack < 1 << s["m_s"]:  # the first is the data's, not proven
                problems.append("trace(C) exceeds n B^2")
            if problems:
                raise BoundsExceeded("the statistics do not meet the session's bounds: " + "; ".join(problems))
        proj = self._projection_values(x, fs, check)
        parts = [self._bits_of([n], s["m_n"]), self._bits_of([self.params.bounds.n_max - n], s["m_n"]),
                 self._bits_of(counts, s["m_n"]), self._bits_of([slack], s["m_s"]),
                 self._bits_of(proj, s["m_hi"])]
        if self.gram is not None:
            parts += self._gram_aux([int(hi[i]) for i in self.i_counts], factor, fs, check)
        return np.concatenate(parts)

    def _gram_aux(self, hi_counts, factor, fs: bytes, check: bool) -> list:
        """The count slack delta_c = hi(count_c) / 2^t - l_c^2 and the factor's projection bits."""
        g = self.gram
        fw = np.zeros(self.n_f, dtype=np.uint64) if factor is None else np.asarray(factor, dtype=np.uint64)
        l11 = flp.decode_signed(fw[:self.C]).tolist()
        delta = [(h >> g["t"]) - int(v) * int(v) for h, v in zip(hi_counts, l11)]
        proj = [int(v) + self.T_f for v in flp.decode_signed(self.project_factor(fw, fs))]
        if check:
            if not all(0 <= x < 1 << g["m_d"] for x in delta):
                raise BoundsExceeded("the Gram factor does not match the class counts")
            if not all(0 <= v < 2 * self.T_f for v in proj):
                raise _Unlucky
        return [self._bits_of(delta, g["m_d"]), self._bits_of(proj, g["m_f"])]

    def _projection_values(self, x: np.ndarray, fs: bytes, check: bool) -> list:
        """``<r_j, hi> + T`` as integers; with ``check``, :class:`_Unlucky` if one leaves ``[0, 2T)``."""
        proj = [int(v) + self.T for v in flp.decode_signed(self.project(x, fs))]
        if check and not all(0 <= v < 2 * self.T for v in proj):
            raise _Unlucky
        return proj

    def _aux_dp(self, x: np.ndarray, fs: bytes, *, check: bool) -> np.ndarray:
        """The DP statement's bits (docs/VALIDITY.md): grid values shifted by tau, no integrality."""
        hi = self._hi_ints(x)
        s, tau = self.sizes, self.tau
        n_top, e_top = s["n_top"], s["e_top"]
        n_val = int(hi[self.i_n]) + tau
        cval = [int(hi[i]) + tau for i in self.i_counts]
        e_val = sum(cval) - n_val + 2 * tau
        dval = [int(hi[i]) + tau for i in self.i_diag]
        slack = s["c_B"] * n_val + s["trace_c"] - (1 << s["g"]) * sum(dval)
        if check:
            lo = flp.decode_signed(x[self.L:])
            problems = []
            if any(int(lo[i]) for i in [self.i_n, *self.i_counts]):
                problems.append("n and class counts must lie on the noise grid")
            if not all(0 <= v <= n_top for v in [n_val, *cval]):
                problems.append("n and class counts must lie in [-tau, n_max 2^f1 + tau] on the grid")
            if not 0 <= e_val <= e_top:
                problems.append("the class counts must sum to n within (C + 1) tau")
            if min(dval) < 0 or not 0 <= slack < 1 << s["m_s"]:  # the first is the data's, not proven
                problems.append("trace(C) exceeds n B^2 beyond the noise's latitude")
            if problems:
                raise BoundsExceeded("the noisy statistics do not meet the session's bounds: " + "; ".join(problems))
        proj = self._projection_values(x, fs, check)
        parts = [self._bits_of([n_val], s["m_n"]), self._bits_of([n_top - n_val], s["m_n"]),
                 self._bits_of(cval, s["m_n"]), self._bits_of([n_top - v for v in cval], s["m_n"]),
                 self._bits_of([e_val], s["m_e"]), self._bits_of([e_top - e_val], s["m_e"]),
                 self._bits_of([slack], s["m_s"]),
                 self._bits_of(proj, s["m_hi"])]
        return np.concatenate(parts)

    def aux_bits(self, x: np.ndarray, fs: bytes, factor=None) -> np.ndarray:
        """The auxiliary bits for lanes ``x`` (and, under the Gram statement, factor words ``factor``) under
        Fiat-Shamir seed ``fs``, unchecked (values outside a range wrap modulo its width): the starting point
        of the attack commands and of the verifiers' tests."""
        return self._aux(np.asarray(x, dtype=np.uint64), fs, check=False, factor=factor)

    def prove(self, hospital: str, vector=None, *, lanes=None, seed: bytes | None = None, check: bool = True,
              aux_override=None, factor=None) -> tuple[np.ndarray, bytes, UploadCommitment]:
        """Hospital: ``(masked body w + m, seed, commitment)`` for a packed vector (or raw field ``lanes``).

        ``check=False`` and ``lanes``/``aux_override`` build an upload whose statement is false (the attack
        commands and the tests of the verifiers use them); an honest hospital never sets them.
        A fresh seed is drawn per try (and the projection retried, docs/VALIDITY.md) unless ``seed`` is given.
        """
        if self.gram is not None and lanes is None:
            x, factor = self.factorise(vector)  # the statistics snapped onto 2^t L L^T (docs/VALIDITY.md)
        else:
            x = self.lanes(vector) if lanes is None else np.asarray(lanes, dtype=np.uint64)
        if x.shape != (self.main_len,) or (x.size and int(x.max()) >= flp.P):
            raise MalformedPayload("the lane vector is not 2L field elements")
        fw = np.zeros(self.n_f, dtype=np.uint64) if factor is None else np.asarray(factor, dtype=np.uint64)
        if fw.shape != (self.n_f,) or (fw.size and int(fw.max()) >= flp.P):
            raise MalformedPayload("the factor is not the session's number of field elements")
        c0, c1 = self.commit_len, self.commit_len + self.n_bits
        for _ in range(_RETRIES):
            s = os.urandom(32) if seed is None else bytes(seed)
            mask = flp.expand_field(s, self.total, DOMAIN_SHARE)
            y_main = flp.add(np.concatenate([x, fw]), mask[:c0])
            main_sha = hashlib.sha256(flp.to_bytes(y_main)).hexdigest()
            seed_sha = seed_digest(s)
            fs = self.fs_seed(hospital, main_sha, seed_sha)
            try:
                aux = self._aux(x, fs, check=check, factor=fw) if aux_override is None else aux_override(self, x, fs)
            except _Unlucky:
                if seed is not None:
                    raise BoundsExceeded("this seed's projection rows leave the honest range; draw a fresh seed")
                continue
            y_aux = flp.add(aux, mask[c0:c1])
            aux_sha = hashlib.sha256(flp.to_bytes(y_aux)).hexdigest()
            jrs = self.joint_rand(fs, aux_sha)
            proofs = self.bits.prove_reps(aux, jrs, [flp.expand_field(os.urandom(32), 2 * self.bits.chunk,
                                                                      _PROOF_DOMAIN) for _ in jrs])
            if self.gram is not None:
                v = self.factor_vectors(fw, self.rhos(fs, aux_sha))
                proofs += [self.sq.prove(v, flp.expand_field(os.urandom(32), self.sq.chunk, _PROOF_DOMAIN))
                           for _ in range(GRAM_QUERIES)]
            y_proof = flp.add(np.concatenate(proofs), mask[c1:])
            body = np.concatenate([y_main, y_aux, y_proof])
            return body, s, UploadCommitment(main_sha, aux_sha, seed_sha)
        raise BoundsExceeded(f"{_RETRIES} fresh seeds all drew projection rows outside the honest range: "
                             "the vector is not within the declared l2 bound")

    # -- verifiers -----------------------------------------------------------------------------------------
    def leader_share(self, body: bytes | np.ndarray) -> np.ndarray:
        """Server: the upload's words as its share (length-checked, every word a field element)."""
        if isinstance(body, (bytes, bytearray, memoryview)):
            return flp.from_bytes(bytes(body), self.total, what="the split upload")
        body = np.asarray(body, dtype=np.uint64)
        if body.shape != (self.total,) or (body.size and int(body.max()) >= flp.P):
            raise MalformedPayload("the split upload is not the session's number of field elements")
        return body

    def upload_share(self, payload: bytes) -> np.ndarray:
        """Server: a sealed upload's words as its share (the envelope opened and checked for this session)."""
        return self.leader_share(open_envelope(self.params, payload, "contribution").body)

    def helper_share(self, seed: bytes) -> np.ndarray:
        """Key holder: ``-m`` from the opened seed."""
        return flp.neg(flp.expand_field(seed, self.total, DOMAIN_SHARE))

    def check_commitment(self, share: np.ndarray, commitment: UploadCommitment, *, leader: bool,
                         seed: bytes | None = None) -> None:
        """Leader: the hashes are of its words; helper: ``seed_sha256`` is of the opened seed."""
        if leader:
            if hashlib.sha256(flp.to_bytes(share[:self.commit_len])).hexdigest() != commitment.main_sha256 or \
                    hashlib.sha256(flp.to_bytes(share[self.commit_len:self.commit_len + self.n_bits])).hexdigest() \
                    != commitment.aux_sha256:
                raise MalformedPayload("the validity commitment does not match the uploaded words")
        elif seed is None or seed_digest(seed) != commitment.seed_sha256:
            raise MalformedPayload("the validity commitment does not match the sealed seed")

    def _decompose(self, bits: np.ndarray, name: str) -> np.ndarray:
        off, cnt, width = self.offsets[name]
        blk = bits[off:off + cnt * width].reshape(cnt, width)
        w = flp.to_field([1 << j for j in range(width)])
        return flp.sum_mod(flp.mul(blk, w), axis=1)

    def relations(self, share: np.ndarray, fs: bytes, *, leader: bool) -> np.ndarray:
        """This verifier's shares of every affine relation's value (all zero on an honest upload)."""
        if self.dp:
            return self._relations_dp(share, fs, leader=leader)
        L, x = self.L, share[:self.main_len]
        hi, lo = x[:L], x[L:]
        bits = share[self.commit_len:self.commit_len + self.n_bits]
        one = 1 if leader else 0
        s = self.sizes
        f1s = 1 << self.f1
        n_val = self._decompose(bits, "n")
        n_gap = self._decompose(bits, "n_gap")
        counts = self._decompose(bits, "counts")
        slack = self._decompose(bits, "slack")
        rel = [
            lo[[self.i_n, self.i_contrib, *self.i_counts]],                          # integers: lo lane 0
            hi[self.i_tag], lo[self.i_tag],                                          # tag slots 0
            flp.sub(hi[[self.i_contrib]], np.uint64(f1s * one)),                     # one contributor
            flp.sub(hi[[self.i_n]], flp.scale(n_val, f1s)),                          # n integer >= 0
            flp.sub(flp.add(n_val, n_gap), np.uint64(self.params.bounds.n_max * one)),  # n <= n_max
            flp.sub(hi[self.i_counts], flp.scale(counts, f1s)),                      # counts integers >= 0
            flp.sub(np.array([flp.sum_mod(counts)], dtype=np.uint64), n_val),        # sum counts = n
            flp.sub(flp.add(flp.scale(n_val, s["c_B"]), np.uint64(s["c_0"] * one)),  # trace <= c_B n + c_0
                    flp.add(slack, np.array([flp.sum_mod(hi[self.i_diag])], dtype=np.uint64))),
        ]
        rel.append(flp.sub(flp.add(self.project(x, fs), np.uint64(self.T * one)), self._decompose(bits, "proj")))
        out = np.concatenate(rel)
        if out.shape[0] != self.n_relations:  # pragma: no cover - a layout slip would silently drop a check
            raise AssertionError("relation count")
        return out

    def _relations_dp(self, share: np.ndarray, fs: bytes, *, leader: bool) -> np.ndarray:
        """The DP statement's relations (docs/VALIDITY.md, "With differential privacy")."""
        L, x = self.L, share[:self.main_len]
        hi, lo = x[:L], x[L:]
        bits = share[self.commit_len:self.commit_len + self.n_bits]
        one = 1 if leader else 0
        s, tau = self.sizes, self.tau
        f1s = 1 << self.f1
        dec = {name: self._decompose(bits, name) for name in
               ("n", "n_gap", "counts", "count_gap", "sum", "sum_gap", "slack")}
        n_val, cval = dec["n"], dec["counts"]

        def const(v: int) -> np.uint64:
            return np.uint64(v * one)

        def total(v) -> np.ndarray:
            return np.array([flp.sum_mod(v)], dtype=np.uint64)

        rel = [
            lo[[self.i_n, self.i_contrib, *self.i_counts]],                          # on the grid: lo lane 0
            hi[self.i_tag], lo[self.i_tag],                                          # tag slots 0
            flp.sub(hi[[self.i_contrib]], np.uint64(f1s * one)),                     # one contributor (no noise)
            flp.sub(flp.add(hi[[self.i_n]], const(tau)), n_val),                     # hi_n >= -tau
            flp.sub(flp.add(n_val, dec["n_gap"]), const(s["n_top"])),                # hi_n <= n_max 2^f1 + tau
            flp.sub(flp.add(hi[self.i_counts], const(tau)), cval),                   # counts >= -tau
            flp.sub(flp.add(cval, dec["count_gap"]), const(s["n_top"])),             # counts <= n_max 2^f1 + tau
            flp.sub(flp.add(flp.sub(total(cval), n_val), const(2 * tau)), dec["sum"]),  # sum - n >= -(C+1) tau
            flp.sub(flp.add(dec["sum"], dec["sum_gap"]), const(s["e_top"])),        # sum - n <= (C+1) tau
            flp.sub(flp.add(flp.scale(n_val, s["c_B"]), const(s["trace_c"])),       # 2^g trace <= c_B hi_n + ...
                    flp.add(dec["slack"],
                            flp.scale(flp.add(total(hi[self.i_diag]), const(self.d * tau)), 1 << s["g"]))),
        ]
        rel.append(flp.sub(flp.add(self.project(x, fs), np.uint64(self.T * one)), self._decompose(bits, "proj")))
        out = np.concatenate(rel)
        if out.shape[0] != self.n_relations:  # pragma: no cover - a layout slip would silently drop a check
            raise AssertionError("relation count")
        return out

    def query(self, share: np.ndarray, commitment: UploadCommitment, hospital: str, query_seed: bytes, *,
              leader: bool) -> np.ndarray:
        """One verifier's message: ``[linear combination of the relations] ++ REPS bit-proof queries``."""
        fs = self.fs_seed(hospital, commitment.main_sha256, commitment.seed_sha256)
        pts, coeffs = self.query_rand(fs, commitment.aux_sha256, query_seed)
        rel = self.relations(share, fs, leader=leader)
        bits = share[self.commit_len:self.commit_len + self.n_bits]
        off = self.commit_len + self.n_bits
        proofs = share[off:off + REPS * self.bits.proof_len].reshape(REPS, self.bits.proof_len)
        msgs = [np.array([flp.dot(row, rel) for row in coeffs], dtype=np.uint64)]
        for jr, t, pf in zip(self.joint_rand(fs, commitment.aux_sha256), pts, proofs):
            msgs.append(self.bits.query(bits, pf, jr, t, leader=leader))
        if self.gram is not None:
            msgs.append(self._gram_query(share, fs, commitment.aux_sha256, query_seed, leader=leader))
        return np.concatenate(msgs)

    def decide(self, leader_msg, helper_msg) -> str | None:
        """None if the upload is valid, else which check failed (``linear`` or ``bits``)."""
        a = np.asarray(leader_msg, dtype=np.uint64)
        b = np.asarray(helper_msg, dtype=np.uint64)
        if a.shape != (self.verifier_len,) or b.shape != (self.verifier_len,) or \
                int(max(a.max(), b.max())) >= flp.P:
            raise MalformedPayload("a verifier message has the wrong shape")
        v = flp.add(a, b)
        if any(int(z) for z in v[:LINEAR_REPS]):
            return "linear"
        k, o = self.bits.verifier_len, LINEAR_REPS
        for r in range(REPS):
            if not self.bits.decide(v[o + r * k:o + (r + 1) * k]):
                return "bits"
        if self.gram is not None:
            o += REPS * k
            if any(int(z) for z in v[o:o + LINEAR_REPS]):
                return "gram_range"
            if any(int(z) for z in v[o + LINEAR_REPS:o + 2 * LINEAR_REPS]):
                return "gram"
            o += 2 * LINEAR_REPS
            k = self.sq.verifier_len
            for q in range(GRAM_QUERIES):
                if not self.sq.decide(v[o + q * k:o + (q + 1) * k]):
                    return "gram"
        return None


def _trit_table() -> np.ndarray:
    """Byte -> its four trits, two bits each (low bit: nonzero, high bit: sign): 0 w.p. 1/2, +-1 w.p. 1/4.

    Stored as one 16-byte item per byte value (four float32 viewed as a complex128) so that a row block is a
    single 1-D ``take``, several times faster than indexing a (256, 4) table."""
    t = np.zeros((256, 4), dtype=np.float32)
    for byte in range(256):
        for k in range(4):
            nz, sg = (byte >> (2 * k)) & 1, (byte >> (2 * k + 1)) & 1
            t[byte, k] = 0.0 if not nz else (-1.0 if sg else 1.0)
    return t.view(np.complex128).ravel()


_TRITS = _trit_table()
#: entries summed per float32 product: 255 * 2^16 < 2^24 keeps every partial sum exact
_PROJ_CHUNK = 1 << 16
#: project with the compiled kernel when numba is installed and this process projects often enough to pay for
#: loading it (:mod:`secure_afl.hazmat.ternary`); else float32 BLAS
_COMPILED = True


def _exact_gram(m: np.ndarray) -> np.ndarray:
    """``m m^T`` of an int64 matrix, exactly, through float64 BLAS: entries cut into 2^h limbs so every product
    sum of limbs stays below 2^53; the result (below 2^62 here) is recombined in int64."""
    width = max(1, int(np.max(np.abs(m))).bit_length()) if m.size else 1
    h = -(-width // 2)
    if 2 * h + max(1, m.shape[1]).bit_length() > 53:  # pragma: no cover - the session's sizes keep it below
        raise InvalidParameterError("the Gram factor's entries are too wide for an exact product")
    hi, lo = np.divmod(m, np.int64(1 << h))
    a, b = hi.astype(np.float64), lo.astype(np.float64)
    aa, bb = (a @ a.T).astype(np.int64), (b @ b.T).astype(np.int64)
    ab = (a @ b.T).astype(np.int64)
    return (aa << (2 * h)) + ((ab + ab.T) << h) + bb


class _Unlucky(Exception):
    """An honest vector's projection left the range for this seed (probability < 2^-16)."""


def describe(circuit: Circuit) -> Mapping:
    """Sizes for the docs and the benchmark."""
    return {"L": circuit.L, "main_words": circuit.main_len, "aux_bits": circuit.n_bits,
            "proof_words": circuit.proof_len, "verifier_words": circuit.verifier_len,
            "chunk": circuit.bits.chunk, "domain": circuit.bits.n, "frac_bits": [circuit.f1, circuit.f2],
            "T_hi_log2": circuit.sizes["m_hi"] - 1,
            "gram": None if circuit.gram is None else {
                "factor_words": circuit.n_f, "factor_scale_bits": circuit.gram["f"], "t": circuit.gram["t"],
                "T_factor_log2": circuit.gram["m_f"] - 1, "jitter": circuit.gram["jitter"],
                "square_sum_proof_words": GRAM_QUERIES * circuit.sq.proof_len},
            "soundness_bits_q64": round(soundness_bits(circuit), 1)}


# -- the protocol around the proof: the server's signed verifier message, the key holder's verdicts ------------
_VERIFIER_SIG_PREFIX = domains.SPLIT_VERIFIER


def check_upload(backend, payload: bytes, statement: Mapping) -> None:
    """Server, at upload: the signed commitment is of this payload's words (else the rows and the joint
    randomness would not be bound to the data they test)."""
    share = backend.upload_share(payload)
    backend.circuit.check_commitment(share, UploadCommitment.from_dict(statement.get("validity")), leader=True)


def _verifier_statement(params: SessionParams, hospital: str, payload_sha256: str, query_seed: bytes,
                        message: np.ndarray) -> dict:
    return {"type": "split-verifier", "v": 1, "session_id": params.session_id,
            "params_digest": params.digest().hex(), "hospital": hospital, "payload_sha256": payload_sha256,
            "query_seed": bytes(query_seed).hex(), "message": flp.to_bytes(message).hex()}


def _leader_query(circuit: Circuit, hospital: str, payload: bytes, validity, query_seed: bytes) -> np.ndarray:
    """The server's verifier message (unsigned) for one upload: the commitment checked against its words."""
    commitment = UploadCommitment.from_dict(validity)
    share = circuit.upload_share(payload)
    circuit.check_commitment(share, commitment, leader=True)
    return circuit.query(share, commitment, hospital, query_seed, leader=True)


def _sign_leader(params: SessionParams, hospital: str, payload_sha256: str, query_seed: bytes, message,
                 identity_key) -> dict:
    st = _verifier_statement(params, hospital, payload_sha256, query_seed, message)
    return {**st, "signature": identity_key.sign(_VERIFIER_SIG_PREFIX + canonical_json(st)).hex()}


def query_key(secret_context: bytes) -> bytes:
    """Key holder: its per-session query key, derived from its secret seed key (which never leaves it)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=domains.SPLIT_QUERY_KEY).derive(bytes(secret_context))


def query_seed(key: bytes, params: SessionParams, hospital: str, payload_sha256: str, validity) -> bytes:
    """Key holder: one upload's query seed, ``HMAC-SHA256(query key, SPLIT_QUERY || upload)`` over the
    hospital-signed commitment: fixed only once the upload is, and unknown to anyone without the key holder's
    key until the key holder hands it to the server (docs/VALIDITY.md, "Verifying as uploads arrive")."""
    import hmac

    upload = canonical_json({"session_id": params.session_id, "params_digest": params.digest().hex(),
                             "hospital": hospital, "payload_sha256": payload_sha256,
                             "validity": UploadCommitment.from_dict(validity).to_dict()})
    return hmac.new(bytes(key), _QUERY_PREFIX + upload, hashlib.sha256).digest()


_QUERY_PREFIX = domains.SPLIT_QUERY


def leader_message(backend, hospital: str, payload: bytes, statement: Mapping, identity_key,
                   query_seed: bytes) -> dict:
    """Server: its verifier message for one upload at the key holder's query seed for it, signed over the
    session, hospital and payload hash so the key holder can hold it to it."""
    qs = bytes(query_seed)
    msg = _leader_query(backend.circuit, hospital, payload, statement.get("validity"), qs)
    return _sign_leader(backend.params, hospital, hashlib.sha256(payload).hexdigest(), qs, msg, identity_key)


#: uploads per worker process below which a verifier judges them in its own process (a spawned worker
#: costs about a second of interpreter start and imports)
PROCESS_MIN_UPLOADS = 32


def leader_messages(params: SessionParams, uploads, identity_key, *, workers: int = 1) -> dict:
    """Server: hospital -> its signed verifier message, for every ``(hospital, payload file, payload_sha256,
    statement, query seed)`` in ``uploads`` (the query seed the key holder sent for that upload).

    The messages are formed in ``workers`` spawned processes when there are enough uploads
    (:data:`PROCESS_MIN_UPLOADS` per worker; the projection's table lookups and the small field operations
    hold the GIL, so threads would not scale); each worker reads the payload file and checks it is the
    upload the key holder named. Only this process holds ``identity_key`` and signs."""

    items = [(h, str(path), sha, statement.get("validity"), bytes(qs)) for h, path, sha, statement, qs in uploads]
    w = workers if len(items) >= PROCESS_MIN_UPLOADS * max(1, workers) else 1
    messages = {h: msg for chunk in map_chunks(_leader_chunk, params.to_dict(), items, w) for h, msg in chunk}
    return {h: _sign_leader(params, h, sha, qs, flp.from_bytes(messages[h]), identity_key)
            for h, _, sha, _, qs in items}


def _leader_chunk(params_dict: dict, items: list) -> list:
    """One worker's part of :func:`leader_messages`: (hospital, unsigned message bytes) per upload."""
    circuit = Circuit(SessionParams.from_dict(params_dict))
    out = []
    for h, path, sha, validity, qs in items:
        with open(path, "rb") as f:
            payload = f.read()
        if hashlib.sha256(payload).hexdigest() != sha:
            raise MalformedPayload(f"the stored upload of {h} is not the one the manifest names")
        out.append((h, flp.to_bytes(_leader_query(circuit, h, payload, validity, qs))))
    return out


def verify_leader_message(statement, server_pub, circuit: Circuit, hospital: str,
                          payload_sha256: str, expected_query_seed: bytes) -> tuple[bytes, np.ndarray]:
    """Key holder: the server's message for exactly this upload, at the query seed this key holder derived for
    it -> (query seed, message); else :class:`InvalidSignature` (unsigned, forged, replayed from another upload
    or session, or formed at a query seed of the server's own: before the key holder's query existed)."""
    from cryptography.exceptions import InvalidSignature as _Bad

    from ..exceptions import InvalidSignature

    try:
        qs = bytes.fromhex(statement["query_seed"])
        msg = flp.from_bytes(bytes.fromhex(statement["message"]), circuit.verifier_len,
                             what=f"the server's verifier message for {hospital}")
        sig = bytes.fromhex(statement["signature"])
    except (KeyError, TypeError, ValueError):
        raise InvalidSignature(f"the server's verifier message for {hospital} is missing or malformed") from None
    if not hmac_compare(qs, expected_query_seed):
        raise InvalidSignature(f"the server's verifier message for {hospital} was not formed at this key "
                               "holder's query seed for that upload (formed before it, or for another upload)")
    st = _verifier_statement(circuit.params, hospital, payload_sha256, qs, msg)
    if {k: statement.get(k) for k in st} != st:
        raise InvalidSignature(f"the server's verifier message for {hospital} is for another upload or session")
    try:
        server_pub.verify(sig, _VERIFIER_SIG_PREFIX + canonical_json(st))
    except _Bad:
        raise InvalidSignature(f"the server's verifier message for {hospital} is not signed by the server") from None
    return qs, msg


def hmac_compare(a: bytes, b: bytes) -> bool:
    import hmac

    return hmac.compare_digest(bytes(a), bytes(b))


def helper_verdict(circuit: Circuit, hospital: str, seed: bytes, statement: Mapping, query_seed: bytes,
                   leader_msg: np.ndarray, *, share: np.ndarray | None = None, with_message: bool = False):
    """Key holder: None if ``hospital``'s upload is valid, else the check it failed. ``share``: this seed's
    :meth:`Circuit.helper_share` when the caller has already expanded it (the release sums its lane part).
    ``with_message``: ``(verdict, this key holder's own verifier message or None)``, the message it publishes
    beside the server's when it refuses."""
    commitment = UploadCommitment.from_dict(statement.get("validity"))
    try:
        circuit.check_commitment(None, commitment, leader=False, seed=seed)
    except MalformedPayload:
        return ("commitment", None) if with_message else "commitment"
    share = circuit.helper_share(seed) if share is None else share
    own = circuit.query(share, commitment, hospital, query_seed, leader=False)
    verdict = circuit.decide(leader_msg, own)
    return (verdict, own) if with_message else verdict


def joint_verdict(params: SessionParams, hospital: str, payload_sha256: str, server_message: Mapping,
                  keyholder_message_hex: str, server_pub) -> str | None:
    """Anyone: the verdict the two published verifier messages give (None: valid, else the failed check),
    after checking the server's signature over its message for exactly this upload."""
    circuit = Circuit(params)
    _, leader = verify_leader_message(server_message, server_pub, circuit, hospital, payload_sha256,
                                      _signed_query_seed(server_message, hospital))
    helper = flp.from_bytes(bytes.fromhex(keyholder_message_hex), circuit.verifier_len,
                            what=f"the key holder's verifier message for {hospital}")
    return circuit.decide(leader, helper)


def _signed_query_seed(server_message, hospital: str) -> bytes:
    """The query seed the server signed its message at. Only the key holder can derive an upload's query seed
    (:func:`query_seed`); anyone else recomputes a verdict at the seed the server signed, which is the one the
    key holder formed its own message at whenever the two agree (a message formed at another seed fails
    :meth:`Circuit.decide`, except with the proof's soundness error)."""
    from ..exceptions import InvalidSignature

    try:
        return bytes.fromhex(server_message["query_seed"])
    except (KeyError, TypeError, ValueError):
        raise InvalidSignature(f"the server's verifier message for {hospital} is missing or malformed") from None


def dispute(params: SessionParams, hospital: str, payload: bytes, statement: Mapping, server_message: Mapping,
            keyholder_message_hex: str | None, server_pub) -> dict:
    """The refused hospital: who is at fault, from its own upload (``payload`` and signed seed
    ``statement``, whose hash its receipt acknowledges) and the two published messages.

    The server's verifier message is a deterministic function of the upload and the query seed it signed, so
    the hospital recomputes it: a signed message that differs is the server's forgery, provable to anyone
    given the payload. If the server's message is true, the failed verdict rests on the upload itself (or on
    the key holder's message, which the key holder signed in its share statement). Returns ``{"at_fault":
    "server" | "hospital", "server_message_true": bool, "verdict": ...}``."""
    circuit = Circuit(params)
    sha = hashlib.sha256(payload).hexdigest()
    qs, leader = verify_leader_message(server_message, server_pub, circuit, hospital, sha,
                                       _signed_query_seed(server_message, hospital))
    try:
        own_leader = _leader_query(circuit, hospital, payload, statement.get("validity"), qs)
    except MalformedPayload:
        return {"at_fault": "hospital", "server_message_true": False, "verdict": "commitment"}
    true = bool(np.array_equal(np.asarray(own_leader), np.asarray(leader)))
    verdict = None
    if keyholder_message_hex is not None:
        helper = flp.from_bytes(bytes.fromhex(keyholder_message_hex), circuit.verifier_len,
                                what=f"the key holder's verifier message for {hospital}")
        verdict = circuit.decide(own_leader, helper)
    return {"at_fault": "hospital" if true else "server", "server_message_true": true, "verdict": verdict}


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
    return d * 2.0 ** (63 - f1 - f2) + (2 * d + 1) * 2.0 ** -53 * fro


def proven_aggregate_bound(params: SessionParams) -> float:
    """|entry| of a sum of k_max proven uploads (docs/VALIDITY.md): each high-lane entry is within 2T, and the
    low-lane sum, whatever the uploads hold there, is read as a centred value below 2^63."""
    f1, f2 = (int(v) for v in params.backend_params["frac_bits"])
    s = _sizes(params, f1, f2)
    return float(params.bounds.k_max) * 2.0 ** (s["m_hi"] - f1) + 2.0 ** (63 - f1 - f2)
