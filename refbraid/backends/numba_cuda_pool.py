"""Numba CUDA kernels (backend ``"cuda"``), part 6: 2×2 and 2×2×2 pooling.

Same signatures and semantics as the pooling kernels of
:mod:`refbraid.backends.reference_spatial`; host or device arrays in, NumPy arrays out, as in
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
from .numba_cuda import THREADS, blocks, cuda, cuda_floats, cuda_jit, to_device

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


def _device_volume(a, dtype, shape):
    return to_device(a, dtype).reshape(as_volumes(shape)[0])


def avgpool(x):
    """2×…×2 average pooling (reference_spatial.avgpool): one thread per output."""
    if not cuda_floats(x):
        return reference_spatial.avgpool(x)
    _, fd = as_volumes(x.shape)
    out_shape = reference_spatial.pooled_shape(x.shape)
    dtype = x.dtype
    out = cuda.device_array(as_volumes(out_shape)[0], dtype=dtype)
    _avgpool_kernel[blocks(out.size), THREADS](_device_volume(x, dtype, x.shape), fd, out)
    return out.copy_to_host().reshape(out_shape)


def maxpool(x):
    """2×…×2 max pooling (reference_spatial.maxpool): (out, index), one thread per output."""
    if not cuda_floats(x):
        return reference_spatial.maxpool(x)
    _, fd = as_volumes(x.shape)
    out_shape = reference_spatial.pooled_shape(x.shape)
    vol = as_volumes(out_shape)[0]
    out = cuda.device_array(vol, dtype=x.dtype)
    index = cuda.device_array(vol, dtype="int64")
    _maxpool_kernel[blocks(out.size), THREADS](_device_volume(x, x.dtype, x.shape), fd, out,
                                               index)
    return out.copy_to_host().reshape(out_shape), index.copy_to_host().reshape(out_shape)


def avgpool_adjoint(dout, in_shape):
    """dx of avgpool (reference_spatial.avgpool_adjoint): one thread per input element."""
    if not cuda_floats(dout):
        return reference_spatial.avgpool_adjoint(dout, in_shape)
    check_pooled_dout(dout, in_shape)
    vol, fd = as_volumes(tuple(in_shape))
    dx = cuda.device_array(vol, dtype=dout.dtype)
    _avgpool_adjoint_kernel[blocks(dx.size), THREADS](
        _device_volume(dout, dout.dtype, dout.shape), fd, dx)
    return dx.copy_to_host().reshape(tuple(in_shape))


def maxpool_adjoint(dout, index, in_shape):
    """dx of maxpool (reference_spatial.maxpool_adjoint): one thread per input element."""
    if not cuda_floats(dout):
        return reference_spatial.maxpool_adjoint(dout, index, in_shape)
    check_pooled_dout(dout, in_shape)
    if tuple(index.shape) != tuple(dout.shape):
        raise ValueError(f"`index` must have the shape of `dout` {tuple(dout.shape)}, got "
                         f"{tuple(index.shape)}.")
    vol, fd = as_volumes(tuple(in_shape))
    dx = cuda.device_array(vol, dtype=dout.dtype)
    _maxpool_adjoint_kernel[blocks(dx.size), THREADS](
        _device_volume(dout, dout.dtype, dout.shape),
        _device_volume(index, index.dtype, index.shape), fd, dx)
    return dx.copy_to_host().reshape(tuple(in_shape))
