"""One table for every split statement: an honest upload, and for each relation a row that breaks just that one.

Each row is run twice: through the unshared circuit (the statement evaluated on the unmasked words,
:meth:`Circuit.evaluate`) and through the proof system on shares (the leader's and the helper's
:meth:`Circuit.query`, then :meth:`Circuit.decide`). The first must name exactly the broken relation, the second
must give that relation's verdict. A relation a statement lists without a row here fails
:func:`test_every_relation_of_every_statement_has_a_row`.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from secure_afl import split
from secure_afl.backends.session_params import dp_session_params
from secure_afl.dp import DPSpec, add_noise_share, noise_share
from secure_afl.hazmat import flp
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.stats import local_statistics
from secure_afl_tools.attacks_validity import field_sqrt, field_factor

LAYOUT = Layout(4, 3)
BOUNDS = Bounds(4.0, 60, 8)
GAMMA = 1.0
SPEC = DPSpec(1.0, 1e-5, 3)


def _vector(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, LAYOUT.dim))
    X *= BOUNDS.max_norm * 0.9 / np.linalg.norm(X, axis=1, keepdims=True)
    y = np.arange(n) % LAYOUT.n_classes
    return LAYOUT.pack(local_statistics(X, y, LAYOUT.n_classes, gamma=GAMMA))


@pytest.fixture(scope="module")
def circuits():
    # each statement signed explicitly, in Goldilocks (the default sessions, gram's and dpgram's, are in Field128:
    # tests/test_split_field128_*.py and tests/test_split_dp_field128.py)
    gl = {"field": "goldilocks"}
    plain = split.Circuit(split.split_session_params("circuits-plain", LAYOUT, GAMMA, BOUNDS, gram_proof=False, **gl))
    gram = split.Circuit(split.split_session_params("circuits-gram", LAYOUT, GAMMA, BOUNDS, gram_proof=True, **gl))
    dp_params = dp_session_params(SPEC, "split", "circuits-dp", LAYOUT, GAMMA, BOUNDS, gram_proof=False, **gl)
    dp = split.Circuit(dp_params)
    dpgram = split.Circuit(dp_session_params(SPEC, "split", "circuits-dp-gram", LAYOUT, GAMMA, BOUNDS,
                                             gram_proof=True, **gl))
    return {"plain": plain, "gram": gram, "dp": dp, "dpgram": dpgram}


def _beside(c: split.Circuit) -> bool:
    """DP with the Gram statement: the circuit takes the statistics before the noise, and the share."""
    return c.part("gram") is not None and c.part("gram").noise


def _honest(c: split.Circuit) -> tuple[np.ndarray, np.ndarray]:
    """Honest lanes and factor words: 45 rows in three classes (the DP one with its noise share)."""
    v = _vector(45)
    if _beside(c):
        return c.witness(v, noise=noise_share(c.params, np.random.default_rng(1)))
    if c.dp:
        v = add_noise_share(c.params, v, rng=np.random.default_rng(1))
    return c.witness(v)


# -- what a row may change ----------------------------------------------------------------------------------
class Lanes:
    """The centred high and low lanes of an upload as Python integers, written back as field words."""

    def __init__(self, c: split.Circuit, x: np.ndarray):
        self.c = c
        self.hi = [int(v) for v in flp.decode_signed(x[:c.L])]
        self.lo = [int(v) for v in flp.decode_signed(x[c.L:])]
        sl = c.params.layout.slices
        self.n, self.contrib = sl["n"].start, sl["contributors"].start
        self.counts = list(range(sl["counts"].start, sl["counts"].stop))
        self.tag = sl["tag"].start
        self.cross = sl["cross"].start
        r, k = np.triu_indices(c.d)
        self.diag = [sl["gram"].start + int(i) for i in np.nonzero(r == k)[0]]

    def words(self) -> np.ndarray:
        return flp.encode_signed(np.array(self.hi + self.lo, dtype=object).astype(np.int64))


@dataclass
class Row:
    relation: str
    #: (lanes, sizes) -> None, editing the lanes in place
    lanes: Callable = lambda z, s: None
    #: the prover's values: "natural" (the edited lanes' own decomposition) or "honest" (the honest lanes', with
    #: the projection of what is sent): either way wrapped modulo each block's width
    witness: str = "natural"
    #: (values, honest values, sizes) -> None: a cheater's further change to the values
    values: Callable | None = None
    #: (circuit, lanes, factor words) -> factor words (the Gram statement)
    factor: Callable | None = None
    #: (circuit, bits) -> None: a cheater's change to the bits themselves
    bits: Callable | None = None


def _not_a_bit(c, bits):
    # n's lowest bit becomes b0 + 2 and the next b1 - 1: the decomposition (and every affine relation) holds
    off = c.offsets["n"][0]
    bits[off] = flp.add(bits[off:off + 1], np.uint64(2))[0]
    bits[off + 1] = flp.sub(bits[off + 1:off + 2], np.uint64(1))[0]


def _set(idx_of, value_of):
    def edit(z, s):
        z.hi[idx_of(z)] = value_of(z, s)
    return edit


def _shift_count_keeping_the_sum(z, s):
    # count 0 down to -1, count 1 up by as much: the sum is still n; the bits claim 0 and c1 + c0 (in range)
    scale = 1 << z.c.f1
    c0 = z.hi[z.counts[0]] // scale
    z.hi[z.counts[0]] = -scale
    z.hi[z.counts[1]] += (c0 + 1) * scale


def _claim_zero_and_the_rest(vals, honest, s):
    vals["counts"][0] = 0
    vals["counts"][1] = honest["counts"][1] + honest["counts"][0]


COMMON = [
    Row("lo_zero", lambda z, s: z.lo.__setitem__(z.n, 1)),
    Row("tag", _set(lambda z: z.tag, lambda z, s: 1)),
    Row("contributors", _set(lambda z: z.contrib, lambda z, s: 2 << z.c.f1)),
    Row("bits", bits=_not_a_bit),
    # a cross entry past every projection bound: the rows' projections leave [-T, T)
    Row("projection", _set(lambda z: z.cross, lambda z, s: 4 * z.c.T)),
]

PLAIN = COMMON + [
    Row("n", lambda z, s: z.hi.__setitem__(z.n, z.hi[z.n] + 1)),  # n not an integer
    Row("n_max", lambda z, s: (z.hi.__setitem__(z.counts[0], z.hi[z.counts[0]] + (z.c.params.bounds.n_max + 1)
                                                 * (1 << z.c.f1) - z.hi[z.n]),
                               z.hi.__setitem__(z.n, (z.c.params.bounds.n_max + 1) << z.c.f1))),
    Row("counts", _shift_count_keeping_the_sum, values=_claim_zero_and_the_rest),
    Row("count_sum", lambda z, s: z.hi.__setitem__(z.counts[0], z.hi[z.counts[0]] - (1 << z.c.f1))),
    # the trace one grid step past c_B n + c_0
    Row("trace", lambda z, s: z.hi.__setitem__(z.diag[0], z.hi[z.diag[0]] + s["c_B"] * (z.hi[z.n] >> z.c.f1)
                                               + s["c_0"] - sum(z.hi[i] for i in z.diag) + 1)),
]


def _top(z, s):
    return z.c.params.bounds.n_max * (1 << z.c.f1) + z.c.tau


def _counts_high(z, s):
    # n at its top, class 0 one step past it, the other classes at -tau: the sum stays within (C + 1) tau of n
    z.hi[z.n] = _top(z, s)
    z.hi[z.counts[0]] = _top(z, s) + 1
    for i in z.counts[1:]:
        z.hi[i] = -z.c.tau


def _count_sum(z) -> int:
    """The DP statement's ``sum counts - n + 2 tau`` (grid units, each value shifted by tau)."""
    tau = z.c.tau
    return sum(z.hi[i] + tau for i in z.counts) - (z.hi[z.n] + tau) + 2 * tau


