"""The attack demonstrations of threat_model/attacks/ assert what they claim (issue 6)."""

from __future__ import annotations

import pytest

from secure_afl.attacks import ATTACKS, run_attack
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
    assert (r["error"], r["reason"]) == ("InvalidKey", "invalid_key")
    assert r["secret_context_error"] == "SecretKeyNotAllowed"
    assert r["coordinates_found_in_ciphertext"] == 0


def test_curious_server_gets_nothing_from_secagg_masked_vector():
    # Execute
    r = run_attack("secagg-server", verbose=False)

    # Assert: uniform, uncorrelated, and the singleton attack is far off
    assert r["outcome"] == "refused"
    assert r["p_uniform"] > 1e-4 and abs(r["correlation"]) < 5 / r["words"] ** 0.5 and r["max_error"] > 1.0


def test_keyholder_refuses_forwarded_single_ciphertext(tmp_path):
    # Execute
    r = run_attack("forward-ciphertext", verbose=False, work=tmp_path)

    # Assert: every naive forwarding is refused with the expected guard, the honest sum is released
    v = r["variants"]
    assert r["outcome"] == "refused" and r["honest_released"]
    assert (v[0]["error"], v[0]["cause"]) == ("DecryptionRefused", "MalformedPayload")
    assert (v[1]["error"], v[1]["cause"]) == ("DecryptionRefused", "DecryptionRefused")
    assert v[2]["error"] == "SanityCheckFailed"
    assert (v[3]["error"], v[3]["cause"]) == ("DecryptionRefused", "InsufficientContributors")
    assert (v[4]["error"], v[4]["cause"]) == ("DecryptionRefused", "InvalidSignature")


def test_homomorphic_fixup_forgery_detected_by_aggregate_tag(tmp_path):
    """T25 (THREAT_MODEL.md): a MALICIOUS server adds Enc(fix-up) to one hospital's ciphertext so
    the counter and RI term look like a K-sum. Every other check passes; the aggregate tag does not."""
    # Execute
    r = run_attack("forward-ciphertext", verbose=False, work=tmp_path)

    # Assert
    fixup = r["variants"][-1]
    assert r["homomorphic_fixup"] == "refused"
    assert (fixup["error"], fixup["reason"]) == ("DecryptionRefused", "aggregate_forged")


def test_keyholder_blocks_key_after_forged_aggregate(tmp_path):
    from secure_afl.release import ReleaseLedger
    from secure_afl.exceptions import PolicyViolation

    # Prepare
    ledger = ReleaseLedger(tmp_path / "ledger.sqlite3")
    ledger.block("key-1", "aggregate tag check failed")
    # Execute / Assert: no release under that key again, other keys unaffected
    with pytest.raises(PolicyViolation, match="blocked"):
        ledger.check("key-1", "s", ["a", "b"], "00" * 32)
    ledger.check("key-2", "s", ["a", "b"], "00" * 32)
    ledger.close()


def test_attack_cli_lists_and_runs(capsys):
    # Execute
    assert main(["attack", "list"]) == 0
    listing = capsys.readouterr().out
    assert main(["attack", "plain-singleton"]) == 0
    out = capsys.readouterr().out

    # Assert
    assert all(name in listing for name in ATTACKS)
    assert "RECOVERED x exactly: max error 0.0" in out


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
