"""The cohort rule: no server, with the colluders the signed session tolerates, shrinks a release to one hospital.

Every test drives a real party: the operator's ``session sign`` command, a real
server process answering a hospital whose relayed session info is altered in
one field, the key holder's split release against a server role that forges
verifier messages or signs a small manifest, and the secagg hospitals' run loop
against a second server of the same signed session.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from secure_afl.session.signed import load_signed
from secure_afl.cohort import default_colluders, quorum, release_policy
from secure_afl.exceptions import EXIT_INPUT, EXIT_SECURITY, InvalidContribution, ParameterMismatch
from secure_afl.server import aggregator, closing, split_round

pytestmark = pytest.mark.security


# -- the rule ---------------------------------------------------------------------------------------------------
def test_the_quorum_keeps_min_clients_honest_and_two_cohorts_share_an_honest_hospital():
    # Assert, for every roster size, min_clients and colluder bound a session can sign: whatever c colluders
    # do, at least min_clients honest hospitals are in a release, and two releases of one session overlap in
    # at least one honest hospital (2 (q - c) > n - c), so neither can be differenced to one hospital
    for n in range(1, 40):
        for mc in range(1, n + 1):
            for c in range(0, mc):
                q = quorum(n, c, mc)
                if q > n:
                    continue
                assert q - c >= mc and 2 * (q - c) > n - c
            c = default_colluders(n, mc)
            assert 0 <= c < mc and quorum(n, c, mc) <= n
            # privacy before liveness: the default is the largest c the roster can carry, dropouts or not
            assert c == mc - 1 or quorum(n, c + 1, mc) > n


class _Out:
    def __init__(self, rc, captured):
        self.returncode, self.stdout, self.stderr = rc, captured.out, captured.err


def _sign(tmp_path, capsys, extra: dict, hospitals=6, backend="split"):
    from support import write_config
    from secure_afl import pki

    pki_dir = tmp_path / "pki"
    pki.init_ca(pki_dir)
    names = [f"h{i}" for i in range(1, hospitals + 1)]
    for h in names:
        pki.issue(pki_dir, "hospital", h)
    cfg = tmp_path / "session.toml"
    write_config(cfg, {"session": {"id": "s-cohort", "backend": backend, "dim": 4, "classes": 2,
                                   "min_clients": 3, "hospitals": names, **extra},
                       "bounds": {"max_norm": 1.0, "n_max": 100, "k_max": 8}})
    from secure_afl.cli import main

    capsys.readouterr()
    rc = main(["session", "sign", str(cfg), "--pki", str(pki_dir)])
    return _Out(rc, capsys.readouterr()), pki_dir


def test_session_sign_prints_the_dropout_tolerance_of_the_signed_colluder_bound(tmp_path, capsys):
    # Execute: the operator signs a split session of 6 hospitals, min_clients 3, the default colluder bound
    out, pki_dir = _sign(tmp_path, capsys, {})
    # Assert: c and q are the signed ones, and the line says how many may be missing
    assert out.returncode == 0, out.stderr
    d = load_signed(pki_dir, "s-cohort")
    p = release_policy(d)
    assert d["colluders"] == p.colluders and d["max_refusals"] == p.colluders
    assert f"{6 - p.quorum} of 6 hospitals may drop out" in out.stdout and f"= {p.quorum} roster" in out.stdout


def test_session_sign_refuses_a_colluder_bound_no_release_can_meet(tmp_path, capsys):
    # Execute: c = 4 with 6 hospitals and min_clients 3 needs q = max(6, 7) = 7 of 6
    out, pki_dir = _sign(tmp_path, capsys, {"colluders": 4})
    # Assert: one line naming the key and the largest c that fits, the input exit status, nothing signed
    assert out.returncode == EXIT_INPUT, out.stdout + out.stderr
    assert "colluders = 4 needs a quorum no release can reach" in out.stderr and "at most 3" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (pki_dir / "sessions" / "s-cohort.json").exists()


def test_session_sign_signs_a_colluder_bound_that_leaves_no_dropout_tolerance_and_says_so(tmp_path, capsys):
    # Execute: c = 3 with 6 hospitals and min_clients 3 needs q = max(5, 6) = 6, everybody
    out, pki_dir = _sign(tmp_path, capsys, {"colluders": 3})
    # Assert: signed, with the warning that no hospital may drop out, and the isolation line of q - 1 = 5
    assert out.returncode == 0, out.stdout + out.stderr
    assert "warning: 0 of 6 hospitals may drop out" in out.stderr
    assert "the server and 5 colluding hospitals" in out.stdout
    assert release_policy(load_signed(pki_dir, "s-cohort")).quorum == 6


def test_a_small_consortium_at_the_defaults_signs_every_hospital_into_the_quorum(tmp_path, capsys):
    # Execute: 4 hospitals at the default min_clients 3, colluders left to the default
    out, pki_dir = _sign(tmp_path, capsys, {}, hospitals=4)
    # Assert: c = 1 (not 0), so q = 4: a server with 2 colluders cannot release over the victim and them
    assert out.returncode == 0, out.stdout + out.stderr
    p = release_policy(load_signed(pki_dir, "s-cohort"))
    assert (p.colluders, p.quorum) == (1, 4)
    assert "the server and 3 colluding hospitals" in out.stdout and "warning: 0 of 4" in out.stderr


# -- a server that lies about one relayed field ------------------------------------------------------------------
_LIES = {
    "backend": lambda i: {**i, "backend": "plain"},
    "min_clients": lambda i: {**i, "min_clients": 1},
    "min_class_count": lambda i: {**i, "min_class_count": 1},
    "hospitals": lambda i: {**i, "hospitals": i["hospitals"][:-1]},
    "max_upload_bytes": lambda i: {**i, "max_upload_bytes": i["max_upload_bytes"] * 2},
    "deadline": lambda i: {**i, "deadline": i["deadline"] + 3600},
    "colluders": lambda i: {**i, "colluders": 0},
    "secagg.client_ids": lambda i: {**i, "secagg": {**i["secagg"], "client_ids": {
        h: (n % len(i["secagg"]["client_ids"])) + 1 for h, n in i["secagg"]["client_ids"].items()}}},
    "secagg.max_rounds": lambda i: {**i, "secagg": {**i["secagg"], "max_rounds": i["secagg"]["max_rounds"] + 5}},
}


@pytest.fixture(scope="module")
def lying_server(tmp_path_factory):
    """A real secagg server process of 4 hospitals with an absolute deadline (every relayed field present)."""
    import datetime as dt

    from support import Consortium

    c = Consortium(tmp_path_factory.mktemp("lie"), backend="secagg", hospitals=("h1", "h2", "h3", "h4"),
                   min_clients=2, secagg={"threshold": 2},
                   extra_session={"deadline": dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)})
    c.start()
    yield c
    c.stop()


@pytest.mark.e2e
@pytest.mark.parametrize("field", sorted(_LIES))
def test_a_hospital_refuses_a_server_that_lies_about_one_field_naming_it(lying_server, field):
    # Prepare: the hospital's connection to the real server; the server's answer altered in one field
    cl = lying_server.hospital("h1")
    genuine = cl.conn.info
    cl.conn.info = lambda: _LIES[field](genuine())
    try:
        # Execute / Assert: refused before anything is sent, the field named
        with pytest.raises(ParameterMismatch, match=field.replace(".", r"\.")):
            cl.fetch_params()
        cl.conn.info = genuine
        assert cl.fetch_params().backend == "secagg"  # the same hospital takes the genuine info
    finally:
        cl.close()


# -- split: a server and min_clients - 1 colluders after one hospital -------------------------------------------
@pytest.fixture(scope="module")
def split_cohort(tmp_path_factory):
    from secure_afl_tools.attacks import run_attack

    return run_attack("split-cohort", verbose=False, work=tmp_path_factory.mktemp("cohort"))


@pytest.fixture(scope="module")
def small_split_cohort(tmp_path_factory):
    from secure_afl_tools.attacks import run_attack

    return run_attack("split-cohort", verbose=False, work=tmp_path_factory.mktemp("cohort4"), roster=4)


def test_at_four_hospitals_a_manifest_of_the_victim_and_two_colluders_gets_no_share(small_split_cohort):
    # Assert: n = 4 at the default min_clients 3 signs c = 1 and q = 4; the victim with min_clients - 1 = 2
    # colluders is refused before any seed is opened, and so are forged refusals of the fourth hospital
    assert small_split_cohort["quorum"] == 4
    assert small_split_cohort["small_manifest"] == "refused" and small_split_cohort["small_manifest_seeds_opened"] == 0
    assert small_split_cohort["forged"] == "refused" and small_split_cohort["outcome"] == "refused"


def test_forged_refusals_past_the_limit_abort_the_release(split_cohort):
    # Assert: 3 honest uploads made to fail the joint check: the key holder releases nothing
    assert split_cohort["forged"] == "refused" and split_cohort["outcome"] == "refused"


def test_a_manifest_of_the_victim_and_its_colluders_gets_no_share(split_cohort):
    # Assert: refused before a single seed was opened (the key's use is recorded before the first opening)
    assert split_cohort["small_manifest"] == "refused" and split_cohort["small_manifest_seeds_opened"] == 0


def test_a_release_needs_q_roster_hospitals_and_leaves_the_victim_hidden(split_cohort):
    # Assert: the smallest cohort the key holder releases is q, and the colluders' view of the victim carries
    # the other honest hospitals' statistics
    assert split_cohort["quorum_release"] == "released" and split_cohort["quorum_residual"] > 1.0


def test_a_forged_refusal_is_attributable_from_the_two_published_verifier_messages(split_cohort):
    # Assert: one forged refusal is within the limit (released over the rest); it is recorded as the joint
    # check's, the two published messages give a failing verdict, and the refused hospital's own upload shows
    # that the server's signed message is false
    a = split_cohort["attributed"]
    assert split_cohort["one_forged"] == "released"
    assert a["recorded_as"].startswith("failed the joint check") and a["verdict_from_messages"] is not None
    assert a["at_fault"] == "server"


def test_the_collector_refuses_a_share_over_fewer_than_q(tmp_path):
    # Prepare: a split session of 6 (min_clients 3, c = 2, q = 5), every upload in; the key holder's share
    # statement names 2 refusals (within the limit) so that 4 remain
    from secure_afl import split
    from secure_afl.exceptions import InsufficientContributors
    from secure_afl_tools.attacks import split_service

    srv, kh, pki_dir, _ = split_service(tmp_path, hospitals=tuple(f"h{i}" for i in range(6)), min_clients=3)
    try:
        params = kh.params(srv.config.session_id)
        manifest = closing.released(srv)[1]
        share = split.field_of(params).zeros(split.main_words(params))
        refused = {"h1": "linear", "h2": "linear"}
        body, st = split.sign_share(kh.party.identity_key(), params, manifest, share, refused)
        # Execute / Assert: the server role applies the signed quorum too, before it commits to any sum
        with pytest.raises(InsufficientContributors, match="quorum"):
            split_round.commit(srv, "keyholder:keyholder", st)
        assert srv.store.get_meta("split_commit") is None
    finally:
        aggregator.shutdown(srv)


# -- secagg: a restarted hospital and a re-run of the same round --------------------------------------------------
@pytest.mark.e2e
def test_a_secagg_rerun_after_a_restart_is_refused_by_every_hospital(tmp_path):
    from secure_afl_tools.attacks import run_attack

    # Execute: round 1 completes over 4 hospitals; a second server of the same signed session runs round 1
    # again, fresh keys, with every hospital but the victim restarted
    r = run_attack("secagg-rerun", verbose=False, work=tmp_path)
    # Assert: every restarted hospital refused; no second sum exists
    assert r["first_released"] and r["refused_by"] == ["h2", "h3", "h4"] and r["outcome"] == "refused"


def test_a_hospital_that_signed_a_survivor_set_signs_no_second_one(tmp_path):
    # Prepare: the adversarial server of tests/support runs one round; every hospital signs its survivor set
    from support.secagg_adversary import MaliciousServer, hospital_data

    adv = MaliciousServer(tmp_path, 4, threshold=2)
    data = hospital_data(adv.names)
    first = adv.run(data)
    assert all(isinstance(v, dict) for v in first.values()), first
    # Execute: each hospital restarts (a new process: new participant, the same record directory) and the
    # server announces round 1 of the session again
    refused: dict = {}
    parts = adv.hospitals(data, refused)
    # Assert: no hospital of the signed session takes part again, naming the record
    assert not parts and set(refused) == set(adv.names)
    assert all(isinstance(e, InvalidContribution) and "signed a survivor set" in str(e) for e in refused.values())


def test_the_record_directory_must_be_absolute():
    from secure_afl.exceptions import InvalidParameterError
    from secure_afl.secagg.record import SurvivorRecord

    with pytest.raises(InvalidParameterError, match="absolute"):
        SurvivorRecord("records", "s", "h1")


# -- the attack command -----------------------------------------------------------------------------------------
def _attack_cli(name: str, prelude: str = ""):
    code = prelude + "\nimport sys\nfrom secure_afl.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "attack", name], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.e2e
def test_attack_split_cohort_exits_zero_and_seven_once_the_key_holder_floor_is_gone():
    ok = _attack_cli("split-cohort")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "REFUSED" in ok.stdout and "RELEASED with residual" in ok.stdout and "RECOVERED" not in ok.stdout
    # the key holder's quorum and refusal limit removed, as a regression would
    broken = _attack_cli("split-cohort", "import dataclasses\n"
                                         "import secure_afl.keyholder.release.session_release as s\n"
                                         "import secure_afl.keyholder.release.split_share as r\n"
                                         "f = s.release_policy\n"
                                         "s.release_policy = lambda d, min_clients=0, min_class_count=0: "
                                         "dataclasses.replace(f(d, min_clients=min_clients, "
                                         "min_class_count=min_class_count), quorum=min_clients)\n"
                                         "r.cohort_after_refusals = lambda policy, parts, refused: "
                                         "[h for h in parts if h not in refused]")
    assert broken.returncode == EXIT_SECURITY, broken.stdout + broken.stderr
    assert "RECOVERED" in broken.stdout and "ATTACK SUCCEEDED" in broken.stderr


def test_signed_definition_lists_c_and_the_refusal_limit(tmp_path, capsys):
    out, pki_dir = _sign(tmp_path, capsys, {"colluders": 1, "max_refusals": 0})
    assert out.returncode == 0, out.stderr
    body = json.loads((pki_dir / "sessions" / "s-cohort.json").read_text())["definition"]
    assert (body["colluders"], body["max_refusals"]) == (1, 0)


def _ckks_relay(tmp_path, roster: int, uploads: int):
    """A signed ckks session of ``roster`` hospitals (min_clients 3), its key holder, and a server relay that
    signs a manifest of the first ``uploads`` hospitals' uploads and relays min_clients = 1 in its info."""
    from secure_afl.backends.ckks import CKKSBackend, ckks_session_params
    from secure_afl.keyholder import KeyHolder
    from secure_afl.packing import Layout
    from secure_afl.params import Bounds
    from secure_afl_tools.attack_parties import MaliciousServer, signed_participant, tagged_upload
    from secure_afl_tools.harness import make_pki, sign_session

    names = [f"h{i}" for i in range(roster)]
    server, parties = make_pki(tmp_path / "pki", names, name="floor")
    bounds, layout = Bounds(2.0, 100, 8), Layout(4, 2)
    sign_session(tmp_path / "pki", {"session": {"id": "floor", "backend": "ckks", "dim": 4, "classes": 2,
                                                "min_clients": 3, "hospitals": names},
                                    "bounds": {"max_norm": 2.0, "n_max": 100, "k_max": 8}})
    kh = KeyHolder(tmp_path / "pki", "keyholder", tmp_path / "keys", passphrase=b"floor test passphrase")
    public = kh.keygen(ckks_session_params("floor", layout, 1.0, bounds))
    params = kh.params("floor")
    be = CKKSBackend(params)
    rng = np.random.default_rng(0)
    ups = {h: tagged_upload(parties[h], params, be, public, rng.uniform(0, 0.1, layout.length))
           for h in names[:uploads]}
    relay = MaliciousServer(server, params, [signed_participant(parties[h], params, ups[h][0]) for h in ups],
                            {h: u[0] for h, u in ups.items()}, {h: u[1] for h, u in ups.items()}, min_clients=1)
    return kh, relay, params


