"""split's message-level vectors (vectors/split/): every case replayed against both verifiers from the files
alone, for each instance: the plain statement's session (``plain``), the Gram statement's (``gram``) and DP with
the Gram statement's (``dp_gram``). tests/test_vector_files.py regenerates the files byte for byte."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secure_afl import split
from secure_afl.envelope import open_envelope
from secure_afl.exceptions import SecureAFLError
from secure_afl.hazmat import flp
from secure_afl.params import SessionParams
from secure_afl.split.signed_messages import UploadCommitment
from secure_afl_tools.vectors import files, split_messages as split_vectors

SECTIONS = {name: files.instance("split", name) for name in files.instances("split")}
BAD = {name: files.bad_cases("split", name) for name in SECTIONS}
PLAIN = SECTIONS["plain"]
H = PLAIN["hospital"]
SERVER = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(PLAIN["keys"]["server_ed25519"]))
HOSPITAL = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(PLAIN["keys"]["hospital_ed25519"]))
SECRET = bytes.fromhex(PLAIN["keys"]["keyholder_secret_key"])
#: what each case is for: None (valid), the check that refuses it, or the exception the key holder raises
EXPECTED = {
    "plain": {"honest": None, "count_minus_one": "linear", "tampered_proof": "bits",
              "seed_misses_commitment": "commitment", "message_for_another_payload": "InvalidSignature"},
    "gram": {"honest": None, "indefinite_field_factor": "gram_range", "indefinite_stand_in_factor": "gram"},
    "dp_gram": {"honest": None, "statistics_in_the_noise": "noise", "q_residual_past_l2": "noise"},
    "dp_gram_field128": {"honest": None, "statistics_past_the_noise_rows": "noise",
                         "q_residual_past_the_groups_l2": "noise"},
}
#: the relations the unmasked body of each Gram section's case breaks, by its verdict
BROKEN = {None: [], "gram_range": ["gram_range"], "gram": ["gram_identity"]}
#: the noise verdict covers two relations: which each case breaks (diag(+T_z, -T_z) is past both the per-entry
#: range and the l2 bound; the Q residual is within the range and past the l2 bound only)
BROKEN_NOISE = {"statistics_in_the_noise": ["noise_range", "noise_l2"], "q_residual_past_l2": ["noise_l2"],
                # Field128: past the noise rows (and so past the l2 bound); every entry within the bound its group
                # gives, the whole share past its l2 bound
                "statistics_past_the_noise_rows": ["noise_range", "noise_l2"],
                "q_residual_past_the_groups_l2": ["noise_l2"]}
CASES = [(s, c) for s, sec in SECTIONS.items() for c in (sec["honest"], *BAD[s])]
IDS = [f"{s}-{c['name']}" for s, c in CASES]


def _params(section: str) -> SessionParams:
    return SessionParams.from_dict(SECTIONS[section]["params"])


def test_the_sessions_are_what_their_instances_name():
    plain, gram, dp_gram = (_params(s) for s in ("plain", "gram", "dp_gram"))
    assert not split.gram_enabled(plain) and plain.dp is None
    assert split.gram_enabled(gram) and gram.dp is None
    assert split.gram_enabled(dp_gram) and split.noise_beside(dp_gram)
    # the honest DP upload's share is within the proven per-entry bound, and it is not zero
    z = np.array(SECTIONS["dp_gram"]["noise"])
    c = split.Circuit(dp_gram)
    assert 0 < np.max(np.abs(z)) <= c.tau < c.part("gram").T_z
    # over Field128 (the default): one word per value, the share's range by its own projection rows
    dp128 = _params("dp_gram_field128")
    assert dp128.backend_params["field"] == "field128" and split.noise_beside(dp128)
    c = split.Circuit(dp128)
    z = np.array(SECTIONS["dp_gram_field128"]["noise"])
    assert c.lanes_per_value == 1 and c.part("gram").noise_rows
    assert 0 < np.max(np.abs(z)) <= split.sizes.noise_bound(dp128)
    assert np.max(np.abs(z)) < 2 ** c.sizes["gram"]["z_log2"] and np.sum(z * z) <= c.part("gram").l2_z


@pytest.mark.parametrize("section", list(SECTIONS))
def test_the_keys_are_the_fixed_ones_and_the_recorded_box_opens_to_the_seed(section):
    sec, params = SECTIONS[section], _params(section)
    pair, ed = split_vectors.fixed_keys()
    assert sec["keys"] == PLAIN["keys"] and sec["hospital"] == H
    assert pair.secret_context == SECRET
    assert {who: key.private_bytes_raw().hex() for who, key in ed.items()} == \
        {who: sec["keys"][f"{who}_ed25519"] for who in ("hospital", "server", "keyholder")}
    assert hashlib.sha256(pair.public_context).hexdigest() == sec["keys"]["keyholder_public_key_sha256"]
    assert params.backend_params[split.PUBLIC_CONTEXT_KEY] == sec["keys"]["keyholder_public_key_sha256"]
    up = sec["upload"]
    payload = bytes.fromhex(sec["honest"]["payload"])
    assert hashlib.sha256(payload).hexdigest() == up["payload_sha256"]
    # the hospital's signed statement names this box and commitment; the box opens only for this upload
    box = split.verify_seed_statement(up["seed_statement"], HOSPITAL.public_key(), params, H, up["payload_sha256"])
    assert box.hex() == up["box"]
    assert split.open_seed(params, SECRET, H, up["payload_sha256"], box).hex() == up["seed"]
    with pytest.raises(split.SeedRefused):
        split.open_statement_seed(params, SECRET, {H: up["seed_statement"]}, {H: HOSPITAL.public_key()}, H,
                                  BAD[section][0]["payload_sha256"])
    assert split.seed_digest(bytes.fromhex(up["seed"])) == up["validity"]["seed_sha256"]
    split.check_upload(split.Circuit(params), payload, {"validity": up["validity"]})


def test_the_cases_cover_what_they_name():
    assert sorted(SECTIONS) == sorted(EXPECTED)
    for section, sec in SECTIONS.items():
        assert [c["name"] for c in (sec["honest"], *BAD[section])] == list(EXPECTED[section])
        assert [c["expect"] for c in (sec["honest"], *BAD[section])] == list(EXPECTED[section].values())


@pytest.mark.parametrize("section,case", CASES, ids=IDS)
def test_each_case_replayed_against_both_verifiers(section, case):
    circuit = split.Circuit(_params(section))
    payload = bytes.fromhex(case["payload"])
    sha = hashlib.sha256(payload).hexdigest()
    assert sha == case["payload_sha256"]
    qs, seed = bytes.fromhex(case["query_seed"]), bytes.fromhex(case["seed"])
    st = {"validity": case["validity"]}
    # server (leader): its message for this payload at this query seed, signed (Ed25519 is deterministic)
    split.check_upload(circuit, payload, st)
    own_server = split.leader_message(circuit, H, payload, st, SERVER, qs)
    expected = EXPECTED[section][case["name"]]
    if case["name"] == "message_for_another_payload":
        assert case["server_message"] != own_server
    else:
        assert case["server_message"] == own_server
    # key holder (helper): the server's message checked, then its own message and the verdict
    try:
        _, leader = split.verify_leader_message(case["server_message"], SERVER.public_key(), circuit, H, sha, qs)
    except SecureAFLError as e:
        assert type(e).__name__ == expected == case["keyholder"]["exception"]
        return
    verdict, own = split.helper_verdict(circuit, H, seed, st, qs, leader, with_message=True)
    assert verdict == expected == case["keyholder"]["verdict"]
    assert (None if own is None else circuit.F.to_bytes(own).hex()) == case["keyholder"]["message"]
    if own is not None:  # anyone holding the two messages recomputes the verdict
        assert circuit.decide(leader, circuit.F.from_bytes(bytes.fromhex(case["keyholder"]["message"]))) == expected


@pytest.mark.parametrize("section,case", [(s, c) for s, c in CASES if s != "plain"],
                         ids=[i for i, (s, _) in zip(IDS, CASES) if s != "plain"])
def test_each_gram_case_breaks_only_the_relation_its_verdict_names(section, case):
    # the unmasked body (server's words plus the key holder's share) judged relation by relation: the verdict
    # is the one false relation, not a projection row that happened to fall out of range
    circuit = split.Circuit(_params(section))
    body = open_envelope(circuit.params, bytes.fromhex(case["payload"]), "contribution").body
    w = circuit.F.add(circuit.leader_share(body), circuit.helper_share(bytes.fromhex(case["seed"])))
    com = UploadCommitment.from_dict(case["validity"])
    verdict = EXPECTED[section][case["name"]]
    assert circuit.evaluate(w, com, H) == (BROKEN_NOISE[case["name"]] if verdict == "noise" else BROKEN[verdict])


def test_the_release_section_is_the_key_holders_share_and_the_servers_signed_sum_of_its_cohort():
    # from the file alone: the key holder's statement and the server's signed sum hold, and they release the vector
    params = _params("plain")
    rel = PLAIN["release"]
    keyholder = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(PLAIN["keys"]["keyholder_ed25519"]))
    body, masked = bytes.fromhex(rel["share"]), bytes.fromhex(rel["masked_sum"])
    share = split.verify_share(params, rel["manifest"], body, rel["share_statement"], keyholder.public_key())
    split.verify_masked_sum(params, rel["share_statement"], masked, rel["masked_sum_statement"], SERVER.public_key())
    got = split.collect(params, masked, share)
    assert [float(f) for f in got] == rel["released"]
    assert np.max(np.abs(got - np.array(PLAIN["vector"]))) <= split.expected_abs_error(params, 1)
    # the server's signature binds the statement it answers: the same sum for another statement is refused
    other = {**rel["share_statement"], "share_sha256": "00" * 32}
    with pytest.raises(SecureAFLError, match="another share statement"):
        split.verify_masked_sum(params, other, masked, rel["masked_sum_statement"], SERVER.public_key())