def _move_count_sum(z, s, delta: int) -> None:
    """Move the count sum by ``delta``, n and every count kept within [-tau, n_max 2^f1 + tau] (the noise
    dwarfs the counts: no single entry has the room)."""
    tau, top = z.c.tau, _top(z, s)
    sign = 1 if delta > 0 else -1
    need = abs(delta)
    # n moves the other way first, then the counts
    for i, d in [(z.n, -sign)] + [(i, sign) for i in z.counts]:
        room = (top - z.hi[i]) if d > 0 else (z.hi[i] + tau)
        take = min(need, room)
        z.hi[i] += d * take
        need -= take
    assert need == 0, "no room to move the count sum"


def _sum_below(z, s):
    _move_count_sum(z, s, -(_count_sum(z) + 1))


def _sum_above(z, s):
    _move_count_sum(z, s, s["e_top"] + 1 - _count_sum(z))


def _claim_sum(value_of):
    def edit(vals, honest, s):
        vals["sum"] = [value_of(s)]
        vals["sum_gap"] = [s["e_top"] - value_of(s)]
    return edit


def _n_high(z, s):
    step = _top(z, s) + 1 - z.hi[z.n]
    z.hi[z.n] += step
    z.hi[z.counts[0]] += step


def _trace_dp(z, s):
    tau, g = z.c.tau, s["g"]
    n_val = z.hi[z.n] + tau
    room = s["c_B"] * n_val + s["trace_c"] - (1 << g) * sum(z.hi[i] + tau for i in z.diag)
    z.hi[z.diag[0]] += (room >> g) + 1