def _decryptions(kh, params) -> int:
    from secure_afl.release_checks import ReleaseLedger

    ledger = ReleaseLedger(kh.keys_dir / "releases.sqlite3")
    try:
        return ledger.decryption_count(params.backend_params["public_context_sha256"])
    finally:
        ledger.close()


@pytest.mark.parametrize("roster,q", [(6, 5), (4, 4)], ids=["6", "4"])
def test_the_key_holder_floor_holds_when_the_server_relays_min_clients_1(tmp_path, roster, q):
    # Prepare: a ckks session of 6 hospitals (min_clients 3, so c = 2 and q = 5), or of 4 (c = 1 and q = 4:
    # the smallest consortium at the defaults); the server relays min_clients = 1 in its info and signs a
    # manifest of 3 uploads (the victim and 2 colluders)
    from secure_afl.exceptions import SecureAFLError

    kh, relay, params = _ckks_relay(tmp_path, roster, 3)
    assert relay.info()["min_clients"] == 1

    # Execute: the key holder's real finalize, asked with min_clients 1 as well
    with pytest.raises(SecureAFLError, match=f"3 contributions, fewer than the release quorum q = {q} ") as info:
        kh.finalize(relay, min_clients=1)

    # Assert: the signed quorum, and how it was reached, is named; nothing was decrypted
    assert "signed min_clients = 3" in str(info.value) and "own floor" not in str(info.value)
    assert _decryptions(kh, params) == 0


