"""Numba CUDA kernels (backend ``"cuda"``), part 3: the 'same' 2-D convolution.

Every public function has the signature and semantics of the same-named function in
:mod:`refbraid.backends.reference`; device arrays in, device arrays out, as in
:mod:`refbraid.backends.numba_cuda`. Direct gather kernels, one thread per output element,
no atomics (deterministic)::

    _conv2d_kernel       z[n,o,i,j] = b[o] + Σ_{c,p,q} W[o,c,p,q] x[n,c,i+p−r,j+q−r]
    _conv2d_dx_kernel    dx[n,c,i,j] = Σ_{o,p,q} W[o,c,p,q] dz[n,o,i−p+r,j−q+r]  (transposed conv)
    _conv2d_dw_kernel    dW[o,c,p,q] = Σ_{n,i,j} dz[n,o,i,j] x[n,c,i+p−r,j+q−r]  (one thread each)
    _channel_sum_kernel  db[o] = Σ_{n,i,j} dz[n,o,i,j]        one thread per channel

The sums are device functions (``conv_sum``, ``conv_dx_sum``, ``conv_dw_sum``,
``channel_sum``), which the batched kernels of
:mod:`refbraid.backends.numba_cuda_conv_batched` call on each interval's views.

Shape legend: ``B`` batch, ``C`` input channels, ``O`` output channels, ``H, W`` image size,
``k`` odd kernel size, ``r = k // 2``. Index terms outside the image are zero (the zero
padding of the reference).

Design (for a GPU course): the flat index decomposes with the image column ``j`` fastest, so
a warp covers neighbouring pixels of one row: the reads of x (and dz) and the write of z are
coalesced, and every thread of the warp reads the same weight ``W[o, c, p, q]``, which the
cache broadcasts. A gather (each output sums its own inputs) needs no atomics, so results are
bit-reproducible. Shared-memory tiling of the input halo would cut the 9 reads per input value
of a 3×3 kernel to about one; it pays from a few dozen channels on, and is the next step. The
weight gradient has one thread per weight (O·C·k² threads, each summing B·H·W products): for
small O·C it under-fills a large GPU, where a block-per-weight tree reduction would fill it.
"""

from __future__ import annotations

from . import reference
from .numba_cpu_conv import check_conv_args
from .numba_cuda import THREADS, blocks, common_dtype, cuda, cuda_floats, cuda_jit
from .numba_cuda_memory import KernelCall

OVERRIDES = ("conv2d", "conv2d_adjoint") if cuda is not None else ()


# ----------------------------------------------------------------------------- sums
# One output element's sum each, on 4-D arrays (the batched kernels of
# numba_cuda_conv_batched call them on row j's views, so every row has these bits).
@cuda_jit(device=True)
def conv_sum(x, W, n, o, i, j):
    """Σ_{c,p,q} W[o,c,p,q] x[n,c,i+p−r,j+q−r] (terms outside the image are zero)."""
    H, Wd = x.shape[2], x.shape[3]
    k = W.shape[3]
    r = k // 2
    acc = 0.0
    for c in range(x.shape[1]):
        for p in range(k):
            ii = i + p - r
            if 0 <= ii < H:
                for q in range(k):
                    jj = j + q - r
                    if 0 <= jj < Wd:
                        acc += W[o, c, p, q] * x[n, c, ii, jj]
    return acc


@cuda_jit(device=True)
def conv_dx_sum(dz, W, n, c, i, j):
    """Σ_{o,p,q} W[o,c,p,q] dz[n,o,i−p+r,j−q+r] (the transposed convolution)."""
    H, Wd = dz.shape[2], dz.shape[3]
    k = W.shape[3]
    r = k // 2
    acc = 0.0
    for o in range(W.shape[0]):
        for p in range(k):
            ii = i - p + r
            if 0 <= ii < H:
                for q in range(k):
                    jj = j - q + r
                    if 0 <= jj < Wd:
                        acc += W[o, c, p, q] * dz[n, o, ii, jj]
    return acc


@cuda_jit(device=True)
def conv_dw_sum(x, dz, o, c, p, q, k):
    """Σ_{n,i,j} dz[n,o,i,j] x[n,c,i+p−r,j+q−r] for the k×k kernel's weight (o, c, p, q)."""
    r = k // 2
    H, Wd = x.shape[2], x.shape[3]
    acc = 0.0
    for n in range(x.shape[0]):
        for i in range(max(0, r - p), min(H, H + r - p)):
            for j in range(max(0, r - q), min(Wd, Wd + r - q)):
                acc += dz[n, o, i, j] * x[n, c, i + p - r, j + q - r]
    return acc


@cuda_jit(device=True)
def channel_sum(dz, o):
    """Σ_{n,i,j} dz[n,o,i,j]."""
    acc = 0.0
    for n in range(dz.shape[0]):
        for i in range(dz.shape[2]):
            for j in range(dz.shape[3]):
                acc += dz[n, o, i, j]
    return acc


