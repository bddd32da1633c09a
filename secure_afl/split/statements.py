"""split's statements: what a valid upload is, one class per circuit, apart from the proof system that proves it.

A statement (:class:`Statement`) says which auxiliary values the prover decomposes into bits (its
``blocks``), how it computes them from its upload (``witness``), and which affine relations, linear in the
upload's words and those bits, are zero exactly when the upload is valid (``relations``, in named groups).
The proof system (:mod:`secure_afl.split.proof`) is the same for every statement: it proves the bits are bits
(:class:`secure_afl.hazmat.flp.BitProof`) and checks the relations as random linear combinations on the two
verifiers' shares.

* :class:`PlainStatement`: integer n and counts, ``trace(C) <= n B^2 + d gamma``, the projection bound
  (docs/VALIDITY.md, "The statement");
* :class:`DPStatement`: the same widened by one hospital's noise share's hard bound ``tau``
  (docs/VALIDITY.md, "With differential privacy");
* :class:`GramStatement`: an optional part either can carry (``[split] gram_proof``): the statistics are
  ``2^t (L L^T + D)`` for a lower-triangular factor L that the upload carries (docs/VALIDITY.md, "The Gram
  statement").

Every one of them implements the one interface the proof system reads (:class:`Statement`: a statement
with words, proofs or checks of its own beyond the affine relations, like the Gram part, fills in those
hooks), and :class:`Composed` checks several on one upload; :func:`statement_for` builds the session's, so the
proof system names none of them.

A new relation touches its statement's ``relation_groups``, ``relations`` and (if it needs bits)
``blocks`` and ``witness``, the sizes in :mod:`secure_afl.split.sizes`, and a row of
tests/test_split_circuits.py, which fails while a named relation has none.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from .. import domains
from ..exceptions import BoundsExceeded, InvalidInputError
from ..hazmat import flp
from ..hazmat.flp_square import SquareSumProof
from ..params import SessionParams
from .projection import exact_gram, project
from .sizes import GRAM_QUERIES, GRAM_RHOS, LINEAR_REPS, NOISE_L2_TAIL_BITS, ROWS

__all__ = ["Statement", "Composed", "PlainStatement", "DPStatement", "GramStatement", "Unlucky", "Prover", "Shares",
           "statement_for", "AFFINE", "VERDICTS"]

#: the blinding of every proof (bit proofs and square-sum proofs): its own ChaCha20 domain
PROOF_DOMAIN = domains.SPLIT_PROOF_XOF
_FROW_DOMAIN = domains.SPLIT_GRAM_ROW_XOF
_RHO_DOMAIN = domains.SPLIT_RHO_XOF

#: the verdict a failed relation group gives (every affine group not named here: ``linear``)
VERDICTS = {"bits": "bits", "gram_range": "gram_range", "gram_identity": "gram", "noise_range": "noise",
            "noise_l2": "noise"}
#: the verdict of any affine relation of a statement's own
AFFINE = "linear"


class Unlucky(BoundsExceeded):
    """An honest vector's projection left the range for this seed (probability < 2^-16): draw a fresh one."""

    def __init__(self):
        super().__init__("this seed's projection rows leave the honest range; draw a fresh seed")


def bits_of(values, width: int) -> np.ndarray:
    """Bits of non-negative ints (Python ints), little-endian, ``width`` (< 64) each; wraps mod 2^width."""
    v = np.array([int(x) % (1 << width) for x in values], dtype=np.uint64)
    return ((v[:, None] >> np.arange(width, dtype=np.uint64)) & np.uint64(1)).ravel()


class Prover:
    """What a statement reads from the prover's upload: the centred high lane as Python integers at n, the
    counts and the diagonal (``hi``, index -> int), the centred low lane (``lo``, None when unchecked), the
    statement's words after the lanes and the Fiat-Shamir seed."""

    def __init__(self, hi: dict, lo, words: np.ndarray, fs: bytes):
        self.hi, self.lo, self.words, self.fs = hi, lo, words, fs


class Shares:
    """One verifier's view of an upload's words as a statement reads them: the lanes, the decomposed bit
    blocks, the leader's constant 1 (0 at the helper, so that constants are added once), the projection, and
    for statements with words or proofs of their own: those words, those proofs, the Fiat-Shamir seed and the
    bits' hash. In the unshared circuit (:meth:`secure_afl.split.proof.Circuit.evaluate`) the same view holds
    the plain words."""

    def __init__(self, lanes: np.ndarray, L: int, decompose, leader: bool, projection, *, words=None,
                 proofs=None, fs: bytes = b"", aux_sha256: str = ""):
        self.lanes, self.L = lanes, L
        self.hi, self.lo = lanes[:L], lanes[L:]
        self.dec = decompose
        self.one = 1 if leader else 0
        self.leader = leader
        self._projection = projection
        self.words, self.proofs, self.fs, self.aux_sha256 = words, proofs, fs, aux_sha256

    def const(self, v: int) -> np.uint64:
        return np.uint64(int(v) * self.one)

    def projection(self) -> np.ndarray:
        """``<r_j, hi> + T - (the proven projection value)`` per row: zero when the bits hold the projection."""
        return self._projection()


