"""The split figures' benchmarks on tiny sessions: they run the real service and report what they measure."""

import pytest

pytestmark = pytest.mark.e2e


def test_bench_service_versus_runs_both_backends_and_counts_every_upload_once(tmp_path, capsys):
    from secure_afl.cli import main

    # Execute: split beside plain in one invocation
    rc = main(["bench", "service", "--backend", "split", "--versus", "plain", "--hospitals", "3", "--dim", "6",
               "--classes", "3", "--samples", "8", "--workdir", str(tmp_path), "--json", str(tmp_path / "r.json")])

    # Assert: both runs, side by side; each upload accepted once and in the release; the share timed
    import json

    captured = capsys.readouterr()
    out = captured.out
    runs = json.loads((tmp_path / "r.json").read_text())
    assert rc == 0 and [r["backend"] for r in runs] == ["plain", "split"]
    assert all(r["uploads_counted"] == {"accepted_records": 3, "hospitals": 3, "each_once": True} for r in runs)
    assert runs[1]["phases"]["release"]["keyholder_share_s"] > 0
    # split's release starts once every upload is judged; the hospitals' figures are still all collected after it
    assert all(r["hospitals_measured"] == 3 for r in runs)
    assert isinstance(runs[1]["phases"]["hospitals"]["processes_ended_after_release_s"], float)
    assert "processes ended" in out
    assert "split / plain" in out and "each survivor exactly once" in out
    # nothing waits silently: each phase says so on stderr as it starts, in the order it runs
    said = [line.partition(": ")[2] for line in captured.err.splitlines() if line.startswith("bench service (split)")]
    starts = [line for line in said if line.endswith(" ...")]
    assert starts[:3] == ["keys ...", "hospitals ...", "judging ..."] and "release ..." in starts, said


def test_bench_upload_cost_splits_the_server_cpu_against_its_floor(tmp_path):
    from secure_afl_tools.bench_upload import format_report, run_upload_cost

    # Execute
    r = run_upload_cost("split", 2, dim=6, classes=3, samples=8, workdir=str(tmp_path))

    # Assert: every figure measured (the floor's parts, the server process, the profiled handler)
    f = r["floor"]
    assert f["tls_cpu_s"] > 0 and f["sha256_cpu_s"] >= 0 and f["floor_cpu_s"] >= f["tls_cpu_s"]
    assert r["server_cpu_s_per_hospital"] >= r["server_cpu_s_per_upload_request"] >= 0
    assert r["submit_cpu_s_per_upload"] > 0
    rows = r["handler_top"]
    assert rows and all(row["tottime_s_per_upload"] >= 0 and row["calls"] > 0 for row in rows)
    assert "floor: TLS" in format_report(r)
