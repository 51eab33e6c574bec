"""Data sets: Peaks determinism and labelling, digits, the IDX reader/writer, the MNIST loader,
splitting, normalisation and input validation."""

from __future__ import annotations

import builtins
import gzip
import math

import numpy as np
import pytest

from refbraid.data import DATASETS, load_dataset, load_mnist, make_dataset, read_idx, write_idx
from refbraid.data.dataset import Dataset
from refbraid.data.peaks import band_edges, load_peaks, peaks, peaks_labels, sample_peaks


# ----------------------------------------------------------------------------- peaks
def test_peaks_function_matches_the_formula_at_hand_picked_points():
    # f(0,0) = 3 e^{-1} - 0 - e^{-1}/3;  f(1, 0) = 0 - 10(0.2 - 1) e^{-1} - e^{-4}/3
    assert peaks(0.0, 0.0) == pytest.approx((3 - 1 / 3) * math.exp(-1), rel=1e-14)
    assert peaks(1.0, 0.0) == pytest.approx(8 * math.exp(-1) - math.exp(-4) / 3, rel=1e-14)
    x, y = 0.3, -1.7
    expected = (3 * (1 - x) ** 2 * math.exp(-x * x - (y + 1) ** 2)
                - 10 * (x / 5 - x**3 - y**5) * math.exp(-x * x - y * y)
                - math.exp(-(x + 1) ** 2 - y * y) / 3)
    assert peaks(x, y) == pytest.approx(expected, rel=1e-14)


def test_peaks_band_edges_are_area_quantiles_and_classes_are_balanced():
    edges = band_edges(5)
    assert edges.shape == (4,) and np.all(np.diff(edges) > 0)
    # an independent estimate of the area quantiles: a large uniform sample
    pts = np.random.default_rng(123).uniform(-3, 3, size=(200_000, 2))
    f = peaks(pts[:, 0], pts[:, 1])
    frac_below = [(f < e).mean() for e in edges]
    np.testing.assert_allclose(frac_below, [0.2, 0.4, 0.6, 0.8], atol=0.01)
    counts = np.bincount(peaks_labels(pts), minlength=5) / len(pts)
    np.testing.assert_allclose(counts, 0.2, atol=0.01)


def test_peaks_labels_count_the_edges_below_the_value():
    edges = band_edges(5)
    pts = np.random.default_rng(0).uniform(-3, 3, size=(500, 2))
    f = peaks(pts[:, 0], pts[:, 1])
    expected = np.array([sum(v >= e for e in edges) for v in f])
    np.testing.assert_array_equal(peaks_labels(pts), expected)


def test_peaks_is_deterministic_from_the_seed():
    a, b, c = load_peaks(300, seed=4), load_peaks(300, seed=4), load_peaks(300, seed=5)
    for name in ("x_train", "y_train", "x_val", "y_val"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.x_train, c.x_train)


