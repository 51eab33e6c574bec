"""Numba CUDA kernels (backend ``"cuda"``): the dense ODE step on k intervals at once.

The batched twin of the per-step cuda path of :class:`refbraid.layers.DenseStep` (as
:mod:`refbraid.backends.numba_cpu_batched` is for the numba backend): row j of the stack has
its own weights ``W[j]``, bias ``b[j]`` and step size ``h[j]``::

    forward   Z[j] = Y[j] W[j]ᵀ + b[j]              one batched GEMM launch (grid z = j)
              Y_next[j] = Y[j] + h[j] σ(Z[j])       one element-wise launch over the stack
    adjoint   S[j] = h[j] (σ'(Z[j]) ⊙ dY_next[j])   one element-wise launch (h· fused)
              P[j] = S[j] W[j],  dW[j] = S[j]ᵀ Y[j]  two batched GEMM launches
              dY[j] = dY_next[j] + P[j],  db[j] = Σ_B S[j]   one launch
                                                    (numba_cuda_step.add_column_sums;
                                                    without grads: in the GEMM, P = dY_next
                                                    + S W, the product rounded first)

k launches and 2k host↔device copies per array become one of each. Every row does what the
per-step path does (:mod:`refbraid.backends.numba_cuda_dense`'s tiled or per-element GEMM
device function on the row's 2-D views, chosen by the same rule; the element-wise kernels of
:mod:`refbraid.backends.numba_cuda`; ``h`` in float64 in the Euler update and in the array
dtype in the adjoint's host multiply, as the per-step calls take it), so the two are
bit-identical (tests/test_numba_batched.py, in the CUDA simulator).

Catalogue kernels ``dense_step_batched`` / ``dense_step_batched_adjoint``
(:data:`refbraid.backends.KERNELS`, reference in :mod:`refbraid.backends.reference_batched`,
cases in tests/test_backends.py): these kernels where :func:`applies` — the backend's device
arrays (device-resident: no copies but the k step sizes), or NumPy arrays (host-array mode,
:func:`refbraid.backends.with_host_arrays`; the copies are
:class:`~refbraid.backends.numba_cuda_memory.KernelCall`'s) — else the reference code with
this backend's activation kernels.

**Switched on** for MGRIT's sweeps (:data:`SWITCHED_ON`, read by
:func:`refbraid.backends.batched_sweeps_on`): one launch set per sweep instead of one per
interval cuts a layer-parallel gradient's launches 3–5× at N = 64–256 with the same dependency
depth (:mod:`refbraid.backends.device_batching`, counted without a GPU by
``python -m benchmarks quick counts``); the ``gpu`` suite's ``LP per-step`` / ``LP batched``
rows time it on a GPU (``python -m benchmarks quick gpu``).

Shape legend: k rows, B batch, C width; op(A) is A or Aᵀ per row.
"""

from __future__ import annotations

import numpy as np

from . import numba_cpu_batched
from . import numba_cuda_memory as mem
from .device_batching import copied_once
from .numba_cpu import activation_code
from .numba_cuda import (
    THREADS,
    _act_dev,
    blocks,
    cuda,
    cuda_jit,
    element_type,
    kernel_factory,
)
from .numba_cuda_dense import SHARED_TILE, SMALL_BLOCK, TILE, gemm_element, gemm_tile
from .numba_cuda_memory import KernelCall, Output
from .numba_cuda_step import add_column_sums, scaled_adjoint_at
from .reference_batched import _dense_adjoint, _dense_forward

#: Whether MGRIT's sweeps on ``cuda`` use batched steps (module docstring): on, by launch counts
#: (:data:`refbraid.backends.device_batching.SWITCHED_ON`).
SWITCHED_ON = True

OVERRIDES = ("dense_step_batched", "dense_step_batched_adjoint") if cuda is not None else ()


def applies(act: str, *arrays) -> bool:
    """True when these kernels take the arguments: numba-cuda present, a known activation, and
    either what :func:`refbraid.backends.numba_cpu_batched.applies` asks (host arrays) or
    float32/float64 device arrays of the backend, all of one dtype (else the array-API
    code runs)."""
    if cuda is None or activation_code(act) < 0:
        return False
    if numba_cpu_batched.applies(act, *arrays):
        return True
    if not all(mem.is_backend_array(a) for a in arrays):
        return False
    dtypes = {mem.numpy_dtype(a) for a in arrays}
    return len(dtypes) == 1 and dtypes.pop().char in "fd"


