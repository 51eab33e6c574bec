"""Data sets for training: Peaks (synthetic, the default), scikit-learn's digits, MNIST (IDX).

Every loader returns a :class:`Dataset` (already checked, split with a seed and normalised;
see :mod:`refbraid.data.dataset`). :func:`load_dataset` is the one entry point by name.

=======  ==================  ============  ========================================
name     samples             input shape   source
=======  ==================  ============  ========================================
peaks    ``n_samples`` 5000  (2,)          generated from the seed (peaks.py)
digits   1,797               (1, 8, 8)     ``sklearn.datasets.load_digits`` (offline)
mnist    60,000              (1, 28, 28)   IDX files in ``data_dir`` (mnist_idx.py)
voxels   ``n_samples`` 800   (1,16,16,16)  generated 3-D shapes, 4 classes (voxels.py)
seq-*    ``n_samples`` 2000  (L, I), (T,)  generated sequence tasks (sequences.py)
lm-*     ``n_samples`` 2000  (T,)          generated language, next-token (language.py)
=======  ==================  ============  ========================================
"""

from __future__ import annotations

import os

from .dataset import VAL_FRACTION, Dataset, make_dataset
from .digits import load_digits_dataset
from .language import LANGUAGE_SETS, load_language_task
from .mnist_idx import load_mnist, read_idx, write_idx
from .peaks import N_POINTS, load_peaks, peaks, peaks_labels
from .sequences import SEQUENCE_SETS, TokenDataset, load_sequence_task
from .voxels import load_voxels

DATASETS = ("peaks", "digits", "mnist", "voxels", *SEQUENCE_SETS, *LANGUAGE_SETS)


def load_dataset(name: str, *, data_dir: str | os.PathLike | None = None,
                 n_samples: int | None = None, seed: int = 0,
                 val_fraction: float = VAL_FRACTION) -> Dataset:
    """Load the data set called ``name`` (one of :data:`DATASETS`).

    ``n_samples``: Peaks sample size (default 5000), voxels sample size (default 800, at
    16³; refbraid.data.voxels.load_voxels for other sizes), or a seeded subset of digits/MNIST
    (default: all). ``data_dir``: the folder with the MNIST IDX files.
    """
    if name == "peaks":
        return load_peaks(N_POINTS if n_samples is None else n_samples, seed, val_fraction)
    if name == "digits":
        return load_digits_dataset(n_samples, seed, val_fraction)
    if name == "mnist":
        if data_dir is None:
            raise ValueError("`data_dir` is required for the 'mnist' data set (a folder with "
                             "train-images-idx3-ubyte and train-labels-idx1-ubyte).")
        return load_mnist(data_dir, n_samples, seed, val_fraction)
    if name == "voxels":
        return load_voxels(n_samples, seed, val_fraction)
    if name in SEQUENCE_SETS:
        return load_sequence_task(name, n_samples, seed, val_fraction)
    if name in LANGUAGE_SETS:
        return load_language_task(name, n_samples, seed, val_fraction)
    raise ValueError(f"`data` must be one of {DATASETS}, got {name!r}.")


__all__ = [
    "DATASETS",
    "Dataset",
    "TokenDataset",
    "load_dataset",
    "load_digits_dataset",
    "load_mnist",
    "load_peaks",
    "load_sequence_task",
    "load_voxels",
    "make_dataset",
    "peaks",
    "peaks_labels",
    "read_idx",
    "write_idx",
]
