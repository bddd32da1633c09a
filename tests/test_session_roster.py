"""A session's roster is the signed definition's ``hospitals``, which may be a subset of the PKI's hospitals.

The consortium's CA may have issued more hospital identities than a session
uses: a spare, or one whose key was stolen and that the operator removed
from ``hospitals`` before signing a new session (threat_model/OPERATIONS.md).
Every party takes the roster from the signed definition, so the session runs
over the subset, and the identity outside it is refused by the server when it
tries to join, with the reason and an audit record. Every party here is a
real process: the server, each hospital's ``client submit``, and the key
holder's ``keygen``, ``publish`` and ``finalize``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from support import Consortium

from secure_afl import pki
from secure_afl.session.signed import load_signed, sign
from secure_afl.analytic import centralised_weights
from secure_afl.exceptions import EXIT_KEYS, DecryptionRefused, UnknownParty
from secure_afl.clients.hospital import protect_contribution
from secure_afl.keyholder import read_model
from secure_afl.signing import build_manifest, sign_upload

pytestmark = [pytest.mark.e2e, pytest.mark.security]

ROSTER = ("h1", "h2", "h3")
SPARE = "h4"


def _cmd(*args) -> list[str]:
    return [sys.executable, "-m", "secure_afl.cli", *map(str, args)]


def _env() -> dict:
    return {**os.environ, "SECURE_AFL_KEY_PASSPHRASE": "test passphrase"}


def _submit(c, name, tmp_path) -> list[str]:
    X, y = c.data(name)
    np.savez(tmp_path / f"{name}.npz", X=X, y=y)
    return _cmd("client", "submit", "--server", c.url, "--session", c.session_id, "--pki", c.pki_dir, "--name", name,
                "--embeddings", tmp_path / f"{name}.npz", "--receipts", tmp_path / "rc", "--no-progress")


def _run(args, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=_env())


def _spare_consortium(consortium, backend, **kw):
    """h1..h3 in the session, h4 issued by the same CA but left out of the signed roster."""
    c = consortium(backend=backend, hospitals=ROSTER, min_clients=2, sign=False, **kw)
    pki.issue(c.pki_dir, "hospital", SPARE)
    sign(c.config, c.pki_dir)
    return c.start()


def _assert_released_over_the_roster(c, tmp_path):
    out = _run(_cmd("keyholder", "finalize", "--pki", c.pki_dir, "--keys", c.root / "keys", "--server", c.url,
                    "--session", c.session_id, "--min-clients", "2", "--out", tmp_path / "model.safetensors"))
    assert out.returncode == 0, out.stderr
    W, meta = read_model(tmp_path / "model.safetensors")
    assert meta.participants == tuple(ROSTER)
    X = np.concatenate([c.data(h)[0] for h in ROSTER])
    y = np.concatenate([c.data(h)[1] for h in ROSTER])
    W_joint = centralised_weights(X, y, c.classes)
    tol = 1e-9 if c.backend == "secagg" else 1e-2  # ckks: the key holder's flooding noise
    assert np.linalg.norm(W - W_joint) / np.linalg.norm(W_joint) <= tol


def _assert_spare_refused(c, tmp_path):
    """The spare's own `client submit` stops before sending anything; its key used directly (as a thief would)
    is refused by the server, with the reason and an audit record."""
    out = _run(_submit(c, SPARE, tmp_path), timeout=60)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == EXIT_KEYS and len(lines) == 1, out.stderr
    assert f"{SPARE!r} is not in the signed roster of session {c.session_id!r}" in lines[0], lines[0]

    thief = c.hospital(SPARE)
    path = "/secagg/request" if c.backend == "secagg" else f"/receipts/{SPARE}"
    with pytest.raises(UnknownParty) as refused:
        thief.conn.request("GET", thief.conn.path(path))
    thief.close()
    assert f"{SPARE!r} is not in the signed roster of session {c.session_id!r}" in str(refused.value)
    log = [json.loads(line) for line in c.audit_path().read_text().splitlines()]
    audited = [r for r in log if r["outcome"] == "refused" and "is not in the signed roster" in json.dumps(r)]
    assert audited and all(r.get("reason") == "unknown_party" for r in audited), audited


def test_secagg_session_over_a_subset_of_the_pki_completes_and_the_spare_is_refused(consortium, tmp_path):
    # Prepare: a spare hospital identity in the PKI, a secagg session over the other three
    c = _spare_consortium(consortium, "secagg", secagg={"stage_timeout_s": 30.0})

    # Execute: the three hospitals of the roster, each its own process, concurrently
    procs = {h: subprocess.Popen(_submit(c, h, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=_env()) for h in ROSTER}
    outs = {h: p.communicate(timeout=240) for h, p in procs.items()}

    # Assert: every hospital of the roster finished, the aggregate is theirs, the spare cannot join
    for h, p in procs.items():
        assert p.returncode == 0, (h, outs[h][1])
    _assert_released_over_the_roster(c, tmp_path)
    _assert_spare_refused(c, tmp_path)


def test_ckks_session_over_a_subset_of_the_pki_completes_and_the_spare_is_refused(consortium, tmp_path):
    # Prepare: the same roster on ckks; the key holder's own commands make and publish the keys
    c = _spare_consortium(consortium, "ckks")
    keyholder = ("--pki", c.pki_dir, "--keys", c.root / "keys")
    for step in (("keygen", *keyholder, "--session", c.session_id),
                 ("publish", *keyholder, "--server", c.url, "--session", c.session_id)):
        out = _run(_cmd("keyholder", *step))
        assert out.returncode == 0, out.stderr

    # Execute: the spare tries first, then the roster uploads
    _assert_spare_refused(c, tmp_path)
    for h in ROSTER:
        out = _run(_submit(c, h, tmp_path))
        assert out.returncode == 0, (h, out.stderr)

    # Assert
    _assert_released_over_the_roster(c, tmp_path)


def test_keyholder_counts_no_upload_of_an_identity_outside_the_roster(tmp_path):
    # Prepare: plain, roster h1..h3 (min_clients 3) and a spare h4 issued by the same CA. The server signs a
    # manifest over genuine signed uploads of h1, h2 and the spare (a server may sign any manifest).
    c = Consortium(tmp_path, backend="plain", hospitals=ROSTER, min_clients=3, sign=False)
    pki.issue(c.pki_dir, "hospital", SPARE)
    sign(c.config, c.pki_dir)
    params = load_signed(c.pki_dir, c.session_id).session_params()
    participants = []
    for h in ("h1", "h2", SPARE):
        party = pki.load_party(c.pki_dir, "hospital", h)
        payload, _ = protect_contribution(party, params, c.stats(*c.data(h)))
        st = sign_upload(party.identity_key(), c.session_id, params.digest(), hashlib.sha256(payload).digest(), h)
        participants.append({**st, "identity_pub": pki.public_key_hex(party.identity_pub())})
    aggregate = b"whatever the server sums"
    manifest = build_manifest(pki.load_party(c.pki_dir, "server", "aggregator").identity_key(), c.session_id,
                              params.digest(), participants, hashlib.sha256(aggregate).digest(), 3)

    # Execute / Assert: the key holder refuses before revealing anything, naming the identity outside the roster
    with pytest.raises(DecryptionRefused) as refused:
        c.keyholder.reveal_and_solve(params, aggregate, manifest, min_clients=3)
    assert SPARE in str(refused.value), str(refused.value)
