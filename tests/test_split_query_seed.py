"""split: the key holder's query seed, against its documented derivation (docs/VALIDITY.md).

``query key = HKDF-SHA256(seed key, salt none, info "secure-afl/split/query-key/v1", 32 bytes)`` and
``query seed = HMAC-SHA256(query key, "secure-afl/split/query/v1\\0" || canonical JSON of {session_id,
params_digest, hospital, payload_sha256, validity})``. The expected values here are computed from that text
with ``hmac``, ``hashlib`` and ``cryptography``, never by calling the functions under test; the end-to-end
attack that a predictable seed opens is in ``tests/test_split_stream.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from secure_afl import split
from secure_afl.packing import Layout
from secure_afl.params import Bounds

SEED_KEY = bytes(range(32))  # a key holder's secret seed key (fixed input)
HOSPITAL = "hosp-a"
PAYLOAD_SHA256 = hashlib.sha256(b"the masked payload").hexdigest()
VALIDITY = {"main_sha256": hashlib.sha256(b"main").hexdigest(), "aux_sha256": hashlib.sha256(b"aux").hexdigest(),
            "seed_sha256": hashlib.sha256(b"seed").hexdigest()}


def _params(session_id="kat-query", gamma=1.0):
    return split.split_session_params(session_id, Layout(3, 2), gamma, Bounds(4.0, 100, 8))


def _documented(seed_key: bytes, session_id: str, params_digest: str, hospital: str, payload_sha256: str,
                validity: dict) -> bytes:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
               info=b"secure-afl/split/query-key/v1").derive(seed_key)
    upload = json.dumps({"session_id": session_id, "params_digest": params_digest, "hospital": hospital,
                         "payload_sha256": payload_sha256, "validity": validity},
                        sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, b"secure-afl/split/query/v1\x00" + upload, hashlib.sha256).digest()


def _seed(seed_key=SEED_KEY, params=None, hospital=HOSPITAL, payload_sha256=PAYLOAD_SHA256, validity=VALIDITY):
    return split.query_seed(split.query_key(seed_key), params or _params(), hospital, payload_sha256, validity)


def test_query_seed_known_answer():
    # Execute / Assert: the library's seed is the documented HKDF then HMAC over the committed upload
    params = _params()
    expected = _documented(SEED_KEY, "kat-query", params.digest().hex(), HOSPITAL, PAYLOAD_SHA256, VALIDITY)
    assert _seed(params=params) == expected
    # and the query key alone is the documented HKDF of the seed key
    assert split.query_key(SEED_KEY) == HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                                             info=b"secure-afl/split/query-key/v1").derive(SEED_KEY)


def test_query_seed_is_keyed_and_covers_every_field_of_the_upload():
    # Prepare: the fixed input, then each field changed on its own
    base = _seed()
    other = {
        "seed key": _seed(seed_key=bytes(32)),
        "seed key, one bit": _seed(seed_key=bytes([SEED_KEY[0] ^ 1]) + SEED_KEY[1:]),
        "session id": _seed(params=_params(session_id="kat-query-2")),
        "parameters (same session id)": _seed(params=_params(gamma=2.0)),
        "hospital": _seed(hospital="hosp-b"),
        "payload hash": _seed(payload_sha256=hashlib.sha256(b"another payload").hexdigest()),
        **{f"validity.{k}": _seed(validity={**VALIDITY, k: hashlib.sha256(k.encode()).hexdigest()})
           for k in VALIDITY},
    }
    # Assert: every change gives another seed, and no two changes the same one
    assert _params().digest() != _params(gamma=2.0).digest()
    assert all(v != base for v in other.values()), [k for k, v in other.items() if v == base]
    assert len(set(other.values())) == len(other)


@pytest.mark.parametrize("weakened", ["hmac, empty key", "sha-256, no key"])
def test_a_keyless_seed_is_what_anyone_computes_and_the_real_one_is_not(weakened):
    # The attack of tests/test_split_stream.py predicts a keyless derivation; the real seed is none of them
    params = _params()
    upload = json.dumps({"session_id": "kat-query", "params_digest": params.digest().hex(), "hospital": HOSPITAL,
                         "payload_sha256": PAYLOAD_SHA256, "validity": VALIDITY},
                        sort_keys=True, separators=(",", ":")).encode()
    msg = b"secure-afl/split/query/v1\x00" + upload
    guess = hmac.new(b"", msg, hashlib.sha256).digest() if weakened.startswith("hmac") \
        else hashlib.sha256(msg).digest()
    assert _seed(params=params) != guess
