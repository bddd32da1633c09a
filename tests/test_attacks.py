"""The attack demonstrations of threat_model/attacks/ assert what they claim."""

from __future__ import annotations

import subprocess
import sys

import pytest

from secure_afl_tools.attacks import ATTACKS, run_attack
from secure_afl.cli import main

pytestmark = pytest.mark.security


def test_curious_server_recovers_singleton_hospital_from_plain_payload():
    # Execute
    r = run_attack("plain-singleton", verbose=False)

    # Assert: x = Q[:, y] exactly, and C = x x^T
    assert r["outcome"] == "recovered" and r["max_error"] == 0.0 and r["gram_error"] < 1e-12
    assert r["label"] == r["true_label"]


def test_curious_server_recovers_singleton_class_from_plain_payload():
    # Execute
    r = run_attack("plain-singleton-class", verbose=False)

    # Assert
    assert r["outcome"] == "recovered" and r["max_error"] == 0.0 and r["singleton_classes"] == [2]


def test_k2_hospital_recovers_the_other_by_subtraction():
    # Execute
    r = run_attack("k2-subtraction", verbose=False)

    # Assert: residual leakage of the aggregate itself (THREAT_MODEL.md section 6)
    assert r["outcome"] == "recovered" and r["max_error"] < 1e-12 and r["counts_error"] == 0.0


def test_differencing_two_releases_recovers_one_hospital_but_ledger_refuses(tmp_path):
    # Execute
    r = run_attack("differencing", verbose=False, work=tmp_path)

    # Assert
    assert r["max_error"] < 1e-12
    assert r["outcome"] == "refused" and r["ledger_refused"] and r["reason"] == "policy_violation"


def test_curious_server_gets_nothing_from_ckks_payload():
    # Execute
    r = run_attack("ckks-server", verbose=False)

    # Assert: typed refusals, and no coordinate of x appears in the ciphertext bytes
    assert r["outcome"] == "refused"
    a = r["attempts"]
    assert (a["reveal with the public context"]["error"], a["reveal with the public context"]["reason"]) == (
        "InvalidKey", "invalid_key")
    assert a["combiner given a secret context"]["error"] == "SecretKeyNotAllowed"
    assert r["coordinates_found_in_ciphertext"] == 0


def test_curious_server_gets_nothing_from_secagg_masked_vector():
    # Execute
    r = run_attack("secagg-server", verbose=False)

    # Assert: uniform, uncorrelated, and the singleton attack is far off
    assert r["outcome"] == "refused"
    assert r["p_uniform"] > 1e-4 and abs(r["correlation"]) < 5 / r["words"] ** 0.5 and r["max_error"] > 1.0


@pytest.mark.parametrize("name", ["split-server", "split-keyholder", "split-subset"])
def test_split_server_or_keyholder_alone_recovers_nothing(tmp_path, name):
    # Execute: the real server role and key holder in process; the adversary is one of them
    r = run_attack(name, verbose=False, work=tmp_path)

    # Assert: what it obtained is no hospital's statistics
    assert r["outcome"] == "refused", r
    assert r["max_error"] > 1.0


@pytest.mark.e2e  # the auditor's `secure-afl audit release` runs as its own process
def test_a_split_server_holding_the_share_cannot_choose_w_and_the_audit_names_it(tmp_path):
    # Execute: the real server role and key holder in process; the server asks for the share first, then
    # relays enc(v*) - share as a second commitment, then stores that sum in place of the one it gave
    r = run_attack("split-remask", verbose=False, work=tmp_path)

    # Assert: each step refused by name, W the plaintext solve's (not the target's), the server named
    assert r["outcome"] == "refused", r
    assert "no_commitment" in r["refusals"]["share_before_commit"]
    assert "a second masked sum" in r["refusals"]["second_sum"]
    assert r["w_rel_error"] <= r["w_rel_bound"] and r["w_to_target"] > 0.1
    assert r["audit_rc"] == 7 and r["audit"].startswith("AT FAULT: the server") and "key holder (W" not in r["audit"]


