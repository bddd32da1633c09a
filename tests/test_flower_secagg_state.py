"""A hospital's SecAgg state carried between Flower messages (secure_afl.flower.secagg_state): a round whose
clients live only in sealed files between stages must end exactly like the in-memory protocol, and the
file must be private, bound to its run, and useless without the key the SuperNode keeps."""

from __future__ import annotations

import stat

import numpy as np
import pytest

from secure_afl.exceptions import StageError
from secure_afl.flower.secagg_state import SealedState, export_client, restore_client
from secure_afl.hazmat import fixedpoint
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.secagg import MaskedInput, SecAggClient, SecAggServerRound, decode_message, identities
from secure_afl.secagg import secagg_session_params

LAYOUT = Layout(3, 2)


def _params(n=4, threshold=2):
    return secagg_session_params("carried", LAYOUT, 1.0, Bounds(1.0, 100, 8), n_parties=n, threshold=threshold,
                                 min_clients=2)


class CarriedHospital:
    """A hospital whose SecAggClient exists only while it answers one message, as under a SuperNode."""

    def __init__(self, root, params, u, priv, pub, run_id=7):
        self.priv, self.pub = priv, pub
        self.sealed = SealedState(root / f"h{u}", params.session_id, f"h{u}", run_id)
        self.key = SealedState.new_key()
        self.sealed.save(self.key, export_client(SecAggClient(params, u, priv, pub)))

    def __call__(self, fn):
        client = restore_client(self.sealed.load(self.key), self.priv, self.pub)
        try:
            return fn(client)
        finally:
            self.sealed.save(self.key, export_client(client))


def test_a_round_of_carried_clients_with_a_dropout_is_exact(tmp_path):
    # Prepare: 4 hospitals, threshold 2; hospital 4 goes silent after sharing its keys
    params = _params()
    priv, pub = identities(4)
    hosp = {u: CarriedHospital(tmp_path, params, u, priv[u], pub) for u in pub}
    server = SecAggServerRound(params, participants=list(pub), identity_keys=pub)
    rng = np.random.default_rng(3)
    vectors = {u: rng.uniform(-1, 1, LAYOUT.length) for u in pub}

    def stage(answer, skip=()):
        for u in sorted(server.active):
            if u not in skip:
                req = server.request(u)
                server.receive(decode_message(hosp[u](lambda c: answer(c, req)).to_bytes()))
        server.close_stage()

    # Execute: every stage, with each client sealed away and restored in between
    stage(lambda c, r: c.handle(r))
    stage(lambda c, r: c.handle(r))
    stage(lambda c, r: c.handle(r))
    for u in sorted(server.active):
        req = server.request(u)
        if u != 4:
            server.receive(MaskedInput.from_bytes(hosp[u](lambda c: c.handle(req, vector=vectors[u])).to_bytes()))
    server.close_stage()
    for u in sorted(server.active):
        server.receive(decode_message(hosp[u](lambda c: c.sign_survivors(server.survivors_)).to_bytes()))
    stage(lambda c, r: c.handle(r))
    # Assert: the survivors' fixed-point sum, bit for bit
    assert server.survivors_ == (1, 2, 3)
    expected = sum(fixedpoint.encode(vectors[u], params.backend_params["frac_bits"]) for u in (1, 2, 3))
    assert np.array_equal(server.fixed_point_sum_, expected)
    assert hosp[1](lambda c: c.stage) == "done"


def test_restored_client_keeps_its_guards(tmp_path):
    """A survivor set signed before the state was sealed binds the restored client: a second set is refused."""
    params = _params()
    priv, pub = identities(4)
    hosp = {u: CarriedHospital(tmp_path, params, u, priv[u], pub) for u in pub}
    server = SecAggServerRound(params, participants=list(pub), identity_keys=pub)
    for _ in range(3):
        for u in sorted(server.active):
            req = server.request(u)
            server.receive(decode_message(hosp[u](lambda c: c.handle(req)).to_bytes()))
        server.close_stage()
    for u in sorted(server.active):
        req = server.request(u)
        server.receive(MaskedInput.from_bytes(
            hosp[u](lambda c: c.handle(req, vector=np.zeros(LAYOUT.length))).to_bytes()))
    server.close_stage()
    hosp[1](lambda c: c.sign_survivors([1, 2, 3, 4]))
    # Execute / Assert
    from secure_afl.exceptions import InvalidContribution

    with pytest.raises(InvalidContribution):
        hosp[1](lambda c: c.sign_survivors([1, 2, 3]))
    assert hosp[1](lambda c: c.stage) == "aborted"


def test_sealed_state_is_private_and_bound_to_its_run(tmp_path):
    params = _params()
    priv, pub = identities(4)
    c = SecAggClient(params, 1, priv[1], pub)
    from secure_afl.secagg import SetupRequest

    c.setup(SetupRequest(params.session_id, 1, params.digest().hex()))
    sealed = SealedState(tmp_path / "state", params.session_id, "h1", run_id=1)
    key = SealedState.new_key()
    # Execute
    sealed.save(key, export_client(c))
    # Assert: 0600 in a 0700 directory, no secret in the clear, and no other key or run opens it
    assert stat.S_IMODE(sealed.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(sealed.dir.stat().st_mode) == 0o700
    assert c._b.hex().encode() not in sealed.path.read_bytes() and c._b not in sealed.path.read_bytes()
    with pytest.raises(StageError):
        sealed.load(SealedState.new_key())
    with pytest.raises(StageError):
        SealedState(tmp_path / "state", params.session_id, "h1", run_id=2).load(key)
    assert restore_client(sealed.load(key), priv[1], pub)._b == c._b


def test_state_it_cannot_carry_is_refused_not_dropped():
    params = _params()
    priv, pub = identities(4)
    c = SecAggClient(params, 1, priv[1], pub)
    c._something_new = object()
    # Execute / Assert
    with pytest.raises(StageError, match="_something_new"):
        export_client(c)
