"""Aggregate tags: sealed, signed check values that expose a forged ckks aggregate."""

import hashlib
import json

import numpy as np
import pytest

from secure_afl import pki
from secure_afl.exceptions import (
    DecryptionRefused,
    InvalidContribution,
    InvalidSignature,
    MalformedPayload,
)
from secure_afl.packing import TAG_SLOTS, Layout
from secure_afl.params import Bounds, SessionParams
from secure_afl.tagging import (
    check_aggregate_tag,
    generate_tag_key,
    new_tag,
    open_tag,
    seal_tag,
    sign_tag,
    verify_tag,
)
from secure_afl.server import aggregator, intake

pytestmark = pytest.mark.security


@pytest.fixture
def keys():
    return generate_tag_key()


@pytest.fixture
def params(keys):
    return SessionParams("tag-s", "ckks", Layout(3, 2), 1.0, Bounds(1.0, 10, 4), {"tag_public_key": keys[1]})


@pytest.fixture(scope="module")
def identities(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    pki.init_ca(d)
    return {h: pki.issue(d, "hospital", h) for h in ("a", "b", "c")}


def test_new_tag_is_random_and_within_the_declared_bound(params):
    # Execute
    tags = np.array([new_tag(params) for _ in range(200)])
    # Assert
    half = 0.5 * params.bounds.hospital_bound(params.gamma)
    assert tags.shape == (200, TAG_SLOTS) and np.abs(tags).max() <= half
    assert len({t.tobytes() for t in tags}) == 200
    assert abs(tags.mean()) < 0.1 * half


def test_seal_open_round_trip_and_binding(params, keys):
    # Prepare
    tag = new_tag(params)
    box = seal_tag(params, "a", tag)
    # Execute / Assert
    assert np.array_equal(open_tag(params, "a", box, keys[0]), tag)
    assert seal_tag(params, "a", tag) != box  # fresh ephemeral key each time
    with pytest.raises(InvalidContribution):
        open_tag(params, "b", box, keys[0])  # bound to the hospital
    with pytest.raises(InvalidContribution):
        open_tag(params, "a", box, generate_tag_key()[0])  # only the key holder's key opens it
    flipped = bytearray(box)
    flipped[40] ^= 1
    with pytest.raises(InvalidContribution):
        open_tag(params, "a", bytes(flipped), keys[0])
    with pytest.raises(MalformedPayload):
        open_tag(params, "a", box[:-1], keys[0])
    other = params.with_backend_params(extra=1)  # other parameters (digest) -> other AEAD key
    with pytest.raises(InvalidContribution):
        open_tag(other, "a", box, keys[0])


def test_tag_statement_signature(params, identities):
    # Prepare
    a = identities["a"]
    box = seal_tag(params, "a", new_tag(params))
    sha = hashlib.sha256(b"payload").hexdigest()
    st = sign_tag(a.identity_key(), params, "a", sha, box)
    # Execute / Assert
    assert verify_tag(st, a.identity_pub(), params, "a", sha) == box
    with pytest.raises(InvalidSignature):
        verify_tag(st, identities["b"].identity_pub(), params, "a", sha)
    with pytest.raises(MalformedPayload):
        verify_tag(st, a.identity_pub(), params, "a", hashlib.sha256(b"other").hexdigest())
    with pytest.raises(MalformedPayload):
        verify_tag(st, a.identity_pub(), params, "b", sha)
    forged_box = seal_tag(params, "a", np.zeros(TAG_SLOTS))
    with pytest.raises(InvalidSignature):
        verify_tag({**st, "box": forged_box.hex()}, a.identity_pub(), params, "a", sha)
    with pytest.raises(MalformedPayload):
        verify_tag({"box": "zz"}, a.identity_pub(), params, "a", sha)


def _round(params, identities, names):
    tags, statements, participants = {}, {}, []
    for h in names:
        tags[h] = new_tag(params)
        sha = hashlib.sha256(h.encode()).hexdigest()
        statements[h] = sign_tag(identities[h].identity_key(), params, h, sha, seal_tag(params, h, tags[h]))
        participants.append({"hospital": h, "payload_sha256": sha})
    enrolled = {h: identities[h].identity_pub() for h in identities}
    return tags, statements, {"participants": participants}, enrolled


def test_check_aggregate_tag_accepts_the_true_sum_only(params, keys, identities):
    # Prepare
    tags, statements, manifest, enrolled = _round(params, identities, ["a", "b", "c"])
    true_sum = sum(tags.values())
    # Execute / Assert: the honest sum (with CKKS-sized noise) passes
    out = check_aggregate_tag(params, true_sum + 1e-9, manifest, statements, enrolled, keys[0], 1e-7)
    assert out == {"passed": True, "tag_tolerance": 1e-7} and "gap" not in str(out)
    # one contribution left out (the server forwarded fewer ciphertexts) -> refused
    with pytest.raises(DecryptionRefused) as e:
        check_aggregate_tag(params, tags["a"] + tags["b"], manifest, statements, enrolled, keys[0], 1e-7)
    assert e.value.reason == "aggregate_forged"
    # a participant without a tag -> refused
    with pytest.raises(DecryptionRefused):
        check_aggregate_tag(params, true_sum, manifest, {"a": statements["a"], "b": statements["b"]}, enrolled,
                            keys[0], 1e-7)
    # a statement swapped between hospitals -> refused
    with pytest.raises((MalformedPayload, InvalidSignature)):
        check_aggregate_tag(params, true_sum, manifest, {**statements, "c": statements["a"]}, enrolled,
                            keys[0], 1e-7)


def test_server_requires_a_valid_tag_on_ckks_uploads(tmp_path):
    """In-process server: a ckks upload without its signed tag, or with another upload's tag, is refused."""
    from support import Consortium

    from secure_afl.backends.ckks import ckks_session_params
    from secure_afl.exceptions import MalformedPayload as MP
    from secure_afl.protocol import context_publication
    from secure_afl.server.aggregator import open_server
    from secure_afl.server.config import load_config
    from secure_afl.signing import sign_upload

    # Prepare
    c = Consortium(tmp_path, backend="ckks", hospitals=("h1", "h2"))
    kh = c.keyholder
    p0 = ckks_session_params(c.session_id, Layout(c.dim, c.classes), 1.0, Bounds(c.max_norm, 1000, 8))
    public = kh.keygen(p0)
    srv = open_server(load_config(c.config))
    try:
        tag_pub = (c.root / "keys" / f"{c.session_id}.tag.pub").read_text()
        from secure_afl.keyholder_params import sign_session_params

        sig = sign_session_params(kh.party.identity_key(), kh.params(c.session_id))
        aggregator.publish_context(srv, "keyholder:keyholder", context_publication(public, tag_pub, sig))
        params = srv.params
        from secure_afl.backends import get_backend

        party = pki.load_party(c.pki_dir, "hospital", "h1")
        v = np.zeros(params.layout.length)
        tag = new_tag(params)
        v[params.layout.slices["tag"]] = tag
        payload = get_backend(params).protect(v, public_context=public)
        sha = hashlib.sha256(payload).digest()

        def statement():
            return sign_upload(party.identity_key(), c.session_id, params.digest(), sha, "h1")

        good_tag = sign_tag(party.identity_key(), params, "h1", sha.hex(), seal_tag(params, "h1", tag))
        wrong_tag = sign_tag(party.identity_key(), params, "h1", hashlib.sha256(b"x").hexdigest(),
                             seal_tag(params, "h1", tag))
        # Execute / Assert
        with pytest.raises(MP):
            intake.submit(srv, "h1", statement(), payload, None)
        with pytest.raises(MP):
            intake.submit(srv, "h1", statement(), payload, wrong_tag)
        assert srv.store.upload_count() == 0
        receipt = intake.submit(srv, "h1", statement(), payload, good_tag)
        assert receipt["hospital"] == "h1" and srv.store.upload_count() == 1
        refused = [json.loads(l) for l in (srv.dir / "audit.jsonl").read_text().splitlines()
                   if '"refused"' in l]
        assert [r["reason"] for r in refused][-2:] == ["malformed", "malformed"]
    finally:
        aggregator.shutdown(srv)
