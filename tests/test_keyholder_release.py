"""The key holder's release object: what it is bound to, and the order in which a release may touch anything.

:class:`secure_afl.keyholder.release.SessionRelease` holds the signed release policy, the trust set (the pinned
server identity, the roster's enrolled hospital keys) and the opened key of one release. These tests read it
after a real keygen in a small consortium, and drive the real release paths with a manifest below the signed
quorum (as a server choosing the cohort would sign it): each must refuse before its ledger records anything
and before any seed or ciphertext is opened.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from secure_afl import pki
from secure_afl.cohort import release_policy
from secure_afl.exceptions import DecryptionRefused, InsufficientContributors
from secure_afl.release_checks import ReleaseLedger
from secure_afl.session.signed import load_signed
from secure_afl.server import aggregator, closing

ROSTER = ["h0", "h1", "h2", "h3"]
SPARE = "h9"  # issued by the CA, not on the session's roster


def _raw(public_key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _ckks_session(tmp_path, *, signed: bool = True):
    """A ckks session of ROSTER (min_clients 3) whose key holder made its keys; SPARE is enrolled too. Returns
    (key holder, parameters, server party, hospital parties, passphrase)."""
    from secure_afl.backends.ckks import ckks_session_params
    from secure_afl.keyholder import KeyHolder
    from secure_afl.packing import Layout
    from secure_afl.params import Bounds
    from secure_afl_tools.harness import make_pki, sign_session

    server, parties = make_pki(tmp_path / "pki", [*ROSTER, SPARE], name="release object")
    if signed:
        sign_session(tmp_path / "pki", {"session": {"id": "rel", "backend": "ckks", "dim": 4, "classes": 2,
                                                    "min_clients": 3, "hospitals": ROSTER},
                                        "bounds": {"max_norm": 2.0, "n_max": 100, "k_max": 8}})
    passphrase = b"release object test passphrase"
    kh = KeyHolder(tmp_path / "pki", "keyholder", tmp_path / "keys", passphrase=passphrase)
    kh.keygen(ckks_session_params("rel", Layout(4, 2), 1.0, Bounds(2.0, 100, 8)))
    return kh, kh.params("rel"), server, parties, passphrase


def _relay_of(kh, params, server, parties, hospitals):
    """A server that signs a manifest of ``hospitals``' genuine signed uploads (and serves them and their tags)."""
    from secure_afl.backends.ckks import CKKSBackend
    from secure_afl_tools.attack_parties import MaliciousServer, signed_participant, tagged_upload

    be, rng = CKKSBackend(params), np.random.default_rng(0)
    ups = {h: tagged_upload(parties[h], params, be, kh.public_context(params.session_id),
                            rng.uniform(0, 0.1, params.layout.length)) for h in hospitals}
    return MaliciousServer(server, params, [signed_participant(parties[h], params, ups[h][0]) for h in ups],
                           {h: u[0] for h, u in ups.items()}, {h: u[1] for h, u in ups.items()}, min_clients=1)


def _ledger_state(kh, key_id: str) -> tuple[int, str | None, list]:
    """(decryptions or shares recorded under ``key_id``, why it is blocked, the privacy ledger's releases)."""
    from secure_afl.dp.ledger import PrivacyLedger

    ledger = ReleaseLedger(kh.keys_dir / "releases.sqlite3")
    try:
        count, blocked = ledger.decryption_count(key_id), ledger.blocked_reason(key_id)
    finally:
        ledger.close()
    with PrivacyLedger(kh.keys_dir / "privacy.sqlite3") as pl:
        return count, blocked, pl.releases()


