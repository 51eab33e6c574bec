"""Numba CPU kernels (backend ``"numba"``), part 6: the 'same' 3-D convolution.

Same signatures and semantics as :func:`refbraid.backends.reference_spatial.conv3d` and
``conv3d_adjoint``. What changes: direct loops on a zero-padded copy of one image at a time
(no einsum temporaries, no im2col buffer), with the innermost loop unit-stride along W::

    z[o, d, i, :]  += W[o,c,p,q,u] · x̃[c, d+p, i+q, u : u+W]   (one weight, one line; line by
                                                                  line, so all of it is in L1)
    dx             =  the same loop on d̃z with W'[c,o,p,q,u] = W[o,c,k−1−p,k−1−q,k−1−u]
    dW[o,c,p,q,u]  =  Σ_{n,d,i,j} dz[n,o,d,i,j] x̃[n,c,d+p,i+q,j+u]
    db[o]          =  Σ_{n,d,i,j} dz[n,o,d,i,j]

Any odd k (3 for the layers, 1 for a 1×1×1 channel map). Sums run in the array dtype, with
``fastmath`` {reassoc, contract} as the 2-D kernels (:data:`numba_cpu_conv.FASTMATH`): SIMD
partial sums and fused multiply-adds, nothing else. One thread (the project's CPU rule).

Shape legend: ``B`` batch, ``C`` input channels, ``O`` output channels, ``D, H, W`` depth,
height, width, ``k`` odd kernel size, ``r = k // 2``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import reference_spatial
from .numba_cpu import check_ndim, check_size, common_dtype, native_floats
from .numba_cpu_conv import FASTMATH

OVERRIDES = ("conv3d", "conv3d_adjoint")


@njit(cache=True)
def _pad_volume(x, r, out):
    """out[c, d+r, i+r, j+r] = x[c, d, i, j], zero elsewhere.  x: (C, D, H, W) one image."""
    out[:] = 0
    C, D, H, Wd = x.shape
    for c in range(C):
        for d in range(D):
            for i in range(H):
                out[c, d + r, i + r, r : r + Wd] = x[c, d, i]


@njit(cache=True, fastmath=FASTMATH)
def _conv3d_image(xp, W, out):
    """out[o,d,i,j] += Σ_{c,p,q,u} W[o,c,p,q,u] xp[c, d+p, i+q, j+u] for one padded image.

    Output line by output line (d, i): its O lines and the C·k² input lines it reads stay in
    L1 (sweeping the whole volume once per weight instead measured 5–8× slower at 16³)."""
    O, D, H, Wd = out.shape
    k = W.shape[-1]
    for d in range(D):
        for i in range(H):
            for o in range(O):
                line = out[o, d, i]
                for c in range(W.shape[1]):
                    for p in range(k):
                        for q in range(k):
                            src = xp[c, d + p, i + q]
                            for u in range(k):
                                w = W[o, c, p, q, u]
                                for j in range(Wd):
                                    line[j] += w * src[j + u]


@njit(cache=True, fastmath=FASTMATH)
def _weight_grad3d_image(xp, dz, dW):
    """dW[o,c,p,q,u] += Σ_{d,i,j} dz[o,d,i,j] xp[c, d+p, i+q, j+u] for one image, output line
    by output line (as _conv3d_image, so that the lines read stay in cache)."""
    O, D, H, Wd = dz.shape
    C, k = dW.shape[1], dW.shape[-1]
    for d in range(D):
        for i in range(H):
            for o in range(O):
                g = dz[o, d, i]
                for c in range(C):
                    for p in range(k):
                        for q in range(k):
                            src = xp[c, d + p, i + q]
                            for u in range(k):
                                acc = dW.dtype.type(0)
                                for j in range(Wd):
                                    acc += g[j] * src[j + u]
                                dW[o, c, p, q, u] += acc


@njit(cache=True, fastmath=FASTMATH)
def _conv3d(x, W, b, out):
    """conv3d image by image: out[n] = b + conv(x̃[n], W).  b: (O,) (zeros for no bias)."""
    B, C, D, H, Wd = x.shape
    r = W.shape[-1] // 2
    xp = np.empty((C, D + 2 * r, H + 2 * r, Wd + 2 * r), x.dtype)
    for n in range(B):
        for o in range(out.shape[1]):
            out[n, o] = b[o]
        _pad_volume(x[n], r, xp)
        _conv3d_image(xp, W, out[n])


@njit(cache=True, fastmath=FASTMATH)
def _conv3d_adjoint(x, W_t, dz, dx, dW):
    """dx[n] = conv(d̃z[n], W_t) (the transposed convolution); dW += correlation of dz, x̃."""
    B, C, D, H, Wd = x.shape
    O, k = dz.shape[1], W_t.shape[-1]
    r = k // 2
    xp = np.empty((C, D + 2 * r, H + 2 * r, Wd + 2 * r), x.dtype)
    dzp = np.empty((O, D + 2 * r, H + 2 * r, Wd + 2 * r), x.dtype)
    dx[:] = 0
    dW[:] = 0
    for n in range(B):
        _pad_volume(x[n], r, xp)
        _pad_volume(dz[n], r, dzp)
        _conv3d_image(dzp, W_t, dx[n])
        _weight_grad3d_image(xp, dz[n], dW)


def check_conv3d_args(x, W, b=None, dz=None) -> None:
    """ValueError unless x: (B, C, D, H, W), W: (O, C, k, k, k) odd k, b: (O,), dz: like z."""
    check_ndim("x", x, 5, "(batch, channels, depth, height, width)")
    check_ndim("W", W, 5, "(out_channels, in_channels, k, k, k)")
    k = W.shape[-1]
    if W.shape[2] != k or W.shape[3] != k or k % 2 == 0:
        raise ValueError(f"`W` must hold odd cubic k×k×k kernels, got shape {W.shape}.")
    check_size("W", W.shape[1], x.shape[1], "in_channels (shape[1]) equal to x.shape[1] =")
    if b is not None and b.shape != (W.shape[0],):
        raise ValueError(f"`b` must have shape ({W.shape[0]},), got {b.shape}.")
    expected = (x.shape[0], W.shape[0], *x.shape[2:])
    if dz is not None and dz.shape != expected:
        raise ValueError(f"`dz` must have shape {expected}, got {dz.shape}.")


def conv3d(x, W, b):
    """'Same' 3-D cross-correlation (reference_spatial.conv3d): direct loops, padded images."""
    if not native_floats(x, W, b):
        return reference_spatial.conv3d(x, W, b)
    check_conv3d_args(x, W, b)
    dtype = common_dtype(x, W, b)
    x = np.ascontiguousarray(x, dtype)  # B,C,D,H,W
    O = W.shape[0]
    bias = np.zeros(O, dtype) if b is None else np.ascontiguousarray(b, dtype)
    z = np.empty((x.shape[0], O, *x.shape[2:]), dtype)
    _conv3d(x, np.ascontiguousarray(W, dtype), bias, z)
    return z


def conv3d_adjoint(x, W, dz):
    """(dx, dW, db) of conv3d (reference_spatial.conv3d_adjoint): dx by the transposed
    convolution W'[c,o,p,q,u] = W[o,c,k−1−p,k−1−q,k−1−u] on the padded dz; dW, db direct."""
    if not native_floats(x, W, dz):
        return reference_spatial.conv3d_adjoint(x, W, dz)
    check_conv3d_args(x, W, dz=dz)
    dtype = common_dtype(x, W, dz)
    x = np.ascontiguousarray(x, dtype)  # B,C,D,H,W
    dz = np.ascontiguousarray(dz, dtype)  # B,O,D,H,W
    W_t = np.ascontiguousarray(
        W.astype(dtype, copy=False)[:, :, ::-1, ::-1, ::-1].transpose(1, 0, 2, 3, 4))  # C,O,k,k,k
    dx = np.empty_like(x)
    dW = np.empty(W.shape, dtype)
    _conv3d_adjoint(x, W_t, dz, dx, dW)
    return dx, dW, dz.sum(axis=(0, 2, 3, 4), dtype=np.float64).astype(dtype)