def _step_sizes(call: KernelCall, h, dtype):
    """The k step sizes as a kernel argument of ``dtype``: copied in with the inputs (host
    mode) or made on the device (one host→device copy of k numbers)."""
    h = np.asarray(h, dtype=dtype)
    if call.on_device:  # once per distinct set of step sizes (device_batching.copied_once)
        where = {} if mem.DEVICE is None else {"device": mem.DEVICE}
        copy = copied_once(("cuda", id(mem.xp), repr(mem.DEVICE)), h,
                           lambda v: mem.xp.asarray(v, **where))
        return call.arg(copy, dtype)
    return call.arg(h, dtype)


# ----------------------------------------------------------------------------- kernels
@kernel_factory
def gemm_batched_kernel(dtype: str):
    """The batched tiled GEMM for ``dtype`` (a name), shared tiles of that type (one kernel
    per dtype: a shared array's shape and type are compile-time constants)."""
    elem = element_type(dtype)

    @cuda_jit
    def _gemm_batched_kernel(A, B, C, trans_a, trans_b, bias, has_bias, addend, has_addend):
        """C[j] = op(A[j]) op(B[j]) (+ bias[j]) (+ addend[j]) for j = blockIdx.z: the tiled
        GEMM of numba_cuda_dense (:func:`~refbraid.backends.numba_cuda_dense.gemm_tile`) on
        row j of the stack per grid layer (``bias``, ``addend``: one-element placeholders
        when not given)."""
        sA = cuda.shared.array(SHARED_TILE, elem)
        sB = cuda.shared.array(SHARED_TILE, elem)
        j = cuda.blockIdx.z
        gemm_tile(A[j], B[j], C[j], trans_a, trans_b, bias[j if has_bias else 0], has_bias,
                  addend[j if has_addend else 0], has_addend, sA, sB)

    return _gemm_batched_kernel


@cuda_jit
def _gemm_batched_small_kernel(A, B, C, trans_a, trans_b, bias, has_bias, addend, has_addend):
    """The per-element GEMM of numba_cuda_dense
    (:func:`~refbraid.backends.numba_cuda_dense.gemm_element`), row j = blockIdx.z."""
    j = cuda.blockIdx.z
    row = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    col = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    gemm_element(A[j], B[j], C[j], row, col, trans_a, trans_b, bias[j if has_bias else 0],
                 has_bias, addend[j if has_addend else 0], has_addend)