def test_a_raised_min_clients_refusal_names_the_quorum_actually_enforced(tmp_path):
    # Prepare: 6 hospitals (signed min_clients 3: q = 5), a manifest of 5, which the signed quorum allows
    from secure_afl.exceptions import InsufficientContributors

    kh, relay, params = _ckks_relay(tmp_path, 6, 5)
    # Execute: the key holder raises its own floor to 6 (keyholder finalize --min-clients 6)
    with pytest.raises(InsufficientContributors) as info:
        kh.finalize(relay, min_clients=6)
    # Assert: the message names q = 6, the quorum it enforced, not the signed 5; nothing was decrypted
    msg = str(info.value)
    assert "5 contributions, fewer than the release quorum q = 6 " in msg
    assert "signed min_clients = 3, raised to this party's own floor of 6" in msg
    assert _decryptions(kh, params) == 0


def test_refusals_past_the_signed_limit_abort_even_when_the_quorum_remains(tmp_path):
    # Prepare: a split session of 8 (min_clients 3: c = 2, q = 6) that signs max_refusals = 0, every upload
    # in; the server forges the verifier message of one honest upload, leaving 7 >= q
    from secure_afl.exceptions import InsufficientContributors
    from secure_afl_tools.attack_parties import ForgingSplitSource
    from secure_afl_tools.attacks import split_service

    names = tuple(f"h{i}" for i in range(8))
    srv, kh, pki_dir, _ = split_service(tmp_path, hospitals=names, min_clients=3,
                                         extra_session={"max_refusals": 0})
    try:
        policy = release_policy(load_signed(pki_dir, srv.config.session_id))
        assert len(names) - 1 >= policy.quorum and policy.max_refusals == 0
        # Execute / Assert: the key holder releases no share
        with pytest.raises(InsufficientContributors, match="max_refusals"):
            kh.release_split(srv.config.session_id, ForgingSplitSource(srv, srv.key, forge=names[1:2]),
                             min_clients=1)
    finally:
        aggregator.shutdown(srv)