DP = COMMON + [
    Row("n_low", _set(lambda z: z.n, lambda z, s: -z.c.tau - 1), witness="honest"),
    Row("n_high", _n_high),
    Row("counts_low", _set(lambda z: z.counts[0], lambda z, s: -z.c.tau - 1), witness="honest"),
    Row("counts_high", _counts_high),
    Row("count_sum_low", _sum_below, values=_claim_sum(lambda s: 0)),
    Row("count_sum_high", _sum_above),
    Row("trace", _trace_dp),
]


def _field_factor(c, lanes, fw):
    """The factor over F_p (Cholesky with square roots mod p): L L^T = A / 2^t holds, its entries are huge."""
    out = field_factor(c, lanes)
    assert out is not None, "the chosen statistics have a pivot without a square root mod p"
    return out


def _zero_slack(vals, honest, s):
    vals["gram_slack"] = [0] * len(vals["gram_slack"])


def _bump_factor(c, lanes, fw):
    fw = fw.copy()
    fw[c.C] = flp.add(fw[c.C:c.C + 1], np.uint64(1))[0]  # one cross-term entry of L off by one
    return fw


# the Gram part's own relations, on a session that carries it (the plain rows above cover the rest: on the Gram
# session an edit of the statistics would also break the identity)
GRAM = [
    Row("gram_range", factor=_field_factor, values=_zero_slack),
    Row("gram_identity", factor=_bump_factor),
]

def _noise_out_of_range(c, lanes, fw):
    # n's noise word set to a square root in F_p of a small non-square integer r: a field element far outside
    # the range whose square is r, so |z|^2 stays within l2_z (the l2 bound is tight enough that any integer at
    # T_z would cross it too); n is not in A, so the identity and the lanes are untouched
    gs = c.part("gram")
    fw = fw.copy()
    i = gs.n_f + c.i_n - int(gs.i_noise[0])
    fw[i] = next(r for r in (field_sqrt(k) for k in range(2, 100) if math.isqrt(k) ** 2 != k) if r)
    z = [int(v) for v in flp.decode_signed(fw[gs.n_f:gs.n_words])]
    assert abs(z[c.i_n - int(gs.i_noise[0])]) >= gs.T_z and sum(v * v for v in z) % flp.P <= gs.l2_z
    return fw


