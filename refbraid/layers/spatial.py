"""What the 2-D and 3-D image layers share: the spatial-size check and the convolution chosen
by the number of spatial axes.

An image batch is (B, C, S…) with ``s = len(S…)`` spatial axes: ``s = 2`` NCHW (2-D), ``s = 3``
NCDHW (3-D). ``conv_same`` is ``bk.conv2d`` or ``bk.conv3d`` ('same', stride 1, zero padding);
the stride-2 convolution (kernel ``conv_stride2``) has ⌈n/2⌉ outputs per axis.

Shape legend: B batch, C channels, S… spatial axes (D, H, W or H, W).
"""

from __future__ import annotations

from .init import check_positive_int

SPATIAL_DIMS = (2, 3)  # 2-D (NCHW) and 3-D (NCDHW) images
STRIDE = 2  # the down-sampling factor of every transition


def check_spatial(name: str, spatial) -> tuple[int, ...]:
    """``spatial`` as a tuple of 2 or 3 positive ints; ValueError naming ``name`` otherwise."""
    if not isinstance(spatial, (tuple, list)) or len(spatial) not in SPATIAL_DIMS:
        raise ValueError(f"`{name}` must be a tuple of 2 (height, width) or 3 (depth, height, "
                         f"width) positive integers, got {spatial!r}.")
    return tuple(check_positive_int(f"{name}[{i}]", n) for i, n in enumerate(spatial))


def conv_same(bk, x, W, b):
    """z = W * x + b, 'same' size: bk.conv2d on (B, C, H, W), bk.conv3d on (B, C, D, H, W)."""
    return bk.conv2d(x, W, b) if x.ndim == 4 else bk.conv3d(x, W, b)


def conv_same_adjoint(bk, x, W, dz):
    """(dx, dW, db) of :func:`conv_same`."""
    return bk.conv2d_adjoint(x, W, dz) if x.ndim == 4 else bk.conv3d_adjoint(x, W, dz)


def strided_shape(spatial: tuple[int, ...]) -> tuple[int, ...]:
    """⌈n/2⌉ per axis: the output size of a stride-2, padding-1, 3-wide convolution."""
    return tuple(-(-n // STRIDE) for n in spatial)
