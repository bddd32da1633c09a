"""secagg threshold, neighbourhood and min_clients chosen together; a session that cannot run is one line."""

from __future__ import annotations

import json

import pytest
from service_helpers import Consortium

from secure_afl.cli import main


@pytest.mark.parametrize("secagg, min_clients, expect", [
    ({"threshold": 5}, 2, "threshold=5 exceeds n_parties=3"),
    ({"threshold": 3}, 2, "min_clients=2 with threshold=3"),
])
def test_server_run_explains_an_impossible_secagg_session_in_one_line(tmp_path, capsys, secagg, min_clients, expect):
    # Prepare: 3 hospitals (complete graph, 3 share holders each)
    c = Consortium(tmp_path, backend="secagg", hospitals=("h1", "h2", "h3"), min_clients=min_clients, secagg=secagg)

    # Execute
    rc = main(["server", "run", "--config", str(c.config)])

    # Assert
    err = capsys.readouterr().err
    assert rc == 2 and expect in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.e2e
def test_demo_with_60_hospitals_on_the_secagg_plus_graph(tmp_path, capsys):
    # Execute: degree 2 ceil(1.5 log2 60) = 18, so 19 share holders per hospital and the default t = 10
    rc = main(["demo", "--backend", "secagg", "--hospitals", "60", "--report", str(tmp_path / "r.json")])

    # Assert
    report = json.loads((tmp_path / "r.json").read_text())
    assert rc == 0 and "PASSED" in capsys.readouterr().out
    assert report["hospitals"] == 60 and report["verification"]["weights_rel_error_vs_plaintext"] <= 1e-9