@pytest.mark.e2e
def test_a_server_closes_no_round_below_the_quorum(consortium):
    # Prepare: a real plain server process of 6 hospitals (min_clients 3, q = 5); 4 upload
    from secure_afl.exceptions import InsufficientContributors

    c = consortium(backend="plain", hospitals=tuple(f"h{i}" for i in range(1, 7)), min_clients=3).start()
    for h in ("h1", "h2", "h3", "h4"):
        cl = c.hospital(h)
        cl.submit(c.stats(*c.data(h)))
        cl.close()
    # Execute / Assert: the key holder's close is refused by the server itself, naming the quorum
    with c.connect_keyholder() as conn:
        with pytest.raises(InsufficientContributors, match="quorum"):
            c.keyholder.finalize(conn, min_clients=3)


@pytest.mark.e2e
def test_a_refused_hospital_proves_the_server_forged_its_refusal_with_its_own_upload(consortium):
    # Prepare: a real split server process of 6 hospitals (min_clients 3, c = 2, q = 5); every hospital
    # submits over HTTPS and keeps its receipt, upload and seed statement
    from secure_afl import pki
    from secure_afl import split
    from secure_afl.keyholder.release import HTTPSource
    from secure_afl_tools.attack_parties import forge_verifier

    names = tuple(f"h{i}" for i in range(1, 7))
    c = consortium(backend="split", hospitals=names, min_clients=3).start()
    conn = c.connect_keyholder()
    c.keyholder.keygen(load_signed(c.pki_dir, c.session_id).session_params())
    c.keyholder.publish(conn)
    kept = {}
    for h in names:
        cl = c.hospital(h)
        cl.submit(c.stats(*c.data(h)))
        kept[h] = (*cl.dispute_paths()[:2], cl.kept_seed())
        cl.close()
    conn.request("POST", conn.path("/close"))
    server_key = pki.load_party(c.pki_dir, "server", "aggregator").identity_key()

    class Forging(HTTPSource):
        """The server's answers over HTTPS, h2's verifier message falsified and re-signed with its key."""

        def split_queries(self, queries):
            out = dict(super().split_queries(queries))
            if "h2" in out:
                out["h2"] = forge_verifier(c.keyholder.params(c.session_id), out["h2"], server_key)
            return out

    # Execute: the key holder's release against that server; then h2 disputes from what it kept
    body, statement = c.keyholder.release_split(c.session_id, Forging(conn), min_clients=3)
    evidence = json.loads((c.keyholder.keys_dir / f"{c.session_id}.validity-refusals.json").read_text())
    payload_path, statement_path, seed = kept["h2"]
    out = split.dispute(c.keyholder.params(c.session_id), "h2", payload_path.read_bytes(),
                                 json.loads(statement_path.read_text()), seed, evidence["server_messages"]["h2"],
                                 statement["evidence"]["h2"]["keyholder_message"],
                                 pki.pinned_identity(c.pki_dir, "server"))
    conn.close()

    # Assert: refused as a joint-check failure (not pinned on h2), the two published messages give a failing
    # verdict, and h2's own upload shows the server's signed message false
    assert statement["refused"].keys() == {"h2"} and len(statement["cohort"]) == 5
    assert statement["evidence"]["h2"]["attribution"].startswith("failed the joint check")
    assert split.joint_verdict(c.keyholder.params(c.session_id), "h2",
                                        evidence["server_messages"]["h2"]["payload_sha256"],
                                        evidence["server_messages"]["h2"],
                                        statement["evidence"]["h2"]["keyholder_message"],
                                        pki.pinned_identity(c.pki_dir, "server")) is not None
    assert out["at_fault"] == "server" and not out["server_message_true"]
    # an honest hospital's dispute against the genuine message finds the message true
    with c.connect_keyholder() as again:
        genuine = HTTPSource(again).split_verifier()["h3"]
    p3, s3, seed3 = kept["h3"]
    honest = split.dispute(c.keyholder.params(c.session_id), "h3", p3.read_bytes(),
                                    json.loads(s3.read_text()), seed3, genuine, None,
                                    pki.pinned_identity(c.pki_dir, "server"))
    assert honest["server_message_true"]


