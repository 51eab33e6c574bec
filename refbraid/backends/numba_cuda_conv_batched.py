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

The whole conv ODE step, k at once (``conv_step_batched`` / ``conv_step_batched_adjoint``,
which :class:`refbraid.layers.ConvStep`'s batched methods call where a backend offers them)::

    _conv_step_rows_kernel        Z as above, then Y_next = Y + h[j] σ(Z) at the same index
    _scaled_adjoint_rows_kernel   S = h[j] σ'(Z) ⊙ dY_next     (numba_cuda_batched)
    _conv2d_dx_rows_kernel        dY = dY_next + W *ᵀ S         (the addend added to the sum)

forward 4 launches → 1 (the convolution, σ, ×h, + of the composition), adjoint 4 → 2 without
the weight gradient, 6 → 4 with it. The Euler update is :func:`numba_cuda_step.euler_at`:
σ(Z), h σ and the sum each rounded to the dtype, h in the dtype, as the launches it replaces
round them, so the fused step has their bits (tests/test_cuda_fused_conv.py, in the
simulator; on a GPU a compiler that contracts h σ + Y into one fused multiply-add changes the
last bit).

Shape legend: k rows, B batch, C input channels, O output channels, H, W image size, s odd
kernel size, ``r = s // 2``; index terms outside the image are zero.
"""

from __future__ import annotations

from . import reference_batched
from .numba_cuda import THREADS, blocks, common_dtype, cuda, cuda_floats, cuda_jit, size
from .numba_cuda_conv import channel_sum, conv_dw_sum, conv_dx_sum, conv_sum, unflatten4
from .numba_cuda_memory import KernelCall
from .numba_cuda_step import euler_at

OVERRIDES = ("conv2d_batched", "conv2d_adjoint_batched", "conv_step_batched",
             "conv_step_batched_adjoint") if cuda is not None else ()


# ----------------------------------------------------------------------------- kernels
# The per-step kernels' sums (numba_cuda_conv's device functions) on row j's 4-D views.
@cuda_jit(device=True)
def _row_at(idx, shape):
    """(j, (n, c, i, l)) of the flat C-order position ``idx`` in a 5-D ``shape`` (k, B, C,
    H, W): the row, and the index in the row's 4-D view (numba_cuda_conv.unflatten4)."""
    per_row = shape[1] * shape[2] * shape[3] * shape[4]
    return idx // per_row, unflatten4(idx % per_row, shape[1:])


@cuda_jit(device=True)
def _conv_at(x, W, bias, has_bias, z, idx):
    """z at the flat index idx of (j, n, o, i, l): b[j,o] + Σ_{c,p,q} W[j,o,c,p,q]
    x[j,n,c,i+p−r,l+q−r], the bias added last; returns the index (j, n, o, i, l)."""
    j, (n, o, i, l_) = _row_at(idx, z.shape)
    acc = conv_sum(x[j], W[j], n, o, i, l_)
    if has_bias:
        acc += bias[j, o]
    z[j, n, o, i, l_] = acc
    return (j, n, o, i, l_)


@cuda_jit
def _conv2d_rows_kernel(x, W, bias, has_bias, z):
    """z[j,n,o,i,l] = b[j,o] + Σ_{c,p,q} W[j,o,c,p,q] x[j,n,c,i+p−r,l+q−r], one thread
    per output element."""
    idx = cuda.grid(1)
    if idx < z.size:
        _conv_at(x, W, bias, has_bias, z, idx)


@cuda_jit
def _conv_step_rows_kernel(x, W, bias, h, code, z, out):
    """The whole forward of k conv ODE steps, one thread per output element: z as
    :func:`_conv2d_rows_kernel` (with the bias), then out = x + h[j] σ(z) at the same
    index (:func:`numba_cuda_step.euler_at`; a step has as many output channels as input)."""
    idx = cuda.grid(1)
    if idx < z.size:
        at = _conv_at(x, W, bias, True, z, idx)
        euler_at(x, z, h[at[0]], code, out, at)


@cuda_jit
def _conv2d_dx_rows_kernel(dz, W, addend, has_addend, dx):
    """dx[j,n,c,i,l] = Σ_{o,p,q} W[j,o,c,p,q] dz[j,n,o,i−p+r,l−q+r] (+ addend[j,n,c,i,l],
    added to the stored sum: the conv step's dY_next + W *ᵀ S), one thread per input pixel."""
    idx = cuda.grid(1)
    if idx < dx.size:
        j, (n, c, i, l_) = _row_at(idx, dx.shape)
        dx[j, n, c, i, l_] = conv_dx_sum(dz[j], W[j], n, c, i, l_)
        if has_addend:
            dx[j, n, c, i, l_] = addend[j, n, c, i, l_] + dx[j, n, c, i, l_]


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
    dx, dW, db = _adjoint_launches(call, X, Wdev, dzd, None, grads, dtype)
    return call.result(dx), *(None if g is None else call.result(g) for g in (dW, db))


def _adjoint_launches(call: KernelCall, X, Wdev, dzd, addend, grads: bool, dtype):
    """Outputs (dx, dW, db) of the gather kernels on kernel arguments ``Wdev``, ``dzd`` and
    the input ``X`` (``addend``: a kernel argument added into dx; dW, db None without
    ``grads``)."""
    dx = call.out(X.shape, dtype)
    add = addend if addend is not None else call.placeholder(dtype, 5)
    _conv2d_dx_rows_kernel[blocks(dx.arg.size), THREADS](dzd, Wdev, add, addend is not None,
                                                         dx.arg)
    if not grads:
        return dx, None, None
    dW, db = call.out(Wdev.shape, dtype), call.out(Wdev.shape[:2], dtype)
    _conv2d_dw_rows_kernel[blocks(dW.arg.size), THREADS](call.arg(X, dtype), dzd, dW.arg)
    _channel_sum_rows_kernel[blocks(db.arg.size), THREADS](dzd, db.arg)
    return dx, dW, db


# ----------------------------------------------------------------------------- whole conv steps
def _step_applies(act: str, *arrays) -> bool:
    """The fused step kernels take the arguments: a known activation, float32/float64 host
    or device arrays of one dtype."""
    from .numba_cpu import activation_code

    return (activation_code(act) >= 0 and cuda_floats(*arrays)
            and len({common_dtype(a) for a in arrays}) == 1)


def _check_step_args(Y, W, b=None) -> None:
    """check_batched_conv_args, and W square in its channels (a step maps C to C)."""
    check_batched_conv_args(Y, W, b)
    if W.shape[1] != Y.shape[2]:
        raise ValueError(f"`W` must map the {Y.shape[2]} channels of `Y` to as many, got "
                         f"shape {tuple(W.shape)}.")


def conv_step_batched(Y, W, b, h, act: str):
    """k conv ODE steps ``Z = W * Y + b``, ``Y_next = Y + h σ(Z)`` (ConvStep.forward_batched)
    in ONE launch (:func:`_conv_step_rows_kernel`; before: the convolution, σ, ×h and + in
    four). Y (k,B,C,H,W), W (k,C,C,s,s), b (k,C), h (k,) step sizes; returns (Y_next, Z).
    Bit-identical to the launches it replaces (h cast to the dtype, each operation rounded
    to it: :func:`numba_cuda_step.euler_at`)."""
    from .numba_cpu import activation_code
    from .numba_cuda_batched import _step_sizes

    if not _step_applies(act, Y, W, b):
        return _composed_step(Y, W, b, h, act)
    _check_step_args(Y, W, b)
    call, dtype = KernelCall(Y, W, b, names=("Y", "W", "b")), common_dtype(Y, W, b)
    z, out = call.out(Y.shape, dtype), call.out(Y.shape, dtype)
    _conv_step_rows_kernel[blocks(size(Y)), THREADS](
        call.arg(Y, dtype), call.arg(W, dtype), call.arg(b, dtype), _step_sizes(call, h, dtype),
        activation_code(act), z.arg, out.arg)
    return call.result(out), call.result(z)


def conv_step_batched_adjoint(Y, Z, dY_next, W, h, act: str, grads: bool = True):
    """ConvStep.adjoint_batched in two launches without ``grads`` (``S = h σ'(Z) ⊙ dY_next``
    in one, ``dY = dY_next + W *ᵀ S`` in the transposed convolution's; before: four), four
    with them (dW, db as :func:`conv2d_adjoint_batched`; before: six). Returns (dY, dW, db),
    dW and db None without ``grads``; bit-identical to the launches it replaces."""
    from .numba_cpu import activation_code
    from .numba_cuda_batched import _scaled_adjoint_rows_kernel, _step_sizes

    if not _step_applies(act, Y, Z, dY_next, W):
        return _composed_adjoint(Y, Z, dY_next, W, h, act, grads)
    _check_step_args(Y, W)
    check_batched_conv_args(Y, W, dZ=dY_next)
    call = KernelCall(Y, Z, dY_next, W, names=("Y", "Z", "dY_next", "W"))
    dtype, n = common_dtype(Y, Z, dY_next, W), size(Y)
    S = call.out(n, dtype)
    _scaled_adjoint_rows_kernel[blocks(n), THREADS](
        call.arg(Z, dtype, (n,)), call.arg(dY_next, dtype, (n,)), _step_sizes(call, h, dtype),
        n // Y.shape[0], activation_code(act), S.arg)
    dY, dW, db = _adjoint_launches(call, Y, call.arg(W, dtype), S.arg.reshape(tuple(Y.shape)),
                                   call.arg(dY_next, dtype), grads, dtype)
    return call.result(dY), *(None if g is None else call.result(g) for g in (dW, db))


def _composed_step(Y, W, b, h, act):
    """The forward from this backend's per-operation kernels (inputs the fused kernel does
    not take: complex, mixed dtypes, an activation without a code)."""
    from .device_batching import values_on
    from .numba_cuda import activation

    hs = values_on(Y, h, Y.dtype)[:, None, None, None, None]
    Z = conv2d_batched(Y, W, b)
    return Y + hs * activation(Z, act), Z


def _composed_adjoint(Y, Z, dY_next, W, h, act, grads):
    """The adjoint from this backend's per-operation kernels (as :func:`_composed_step`)."""
    from .device_batching import values_on
    from .numba_cuda import activation_adjoint

    hs = values_on(dY_next, h, dY_next.dtype)[:, None, None, None, None]
    dYs, dW, db = conv2d_adjoint_batched(Y, W, hs * activation_adjoint(Z, dY_next, act), grads)
    return dY_next + dYs, dW, db
