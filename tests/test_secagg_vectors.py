"""vectors/secagg/: the secagg wire format, byte for byte, and its bad cases.

The generator (secure_afl_tools.vectors.secagg_messages) runs one real round with fixed keys and a fixed random
stream; tests/test_vector_files.py runs it again and must get the same files. Here every recorded message must
decode and re-encode to its own bytes, a fresh server round and fresh clients fed the recorded messages must
produce the recorded answers, and each bad case, fed in place of the message it replaces, must raise its typed
exception.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pytest

from secure_afl import exceptions
from secure_afl.encoding import canonical_json
from secure_afl.secagg import messages
from secure_afl.secagg.messages import UnmaskMaterial, decode_message
from secure_afl.secagg.server import SecAggServerRound
from secure_afl_tools.vectors import files, secagg_messages as gen
from support import sourcetree as st

VEC = files.instance("secagg", gen.INSTANCE)
BAD = files.bad_cases("secagg", gen.INSTANCE)
MESSAGES = VEC["messages"]
NAMES = [m["name"] for m in MESSAGES]


def _raw(entry) -> bytes:
    return entry["json"].encode("ascii") if "json" in entry else bytes.fromhex(entry["hex"])


def test_the_vectors_cover_every_stage_and_the_signed_messages():
    types = {m["type"] for m in MESSAGES}
    assert {"secagg.key_advertisement", "secagg.share_keys_request", "secagg.share_keys_response",
            "secagg.masked_input_request", "secagg.masked_input", "secagg.consistency", "secagg.unmask_request",
            "secagg.unmask_response"} <= types
    assert {m["stage"] for m in MESSAGES} == {"setup", "advertise_keys", "share_keys", "masked_input", "unmask"}
    assert VEC["params_digest"] == gen.params().digest().hex()


@pytest.mark.parametrize("entry", MESSAGES, ids=NAMES)
def test_each_message_decodes_and_re_encodes_to_its_bytes(entry):
    msg = decode_message(_raw(entry))
    assert msg.TYPE == entry["type"] and msg.to_bytes() == _raw(entry)
    assert type(msg).from_dict(json.loads(json.dumps(msg.to_dict()))) == msg


def test_the_complaint_and_the_unmask_material_re_encode_to_their_bytes():
    complaint = decode_message(_raw(VEC["dealer_complaint"]))
    assert complaint.to_bytes() == _raw(VEC["dealer_complaint"]) and complaint.deal.dealer == 2
    material = UnmaskMaterial.from_dict(json.loads(VEC["unmask_material"]["json"]))
    assert canonical_json(material.to_dict()) == _raw(VEC["unmask_material"])
    assert canonical_json(_server_until(None).unmask_material().to_dict()) == _raw(VEC["unmask_material"])


def test_the_signed_messages_verify_under_the_fixed_identities():
    _, pub = gen.identities()
    signed = [decode_message(_raw(m)) for m in MESSAGES if m["type"] in ("secagg.key_advertisement",
                                                                         "secagg.consistency")]
    assert len(signed) == 2 * gen.N and all(m.verify(pub[m.client_id]) for m in signed)
    deals = [decode_message(_raw(m)).deal for m in MESSAGES if m["type"] == "secagg.share_keys_response"]
    assert len(deals) == gen.N and all(d.verify(pub[d.dealer]) for d in deals)


def _server_until(stop: str | None, replacement: bytes | None = None):
    """A fresh server round fed the recorded answers in order; at ``stop`` it is fed ``replacement`` instead."""
    _, pub = gen.identities()
    server = SecAggServerRound(gen.params(), participants=range(1, gen.N + 1), identity_keys=pub)
    stage = MESSAGES[0]["stage"]
    for entry in MESSAGES:
        if entry["stage"] != stage:
            server.close_stage()
            stage = entry["stage"]
        kind = entry["name"].rsplit("_", 2)
        u = int(kind[-1])
        if entry["name"] == stop:
            return server.receive(decode_message(replacement))
        if kind[-2] == "request":
            assert server.request(u).to_bytes() == _raw(entry), entry["name"]
        else:
            server.receive(decode_message(_raw(entry)))
    server.close_stage()
    return server


def test_a_fresh_server_round_fed_the_recorded_answers_asks_the_recorded_requests_and_sums_the_same():
    server = _server_until(None)
    total = np.ascontiguousarray(server.aggregate_vector_, dtype="<f8").tobytes()
    assert hashlib.sha256(total).hexdigest() == VEC["aggregate_sha256"]


def _client_until(u: int, stop: str, replacement: bytes):
    priv, pub = gen.identities()
    client = gen.make_client(gen.params(), u, priv, pub)
    for entry in MESSAGES:
        name = entry["name"]
        if not name.endswith(f"_request_{u}"):
            continue
        req = decode_message(replacement if name == stop else _raw(entry))
        # the client's own answers need its secrets, drawn from the generator's stream: the replay stops
        # before the first stage that draws them (share_keys), or at the case itself
        if name == stop:
            return client.handle(req)
        assert client.handle(req).to_bytes() == _raw(MESSAGES[NAMES.index(name.replace("request", "response"))])
    raise AssertionError(f"{stop} is not a recorded request to client {u}")


@pytest.mark.parametrize("case", BAD, ids=[c["name"] for c in BAD])
def test_each_bad_case_raises_its_typed_exception(case):
    expected = getattr(exceptions, case["expect"])
    assert issubclass(expected, exceptions.SecureAFLError)
    raw = _raw(case)
    with pytest.raises(expected):
        if case["replay"] == "decode":
            decode_message(raw)
        elif case["replay"] == "server":
            _server_until(case["replaces"], raw)
        else:
            u = int(case["replaces"].rsplit("_", 1)[1])
            _client_until(u, case["replaces"], raw)


@pytest.mark.parametrize("case", [c for c in BAD if c["replay"] != "decode"],
                         ids=[c["name"] for c in BAD if c["replay"] != "decode"])
def test_the_message_each_bad_case_replaces_is_accepted(case):
    # the same replay with the recorded message goes through: the refusal is the case's, not the replay's
    original = _raw(MESSAGES[NAMES.index(case["replaces"])])
    if case["replay"] == "server":
        _server_until(case["replaces"], original)
    else:
        u = int(case["replaces"].rsplit("_", 1)[1])
        with gen.fixed_randomness(b"any stream: only the refusal matters"):
            _client_until(u, case["replaces"], original)


def _first(type_: str) -> dict:
    return json.loads(next(m["json"] for m in MESSAGES if m["type"] == type_))


@pytest.mark.parametrize("type_, edit, path", [
    ("secagg.key_advertisement", lambda d: d.update(enc_public_key="AAAA"), "enc_public_key: must be 32 bytes"),
    ("secagg.key_advertisement", lambda d: d.update(client_id=True), "client_id: must be an int"),
    ("secagg.key_advertisement", lambda d: d.pop("params_digest"), "params_digest: missing"),
    ("secagg.key_advertisement", lambda d: d.update(signature="not base64!"), "signature: not base64"),
    ("secagg.share_keys_response", lambda d: d["deal"]["commitments"][0].pop(), "deal.commitments[0]: must be a list"),
    ("secagg.share_keys_response", lambda d: d["shares"][0].update(nonce="AAAA"), "shares[0].nonce: must be 12"),
    ("secagg.share_keys_response", lambda d: d["deal"]["commitments"].reverse(), "deal.commitments: commitments are"),
    ("secagg.share_keys_response", lambda d: d.update(deal=None), "deal: a deal record is an object"),
    ("secagg.consistency", lambda d: d.update(survivors=[2, 1, 3]), "survivors: must be strictly increasing"),
    ("secagg.unmask_request", lambda d: d["statements"].update(round=0), "statements: out of range"),
    ("secagg.unmask_response", lambda d: d.update(mask_key_shares=[]), "mask_key_shares: expected an object"),
])
def test_a_malformed_field_is_a_typed_error_that_names_it(type_, edit, path):
    d = _first(type_)
    edit(d)
    with pytest.raises(exceptions.MalformedPayload, match=f"malformed {type_} message: {path}".replace("[", r"\[")
                       .replace("]", r"\]")) as err:
        decode_message(canonical_json(d))
    assert err.value.reason == "malformed"


def test_every_message_table_has_the_header_and_the_round_last():
    m = messages
    for cls in (getattr(m, name) for name in m.__all__):
        if isinstance(cls, type) and issubclass(cls, m.MessageBase):
            names = [f.name for f in cls.FIELDS]
            assert names[:2] == ["session_id", "client_id"] and names[-1] == "round", cls
            assert [f.name for f in dataclasses.fields(cls)] == names


def test_the_generator_is_a_tool_not_part_of_a_partys_install():
    # setup.py's ROOTS are what a party installs; vectors/ is a development folder, the generators are tools
    assert "vectors" not in st.roots() and all(not f.startswith("vectors") for f in st.roots())
    assert "tools" not in st.main_roots() and st.separate_roots()["tools"] == "secure_afl_tools"
    assert gen.__name__.startswith("secure_afl_tools.vectors.")
