"""secagg threshold, neighbourhood and min_clients chosen together; a session that cannot run is one line."""

from __future__ import annotations

import json

import pytest
from support import Consortium

from secure_afl.cli import main
from secure_afl.server import aggregator, intake, secagg_round


@pytest.mark.parametrize("secagg, min_clients, expect", [
    ({"threshold": 5}, 2, "threshold=5 exceeds n_parties=3"),
    ({"threshold": 3}, 2, "min_clients=2 with threshold=3"),
])
def test_server_run_explains_an_impossible_secagg_session_in_one_line(tmp_path, capsys, secagg, min_clients, expect):
    # Prepare: 3 hospitals (complete graph, 3 share holders each)
    c = Consortium(tmp_path, backend="secagg", hospitals=("h1", "h2", "h3"), min_clients=min_clients, secagg=secagg,
                   sign=False)

    # Execute: the operator cannot sign it, and the server cannot run it
    for argv in (["session", "sign", str(c.config), "--pki", str(c.pki_dir)],
                 ["server", "run", "--config", str(c.config), "--allow-ca-key"]):
        rc = main(argv)

        # Assert
        err = capsys.readouterr().err
        assert rc == 3 and expect in err and "Traceback" not in err, argv  # 3: bad input
        assert len(err.strip().splitlines()) == 1
    assert not (c.pki_dir / "sessions").exists()


@pytest.mark.slow
@pytest.mark.e2e
def test_demo_with_60_hospitals_on_the_secagg_plus_graph(tmp_path, capsys):
    # Execute: degree 2 ceil(1.5 log2 60) = 18, so 19 share holders per hospital and the default t = 10
    rc = main(["demo", "--backend", "secagg", "--hospitals", "60", "--report", str(tmp_path / "r.json")])

    # Assert
    report = json.loads((tmp_path / "r.json").read_text())
    assert rc == 0 and "W: within certified bound" in capsys.readouterr().out
    assert report["hospitals"] == 60 and report["verification"]["weights_rel_error_vs_plaintext"] <= 1e-9


def test_stage_clock_starts_with_the_first_hospital_not_with_the_server(tmp_path):
    import time

    from secure_afl.server.aggregator import open_server
    from secure_afl.server.config import load_config

    # Prepare: a secagg server that sits idle far longer than its stage timeout before anyone comes
    c = Consortium(tmp_path, backend="secagg", hospitals=("h1", "h2", "h3"), min_clients=2,
                   secagg={"threshold": 2, "stage_timeout_s": 30.0})
    srv = open_server(load_config(c.config))
    try:
        later = time.time() + 3600
        # Execute: the clock ticks an hour on; then h1 arrives and waits for the others
        secagg_round.tick(srv, now=later)
        first = secagg_round.secagg_request(srv, "h1")
        secagg_round.tick(srv, now=time.time() + 1)
        # Assert: nothing closed while nobody was there; h1 gets its setup request
        assert first["stage"] == "setup" and "request" in first
        assert secagg_round.round_stage(srv) == "setup"
        log = [json.loads(line) for line in c.audit_path().read_text().splitlines()]
        assert [r["actor"] for r in log if r["event"] == "secagg_round_opened"] == ["h1"]
        assert not [r for r in log if r["event"] == "secagg_stage_closed"]
    finally:
        aggregator.shutdown(srv)


def test_abort_counts_the_hospitals_that_really_answered(tmp_path):
    import base64
    import time

    from secure_afl import pki
    from secure_afl.secagg import SecAggClient, decode_message
    from secure_afl.server.aggregator import open_server
    from secure_afl.server.config import load_config

    # Prepare: 3 hospitals, t = 2; only h1 acknowledges setup before the stage times out
    c = Consortium(tmp_path, backend="secagg", hospitals=("h1", "h2", "h3"), min_clients=2,
                   secagg={"threshold": 2, "stage_timeout_s": 30.0})
    srv = open_server(load_config(c.config))
    try:
        keys = {i: pki.load_party(c.pki_dir, "hospital", h).identity_pub() for h, i in srv.secagg.client_ids.items()}
        h1 = SecAggClient(srv.params, 1, pki.load_party(c.pki_dir, "hospital", "h1").identity_key(), keys)
        req = decode_message(base64.b64decode(secagg_round.secagg_request(srv, "h1")["request"]))
        secagg_round.secagg_message(srv, "h1", "setup", h1.handle(req).to_bytes())
        # Execute
        secagg_round.tick(srv, now=time.time() + 60)
        # Assert: the abort names the one hospital that answered, as the audit log does
        log = [json.loads(line) for line in c.audit_path().read_text().splitlines()]
        answered = [r["actor"] for r in log if r["event"] == "secagg_setup" and r["outcome"] == "accepted"]
        closed = [r for r in log if r["event"] == "secagg_stage_closed"]
        assert answered == ["h1"] and secagg_round.round_stage(srv) == "aborted"
        assert closed[-1]["details"]["dropped"] == ["h2", "h3"]
        assert "only 1 hospitals acknowledged setup" in closed[-1]["details"]["message"]
    finally:
        aggregator.shutdown(srv)