def total(v) -> np.ndarray:
    return np.array([flp.sum_mod(v)], dtype=np.uint64)


class Statement:
    """The one interface every circuit implements (module docstring), with defaults for what a statement may
    lack: words after the lanes, proofs and verifier message parts of its own, checks beyond the affine
    relations. The proof system (:class:`secure_afl.split.proof.Circuit`) sees only this interface; a
    composition of statements (:class:`Composed`) is one too."""

    name = "statement"
    #: field words the statement adds to the body after the lanes (committed with them, not summed)
    n_words = 0
    #: proofs of its own (each blinded by 32 bytes of the prover's randomness) and their words
    n_proofs = 0
    proof_len = 0
    #: words of its own in a verifier's message, after the affine combinations and the bit proofs
    verifier_len = 0

    def upload(self, lanes_of, vector, noise):
        """``(lanes, words)`` the hospital uploads for the packed ``vector`` (and DP ``noise``), or None where
        the statement takes the vector's own lanes and no words."""
        return None

    def prove(self, words, fs: bytes, aux_sha256: str, proof_rand: list[bytes]) -> list[np.ndarray]:
        return []

    def query(self, v: "Shares", query_seed: bytes) -> np.ndarray:
        return np.zeros(0, dtype=np.uint64)

    def decide(self, v: np.ndarray) -> str | None:
        """The verdict of its message part (summed over both verifiers), None if it holds."""
        return None

    def failures(self, v: "Shares") -> list[str]:
        """Relations beyond the affine groups that the plain words in ``v`` break (the unshared circuit)."""
        return []

    def soundness(self) -> tuple[float, float, int]:
        """Its terms of the soundness bound (docs/VALIDITY.md): ``(per hash query, query points, random
        combination pairs)``; the affine relations are one pair."""
        return 0.0, 0.0, 1

    def describe(self) -> dict:
        return {}

    def __init__(self, params: SessionParams, sizes: dict, f1: int):
        self.params, self.s, self.f1 = params, sizes, f1
        lay = params.layout
        sl = lay.slices
        self.d, self.C = lay.dim, lay.n_classes
        self.i_n = sl["n"].start
        self.i_counts = np.arange(sl["counts"].start, sl["counts"].stop)
        self.i_contrib = sl["contributors"].start
        self.i_tag = np.arange(sl["tag"].start, sl["tag"].stop)
        r, c = np.triu_indices(self.d)
        self.i_diag = np.nonzero(r == c)[0]
        self.tau = sizes["tau"]

    # what each statement defines
    def blocks(self) -> list[tuple[str, int, int]]:
        """``(name, count, width)`` of each block of auxiliary bits, in the body's order."""
        raise NotImplementedError

    def relation_groups(self) -> list[tuple[str, int]]:
        """``(name, count)`` of each group of affine relations, in the order :meth:`relations` returns them."""
        raise NotImplementedError

    def relations(self, v: Shares) -> list[np.ndarray]:
        """This verifier's shares of every relation's value, one array per group (all zero when valid)."""
        raise NotImplementedError

    def witness(self, u: Prover, *, check: bool) -> dict:
        """The prover's values for each block but the projection's (``proj``); with ``check``,
        :class:`BoundsExceeded` naming what the statistics break."""
        raise NotImplementedError

    # shared by both
    def relation_names(self) -> list[str]:
        """Every relation this statement checks: its affine groups and that the auxiliary values are bits."""
        return [name for name, _ in self.relation_groups()] + ["bits"]

    def _common_groups(self) -> list[tuple[str, int]]:
        return [("lo_zero", self.C + 2), ("tag", 2 * len(self.i_tag)), ("contributors", 1)]

    def _common(self, v: Shares) -> list[np.ndarray]:
        return [
            v.lo[[self.i_n, self.i_contrib, *self.i_counts]],                # n, counts, contributors: lo lane 0
            np.concatenate([v.hi[self.i_tag], v.lo[self.i_tag]]),           # tag slots 0
            flp.sub(v.hi[[self.i_contrib]], v.const(1 << self.f1)),          # one contributor (never noised)
        ]


