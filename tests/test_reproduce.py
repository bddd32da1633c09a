import json

import pytest

from secure_afl.cli import main
from secure_afl_tools.reproduce import table_a1


@pytest.mark.slow  # d = 512, N = 10,000: minutes on two cores
def test_table_a1_small_k_with_and_without_ri():
    # K = 10 (N_k = 1000 >= d) and K = 50 (N_k = 200 < d = 512)
    res = table_a1((10, 50), runs=1)
    assert all(v <= 1e-9 for v in res["delta_with_ri"])
    assert all(v <= 1e-9 for v in res["delta_sum_form"])
    assert res["delta_without_ri"][0] <= 1e-9
    assert res["delta_without_ri"][1] > 1.0  # explodes once N_k < d, as in the paper


def test_reproduce_cli_writes_json(tmp_path, capsys):
    out = tmp_path / "a1.json"
    rc = main(["reproduce", "dummy", "--K", "2", "--json", str(out)])
    data = json.loads(out.read_text())
    assert rc == 0
    assert data["K"] == [2] and len(data["delta_with_ri"]) == 1 and len(data["delta_without_ri"]) == 1
    assert "Table A.1" in capsys.readouterr().out