def test_peaks_shapes_split_and_normalisation():
    d = load_peaks(1000, seed=1, val_fraction=0.25)
    assert d.name == "peaks" and d.n_classes == 5 and d.input_shape == (2,)
    assert d.x_train.shape == (750, 2) and d.x_val.shape == (250, 2)
    assert d.y_train.dtype == np.int64
    np.testing.assert_allclose(d.x_train.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(d.x_train.std(axis=0), 1.0, rtol=1e-12)
    # train ∪ val is exactly the raw sample, without overlap, and labels follow the points
    raw = np.concatenate([d.x_train, d.x_val]) * d.std + d.mean
    labels = np.concatenate([d.y_train, d.y_val])
    pts, lab = sample_peaks(1000, np.random.default_rng(1))
    order_a, order_b = np.lexsort(raw.T), np.lexsort(pts.T)
    np.testing.assert_allclose(raw[order_a], pts[order_b], atol=1e-12)
    np.testing.assert_array_equal(labels[order_a], lab[order_b])
    # normalise() maps new raw points the same way
    np.testing.assert_allclose(d.normalise(raw[:5]), np.concatenate([d.x_train, d.x_val])[:5],
                               atol=1e-12)


def test_load_dataset_by_name_and_errors():
    assert DATASETS[:4] == ("peaks", "digits", "mnist", "voxels")
    assert all(name.startswith(("seq-", "lm-")) for name in DATASETS[4:])
    assert load_dataset("peaks", n_samples=50).n_train == 40
    with pytest.raises(ValueError, match="`data` must be one of"):
        load_dataset("cifar")
    with pytest.raises(ValueError, match="`data_dir` is required"):
        load_dataset("mnist")
    with pytest.raises(ValueError, match="`n_points`"):
        load_peaks(1)
    with pytest.raises(ValueError, match="`val_fraction`"):
        load_peaks(100, val_fraction=1.0)


# ----------------------------------------------------------------------------- digits
def test_digits_shapes_and_scalar_normalisation():
    pytest.importorskip("sklearn")
    d = load_dataset("digits", seed=0)
    assert d.input_shape == (1, 8, 8) and d.n_classes == 10
    assert d.n_train + d.n_val == 1797
    assert d.mean.shape == (1, 1, 1) and d.std.shape == (1, 1, 1)  # one scalar for images
    assert abs(d.x_train.mean()) < 1e-12 and d.x_train.std() == pytest.approx(1.0)
    sub = load_dataset("digits", n_samples=100, seed=3)
    assert sub.n_train + sub.n_val == 100
    np.testing.assert_array_equal(sub.x_train, load_dataset("digits", n_samples=100,
                                                            seed=3).x_train)


def test_digits_without_scikit_learn_names_the_extra(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name.startswith("sklearn"):
            raise ImportError("No module named 'sklearn'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match=r"refbraid\[data\]"):
        load_dataset("digits")


# ----------------------------------------------------------------------------- IDX / MNIST
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_round_trip(tmp_path, dtype, suffix):
    rng = np.random.default_rng(0)
    a = (rng.uniform(-100, 100, size=(3, 4, 5)) if np.dtype(dtype).kind == "f"
         else rng.integers(0, 100, size=(3, 4, 5))).astype(dtype)
    path = tmp_path / f"a.idx{suffix}"
    write_idx(path, a)
    b = read_idx(path)
    assert b.dtype == a.dtype and b.shape == a.shape
    np.testing.assert_array_equal(a, b)


def test_idx_header_is_the_documented_big_endian_layout(tmp_path):
    path = tmp_path / "labels"
    write_idx(path, np.array([7, 1, 255], dtype=np.uint8))
    raw = path.read_bytes()
    assert raw == bytes([0, 0, 0x08, 1, 0, 0, 0, 3, 7, 1, 255])


def test_idx_rejects_bad_files(tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x01\x02\x03\x04rest")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(bad)
    short = tmp_path / "short"
    write_idx(short, np.zeros((4, 3), np.uint8))
    short.write_bytes(short.read_bytes()[:-2])
    with pytest.raises(ValueError, match="corrupt"):
        read_idx(short)
    with pytest.raises(TypeError, match="IDX type code"):
        write_idx(tmp_path / "x", np.zeros(3, dtype=np.complex64))


def _write_tiny_mnist(folder, n=30, gz=False, H=6, W=5):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(n, H, W)).astype(np.uint8)
    labels = (np.arange(n) % 10).astype(np.uint8)
    suffix = ".gz" if gz else ""
    write_idx(folder / f"train-images-idx3-ubyte{suffix}", images)
    write_idx(folder / f"train-labels-idx1-ubyte{suffix}", labels)
    return images, labels


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_loader_reads_a_generated_folder(tmp_path, gz):
    images, labels = _write_tiny_mnist(tmp_path, gz=gz)
    if gz:  # really gzip-compressed
        with gzip.open(tmp_path / "train-labels-idx1-ubyte.gz") as fh:
            assert fh.read(4) == bytes([0, 0, 8, 1])
    d = load_dataset("mnist", data_dir=tmp_path, seed=0)
    assert d.input_shape == (1, 6, 5) and d.n_classes == 10 and d.n_train + d.n_val == 30
    raw = np.concatenate([d.x_train, d.x_val]) * d.std + d.mean  # back to [0, 1] pixels
    np.testing.assert_allclose(np.sort(raw.ravel() * 255), np.sort(images.ravel().astype(float)),
                               atol=1e-9)
    assert sorted(np.concatenate([d.y_train, d.y_val]).tolist()) == sorted(labels.tolist())
    assert load_mnist(tmp_path, n_samples=10).n_train == 8


def test_mnist_missing_files_are_listed(tmp_path):
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte.*train-labels-idx1-ubyte"):
        load_mnist(tmp_path)
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((2, 3, 3), np.uint8))
    with pytest.raises(FileNotFoundError) as err:
        load_mnist(tmp_path)
    assert "train-labels-idx1-ubyte" in str(err.value)
    assert "train-images" not in str(err.value)
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        load_mnist(tmp_path / "nowhere")


def test_mnist_label_count_mismatch(tmp_path):
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((4, 3, 3), np.uint8))
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(3, np.uint8))
    with pytest.raises(ValueError, match="labels for 4 images"):
        load_mnist(tmp_path)


# ----------------------------------------------------------------------------- validation
def test_nan_and_inf_name_the_data_set_and_array():
    x = np.random.default_rng(0).normal(size=(20, 3))
    y = np.arange(20) % 2
    x[7, 1] = np.nan
    with pytest.raises(ValueError, match=r"data set 'toy': `x` holds 1 NaN/inf.*\(7, 1\)"):
        make_dataset("toy", x, y, 2)
    d = make_dataset("toy", np.ones((20, 3)) * np.arange(3), y, 2)
    bad_val = d.x_val.copy()
    bad_val[0, 0] = np.inf
    with pytest.raises(ValueError, match=r"data set 'toy': `x_val`"):
        Dataset("toy", d.x_train, d.y_train, bad_val, d.y_val, 2, (3,), d.mean, d.std)


def test_labels_and_shapes_are_checked():
    x = np.zeros((10, 2))
    with pytest.raises(ValueError, match=r"`y` must lie in \[0, 2\)"):
        make_dataset("toy", x, np.arange(10), 2)
    with pytest.raises(TypeError, match="integer labels"):
        make_dataset("toy", x, np.zeros(10), 2)
    with pytest.raises(ValueError, match="shape"):
        make_dataset("toy", x, np.zeros(9, int), 2)


def test_constant_features_do_not_divide_by_zero():
    x = np.c_[np.zeros(10), np.arange(10.0)]
    d = make_dataset("toy", x, np.arange(10) % 2, 2)
    assert np.all(np.isfinite(d.x_train)) and d.std[0] == 1.0
