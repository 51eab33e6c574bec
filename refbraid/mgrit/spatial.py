"""Spatial grid transfers between feature-map resolutions: restriction R, interpolation P and
their exact transposes (cell-centred grids, factor 2 per spatial axis).

A feature map is an array whose last ``dims`` axes are space (2: NCHW images, 3: NCDHW
voxels); every operator is the tensor product of one 1-D operator along each of those axes.
On a cell-centred 1-D grid with fine cells ``2j, 2j+1`` inside coarse cell ``j``::

    average      (R x)[j]     = (x[2j] + x[2j+1]) / 2                      (2×2 average pooling)
    constant     (P v)[2j]    = (P v)[2j+1] = v[j]                         (nearest neighbour)
    linear       (P v)[2j]    = ¾ v[j] + ¼ v[j-1],   (P v)[2j+1] = ¾ v[j] + ¼ v[j+1]
                 with v[-1] := v[0], v[n] := v[n-1] (constant extension at the boundary)
    full weighting  R_fw = Pᵀ_linear / 2  (1-D stencil [1 3 3 1]/8 on interior cells)

so in d dimensions ``average`` is 2^d-cell average pooling, ``linear`` is bilinear (d = 2)
or trilinear (d = 3) interpolation, and ``full_weighting`` is ``Pᵀ / 2^d``. Every operator is
linear; the transposes below satisfy ``<A x, y> = <x, Aᵀ y>`` exactly (tests/mgrit/
test_spatial.py checks each with random vectors). Note ``P_constant = 2^d · Rᵀ_average``.

Shape legend: ``(..., n_1, ..., n_d)`` fine, ``(..., n_1/2, ..., n_d/2)`` coarse; every fine
spatial extent must be even.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..backends.portable import asarray_on
from .arrays import namespace

RESTRICTIONS = ("average", "full_weighting")
INTERPOLATIONS = ("constant", "linear")


def _check_even(x, dims: int) -> None:
    shape = tuple(getattr(x, "shape", ()))
    if len(shape) < dims:
        raise ValueError(f"`x` must have at least dims={dims} axes, got shape {shape}.")
    odd = [n for n in shape[-dims:] if n % 2]
    if odd:
        raise ValueError(f"spatial coarsening needs even extents on the last {dims} axes of "
                         f"`x`, got shape {shape}; use sizes divisible by 2 per coarsening.")


def _along(fn: Callable, x, dims: int):
    """Apply the 1-D operator ``fn(x, axis)`` along each of the last ``dims`` axes."""
    for axis in range(x.ndim - dims, x.ndim):
        x = fn(x, axis)
    return x


def _pairs(x, axis: int):
    """Views of the even and odd cells along ``axis``: x[..., 2j, ...], x[..., 2j+1, ...]."""
    xp = namespace(x)
    n = x.shape[axis]
    return (xp.take(x, asarray_on(x, np.arange(0, n, 2)), axis=axis),
            xp.take(x, asarray_on(x, np.arange(1, n, 2)), axis=axis))


def _interleave(even, odd, axis: int):
    """Inverse of :func:`_pairs`: out[..., 2j] = even[..., j], out[..., 2j+1] = odd[..., j]."""
    xp = namespace(even)
    both = xp.stack([even, odd], axis=axis + 1)  # ..., n, 2, ...
    shape = list(even.shape)
    shape[axis] = 2 * even.shape[axis]
    return xp.reshape(both, tuple(shape))


def _shift(v, axis: int, by: int):
    """v[j - by] with constant extension at the boundary (by = ±1)."""
    xp = namespace(v)
    n = v.shape[axis]
    idx = np.clip(np.arange(n) - by, 0, n - 1)
    return xp.take(v, asarray_on(v, idx), axis=axis)


def _shift_adjoint(w, axis: int, by: int):
    """Transpose of :func:`_shift`: ``out[i] = Σ_{j : clip(j - by) = i} w[j]``."""
    xp = namespace(w)
    n = w.shape[axis]
    if n == 1:
        return w

    def rows(lo, hi):
        return xp.take(w, asarray_on(w, np.arange(lo, hi)), axis=axis)

    zero = xp.zeros_like(rows(0, 1))
    if by == 1:  # out[0] = w[0] + w[1], out[i] = w[i+1], out[n-1] = 0
        return xp.concat([rows(0, 1) + rows(1, 2), rows(2, n), zero], axis=axis)
    # by == -1:  out[0] = 0, out[i] = w[i-1], out[n-1] = w[n-2] + w[n-1]
    return xp.concat([zero, rows(0, n - 2), rows(n - 2, n - 1) + rows(n - 1, n)], axis=axis)


# ----------------------------------------------------------------------------- 1-D operators
def _average_1d(x, axis):
    even, odd = _pairs(x, axis)
    return (even + odd) / 2


def _average_1d_adjoint(y, axis):
    return _interleave(y / 2, y / 2, axis)


def _constant_1d(v, axis):
    return _interleave(v, v, axis)


def _constant_1d_adjoint(x, axis):
    even, odd = _pairs(x, axis)
    return even + odd


def _linear_1d(v, axis):
    return _interleave(0.75 * v + 0.25 * _shift(v, axis, 1),
                       0.75 * v + 0.25 * _shift(v, axis, -1), axis)


def _linear_1d_adjoint(x, axis):
    even, odd = _pairs(x, axis)
    return (0.75 * (even + odd) + 0.25 * _shift_adjoint(even, axis, 1)
            + 0.25 * _shift_adjoint(odd, axis, -1))


# ----------------------------------------------------------------------------- d-D operators
def restrict(x, kind: str = "average", dims: int = 2):
    """Restriction R to half resolution on the last ``dims`` axes (module docstring)."""
    _check_even(x, dims)
    if kind == "average":
        return _along(_average_1d, x, dims)
    if kind == "full_weighting":
        return _along(_linear_1d_adjoint, x, dims) / 2**dims
    raise ValueError(f"`restriction` must be one of {RESTRICTIONS}, got {kind!r}.")


def restrict_adjoint(y, kind: str = "average", dims: int = 2):
    """Rᵀ: coarse → fine, the exact transpose of :func:`restrict`."""
    if kind == "average":
        return _along(_average_1d_adjoint, y, dims)
    if kind == "full_weighting":
        return _along(_linear_1d, y, dims) / 2**dims
    raise ValueError(f"`restriction` must be one of {RESTRICTIONS}, got {kind!r}.")


def interpolate(v, kind: str = "linear", dims: int = 2):
    """Interpolation P to double resolution on the last ``dims`` axes (module docstring)."""
    if kind == "constant":
        return _along(_constant_1d, v, dims)
    if kind == "linear":
        return _along(_linear_1d, v, dims)
    raise ValueError(f"`interpolation` must be one of {INTERPOLATIONS}, got {kind!r}.")


def interpolate_adjoint(x, kind: str = "linear", dims: int = 2):
    """Pᵀ: fine → coarse, the exact transpose of :func:`interpolate`."""
    _check_even(x, dims)
    if kind == "constant":
        return _along(_constant_1d_adjoint, x, dims)
    if kind == "linear":
        return _along(_linear_1d_adjoint, x, dims)
    raise ValueError(f"`interpolation` must be one of {INTERPOLATIONS}, got {kind!r}.")
