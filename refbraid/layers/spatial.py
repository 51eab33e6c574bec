"""What the 2-D and 3-D image layers share: the spatial-size check and the convolution chosen
by the number of spatial axes.

An image batch is (B, C, S…) with ``s = len(S…)`` spatial axes: ``s = 2`` NCHW (2-D), ``s = 3``
NCDHW (3-D). ``conv_same`` is ``bk.conv2d`` or ``bk.conv3d`` ('same', stride 1, zero padding);
the stride-2 convolution (kernel ``conv_stride2``) has ⌈n/2⌉ outputs per axis.

Shape legend: B batch, C channels, S… spatial axes (D, H, W or H, W).
"""

from __future__ import annotations

from dataclasses import replace

from .init import check_positive_int

SPATIAL_DIMS = (2, 3)  # 2-D (NCHW) and 3-D (NCDHW) images
STRIDE = 2  # the down-sampling factor of every transition


def check_spatial(name: str, spatial) -> tuple[int, ...]:
    """``spatial`` as a tuple of 2 or 3 positive ints; ValueError naming ``name`` otherwise."""
    if not isinstance(spatial, (tuple, list)) or len(spatial) not in SPATIAL_DIMS:
        raise ValueError(f"`{name}` must be a tuple of 2 (height, width) or 3 (depth, height, "
                         f"width) positive integers, got {spatial!r}.")
    return tuple(check_positive_int(f"{name}[{i}]", n) for i, n in enumerate(spatial))


class Resizable:
    """A layer with a ``spatial`` field that can be rebuilt for other map sizes.

    On an MGRIT level coarsened in space every state is 2^s times smaller, so a transition
    between stages sees smaller maps than it was built for. ``at(spatial)`` is the same layer
    (same parameters: none of them depends on the map size) on maps of size ``spatial``; its
    ``out_shape`` follows from that input (pooling and the strided conv halve it, widening and
    batch norm keep it)."""

    def at(self, spatial):
        spatial = check_spatial("spatial", spatial)
        return self if spatial == self.spatial else replace(self, spatial=spatial)


def conv_same(bk, x, W, b):
    """z = W * x + b, 'same' size: bk.conv2d on (B, C, H, W), bk.conv3d on (B, C, D, H, W)."""
    return bk.conv2d(x, W, b) if x.ndim == 4 else bk.conv3d(x, W, b)


def conv_same_adjoint(bk, x, W, dz):
    """(dx, dW, db) of :func:`conv_same`."""
    return bk.conv2d_adjoint(x, W, dz) if x.ndim == 4 else bk.conv3d_adjoint(x, W, dz)


def strided_shape(spatial: tuple[int, ...]) -> tuple[int, ...]:
    """⌈n/2⌉ per axis: the output size of a stride-2, padding-1, 3-wide convolution."""
    return tuple(-(-n // STRIDE) for n in spatial)
