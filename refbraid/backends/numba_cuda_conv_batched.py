"""Numba CUDA kernels (backend ``"cuda"``): the 'same' 2-D convolution of k intervals at once.

The batched twin of :mod:`refbraid.backends.numba_cuda_conv` for MGRIT's batched sweeps of
:class:`refbraid.layers.ConvStep`: row j of the stack has its own weights ``W[j]`` and bias
``b[j]``, and every kernel is the per-step kernel with a leading row index j in the flat
thread index (one launch per pass over all k rows)::

    _conv2d_rows_kernel     Z[j,n,o,i,l] = b[j,o] + Σ_{c,p,q} W[j,o,c,p,q] X[j,n,c,i+p−r,l+q−r]
    _conv2d_dx_rows_kernel  dX[j,n,c,i,l] = Σ_{o,p,q} W[j,o,c,p,q] dZ[j,n,o,i−p+r,l−q+r]
    _conv2d_dw_rows_kernel  dW[j,o,c,p,q] = Σ_{n,i,l} dZ[j,n,o,i,l] X[j,n,c,i+p−r,l+q−r]
    _channel_sum_rows_kernel  db[j,o] = Σ_{n,i,l} dZ[j,n,o,i,l]

Each output element is the per-step kernel's sum (the device functions of
:mod:`refbraid.backends.numba_cuda_conv`) on row j's views, the bias added last as there, so
every row has the bits of a per-step :func:`refbraid.backends.numba_cuda_conv.conv2d` /
``conv2d_adjoint`` call (tests/test_cuda_conv_batched.py, in the CUDA simulator). Against
the NumPy reference (:func:`refbraid.backends.reference_batched.conv2d_batched`, nine stencil
offsets of GEMMs) the sums run in another order: equal to round-off.

Catalogue kernels ``conv2d_batched`` / ``conv2d_adjoint_batched``
(:data:`refbraid.backends.KERNELS`): these kernels for float32/float64 host or device arrays,
else the reference. A batched
forward is one launch, its adjoint one (dX only) or three (with dW, db), instead of that many
per interval: :mod:`refbraid.backends.device_batching` counts what a sweep saves.

Shape legend: k rows, B batch, C input channels, O output channels, H, W image size, s odd
kernel size, ``r = s // 2``; index terms outside the image are zero.
"""

from __future__ import annotations

from . import reference_batched
from .numba_cuda import THREADS, blocks, common_dtype, cuda, cuda_floats, cuda_jit
from .numba_cuda_conv import channel_sum, conv_dw_sum, conv_dx_sum, conv_sum
from .numba_cuda_memory import KernelCall

OVERRIDES = ("conv2d_batched", "conv2d_adjoint_batched") if cuda is not None else ()