def test_masked_input_stage_does_not_close_under_an_upload_being_added(tmp_path, monkeypatch):
    import base64
    import hashlib
    import threading
    import time

    from secure_afl import pki
    from secure_afl.clients.hospital import protect_vector
    from secure_afl.secagg import SecAggClient, Stage, decode_message
    from secure_afl.server.aggregator import open_server
    from secure_afl.server.config import load_config
    from secure_afl.signing import sign_upload

    # Prepare: three hospitals through setup, advertise and share keys, in-process against the real server role
    names = ("h1", "h2", "h3")
    c = Consortium(tmp_path, backend="secagg", hospitals=names, min_clients=2,
                   secagg={"threshold": 2, "stage_timeout_s": 30.0})
    srv = open_server(load_config(c.config))
    try:
        parties = {h: pki.load_party(c.pki_dir, "hospital", h) for h in names}
        keys = {srv.secagg.client_ids[h]: parties[h].identity_pub() for h in names}
        cl = {h: SecAggClient(srv.params, srv.secagg.client_ids[h], parties[h].identity_key(), keys) for h in names}

        def request(h):
            return decode_message(base64.b64decode(secagg_round.secagg_request(srv, h)["request"]))

        for stage in (Stage.SETUP, Stage.ADVERTISE_KEYS, Stage.SHARE_KEYS):
            for h in names:
                secagg_round.secagg_message(srv, h, stage, cl[h].handle(request(h)).to_bytes())
            secagg_round.tick(srv)  # everyone answered: the stage closes now
        assert secagg_round.round_stage(srv) == Stage.MASKED_INPUT

        def upload(h):
            vec = protect_vector(srv.params, c.stats(*c.data(h)))
            payload = cl[h].handle(request(h), vector=vec).to_bytes()
            st = sign_upload(parties[h].identity_key(), c.session_id, srv.params.digest(),
                             hashlib.sha256(payload).digest(), h)
            return intake.submit(srv, h, st, payload)

        upload("h1")
        upload("h2")
        real, entered, go = secagg_round.combine_upload, threading.Event(), threading.Event()

        def held(session, hospital, payload):
            entered.set()
            assert go.wait(60)
            return real(session, hospital, payload)

        monkeypatch.setattr(secagg_round, "combine_upload", held)
        t = threading.Thread(target=upload, args=("h3",))
        t.start()
        assert entered.wait(60)

        # Execute: the stage clock runs past the deadline while h3's masked input is being added
        secagg_round.tick(srv, now=time.time() + 120)
        stage_meanwhile = secagg_round.round_stage(srv)
        go.set()
        t.join(60)
        secagg_round.tick(srv)

        # Assert: the stage waited for h3, and closed with all three masked inputs
        assert stage_meanwhile == Stage.MASKED_INPUT
        assert secagg_round.round_stage(srv) == Stage.UNMASK and sorted(srv.secagg.round.survivors_) == [1, 2, 3]
    finally:
        aggregator.shutdown(srv)


def test_the_default_threshold_at_each_min_clients_is_privacy_first_and_a_shortfall_is_a_warning(tmp_path, capsys):
    """Six hospitals. The other backends' default isolates one hospital with 4 colluders at min_clients 3 and 5
    at 4 and 5. secagg's default threshold reaches 4 at min_clients 3 (t = 4, every hospital needed); at 4 and
    5 the quorum caps t at n - min_clients + 1, so the default is that cap, and sign says, as a warning, that
    this secagg session isolates with fewer colluders and that no threshold reaches the others' number."""
    from secure_afl.session.signed import load_signed

    hospitals = tuple(f"h{i}" for i in range(1, 7))
    thresholds, errs = {}, {}
    for mc in (3, 4, 5):
        # Execute
        c = Consortium(tmp_path / f"mc{mc}", backend="secagg", hospitals=hospitals, min_clients=mc, sign=False)
        rc = main(["session", "sign", str(c.config), "--pki", str(c.pki_dir)])
        out = capsys.readouterr()
        assert rc == 0, out.err
        thresholds[mc] = load_signed(c.pki_dir, c.session_id).session_params().backend_params["threshold"]
        errs[mc] = out.err
    # Assert: the largest isolation each quorum allows, and the shortfall said once, on stderr, where there is one
    assert thresholds == {3: 4, 4: 3, 5: 2}
    assert "fewer than the" not in errs[3] and "0 of 6 hospitals may drop out" in errs[3]
    for mc, others in ((4, 5), (5, 5)):
        warned = [line for line in errs[mc].splitlines() if "fewer than the" in line]
        assert len(warned) == 1 and warned[0].startswith("secure-afl session sign: warning: isolating"), errs[mc]
        assert f"takes the server and {thresholds[mc]} colluding" in warned[0]
        assert f"fewer than the {others} a plain, ckks, bfv or split session" in warned[0]
        assert f"allows t <= {7 - mc}" in warned[0] and "split reaches it" in warned[0]