def test_the_release_holds_the_signed_policy_the_roster_s_keys_the_pinned_server_and_the_opened_keys(tmp_path):
    kh, params, server, parties, _ = _ckks_session(tmp_path)

    rel = kh.open_release("rel", min_clients=1)

    # the policy is the operator's signed one (roster, quorum), not a floor the caller passed
    signed = release_policy(load_signed(kh.pki_dir, "rel"), min_clients=1)
    assert rel.policy == signed and list(rel.policy.roster) == ROSTER and rel.policy.quorum > 1
    # the trust set: the roster's enrolled keys only (a CA-issued spare counts for nothing) and the pinned server
    assert sorted(rel.enrolled) == ROSTER
    assert all(_raw(rel.enrolled[h]) == _raw(parties[h].identity_pub()) for h in ROSTER)
    assert _raw(rel.server_identity) == _raw(server.identity_pub())
    # the keygen record and the keys it opened: the same ones custody opens
    assert rel.params.digest() == params.digest()
    assert rel.secret == kh.secret_context("rel") and rel.tag_key == kh.tag_secret("rel")
    assert _raw(rel.identity_key.public_key()) == _raw(pki.pinned_identity(kh.pki_dir, "keyholder"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        rel.policy = dataclasses.replace(signed, quorum=1)

    # the caller may narrow the trust set, never widen it past the roster; a step that needs no key opens none
    narrowed = kh.open_release("rel", min_clients=1, expected_hospitals=["h0", "h1", SPARE], unseal=False)
    assert sorted(narrowed.enrolled) == ["h0", "h1"]
    assert narrowed.secret is None and narrowed.tag_key is None


def test_a_he_manifest_below_the_quorum_is_refused_before_the_ledger_records_a_decryption(tmp_path):
    # Prepare: the server signs a manifest of 3 genuine uploads where the signed quorum needs all 4
    kh, params, server, parties, _ = _ckks_session(tmp_path)
    quorum = release_policy(load_signed(kh.pki_dir, "rel")).quorum
    relay = _relay_of(kh, params, server, parties, ROSTER[:quorum - 1])
    from secure_afl.keyholder.release import HTTPSource

    # Execute: the real ckks release path, with the caller's own floor at 1
    with pytest.raises(InsufficientContributors):
        kh.release_he("rel", HTTPSource(relay), min_clients=1)

    # Assert: no decryption recorded (so none made), the key not blocked, nothing in the privacy ledger
    assert _ledger_state(kh, params.backend_params["public_context_sha256"]) == (0, None, [])


def test_a_split_manifest_below_the_quorum_opens_no_seed_and_records_no_share(tmp_path):
    # Prepare: a split session of 6 (min_clients 3, so q = 5); the server signs a manifest of 3 of the uploads
    from secure_afl import split
    from secure_afl_tools.attack_parties import ForgingSplitSource, subset_manifest
    from secure_afl_tools.attacks import split_service

    names = tuple(f"h{i}" for i in range(6))
    srv, kh, pki_dir, _ = split_service(tmp_path, hospitals=names, min_clients=3)
    queried = []

    class Recording(ForgingSplitSource):
        """The server's answers as they are; the query seeds it is asked for kept (each one comes from an
        opened seed box)."""

        def split_queries(self, queries):
            queried.append(dict(queries))
            return super().split_queries(queries)

    try:
        sid = srv.config.session_id
        assert release_policy(load_signed(pki_dir, sid)).quorum > 3
        small = subset_manifest(closing.released(srv)[1], names[:3], srv.key)

        # Execute: the real split release path, with the caller's own floor at 1
        with pytest.raises(InsufficientContributors):
            kh.release_split(sid, Recording(srv, srv.key, manifest=small), min_clients=1)
    finally:
        aggregator.shutdown(srv)

    # Assert: no seed box opened (no verdict formed, no query seed sent), no share recorded, the key not blocked
    assert not (kh.keys_dir / f"{sid}.split-verdicts.json").exists() and queried == []
    assert _ledger_state(kh, kh.params(sid).backend_params[split.PUBLIC_CONTEXT_KEY]) == (0, None, [])


def test_without_the_signed_definition_the_sealed_key_is_never_opened(tmp_path):
    # Prepare: keys made, no signed definition in the PKI, and a key holder holding the wrong passphrase: were
    # the key opened first, the refusal would be the passphrase's
    from secure_afl.keyholder import KeyHolder
    from secure_afl.keyholder.release import HTTPSource

    kh, params, server, parties, passphrase = _ckks_session(tmp_path, signed=False)
    wrong = KeyHolder(kh.pki_dir, "keyholder", kh.keys_dir, passphrase=passphrase[::-1])
    relay = _relay_of(kh, params, server, parties, ROSTER)

    # Execute / Assert: refused naming the missing definition; nothing recorded
    with pytest.raises(DecryptionRefused, match="signed definition"):
        wrong.release_he("rel", HTTPSource(relay), min_clients=1)
    assert _ledger_state(kh, params.backend_params["public_context_sha256"]) == (0, None, [])
