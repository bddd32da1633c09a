"""A ServerApp that runs the SecAgg round of a session twice, the second time without the victim.

The real ServerApp round loop (``server_app._secagg_round``) drives the real
ClientApp handlers (``client_app.secagg`` / ``client_app.receipt``) with real
Flower ``Message`` objects; the grid (``support.flower.InProcessGrid``) only carries them within this
process, each hospital with its own node context, as a SuperNode would hand
them to its ClientApp. The ServerApp is malicious in one respect: after a
completed round it starts the session again, with a second native server of
the same signed session, and asks every hospital but the victim. Two unmasked
sums over survivor sets that differ by the victim would give its statistics.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.supercore.task_identity import TaskIdentity
from support import Consortium
from support.flower import InProcessGrid, node_contexts

from secure_afl.exceptions import InsufficientShares
from secure_afl.flower import server_app
from secure_afl.hazmat import fixedpoint
from secure_afl.server import aggregator
from secure_afl.server.aggregator import open_server
from secure_afl.server.config import load_config

pytestmark = pytest.mark.security

HOSPITALS = ("h1", "h2", "h3", "h4")


def _contexts(c: Consortium, run_id: int, data: dict):
    return node_contexts(c, run_id, data, HOSPITALS)


def _consortium(tmp_path) -> tuple[Consortium, dict]:
    """4 secagg hospitals (t = 2, quorum 3), each one's embeddings in the file its node config names."""
    c = Consortium(tmp_path, backend="secagg", hospitals=HOSPITALS, min_clients=2,
                   secagg={"threshold": 2, "stage_timeout_s": 3.0})
    data = {}
    for h in HOSPITALS:
        X, y = c.data(h, n=12)
        data[h] = c.root / f"{h}.npz"
        np.savez(data[h], X=X, y=y)
    return c, data


def _server(c: Consortium, data_dir: str):
    cfg = load_config(c.config)
    cfg.data_dir = c.root / data_dir
    return open_server(cfg)


def test_serverapp_rerunning_setup_without_the_victim_gets_no_second_sum(tmp_path):
    # Prepare: 4 hospitals, t = 2, quorum 3, every one's data on disk; one complete round
    c, data = _consortium(tmp_path)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 0, 0
    nodes = {h: i + 1 for i, h in enumerate(HOSPITALS)}
    first = _server(c, "server-1")
    try:
        server_app._secagg_round(InProcessGrid(_contexts(c, 7, data)), first, nodes, reply_timeout_s=30)
        sum_all = first.secagg.round.fixed_point_sum_
    finally:
        aggregator.shutdown(first)

    # Execute: a second run of the same session, h1 left out
    second = _server(c, "server-2")
    grid = InProcessGrid(_contexts(c, 8, data))
    try:
        with pytest.raises(InsufficientShares):
            server_app._secagg_round(grid, second, {h: n for h, n in nodes.items() if h != "h1"},
                                     reply_timeout_s=30)
        sum_rest = getattr(second.secagg.round, "fixed_point_sum_", None)
    finally:
        aggregator.shutdown(second)

    # Assert: the first round was complete; the second produced no sum to subtract it from
    assert sum_all is not None
    victim = c.stats(*np.load(data["h1"]).values())
    from secure_afl.clients.hospital import protect_vector

    params = c.hospital("h1").definition.session_params()
    h1 = fixedpoint.encode(protect_vector(params, victim), params.backend_params["frac_bits"])
    assert sum_rest is None or not np.array_equal(sum_all - sum_rest, h1)
    assert sum_rest is None
    # and every hospital refused at the setup already: it answered no stage of the second run
    assert grid.answered == [], grid.answered


def test_a_hospital_that_signed_over_flower_takes_no_part_natively_in_the_same_session(tmp_path):
    # Prepare: no record directory named anywhere: the Flower node and `client submit` both keep it in the
    # hospital's own PKI directory
    from secure_afl import pki
    from secure_afl.clients.hospital import HospitalClient
    from secure_afl.clients.secagg_client import SecAggParticipant
    from secure_afl.exceptions import InvalidContribution

    c, data = _consortium(tmp_path)
    contexts = _contexts(c, 9, data)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 9, 0, 0
    server = _server(c, "server-1")
    try:
        server_app._secagg_round(InProcessGrid(contexts), server, {h: i + 1 for i, h in enumerate(HOSPITALS)},
                                 reply_timeout_s=30)
        assert server.secagg.round.fixed_point_sum_ is not None
    finally:
        aggregator.shutdown(server)

    # Execute: h2 restarted as the native client of the same signed session
    site = HospitalClient("https://127.0.0.1:9", c.session_id, pki.load_party(c.pki_dir, "hospital", "h2"))
    site.conn.close()
    # Assert: it takes no part, naming the record
    with pytest.raises(InvalidContribution, match="signed a survivor set"):
        SecAggParticipant(site, site.definition.session_params(), c.stats(*np.load(data["h2"]).values()))
