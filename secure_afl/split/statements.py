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
* :class:`~secure_afl.split.gram_statement.GramStatement`: an optional part either can carry (``[split] gram_proof``): the statistics are
  ``2^t (L L^T + D)`` for a lower-triangular factor L that the upload carries (docs/VALIDITY.md, "The Gram
  statement").

Every one of them implements the one interface the proof system reads (:class:`Statement`: a statement
with words, proofs or checks of its own beyond the affine relations, like the Gram part, fills in those
hooks), and :class:`Composed` checks several on one upload;
:func:`secure_afl.split.session_statement.statement_for` builds the session's, so the proof system names none
of them.

A new relation touches its statement's ``relation_groups``, ``relations`` and (if it needs bits)
``blocks`` and ``witness``, the sizes in :mod:`secure_afl.split.sizes`, and a row of
tests/test_split_circuits.py, which fails while a named relation has none.
"""

from __future__ import annotations

import numpy as np

from .. import domains
from ..exceptions import BoundsExceeded
from ..hazmat.fields import GOLDILOCKS, small
from ..params import SessionParams
from .sizes import ROWS, field_of

__all__ = ["Statement", "Composed", "PlainStatement", "DPStatement", "Unlucky", "Prover", "Shares", "AFFINE",
           "VERDICTS", "PROOF_DOMAIN", "bits_of", "total"]

#: the blinding of every proof (bit proofs and square-sum proofs): its own ChaCha20 domain
PROOF_DOMAIN = domains.SPLIT_PROOF_XOF

#: the verdict a failed relation group gives (every affine group not named here: ``linear``)
VERDICTS = {"bits": "bits", "gram_range": "gram_range", "gram_identity": "gram", "noise_range": "noise",
            "noise_l2": "noise"}
#: the verdict of any affine relation of a statement's own
AFFINE = "linear"


class Unlucky(BoundsExceeded):
    """An honest vector's projection left the range for this seed (probability < 2^-16): draw a fresh one."""

    def __init__(self):
        super().__init__("this seed's projection rows leave the honest range; draw a fresh seed")


def bits_of(values, width: int, field=None) -> np.ndarray:
    """Bits of non-negative ints (Python ints), little-endian, ``width`` each (past 64 only in a field above
    2^64, Field128's one-word lanes); wraps mod 2^width; as elements of ``field`` (Goldilocks when None)."""
    wrapped = [int(x) % (1 << width) for x in values]
    words = []
    for w0 in range(0, max(width, 1), 64):
        v = np.array([(x >> w0) & 0xFFFFFFFFFFFFFFFF for x in wrapped], dtype=np.uint64)
        words.append((v[:, None] >> np.arange(min(64, width - w0), dtype=np.uint64)) & np.uint64(1))
    bits = np.concatenate(words, axis=1).ravel() if words else np.zeros(0, dtype=np.uint64)
    return small(field or GOLDILOCKS, bits)


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

    def __init__(self, lanes: np.ndarray, L: int, decompose, leader: bool, projection, *, field, words=None,
                 proofs=None, fs: bytes = b"", aux_sha256: str = ""):
        self.F = field
        self.lanes, self.L = lanes, L
        self.hi, self.lo = lanes[:L], lanes[L:]
        self.dec = decompose
        self.one = 1 if leader else 0
        self.leader = leader
        self._projection = projection
        self.words, self.proofs, self.fs, self.aux_sha256 = words, proofs, fs, aux_sha256

    def const(self, v: int) -> np.ndarray:
        """The public constant ``v`` on the leader's side, 0 on the helper's (one element, broadcasting)."""
        return self.F.to_field([int(v) * self.one])

    def projection(self) -> np.ndarray:
        """``<r_j, hi> + T - (the proven projection value)`` per row: zero when the bits hold the projection."""
        return self._projection()


def total(F, v) -> np.ndarray:
    """The sum of ``v`` as a one-element array of field ``F``."""
    return F.to_field([F.sum_mod(v)])


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
        return self.F.zeros(0)

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
        #: the field the session's circuit runs over (its signed parameters name it)
        self.F = field_of(params)
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
        if self.s.get("lanes", 2) == 1:  # one word per value: no low lane to pin
            return [("tag", len(self.i_tag)), ("contributors", 1)]
        return [("lo_zero", self.C + 2), ("tag", 2 * len(self.i_tag)), ("contributors", 1)]

    def _common(self, v: Shares) -> list[np.ndarray]:
        F = self.F
        one = F.sub(v.hi[[self.i_contrib]], v.const(1 << self.f1))        # one contributor (never noised)
        if self.s.get("lanes", 2) == 1:
            return [v.hi[self.i_tag], one]                                   # tag slots 0
        return [
            v.lo[[self.i_n, self.i_contrib, *self.i_counts]],                # n, counts, contributors: lo lane 0
            np.concatenate([v.hi[self.i_tag], v.lo[self.i_tag]]),           # tag slots 0
            one,
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
        s, f1s, F = self.s, 1 << self.f1, self.F
        n_val, counts = v.dec("n"), v.dec("counts")
        return self._common(v) + [
            F.sub(v.hi[[self.i_n]], F.scale(n_val, f1s)),                          # n integer >= 0
            F.sub(F.add(n_val, v.dec("n_gap")), v.const(self.params.bounds.n_max)),  # n <= n_max
            F.sub(v.hi[self.i_counts], F.scale(counts, f1s)),                      # counts integers >= 0
            F.sub(total(F, counts), n_val),                                             # sum counts = n
            F.sub(F.add(F.scale(n_val, s["c_B"]), v.const(s["c_0"])),            # trace <= c_B n + c_0
                    F.add(v.dec("slack"), total(F, v.hi[self.i_diag]))),
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
        s, tau, F = self.s, self.tau, self.F
        n_val, cval = v.dec("n"), v.dec("counts")
        return self._common(v) + [
            F.sub(F.add(v.hi[[self.i_n]], v.const(tau)), n_val),                   # hi_n >= -tau
            F.sub(F.add(n_val, v.dec("n_gap")), v.const(s["n_top"])),              # hi_n <= n_max 2^f1 + tau
            F.sub(F.add(v.hi[self.i_counts], v.const(tau)), cval),                 # counts >= -tau
            F.sub(F.add(cval, v.dec("count_gap")), v.const(s["n_top"])),           # counts <= n_max 2^f1 + tau
            F.sub(F.add(F.sub(total(F, cval), n_val), v.const(2 * tau)), v.dec("sum")),  # sum - n >= -(C+1) tau
            F.sub(F.add(v.dec("sum"), v.dec("sum_gap")), v.const(s["e_top"])),     # sum - n <= (C+1) tau
            F.sub(F.add(F.scale(n_val, s["c_B"]), v.const(s["trace_c"])),        # 2^g trace <= c_B hi_n + ...
                    F.add(v.dec("slack"),
                            F.scale(F.add(total(F, v.hi[self.i_diag]), v.const(self.d * tau)), 1 << s["g"]))),
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
        self.params, self.s, self.f1, self.tau, self.F = base.params, base.s, base.f1, base.tau, base.F
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
        return None if words is None else np.asarray(words, dtype=self.F.dtype)[p_cut[0]:p_cut[1]]

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
        return Shares(v.lanes, v.L, v.dec, v.leader, v._projection, field=v.F, words=self._words(v.words, words_cut),
                      proofs=self._words(v.proofs, proofs_cut), fs=v.fs, aux_sha256=v.aux_sha256)

    def query(self, v: Shares, query_seed: bytes) -> np.ndarray:
        return np.concatenate([self.F.zeros(0)] + [
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
