"""Numba CUDA kernels (backend ``"cuda"``): the dense ODE step's adjoint as its GEMMs plus
two fused kernels, one step or k at once.

The adjoint of ``y_next = y + h σ(y Wᵀ + b)`` (:class:`refbraid.layers.DenseStep`;
reference :func:`refbraid.backends.reference_batched.dense_step_adjoint`)::

    s  = h σ'(z) ⊙ dy_next          _scaled_adjoint_kernel       one thread per element
    p  = s W                        the tiled GEMM               (numba_cuda_dense)
    dW = sᵀ y                       the tiled GEMM
    dy = dy_next + p,  db = Σ_B s   _add_column_sums_kernel      ≤ 32 columns × ≤ 8 groups

Composed of the per-operation kernels a step issued six launches (σ'·dy, ×h in the glue, two
GEMMs, the column sum, + in the glue); here four: the step size is applied inside the
element-wise kernel, and the last sum rides along the column sums (a block of up to 32
neighbouring columns × up to 8 row groups, each thread walking every groups-th row of its
column: coalesced, as neighbouring threads read neighbouring columns; numba_cuda_dense's
column-sum geometry). Without ``grads`` (MGRIT's relaxation) a step is two launches
(σ'·dy·h, and the GEMM with ``dy_next`` added in its epilogue: ``numba_cuda_dense._store``,
the product rounded to the dtype first; before, three: + in the glue).
The forward step is already one GEMM with the bias fused (``numba_cuda_dense.linear``) and
one element-wise kernel (``numba_cuda.euler_act``). k steps at once
(``numba_cuda_batched.dense_adjoint_batched``) launch the same sequence with the batched
GEMM and :func:`add_column_sums` over the stack.

Round-off: bit-identical to the per-operation cuda path it replaces (the same roundings:
σ'·dy is rounded to the dtype before the multiplication by h, which is h cast to the dtype
as the glue's ``h * s`` casts a Python float; the column sums accumulate in float64 in the
order ``_column_sum_kernel`` uses, which depends on B alone), tested in the simulator;
against NumPy's reference, the column sum's accumulation order and precision (float64,
then rounded) differ: ≤ a few ulp of the sum (tests/test_gpu_fused.py).

Shape legend: k rows (one for a single step), B batch, C width.
"""

from __future__ import annotations

import numba
import numpy as np

from . import numba_cuda_memory as mem
from .numba_cpu import activation_code
from .numba_cuda import THREADS, _act_adjoint_dev, _act_dev, blocks, cuda, cuda_jit
from .numba_cuda_dense import COLUMN_SUM_SHARED, column_sum_geometry, column_tree
from .numba_cuda_memory import KernelCall

OVERRIDES = ("dense_step_adjoint",) if cuda is not None else ()


# ----------------------------------------------------------------------------- device functions
# One element of a fused chain each, at index ``i`` (an int on flat arrays, a tuple on N-D
# ones); every intermediate is stored in ``out`` (rounded to its dtype) before the next
# operation, as the per-operation launches round it.
@cuda_jit(device=True)
def scaled_adjoint_at(z, dy, h, code, out, i):
    """out[i] = h · (σ'(z[i]) dy[i]), σ'·dy rounded to the dtype first; ``h`` a scalar of
    the dtype."""
    out[i] = _act_adjoint_dev(z[i], dy[i], code)
    out[i] = h * out[i]


@cuda_jit(device=True)
def euler_at(y, z, h, code, out, i):
    """out[i] = y[i] + h σ(z[i]), σ(z) and h σ each rounded to the dtype (the array path's
    σ, ×h and + launches); ``h`` a scalar of the dtype."""
    out[i] = _act_dev(z[i], code)
    out[i] = h * out[i]
    out[i] = y[i] + out[i]


# ----------------------------------------------------------------------------- kernels
@cuda_jit
def _scaled_adjoint_kernel(z, dy, h, code, out):
    """out[i] = h · (σ'(z[i]) dy[i]) on flat arrays (:func:`scaled_adjoint_at`)."""
    i = cuda.grid(1)
    if i < z.size:
        scaled_adjoint_at(z, dy, h, code, out, i)