def _squares_mod_p(vals, honest, sizes):
    # the cheater's software takes the groups' squared norms as the field does, mod p
    vals["noise_sq"] = [v % flp.P for v in vals["noise_sq"]]
    vals["noise_l2"] = [sizes["gram"]["l2_z"] - sum(vals["noise_sq"])]


def _noise_past_l2(c, lanes, fw):
    # every cross-term noise word at T_z - 1 (inside the per-entry range) and each Q lane moved with its word, so
    # that the lanes less the noise, and with them the identity, are untouched: only |z|^2 exceeds l2_z (edits the
    # lanes in place, the one row that must move a lane and a word together)
    gs = c.part("gram")
    fw = fw.copy()
    sl = c.params.layout.slices
    idx = np.arange(sl["cross"].start, sl["cross"].stop)
    w = gs.n_f + idx - int(gs.i_noise[0])
    new = np.full(len(idx), gs.T_z - 1, dtype=np.int64)
    delta = new - flp.decode_signed(fw[w])
    fw[w] = flp.encode_signed(new)
    lanes[idx] = flp.encode_signed(flp.decode_signed(lanes[idx]) + delta)
    z = flp.decode_signed(fw[gs.n_f:gs.n_words])
    assert sum(int(v) ** 2 for v in z) > gs.l2_z
    return fw


# DP with the Gram statement: the Gram part's rows on the statistics before the noise, and the share's range and
# l2 bound
DPGRAM = GRAM + [Row("noise_range", factor=_noise_out_of_range, values=_squares_mod_p), Row("noise_l2", factor=_noise_past_l2)]

TABLE = {"plain": PLAIN, "dp": DP, "gram": GRAM, "dpgram": DPGRAM}


def _rand(c, tag: str) -> bytes:
    return hashlib.shake_256(b"split circuits " + tag.encode()).digest(c.rand_size)


def _build(c: split.Circuit, row: Row | None):
    """``(masked body, seed, commitment)`` of the row's upload, proved without the prover's checks."""
    x, fw = _honest(c)
    if c.sizes["gram"] is not None and row is not None and row.relation == "gram_range":
        x, fw = _gram_range_statistics(c)
    if row is None:
        return c.prove_once("h1", x, fw, _rand(c, "honest"))
    z = Lanes(c, x)
    row.lanes(z, c.sizes)
    x2 = z.words()
    fw2 = fw if row.factor is None else row.factor(c, x2, fw)

    def aux(circuit, lanes, fs):
        vals = circuit.witness_values(lanes, fs, check=False, factor=fw2)
        honest = circuit.witness_values(x, fs, check=False, factor=fw)
        if row.witness == "honest":
            vals = {**honest, "proj": vals["proj"], **({"proj_f": vals["proj_f"]} if "proj_f" in vals else {})}
        if row.values is not None:
            row.values(vals, honest, c.sizes)
        bits = circuit.bits_from(vals)
        if row.bits is not None:
            row.bits(circuit, bits)
        return bits

    return c.prove_once("h1", x2, fw2, _rand(c, row.relation), check=False, aux_override=aux)


def _gram_range_statistics(c):
    """Honest statistics whose field Cholesky has every pivot a square mod p (found by a fixed search)."""
    for seed in range(400):
        x, fw = c.witness(_vector(30 + seed % 30, seed=seed), noise=np.zeros(c.L) if _beside(c) else None)
        ff = field_factor(c, x)
        if ff is not None and any(abs(int(v)) > 2 * c.part("gram").T_f for v in flp.decode_signed(ff)):
            return x, fw
    raise AssertionError("no statistics with a field factor in 400 seeds")


