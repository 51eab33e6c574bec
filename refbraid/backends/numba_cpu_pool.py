"""Numba CPU kernels (backend ``"numba"``), part 7: 2×2 and 2×2×2 pooling.

Same signatures and semantics as the pooling kernels of
:mod:`refbraid.backends.reference_spatial` (windows 2 wide, stride 2, an odd trailing row
dropped; max pooling's index is the position in the window, row-major over its axes, the first
maximum on ties). What changes: one pass of direct loops instead of the reference's reshaped
copies and one-hot arrays. A 2-D image (B, C, H, W) runs as a volume of depth 1 with a
depth window of 1::

    avgpool          out[r, m] = (1/P) Σ_{a,b,c} x[r, fd·m₀+a, 2m₁+b, 2m₂+c]
    avgpool_adjoint  dx[r, fd·m₀+a, 2m₁+b, 2m₂+c] = dout[r, m] / P     (0 in dropped rows)
    maxpool          out[r, m] = x at the first maximum of the window, index = (a·2 + b)·2 + c
    maxpool_adjoint  dx = dout[r, m] at the window's index, 0 elsewhere

Shape legend: ``r`` one (batch, channel) pair, ``m = (m₀, m₁, m₂)`` an output position,
``fd`` the depth window (2 in 3-D, 1 in 2-D), ``P = 2^s``. Complex inputs (the harness's
complex step) go to the reference.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import reference_spatial
from .numba_cpu import native_floats

OVERRIDES = ("avgpool", "avgpool_adjoint", "maxpool", "maxpool_adjoint")


def as_volumes(shape) -> tuple[tuple[int, int, int, int], int]:
    """(B, C, S…) -> the (B·C, D, H, W) volume shape (D = 1 in 2-D) and the depth window."""
    if len(shape) == 4:
        return (shape[0] * shape[1], 1, shape[2], shape[3]), 1
    if len(shape) == 5:
        return (shape[0] * shape[1], *shape[2:]), 2
    raise ValueError(f"`x` must be (batch, channels, height, width) or (batch, channels, depth, "
                     f"height, width), got shape {tuple(shape)}.")


@njit(cache=True)
def _avgpool(x, fd, out):
    R, Do, Ho, Wo = out.shape
    scale = out.dtype.type(1.0 / (fd * 4))
    for r in range(R):
        for m0 in range(Do):
            for m1 in range(Ho):
                for m2 in range(Wo):
                    s = out.dtype.type(0)
                    for a in range(fd):
                        for b in range(2):
                            row = x[r, fd * m0 + a, 2 * m1 + b]
                            s += row[2 * m2] + row[2 * m2 + 1]
                    out[r, m0, m1, m2] = s * scale


@njit(cache=True)
def _avgpool_adjoint(dout, fd, dx):
    dx[:] = 0
    R, Do, Ho, Wo = dout.shape
    scale = dx.dtype.type(1.0 / (fd * 4))
    for r in range(R):
        for m0 in range(Do):
            for m1 in range(Ho):
                for m2 in range(Wo):
                    g = dout[r, m0, m1, m2] * scale
                    for a in range(fd):
                        for b in range(2):
                            row = dx[r, fd * m0 + a, 2 * m1 + b]
                            row[2 * m2] = g
                            row[2 * m2 + 1] = g


@njit(cache=True)
def _maxpool(x, fd, out, index):
    R, Do, Ho, Wo = out.shape
    for r in range(R):
        for m0 in range(Do):
            for m1 in range(Ho):
                for m2 in range(Wo):
                    best = x[r, fd * m0, 2 * m1, 2 * m2]
                    arg = 0
                    for a in range(fd):
                        for b in range(2):
                            for c in range(2):
                                v = x[r, fd * m0 + a, 2 * m1 + b, 2 * m2 + c]
                                if v > best:  # strict: the first maximum wins ties
                                    best, arg = v, (a * 2 + b) * 2 + c
                    out[r, m0, m1, m2] = best
                    index[r, m0, m1, m2] = arg


@njit(cache=True)
def _maxpool_adjoint(dout, index, fd, dx):
    dx[:] = 0
    R, Do, Ho, Wo = dout.shape
    for r in range(R):
        for m0 in range(Do):
            for m1 in range(Ho):
                for m2 in range(Wo):
                    k = index[r, m0, m1, m2]
                    a, b, c = k // 4, (k // 2) % 2, k % 2
                    dx[r, fd * m0 + a, 2 * m1 + b, 2 * m2 + c] = dout[r, m0, m1, m2]


def avgpool(x):
    """2×…×2 average pooling (reference_spatial.avgpool), direct loops."""
    if not native_floats(x):
        return reference_spatial.avgpool(x)
    vol, fd = as_volumes(x.shape)
    out_shape = reference_spatial.pooled_shape(x.shape)
    out = np.empty(out_shape, x.dtype)
    _avgpool(np.ascontiguousarray(x).reshape(vol), fd, out.reshape(as_volumes(out_shape)[0]))
    return out


def avgpool_adjoint(dout, in_shape):
    """dx of avgpool (reference_spatial.avgpool_adjoint), direct loops."""
    if not native_floats(dout):
        return reference_spatial.avgpool_adjoint(dout, in_shape)
    vol, fd = as_volumes(tuple(in_shape))
    check_pooled_dout(dout, in_shape)
    dx = np.empty(tuple(in_shape), dout.dtype)
    _avgpool_adjoint(np.ascontiguousarray(dout).reshape(as_volumes(dout.shape)[0]), fd,
                     dx.reshape(vol))
    return dx


def maxpool(x):
    """2×…×2 max pooling (reference_spatial.maxpool): (out, index), direct loops."""
    if not native_floats(x):
        return reference_spatial.maxpool(x)
    vol, fd = as_volumes(x.shape)
    out_shape = reference_spatial.pooled_shape(x.shape)
    out, index = np.empty(out_shape, x.dtype), np.empty(out_shape, np.int64)
    out_vol = as_volumes(out_shape)[0]
    _maxpool(np.ascontiguousarray(x).reshape(vol), fd, out.reshape(out_vol),
             index.reshape(out_vol))
    return out, index


def maxpool_adjoint(dout, index, in_shape):
    """dx of maxpool (reference_spatial.maxpool_adjoint), direct loops."""
    if not native_floats(dout):
        return reference_spatial.maxpool_adjoint(dout, index, in_shape)
    vol, fd = as_volumes(tuple(in_shape))
    check_pooled_dout(dout, in_shape)
    if tuple(index.shape) != tuple(dout.shape):
        raise ValueError(f"`index` must have the shape of `dout` {tuple(dout.shape)}, got "
                         f"{tuple(index.shape)}.")
    dx = np.empty(tuple(in_shape), dout.dtype)
    out_vol = as_volumes(dout.shape)[0]
    _maxpool_adjoint(np.ascontiguousarray(dout).reshape(out_vol),
                     np.ascontiguousarray(index, np.int64).reshape(out_vol), fd, dx.reshape(vol))
    return dx


def check_pooled_dout(dout, in_shape) -> None:
    want = reference_spatial.pooled_shape(tuple(in_shape))
    if tuple(dout.shape) != want:
        raise ValueError(f"`dout` must have shape {want} (the pooled `in_shape`), got "
                         f"{tuple(dout.shape)}.")