def test_malicious_server_gets_no_victim_statistics_decrypted(tmp_path):
    """T2/T25: a malicious server answering the key holder's real finalize. Every forgery is refused
    BEFORE any decryption (ledger count measured), and a forged server "aggregate" is simply not used."""
    # Execute
    r = run_attack("forward-ciphertext", verbose=False, work=tmp_path)

    # Assert
    v = r["variants"]
    assert r["outcome"] == "refused" and r["decrypted_before_refusal"] == 0
    assert (v[0]["error"], v[0]["decryptions"]) == ("InsufficientContributors", 0)
    assert [x["reason"] for x in v[1:4]] == ["server_forgery"] * 3
    assert v[4]["outcome"] == "released_honest_sum" and v[4]["distance_to_honest_sum"] < v[4]["distance_to_victim"]
    assert r["honest_released"]


def test_release_does_not_give_the_decryption_error_needed_for_key_recovery(tmp_path):
    """IND-CPA-D (Li-Micciancio): without the flooding the attacker holds the exact decryption error
    (the control shows the attack's statistic works); with it, the estimate is noise."""
    # Execute
    flooded = run_attack("decryption-error", verbose=False, work=tmp_path / "a")
    control = run_attack("decryption-error", verbose=False, work=tmp_path / "b", flood=False)

    # Assert
    assert control["outcome"] == "recovered" and control["residual"] < 1e-6
    assert flooded["outcome"] == "refused" and flooded["residual"] > 1e3 and flooded["flood_sigma"] > 0


def test_keyholder_blocks_key_after_forged_aggregate(tmp_path):
    from secure_afl.release_checks import ReleaseLedger
    from secure_afl.exceptions import PolicyViolation

    # Prepare
    ledger = ReleaseLedger(tmp_path / "ledger.sqlite3")
    ledger.block("key-1", "aggregate tag check failed")
    # Execute / Assert: no release under that key again, other keys unaffected
    with pytest.raises(PolicyViolation, match="blocked"):
        ledger.check("key-1", "s", ["a", "b"], "00" * 32)
    ledger.check("key-2", "s", ["a", "b"], "00" * 32)
    # a CKKS key decrypts once: a second decryption is refused even with no block
    ledger.record_decryption("key-3", "s", ["a", "b"])
    with pytest.raises(PolicyViolation, match="decrypts once"):
        ledger.record_decryption("key-3", "s", ["a", "b"])
    ledger.close()


def test_attack_cli_lists_and_runs(capsys):
    # Execute
    assert main(["attack", "list"]) == 0
    listing = capsys.readouterr().out
    assert main(["attack", "plain-singleton"]) == 0
    out = capsys.readouterr().out

    # Assert
    assert all(name in listing for name in ATTACKS)
    assert "RECOVERED: x read with max error 0.0" in out


@pytest.mark.parametrize("eps", [1.0, 8.0])
def test_k2_subtraction_returns_only_noise_under_dp(eps):
    # Execute: the same attack, the session declaring DP
    r = run_attack("k2-subtraction", verbose=False, dp=eps, seed=3)

    # Assert (measured): what A recovers is B plus noise of the declared scale, not B
    assert r["outcome"] == "noise"
    n = r["residual_entries"]
    # chi-square on the residual's second moment: false failure rate 1e-6 (bounds for n = 35 entries)
    from scipy import stats as st

    ratio = (r["residual_std"] ** 2 + r["residual_mean"] ** 2) / r["sigma"] ** 2
    assert st.chi2.ppf(5e-7, n) / n <= ratio <= st.chi2.isf(5e-7, n) / n
    assert r["max_error"] > 0.3 * r["sigma"] and r["counts_error"] > 1e-3


def test_attack_cli_k2_with_dp_prints_noise(capsys):
    assert main(["attack", "k2-subtraction", "--dp", "1"]) == 0
    assert "NOISE" in capsys.readouterr().out