@cuda_jit
def _add_column_sums_kernel(p, dy_next, s, dy, db, width, groups):
    """dy[j, n, c] = dy_next[j, n, c] + p[j, n, c] and db[j, c] = Σ_n s[j, n, c]: block b
    takes columns of row j = b // tiles, thread (c, g) walks rows g, g + groups, … writing dy
    and summing s in float64, the partial sums then added as the composed path's
    ``_column_sum_kernel`` adds them (numba_cuda_dense: the same bits)."""
    part = cuda.shared.array(COLUMN_SUM_SHARED, numba.float64)
    C = p.shape[2]
    tiles = (C + width - 1) // width
    t = cuda.threadIdx.x
    j = cuda.blockIdx.x // tiles
    c = (cuda.blockIdx.x % tiles) * width + t % width
    acc = 0.0
    if c < C:
        for n in range(t // width, p.shape[1], groups):
            dy[j, n, c] = dy_next[j, n, c] + p[j, n, c]
            acc += s[j, n, c]
    part[t] = acc
    cuda.syncthreads()
    column_tree(part, t, width, groups)
    if t < width and c < C:
        db[j, c] = part[t]


# ----------------------------------------------------------------------------- host side
def applies(act: str, *arrays) -> bool:
    """True when these kernels take the arguments: numba-cuda present, a known activation,
    float32/float64 arrays of one dtype, all the backend's device arrays or all NumPy."""
    if cuda is None or activation_code(act) < 0:
        return False
    on_device = all(mem.is_backend_array(a) for a in arrays)
    if not (on_device or all(isinstance(a, np.ndarray) for a in arrays)):
        return False
    dtypes = {mem.numpy_dtype(a) for a in arrays}
    return len(dtypes) == 1 and dtypes.pop().char in "fd"


def add_column_sums(call: KernelCall, P, dY_next, S, dtype, k: int, B: int, C: int):
    """Launch :func:`_add_column_sums_kernel` on the kernel arguments ``P`` and ``S`` (k·B·C
    values each, any shape) and the input ``dY_next``: returns the outputs (dY (k, B, C),
    db (k, C))."""
    dY, db = call.out((k, B, C), dtype), call.out((k, C), dtype)
    width, groups = column_sum_geometry(B, C)
    _add_column_sums_kernel[k * blocks(C, width), width * groups](
        P.reshape((k, B, C)), call.arg(dY_next, dtype, (k, B, C)), S.reshape((k, B, C)),
        dY.arg, db.arg, width, groups)
    return dY, db


def dense_step_adjoint(y, z, dy_next, W, h: float, act: str, grads: bool = True):
    """reference_batched.dense_step_adjoint: one element-wise kernel, the GEMMs, and the sum
    with the column sums (module docstring), where :func:`applies`; else the composition of
    this backend's per-operation kernels."""
    from .numba_cuda_dense import _gemm

    if not applies(act, y, z, dy_next, W) or len(tuple(y.shape)) != 2:
        return _composed(y, z, dy_next, W, h, act, grads)
    dtype = mem.numpy_dtype(y)
    (B, C), K = y.shape, W.shape[1]
    n = B * C
    call = KernelCall(y, z, dy_next, W, names=("y", "z", "dy_next", "W"))
    S = call.out(n, dtype)
    _scaled_adjoint_kernel[blocks(n), THREADS](call.arg(z, dtype, (n,)),
                                               call.arg(dy_next, dtype, (n,)), dtype.type(h),
                                               activation_code(act), S.arg)
    Sd = S.arg.reshape((B, C))
    if not grads:  # dy = dy_next + s W in the GEMM's epilogue
        P = _gemm(call, Sd, call.arg(W, dtype), False, False, B, K, dtype,
                  addend=call.arg(dy_next, dtype))
        return call.result(P), None, None
    P = _gemm(call, Sd, call.arg(W, dtype), False, False, B, K, dtype)  # s W: B,K
    dW = _gemm(call, Sd, call.arg(y, dtype), True, False, C, K, dtype)  # sᵀ y: C,K
    dy, db = add_column_sums(call, P.arg, dy_next, Sd, dtype, 1, B, C)
    return call.result(dy, (B, C)), call.result(dW), call.result(db, (C,))


def _composed(y, z, dy_next, W, h, act, grads):
    """The adjoint from this backend's per-operation kernels (inputs the kernels above do not
    take: complex, mixed dtypes, host and device mixed)."""
    from . import numba_cuda, numba_cuda_dense

    s = h * numba_cuda.activation_adjoint(z, dy_next, act)
    if not grads:
        return dy_next + numba_cuda_dense.matmul(s, W), None, None
    ds_W, dW, db = numba_cuda_dense.linear_adjoint(y, W, s)
    return dy_next + ds_W, dW, db
