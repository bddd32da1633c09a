"""The key holder against a malicious server, end to end: real server processes whose stored state the
test tampers with (as a compromised server would), the key holder's real finalize over HTTPS, and the
hospitals' real submit."""

import hashlib
import sqlite3

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from secure_afl.backends import get_backend
from secure_afl.backends.ckks import bind_public_context, ckks_session_params, generate_keys
from secure_afl.envelope import seal
from secure_afl.exceptions import (
    InsufficientContributors,
    InvalidSignature,
    ParameterMismatch,
    PolicyViolation,
    SanityCheckFailed,
)
from secure_afl.hazmat import ckks as hz
from secure_afl.keyholder.verify import ServerForgery
from secure_afl.keyholder_params import sign_session_params
from secure_afl.packing import Layout
from secure_afl.params import Bounds, SessionParams
from secure_afl.protocol import context_publication
from secure_afl.release_checks import ReleaseLedger
from secure_afl.server.store import Store
from secure_afl.tagging import new_tag, seal_tag, sign_tag


pytestmark = [pytest.mark.e2e, pytest.mark.security]




def _open(c, publish: bool = True):
    c.start()
    params = ckks_session_params(c.session_id, Layout(c.dim, c.classes), 1.0, Bounds(c.max_norm, 1000, 8))
    c.keyholder.keygen(params)
    if publish:
        with c.connect_keyholder() as conn:
            c.keyholder.publish(conn)
    return c.keyholder.params(c.session_id)


def _ledger(c):
    key_id = c.keyholder.params(c.session_id).backend_params["public_context_sha256"]
    ledger = ReleaseLedger(c.keyholder.keys_dir / "releases.sqlite3")
    try:
        return ledger.decryption_count(key_id), ledger.blocked_reason(key_id)
    finally:
        ledger.close()


def _store(c) -> Store:
    return Store(c.root / "server" / c.session_id)


def _finalize(c, min_clients=2):
    with c.connect_keyholder() as conn:
        return c.keyholder.finalize(conn, min_clients=min_clients)


def test_multichunk_forgery_d512_refused_before_decryption_and_key_blocked(consortium):
    """The reviewed attack at d = 512, C = 100 (many chunks, one tag slot group): the server serves, as h2's upload, h1's
    ciphertext plus an encrypted fix-up that makes it look like a 2-sum."""
    # Prepare: two honest uploads
    c = consortium(backend="ckks", hospitals=("h1", "h2"), dim=512, classes=100, min_clients=2)
    params = _open(c)
    for h in c.hospitals:
        cl = c.hospital(h)
        cl.submit(c.stats(*c.data(h, n=30)))
        cl.close()
    # the compromised server builds the forgery with what it holds (the public context, h1's upload)
    store = _store(c)
    rows = {r["hospital"]: r for r in store.uploads()}
    backend = get_backend(params)
    public = c.keyholder.public_context(c.session_id)
    ctx = hz.load_context(public, backend.ckks_, secret=False)
    lay = params.layout
    assert hz.CKKSParameters.from_dict(params.backend_params).n_chunks(lay.length) > 40  # the multi-chunk case
    fix = np.zeros(lay.length)
    fix[Layout(lay.dim, lay.n_classes).slices["contributors"]] = 1.0
    chunks = hz.add_chunks(backend.load_contribution(ctx, store.get_blob(rows["h1"]["payload_sha256"])),
                           backend.load_contribution(ctx, backend.protect(fix, public_context=public)))
    forged = seal(params, "contribution", hz.dump_chunks(chunks, lay.length))
    store.db.execute("UPDATE uploads SET payload_sha256=? WHERE hospital='h2'", (store.put_blob(forged),))
    store.close()

    # Execute / Assert: refused, nothing decrypted, key blocked; the second attempt is refused too
    with pytest.raises(ServerForgery, match="h2 did not sign"):
        _finalize(c)
    decryptions, blocked = _ledger(c)
    assert decryptions == 0 and blocked is not None
    with pytest.raises(PolicyViolation) as second:
        _finalize(c)
    assert second.value.reason == "key_blocked" and _ledger(c)[0] == 0


@pytest.mark.parametrize("swap", ["context", "tag_key", "signed_small_order_tag_key"])
def test_substituted_keys_refused_by_hospital_before_it_encrypts(consortium, swap):
    """The server rewrites the published context or tag key in its database and restarts."""
    # Prepare
    c = consortium(backend="ckks", hospitals=("h1", "h2"), min_clients=2)
    params = _open(c)
    c.kill9()
    store = _store(c)
    evil = params
    if swap == "context":
        mine = generate_keys(params)  # the server's own key pair
        evil = bind_public_context(params, mine.public_context)
        store.set_meta("public_context_sha256", store.put_blob(mine.public_context))
    elif swap == "tag_key":
        evil = params.with_backend_params(tag_public_key=X25519PrivateKey.generate().public_key().public_bytes(
            Encoding.Raw, PublicFormat.Raw).hex())
    else:  # even a key holder that signed a degenerate (small-order) tag key is not followed
        evil = params.with_backend_params(tag_public_key="00" * 32)
        store.set_meta("params_signature", sign_session_params(c.keyholder.party.identity_key(), evil))
    store.set_meta("params", evil.to_dict())
    store.close()
    c.start()
    cl = c.hospital("h1")

    # Execute
    expected = ParameterMismatch if swap == "signed_small_order_tag_key" else InvalidSignature
    with pytest.raises(expected):
        cl.submit(c.stats(*c.data("h1")))

    # Assert: nothing was encrypted for, or uploaded to, the substituted keys
    assert cl.bytes_uploaded == 0 and cl.conn.status()["counts"]["uploaded"] == 0
    cl.close()