def _attack_cli(name: str, patch: str = "") -> subprocess.CompletedProcess:
    """``secure-afl attack NAME`` in a fresh interpreter, after ``patch`` (a protection switched off)."""
    code = f"import sys\n{patch}\nfrom secure_afl.cli import main\nsys.exit(main(['attack', '{name}']))\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["ckks-server", "secagg-server", "split-server", "split-keyholder",
                                  "split-subset", "split-remask"])
def test_attack_cli_exits_zero_when_the_protection_holds(name):
    r = _attack_cli(name)
    assert r.returncode == 0, r.stderr
    assert "REFUSED" in r.stdout and "RECOVERED" not in r.stdout


# each patch switches one protection off, as a regression would
_BROKEN = {
    # the server may hold a secret context (the combiner's refusal removed)
    "ckks-server": ("import secure_afl.backends.ckks as m\n"
                    "m.CKKSBackend.combiner = lambda self, public_context, **kw: object()"),
    # the masks expand to zero: hospitals upload their vector unmasked
    "secagg-server": ("import numpy as np, secure_afl.secagg.client as c, secure_afl.secagg.masking as mk\n"
                      "zero = lambda seed, length, domain=None: np.zeros(length, dtype=np.uint64)\n"
                      "c.expand = zero\n"
                      "mk.expand = zero"),
    # split hospitals add no mask to what the server stores
    # (in either field: the attack's session is split's default)
    "split-server": ("import numpy as np, secure_afl.hazmat.flp as f, secure_afl.hazmat.field128 as w, "
                     "secure_afl.split.proof as v\n"
                     "g = f.Goldilocks.expand_field\n"
                     "f.Goldilocks.expand_field = staticmethod(lambda seed, n, domain: (np.zeros(n, dtype=np.uint64) "
                     "if domain == v.DOMAIN_SHARE else g(seed, n, domain)))\n"
                     "h = w.Field128.expand_field\n"
                     "w.Field128.expand_field = lambda self, seed, n, domain: (self.zeros(n) "
                     "if domain == v.DOMAIN_SHARE else h(self, seed, n, domain))"),
    # the split server serves a stored masked vector to the key holder (its refusing route removed)
    "split-keyholder": ("import secure_afl.server.closing as m\n"
                        "m.contribution = lambda s, h: (m.released(s), next(s.store.get_blob(r['payload_sha256']) "
                        "for r in s.store.uploads() if r['hospital'] == h))[1]"),
    # the key holder's floor removed (the signed quorum on the manifest and on the cohort its validity
    # verdicts leave): it releases a share for any cohort
    "split-subset": ("import secure_afl.keyholder.release.split_share as r\nf = r.verify_manifest_for\n"
                     "import dataclasses\n"
                     "r.verify_manifest_for = lambda p, m, s, e, pol: f(p, m, s, e, dataclasses.replace(pol, quorum=1))\n"
                     "import secure_afl.keyholder.release as k\nrs = k.KeyHolder.release_split\n"
                     "k.KeyHolder.release_split = lambda self, sid, src, *, min_clients, **kw: "
                     "rs(self, sid, src, min_clients=1, **kw)\n"
                     "r.cohort_after_refusals = lambda p, parts, refused: [h for h in parts if h not in refused]"),
    # the key holder takes a sum relayed after its share and releases from it (the refusal of a second sum
    # and the release from the kept sum alone removed)
    "split-remask": ("import secure_afl.keyholder.release.split_share as r\nlast = {}\n"
                     "r.check_same_commitment = lambda rel, kept, answer: last.update(a=r.read_commitment(answer))\n"
                     "rf = r.release_from_sum\n"
                     "r.release_from_sum = lambda rel, body, st, signed, masked, manifest, **kw: "
                     "rf(rel, body, st, *last.get('a', (signed, masked)), manifest, **kw)"),
}


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(_BROKEN))
def test_attack_cli_exits_non_zero_when_the_attack_succeeds(name):
    r = _attack_cli(name, _BROKEN[name])
    assert r.returncode == 7, r.stdout + r.stderr  # EXIT_SECURITY
    assert ("STEERED" if name == "split-remask" else "RECOVERED") in r.stdout and "ATTACK SUCCEEDED" in r.stderr