# ----------------------------------------------------------------------------- kernels
# The per-step kernels' sums (numba_cuda_conv's device functions) on row j's 4-D views.
@cuda_jit
def _conv2d_rows_kernel(x, W, bias, has_bias, z):
    """z[j,n,o,i,l] = b[j,o] + Σ_{c,p,q} W[j,o,c,p,q] x[j,n,c,i+p−r,l+q−r], one thread
    per output element."""
    idx = cuda.grid(1)
    if idx < z.size:
        _, B, O, H, Wd = z.shape
        l_ = idx % Wd
        i = (idx // Wd) % H
        o = (idx // (Wd * H)) % O
        n = (idx // (Wd * H * O)) % B
        j = idx // (Wd * H * O * B)
        acc = conv_sum(x[j], W[j], n, o, i, l_)
        if has_bias:
            acc += bias[j, o]
        z[j, n, o, i, l_] = acc


@cuda_jit
def _conv2d_dx_rows_kernel(dz, W, dx):
    """dx[j,n,c,i,l] = Σ_{o,p,q} W[j,o,c,p,q] dz[j,n,o,i−p+r,l−q+r], one thread per input
    pixel."""
    idx = cuda.grid(1)
    if idx < dx.size:
        _, B, C, H, Wd = dx.shape
        l_ = idx % Wd
        i = (idx // Wd) % H
        c = (idx // (Wd * H)) % C
        n = (idx // (Wd * H * C)) % B
        j = idx // (Wd * H * C * B)
        dx[j, n, c, i, l_] = conv_dx_sum(dz[j], W[j], n, c, i, l_)


@cuda_jit
def _conv2d_dw_rows_kernel(x, dz, dW):
    """dW[j,o,c,p,q] = Σ_{n,i,l} dz[j,n,o,i,l] x[j,n,c,i+p−r,l+q−r], one thread per weight."""
    idx = cuda.grid(1)
    if idx < dW.size:
        _, O, C, k, _ = dW.shape
        q = idx % k
        p = (idx // k) % k
        c = (idx // (k * k)) % C
        o = (idx // (k * k * C)) % O
        j = idx // (k * k * C * O)
        dW[j, o, c, p, q] = conv_dw_sum(x[j], dz[j], o, c, p, q, k)


@cuda_jit
def _channel_sum_rows_kernel(dz, out):
    """out[j,o] = Σ_{n,i,l} dz[j,n,o,i,l], one thread per (row, channel)."""
    idx = cuda.grid(1)
    if idx < out.size:
        O = dz.shape[2]
        out[idx // O, idx % O] = channel_sum(dz[idx // O], idx % O)


# ----------------------------------------------------------------------------- checks
def check_batched_conv_args(X, W, b=None, dZ=None) -> None:
    """ValueError unless X: (k, B, C, H, W), W: (k, O, C, s, s) odd s, b: (k, O),
    dZ: (k, B, O, H, W)."""
    if len(X.shape) != 5:
        raise ValueError(f"`X` must be 5-D (rows, batch, channels, height, width), got shape "
                         f"{tuple(X.shape)}.")
    k, _, C = X.shape[:3]
    if len(W.shape) != 5 or W.shape[0] != k or W.shape[2] != C or W.shape[3] != W.shape[4] \
            or W.shape[4] % 2 == 0:
        raise ValueError(f"`W` must have shape ({k}, out_channels, {C}, s, s) with odd s, got "
                         f"{tuple(W.shape)}.")
    O = W.shape[1]
    if b is not None and tuple(b.shape) != (k, O):
        raise ValueError(f"`b` must have shape ({k}, {O}), got {tuple(b.shape)}.")
    expected = (k, X.shape[1], O, X.shape[3], X.shape[4])
    if dZ is not None and tuple(dZ.shape) != expected:
        raise ValueError(f"`dZ` must have shape {expected}, got {tuple(dZ.shape)}.")


# ----------------------------------------------------------------------------- catalogue entries
def conv2d_batched(X, W, b):
    """reference_batched.conv2d_batched: ``Z[j] = conv2d(X[j], W[j], b[j])`` in one launch."""
    if not cuda_floats(X, W, b):
        return reference_batched.conv2d_batched(X, W, b)
    check_batched_conv_args(X, W, b)
    call, dtype = KernelCall(X, W, b, names=("X", "W", "b")), common_dtype(X, W, b)
    z = call.out((*X.shape[:2], W.shape[1], *X.shape[3:]), dtype)
    bias = call.arg(b, dtype) if b is not None else call.placeholder(dtype, 2)
    _conv2d_rows_kernel[blocks(z.arg.size), THREADS](
        call.arg(X, dtype), call.arg(W, dtype), bias, b is not None, z.arg)
    return call.result(z)


def conv2d_adjoint_batched(X, W, dZ, grads: bool = True):
    """reference_batched.conv2d_adjoint_batched: (dX, dW, db) of every row, gather kernels
    over all rows at once (dX only without ``grads``; dW, db None then)."""
    if not cuda_floats(X, W, dZ):
        return reference_batched.conv2d_adjoint_batched(X, W, dZ, grads)
    check_batched_conv_args(X, W, dZ=dZ)
    call, dtype = KernelCall(X, W, dZ, names=("X", "W", "dZ")), common_dtype(X, W, dZ)
    Wdev, dzd = call.arg(W, dtype), call.arg(dZ, dtype)
    dx = call.out(X.shape, dtype)
    _conv2d_dx_rows_kernel[blocks(dx.arg.size), THREADS](dzd, Wdev, dx.arg)
    if not grads:
        return call.result(dx), None, None
    dW, db = call.out(W.shape, dtype), call.out(W.shape[:2], dtype)
    _conv2d_dw_rows_kernel[blocks(dW.arg.size), THREADS](call.arg(X, dtype), dzd, dW.arg)
    _channel_sum_rows_kernel[blocks(db.arg.size), THREADS](dzd, db.arg)
    return call.result(dx), call.result(dW), call.result(db)
