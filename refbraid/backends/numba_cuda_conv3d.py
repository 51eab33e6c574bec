"""Numba CUDA kernels (backend ``"cuda"``), part 5: the 'same' 3-D convolution.

Same signatures and semantics as :func:`refbraid.backends.reference_spatial.conv3d` and
``conv3d_adjoint``; device arrays in, device arrays out, as in
:mod:`refbraid.backends.numba_cuda`. Direct gather kernels as the 2-D ones
(:mod:`refbraid.backends.numba_cuda_conv`), one thread per output element, no atomics::

    _conv3d_kernel      z[n,o,d,i,j] = b[o] + Σ_{c,p,q,u} W[o,c,p,q,u] x[n,c,d+p−r,i+q−r,j+u−r]
    _conv3d_dx_kernel   dx[n,c,d,i,j] = Σ_{o,p,q,u} W[o,c,p,q,u] dz[n,o,d−p+r,i−q+r,j−u+r]
    _conv3d_dw_kernel   dW[o,c,p,q,u] = Σ_{n,d,i,j} dz[n,o,d,i,j] x[n,c,d+p−r,i+q−r,j+u−r]
    _channel_sum3_kernel db[o] = Σ_{n,d,i,j} dz[n,o,d,i,j]

Index terms outside the volume are zero (the reference's zero padding). Shape legend: ``B``
batch, ``C``/``O`` input/output channels, ``D, H, W`` volume size, ``k`` odd, ``r = k // 2``.
"""

from __future__ import annotations

from . import reference_spatial
from .numba_cpu_conv3d import check_conv3d_args
from .numba_cuda import THREADS, blocks, common_dtype, cuda, cuda_floats, cuda_jit
from .numba_cuda_memory import KernelCall

OVERRIDES = ("conv3d", "conv3d_adjoint") if cuda is not None else ()


@cuda_jit
def _conv3d_kernel(x, W, bias, has_bias, z):
    """z[n,o,d,i,j] = b[o] + Σ W[o,c,p,q,u] x[n,c,d+p−r,i+q−r,j+u−r], one thread per output."""
    idx = cuda.grid(1)
    if idx < z.size:
        _, O, D, H, Wd = z.shape
        j = idx % Wd
        i = (idx // Wd) % H
        d = (idx // (Wd * H)) % D
        o = (idx // (Wd * H * D)) % O
        n = idx // (Wd * H * D * O)
        k = W.shape[4]
        r = k // 2
        acc = 0.0
        for c in range(x.shape[1]):
            for p in range(k):
                dd = d + p - r
                if 0 <= dd < D:
                    for q in range(k):
                        ii = i + q - r
                        if 0 <= ii < H:
                            for u in range(k):
                                jj = j + u - r
                                if 0 <= jj < Wd:
                                    acc += W[o, c, p, q, u] * x[n, c, dd, ii, jj]
        if has_bias:
            acc += bias[o]
        z[n, o, d, i, j] = acc


@cuda_jit
def _conv3d_dx_kernel(dz, W, dx):
    """dx[n,c,d,i,j] = Σ W[o,c,p,q,u] dz[n,o,d−p+r,i−q+r,j−u+r], one thread per input voxel."""
    idx = cuda.grid(1)
    if idx < dx.size:
        _, C, D, H, Wd = dx.shape
        j = idx % Wd
        i = (idx // Wd) % H
        d = (idx // (Wd * H)) % D
        c = (idx // (Wd * H * D)) % C
        n = idx // (Wd * H * D * C)
        k = W.shape[4]
        r = k // 2
        acc = 0.0
        for o in range(W.shape[0]):
            for p in range(k):
                dd = d - p + r
                if 0 <= dd < D:
                    for q in range(k):
                        ii = i - q + r
                        if 0 <= ii < H:
                            for u in range(k):
                                jj = j - u + r
                                if 0 <= jj < Wd:
                                    acc += W[o, c, p, q, u] * dz[n, o, dd, ii, jj]
        dx[n, c, d, i, j] = acc


@cuda_jit
def _conv3d_dw_kernel(x, dz, dW):
    """dW[o,c,p,q,u] = Σ_{n,d,i,j} dz[n,o,d,i,j] x[n,c,d+p−r,i+q−r,j+u−r], one thread each."""
    idx = cuda.grid(1)
    if idx < dW.size:
        _, C, k, _, _ = dW.shape
        u = idx % k
        q = (idx // k) % k
        p = (idx // (k * k)) % k
        c = (idx // (k * k * k)) % C
        o = idx // (k * k * k * C)
        r = k // 2
        D, H, Wd = x.shape[2], x.shape[3], x.shape[4]
        acc = 0.0
        for n in range(x.shape[0]):
            for d in range(max(0, r - p), min(D, D + r - p)):
                for i in range(max(0, r - q), min(H, H + r - q)):
                    for j in range(max(0, r - u), min(Wd, Wd + r - u)):
                        acc += dz[n, o, d, i, j] * x[n, c, d + p - r, i + q - r, j + u - r]
        dW[o, c, p, q, u] = acc


@cuda_jit
def _channel_sum3_kernel(dz, out):
    """out[o] = Σ_{n,d,i,j} dz[n,o,d,i,j], one thread per channel o."""
    o = cuda.grid(1)
    if o < dz.shape[1]:
        acc = 0.0
        for n in range(dz.shape[0]):
            for d in range(dz.shape[2]):
                for i in range(dz.shape[3]):
                    for j in range(dz.shape[4]):
                        acc += dz[n, o, d, i, j]
        out[o] = acc


def conv3d(x, W, b):
    """'Same' 3-D cross-correlation (reference_spatial.conv3d): one thread per output."""
    if not cuda_floats(x, W, b):
        return reference_spatial.conv3d(x, W, b)
    check_conv3d_args(x, W, b)
    call, dtype = KernelCall(x, W, b, names=("x", "W", "b")), common_dtype(x, W, b)
    z = call.out((x.shape[0], W.shape[0], *x.shape[2:]), dtype)
    bias = call.arg(b, dtype) if b is not None else call.placeholder(dtype)
    _conv3d_kernel[blocks(z.arg.size), THREADS](
        call.arg(x, dtype), call.arg(W, dtype), bias, b is not None, z.arg)
    return call.result(z)


def conv3d_adjoint(x, W, dz):
    """(dx, dW, db) of conv3d (reference_spatial.conv3d_adjoint): gather kernels, no atomics."""
    if not cuda_floats(x, W, dz):
        return reference_spatial.conv3d_adjoint(x, W, dz)
    check_conv3d_args(x, W, dz=dz)
    call, dtype = KernelCall(x, W, dz, names=("x", "W", "dz")), common_dtype(x, W, dz)
    xd, Wdev, dzd = call.arg(x, dtype), call.arg(W, dtype), call.arg(dz, dtype)
    dx, dW, db = call.out(x.shape, dtype), call.out(W.shape, dtype), call.out(W.shape[0], dtype)
    _conv3d_dx_kernel[blocks(dx.arg.size), THREADS](dzd, Wdev, dx.arg)
    _conv3d_dw_kernel[blocks(dW.arg.size), THREADS](xd, dzd, dW.arg)
    _channel_sum3_kernel[blocks(W.shape[0]), THREADS](dzd, db.arg)
    return call.result(dx), call.result(dW), call.result(db)
