"""Tests of ``secure-afl bench`` (small dimensions; the real figures come from the CLI)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from secure_afl.keyholder.flooding import SECURITY
from secure_afl.packing import Layout

from secure_afl_tools import bench

KEYS = {"backend", "protect_s_per_client", "combine_s", "reveal_s", "bytes_per_client", "max_abs_error",
        "exact", "dim", "classes", "clients", "dropout"}


def _parser():
    p = argparse.ArgumentParser(prog="secure-afl bench")
    bench.register(p)
    return p


@pytest.mark.parametrize("backend", ["plain", "ckks", "bfv"])
def test_bench_protect_writes_json(tmp_path, capsys, backend):
    # Prepare
    out = tmp_path / "res.json"
    args = _parser().parse_args(["protect", "--backend", backend, "--dim", "8", "--classes", "3",
                                 "--clients", "4", "--dropout", "0.25", "--seed", "3", "--json", str(out)])

    # Execute
    rc = args.func(args)

    # Assert
    res = json.loads(out.read_text())
    assert res["w_bound"] is None or res["w_bound"] > 0
    assert rc == 0
    assert KEYS <= set(res)
    assert res["backend"] == backend and res["clients"] == 4 and res["survivors"] == 3
    assert res["exact"] is True
    assert res["max_abs_error"] <= res["error_bound"]
    assert "protect_s_per_client" in capsys.readouterr().out


def test_ckks_bytes_per_value_matches_the_parameters():
    # Prepare / Execute
    res = bench.run_protect("ckks", 90, 3, 2, samples=16)

    # Assert: ~D/2 bytes per slot for D data bits, plus framing (measured, not assumed)
    bits = res["backend_params"]["coeff_mod_bit_sizes"]
    n_slots = res["backend_params"]["poly_modulus_degree"] // 2
    # chunks: the Gram and cross entries, then the counts block in a ciphertext of its own
    n_start = Layout(90, 3).slices["n"].start
    per_slot = res["bytes_per_client"] / ((-(-n_start // n_slots) + 1) * n_slots)
    assert sum(bits[:-1]) / 2 <= per_slot <= sum(bits[:-1]) / 2 + 6


def test_every_backend_in_one_run_prints_one_table(capsys):
    # Prepare
    args = _parser().parse_args(["protect", "--dim", "6", "--classes", "2", "--clients", "2", "3",
                                 "--samples", "20"])

    # Execute
    rc = args.func(args)

    # Assert: one line per backend and K with its certified W bound
    out = capsys.readouterr().out.splitlines()
    head = out.index(next(line for line in out if "certified W bound" in line))
    table = out[head:head + 1 + 5 * 2]
    assert rc == 0 and {line.split()[0] for line in table[1:]} == {"plain", "ckks", "bfv", "secagg", "split"}
    # then split's release, per K: both verifiers' time, the key holder's share alone, the proof's bytes
    notes = out[head + 1 + 5 * 2:]
    assert [line.split(":")[0] for line in notes] == ["split, K = 2", "split, K = 3"]
    assert all("key holder release" in line and "validity proof" in line for line in notes)


def test_split_round_is_exact_and_sixteen_bytes_per_value():
    # Execute
    res = bench.run_protect("split", 16, 4, 5, samples=8)
    # Assert: the seed statement (its fields and the hex of the HPKE box) and the validity proof are the only
    # overhead over the two 8-byte lanes
    assert KEYS <= set(res) and res["exact"] is True and res["survivors"] == 5
    from secure_afl import split

    extra = 1200 + 2 * split.BOX_LEN + res["validity_proof_bytes"]
    assert 16.0 < res["bytes_per_value"] < 16.0 + extra / res["length"] and res["keyholder_share_s"] > 0


def test_secagg_round_is_exact_with_dropout():
    # Execute
    res = bench.run_protect("secagg", 4, 2, 10, samples=8, dropout=0.3)
    # Assert
    assert KEYS <= set(res) and res["backend"] == "secagg"
    assert res["exact"] is True and res["survivors"] == 7 and res["max_abs_error"] <= 1e-9


def test_bad_dropout_is_refused():
    # Prepare / Execute / Assert
    with pytest.raises(ValueError):
        bench.run_protect("plain", 4, 2, 2, dropout=1.0)


def test_bench_dp_prints_a_table_and_writes_a_png(tmp_path, capsys):
    from secure_afl.analytic import centralised_weights, top1_accuracy
    from secure_afl_tools.demo import load_embedded
    from secure_afl_tools.bench_dp import run_bench

    out = run_bench(datasets=("breast-cancer",), clients=(5,), epsilons=(1.0, float("inf")), seeds=1,
                    png=str(tmp_path / "dp.png"), json_path=str(tmp_path / "dp.json"))
    assert (tmp_path / "dp.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(out["rows"]) == 2 and "eps=1" in capsys.readouterr().out
    # epsilon = inf is the exact path: the centralised X^+ Y head's accuracy on the same split;
    # epsilon = 1 still beats always answering the majority class
    Xtr, ytr, Xte, yte, n_classes = load_embedded("breast-cancer", 0)
    by_eps = {r["epsilon"]: r["accuracy_mean"] for r in out["rows"]}
    assert by_eps[float("inf")] == top1_accuracy(centralised_weights(Xtr, ytr, n_classes), Xte, yte)
    assert by_eps[1.0] > np.bincount(yte).max() / len(yte)


def test_keyholder_bench_runs_the_real_release_path(capsys):
    # the bench drives KeyHolder.release_he on stored signed uploads; a flooded release must come out
    from secure_afl_tools.bench_keyholder import main as kh_bench

    assert kh_bench(["--dim", "8", "--classes", "3", "--hospitals", "2"]) == 0
    out = capsys.readouterr().out
    assert "K=2" in out and "flood sigma" in out


@pytest.mark.parametrize("backend", ["plain", "split"])
def test_protect_repeats_keep_one_time_per_hospital_and_the_same_round(backend):
    from secure_afl_tools.bench import run_protect

    # Execute: one round as is, one with every protect timed three times
    once = run_protect(backend, 8, 3, 3, samples=16)
    best = run_protect(backend, 8, 3, 3, samples=16, protect_repeats=3)

    # Assert: the same round (sizes, exactness, bound); a measured time
    for key in ("bytes_per_client", "survivors", "exact", "w_bound", "max_abs_error"):
        assert once[key] == best[key], key
    assert best["protect_s_per_client"] > 0


def test_ckks_error_is_the_key_holders_flooded_release():
    from secure_afl.keyholder.flooding import tail_z

    # Execute
    res = bench.run_protect("ckks", 8, 3, 4, samples=16, seed=1)

    # Assert: the reported error is that of the flooded vector: above the bare decryption's error and
    # above anything a bare decryption could show (its own bound), yet within the flooding's proved bound
    assert res["flooded"] is True and res["exact"] is True
    assert res["max_abs_error_unflooded"] <= res["error_bound_unflooded"]
    assert res["max_abs_error_unflooded"] <= res["max_abs_error"] <= res["error_bound"]
    assert res["max_abs_error"] > res["error_bound_unflooded"]
    # the bound is the flooding's: at least z sigma of the noise on every released entry
    assert res["error_bound"] >= tail_z(res["length"]) * res["flood_sigma"] > 0
    assert res["flood_security"] == SECURITY
    assert res["w_bound"] is None or res["w_bound"] > 0
    assert res["w_rel_error"] >= 0
