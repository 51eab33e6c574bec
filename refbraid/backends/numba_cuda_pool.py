"""Numba CUDA kernels (backend ``"cuda"``), part 6: 2×2 and 2×2×2 pooling.

Same signatures and semantics as the pooling kernels of
:mod:`refbraid.backends.reference_spatial`; device arrays in, device arrays out, as in
:mod:`refbraid.backends.numba_cuda`. Images run as (B·C, D, H, W) volumes with a depth window
``fd`` (2 in 3-D, 1 in 2-D; :func:`refbraid.backends.numba_cpu_pool.as_volumes`). Gather
kernels, no atomics::

    _avgpool_kernel          out[r,m] = (1/P) Σ_window x                 one thread per output
    _maxpool_kernel          out[r,m], index[r,m] = first window maximum  one thread per output
    _avgpool_adjoint_kernel  dx[r,i] = dout[r, i//2…] / P (0 past the kept region)   per input
    _maxpool_adjoint_kernel  dx[r,i] = dout[r, i//2…] if index points at i, else 0  per input

Window positions are numbered row-major, ``(a·2 + b)·2 + c``, as the reference's index.
"""

from __future__ import annotations

from . import reference_spatial
from .numba_cpu_pool import as_volumes, check_pooled_dout
from .numba_cuda import THREADS, blocks, cuda, cuda_floats, cuda_jit
from .numba_cuda_memory import KernelCall, numpy_dtype

OVERRIDES = ("avgpool", "avgpool_adjoint", "maxpool", "maxpool_adjoint") if cuda is not None \
    else ()


@cuda_jit
def _avgpool_kernel(x, fd, out):
    idx = cuda.grid(1)
    if idx < out.size:
        _, Do, Ho, Wo = out.shape
        m2 = idx % Wo
        m1 = (idx // Wo) % Ho
        m0 = (idx // (Wo * Ho)) % Do
        r = idx // (Wo * Ho * Do)
        s = 0.0
        for a in range(fd):
            for b in range(2):
                for c in range(2):
                    s += x[r, fd * m0 + a, 2 * m1 + b, 2 * m2 + c]
        out[r, m0, m1, m2] = s / (fd * 4)


@cuda_jit
def _maxpool_kernel(x, fd, out, index):
    idx = cuda.grid(1)
    if idx < out.size:
        _, Do, Ho, Wo = out.shape
        m2 = idx % Wo
        m1 = (idx // Wo) % Ho
        m0 = (idx // (Wo * Ho)) % Do
        r = idx // (Wo * Ho * Do)
        best = x[r, fd * m0, 2 * m1, 2 * m2]
        arg = 0
        for a in range(fd):
            for b in range(2):
                for c in range(2):
                    v = x[r, fd * m0 + a, 2 * m1 + b, 2 * m2 + c]
                    if v > best:  # strict: the first maximum wins ties
                        best = v
                        arg = (a * 2 + b) * 2 + c
        out[r, m0, m1, m2] = best
        index[r, m0, m1, m2] = arg


@cuda_jit
def _avgpool_adjoint_kernel(dout, fd, dx):
    idx = cuda.grid(1)
    if idx < dx.size:
        _, D, H, W = dx.shape
        j = idx % W
        i = (idx // W) % H
        d = (idx // (W * H)) % D
        r = idx // (W * H * D)
        m0, m1, m2 = d // fd, i // 2, j // 2
        _, Do, Ho, Wo = dout.shape
        if m0 < Do and m1 < Ho and m2 < Wo:
            dx[r, d, i, j] = dout[r, m0, m1, m2] / (fd * 4)
        else:
            dx[r, d, i, j] = 0.0


@cuda_jit
def _maxpool_adjoint_kernel(dout, index, fd, dx):
    idx = cuda.grid(1)
    if idx < dx.size:
        _, D, H, W = dx.shape
        j = idx % W
        i = (idx // W) % H
        d = (idx // (W * H)) % D
        r = idx // (W * H * D)
        m0, m1, m2 = d // fd, i // 2, j // 2
        _, Do, Ho, Wo = dout.shape
        here = ((d - fd * m0) * 2 + (i - 2 * m1)) * 2 + (j - 2 * m2)
        if m0 < Do and m1 < Ho and m2 < Wo and index[r, m0, m1, m2] == here:
            dx[r, d, i, j] = dout[r, m0, m1, m2]
        else:
            dx[r, d, i, j] = 0.0


def avgpool(x):
    """2×…×2 average pooling (reference_spatial.avgpool): one thread per output."""
    if not cuda_floats(x):
        return reference_spatial.avgpool(x)
    volume, fd = as_volumes(x.shape)
    out_shape = reference_spatial.pooled_shape(x.shape)
    call, dtype = KernelCall(x), numpy_dtype(x)
    out = call.out(as_volumes(out_shape)[0], dtype)
    _avgpool_kernel[blocks(out.arg.size), THREADS](call.arg(x, dtype, volume), fd, out.arg)
    return call.result(out, out_shape)


def maxpool(x):
    """2×…×2 max pooling (reference_spatial.maxpool): (out, index), one thread per output."""
    if not cuda_floats(x):
        return reference_spatial.maxpool(x)
    volume, fd = as_volumes(x.shape)
    out_shape = reference_spatial.pooled_shape(x.shape)
    call, dtype = KernelCall(x), numpy_dtype(x)
    out, index = call.out(as_volumes(out_shape)[0], dtype), call.out(as_volumes(out_shape)[0],
                                                                    "int64")
    _maxpool_kernel[blocks(out.arg.size), THREADS](call.arg(x, dtype, volume), fd, out.arg,
                                                   index.arg)
    return call.result(out, out_shape), call.result(index, out_shape)


def avgpool_adjoint(dout, in_shape):
    """dx of avgpool (reference_spatial.avgpool_adjoint): one thread per input element."""
    if not cuda_floats(dout):
        return reference_spatial.avgpool_adjoint(dout, in_shape)
    check_pooled_dout(dout, in_shape)
    volume, fd = as_volumes(tuple(in_shape))
    call, dtype = KernelCall(dout), numpy_dtype(dout)
    dx = call.out(volume, dtype)
    _avgpool_adjoint_kernel[blocks(dx.arg.size), THREADS](
        call.arg(dout, dtype, as_volumes(dout.shape)[0]), fd, dx.arg)
    return call.result(dx, tuple(in_shape))


def maxpool_adjoint(dout, index, in_shape):
    """dx of maxpool (reference_spatial.maxpool_adjoint): one thread per input element."""
    if not cuda_floats(dout):
        return reference_spatial.maxpool_adjoint(dout, index, in_shape)
    check_pooled_dout(dout, in_shape)
    if tuple(index.shape) != tuple(dout.shape):
        raise ValueError(f"`index` must have the shape of `dout` {tuple(dout.shape)}, got "
                         f"{tuple(index.shape)}.")
    volume, fd = as_volumes(tuple(in_shape))
    call, dtype = KernelCall(dout, index, names=("dout", "index")), numpy_dtype(dout)
    dx = call.out(volume, dtype)
    pooled = as_volumes(dout.shape)[0]
    _maxpool_adjoint_kernel[blocks(dx.arg.size), THREADS](
        call.arg(dout, dtype, pooled), call.arg(index, numpy_dtype(index), pooled), fd, dx.arg)
    return call.result(dx, tuple(in_shape))
