"""Peaks: the synthetic 2-D classification problem of Haber & Ruthotto (2017), also used by
Günther et al. (2020) for layer-parallel training (docs/references.md §7).

MATLAB's ``peaks`` function on the square [-3, 3]²::

    f(x, y) = 3(1 − x)² e^{−x² − (y+1)²} − 10(x/5 − x³ − y⁵) e^{−x² − y²} − e^{−(x+1)² − y²}/3

Points p = (x, y) are drawn uniformly from [-3, 3]² (seeded), and labelled by the band of f
they fall in: ``label = #{k : f(p) ≥ e_k}`` for band edges e_1 < … < e_{c−1}.

Band edges (our choice, so that classes are roughly balanced): the k/c-quantiles of f over
the square, i.e. e_k is the value below which a fraction k/c of the AREA lies. They are
computed once on the midpoints of a fixed 400 × 400 grid (independent of the seed and of
the sample), so the labelling rule is a fixed function of p. For c = 5:
e ≈ (−0.3080, 0.0017, 0.1535, 1.3140). A uniform sample then has ≈ 20 % per class.

Shape legend: n points; each sample has input shape (2,).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .dataset import VAL_FRACTION, Dataset, make_dataset

BOX = 3.0  # points live in [-BOX, BOX]²
N_CLASSES = 5  # bands of f, as in Haber & Ruthotto (2017)
EDGE_GRID = 400  # grid points per axis for the area quantiles that define the band edges
N_POINTS = 5000  # default sample size


def peaks(x, y):
    """MATLAB's peaks function f(x, y), element-wise."""
    return (
        3.0 * (1.0 - x) ** 2 * np.exp(-(x**2) - (y + 1.0) ** 2)
        - 10.0 * (x / 5.0 - x**3 - y**5) * np.exp(-(x**2) - y**2)
        - np.exp(-((x + 1.0) ** 2) - y**2) / 3.0
    )


@lru_cache(maxsize=8)
def _band_edges(n_classes: int) -> tuple[float, ...]:
    t = -BOX + 2.0 * BOX * (np.arange(EDGE_GRID) + 0.5) / EDGE_GRID
    X, Y = np.meshgrid(t, t)
    q = np.arange(1, n_classes) / n_classes
    return tuple(float(e) for e in np.quantile(peaks(X, Y), q))


def band_edges(n_classes: int = N_CLASSES) -> np.ndarray:
    """Edges e_1 < … < e_{c−1}: the k/c area-quantiles of f over [-3, 3]² (see module doc)."""
    if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)) or n_classes < 2:
        raise ValueError(f"`n_classes` must be an integer ≥ 2, got {n_classes!r}.")
    return np.array(_band_edges(int(n_classes)))


def peaks_labels(points: np.ndarray, n_classes: int = N_CLASSES) -> np.ndarray:
    """label(p) = #{k : f(p) ≥ e_k} for points (n, 2); returns int64 labels (n,)."""
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != 2:
        raise ValueError(f"`points` must have shape (n, 2), got {points.shape}.")
    f = peaks(points[:, 0], points[:, 1])
    return np.searchsorted(band_edges(n_classes), f, side="right").astype(np.int64)


def sample_peaks(n_points: int, seed: int | np.random.Generator = 0,
                 n_classes: int = N_CLASSES) -> tuple[np.ndarray, np.ndarray]:
    """Raw (un-normalised) sample: points (n, 2) uniform in [-3, 3]² and their labels (n,)."""
    if isinstance(n_points, bool) or not isinstance(n_points, (int, np.integer)) or n_points < 2:
        raise ValueError(f"`n_points` must be an integer ≥ 2, got {n_points!r}.")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    points = rng.uniform(-BOX, BOX, size=(int(n_points), 2))
    return points, peaks_labels(points, n_classes)


def load_peaks(n_points: int = N_POINTS, seed: int = 0, val_fraction: float = VAL_FRACTION,
               n_classes: int = N_CLASSES) -> Dataset:
    """The Peaks data set: ``n_points`` seeded points, split and normalised per feature.

    The same seed gives the same points, labels and split.
    """
    rng = np.random.default_rng(seed)
    points, labels = sample_peaks(n_points, rng, n_classes)
    info = {"box": BOX, "band_edges": band_edges(n_classes).tolist()}
    return make_dataset("peaks", points, labels, n_classes, seed=rng,
                        val_fraction=val_fraction, info=info)
