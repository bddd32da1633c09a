"""A statistics file belongs to the hospital it was made for, an upload is final, and no hospital command
replaces a file it did not write: each through the real ``secure-afl`` command (and a real server process)."""

from __future__ import annotations

import numpy as np
import pytest

from secure_afl.clients.statsfile import read_metadata, write_statistics_file
from secure_afl.exceptions import EXIT_INPUT, EXIT_REFUSED
from support.cli import FAST_S, one_line, run_cli, submit_args

e2e = pytest.mark.e2e


def _file_for(c, name: str, made_for: str, path, seed=None):
    """``name``'s statistics as ``client embed --name MADE_FOR`` records them."""
    X, y = c.data(name, seed=seed)
    return write_statistics_file(path, c.stats(X, y), [f"class-{i}" for i in range(c.classes)],
                                 metadata={"max_row_norm": float(np.linalg.norm(X, axis=1).max()),
                                           "hospital": made_for, "source_path": f"/data/{made_for}/images"})


@e2e
def test_another_hospitals_file_is_refused_by_name_and_a_second_upload_is_final(consortium, tmp_path):
    # Prepare: a running plain session; hosp h2's file in h1's hands, and h1's own
    c = consortium(backend="plain", hospitals=("h1", "h2"), min_clients=2).start()
    theirs = _file_for(c, "h2", "h2", tmp_path / "h2.npz")
    mine = _file_for(c, "h1", "h1", tmp_path / "h1.npz")
    corrected = _file_for(c, "h1", "h1", tmp_path / "h1-corrected.npz", seed=9)

    # Execute: h1 submits h2's file, then its own, then a corrected one
    wrong, took = run_cli(*submit_args(c, "h1", theirs))
    first, _ = run_cli(*submit_args(c, "h1", mine))
    second, _ = run_cli(*submit_args(c, "h1", corrected))

    # Assert: the wrong file named with whom it was made for, before anything was sent; the second upload
    # refused saying that uploads are final and what to do
    line = one_line(wrong, EXIT_INPUT, "other_hospital")
    assert f"{theirs} was made for hospital h2 from /data/h2/images, not for h1" in line and took < FAST_S
    assert first.returncode == 0, first.stderr
    line = one_line(second, EXIT_REFUSED, "duplicate")
    assert "uploads are final: the first one stands and is in the sum" in line
    assert "a corrected file can only go into a new session" in line
    with c.connect_keyholder() as conn:
        assert len(conn.status()["uploaded"]) == 1


@e2e
def test_embed_predict_refuse_an_existing_output_and_embed_records_the_hospital(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from PIL import Image

    # Prepare: a tiny image folder, and a statistics file already at the output path (perhaps submitted)
    rng = np.random.default_rng(3)
    for cls in ("a", "b"):
        (tmp_path / "images" / cls).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(
                tmp_path / "images" / cls / f"{i}.png")
    out = tmp_path / "stats.npz"
    out.write_bytes(b"the file already submitted")
    embed = ["client", "embed", "--images", tmp_path / "images", "--backbone", "resnet18", "--weights", "random",
             "--seed", 1, "--workers", 0, "--no-progress", "--name", "hosp-a", "--stats-only", out]

    # Execute: embed onto it, then with --force; predict onto an existing --out
    refused, took = run_cli(*embed)
    forced, _ = run_cli(*embed, "--force")
    csv = tmp_path / "predictions.csv"
    csv.write_text("kept")
    pred, _ = run_cli("predict", "--model", tmp_path / "no-model-needed.safetensors", "--embeddings", out,
                      "--out", csv)

    # Assert: refused by name before the backbone loaded; with --force written, recording hospital and source
    line = one_line(refused, EXIT_INPUT, "output_exists")
    assert f"--stats-only {out} already exists" in line and "--force" in line and took < FAST_S
    assert forced.returncode == 0, forced.stderr
    meta = read_metadata(out)
    assert meta["hospital"] == "hosp-a" and meta["source_path"] == str((tmp_path / "images").resolve())
    line = one_line(pred, EXIT_INPUT, "output_exists")
    assert f"--out {csv} already exists" in line and csv.read_text() == "kept"
