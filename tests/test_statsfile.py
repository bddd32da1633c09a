"""The one reader of hospital statistics files: round trips and refusals."""

import numpy as np
import pytest

from secure_afl.clients.statsfile import (
    StatisticsFileError,
    load_statistics_file,
    write_embeddings_file,
    write_statistics_file,
)
from secure_afl.exceptions import BoundsExceeded, InvalidInputError
from secure_afl.stats import local_statistics

CLASSES = ["a", "b", "c"]


def _data(seed=0, n=50, d=6, radius=0.9):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X *= (radius * rng.uniform(0.2, 1.0, n) / np.linalg.norm(X, axis=1))[:, None]
    return X, rng.integers(0, len(CLASSES), n)


def _stats_file(path, X, y, **meta):
    meta.setdefault("max_row_norm", float(np.linalg.norm(X, axis=1).max()))
    return write_statistics_file(path, local_statistics(X, y, len(CLASSES)), CLASSES, meta)


def _write(kind, path, X, y):
    """A statistics file, an embeddings file, or a bare X/y archive (what `client submit --embeddings` takes)."""
    if kind == "statistics":
        _stats_file(path, X, y)
    elif kind == "embeddings":
        write_embeddings_file(path, X, y, CLASSES)
    else:
        np.savez(path, X=X, y=y)


@pytest.mark.parametrize("kind", ["statistics", "embeddings", "bare"])
def test_round_trip_of_every_file_kind(tmp_path, kind):
    # Prepare
    X, y = _data()
    path = tmp_path / "f.npz"
    _write(kind, path, X, y)
    # Execute
    st, classes = load_statistics_file(path, n_classes=3, max_norm=1.0, batch_size=7)
    # Assert
    ref = local_statistics(X, y, 3)
    np.testing.assert_allclose(st.gram, X.T @ X, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(st.cross, ref.cross, rtol=1e-12, atol=1e-12)
    assert st.gamma == 0.0 and st.n == 50 and np.array_equal(st.class_counts, ref.class_counts)
    assert classes == (["0", "1", "2"] if kind == "bare" else CLASSES)


@pytest.mark.parametrize("kind", ["statistics", "embeddings"])
def test_rows_over_the_bound_are_refused(tmp_path, kind):
    # Prepare: one row of norm 1.5 for a session with B = 1
    X, y = _data()
    X[7] *= 1.5 / np.linalg.norm(X[7])
    path = tmp_path / "f.npz"
    _write(kind, path, X, y)
    # Execute / Assert
    with pytest.raises(BoundsExceeded, match="B=1.0"):
        load_statistics_file(path, n_classes=3, max_norm=1.0)
    assert load_statistics_file(path, n_classes=3, max_norm=1.5 + 1e-9)[0].n == 50


def test_statistics_file_without_a_recorded_norm_is_refused_under_a_bound(tmp_path):
    X, y = _data()
    write_statistics_file(tmp_path / "f.npz", local_statistics(X, y, 3), CLASSES)
    with pytest.raises(BoundsExceeded, match="records no largest embedding norm"):
        load_statistics_file(tmp_path / "f.npz", n_classes=3, max_norm=1.0)
    assert load_statistics_file(tmp_path / "f.npz", n_classes=3)[0].n == 50


def test_recorded_norm_below_the_real_one_is_refused(tmp_path):
    # Prepare: the file claims every row is within 0.1 while its Gram says otherwise
    X, y = _data(radius=0.9)
    _stats_file(tmp_path / "f.npz", X, y, max_row_norm=0.1)
    # Execute / Assert
    with pytest.raises(StatisticsFileError, match="trace"):
        load_statistics_file(tmp_path / "f.npz", n_classes=3, max_norm=1.0)


@pytest.mark.parametrize("kind", ["statistics", "embeddings", "bare"])
def test_wrong_class_count_is_refused(tmp_path, kind):
    X, y = _data()
    path = tmp_path / "f.npz"
    _write(kind, path, X, y)
    with pytest.raises(InvalidInputError, match="3 classes; the session has 2" if kind != "bare" else "labels"):
        load_statistics_file(path, n_classes=2)


def _corrupt(tmp_path, how):
    X, y = _data()
    path = tmp_path / "f.npz"
    good = tmp_path / "good.npz"
    _stats_file(good, X, y)
    z = dict(np.load(good, allow_pickle=False))
    if how == "truncated":
        path.write_bytes(good.read_bytes()[:200])
    elif how == "not_npz":
        path.write_bytes(b"this is not an archive")
    elif how == "missing_cross":
        del z["cross"]
        np.savez(path, **z)
    elif how == "nan":
        z["gram"][0, 0] = np.nan
        np.savez(path, **z)
    elif how == "asymmetric":
        z["gram"][0, 1] += 1.0
        np.savez(path, **z)
    elif how == "counts":
        z["counts"][0] += 1
        np.savez(path, **z)
    elif how == "shape":
        z["cross"] = z["cross"][:, :2]
        np.savez(path, **z)
    elif how == "text":
        z["gram"] = np.full(z["gram"].shape, "x")
        np.savez(path, **z)
    return path


@pytest.mark.parametrize("how", ["truncated", "not_npz", "missing_cross", "nan", "asymmetric", "counts",
                                 "shape", "text"])
def test_corrupt_statistics_files_are_refused(tmp_path, how):
    path = _corrupt(tmp_path, how)
    with pytest.raises(StatisticsFileError) as err:
        load_statistics_file(path, n_classes=3, max_norm=1.0)
    assert err.value.reason == "bad_statistics_file"


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(StatisticsFileError) as err:
        load_statistics_file(tmp_path / "nope.npz")
    # a missing input file is bad input (exit 3), not the server's "no such session" (exit 4)
    from secure_afl.exceptions import EXIT_INPUT, exit_code

    assert err.value.reason == "bad_statistics_file" and exit_code(err.value) == EXIT_INPUT
    assert "no such file" in str(err.value)


@pytest.mark.parametrize("how", ["nan", "labels", "float_labels", "missing_y"])
def test_corrupt_embeddings_files_are_refused(tmp_path, how):
    X, y = _data()
    arrays = {"X": X, "y": y, "classes": np.asarray(CLASSES)}
    if how == "nan":
        arrays["X"][3, 1] = np.nan
    elif how == "labels":
        arrays["y"][0] = 3
    elif how == "float_labels":
        arrays["y"] = y + 0.5
    else:
        del arrays["y"]
    np.savez(tmp_path / "f.npz", **arrays)
    with pytest.raises(StatisticsFileError):
        load_statistics_file(tmp_path / "f.npz", n_classes=3)
