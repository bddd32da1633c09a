"""Field128 (p = 2^128 - 28 2^64 + 1): every method against Python integers, on the numpy path and the
compiled one, against python-flint's arithmetic mod p, and against the known answers in vectors/field128.json
(computed from Python integers alone by secure_afl_tools.vectors.field128_vectors, which must regenerate
the file byte for byte: tests/test_vector_files.py)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from secure_afl.exceptions import BoundsExceeded, InvalidInputError, MalformedPayload
from secure_afl.hazmat import field128_kernels as kernels
from secure_afl.hazmat.field128 import FIELD128 as F, accept_words
from secure_afl_tools.vectors import field128_vectors as gen
from secure_afl_tools.vectors.files import ROOT

P = 2 ** 128 - 28 * 2 ** 64 + 1
VEC = json.loads((ROOT / gen.OWNS).read_text())
EDGE = [0, 1, 2, P - 1, P - 2, 2 ** 64 - 1, 2 ** 64, 2 ** 64 + 1, (2 ** 64 - 28) << 64, P - 2 ** 64, 2 ** 127,
        (P - 1) // 2, (P + 1) // 2, 28 * 2 ** 64 - 1, 28 * 2 ** 64, 2 ** 96, 2 ** 96 - 1,
        (2 ** 64 - 29) << 64 | (2 ** 64 - 1)]
elements = st.one_of(st.sampled_from(EDGE), st.integers(0, P - 1))


@pytest.fixture(params=["numpy", "compiled"])
def path(request):
    """Run the test on the numpy words, then with the numba loops loaded (skipped where numba is missing)."""
    if request.param == "compiled":
        if not kernels.AVAILABLE:
            pytest.skip("numba is not installed")
        kernels.load()
    else:
        kernels.unload()
    yield request.param
    kernels.unload()


def _ints(a) -> list[int]:
    return [int(x) for x in F.to_ints(a).reshape(-1)]


def _pairs(n: int, seed: int):
    rnd = random.Random(seed)
    xs = EDGE + [rnd.randrange(P) for _ in range(n)]
    ys = [rnd.choice(EDGE) if rnd.random() < 0.3 else rnd.randrange(P) for _ in xs]
    return xs, ys


# -- the prime, the group, the constants -----------------------------------------------------------------------
def _miller_rabin_deterministic(n: int) -> bool:
    """Deterministic for n < 3.3 * 10^24 with the first 13 prime bases (Sorenson and Webster)."""
    assert n < 3_317_044_064_679_887_385_961_981
    if n < 2:
        return False
    bases = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41]
    if n in bases:
        return True
    if any(n % b == 0 for b in bases):
        return False
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def test_p_is_prime_and_7_generates_its_group_by_lucas_certificate():
    # Lucas: if g^(p-1) = 1 and g^((p-1)/q) != 1 for every prime q | p - 1, g has order p - 1, so p is prime;
    # the factors of p - 1 are below 2^49 and proven prime deterministically
    factors = VEC["p_minus_1_factors"]
    prod = 1
    for q, e in factors:
        assert _miller_rabin_deterministic(q)
        prod *= q ** e
    assert prod == P - 1 == F.P - 1
    g = F.GENERATOR
    assert pow(g, P - 1, P) == 1
    assert all(pow(g, (P - 1) // q, P) != 1 for q, _ in factors)
    # and independently, flint's primality proof
    flint = pytest.importorskip("flint")
    assert flint.fmpz(P).is_prime()
    assert not _miller_rabin_deterministic(440340496364689 * 3)


def test_constants():
    assert F.P == int(VEC["p"], 16) and F.HALF == int(VEC["half"], 16) == (P - 1) // 2
    assert (F.name, F.ENCODED_SIZE, F.TWO_ADICITY, F.GENERATOR) == ("field128", 16, 66, 7)
    assert F.dtype == np.dtype([("lo", "<u8"), ("hi", "<u8")]) and F.dtype.itemsize == 16
    with pytest.raises(AttributeError):
        F.P = 5


def test_the_2_power_subgroup_generator_has_order_exactly_2_to_the_66():
    r = F.root_of_unity(1 << 66)
    assert r == pow(7, 3 * 3491 * 440340496364689, P)
    assert pow(r, 1 << 66, P) == 1 and pow(r, 1 << 65, P) == P - 1
    for k in range(0, 67):
        w = F.root_of_unity(1 << k)
        assert pow(w, 1 << k, P) == 1 and (k == 0 or pow(w, 1 << (k - 1), P) == P - 1)
    for row in VEC["roots_of_unity"]:
        assert F.root_of_unity(1 << row["log_n"]) == int(row["root"], 16)
    for bad in (0, 3, 12, 1 << 67, -4):
        with pytest.raises(InvalidInputError):
            F.root_of_unity(bad)


# -- every method against Python integers, on both paths ---------------------------------------------------------
def test_arithmetic_against_python_ints(path):
    xs, ys = _pairs(400, 1)
    a, b = F.to_field(xs), F.to_field(ys)
    assert _ints(F.add(a, b)) == [(x + y) % P for x, y in zip(xs, ys)]
    assert _ints(F.sub(a, b)) == [(x - y) % P for x, y in zip(xs, ys)]
    assert _ints(F.mul(a, b)) == [x * y % P for x, y in zip(xs, ys)]
    assert _ints(F.neg(a)) == [-x % P for x in xs]
    assert _ints(F.scale(a, -3)) == [-3 * x % P for x in xs]
    assert F.dot(a, b) == sum(x * y for x, y in zip(xs, ys)) % P
    assert F.sum_mod(a) == sum(xs) % P
    # broadcasting one side, and a 2-D sum along each axis
    assert _ints(F.mul(a, F.to_field(ys[3]))) == [x * ys[3] % P for x in xs]
    m = F.to_field(np.array(xs[:400], dtype=object).reshape(20, 20))
    assert _ints(F.sum_mod(m, axis=0)) == [sum(xs[i * 20 + j] for i in range(20)) % P for j in range(20)]
    assert _ints(F.sum_mod(m, axis=1)) == [sum(xs[i * 20:i * 20 + 20]) % P for i in range(20)]
    assert F.sum_mod(a[:5], axis=0).shape == () and _ints(F.sum_mod(a[:5], axis=0)) == [sum(xs[:5]) % P]


def test_long_and_broadcast_vectors_against_python_ints(path):
    # longer than one numpy chunk, a one-element side, and a 2-D shape against a row
    xs, ys = _pairs(40000, 2)
    a, b = F.to_field(xs), F.to_field(ys)
    assert _ints(F.mul(a, b)) == [x * y % P for x, y in zip(xs, ys)]
    assert _ints(F.sub(b, a)) == [(y - x) % P for x, y in zip(xs, ys)]
    assert _ints(F.add(F.to_field([ys[0]]), a)) == [(ys[0] + x) % P for x in xs]
    m = a[:300 * 64].reshape(300, 64)
    row = b[:64]
    got = F.mul(m, row)
    assert got.shape == (300, 64)
    assert _ints(got) == [xs[i] * ys[i % 64] % P for i in range(300 * 64)]


def test_construction_and_conversion():
    assert _ints(F.zeros(3)) == [0, 0, 0] and _ints(F.ones((2, 2))) == [1] * 4
    big = [-1, P, P + 5, -P - 7, 2 ** 300 + 3, 12]
    assert _ints(F.to_field(big)) == [x % P for x in big]
    assert F.to_field(np.array(big, dtype=object).reshape(2, 3)).shape == (2, 3)
    assert F.to_ints(F.to_field([P - 1]))[0] == P - 1 and isinstance(F.to_ints(F.to_field([7]))[0], int)
    assert F.to_field(5).shape == ()
    for bad in (np.zeros(3, dtype=np.uint64), [1, 2], np.zeros(3, dtype=[("lo", "<u8"), ("hi", ">u8")])):
        with pytest.raises(InvalidInputError):
            F.mul(bad, F.ones(3))
    with pytest.raises(InvalidInputError):
        F.inv(P)


def test_powers_inverse_and_poly_eval(path):
    x = 0x1234567890ABCDEF1122334455667788
    assert _ints(F.powers(x, 300, start=7)) == [pow(x, 7 + i, P) for i in range(300)]
    assert F.powers(x, 0).size == 0
    for a in EDGE[1:]:
        assert F.inv(a) * a % P == 1 and F.inv(a - P) == F.inv(a)
    for n in (1, 5, 64, 65, 700):  # Horner below 65 coefficients, a dot product with the powers above
        cs = [random.Random(n).randrange(P) for _ in range(n)]
        acc = 0
        for c in reversed(cs):
            acc = (acc * x + c) % P
        assert F.poly_eval(F.to_field(cs), x) == acc


def test_ntt_against_the_naive_transform(path):
    rnd = random.Random(3)
    for n in (1, 2, 4, 8, 64, 128):
        v = [rnd.randrange(P) for _ in range(n)]
        w = F.root_of_unity(n)
        want = gen.dft(v, w)
        assert _ints(F.ntt(F.to_field(v))) == want
        assert _ints(F.intt(F.to_field(want))) == v
    # a batch of rows and another root
    rows = [[rnd.randrange(P) for _ in range(32)] for _ in range(3)]
    w = pow(F.root_of_unity(32), 5, P)
    assert _ints(F.ntt(F.to_field(rows), w)) == sum((gen.dft(r, w) for r in rows), [])
    for bad in (F.zeros(6), F.zeros(())):
        with pytest.raises(InvalidInputError):
            F.ntt(bad)


# -- signed values -----------------------------------------------------------------------------------------------
def test_signed_encoding_at_the_bounds():
    half = F.HALF
    zs = [0, 1, -1, half, -half, half - 1, -half + 1, 2 ** 64, -(2 ** 100)]
    enc = F.encode_signed(np.array(zs, dtype=object))
    assert _ints(enc) == [z % P for z in zs]
    assert list(F.decode_signed(enc)) == zs
    for z in (half + 1, -half - 1, 2 ** 127, P, -P):
        with pytest.raises(BoundsExceeded):
            F.encode_signed(np.array([0, z], dtype=object))
    i64 = np.array([0, 1, -1, 2 ** 63 - 1, -2 ** 63, -12345], dtype=np.int64)
    assert _ints(F.encode_signed(i64)) == [int(z) % P for z in i64]
    assert [int(v) for v in F.decode_signed(F.encode_signed(i64))] == [int(z) for z in i64]
    assert F.encode_signed(i64.reshape(2, 3)).shape == (2, 3)
    assert _ints(F.encode_signed(np.array([2 ** 64 - 1], dtype=np.uint64))) == [2 ** 64 - 1]
    with pytest.raises(InvalidInputError):
        F.encode_signed(np.array([1.5]))
    # the centred value half + 1 reads as -half
    assert F.decode_signed(F.to_field([half + 1]))[0] == -half
    for row in VEC["signed"]:
        assert F.to_bytes(F.encode_signed(np.array([int(row["z"])], dtype=object))).hex() == row["encoded"]
    for z in VEC["signed_refused"]:
        with pytest.raises(BoundsExceeded):
            F.encode_signed(np.array([int(z)], dtype=object))


def test_decode_signed_float_rounds_half_to_even():
    # 2^53 + 1 lies halfway between two doubles: even rounds down; 2^53 + 3 rounds up; a value past 2^64
    # whose dropped bits are not exactly half rounds to nearest
    zs = [2 ** 53 + 1, 2 ** 53 + 3, -(2 ** 53 + 1), 2 ** 100 + 2 ** 47, 2 ** 100 + 2 ** 47 + 1, F.HALF, -F.HALF, 0,
          3 * 2 ** 90 + 2 ** 37 - 1, 2 ** 100 + 3 * 2 ** 47, -(2 ** 100 + 3 * 2 ** 47), 2 ** 64 - 1, 2 ** 64,
          2 ** 64 + 2 ** 11, 2 ** 65 - 2 ** 11, 2 ** 65 - 2 ** 11 - 1, -(2 ** 127 - 2 ** 70), 2 ** 116 - 2 ** 62, 0]
    # a high word just below a power of two rounds up to it as a float: its bit length is not frexp's exponent
    zs += [(2 ** 63 - 15) * 2 ** 64 + 5, -((2 ** 60 - 1) * 2 ** 64 + 12345), (2 ** 54 - 1) * 2 ** 64]
    rnd = random.Random(7)
    zs += [rnd.randrange(-F.HALF, F.HALF) >> rnd.randrange(128) for _ in range(400)]
    got = F.decode_signed_float(F.to_field(zs))
    assert got.dtype == np.float64 and list(got) == [float(z) for z in zs]
    assert F.decode_signed_float(F.to_field(np.array(zs[:6], dtype=object).reshape(2, 3))).shape == (2, 3)
    assert got[0] == 2.0 ** 53 and got[1] == 2.0 ** 53 + 4


def test_decode_refuses_a_word_that_is_no_element():
    bad = np.zeros(2, dtype=F.dtype)
    bad["lo"], bad["hi"] = [1, 0], [2 ** 64 - 28, 2 ** 64 - 1]
    with pytest.raises(MalformedPayload):
        F.decode_signed(bad)
    with pytest.raises(MalformedPayload):
        F.decode_signed_float(bad[:1])


# -- bytes -----------------------------------------------------------------------------------------------------
def test_bytes_round_trip_and_refusals():
    xs = EDGE[:]
    a = F.to_field(xs)
    body = F.to_bytes(a)
    assert body == b"".join(x.to_bytes(16, "little") for x in xs) == a.tobytes()
    assert _ints(F.from_bytes(body, len(xs))) == xs
    for word in VEC["malformed"]:
        with pytest.raises(MalformedPayload):
            F.from_bytes(body[:16] + bytes.fromhex(word), what="a share")
    for cut in (body[:-1], body + b"\x00", body[:15]):
        with pytest.raises(MalformedPayload):
            F.from_bytes(cut)
    with pytest.raises(MalformedPayload):
        F.from_bytes(body, len(xs) + 1)
    assert F.from_bytes(b"").size == 0
    # p - 1 is the largest element; p is refused by name of what was read
    with pytest.raises(MalformedPayload, match="the noise share"):
        F.from_bytes(P.to_bytes(16, "little"), what="the noise share")
    assert _ints(F.from_bytes((P - 1).to_bytes(16, "little"))) == [P - 1]


# -- key expansion --------------------------------------------------------------------------------------------
def test_expand_field_is_the_keystream_below_p_in_order():
    key, domain = bytes(range(32)), b"field128 dom"
    got = F.expand_field(key, 1000, domain)
    assert _ints(got) == gen.expand_reference(key, 1000, domain)
    assert _ints(F.expand_field(key, 10, domain)) == _ints(got[:10])  # a prefix of the same stream
    assert F.expand_field(key, 0, domain).size == 0
    assert _ints(F.expand_field(key, 10, b"other domain")) != _ints(got[:10])
    e = VEC["expand"]
    assert _ints(F.expand_field(bytes.fromhex(e["key"]), e["n"], bytes.fromhex(e["domain"]))) == \
        [int(v, 16) for v in e["elements"]]
    for k, d in ((bytes(31), domain), (bytes(32), b"short"), ("x" * 32, domain)):
        with pytest.raises(InvalidInputError):
            F.expand_field(k, 4, d)


def test_expand_field_looks_uniform():
    # 4096 draws: each of the 16 top-nibble buckets of [0, p) should hold 256 +- a few sigma (sigma ~ 15.5)
    x = F.to_ints(F.expand_field(b"\x07" * 32, 4096, bytes(12)))
    assert all(0 <= v < P for v in x)
    buckets = np.bincount([int(v) * 16 // P for v in x], minlength=16)
    assert buckets.min() > 256 - 80 and buckets.max() < 256 + 80
    assert abs(float(np.mean([float(v) / P for v in x])) - 0.5) < 0.02


def test_the_rejection_step_drops_words_at_or_above_p():
    # a word >= p turns up with probability < 2^-59: the step is checked on a crafted stream
    words = [5, P, P - 1, 2 ** 128 - 1, 0, P + 1, 2 ** 64]
    buf = b"".join(w.to_bytes(16, "little") for w in words)
    assert _ints(accept_words(buf)) == [w for w in words if w < P]
    with pytest.raises(InvalidInputError):
        accept_words(buf[:-3])


# -- property tests ----------------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(st.lists(elements, min_size=1, max_size=12), st.lists(elements, min_size=1, max_size=12),
       st.lists(elements, min_size=1, max_size=12))
def test_ring_laws(xs, ys, zs):
    n = min(len(xs), len(ys), len(zs))
    a, b, c = F.to_field(xs[:n]), F.to_field(ys[:n]), F.to_field(zs[:n])
    assert _ints(F.add(a, b)) == _ints(F.add(b, a)) and _ints(F.mul(a, b)) == _ints(F.mul(b, a))
    assert _ints(F.mul(F.mul(a, b), c)) == _ints(F.mul(a, F.mul(b, c)))
    assert _ints(F.add(F.add(a, b), c)) == _ints(F.add(a, F.add(b, c)))
    assert _ints(F.mul(a, F.add(b, c))) == _ints(F.add(F.mul(a, b), F.mul(a, c)))
    assert _ints(F.sub(F.add(a, b), b)) == xs[:n] and _ints(F.add(a, F.neg(a))) == [0] * n
    assert _ints(F.mul(a, F.ones(n))) == xs[:n]
    assert _ints(F.mul(a, b)) == [x * y % P for x, y in zip(xs[:n], ys[:n])]


@settings(max_examples=100, deadline=None)
@given(elements.filter(lambda v: v != 0))
def test_inverse_property(x):
    assert x * F.inv(x) % P == 1
    assert _ints(F.mul(F.to_field([x]), F.to_field([F.inv(x)]))) == [1]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 7).flatmap(lambda k: st.lists(elements, min_size=1 << k, max_size=1 << k)))
def test_ntt_round_trip(xs):
    a = F.to_field(xs)
    assert _ints(F.intt(F.ntt(a))) == xs
    assert _ints(F.ntt(a)) == gen.dft(xs, F.root_of_unity(len(xs)))


@settings(max_examples=60, deadline=None)
@given(st.lists(elements, min_size=1, max_size=100), elements)
def test_poly_eval_is_horner(cs, x):
    acc = 0
    for c in reversed(cs):
        acc = (acc * x + c) % P
    assert F.poly_eval(F.to_field(cs), x) == acc


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(-((P - 1) // 2), (P - 1) // 2), min_size=1, max_size=20))
def test_signed_round_trip(zs):
    assert list(F.decode_signed(F.encode_signed(np.array(zs, dtype=object)))) == zs
    assert list(F.decode_signed_float(F.encode_signed(np.array(zs, dtype=object)))) == [float(z) for z in zs]


# -- the compiled loops equal the numpy words bit for bit -------------------------------------------------------
@pytest.mark.skipif(not kernels.AVAILABLE, reason="numba is not installed")
def test_compiled_loops_equal_the_numpy_path_bit_for_bit():
    rnd = random.Random(9)
    xs = EDGE * 8 + [rnd.randrange(P) for _ in range(3000)]
    ys = list(reversed(xs))
    a, b = F.to_field(xs), F.to_field(ys)
    rows = F.to_field([[rnd.randrange(P) for _ in range(256)] for _ in range(4)])
    x = 0xFFFFFFFFFFFFFFE3FFFFFFFFFFFFFFFF

    def run():
        return [F.mul(a, b).tobytes(), F.add(a, b).tobytes(), F.sub(a, b).tobytes(), F.neg(a).tobytes(),
                F.scale(a, x).tobytes(), F.dot(a, b), F.sum_mod(a), F.ntt(rows).tobytes(),
                F.intt(rows).tobytes(), F.poly_eval(a, x), F.powers(x, 1000).tobytes()]

    try:
        kernels.unload()
        numpy_out = run()
        kernels.load()
        compiled_out = run()
    finally:
        kernels.unload()
    assert compiled_out == numpy_out
    assert F.dot(a, b) == sum(p * q for p, q in zip(xs, ys)) % P


# -- an independent implementation: python-flint ------------------------------------------------------------
def test_against_flint(path):
    flint = pytest.importorskip("flint")
    ctx = flint.fmpz_mod_ctx(P)
    xs, ys = _pairs(200, 5)
    a, b = F.to_field(xs), F.to_field(ys)
    fx, fy = [ctx(x) for x in xs], [ctx(y) for y in ys]
    assert _ints(F.mul(a, b)) == [int(u * v) for u, v in zip(fx, fy)]
    assert _ints(F.add(a, b)) == [int(u + v) for u, v in zip(fx, fy)]
    assert _ints(F.sub(a, b)) == [int(u - v) for u, v in zip(fx, fy)]
    assert [F.inv(x) for x in xs if x] == [int(u ** -1) for u in fx if int(u)]
    # the NTT is evaluation at the powers of the root: flint's polynomial evaluated there
    poly = flint.fmpz_mod_poly_ctx(ctx)(xs[:64])
    w = ctx(F.root_of_unity(64))
    assert _ints(F.ntt(a[:64])) == [int(poly(w ** i)) for i in range(64)]
    assert F.poly_eval(a[:64], ys[0]) == int(poly(fy[0]))


# -- the known answers --------------------------------------------------------------------------------------
def test_the_library_reproduces_the_vectors(path):
    rows = VEC["arithmetic"]
    h = lambda key: [int(r[key], 16) for r in rows]  # noqa: E731
    a, b = F.to_field(h("a")), F.to_field(h("b"))
    assert _ints(F.add(a, b)) == h("sum") and _ints(F.sub(a, b)) == h("difference")
    assert _ints(F.mul(a, b)) == h("product")
    for r in VEC["inverse"]:
        assert F.inv(int(r["a"], 16)) == int(r["inverse"], 16)
    pw = VEC["powers"]
    assert _ints(F.powers(int(pw["x"], 16), len(pw["values"]), start=pw["start"])) == \
        [int(v, 16) for v in pw["values"]]
    nt = VEC["ntt"]
    assert _ints(F.ntt(F.to_field([int(v, 16) for v in nt["input"]]))) == [int(v, 16) for v in nt["output"]]
    assert _ints(F.intt(F.to_field([int(v, 16) for v in nt["output"]]))) == [int(v, 16) for v in nt["input"]]
    pe = VEC["poly_eval"]
    assert F.poly_eval(F.to_field([int(v, 16) for v in pe["coeffs"]]), int(pe["x"], 16)) == int(pe["value"], 16)


# -- the benchmark runs and names every case ------------------------------------------------------------------
def test_bench_field_prints_every_case_and_column():
    from secure_afl_tools import bench_field

    res = bench_field.run(log_n=6, ntt_range=(4, 5), repeats=1)
    assert list(res["seconds"]) == ["mul", "add", "dot", "ntt 2^4", "ntt 2^5", "expand"]
    assert all(t > 0 for row in res["seconds"].values() for t in row.values())
    assert all({"gold numpy", "f128 numpy"} <= set(row) for row in res["seconds"].values())
    assert ("f128 numba" in res["seconds"]["mul"]) == kernels.AVAILABLE
    table = bench_field.render(res)
    assert "ntt 2^5" in table and "numba gain" in table and kernels.loaded() is None
