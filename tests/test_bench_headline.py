"""The CIFAR-100-shaped headline script at a tiny size: every phase through the real service."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torchvision")


@pytest.mark.e2e
@pytest.mark.slow
def test_headline_runs_end_to_end_through_the_service(capsys):
    from secure_afl_tools.bench_headline import main

    assert main(["--images", "300", "--test-images", "60", "--classes", "5", "--hospitals", "4",
                 "--input-size", "32", "--batch-size", "64", "--device", "cpu"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    ph = res["phases_s"]
    for name in ("extraction", "statistics", "protect_upload", "release", "solve"):
        assert ph[name] > 0
    assert res["total_s"] == pytest.approx(ph["extraction"] + ph["statistics"] + ph["protect_upload"]
                                           + ph["release"], abs=1e-3)
    assert 2 <= res["hospitals"] <= 4 and res["bytes_up_per_hospital"] > 8 * 512 * 5
    # the service's release equals the plaintext solve of the same hospitals' statistics
    assert res["w_rel_error_vs_plain"] < 1e-6
    assert res["test_accuracy"] > 1.0 / 5


@pytest.mark.e2e
@pytest.mark.slow
def test_headline_compare_plain_runs_both_backends_on_the_same_features(capsys):
    """--compare plain: one invocation, both sessions through the real service on the same extraction and
    statistics, both ratios formed from the two runs' own phases and printed side by side."""
    from secure_afl_tools.bench_headline import main

    assert main(["--images", "300", "--test-images", "60", "--classes", "5", "--hospitals", "3",
                 "--input-size", "32", "--batch-size", "64", "--device", "cpu", "--compare", "plain"]) == 0
    captured = capsys.readouterr()
    res = json.loads(captured.out.strip().splitlines()[-1])
    c = res["compare"]
    assert res["backend"] == "split" and c["backend"] == "plain"
    # the shared phases are the same measurement; the protection's own phases are each run's
    for name in ("extraction", "statistics"):
        assert res["phases_s"][name] == c["phases_s"][name]
    for r in (res, c):
        assert r["protection_s"] == pytest.approx(r["phases_s"]["protect_upload"] + r["phases_s"]["release"],
                                                  abs=1e-3)
    assert c["ratio_end_to_end"] == pytest.approx(res["total_s"] / c["total_s"])
    assert c["ratio_protection"] == pytest.approx(res["protection_s"] / c["protection_s"])
    assert res["w_rel_error_vs_plain"] < 1e-6 and c["w_rel_error_vs_plain"] < 1e-6
    assert "end to end (total)" in captured.err and "protection only" in captured.err
