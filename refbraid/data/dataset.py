"""The `Dataset` record every loader returns, and the shared preparation steps.

Preparation, in order (each loader calls :func:`make_dataset`)::

    check      every array finite, labels integers in [0, n_classes)
    split      a seeded permutation π of the n samples; the first n_val = round(f·n)
               of π are validation, the rest training (f = ``val_fraction``)
    normalise  x ← (x − μ) / s with μ, s from the TRAINING part only:
               per feature for vector data (shape (K,)), one scalar for images
               (shape (C, H, W)), so a picture stays a picture

Shape legend: n samples, K features, C channels, H height, W width; ``input_shape`` is one
sample's shape, (K,) or (C, H, W).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

VAL_FRACTION = 0.2  # default share of the samples held out for validation
STD_FLOOR = 1e-12  # standard deviations below this are treated as 1 (a constant feature)


@dataclass(frozen=True)
class Dataset:
    """A classification data set, already split and normalised.

    ``x_*`` has shape ``(n, *input_shape)`` and ``y_*`` shape (n,) with integer labels in
    [0, n_classes). ``mean`` and ``std`` are the normalisation constants (broadcastable to
    one sample) so new raw inputs can be mapped with :meth:`normalise`; ``info`` holds
    loader-specific facts (e.g. the Peaks band edges).
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    n_classes: int
    input_shape: tuple[int, ...]
    mean: np.ndarray
    std: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        for part in ("train", "val"):
            x, y = getattr(self, f"x_{part}"), getattr(self, f"y_{part}")
            if tuple(x.shape[1:]) != tuple(self.input_shape):
                raise ValueError(
                    f"data set {self.name!r}: `x_{part}` must have shape (n, "
                    f"{', '.join(map(str, self.input_shape))}), got {x.shape}."
                )
            if y.shape != (x.shape[0],):
                raise ValueError(
                    f"data set {self.name!r}: `y_{part}` must have shape ({x.shape[0]},), "
                    f"got {y.shape}."
                )
            check_finite(self.name, f"x_{part}", x)
            check_labels(self.name, f"y_{part}", y, self.n_classes)

    @property
    def n_train(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def n_val(self) -> int:
        return int(self.x_val.shape[0])

    def normalise(self, x_raw: np.ndarray) -> np.ndarray:
        """Map raw inputs ``(n, *input_shape)`` the way the stored ones were: (x − μ) / s."""
        return (np.asarray(x_raw, dtype=self.x_train.dtype) - self.mean) / self.std

    def astype(self, dtype) -> Dataset:
        """The same data set with inputs (and normalisation constants) in ``dtype``."""
        dtype = np.dtype(dtype)
        return Dataset(
            self.name, self.x_train.astype(dtype), self.y_train, self.x_val.astype(dtype),
            self.y_val, self.n_classes, self.input_shape, self.mean.astype(dtype),
            self.std.astype(dtype), dict(self.info),
        )


# ----------------------------------------------------------------------------- checks
def check_finite(name: str, array_name: str, x: np.ndarray) -> None:
    """Raise ValueError naming the data set and array if ``x`` holds NaN or inf."""
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.number):
        raise TypeError(f"data set {name!r}: `{array_name}` must be numeric, got dtype {x.dtype}.")
    if np.issubdtype(x.dtype, np.floating) and not np.all(np.isfinite(x)):
        bad = np.argwhere(~np.isfinite(x))[0]
        raise ValueError(
            f"data set {name!r}: `{array_name}` holds {int(np.sum(~np.isfinite(x)))} NaN/inf "
            f"value(s), the first at index {tuple(int(i) for i in bad)}."
        )


def check_labels(name: str, array_name: str, y: np.ndarray, n_classes: int) -> None:
    """Raise if labels are not integers in [0, n_classes)."""
    if not np.issubdtype(np.asarray(y).dtype, np.integer):
        raise TypeError(
            f"data set {name!r}: `{array_name}` must hold integer labels, got dtype {y.dtype}."
        )
    if y.size and (int(y.min()) < 0 or int(y.max()) >= n_classes):
        raise ValueError(
            f"data set {name!r}: `{array_name}` must lie in [0, {n_classes}), got range "
            f"[{int(y.min())}, {int(y.max())}]."
        )


def check_val_fraction(val_fraction: float) -> float:
    if not (isinstance(val_fraction, (int, float)) and 0.0 < val_fraction < 1.0):
        raise ValueError(f"`val_fraction` must be a number in (0, 1), got {val_fraction!r}.")
    return float(val_fraction)


# ----------------------------------------------------------------------------- preparation
def split_indices(n: int, val_fraction: float, rng: np.random.Generator):
    """Seeded split: (train indices, validation indices), both non-empty."""
    check_val_fraction(val_fraction)
    if n < 2:
        raise ValueError(f"a data set needs at least 2 samples to split, got {n}.")
    n_val = min(max(1, round(val_fraction * n)), n - 1)
    perm = rng.permutation(n)
    return perm[n_val:], perm[:n_val]


def make_dataset(
    name: str,
    x: np.ndarray,
    y: np.ndarray,
    n_classes: int,
    *,
    seed: int | np.random.Generator = 0,
    val_fraction: float = VAL_FRACTION,
    image: bool = False,
    info: dict[str, Any] | None = None,
) -> Dataset:
    """Check, split (seeded) and normalise raw samples x ``(n, *input_shape)``, labels y (n,).

    μ, s come from the training part: per feature for vectors, one scalar when ``image``.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y)
    if x.ndim < 2 or y.shape != (x.shape[0],):
        raise ValueError(
            f"data set {name!r}: need x of shape (n, ...) and y of shape (n,), got {x.shape} "
            f"and {y.shape}."
        )
    check_finite(name, "x", x)
    check_labels(name, "y", y, n_classes)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    train, val = split_indices(x.shape[0], val_fraction, rng)
    x_train, x_val = x[train], x[val]
    axes = tuple(range(x.ndim)) if image else (0,)
    mean = x_train.mean(axis=axes, keepdims=True)[0]  # one sample's shape (or 1s)
    std = x_train.std(axis=axes, keepdims=True)[0]
    std = np.where(std < STD_FLOOR, 1.0, std)
    return Dataset(
        name=name,
        x_train=(x_train - mean) / std,
        y_train=y[train].astype(np.int64),
        x_val=(x_val - mean) / std,
        y_val=y[val].astype(np.int64),
        n_classes=int(n_classes),
        input_shape=tuple(int(s) for s in x.shape[1:]),
        mean=mean,
        std=std,
        info=dict(info or {}),
    )