# ----------------------------------------------------------------------------- kernels
@cuda_jit(device=True)
def unflatten4(idx, shape):
    """The index (n, c, i, j) of the flat C-order position ``idx`` in a 4-D ``shape``."""
    _, C, H, Wd = shape
    return (idx // (Wd * H * C), (idx // (Wd * H)) % C, (idx // Wd) % H, idx % Wd)


@cuda_jit(device=True)
def conv_at(x, W, bias, has_bias, z, idx):
    """z at the flat index idx: b[o] + Σ_{c,p,q} W[o,c,p,q] x[n,c,i+p−r,j+q−r], the bias added
    last; returns the index (n, o, i, j)."""
    n, o, i, j = unflatten4(idx, z.shape)
    acc = conv_sum(x, W, n, o, i, j)
    if has_bias:
        acc += bias[o]
    z[n, o, i, j] = acc
    return (n, o, i, j)


@cuda_jit(device=True)
def conv_dx_at(dz, W, dx, idx):
    """dx at the flat index idx: Σ_{o,p,q} W[o,c,p,q] dz[n,o,i−p+r,j−q+r]; returns (n, c,
    i, j)."""
    n, c, i, j = unflatten4(idx, dx.shape)
    dx[n, c, i, j] = conv_dx_sum(dz, W, n, c, i, j)
    return (n, c, i, j)


@cuda_jit
def _conv2d_kernel(x, W, bias, has_bias, z):
    """z[n,o,i,j] = b[o] + Σ_{c,p,q} W[o,c,p,q] x[n,c,i+p−r,j+q−r], one thread per output."""
    idx = cuda.grid(1)
    if idx < z.size:
        conv_at(x, W, bias, has_bias, z, idx)


@cuda_jit
def _conv2d_dx_kernel(dz, W, dx):
    """dx[n,c,i,j] = Σ_{o,p,q} W[o,c,p,q] dz[n,o,i−p+r,j−q+r], one thread per input pixel."""
    idx = cuda.grid(1)
    if idx < dx.size:
        conv_dx_at(dz, W, dx, idx)


@cuda_jit
def _conv2d_dw_kernel(x, dz, dW):
    """dW[o,c,p,q] = Σ_{n,i,j} dz[n,o,i,j] x[n,c,i+p−r,j+q−r], one thread per weight."""
    idx = cuda.grid(1)
    if idx < dW.size:
        _, C, k, _ = dW.shape
        q = idx % k
        p = (idx // k) % k
        c = (idx // (k * k)) % C
        o = idx // (k * k * C)
        dW[o, c, p, q] = conv_dw_sum(x, dz, o, c, p, q, k)


@cuda_jit
def _channel_sum_kernel(dz, out):
    """out[o] = Σ_{n,i,j} dz[n,o,i,j], one thread per channel o."""
    o = cuda.grid(1)
    if o < dz.shape[1]:
        out[o] = channel_sum(dz, o)


# ----------------------------------------------------------------------------- conv
def conv2d(x, W, b):
    """'Same' cross-correlation (reference.conv2d): a direct kernel, one thread per output."""
    if not cuda_floats(x, W, b):
        return reference.conv2d(x, W, b)
    check_conv_args(x, W, b)
    call, dtype = KernelCall(x, W, b, names=("x", "W", "b")), common_dtype(x, W, b)
    z = call.out((x.shape[0], W.shape[0], *x.shape[2:]), dtype)
    bias = call.arg(b, dtype) if b is not None else call.placeholder(dtype)
    _conv2d_kernel[blocks(z.arg.size), THREADS](
        call.arg(x, dtype), call.arg(W, dtype), bias, b is not None, z.arg)
    return call.result(z)


def conv2d_adjoint(x, W, dz):
    """(dx, dW, db) of conv2d (reference.conv2d_adjoint): three gather kernels, no atomics."""
    if not cuda_floats(x, W, dz):
        return reference.conv2d_adjoint(x, W, dz)
    check_conv_args(x, W, dz=dz)
    call, dtype = KernelCall(x, W, dz, names=("x", "W", "dz")), common_dtype(x, W, dz)
    xd, Wdev, dzd = call.arg(x, dtype), call.arg(W, dtype), call.arg(dz, dtype)
    dx, dW, db = call.out(x.shape, dtype), call.out(W.shape, dtype), call.out(W.shape[0], dtype)
    _conv2d_dx_kernel[blocks(dx.arg.size), THREADS](dzd, Wdev, dx.arg)
    _conv2d_dw_kernel[blocks(dW.arg.size), THREADS](xd, dzd, dW.arg)
    _channel_sum_kernel[blocks(W.shape[0]), THREADS](dzd, db.arg)
    return call.result(dx), call.result(dW), call.result(db)
