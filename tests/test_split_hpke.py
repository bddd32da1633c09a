"""The split seed box: RFC 9180 HPKE with the hybrid ML-KEM-768 + X25519 KEM (``cryptography``'s ``hpke``).

A fixed vector pins the format (key layout, info, suite); round trips and
negative tests cover the associated data, the key and the retired
hand-built X25519 box, which is refused by name, at the library and at the
server's upload route.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from secure_afl import domains
from secure_afl import split
from secure_afl.backends import get_backend
from secure_afl.exceptions import InvalidContribution, MalformedPayload, SecureAFLError
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.signing import sign_box_statement

VECTOR = json.loads((Path(__file__).resolve().parent.parent / "vectors" / "split_seed_box.json").read_text())
LAYOUT = Layout(6, 3)


def _session(sid="split-hpke"):
    params = split.split_session_params(sid, LAYOUT, 1.0, Bounds(4.0, 1000, 8))
    keys = split.generate_keys(params)
    return split.bind_public_context(params, keys.public_context), keys


def _retired_box(x25519_public: bytes, ad: bytes, seed: bytes) -> bytes:
    """The box format before HPKE, built by hand as an old hospital's software would."""
    eph = X25519PrivateKey.generate()
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

    shared = eph.exchange(X25519PublicKey.from_public_bytes(x25519_public))
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"old-box\0" + ad).derive(shared)
    return eph.public_key().public_bytes_raw() + ChaCha20Poly1305(key).encrypt(bytes(12), seed, ad)


def test_known_answer_box_opens_to_its_seed():
    secret = bytes.fromhex(VECTOR["secret_key"])
    box = bytes.fromhex(VECTOR["box"])
    assert split.open_box(secret, VECTOR["ad"].encode(), box) == bytes.fromhex(VECTOR["seed"])
    assert (split.ENC_LEN, split.BOX_LEN, split.PUBLIC_KEY_LEN, split.SECRET_KEY_LEN) == \
        (VECTOR["enc_len"], VECTOR["box_len"], VECTOR["public_key_len"], len(secret))
    # the vector's public key is the one the secret's layout (ML-KEM seed || X25519 key) derives
    from cryptography.hazmat.primitives.asymmetric.mlkem import MLKEM768PrivateKey

    pub = MLKEM768PrivateKey.from_seed_bytes(secret[:64]).public_key().public_bytes_raw() + \
        X25519PrivateKey.from_private_bytes(secret[64:]).public_key().public_bytes_raw()
    assert hashlib.sha256(pub).hexdigest() == VECTOR["public_key_sha256"]


def test_known_answer_box_refuses_any_changed_byte_ad_or_key():
    secret, box, ad = bytes.fromhex(VECTOR["secret_key"]), bytes.fromhex(VECTOR["box"]), VECTOR["ad"].encode()
    for i in (0, 1087, 1088, 1119, 1120, len(box) - 1):  # ML-KEM part, X25519 part, ciphertext, tag
        bad = bytearray(box)
        bad[i] ^= 1
        with pytest.raises(InvalidContribution):
            split.open_box(secret, ad, bytes(bad))
    with pytest.raises(InvalidContribution):
        split.open_box(secret, ad.replace(b'"h1"', b'"h2"'), box)
    other = split.generate_keys(None).secret_context
    with pytest.raises(InvalidContribution):
        split.open_box(other, ad, box)


def test_round_trip_and_sizes():
    params, keys = _session()
    sha = hashlib.sha256(b"payload").hexdigest()
    seed = os.urandom(32)
    box = split.seal_seed(params, keys.public_context, "h1", sha, seed)
    assert len(box) == split.BOX_LEN == 1168 and split.ENC_LEN == 1120
    assert len(keys.public_context) == 1216 and len(keys.secret_context) == 96
    assert split.open_seed(params, keys.secret_context, "h1", sha, box) == seed
    # encapsulation is randomised: the same seed never gives the same box
    assert split.seal_seed(params, keys.public_context, "h1", sha, seed) != box


def test_changed_associated_datum_is_refused():
    params, keys = _session()
    sha = hashlib.sha256(b"payload").hexdigest()
    box = split.seal_seed(params, keys.public_context, "h1", sha, os.urandom(32))
    other_session, _ = _session("split-hpke-other")
    other_params = params.with_backend_params(frac_bits=[params.backend_params["frac_bits"][0],
                                                         params.backend_params["frac_bits"][1] - 1])
    for p, h, s in ((other_session, "h1", sha), (other_params, "h1", sha), (params, "h2", sha),
                    (params, "h1", hashlib.sha256(b"x").hexdigest())):
        with pytest.raises(InvalidContribution, match=h):
            split.open_seed(p, keys.secret_context, h, s, box)


def test_wrong_key_is_refused():
    params, keys = _session()
    _, other = _session()
    sha = hashlib.sha256(b"payload").hexdigest()
    box = split.seal_seed(params, keys.public_context, "h1", sha, os.urandom(32))
    with pytest.raises(InvalidContribution, match="h1"):
        split.open_seed(params, other.secret_context, "h1", sha, box)


def test_retired_box_and_key_are_refused_naming_the_format():
    params, keys = _session()
    sha = hashlib.sha256(b"payload").hexdigest()
    old = _retired_box(keys.public_context[-32:], b"ad", os.urandom(32))
    assert len(old) == 80
    with pytest.raises(MalformedPayload) as e:
        split.open_seed(params, keys.secret_context, "h1", sha, old)
    msg = str(e.value)
    assert "\n" not in msg and "retired" in msg and "X25519 + HKDF-SHA256 + ChaCha20-Poly1305" in msg
    with pytest.raises(MalformedPayload, match="retired"):
        split.bind_public_context(params, keys.public_context[-32:])


@pytest.mark.e2e
def test_upload_sealed_in_the_retired_box_format_is_refused_at_the_server(consortium):
    # Prepare: a hospital running the old software seals its seed in the retired box and signs that statement
    c = consortium(backend="split", hospitals=("h1", "h2"), min_clients=1).start()
    conn = c.connect_keyholder()
    c.keyholder.keygen(split.split_session_params(c.session_id, Layout(c.dim, c.classes), 1.0,
                                                  Bounds(c.max_norm, 1000, 8)))
    c.keyholder.publish(conn)
    h1 = c.hospital("h1")
    params = h1.fetch_params()
    payload, st = h1.protect(params, c.stats(*c.data("h1")))
    ctx = c.keyholder.public_context(c.session_id)
    old = {k: v for k, v in st.items() if k != "signature"}
    old.update(v=2, box=_retired_box(ctx[-32:], b"ad", os.urandom(32)).hex())
    old = sign_box_statement(h1.party.identity_key(), domains.SPLIT_SEED, old)
    # Execute / Assert: a one-line refusal naming the retired format; the genuine upload is still accepted
    with pytest.raises(SecureAFLError, match="retired X25519 \\+ HKDF-SHA256") as e:
        h1.upload(params, payload, tag=old)
    assert "\n" not in str(e.value)
    h1.upload(params, payload, tag=st)
    assert get_backend(params).name == "split"
    h1.close()
    conn.close()