def test_a_key_holder_without_the_signed_definition_releases_nothing(tmp_path):
    # Prepare: a ckks session whose key holder made its key, but whose PKI holds no signed definition (a bundle
    # copied before `session sign`): the server relays min_clients = 1 and signs a manifest of 3 uploads
    from secure_afl.backends.ckks import CKKSBackend, ckks_session_params
    from secure_afl.exceptions import DecryptionRefused
    from secure_afl.keyholder import KeyHolder
    from secure_afl.packing import Layout
    from secure_afl.params import Bounds
    from secure_afl.release_checks import ReleaseLedger
    from secure_afl_tools.attack_parties import MaliciousServer, signed_participant, tagged_upload
    from secure_afl_tools.harness import make_pki

    names = [f"h{i}" for i in range(6)]
    server, parties = make_pki(tmp_path / "pki", names, name="unsigned")
    layout = Layout(4, 2)
    kh = KeyHolder(tmp_path / "pki", "keyholder", tmp_path / "keys", passphrase=b"unsigned test passphrase")
    public = kh.keygen(ckks_session_params("unsigned", layout, 1.0, Bounds(2.0, 100, 8)))
    params = kh.params("unsigned")
    be = CKKSBackend(params)
    rng = np.random.default_rng(0)
    ups = {h: tagged_upload(parties[h], params, be, public, rng.uniform(0, 0.1, layout.length)) for h in names[:3]}
    relay = MaliciousServer(server, params, [signed_participant(parties[h], params, ups[h][0]) for h in ups],
                            {h: u[0] for h, u in ups.items()}, {h: u[1] for h, u in ups.items()}, min_clients=1)

    # Execute / Assert: the key holder's real release path refuses, naming the missing definition
    from secure_afl.keyholder.release import HTTPSource

    with pytest.raises(DecryptionRefused, match="signed definition"):
        kh.release_he("unsigned", HTTPSource(relay), min_clients=1)
    ledger = ReleaseLedger(kh.keys_dir / "releases.sqlite3")
    try:
        assert ledger.decryption_count(params.backend_params["public_context_sha256"]) == 0
    finally:
        ledger.close()


def test_refusals_that_name_a_hospital_outside_the_manifest_are_refused_by_name():
    # a refusal list is the key holder's own verdicts on the manifest's uploads; one naming a hospital the
    # manifest does not carry was not formed over this manifest, and counting it would move the refusal limit
    from secure_afl.cohort import ReleasePolicy, cohort_after_refusals
    from secure_afl.exceptions import InsufficientContributors

    roster = ("h1", "h2", "h3", "h4", "h5", "h6")
    policy = ReleasePolicy(session_id="s", backend="split", roster=roster, min_clients=3, colluders=2,
                           quorum=quorum(6, 2, 3), max_refusals=1, min_class_count=1, deadline=None)
    # Assert: a refusal inside the manifest leaves a cohort; one outside it is named and refused
    assert cohort_after_refusals(policy, roster, {"h6": "linear"}) == ["h1", "h2", "h3", "h4", "h5"]
    with pytest.raises(InsufficientContributors, match=r"\['h9'\], not in the release's cohort"):
        cohort_after_refusals(policy, roster, {"h9": "linear"})
