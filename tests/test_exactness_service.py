"""Through the real service: split, secagg and bfv release the same aggregate on ill-conditioned data (n < d, so
C is singular and W is the minimum-norm solve), and each key holder -- the real `keyholder finalize` command,
each run with another BLAS thread count -- writes the same W, bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from secure_afl.keyholder import read_model
from secure_afl.session.signed import load_signed

from support.flower import submit_all

pytestmark = [pytest.mark.e2e]

HOSPITALS = ("h1", "h2", "h3")
DIM = 256


def _data(c) -> dict:
    """60 rows per hospital, 180 in all, in d = 256 (C singular), spread over three decades: a size at which
    the eigendecomposition's result depends on the BLAS thread count unless the solve pins it."""
    rng = np.random.default_rng(5)
    out = {}
    for h in HOSPITALS:
        X = rng.standard_normal((60, DIM)) * np.logspace(0, -3, DIM)
        X *= 0.9 * c.max_norm / np.max(np.linalg.norm(X, axis=1))
        out[h] = (X, rng.integers(0, c.classes, 60))
    return out


def _finalize(c, out_dir, threads: int):
    (out_dir / "pass").write_text("test passphrase\n")
    (out_dir / "pass").chmod(0o600)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads)}
    run = subprocess.run([sys.executable, "-m", "secure_afl.cli", "keyholder", "finalize", "--pki", str(c.pki_dir),
                          "--keys", str(c.root / "keys"), "--server", c.url, "--session", c.session_id,
                          "--min-clients", "2", "--out", str(out_dir / "model.safetensors"),
                          "--report", str(out_dir / "report.json"), "--passphrase-file", str(out_dir / "pass")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    W, _ = read_model(out_dir / "model.safetensors")
    return W, json.loads((out_dir / "report.json").read_text())


def test_w_is_bit_for_bit_the_same_across_split_secagg_and_bfv_through_the_service(consortium, tmp_path):
    # Prepare / Execute: one consortium per backend on the same data, each released by the real finalize command
    Ws = {}
    for backend, threads in (("split", 1), ("secagg", 2), ("bfv", 4)):
        c = consortium(backend=backend, hospitals=HOSPITALS, min_clients=2, dim=DIM,
                       extra_session={"min_class_count": 1})
        c.start()
        if backend in ("split", "bfv"):
            c.keyholder.keygen(load_signed(c.pki_dir, c.session_id).session_params())
            with c.connect_keyholder() as conn:
                c.keyholder.publish(conn)
        submit_all(c, _data(c))
        out = tmp_path / backend
        out.mkdir()
        Ws[backend], report = _finalize(c, out, threads)
        assert report["participants"] == list(HOSPITALS) and report["samples"] == 180
        c.stop()
    # Assert: one W, to the last bit
    assert np.array_equal(Ws["split"], Ws["secagg"]) and np.array_equal(Ws["split"], Ws["bfv"])
    assert np.all(np.isfinite(Ws["split"])) and np.linalg.norm(Ws["split"]) > 0
