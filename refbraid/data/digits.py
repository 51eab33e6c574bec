"""Handwritten digits from scikit-learn (``sklearn.datasets.load_digits``, docs/references.md §7):
1,797 grey-scale 8 × 8 images of the digits 0–9, shipped inside scikit-learn (works offline).

Pixels are integers 0–16; they are scaled to [0, 1] and then normalised with ONE scalar
mean and standard deviation of the training images, ``x ← (x/16 − μ) / s``.

Shape legend: n images; each sample has input shape (1, 8, 8) (channels, height, width).
"""

from __future__ import annotations

import numpy as np

from .dataset import VAL_FRACTION, Dataset, make_dataset

PIXEL_MAX = 16.0  # load_digits stores pixels as integers 0..16
INSTALL_HINT = "pip install 'refbraid[data]'  (or: pip install scikit-learn)"


def _load_digits_raw():
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"the 'digits' data set needs scikit-learn, which is not installed; install the "
            f"extra with: {INSTALL_HINT}"
        ) from err
    bunch = load_digits()
    return np.asarray(bunch.images, dtype=np.float64), np.asarray(bunch.target, dtype=np.int64)


def load_digits_dataset(n_samples: int | None = None, seed: int = 0,
                        val_fraction: float = VAL_FRACTION) -> Dataset:
    """The digits data set as (1, 8, 8) images; ``n_samples`` keeps a seeded subset."""
    images, labels = _load_digits_raw()
    rng = np.random.default_rng(seed)
    if n_samples is not None:
        if isinstance(n_samples, bool) or not isinstance(n_samples, (int, np.integer)) \
                or not 2 <= n_samples:
            raise ValueError(f"`n_samples` must be an integer ≥ 2, got {n_samples!r}.")
        keep = np.sort(rng.permutation(images.shape[0])[: int(n_samples)])
        images, labels = images[keep], labels[keep]
    x = images[:, None, :, :] / PIXEL_MAX  # n,1,8,8
    return make_dataset("digits", x, labels, 10, seed=rng, val_fraction=val_fraction,
                        image=True, info={"pixel_max": PIXEL_MAX})
