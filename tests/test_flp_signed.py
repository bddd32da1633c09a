"""flp.encode_signed / decode_signed up to the field's edge: known vectors, properties, and refusals.

The centred range is ``[-(p-1)/2, (p-1)/2]`` with ``(p-1)/2 = 2^63 - 2^31``: narrower than int64, so the
int64 values past it must be refused, not carried to the other representative.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as hs

from secure_afl.exceptions import BoundsExceeded, MalformedPayload
from secure_afl.hazmat import flp

P, HALF = flp.P, flp.HALF
VEC = json.loads((Path(__file__).resolve().parent.parent / "vectors" / "flp_signed.json").read_text())


def test_the_vectors_state_this_field():
    assert VEC["p"] == P == 2 ** 64 - 2 ** 32 + 1 and VEC["half"] == HALF == (P - 1) // 2 == 2 ** 63 - 2 ** 31


@pytest.mark.parametrize("case", VEC["in_range"], ids=lambda c: str(c["z"]))
def test_known_vectors_encode_and_decode(case):
    z = np.array([case["z"]], dtype=np.int64)
    word = flp.encode_signed(z)
    assert word.dtype == np.uint64 and int(word[0]) == case["word"] == case["z"] % P
    assert int(flp.decode_signed(word)[0]) == case["z"]


@pytest.mark.parametrize("z", VEC["out_of_range"])
def test_a_value_past_the_centred_range_is_refused_not_wrapped(z):
    with pytest.raises(BoundsExceeded):
        flp.encode_signed(np.array([0, z, 1], dtype=np.int64))


@pytest.mark.parametrize("word", VEC["non_canonical"])
def test_a_word_that_is_no_field_element_is_refused(word):
    with pytest.raises(MalformedPayload):
        flp.decode_signed(np.array([1, word], dtype=np.uint64))


def test_the_edges_in_one_vector_and_an_empty_one():
    z = np.array([-HALF, -HALF + 1, -1, 0, 1, HALF - 1, HALF], dtype=np.int64)
    assert np.array_equal(flp.decode_signed(flp.encode_signed(z)), z)
    assert flp.encode_signed(np.array([], dtype=np.int64)).size == 0
    assert flp.decode_signed(np.array([], dtype=np.uint64)).size == 0


def test_a_strided_view_encodes_like_its_copy():
    z = np.arange(-20, 20, dtype=np.int64).reshape(8, 5) * (HALF // 20)
    assert np.array_equal(flp.encode_signed(z[:, 1]), flp.encode_signed(z[:, 1].copy()))


_SIGNED = hs.integers(-HALF, HALF)


@settings(max_examples=300, deadline=None)
@given(hs.lists(_SIGNED, min_size=1, max_size=40))
def test_round_trip_and_field_value_on_the_whole_range(zs):
    z = np.array(zs, dtype=np.int64)
    f = flp.encode_signed(z)
    assert [int(v) for v in f] == [v % P for v in zs]
    assert np.array_equal(flp.decode_signed(f), z)


@settings(max_examples=300, deadline=None)
@given(_SIGNED, _SIGNED)
def test_field_addition_of_encodings_is_integer_addition_while_it_stays_centred(a, b):
    s = flp.add(flp.encode_signed(np.array([a], dtype=np.int64)), flp.encode_signed(np.array([b], dtype=np.int64)))
    want = a + b
    if -HALF <= want <= HALF:
        assert int(flp.decode_signed(s)[0]) == want
    else:  # past the edge the field wraps: the centred representative is off by exactly p
        assert int(flp.decode_signed(s)[0]) == want - P * (1 if want > 0 else -1)


@settings(max_examples=200, deadline=None)
@given(hs.integers(0, P - 1))
def test_every_field_word_decodes_to_its_centred_representative(w):
    got = int(flp.decode_signed(np.array([w], dtype=np.uint64))[0])
    assert got % P == w and -HALF <= got <= HALF


@settings(max_examples=200, deadline=None)
@given(hs.one_of(hs.integers(HALF + 1, 2 ** 63 - 1), hs.integers(-(2 ** 63), -HALF - 1)))
def test_every_int64_past_the_edge_is_refused(z):
    with pytest.raises(BoundsExceeded):
        flp.encode_signed(np.array([z], dtype=np.int64))