class PlainStatement(Statement):
    """Integer n in [0, n_max], integer counts >= 0 summing to n, the trace bound, the projection bound."""

    name = "plain"

    def blocks(self):
        s = self.s
        return [("n", 1, s["m_n"]), ("n_gap", 1, s["m_n"]), ("counts", self.C, s["m_n"]),
                ("slack", 1, s["m_s"]), ("proj", ROWS, s["m_hi"])]

    def relation_groups(self):
        return self._common_groups() + [("n", 1), ("n_max", 1), ("counts", self.C), ("count_sum", 1),
                                        ("trace", 1), ("projection", ROWS)]

    def relations(self, v: Shares):
        s, f1s = self.s, 1 << self.f1
        n_val, counts = v.dec("n"), v.dec("counts")
        return self._common(v) + [
            flp.sub(v.hi[[self.i_n]], flp.scale(n_val, f1s)),                          # n integer >= 0
            flp.sub(flp.add(n_val, v.dec("n_gap")), v.const(self.params.bounds.n_max)),  # n <= n_max
            flp.sub(v.hi[self.i_counts], flp.scale(counts, f1s)),                      # counts integers >= 0
            flp.sub(total(counts), n_val),                                             # sum counts = n
            flp.sub(flp.add(flp.scale(n_val, s["c_B"]), v.const(s["c_0"])),            # trace <= c_B n + c_0
                    flp.add(v.dec("slack"), total(v.hi[self.i_diag]))),
            v.projection(),
        ]

    def witness(self, u: Prover, *, check: bool) -> dict:
        hi, lo = u.hi, u.lo
        s, scale = self.s, 1 << self.f1
        n = int(hi[self.i_n]) // scale
        counts = [int(hi[i]) // scale for i in self.i_counts]
        diag = [int(hi[i]) for i in self.i_diag]
        slack = s["c_B"] * n + s["c_0"] - sum(diag)
        if check:
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
        return {"n": [n], "n_gap": [self.params.bounds.n_max - n], "counts": counts, "slack": [slack]}


class DPStatement(Statement):
    """With one hospital's Skellam share in the upload: n and the counts are grid values in
    ``[-tau, n_max 2^f1 + tau]``, their sum within ``(C + 1) tau`` of n, the trace bound shifted by the noise
    and taken times ``2^g``, the projection bound grown by ``sqrt(m) tau``."""

    name = "dp"

    def blocks(self):
        s = self.s
        return [("n", 1, s["m_n"]), ("n_gap", 1, s["m_n"]), ("counts", self.C, s["m_n"]),
                ("count_gap", self.C, s["m_n"]), ("sum", 1, s["m_e"]), ("sum_gap", 1, s["m_e"]),
                ("slack", 1, s["m_s"]), ("proj", ROWS, s["m_hi"])]

    def relation_groups(self):
        return self._common_groups() + [("n_low", 1), ("n_high", 1), ("counts_low", self.C),
                                        ("counts_high", self.C), ("count_sum_low", 1), ("count_sum_high", 1),
                                        ("trace", 1), ("projection", ROWS)]

    def relations(self, v: Shares):
        s, tau = self.s, self.tau
        n_val, cval = v.dec("n"), v.dec("counts")
        return self._common(v) + [
            flp.sub(flp.add(v.hi[[self.i_n]], v.const(tau)), n_val),                   # hi_n >= -tau
            flp.sub(flp.add(n_val, v.dec("n_gap")), v.const(s["n_top"])),              # hi_n <= n_max 2^f1 + tau
            flp.sub(flp.add(v.hi[self.i_counts], v.const(tau)), cval),                 # counts >= -tau
            flp.sub(flp.add(cval, v.dec("count_gap")), v.const(s["n_top"])),           # counts <= n_max 2^f1 + tau
            flp.sub(flp.add(flp.sub(total(cval), n_val), v.const(2 * tau)), v.dec("sum")),  # sum - n >= -(C+1) tau
            flp.sub(flp.add(v.dec("sum"), v.dec("sum_gap")), v.const(s["e_top"])),     # sum - n <= (C+1) tau
            flp.sub(flp.add(flp.scale(n_val, s["c_B"]), v.const(s["trace_c"])),        # 2^g trace <= c_B hi_n + ...
                    flp.add(v.dec("slack"),
                            flp.scale(flp.add(total(v.hi[self.i_diag]), v.const(self.d * tau)), 1 << s["g"]))),
            v.projection(),
        ]

    def witness(self, u: Prover, *, check: bool) -> dict:
        hi, lo = u.hi, u.lo
        s, tau = self.s, self.tau
        n_top, e_top = s["n_top"], s["e_top"]
        n_val = int(hi[self.i_n]) + tau
        cval = [int(hi[i]) + tau for i in self.i_counts]
        e_val = sum(cval) - n_val + 2 * tau
        dval = [int(hi[i]) + tau for i in self.i_diag]
        slack = s["c_B"] * n_val + s["trace_c"] - (1 << s["g"]) * sum(dval)
        if check:
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
        return {"n": [n_val], "n_gap": [n_top - n_val], "counts": cval, "count_gap": [n_top - v for v in cval],
                "sum": [e_val], "sum_gap": [e_top - e_val], "slack": [slack]}


class Composed(Statement):
    """Statements checked together on one upload, in order: their blocks, relations, words, proofs and message
    parts concatenated (the first one's are first), their verdicts in that order."""

    def __init__(self, parts: list[Statement]):
        self.parts = list(parts)
        base = self.parts[0]
        self.params, self.s, self.f1, self.tau = base.params, base.s, base.f1, base.tau
        self.d, self.C = base.d, base.C
        self.i_n, self.i_counts, self.i_contrib, self.i_tag, self.i_diag = \
            base.i_n, base.i_counts, base.i_contrib, base.i_tag, base.i_diag
        self.name = "+".join(p.name for p in self.parts)
        self.n_words = sum(p.n_words for p in self.parts)
        self.n_proofs = sum(p.n_proofs for p in self.parts)
        self.proof_len = sum(p.proof_len for p in self.parts)
        self.verifier_len = sum(p.verifier_len for p in self.parts)

    def part(self, name: str) -> Statement | None:
        """The statement of that name in the composition (None if absent)."""
        return next((p for p in self.parts if p.name == name), None)

    def _cuts(self, attr: str) -> list[tuple[int, int]]:
        out, o = [], 0
        for p in self.parts:
            out.append((o, o + getattr(p, attr)))
            o += getattr(p, attr)
        return out

    def blocks(self):
        return [b for p in self.parts for b in p.blocks()]

    def relation_groups(self):
        return [g for p in self.parts for g in p.relation_groups()]

    def relation_names(self):
        return [n for p in self.parts for n in p.relation_names()]

    def relations(self, v):
        return [g for p in self.parts for g in p.relations(v)]

    def upload(self, lanes_of, vector, noise):
        return next((u for u in (p.upload(lanes_of, vector, noise) for p in self.parts) if u is not None), None)

    def _words(self, words, p_cut):
        return None if words is None else np.asarray(words, dtype=np.uint64)[p_cut[0]:p_cut[1]]

    def witness(self, u: Prover, *, check: bool) -> dict:
        out = {}
        for p, cut in zip(self.parts, self._cuts("n_words")):
            out.update(p.witness(Prover(u.hi, u.lo, self._words(u.words, cut), u.fs), check=check))
        return out

    def prove(self, words, fs, aux_sha256, proof_rand):
        out = []
        for p, cut, rc in zip(self.parts, self._cuts("n_words"), self._cuts("n_proofs")):
            out += p.prove(self._words(words, cut), fs, aux_sha256, proof_rand[rc[0]:rc[1]])
        return out

    def _view(self, v: Shares, words_cut, proofs_cut) -> Shares:
        return Shares(v.lanes, v.L, v.dec, v.leader, v._projection, words=self._words(v.words, words_cut),
                      proofs=self._words(v.proofs, proofs_cut), fs=v.fs, aux_sha256=v.aux_sha256)

    def query(self, v: Shares, query_seed: bytes) -> np.ndarray:
        return np.concatenate([np.zeros(0, dtype=np.uint64)] + [
            p.query(self._view(v, wc, pc), query_seed)
            for p, wc, pc in zip(self.parts, self._cuts("n_words"), self._cuts("proof_len"))])

    def decide(self, v: np.ndarray) -> str | None:
        for p, (a, b) in zip(self.parts, self._cuts("verifier_len")):
            verdict = p.decide(v[a:b])
            if verdict is not None:
                return verdict
        return None

    def failures(self, v: Shares) -> list[str]:
        return [f for p, wc, pc in zip(self.parts, self._cuts("n_words"), self._cuts("proof_len"))
                for f in p.failures(self._view(v, wc, pc))]

    def soundness(self) -> tuple[float, float, int]:
        terms = [p.soundness() for p in self.parts]
        return sum(t[0] for t in terms), sum(t[1] for t in terms), sum(t[2] for t in terms)

    def describe(self) -> dict:
        out = {"statement": self.name, "gram": None}
        for p in self.parts:
            out.update(p.describe())
        return out


def statement_for(params: SessionParams, sizes: dict, f1: int, L: int) -> Composed:
    """The session's statement: the plain or DP one, with the Gram part where the session signs it."""
    parts = [(DPStatement if params.dp is not None else PlainStatement)(params, sizes, f1)]
    if sizes["gram"] is not None:
        parts.append(GramStatement(params, sizes["gram"], L))
    return Composed(parts)


class GramStatement(Statement):
    """The Gram part (docs/VALIDITY.md, "The Gram statement"): ``A = [[diag(counts), Q^T], [Q, C^r]]`` in the
    high lane (classes first, so the factor's first block is diagonal) equals ``2^t (L L^T + diag(delta, 0))``
    with L lower triangular (its words follow the lanes in the body), ``delta >= 0`` (bits), every factor entry
    within ``2 T_f`` (projection rows of its own); the identity is checked on ``GRAM_RHOS`` Fiat-Shamir vectors
    rho through ``GRAM_QUERIES`` square-sum proofs of ``|L^T rho|^2``.

    With DP the lanes hold the statistics plus the hospital's noise share z; z travels as words of its own after
    the factor, each proven in ``[-T_z, T_z)`` (bits, ``noise_range``), and A is read from the lanes less z: the
    identity is of the statistics before the noise (docs/VALIDITY.md, "The Gram statement with differential
    privacy")."""

    def __init__(self, params: SessionParams, sizes: dict, L: int):
        self.params, self.g, self.L = params, sizes, L
        lay = params.layout
        self.d, self.C = lay.dim, lay.n_classes
        self.n_f = sizes["n_f"]
        self.T_f = 1 << (sizes["m_f"] - 1)
        #: DP: the noise share's words (the noised entries, in layout order) and their proven range
        self.n_z = sizes["n_z"]
        self.noise = self.n_z > 0
        self.T_z = 1 << (sizes["m_z"] - 1) if self.noise else 0
        self.i_noise = np.arange(lay.slices["gram"].start, lay.slices["gram"].start + self.n_z)
        self.i_counts = np.arange(lay.slices["counts"].start, lay.slices["counts"].stop)
        #: the words the statement adds after the lanes: the factor, then the noise share
        self.n_words = self.n_f + self.n_z
        self.sq = SquareSumProof(sizes["m"], GRAM_RHOS)
        #: DP: the square-sum proofs of |z|^2 in z_groups groups of z_len entries, checked against the share's l2
        #: bound l2_z
        self.zsq = SquareSumProof(sizes["z_len"], sizes["z_groups"]) if self.noise else None
        self.l2_z = sizes["l2_z"] if self.noise else 0
        self.z_groups = sizes["z_groups"] if self.noise else 0
        #: proofs (each blinded by 32 bytes of the prover's randomness): GRAM_QUERIES of |L^T rho|^2, and under DP
        #: GRAM_QUERIES of |z|^2
        self.n_proofs = GRAM_QUERIES * (2 if self.noise else 1)
        self.proof_len = GRAM_QUERIES * (self.sq.proof_len + (self.zsq.proof_len if self.noise else 0))
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
        fw = np.asarray(v.words, dtype=np.uint64)
        rhos = self.rhos(v.fs, v.aux_sha256)
        squares = [flp.dot(x, x) for x in self.factor_vectors(fw, rhos)]
        zsquare = [flp.dot(g, g) for g in self._z_groups(fw)] if self.noise else None
        rng, quad, _, noise, l2 = self.values(v.hi, fw, v.dec, None, v.fs, v.aux_sha256, leader=True,
                                              squares=squares, zsquare=zsquare)
        return [name for name, vals in (("gram_range", rng), ("gram_identity", quad), ("noise_range", noise),
                                        ("noise_l2", l2)) if np.any(vals)]

    def soundness(self) -> tuple[float, float, int]:
        # the factor's range rows; GRAM_RHOS vectors rho, each missing a nonzero symmetric A - 2^t (L L^T + D)
        # with probability <= 2/p (Schwartz-Zippel, degree 2); the square-sum proofs' query points (the factor's,
        # and under DP the noise share's); two more random combinations, three under DP
        p = float(flp.P)
        per_query = 2.0 ** -ROWS + (2.0 / p) ** GRAM_RHOS
        query_point = ((2 * self.sq.n - 2) / (p - self.sq.n)) ** GRAM_QUERIES
        if self.noise:
            query_point += ((2 * self.zsq.n - 2) / (p - self.zsq.n)) ** GRAM_QUERIES
        return per_query, query_point, 2 + (1 if self.noise else 0)

    def describe(self) -> dict:
        g = self.g
        return {"gram": {
            "factor_words": self.n_f, "noise_words": self.n_z, "noise_bound_log2": g["m_z"] - 1,
            "noise_l2_bound": g["l2_z"] if self.noise else None,
            "noise_l2_groups": g["z_groups"] if self.noise else None,
            "factor_scale_bits": g["f"], "t": g["t"], "T_factor_log2": g["m_f"] - 1, "jitter": g["jitter"],
            "square_sum_proof_words": GRAM_QUERIES * self.sq.proof_len}}

    def blocks(self) -> list[tuple[str, int, int]]:
        return [("gram_slack", self.C, self.g["m_d"]), ("proj_f", ROWS, self.g["m_f"])] + \
            ([("noise", self.n_z, self.g["m_z"]), ("noise_sq", self.z_groups, self.g["m_g"]),
              ("noise_l2", 1, self.g["m_l"])] if self.noise else [])

    def relation_names(self) -> list[str]:
        return ["gram_range", "gram_identity"] + (["noise_range", "noise_l2"] if self.noise else [])

    def statistics(self, hi, words) -> np.ndarray:
        """The high lane less the noise share (its words after the factor; the lane itself without DP)."""
        if not self.noise:
            return hi
        out = np.array(hi, dtype=np.uint64, copy=True)
        out[self.i_noise] = flp.sub(out[self.i_noise], np.asarray(words, dtype=np.uint64)[self.n_f:])
        return out

    # -- the factor ---------------------------------------------------------------------------------------
    def rhos(self, fs: bytes, aux_sha256: str) -> np.ndarray:
        """(GRAM_RHOS, m): the Fiat-Shamir vectors, fixed by the lanes, the factor and the bits (delta)."""
        key = hashlib.sha256(fs + domains.SPLIT_FS_GRAM + bytes.fromhex(aux_sha256)).digest()
        return flp.expand_field(key, GRAM_RHOS * self.g["m"], _RHO_DOMAIN).reshape(GRAM_RHOS, self.g["m"])

    def _factor_blocks(self, fw: np.ndarray):
        d, C = self.d, self.C
        l21 = fw[C:C + d * C].reshape(d, C)
        l22 = np.zeros((d, d), dtype=np.uint64)
        l22[self._tril] = fw[C + d * C:self.n_f]
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
        """``<r_j, factor>`` mod p for ROWS rows of their own."""
        return project(np.asarray(fw, dtype=np.uint64)[:self.n_f], hashlib.sha256(fs + domains.SPLIT_FS_FACTOR_ROWS).digest(),
                       _FROW_DOMAIN)

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
        S = np.asarray(st.gram, dtype=np.float64) + g["jitter"] * np.eye(self.d) - lr @ lr.T
        try:
            chol = np.linalg.cholesky(0.5 * (S + S.T))
        except np.linalg.LinAlgError:
            raise BoundsExceeded("the statistics are not positive semi-definite: no rows have this Gram matrix "
                                 "and these cross terms") from None
        l21 = l21.astype(np.int64)
        l22 = np.trunc(chol * 2.0 ** f).astype(np.int64)
        gram = exact_gram(np.concatenate([l21, l22], axis=1))
        x = lanes_of(v).copy()
        sl = lay.slices
        r, c = np.triu_indices(self.d)
        idx = np.concatenate([np.arange(sl["gram"].start, sl["gram"].stop), np.arange(sl["cross"].start,
                              sl["cross"].stop), np.arange(sl["counts"].start, sl["counts"].stop)])
        vals = np.concatenate([gram[r, c], (l21 * l11.reshape(1, -1)).ravel(),
                               np.array(cnt, dtype=np.int64) * s2f]) << t
        x[idx] = flp.encode_signed(vals)
        x[self.L + idx] = 0
        fw = flp.encode_signed(np.concatenate([l11, l21.ravel(), l22[self._tril]]))
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
        hi = flp.decode_signed(x[:self.L])
        hi[self.i_noise] += zi
        x[:self.L] = flp.encode_signed(hi)
        return x, np.concatenate([fw, flp.encode_signed(zi)])

    # -- prover -------------------------------------------------------------------------------------------
    def _witness(self, hi_counts, factor, fs: bytes, *, check: bool) -> dict:
        """The count slack delta_c = hi(count_c) / 2^t - l_c^2 (the count less its noise under DP), the factor's
        projection values and the noise words shifted by T_z."""
        g = self.g
        fw = np.zeros(self.n_words, dtype=np.uint64) if factor is None else np.asarray(factor, dtype=np.uint64)
        out = {}
        if self.noise:
            z = flp.decode_signed(fw[self.n_f:]).tolist()
            zc = z[self.i_counts[0] - self.i_noise[0]:self.i_counts[-1] + 1 - self.i_noise[0]]
            hi_counts = [h - v for h, v in zip(hi_counts, zc)]
            out["noise"] = [v + self.T_z for v in z]  # the honest prover's range is checked in factorise
            n = g["z_len"]
            out["noise_sq"] = [sum(v * v for v in z[i:i + n]) for i in range(0, n * self.z_groups, n)]
            out["noise_l2"] = [self.l2_z - sum(out["noise_sq"])]
            if check and not (0 <= out["noise_l2"][0] < 1 << g["m_l"] and max(out["noise_sq"]) < 1 << g["m_g"]):
                raise BoundsExceeded("the noise share's l2 norm exceeds the session's bound (an honest share does "
                                     f"with probability below 2^-{NOISE_L2_TAIL_BITS}: draw it again)")
        l11 = flp.decode_signed(fw[:self.C]).tolist()
        delta = [(h >> g["t"]) - int(v) * int(v) for h, v in zip(hi_counts, l11)]
        proj = [int(v) + self.T_f for v in flp.decode_signed(self.project_factor(fw, fs))]
        if check:
            if not all(0 <= x < 1 << g["m_d"] for x in delta):
                raise BoundsExceeded("the Gram factor does not match the class counts")
            if not all(0 <= v < 2 * self.T_f for v in proj):
                raise Unlucky()
        return {"gram_slack": delta, "proj_f": proj, **out}

    def prove(self, fw, fs: bytes, aux_sha256: str, proof_rand: list[bytes]) -> list[np.ndarray]:
        """The ``GRAM_QUERIES`` square-sum proofs of ``L^T rho`` (then, under DP, those of the noise share z), each
        blinded by its 32 random bytes (:attr:`n_proofs` of them)."""
        v = self.factor_vectors(fw, self.rhos(fs, aux_sha256))
        out = [self.sq.prove(v, flp.expand_field(r, self.sq.chunk, PROOF_DOMAIN))
               for r in proof_rand[:GRAM_QUERIES]]
        if self.noise:
            z = self._z_groups(fw)
            out += [self.zsq.prove(z, flp.expand_field(r, self.zsq.chunk, PROOF_DOMAIN))
                    for r in proof_rand[GRAM_QUERIES:self.n_proofs]]
        return out

    def _z_groups(self, fw) -> np.ndarray:
        """(z_groups, z_len): the noise words (a share of them) in their groups, the last padded with zeros."""
        z = np.zeros(self.z_groups * self.g["z_len"], dtype=np.uint64)
        z[:self.n_z] = np.asarray(fw, dtype=np.uint64)[self.n_f:self.n_words]
        return z.reshape(self.z_groups, -1)

    def _split_proofs(self, proofs):
        """The flat proof words as ``(|L^T rho|^2 proofs, |z|^2 proofs or None)``."""
        proofs = np.asarray(proofs, dtype=np.uint64).reshape(-1)
        k = GRAM_QUERIES * self.sq.proof_len
        sq = proofs[:k].reshape(GRAM_QUERIES, self.sq.proof_len)
        return sq, (proofs[k:].reshape(GRAM_QUERIES, self.zsq.proof_len) if self.noise else None)

    # -- verifiers ----------------------------------------------------------------------------------------
    def _rand(self, fs: bytes, aux_sha256: str, query_seed: bytes):
        key = hashlib.sha256(bytes(query_seed) + fs + bytes.fromhex(aux_sha256) + b"gram").digest()
        n_co = LINEAR_REPS * (ROWS + self.n_gram_relations)
        n_noise = (self.n_z + GRAM_QUERIES * self.z_groups + 1) if self.noise else 0
        # the noise relations' coefficients and the |z|^2 proofs' query points come last: a session without DP
        # draws the same stream as before
        stream = flp.expand_field(key, 4 * GRAM_QUERIES + n_co + LINEAR_REPS * n_noise +
                                  (4 * GRAM_QUERIES if self.noise else 0), domains.SPLIT_GRAM_QUERY_XOF)
        pts = [int(v) for v in stream[:4 * GRAM_QUERIES] if pow(int(v), self.sq.n, flp.P) != 1][:GRAM_QUERIES]
        co = stream[4 * GRAM_QUERIES:]
        end = n_co + LINEAR_REPS * n_noise
        zpts = [int(v) for v in co[end:] if pow(int(v), self.zsq.n, flp.P) != 1][:GRAM_QUERIES] \
            if self.noise else []
        if len(pts) < GRAM_QUERIES or len(zpts) < (GRAM_QUERIES if self.noise else 0):  # pragma: no cover
            raise InvalidInputError("query points fell on the interpolation domain; draw another query seed")
        return pts, co[:LINEAR_REPS * ROWS].reshape(LINEAR_REPS, ROWS), \
            co[LINEAR_REPS * ROWS:n_co].reshape(LINEAR_REPS, self.n_gram_relations), \
            co[n_co:end].reshape(LINEAR_REPS, n_noise), zpts

    def values(self, hi, fw, decompose, proofs, fs: bytes, aux_sha256: str, *, leader: bool, squares=None,
               zsquare=None):
        """This verifier's shares of the factor's range relations (ROWS), of the quadratic identities (one per
        query and rho), from the square-sum proofs' outputs, and under DP of the noise share's range (one per
        entry) and l2 relations (one per |z|^2 proof); ``squares`` and ``zsquare``: the true ``|L^T rho|^2`` and
        ``|z|^2`` instead (the unshared circuit, ``proofs`` None)."""
        one = 1 if leader else 0
        sq_proofs, z_proofs = (None, None) if proofs is None else self._split_proofs(proofs)
        rng = flp.sub(flp.add(self.project_factor(fw, fs), np.uint64(self.T_f * one)), decompose("proj_f"))
        noise = flp.sub(flp.add(np.asarray(fw, dtype=np.uint64)[self.n_f:], np.uint64(self.T_z * one)),
                        decompose("noise")) if self.noise else np.zeros(0, dtype=np.uint64)
        l2 = np.zeros(0, dtype=np.uint64)
        if self.noise:
            outs = [np.asarray(zsquare, dtype=np.uint64)] * GRAM_QUERIES if z_proofs is None else \
                [self.zsq.outputs(pf) for pf in z_proofs]
            # each group's squared norm is its m_g bits, and l2_z - (their sum) is the m_l bits of noise_l2: zero
            # iff the share's squared norm is at most l2_z (docs/VALIDITY.md, "The noise share's l2 bound")
            groups = decompose("noise_sq")
            l2 = np.concatenate([flp.sub(o, groups) for o in outs] + [
                flp.sub(flp.sub(np.array([self.l2_z * one], dtype=np.uint64), total(groups)),
                        decompose("noise_l2"))])
        hi = self.statistics(hi, fw)
        delta = decompose("gram_slack")
        rhos = self.rhos(fs, aux_sha256)
        lhs = [flp.dot(self.kappa(rho), hi) for rho in rhos]
        slack = [flp.dot(flp.mul(rho[:self.C], rho[:self.C]), delta) for rho in rhos]
        two_t = 1 << self.g["t"]
        quad = []
        for q in range(GRAM_QUERIES):
            outs = self.sq.outputs(sq_proofs[q]) if squares is None else squares
            quad += [(lhs[r] - two_t * (int(outs[r]) + slack[r])) % flp.P for r in range(GRAM_RHOS)]
        return rng, np.array(quad, dtype=np.uint64), rhos, noise, l2

    def _query(self, hi, fw, decompose, sq_proofs, fs: bytes, aux_sha256: str, query_seed: bytes, *,
               leader: bool) -> np.ndarray:
        """``[range combinations] ++ [identity combinations] ++ GRAM_QUERIES square-sum queries`` (``++ [noise
        range combinations]`` under DP)."""
        pts, c_range, c_gram, c_noise, zpts = self._rand(fs, aux_sha256, query_seed)
        rng, quad, rhos, noise, l2 = self.values(hi, fw, decompose, sq_proofs, fs, aux_sha256, leader=leader)
        sq, zsq = self._split_proofs(sq_proofs)
        v = self.factor_vectors(fw, rhos)
        msg = [np.array([flp.dot(row, rng) for row in c_range], dtype=np.uint64),
               np.array([flp.dot(row, quad) for row in c_gram], dtype=np.uint64)]
        msg += [self.sq.query(v, sq[q], t) for q, t in enumerate(pts)]
        if self.noise:
            rel = np.concatenate([noise, l2])
            msg.append(np.array([flp.dot(row, rel) for row in c_noise], dtype=np.uint64))
            msg += [self.zsq.query(self._z_groups(fw), zsq[q], t) for q, t in enumerate(zpts)]
        return np.concatenate(msg)

    def decide(self, v: np.ndarray) -> str | None:
        if any(int(z) for z in v[:LINEAR_REPS]):
            return "gram_range"
        if any(int(z) for z in v[LINEAR_REPS:2 * LINEAR_REPS]):
            return "gram"
        o, k = 2 * LINEAR_REPS, self.sq.verifier_len
        for q in range(GRAM_QUERIES):
            if not self.sq.decide(v[o + q * k:o + (q + 1) * k]):
                return "gram"
        if self.noise:
            o += GRAM_QUERIES * k
            if any(int(z) for z in v[o:o + LINEAR_REPS]):
                return "noise"
            o, k = o + LINEAR_REPS, self.zsq.verifier_len
            for q in range(GRAM_QUERIES):
                if not self.zsq.decide(v[o + q * k:o + (q + 1) * k]):
                    return "noise"
        return None
