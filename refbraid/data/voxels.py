"""Voxels: generated 3-D shapes to classify, a laptop-sized twin of the ModelNet experiment of
the TorchBraid paper (ModelNet cannot be downloaded here).

Four classes, each a solid given by a signed distance ``d(q)`` (< 0 inside) in its own frame::

    0 sphere    d = |q| − ρ
    1 box       d = max_k (|q_k| − a_k)                     (half-widths a, aspect ≤ 2)
    2 cylinder  d = max(√(q_x² + q_y²) − ρ, |q_z| − a)       (radius ρ, half-height a)
    3 torus     d = √((√(q_x² + q_y²) − R)² + q_z²) − ρ      (ring radius R, tube ρ < R)

A sample draws a random pose — a uniformly random rotation Q (QR of a Gaussian matrix, signs
fixed), a centre c within ±``CENTRE_SHIFT`` of the middle — and a random scale (the sizes above
as fractions of the box, within ``SIZE_RANGE``), all from the seed. Voxel centres p of an
n×n×n grid on [−1, 1]³ map to q = Qᵀ(p − c); the occupancy is anti-aliased over one voxel,
``v = clip(1/2 − d/Δ, 0, 1)`` with Δ = 2/n the voxel width, plus ``noise``·N(0, 1). Labels
are balanced (sample i has class i mod 4, then the samples are shuffled with the seed).

Shape legend: n voxels per axis (16–32); each sample has input shape (1, n, n, n) (channels,
depth, height, width), ready for the 3-D conv layers (refbraid.layers.conv3d).
"""

from __future__ import annotations

import numpy as np

from ..layers.init import check_positive_int
from .dataset import VAL_FRACTION, Dataset, make_dataset

CLASSES = ("sphere", "box", "cylinder", "torus")
SIZES = (16, 32)  # smallest and largest grid edge, voxels
DEFAULT_SIZE = 16
N_SAMPLES = 800  # default sample size (200 a class)
CENTRE_SHIFT = 0.15  # shape centres within ±0.15 of the middle (the box is [−1, 1]³)
SIZE_RANGE = (0.5, 0.8)  # the largest extent of a shape, a fraction of the half-box
NOISE = 0.05  # default standard deviation of the added Gaussian noise


def random_rotation(rng: np.random.Generator) -> np.ndarray:
    """A uniformly distributed 3×3 rotation: QR of a Gaussian matrix with R's diagonal > 0
    (Mezzadri 2007), its determinant made +1."""
    q, r = np.linalg.qr(rng.standard_normal((3, 3)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def signed_distance(label: int, q: np.ndarray, scale: float, rng: np.random.Generator):
    """d(q) of class ``label`` (module table) at points q (..., 3), largest extent ``scale``;
    the shape's aspect ratios are drawn from ``rng``."""
    x, y, z = q[..., 0], q[..., 1], q[..., 2]
    if label == 0:  # sphere
        return np.sqrt(x * x + y * y + z * z) - scale
    if label == 1:  # box, half-widths between scale/2 and scale
        a = scale * rng.uniform(0.5, 1.0, size=3)
        return np.max(np.abs(q) - a, axis=-1)
    if label == 2:  # cylinder
        rho, half = scale * rng.uniform(0.4, 0.8), scale * rng.uniform(0.6, 1.0)
        return np.maximum(np.sqrt(x * x + y * y) - rho, np.abs(z) - half)
    if label == 3:  # torus, ring radius R = scale·(0.6…0.75), tube ρ = R·(0.3…0.5)
        ring = scale * rng.uniform(0.6, 0.75)
        tube = ring * rng.uniform(0.3, 0.5)
        return np.sqrt((np.sqrt(x * x + y * y) - ring) ** 2 + z * z) - tube
    raise ValueError(f"`label` must be one of 0..{len(CLASSES) - 1}, got {label!r}.")


def voxel_grid(size: int) -> np.ndarray:
    """Voxel centres of an n×n×n grid on [−1, 1]³: (n, n, n, 3), axes (depth z, height y, width x)
    holding (x, y, z)."""
    t = -1.0 + (np.arange(size) + 0.5) * (2.0 / size)
    zz, yy, xx = np.meshgrid(t, t, t, indexing="ij")
    return np.stack([xx, yy, zz], axis=-1)


def render_shape(label: int, size: int, rng: np.random.Generator,
                 noise: float = NOISE) -> np.ndarray:
    """One (n, n, n) occupancy volume of class ``label`` at a random pose and scale."""
    rotation = random_rotation(rng)
    centre = rng.uniform(-CENTRE_SHIFT, CENTRE_SHIFT, size=3)
    scale = rng.uniform(*SIZE_RANGE)
    q = (voxel_grid(size) - centre) @ rotation  # rows p − c times Q: (Qᵀ(p − c))ᵀ
    d = signed_distance(label, q, scale, rng)
    volume = np.clip(0.5 - d * (size / 2.0), 0.0, 1.0)  # anti-aliased over one voxel, Δ = 2/n
    if noise:
        volume = volume + noise * rng.standard_normal(volume.shape)
    return volume


def generate_voxels(n_samples: int, size: int = DEFAULT_SIZE, seed: int = 0,
                    noise: float = NOISE) -> tuple[np.ndarray, np.ndarray]:
    """Raw volumes x (n_samples, 1, n, n, n) and balanced labels y (n_samples,), from the seed."""
    check_positive_int("n_samples", n_samples)
    check_size(size)
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not noise >= 0:
        raise ValueError(f"`noise` must be a number ≥ 0, got {noise!r}.")
    rng = np.random.default_rng(seed)
    labels = np.arange(n_samples) % len(CLASSES)
    rng.shuffle(labels)
    x = np.empty((n_samples, 1, size, size, size))
    for i, label in enumerate(labels):
        x[i, 0] = render_shape(int(label), size, rng, float(noise))
    return x, labels.astype(np.int64)


def check_size(size) -> int:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) \
            or not SIZES[0] <= size <= SIZES[1]:
        raise ValueError(f"`size` must be an integer from {SIZES[0]} to {SIZES[1]} (voxels per "
                         f"axis), got {size!r}.")
    return int(size)


def load_voxels(n_samples: int | None = None, seed: int = 0, val_fraction: float = VAL_FRACTION,
                size: int = DEFAULT_SIZE, noise: float = NOISE) -> Dataset:
    """The voxel data set: (1, n, n, n) volumes of 4 shape classes, split and normalised with
    one scalar mean and standard deviation (as the image sets)."""
    n = N_SAMPLES if n_samples is None else n_samples
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"`n_samples` must be an integer ≥ 2, got {n_samples!r}.")
    x, y = generate_voxels(int(n), size, seed, noise)
    info = {"classes": CLASSES, "size": size, "noise": noise}
    return make_dataset("voxels", x, y, len(CLASSES), seed=seed, val_fraction=val_fraction,
                        image=True, info=info)
