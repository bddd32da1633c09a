"""The set-up the in-process attacks share: a small layout (d = 6, C = 3), bounds, embeddings, a hospital's
packed vector as the client builds it, and the curious server's reading of a plain upload."""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from secure_afl.envelope import peek_header
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.params import SessionParams
from secure_afl.stats import SufficientStatistics, local_statistics


DIM, CLASSES, GAMMA = 6, 3, 1.0


def attack_bounds():
    return Bounds(max_norm=2.0, n_max=200, k_max=8)


def attack_layout():
    return Layout(DIM, CLASSES)


def embeddings(rng: np.random.Generator, n: int, labels=None):
    """n rows of norm <= 1.5 (inside B = 2) and labels in [0, CLASSES)."""
    X = rng.standard_normal((n, DIM))
    X *= (rng.uniform(0.3, 1.5, n) / np.linalg.norm(X, axis=1))[:, None]
    y = rng.integers(0, CLASSES, n) if labels is None else np.asarray(labels, dtype=np.int64)
    return X, y


def packed_vector(X, y):
    """The hospital's packed vector exactly as HospitalClient.protect builds it."""

    s = local_statistics(X, y, CLASSES)
    with_ri = SufficientStatistics(s.gram + GAMMA * np.eye(DIM), s.cross, s.n, s.class_counts, 1.0, GAMMA)
    return attack_layout().pack(with_ri)


def plain_params(session_id: str):
    return SessionParams(session_id, "plain", attack_layout(), GAMMA, attack_bounds())


def read_plain_payload(payload: bytes):
    """What the curious server does with a plain upload: parse it (no key needed)."""

    v = np.frombuffer(peek_header(payload).body, dtype="<f8").astype(np.float64)
    return attack_layout().unpack(v, gamma=GAMMA)


def singleton_from_stats(stats, cls: int):
    """x = Q[:, c] for a class with one sample; with n_k = 1 also C = x x^T."""
    return stats.cross[:, cls].copy()


@contextmanager
def workdir(work):
    if work is not None:
        Path(work).mkdir(parents=True, exist_ok=True)
        yield Path(work)
        return
    d = Path(tempfile.mkdtemp(prefix="secure-afl-attack-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def say(verbose: bool, line: str) -> None:
    if verbose:
        print(line)


def seal_body(payload: bytes) -> bytes:
    from secure_afl.envelope import peek_header

    return peek_header(payload).body


def untagged(lay, v):
    out = v.copy()
    out[lay.slices["tag"]] = 0.0
    return out


def fresh_keyholder(kh, pki_dir, d: Path, label: str):
    """A copy of the key holder's state per try, so a block from one try does not hide another's guard."""
    from secure_afl.keyholder import KeyHolder

    copy = d / f"keys-{label}"
    shutil.copytree(kh.keys_dir, copy)
    return KeyHolder(pki_dir, "keyholder", copy, passphrase=kh.passphrase)
