"""The CIFAR-100-shaped headline script at a tiny size: every phase through the real service."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torchvision")


@pytest.mark.e2e
@pytest.mark.slow
def test_headline_runs_end_to_end_through_the_service(capsys):
    from secure_afl.tools.bench_headline import main

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
