"""Numba CUDA kernels (backend ``"cuda"``): one conv ODE step whole (serial backprop and
MGRIT's per-step sweeps; :mod:`refbraid.backends.numba_cuda_conv_batched` does k at once).

The catalogue kernels ``conv_step`` / ``conv_step_adjoint`` (reference
:mod:`refbraid.backends.reference_conv_step`)::

    _conv_step_kernel        z = W * y + b, then y_next = y + h σ(z) at the same index
    _scaled_adjoint_kernel   s = h σ'(z) ⊙ dy_next                 (numba_cuda_step)
    _conv2d_dx_add_kernel    dy = dy_next + W *ᵀ s                  (the addend added last)
    with grads: numba_cuda_conv's dW and db kernels on s

Launches per step, against the per-operation path of this backend (the convolution, then
``euler_act``; σ'·dy, ×h, the three adjoint kernels and the sum): forward 2 → 1, adjoint
6 → 2 without the weight gradient (the composed path computed dW and db and dropped them)
and 6 → 4 with it. Each output element is the per-step convolution kernel's sum (the device
functions of :mod:`refbraid.backends.numba_cuda_conv`, bias added last) and the Euler update
of :func:`numba_cuda_step.euler_at` (σ(z), h σ and the sum each rounded to the dtype, h in
the dtype), so a step has the bits of ``conv_step_batched`` with k = 1
(tests/test_cuda_conv_step.py, in the simulator). The per-operation ``euler_act`` multiplies
by h in float64: in float32 the two differ in the last bit; in float64 they agree.

``out=`` is not written (a new device array is returned, as on every device backend);
``add=`` is added after the step (``into.plus``: MGRIT adds its right-hand side on device
arrays by block operations, not through the step). Inputs the kernels do not take (complex,
mixed dtypes, an activation without a code) take the per-operation path.
"""

from __future__ import annotations

from .into import plus
from .numba_cpu import activation_code
from .numba_cuda import THREADS, blocks, common_dtype, cuda, cuda_floats, cuda_jit, size
from .numba_cuda_conv import (
    _channel_sum_kernel,
    _conv2d_dw_kernel,
    check_conv_args,
    conv_at,
    conv_dx_at,
)
from .numba_cuda_memory import KernelCall
from .numba_cuda_step import _scaled_adjoint_kernel, euler_at

OVERRIDES = ("conv_step", "conv_step_adjoint") if cuda is not None else ()


# ----------------------------------------------------------------------------- kernels
@cuda_jit
def _conv_step_kernel(x, W, bias, h, code, z, out):
    """z[n,o,i,j] = b[o] + Σ_{c,p,q} W[o,c,p,q] x[n,c,i+p−r,j+q−r], then out = x + h σ(z) at
    that index (:func:`numba_cuda_step.euler_at`), one thread per output element."""
    idx = cuda.grid(1)
    if idx < z.size:
        euler_at(x, z, h, code, out, conv_at(x, W, bias, True, z, idx))


@cuda_jit
def _conv2d_dx_add_kernel(dz, W, addend, dx):
    """dx[n,c,i,j] = addend[n,c,i,j] + Σ_{o,p,q} W[o,c,p,q] dz[n,o,i−p+r,j−q+r], the sum
    stored (rounded) first, one thread per input pixel."""
    idx = cuda.grid(1)
    if idx < dx.size:
        at = conv_dx_at(dz, W, dx, idx)
        dx[at] = addend[at] + dx[at]


# ----------------------------------------------------------------------------- catalogue entries
def _applies(act: str, *arrays) -> bool:
    """A known activation and float32/float64 host or device arrays of one dtype."""
    return (activation_code(act) >= 0 and cuda_floats(*arrays)
            and len({common_dtype(a) for a in arrays}) == 1)


def _check_step(y, W, b=None, dz=None) -> None:
    check_conv_args(y, W, b, dz)
    if W.shape[0] != y.shape[1]:
        raise ValueError(f"`W` must map the {y.shape[1]} channels of `y` to as many, got shape "
                         f"{tuple(W.shape)}.")


def conv_step(y, W, b, h: float, act: str, out=None, add=None):
    """reference_conv_step.conv_step in ONE launch: ``z = W * y + b``, ``y_next = y + h σ(z)``
    (``+ add`` after it); returns (y_next, z)."""
    from .reference_conv_step import conv_step as composed

    if b is None or not _applies(act, y, W, b):
        return composed(y, W, b, h, act, add=add)
    _check_step(y, W, b)
    call, dtype = KernelCall(y, W, b, names=("y", "W", "b")), common_dtype(y, W, b)
    z, y_next = call.out(y.shape, dtype), call.out(y.shape, dtype)
    _conv_step_kernel[blocks(size(y)), THREADS](
        call.arg(y, dtype), call.arg(W, dtype), call.arg(b, dtype), dtype.type(h),
        activation_code(act), z.arg, y_next.arg)
    return plus(call.result(y_next), add), call.result(z)


def conv_step_adjoint(y, z, dy_next, W, h: float, act: str, grads: bool = True, out=None,
                      add=None):
    """reference_conv_step.conv_step_adjoint in two launches without ``grads`` (``s = h σ'(z)
    ⊙ dy_next``; ``dy = dy_next + W *ᵀ s``), four with them (dW, db); returns (dy, dW, db),
    dW and db None without ``grads``; ``+ add`` in dy after it."""
    from .reference_conv_step import conv_step_adjoint as composed

    if not _applies(act, y, z, dy_next, W):
        return composed(y, z, dy_next, W, h, act, grads, add=add)
    _check_step(y, W, dz=dy_next)
    call = KernelCall(y, z, dy_next, W, names=("y", "z", "dy_next", "W"))
    dtype, n = common_dtype(y, z, dy_next, W), size(y)
    s = call.out(n, dtype)
    _scaled_adjoint_kernel[blocks(n), THREADS](
        call.arg(z, dtype, (n,)), call.arg(dy_next, dtype, (n,)), dtype.type(h),
        activation_code(act), s.arg)
    sd, Wdev = s.arg.reshape(tuple(y.shape)), call.arg(W, dtype)
    dy = call.out(y.shape, dtype)
    _conv2d_dx_add_kernel[blocks(n), THREADS](sd, Wdev, call.arg(dy_next, dtype), dy.arg)
    if not grads:
        return plus(call.result(dy), add), None, None
    dW, db = call.out(W.shape, dtype), call.out(W.shape[0], dtype)
    _conv2d_dw_kernel[blocks(dW.arg.size), THREADS](call.arg(y, dtype), sd, dW.arg)
    _channel_sum_kernel[blocks(W.shape[0]), THREADS](sd, db.arg)
    return plus(call.result(dy), add), call.result(dW), call.result(db)