def test_forwarded_single_ciphertext_refused_before_decryption(consortium):
    # Prepare: the server releases after ONE upload (its own min_clients = 1)
    c = consortium(backend="ckks", hospitals=("h1", "h2"), min_clients=1)
    _open(c)
    cl = c.hospital("h1")
    cl.submit(c.stats(*c.data("h1")))
    cl.close()

    # Execute / Assert: the key holder counts verified signed uploads before it decrypts
    with pytest.raises(InsufficientContributors):
        _finalize(c, min_clients=2)
    assert _ledger(c)[0] == 0


def test_failed_check_after_decryption_blocks_the_key(consortium):
    """A malicious hospital uploads counts that do not sum to n: found only after decryption, so the
    key is blocked and a second finalize is refused (no second decryption)."""
    # Prepare
    c = consortium(backend="ckks", hospitals=("h1", "h2"), min_clients=2)
    _open(c)
    good = c.hospital("h1")
    good.submit(c.stats(*c.data("h1")))
    good.close()
    bad = c.hospital("h2")
    params = bad.fetch_params()
    ctx = bad.conn.request("GET", bad.conn.path("/context"), signed=False).content
    tag = new_tag(params)
    v = bad.protect_vector(params, c.stats(*c.data("h2")), tag=tag)
    v[params.layout.slices["counts"]] = 0.0
    payload = get_backend(params).protect(v, public_context=ctx)
    bad.upload(params, payload, tag=sign_tag(bad.party.identity_key(), params, "h2",
                                             hashlib.sha256(payload).hexdigest(), seal_tag(params, "h2", tag)))
    bad.close()

    # Execute / Assert
    with pytest.raises(SanityCheckFailed):
        _finalize(c)
    decryptions, blocked = _ledger(c)
    assert decryptions == 1 and "after decryption" in blocked
    with pytest.raises(PolicyViolation) as second:
        _finalize(c)
    assert second.value.reason == "key_blocked" and _ledger(c)[0] == 1


def test_server_refuses_degenerate_tag_key_and_unsigned_parameters_at_publish(consortium):
    # Prepare
    c = consortium(backend="ckks", hospitals=("h1", "h2"), min_clients=2)
    params = _open(c, publish=False)
    public = c.keyholder.public_context(c.session_id)
    key = c.keyholder.party.identity_key()
    zero = params.with_backend_params(tag_public_key="00" * 32)
    other = SessionParams.from_dict({**params.to_dict(), "gamma": 2.0})

    # Execute / Assert: a small-order tag key (even signed), and parameters the server does not run
    with c.connect_keyholder() as conn:
        for tag_key, signed in (("00" * 32, zero), (params.backend_params["tag_public_key"], other)):
            with pytest.raises((ParameterMismatch, InvalidSignature)):
                conn.request("POST", conn.path("/context"),
                             body=context_publication(public, tag_key, sign_session_params(key, signed)))
        assert conn.info()["status"] == "awaiting_context"
        c.keyholder.publish(conn)  # the genuine publication opens the session
        assert conn.info()["status"] == "open"
    with sqlite3.connect(c.root / "server" / c.session_id / "state.sqlite3") as db:
        assert db.execute("SELECT COUNT(*) FROM uploads").fetchone()[0] == 0


def test_signed_malformed_upload_names_its_hospital_before_decryption(consortium):
    """A hospital colluding with the server swaps its stored upload for bytes that are not a valid
    ciphertext and signs them: the key holder refuses before decrypting and names that hospital."""
    # Prepare
    from secure_afl import pki
    from secure_afl.keyholder.verify import ContributionRejected
    from secure_afl.signing import sign_upload

    c = consortium(backend="ckks", hospitals=("h1", "h2", "h3"), min_clients=2)
    params = _open(c)
    for h in c.hospitals:
        cl = c.hospital(h)
        cl.submit(c.stats(*c.data(h)))
        cl.close()
    store = _store(c)
    good = store.get_blob({r["hospital"]: r for r in store.uploads()}["h2"]["payload_sha256"])
    broken = good[:-64] + bytes(64)  # framing intact, last ciphertext damaged
    sha = store.put_blob(broken)
    h2 = pki.load_party(c.pki_dir, "hospital", "h2")
    statement = sign_upload(h2.identity_key(), c.session_id, params.digest(), bytes.fromhex(sha), "h2")
    store.db.execute("UPDATE uploads SET payload_sha256=?, statement=? WHERE hospital='h2'",
                     (sha, __import__("json").dumps(statement)))
    store.close()

    # Execute / Assert
    with pytest.raises(ContributionRejected) as refused:
        _finalize(c)
    assert refused.value.hospital == "h2" and _ledger(c)[0] == 0


def test_keyholder_never_decrypts_a_server_formed_ckks_aggregate(consortium):
    c = consortium(backend="ckks", hospitals=("h1", "h2"), min_clients=2)
    params = ckks_session_params(c.session_id, Layout(c.dim, c.classes), 1.0, Bounds(c.max_norm, 1000, 8))
    c.keyholder.keygen(params)
    # Execute / Assert: the library entry point for server aggregates refuses ckks outright
    from secure_afl.exceptions import DecryptionRefused

    with pytest.raises(DecryptionRefused, match="never decrypted"):
        c.keyholder.reveal_and_solve(c.keyholder.params(c.session_id), b"", {}, min_clients=2)
