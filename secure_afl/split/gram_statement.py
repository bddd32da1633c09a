"""split's Gram statement, the optional part of a session's statement (``[split] gram_proof``): the statistics
are ``2^t (L L^T + D)`` for a lower-triangular factor L the upload carries (docs/VALIDITY.md, "The Gram
statement"); under DP also each noise share's per-entry and l2 bounds. It implements the one interface of
:class:`secure_afl.split.statements.Statement`.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from .. import domains
from .._blas import one_blas_thread
from ..exceptions import BoundsExceeded, InvalidInputError
from ..hazmat.flp_square import SquareSumProof
from ..params import SessionParams
from .projection import exact_gram, project
from .sizes import GRAM_QUERIES, GRAM_RHOS, LINEAR_REPS, NOISE_L2_TAIL_BITS, ROWS, field_of
from .statements import PROOF_DOMAIN, Prover, Shares, Statement, Unlucky, total

__all__ = ["GramStatement"]

_FROW_DOMAIN = domains.SPLIT_GRAM_ROW_XOF
_RHO_DOMAIN = domains.SPLIT_RHO_XOF


class GramStatement(Statement):
    """The Gram part (docs/VALIDITY.md, "The Gram statement"): ``A = [[diag(counts), Q^T], [Q, C^r]]`` in the
    high lane (classes first, so the factor's first block is diagonal) equals ``2^t (L L^T + diag(delta, 0))``
    with L lower triangular (its words follow the lanes in the body), ``delta >= 0`` (bits), every factor entry
    within ``2 T_f`` (projection rows of its own); the identity is checked on ``GRAM_RHOS`` Fiat-Shamir vectors
    rho through ``GRAM_QUERIES`` square-sum proofs of ``|L^T rho|^2``.

    With DP the lanes hold the statistics plus the hospital's noise share z (grid units, at ``2^z_shift`` in the
    lanes); z travels as words of its own after the factor, each proven in ``[-T_z, T_z)`` by its bits in
    Goldilocks, within ``2 T_z`` by ROWS projection rows of its own in Field128 (``noise_range``), and A is read
    from the lanes less ``2^z_shift z``: the identity is of the statistics before the noise (docs/VALIDITY.md,
    "The Gram statement with differential privacy")."""

    def __init__(self, params: SessionParams, sizes: dict, L: int):
        self.params, self.g, self.L = params, sizes, L
        #: the field the session's circuit runs over
        self.F = field_of(params)
        lay = params.layout
        self.d, self.C = lay.dim, lay.n_classes
        self.n_f = sizes["n_f"]
        self.T_f = 1 << (sizes["m_f"] - 1)
        #: DP: the noise share's words (the noised entries, in layout order) and their proven range
        self.n_z = sizes["n_z"]
        self.noise = self.n_z > 0
        self.T_z = 1 << (sizes["m_z"] - 1) if self.noise else 0
        #: Field128: the share's range by projection rows (its square below p there), not per-entry bits
        self.noise_rows = bool(sizes["noise_rows"])
        #: the share's weight in the lanes: 2^f2 within one Field128 word, 1 in the high lane beside a low one
        self.z_scale = 1 << sizes["z_shift"]
        self.i_noise = np.arange(lay.slices["gram"].start, lay.slices["gram"].start + self.n_z)
        self.i_counts = np.arange(lay.slices["counts"].start, lay.slices["counts"].stop)
        #: one exact Field128 word per value: the residual R = 2^t (L L^T + D) - A, one word per entry of A
        #: (its slots in layout order: Gram, cross, counts), each proven within 2T_R (docs/VALIDITY.md)
        self.n_r = sizes["n_r"]
        self.exact = self.n_r > 0
        self.T_r = 1 << (sizes["m_r"] - 1) if self.exact else 0
        sl = lay.slices
        self.i_a = np.concatenate([np.arange(sl["gram"].start, sl["gram"].stop),
                                   np.arange(sl["cross"].start, sl["cross"].stop),
                                   np.arange(sl["counts"].start, sl["counts"].stop)])
        #: the range rows (the factor's, then the residual's), combined in one random combination pair
        self.n_range = ROWS * (2 if self.exact else 1)
        #: the words the statement adds after the lanes: the factor, then the noise share, then the residual
        self.n_words = self.n_f + self.n_z + self.n_r
        self.sq = SquareSumProof(sizes["m"], GRAM_RHOS, field=self.F)
        #: DP: the square-sum proofs of |z|^2 in z_groups groups of z_len entries, checked against the share's l2
        #: bound l2_z
        self.zsq = SquareSumProof(sizes["z_len"], sizes["z_groups"], field=self.F) if self.noise else None
        self.l2_z = sizes["l2_z"] if self.noise else 0
        self.z_groups = sizes["z_groups"] if self.noise else 0
        #: proofs (each blinded by 32 bytes of the prover's randomness): GRAM_QUERIES of |L^T rho|^2, and under DP
        #: GRAM_QUERIES of |z|^2
        self.n_proofs = GRAM_QUERIES * (2 if self.noise else 1)
        self.proof_len = GRAM_QUERIES * (self.sq.proof_len + (self.zsq.proof_len if self.noise else 0))
        #: the noise share's range relations: one per word (its bits) or one per projection row
        self.n_noise_range = (ROWS if self.noise_rows else self.n_z) if self.noise else 0
        self.verifier_len = 2 * LINEAR_REPS + GRAM_QUERIES * self.sq.verifier_len + \
            ((LINEAR_REPS + GRAM_QUERIES * self.zsq.verifier_len) if self.noise else 0)
        self.n_gram_relations = GRAM_QUERIES * GRAM_RHOS
        self._tril = np.tril_indices(self.d)

    name = "gram"

    def relation_groups(self):
        return []  # its relations are checked in random combinations of their own (:meth:`query`)

    def relations(self, v):
        return []

    def upload(self, lanes_of, vector, noise):
        return self.factorise(lanes_of, vector, noise)

    def witness(self, u: Prover, *, check: bool) -> dict:
        return self._witness([int(u.hi[i]) for i in self.i_counts], u.words, u.fs, check=check)

    def query(self, v: Shares, query_seed: bytes) -> np.ndarray:
        return self._query(v.hi, v.words, v.dec, v.proofs, v.fs, v.aux_sha256, query_seed, leader=v.leader)

    def failures(self, v: Shares) -> list[str]:
        fw = np.asarray(v.words, dtype=self.F.dtype)
        rhos = self.rhos(v.fs, v.aux_sha256)
        squares = [self.F.dot(x, x) for x in self.factor_vectors(fw, rhos)]
        zsquare = [self.F.dot(g, g) for g in self._z_groups(fw)] if self.noise else None
        rng, quad, _, noise, l2 = self.values(v.hi, fw, v.dec, None, v.fs, v.aux_sha256, leader=True,
                                              squares=squares, zsquare=zsquare)
        return [name for name, vals in (("gram_range", rng), ("gram_identity", quad), ("noise_range", noise),
                                        ("noise_l2", l2)) if np.any(self.F.to_ints(vals) != 0)]

    def soundness(self) -> tuple[float, float, int]:
        # the factor's range rows; GRAM_RHOS vectors rho, each missing a nonzero symmetric A - 2^t (L L^T + D)
        # with probability <= 2/p (Schwartz-Zippel, degree 2); the square-sum proofs' query points (the factor's,
        # and under DP the noise share's); two more random combinations, three under DP
        p = float(self.F.P)
        per_query = 2.0 ** -ROWS * (1 + self.exact + self.noise_rows) + (2.0 / p) ** GRAM_RHOS
        query_point = ((2 * self.sq.n - 2) / (p - self.sq.n)) ** GRAM_QUERIES
        if self.noise:
            query_point += ((2 * self.zsq.n - 2) / (p - self.zsq.n)) ** GRAM_QUERIES
        return per_query, query_point, 2 + (1 if self.noise else 0)

    def describe(self) -> dict:
        g = self.g
        return {"gram": {
            "factor_words": self.n_f, "noise_words": self.n_z, "noise_bound_log2": g["z_log2"] if self.noise else None,
            "noise_range": ("projection rows" if self.noise_rows else "bits") if self.noise else None,
            "noise_l2_bound": g["l2_z"] if self.noise else None,
            "noise_l2_groups": g["z_groups"] if self.noise else None,
            "factor_scale_bits": g["f"], "t": g["t"], "T_factor_log2": g["m_f"] - 1, "jitter": g["jitter"],
            "square_sum_proof_words": GRAM_QUERIES * self.sq.proof_len,
            "residual_words": self.n_r, "T_residual_log2": g["m_r"] - 1 if self.exact else None,
            "least_eigenvalue_floor": -g["slack"] if self.exact else 0.0}}

    def blocks(self) -> list[tuple[str, int, int]]:
        return [("gram_slack", self.C, self.g["m_d"]), ("proj_f", ROWS, self.g["m_f"])] + \
            ([("proj_r", ROWS, self.g["m_r"])] if self.exact else []) + \
            ([("proj_z", ROWS, self.g["m_z"]) if self.noise_rows else ("noise", self.n_z, self.g["m_z"]),
              ("noise_sq", self.z_groups, self.g["m_g"]),
              ("noise_l2", 1, self.g["m_l"])] if self.noise else [])

    def relation_names(self) -> list[str]:
        return ["gram_range", "gram_identity"] + (["noise_range", "noise_l2"] if self.noise else [])

    def statistics(self, hi, words) -> np.ndarray:
        """The high lane less the noise share (its words after the factor, at 2^z_shift; the lane itself without
        DP), plus the residual R on A's entries where the lanes are exact (one Field128 word per value, no DP)."""
        if not (self.exact or self.noise):
            return hi
        out = np.array(hi, dtype=self.F.dtype, copy=True)
        if self.exact:
            out[self.i_a] = self.F.add(out[self.i_a], self.residual(words))
        if self.noise:
            out[self.i_noise] = self.F.sub(out[self.i_noise], self.F.scale(self.noise_words(words), self.z_scale))
        return out

    def noise_words(self, words) -> np.ndarray:
        """The noise share's words (after the factor; grid units)."""
        return np.asarray(words, dtype=self.F.dtype)[self.n_f:self.n_f + self.n_z]

    # -- the factor ---------------------------------------------------------------------------------------
    def rhos(self, fs: bytes, aux_sha256: str) -> np.ndarray:
        """(GRAM_RHOS, m): the Fiat-Shamir vectors, fixed by the lanes, the factor and the bits (delta)."""
        key = hashlib.sha256(fs + domains.SPLIT_FS_GRAM + bytes.fromhex(aux_sha256)).digest()
        return self.F.expand_field(key, GRAM_RHOS * self.g["m"], _RHO_DOMAIN).reshape(GRAM_RHOS, self.g["m"])

    def _factor_blocks(self, fw: np.ndarray):
        d, C = self.d, self.C
        l21 = fw[C:C + d * C].reshape(d, C)
        l22 = self.F.zeros((d, d))
        l22[self._tril] = fw[C + d * C:self.n_f]
        return fw[:C], l21, l22

    def factor_vectors(self, fw, rhos) -> np.ndarray:
        """``L^T rho`` for each rho (linear in the factor words: the verifiers apply it to their shares)."""
        l11, l21, l22 = self._factor_blocks(np.asarray(fw, dtype=self.F.dtype))
        out = []
        for rho in rhos:
            rc, rf = rho[:self.C], rho[self.C:].reshape(-1, 1)
            F = self.F
            out.append(np.concatenate([F.add(F.mul(l11, rc), F.sum_mod(F.mul(l21, rf), axis=0)),
                                       F.sum_mod(F.mul(l22, rf), axis=0)]))
        return np.stack(out)

    def kappa(self, rho) -> np.ndarray:
        """The high-lane coefficients of ``rho^T A rho`` (A read from the packed triu(C^r), Q and counts)."""
        sl = self.params.layout.slices
        rc, rf = rho[:self.C], rho[self.C:]
        r, c = np.triu_indices(self.d)
        k = self.F.zeros(self.L)
        g = self.F.mul(rf[r], rf[c])
        k[sl["gram"]] = np.where(r == c, g, self.F.add(g, g))
        q = self.F.mul(rf.reshape(-1, 1), rc.reshape(1, -1)).ravel()
        k[sl["cross"]] = self.F.add(q, q)
        k[sl["counts"]] = self.F.mul(rc, rc)
        return k

    def residual(self, words) -> np.ndarray:
        """The residual words R (after the factor and the noise share), one per entry of A."""
        o = self.n_f + self.n_z
        return np.asarray(words, dtype=self.F.dtype)[o:o + self.n_r]

    def project_residual(self, words, fs: bytes) -> np.ndarray:
        """``<r_j, R>`` mod p for ROWS rows of their own."""
        return project(self.residual(words), hashlib.sha256(fs + domains.SPLIT_FS_RESIDUAL_ROWS).digest(),
                       _FROW_DOMAIN, compiled=True, field=self.F)

    def project_noise(self, words, fs: bytes) -> np.ndarray:
        """``<r_j, z>`` mod p for ROWS rows of their own (Field128: the noise share's range)."""
        return project(self.noise_words(words), hashlib.sha256(fs + domains.SPLIT_FS_NOISE_ROWS).digest(),
                       _FROW_DOMAIN, compiled=True, field=self.F)

    def project_factor(self, fw, fs: bytes) -> np.ndarray:
        """``<r_j, factor>`` mod p for ROWS rows of their own."""
        return project(np.asarray(fw, dtype=self.F.dtype)[:self.n_f],
                       hashlib.sha256(fs + domains.SPLIT_FS_FACTOR_ROWS).digest(), _FROW_DOMAIN, compiled=True,
                       field=self.F)

    def factorise(self, lanes_of, vector, noise=None) -> tuple[np.ndarray, np.ndarray]:
        """Hospital: ``(lanes, factor words)`` with the Gram, cross and count entries of the lanes exactly
        ``2^t L L^T`` (low lanes 0) for the rounded factor L at scale 2^f: l_c = floor(sqrt(count_c) 2^f),
        the rest of L the Cholesky factor of the statistics (plus the session's jitter where gamma does not
        cover the rounding), rounded towards zero so no diagonal grows. :class:`BoundsExceeded` if the
        statistics are not positive semi-definite (not the Gram of any rows). ``lanes_of``: the session's
        fixed-point lanes of a packed vector. With DP, ``vector`` is the statistics BEFORE the noise and ``noise``
        the hospital's share (:func:`secure_afl.dp.noise_share`, grid units): the lanes get it added on the
        snapped statistics (what :func:`secure_afl.dp.add_noise_share` gives) and the words carry it after the
        factor."""
        g = self.g
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
        # one BLAS thread: at d = 512 a second one added 0.29 CPU s to the factor's 0.37 s and no wall time (the
        # exact product's recombination is not BLAS), and a many-core hospital would spin one per core
        with one_blas_thread():
            S = np.asarray(st.gram, dtype=np.float64) + g["jitter"] * np.eye(self.d) - lr @ lr.T
            try:
                chol = np.linalg.cholesky(0.5 * (S + S.T))
            except np.linalg.LinAlgError:
                raise BoundsExceeded("the statistics are not positive semi-definite: no rows have this Gram "
                                     "matrix and these cross terms") from None
            l21 = l21.astype(np.int64)
            l22 = np.trunc(chol * 2.0 ** f).astype(np.int64)
            gram = exact_gram(np.concatenate([l21, l22], axis=1))
        x = lanes_of(v).copy()
        sl = lay.slices
        r, c = np.triu_indices(self.d)
        idx = np.concatenate([np.arange(sl["gram"].start, sl["gram"].stop), np.arange(sl["cross"].start,
                              sl["cross"].stop), np.arange(sl["counts"].start, sl["counts"].stop)])
        if gram.dtype == object:  # one Field128 word per value: A at 2^(2f + t) is past int64
            vals = np.concatenate([gram[r, c], (l21.astype(object) * l11.astype(object).reshape(1, -1)).ravel(),
                                   np.array([v * s2f for v in cnt], dtype=object)]) * (1 << t)
        else:
            vals = np.concatenate([gram[r, c], (l21 * l11.reshape(1, -1)).ravel(),
                                   np.array(cnt, dtype=np.int64) * s2f]) << t
        fw = self.F.encode_signed(np.concatenate([l11, l21.ravel(), l22[self._tril]]))
        if self.exact:
            # the lanes stay exact; R = 2^t (L L^T + D) - A travels beside the factor (0 on the counts, where
            # D = diag(delta) takes the count's rounding)
            a = self.F.decode_signed(x[self.i_a])
            return x, np.concatenate([fw, self.F.encode_signed(np.asarray(vals, dtype=object) - a)])
        x[idx] = self.F.encode_signed(vals)
        if x.shape[0] > self.L:  # two lanes: the snapped entries' low lanes are 0
            x[self.L + idx] = 0
        if not self.noise:
            return x, fw
        if noise is None:
            raise InvalidInputError("a DP session's Gram statement takes the noise share beside the statistics")
        z = np.asarray(noise, dtype=np.float64)
        if z.shape != (lay.length,):
            raise InvalidInputError("the noise share is not one entry per packed slot")
        z = z[self.i_noise]
        if not np.all(np.isfinite(z)) or np.any(z != np.round(z)) or np.any(np.abs(z) >= self.T_z):
            raise BoundsExceeded("the noise share is not integers within the session's noise bound")
        zi = z.astype(np.int64)
        hi = self.F.decode_signed(x[:self.L])
        # over one Field128 word the share sits at 2^f2 (Python integers there: past int64)
        hi[self.i_noise] += zi if self.z_scale == 1 else zi.astype(object) * self.z_scale
        x[:self.L] = self.F.encode_signed(hi)
        return x, np.concatenate([fw, self.F.encode_signed(zi)])

    # -- prover -------------------------------------------------------------------------------------------
    def _witness(self, hi_counts, factor, fs: bytes, *, check: bool) -> dict:
        """The count slack delta_c = hi(count_c) / 2^t - l_c^2 (the count less its noise under DP), the factor's
        projection values and the noise words shifted by T_z."""
        g = self.g
        fw = self.F.zeros(self.n_words) if factor is None else np.asarray(factor, dtype=self.F.dtype)
        out = {}
        if self.noise:
            z = [int(v) for v in self.F.decode_signed(self.noise_words(fw))]
            zc = z[self.i_counts[0] - self.i_noise[0]:self.i_counts[-1] + 1 - self.i_noise[0]]
            hi_counts = [h - v * self.z_scale for h, v in zip(hi_counts, zc)]
            if self.noise_rows:
                out["proj_z"] = [int(v) + self.T_z for v in self.F.decode_signed(self.project_noise(fw, fs))]
                if check and not all(0 <= v < 2 * self.T_z for v in out["proj_z"]):
                    raise Unlucky()
            else:
                out["noise"] = [v + self.T_z for v in z]  # the honest prover's range is checked in factorise
            n = g["z_len"]
            out["noise_sq"] = [sum(v * v for v in z[i:i + n]) for i in range(0, n * self.z_groups, n)]
            out["noise_l2"] = [self.l2_z - sum(out["noise_sq"])]
            if check and not (0 <= out["noise_l2"][0] < 1 << g["m_l"] and max(out["noise_sq"]) < 1 << g["m_g"]):
                raise BoundsExceeded("the noise share's l2 norm exceeds the session's bound (an honest share does "
                                     f"with probability below 2^-{NOISE_L2_TAIL_BITS}: draw it again)")
        l11 = self.F.decode_signed(fw[:self.C]).tolist()
        delta = [(h >> g["t"]) - int(v) * int(v) for h, v in zip(hi_counts, l11)]
        proj = [int(v) + self.T_f for v in self.F.decode_signed(self.project_factor(fw, fs))]
        if self.exact:
            out["proj_r"] = [int(v) + self.T_r for v in self.F.decode_signed(self.project_residual(fw, fs))]
        if check:
            if not all(0 <= x < 1 << g["m_d"] for x in delta):
                raise BoundsExceeded("the Gram factor does not match the class counts")
            if not all(0 <= v < 2 * self.T_f for v in proj) or \
                    not all(0 <= v < 2 * self.T_r for v in out.get("proj_r", [])):
                raise Unlucky()
        return {"gram_slack": delta, "proj_f": proj, **out}

    def prove(self, fw, fs: bytes, aux_sha256: str, proof_rand: list[bytes]) -> list[np.ndarray]:
        """The ``GRAM_QUERIES`` square-sum proofs of ``L^T rho`` (then, under DP, those of the noise share z), each
        blinded by its 32 random bytes (:attr:`n_proofs` of them)."""
        v = self.factor_vectors(fw, self.rhos(fs, aux_sha256))
        out = [self.sq.prove(v, self.F.expand_field(r, self.sq.chunk, PROOF_DOMAIN))
               for r in proof_rand[:GRAM_QUERIES]]
        if self.noise:
            z = self._z_groups(fw)
            out += [self.zsq.prove(z, self.F.expand_field(r, self.zsq.chunk, PROOF_DOMAIN))
                    for r in proof_rand[GRAM_QUERIES:self.n_proofs]]
        return out

    def _z_groups(self, fw) -> np.ndarray:
        """(z_groups, z_len): the noise words (a share of them) in their groups, the last padded with zeros."""
        z = self.F.zeros(self.z_groups * self.g["z_len"])
        z[:self.n_z] = self.noise_words(fw)
        return z.reshape(self.z_groups, -1)

    def _split_proofs(self, proofs):
        """The flat proof words as ``(|L^T rho|^2 proofs, |z|^2 proofs or None)``."""
        proofs = np.asarray(proofs, dtype=self.F.dtype).reshape(-1)
        k = GRAM_QUERIES * self.sq.proof_len
        sq = proofs[:k].reshape(GRAM_QUERIES, self.sq.proof_len)
        return sq, (proofs[k:].reshape(GRAM_QUERIES, self.zsq.proof_len) if self.noise else None)

    # -- verifiers ----------------------------------------------------------------------------------------
    def _rand(self, fs: bytes, aux_sha256: str, query_seed: bytes):
        key = hashlib.sha256(domains.SPLIT_GRAM_QUERY_RAND + bytes(query_seed) + fs +
                             bytes.fromhex(aux_sha256)).digest()
        n_co = LINEAR_REPS * (self.n_range + self.n_gram_relations)
        n_noise = (self.n_noise_range + GRAM_QUERIES * self.z_groups + 1) if self.noise else 0
        # the noise relations' coefficients and the |z|^2 proofs' query points come last: a session without DP
        # draws the same stream as before
        stream = self.F.expand_field(key, 4 * GRAM_QUERIES + n_co + LINEAR_REPS * n_noise +
                                  (4 * GRAM_QUERIES if self.noise else 0), domains.SPLIT_GRAM_QUERY_XOF)
        pts = [int(v) for v in self.F.to_ints(stream[:4 * GRAM_QUERIES])
               if pow(int(v), self.sq.n, self.F.P) != 1][:GRAM_QUERIES]
        co = stream[4 * GRAM_QUERIES:]
        end = n_co + LINEAR_REPS * n_noise
        zpts = [int(v) for v in self.F.to_ints(co[end:])
                if pow(int(v), self.zsq.n, self.F.P) != 1][:GRAM_QUERIES] \
            if self.noise else []
        if len(pts) < GRAM_QUERIES or len(zpts) < (GRAM_QUERIES if self.noise else 0):  # pragma: no cover
            raise InvalidInputError("query points fell on the interpolation domain; draw another query seed")
        return pts, co[:LINEAR_REPS * self.n_range].reshape(LINEAR_REPS, self.n_range), \
            co[LINEAR_REPS * self.n_range:n_co].reshape(LINEAR_REPS, self.n_gram_relations), \
            co[n_co:end].reshape(LINEAR_REPS, n_noise), zpts

    def values(self, hi, fw, decompose, proofs, fs: bytes, aux_sha256: str, *, leader: bool, squares=None,
               zsquare=None):
        """This verifier's shares of the factor's range relations (ROWS), of the quadratic identities (one per
        query and rho), from the square-sum proofs' outputs, and under DP of the noise share's range (one per
        entry) and l2 relations (one per |z|^2 proof); ``squares`` and ``zsquare``: the true ``|L^T rho|^2`` and
        ``|z|^2`` instead (the unshared circuit, ``proofs`` None)."""
        one = 1 if leader else 0
        sq_proofs, z_proofs = (None, None) if proofs is None else self._split_proofs(proofs)
        F = self.F
        rng = F.sub(F.add(self.project_factor(fw, fs), F.to_field([self.T_f * one])), decompose("proj_f"))
        if self.exact:
            rng = np.concatenate([rng, F.sub(F.add(self.project_residual(fw, fs), F.to_field([self.T_r * one])),
                                             decompose("proj_r"))])
        noise = F.zeros(0)
        if self.noise_rows:
            noise = F.sub(F.add(self.project_noise(fw, fs), F.to_field([self.T_z * one])), decompose("proj_z"))
        elif self.noise:
            noise = F.sub(F.add(self.noise_words(fw), F.to_field([self.T_z * one])), decompose("noise"))
        l2 = self.F.zeros(0)
        if self.noise:
            outs = [self.F.to_field(zsquare)] * GRAM_QUERIES if z_proofs is None else \
                [self.zsq.outputs(pf) for pf in z_proofs]
            # each group's squared norm is its m_g bits, and l2_z - (their sum) is the m_l bits of noise_l2: zero
            # iff the share's squared norm is at most l2_z (docs/VALIDITY.md, "The noise share's l2 bound")
            groups = decompose("noise_sq")
            l2 = np.concatenate([self.F.sub(o, groups) for o in outs] + [
                self.F.sub(self.F.sub(self.F.to_field([self.l2_z * one]), total(self.F, groups)),
                        decompose("noise_l2"))])
        hi = self.statistics(hi, fw)
        delta = decompose("gram_slack")
        rhos = self.rhos(fs, aux_sha256)
        lhs = [self.F.dot(self.kappa(rho), hi) for rho in rhos]
        slack = [self.F.dot(self.F.mul(rho[:self.C], rho[:self.C]), delta) for rho in rhos]
        two_t = 1 << self.g["t"]
        quad = []
        for q in range(GRAM_QUERIES):
            outs = self.sq.outputs(sq_proofs[q]) if squares is None else squares
            outs = self.F.to_ints(np.asarray(outs, dtype=self.F.dtype)) if squares is None else outs
            quad += [(lhs[r] - two_t * (int(outs[r]) + slack[r])) % self.F.P for r in range(GRAM_RHOS)]
        return rng, self.F.to_field(quad), rhos, noise, l2

    def _query(self, hi, fw, decompose, sq_proofs, fs: bytes, aux_sha256: str, query_seed: bytes, *,
               leader: bool) -> np.ndarray:
        """``[range combinations] ++ [identity combinations] ++ GRAM_QUERIES square-sum queries`` (``++ [noise
        range combinations]`` under DP)."""
        pts, c_range, c_gram, c_noise, zpts = self._rand(fs, aux_sha256, query_seed)
        rng, quad, rhos, noise, l2 = self.values(hi, fw, decompose, sq_proofs, fs, aux_sha256, leader=leader)
        sq, zsq = self._split_proofs(sq_proofs)
        v = self.factor_vectors(fw, rhos)
        msg = [self.F.to_field([self.F.dot(row, rng) for row in c_range]),
               self.F.to_field([self.F.dot(row, quad) for row in c_gram])]
        msg += [self.sq.query(v, sq[q], t) for q, t in enumerate(pts)]
        if self.noise:
            rel = np.concatenate([noise, l2])
            msg.append(self.F.to_field([self.F.dot(row, rel) for row in c_noise]))
            msg += [self.zsq.query(self._z_groups(fw), zsq[q], t) for q, t in enumerate(zpts)]
        return np.concatenate(msg)

    def decide(self, v: np.ndarray) -> str | None:
        if any(int(z) for z in self.F.to_ints(v[:LINEAR_REPS])):
            return "gram_range"
        if any(int(z) for z in self.F.to_ints(v[LINEAR_REPS:2 * LINEAR_REPS])):
            return "gram"
        o, k = 2 * LINEAR_REPS, self.sq.verifier_len
        for q in range(GRAM_QUERIES):
            if not self.sq.decide(v[o + q * k:o + (q + 1) * k]):
                return "gram"
        if self.noise:
            o += GRAM_QUERIES * k
            if any(int(z) for z in self.F.to_ints(v[o:o + LINEAR_REPS])):
                return "noise"
            o, k = o + LINEAR_REPS, self.zsq.verifier_len
            for q in range(GRAM_QUERIES):
                if not self.zsq.decide(v[o + q * k:o + (q + 1) * k]):
                    return "noise"
        return None