def _shared_verdict(c: split.Circuit, body, seed, commitment):
    qs = hashlib.sha256(b"query " + bytes.fromhex(commitment.main_sha256)).digest()
    c.check_commitment(body, commitment, leader=True)
    c.check_commitment(None, commitment, leader=False, seed=seed)
    leader = c.query(c.leader_share(body), commitment, "h1", qs, leader=True)
    helper = c.query(c.helper_share(seed), commitment, "h1", qs, leader=False)
    return c.decide(leader, helper)


def _unshared(c: split.Circuit, body, seed, commitment):
    return c.evaluate(flp.add(body, c.helper_share(seed)), commitment, "h1")


CASES = [(name, None) for name in TABLE] + [(name, row) for name, rows in TABLE.items() for row in rows]


@pytest.mark.parametrize("name,row", CASES, ids=[f"{n}-{'honest' if r is None else r.relation}" for n, r in CASES])
def test_a_row_breaks_just_its_relation_unshared_and_on_shares(circuits, name, row):
    c = circuits[name]
    body, seed, commitment = _build(c, row)
    expected = [] if row is None else [row.relation]
    assert _unshared(c, body, seed, commitment) == expected
    assert _shared_verdict(c, body, seed, commitment) == (None if row is None else c.verdict_of(row.relation))


def test_every_relation_of_every_statement_has_a_row(circuits):
    statements = {"plain": circuits["plain"].statement, "dp": circuits["dp"].statement,
                  "gram": circuits["gram"].part("gram"), "dpgram": circuits["dpgram"].part("gram")}
    for name, st in statements.items():
        assert sorted(r.relation for r in TABLE[name]) == sorted(st.relation_names()), name
    # the Gram session checks the plain statement's relations and its own, nothing else
    assert sorted(circuits["gram"].relation_names()) == sorted(statements["plain"].relation_names() +
                                                               statements["gram"].relation_names())
    # and under DP, the DP statement's and the Gram part's with the noise range
    assert sorted(circuits["dpgram"].relation_names()) == sorted(statements["dp"].relation_names() +
                                                                 statements["dpgram"].relation_names())


def test_the_statements_are_the_ones_the_session_asks_for(circuits):
    # one composed statement per session: the plain or DP one first, the Gram part after it where signed
    kinds = {name: [type(p) for p in c.statement.parts] for name, c in circuits.items()}
    assert kinds == {"plain": [split.PlainStatement], "dp": [split.DPStatement],
                     "gram": [split.PlainStatement, split.GramStatement],
                     "dpgram": [split.DPStatement, split.GramStatement]}
    assert circuits["plain"].sizes["gram"] is None and circuits["plain"].part("gram") is None
    assert _beside(circuits["dpgram"]) and not _beside(circuits["gram"])


@pytest.mark.parametrize("name", ["plain", "gram", "dp", "dpgram"])
def test_every_word_of_the_verifier_message_is_checked(circuits, name):
    """Each word of the summed verifier message enters a check: the random combinations of every relation
    group (each is a repetition, so each is checked on its own), the bit proofs' and square-sum proofs'
    ``out`` and ``P(t) = sum U V`` words. One word moved on an honest upload must be refused: a check that
    read fewer words (only the first combination, or ``P(t)`` without ``out``) would let it through."""
    c = circuits[name]
    body, seed, commitment = _build(c, None)
    qs = hashlib.sha256(b"query " + bytes.fromhex(commitment.main_sha256)).digest()
    leader = c.query(c.leader_share(body), commitment, "h1", qs, leader=True)
    helper = c.query(c.helper_share(seed), commitment, "h1", qs, leader=False)
    assert c.decide(leader, helper) is None
    passed = []
    for j in range(c.verifier_len):
        moved = leader.copy()
        moved[j] = flp.add(moved[j:j + 1], np.ones(1, dtype=np.uint64))[0]
        if c.decide(moved, helper) is None:
            passed.append(j)
    assert passed == []