@cuda_jit
def _euler_rows_kernel(y, z, h, n, code, out):
    """out[i] = y[i] + h[i // n] σ(z[i]) on the flat stack (k rows of n values).

    ``float(h[…])`` is a no-op on a GPU (h is float64 there, as the per-step kernel's scalar
    h); in the simulator it makes h a Python float like the per-step argument, whose NumPy
    promotion rules differ from a float64 scalar's."""
    i = cuda.grid(1)
    if i < z.size:
        out[i] = y[i] + float(h[i // n]) * _act_dev(z[i], code)


@cuda_jit
def _scaled_adjoint_rows_kernel(z, dy, h, n, code, out):
    """out[i] = h[i // n] · (σ'(z[i]) dy[i]) on the flat stack, σ'·dy stored (rounded to the
    dtype) before the scaling, as the per-step path's separate ``h * s`` rounds it; ``h``
    in the array dtype."""
    i = cuda.grid(1)
    if i < z.size:
        scaled_adjoint_at(z, dy, h[i // n], code, out, i)


# ----------------------------------------------------------------------------- host side
def _gemm(call: KernelCall, A, B, trans_a: bool, trans_b: bool, k: int, M: int, N: int, dtype,
          bias=None, addend=None) -> Output:
    """k GEMMs in one launch on kernel arguments (tiled, or per element below one tile of
    output per row: the per-step rule), ``addend`` (k, M, N) added to the products; returns
    the output C (k, M, N)."""
    C = call.out((k, M, N), dtype)
    b = bias if bias is not None else call.placeholder(dtype, 2)
    add = addend if addend is not None else call.placeholder(dtype, 3)
    flags = (b, bias is not None, add, addend is not None)
    if M * N < TILE * TILE:
        block = (min(M, SMALL_BLOCK), min(N, SMALL_BLOCK))
        grid = (blocks(M, block[0]), blocks(N, block[1]), k)
        _gemm_batched_small_kernel[grid, block](A, B, C.arg, trans_a, trans_b, *flags)
        return C
    grid = (blocks(N, TILE), blocks(M, TILE), k)
    gemm_batched_kernel(np.dtype(dtype).name)[grid, (TILE, TILE)](A, B, C.arg, trans_a, trans_b,
                                                                  *flags)
    return C


def dense_forward_batched(Y, W, b, h, act: str):
    """(Y_next, Z) of k dense steps (module docstring); host arrays in and out (the
    copies are :class:`KernelCall`'s)."""
    dtype = mem.numpy_dtype(Y)
    k, B, C = Y.shape
    n = k * B * C
    call = KernelCall(Y, W, b, names=("Y", "W", "b"))
    Z = _gemm(call, call.arg(Y, dtype), call.arg(W, dtype), False, True, k, B, C, dtype,
              call.arg(b, dtype))
    hd = _step_sizes(call, h, np.float64)  # float(h), as per step
    out = call.out(n, dtype)
    _euler_rows_kernel[blocks(n), THREADS](call.arg(Y, dtype, (n,)), Z.arg.reshape(n), hd,
                                           B * C, activation_code(act), out.arg)
    return call.result(out, Y.shape), call.result(Z)


def dense_adjoint_batched(Y, Z, dY_next, W, h, act: str, grads: bool = True):
    """(dY, dW, db) of k dense adjoint steps (module docstring); dW, db None without grads."""
    dtype = mem.numpy_dtype(Y)
    k, B, C = Y.shape
    n = k * B * C
    call = KernelCall(Y, Z, dY_next, W, names=("Y", "Z", "dY_next", "W"))
    S = call.out(n, dtype)  # h σ'(Z) ⊙ dY_next, one launch
    _scaled_adjoint_rows_kernel[blocks(n), THREADS](call.arg(Z, dtype, (n,)),
                                                    call.arg(dY_next, dtype, (n,)),
                                                    _step_sizes(call, h, dtype), B * C,
                                                    activation_code(act), S.arg)
    Sd, Wd = S.arg.reshape((k, B, C)), call.arg(W, dtype)
    if not grads:  # dY = dY_next + S W in the GEMM's epilogue
        P = _gemm(call, Sd, Wd, False, False, k, B, C, dtype,
                  addend=call.arg(dY_next, dtype, (k, B, C)))
        return call.result(P), None, None
    P = _gemm(call, Sd, Wd, False, False, k, B, C, dtype)
    dW = _gemm(call, Sd, call.arg(Y, dtype), True, False, k, C, C, dtype)
    dY, db = add_column_sums(call, P.arg, dY_next, Sd, dtype, k, B, C)  # + and Σ_B, one launch
    return call.result(dY), call.result(dW), call.result(db)


# ----------------------------------------------------------------------------- catalogue entries
def dense_step_batched(Y, W, b, h, act: str):
    """reference_batched.dense_step_batched: the batched launches where :func:`applies`."""
    from . import numba_cuda

    if applies(act, Y, W, b):
        return dense_forward_batched(Y, W, b, h, act)
    return _dense_forward(Y, W, b, h, act, numba_cuda.activation)


def dense_step_batched_adjoint(Y, Z, dY_next, W, h, act: str, grads: bool = True):
    """reference_batched.dense_step_batched_adjoint: the batched launches where
    :func:`applies`."""
    from . import numba_cuda

    if applies(act, Y, Z, dY_next, W):
        return dense_adjoint_batched(Y, Z, dY_next, W, h, act, grads)
    return _dense_adjoint(Y, Z, dY_next, W, h, act, grads, numba_cuda.activation_adjoint)
