"""Numba CUDA kernels of the transformer and GRU layers (merged into backend ``"cuda"``).

Every public function keeps the signature and semantics of the same-named function in
:mod:`refbraid.backends.reference` (section "transformer kernels") and, like the rest of the
``cuda`` backend, takes and returns device arrays (memory through
:class:`~refbraid.backends.numba_cuda_memory.KernelCall`: no copies; host arrays in, NumPy
out), so the same code runs on a GPU and under Numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``) in the tests. What runs on the device::

    bmm                c[g] = a[g] @ b[g]         tiled shared-memory GEMM (a TILE×TILE block
                                                  per output tile, blockIdx.z = matrix g) when
                                                  both output sides reach TILE; else one thread
                                                  per output element
    softmax            masked row softmax        one thread per row
    softmax_adjoint    p ⊙ (dp − Σ p ⊙ dp)       one thread per row
    layernorm          y, μ, r                   one thread per row
    layernorm_adjoint  dx; dγ, dβ                one thread per row; one thread per column for
                                                  the parameter sums (no atomics, deterministic)
    gru_cell           r, z, n, h_new            one thread per (sample, hidden unit)
    gru_cell_adjoint   dgx, dgh, dh              one thread per (sample, hidden unit)

The per-row and per-element bodies are plain functions of
:mod:`refbraid.backends.numba_cpu_attention` and :mod:`refbraid.backends.numba_cpu_layernorm`
(``softmax_row``, ``layernorm_row``, …), compiled here with ``cuda.jit(device=True)``
(``softmax_adjoint_row`` also by the CPU backend; the CPU softmax and layer norm run the same
math split into SIMD-friendly passes, see those modules). One thread per row suits the
short rows of attention (S keys) and layer norm (E features); a block-per-row tree reduction
is the next step for rows of thousands. ``bmm`` accumulates in float64 for float32 data too.
``embedding`` and ``embedding_adjoint`` stay the reference (a gather and a one-hot GEMM in
``xp``, on the device arrays); the scatter-add would need atomics.

Arrays that are not float32/float64 (complex steps) go to the reference unchanged, as in
the CPU module.

Design (for a GPU course): ``bmm`` maps the batch index to ``blockIdx.z`` so one launch
covers every head of every sample (launch overhead paid once, not G times); its tiles load
row-major operands with neighbouring threads on neighbouring addresses (coalesced). The
one-thread-per-row kernels (softmax, layer norm) read each row serially, so neighbouring
threads touch addresses a row apart: uncoalesced, acceptable for the short rows here and
clear to read; a warp per row (32 threads striding the row, a shuffle reduction) is the
coalesced version. The GRU kernels are one thread per (sample, unit) with the three gates of
a unit in registers: the gate algebra is fused into one pass after the two matmuls.

Shape legend: G batched matrices (batch·heads), M, K, N matrix sizes, R rows, N row length,
B batch, H GRU hidden size.
"""

from __future__ import annotations

import math

import numpy as np

try:
    from numba import cuda
except ImportError as err:  # numba without CUDA support: the cuda backend keeps the reference
    # kernels here; get_backend skips an optional module that reports itself missing.
    raise ModuleNotFoundError(f"{__name__} needs numba.cuda: {err}", name=__name__) from err

from . import reference
from .numba_cpu_attention import (
    check_gru,
    check_same_shape,
    check_vector,
    gru_cell_adjoint_point,
    gru_cell_point,
    softmax_adjoint_row,
    softmax_row,
)
from .numba_cpu_layernorm import (
    check_layernorm_adjoint_args,
    layernorm_adjoint_row,
    layernorm_param_col,
    layernorm_row,
)
from .numba_cuda import common_dtype, cuda_floats, element_type, kernel_factory, size
from .numba_cuda_memory import KernelCall, numpy_dtype

OVERRIDES = (
    "bmm",
    "softmax",
    "softmax_adjoint",
    "layernorm",
    "layernorm_adjoint",
    "gru_cell",
    "gru_cell_adjoint",
)

THREADS = 128  # threads per block of the one-thread-per-row/element kernels
TILE = 16  # edge of the square output tile (and thread block) of bmm
MAX_GRID_Z = 65535  # CUDA's limit on gridDim.z; bmm loops when there are more matrices

_softmax_row = cuda.jit(device=True)(softmax_row)
_softmax_adjoint_row = cuda.jit(device=True)(softmax_adjoint_row)
_layernorm_row = cuda.jit(device=True)(layernorm_row)
_layernorm_adjoint_row = cuda.jit(device=True)(layernorm_adjoint_row)
_layernorm_param_col = cuda.jit(device=True)(layernorm_param_col)
_gru_cell_point = cuda.jit(device=True)(gru_cell_point)
_gru_cell_adjoint_point = cuda.jit(device=True)(gru_cell_adjoint_point)


# ----------------------------------------------------------------------------- kernels
@cuda.jit
def _softmax_kernel(x, mask, use_mask, p):
    i = cuda.grid(1)
    if i < x.shape[0]:
        _softmax_row(x, mask, use_mask, p, i)


@cuda.jit
def _softmax_adjoint_kernel(p, dp, dx):
    i = cuda.grid(1)
    if i < p.shape[0]:
        _softmax_adjoint_row(p, dp, dx, i)


@cuda.jit
def _layernorm_kernel(x, gamma, beta, eps, y, mean, rstd):
    i = cuda.grid(1)
    if i < x.shape[0]:
        _layernorm_row(x, gamma, beta, eps, y, mean, rstd, i)


@cuda.jit
def _layernorm_adjoint_kernel(x, mean, rstd, gamma, dy, dx):
    i = cuda.grid(1)
    if i < x.shape[0]:
        _layernorm_adjoint_row(x, mean, rstd, gamma, dy, dx, i)


@cuda.jit
def _layernorm_param_kernel(x, mean, rstd, dy, dgamma, dbeta):
    j = cuda.grid(1)
    if j < x.shape[1]:
        _layernorm_param_col(x, mean, rstd, dy, dgamma, dbeta, j)


@cuda.jit
def _gru_cell_kernel(gx, gh, h, dt, implicit, h_new, gates):
    t = cuda.grid(1)
    if t < h.shape[0] * h.shape[1]:
        _gru_cell_point(gx, gh, h, dt, implicit, h_new, gates, t // h.shape[1], t % h.shape[1])


@cuda.jit
def _gru_cell_adjoint_kernel(gates, gh, h, dh_new, dt, implicit, dgx, dgh, dh):
    t = cuda.grid(1)
    if t < h.shape[0] * h.shape[1]:
        _gru_cell_adjoint_point(gates, gh, h, dh_new, dt, implicit, dgx, dgh, dh,
                                t // h.shape[1], t % h.shape[1])


@cuda.jit
def _bmm_simple_kernel(a, b, c):
    """One thread per output element c[g, i, j] = Σ_k a[g, i, k] b[g, k, j] (small matrices)."""
    t = cuda.grid(1)
    M, K, N = a.shape[1], a.shape[2], b.shape[2]
    if t < a.shape[0] * M * N:
        g, ij = t // (M * N), t % (M * N)
        i, j = ij // N, ij % N
        acc = 0.0
        for k in range(K):
            acc += a[g, i, k] * b[g, k, j]
        c[g, i, j] = acc


@kernel_factory
def bmm_tiled_kernel(dtype: str, tile: int):
    """The tiled batched GEMM for one element type (a dtype name) and tile edge (shared arrays
    need both at compile time).

    Block (tile, tile) computes c[g, row, col] for one output tile: for each K-tile, every
    thread loads one element of a and of b into shared memory, the block synchronises, and
    each thread accumulates its dot product over the tile; blockIdx.z walks the matrices g.
    """
    elem = element_type(dtype)
    T = tile  # noqa: N806 - a compile-time constant of the kernel

    @cuda.jit
    def kernel(a, b, c):
        sa = cuda.shared.array((T, T), elem)
        sb = cuda.shared.array((T, T), elem)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        row = cuda.blockIdx.y * T + ty
        col = cuda.blockIdx.x * T + tx
        M, K, N = a.shape[1], a.shape[2], b.shape[2]
        for g in range(cuda.blockIdx.z, a.shape[0], cuda.gridDim.z):
            acc = 0.0
            for k0 in range(0, K, T):
                if row < M and k0 + tx < K:
                    sa[ty, tx] = a[g, row, k0 + tx]
                else:
                    sa[ty, tx] = 0.0
                if col < N and k0 + ty < K:
                    sb[ty, tx] = b[g, k0 + ty, col]
                else:
                    sb[ty, tx] = 0.0
                cuda.syncthreads()
                for kk in range(T):
                    acc += sa[ty, kk] * sb[kk, tx]
                cuda.syncthreads()
            if row < M and col < N:
                c[g, row, col] = acc

    return kernel


def _grid_1d(n: int) -> tuple[int, int]:
    """(blocks, threads per block) covering n threads."""
    threads = max(1, min(THREADS, n))
    return math.ceil(n / threads), threads


# ----------------------------------------------------------------------------- host functions
def _rows(a) -> tuple[int, int]:
    """The (R, N) shape an array (…, N) is read as by the one-thread-per-row kernels."""
    return math.prod(a.shape[:-1]), a.shape[-1]


def _mask_arg(call: KernelCall, mask, x):
    """(kernel mask, use_mask): the bool mask as uint8 rows, or a placeholder when None."""
    if mask is None:
        return call.placeholder(np.uint8, 2), False
    if getattr(mask, "dtype", None) is None or numpy_dtype(mask) != np.bool_ or \
            tuple(mask.shape) != tuple(x.shape):
        raise ValueError(f"`mask` must be None or a bool array of shape {tuple(x.shape)}, "
                         f"got {getattr(mask, 'dtype', type(mask).__name__)} "
                         f"{tuple(getattr(mask, 'shape', ()))}.")
    return call.arg(mask, np.uint8, _rows(x)), True


def bmm(a, b):
    """c[g] = a[g] @ b[g] (reference.bmm): the tiled shared-memory kernel when both output
    sides reach TILE, else one thread per output element (a tile would be mostly idle)."""
    if not cuda_floats(a, b) or a.ndim != 3 or b.ndim != 3 or 0 in a.shape or 0 in b.shape:
        return reference.bmm(a, b)
    G, M, K = a.shape
    if b.shape[0] != G or b.shape[1] != K:
        raise ValueError(f"`b` must have shape ({G}, {K}, N) to multiply `a` {tuple(a.shape)}, "
                         f"got {tuple(b.shape)}.")
    N = b.shape[2]
    call, dtype = KernelCall(a, b, names=("a", "b")), common_dtype(a, b)
    a_d, b_d, c = call.arg(a, dtype), call.arg(b, dtype), call.out((G, M, N), dtype)
    if min(M, N) >= TILE:
        grid = (math.ceil(N / TILE), math.ceil(M / TILE), min(G, MAX_GRID_Z))
        bmm_tiled_kernel(np.dtype(dtype).name, TILE)[grid, (TILE, TILE)](a_d, b_d, c.arg)
    else:
        blocks, threads = _grid_1d(G * M * N)
        _bmm_simple_kernel[blocks, threads](a_d, b_d, c.arg)
    return call.result(c)


def softmax(x, mask, scale: float = 1.0):
    """Masked row softmax (reference.softmax): one thread per row; a ``scale`` ≠ 1
    multiplies x first, as the reference does."""
    if not cuda_floats(x) or x.ndim == 0 or size(x) == 0:
        return reference.softmax(x, mask, scale)
    if scale != 1.0:
        x = x * scale
    call, dtype = KernelCall(x, mask, names=("x", "mask")), numpy_dtype(x)
    m2, use_mask = _mask_arg(call, mask, x)
    p = call.out(_rows(x), dtype)
    blocks, threads = _grid_1d(_rows(x)[0])
    _softmax_kernel[blocks, threads](call.arg(x, dtype, _rows(x)), m2, use_mask, p.arg)
    return call.result(p, x.shape)


def softmax_adjoint(p, dp, scale: float = 1.0):
    """dx = scale · p ⊙ (dp − Σ p ⊙ dp) (reference.softmax_adjoint): one thread per row, the
    product by a ``scale`` ≠ 1 after it, as the reference takes it."""
    if not cuda_floats(p, dp) or p.ndim == 0 or size(p) == 0:
        return reference.softmax_adjoint(p, dp, scale)
    check_same_shape("dp", dp, "p", p)
    call, dtype = KernelCall(p, dp, names=("p", "dp")), common_dtype(p, dp)
    dx = call.out(_rows(p), dtype)
    blocks, threads = _grid_1d(_rows(p)[0])
    _softmax_adjoint_kernel[blocks, threads](call.arg(p, dtype, _rows(p)),
                                             call.arg(dp, dtype, _rows(p)), dx.arg)
    dx = call.result(dx, p.shape)
    return dx * scale if scale != 1.0 else dx


def layernorm(x, gamma, beta, eps: float):
    """(y, mean, rstd) of reference.layernorm: one thread per row."""
    if not cuda_floats(x, gamma, beta) or x.ndim == 0 or size(x) == 0:
        return reference.layernorm(x, gamma, beta, eps)
    N = x.shape[-1]
    check_vector("gamma", gamma, N)
    check_vector("beta", beta, N)
    call = KernelCall(x, gamma, beta, names=("x", "gamma", "beta"))
    dtype, (R, _) = common_dtype(x, gamma, beta), _rows(x)
    y, mean, rstd = call.out((R, N), dtype), call.out(R, dtype), call.out(R, dtype)
    blocks, threads = _grid_1d(R)
    _layernorm_kernel[blocks, threads](
        call.arg(x, dtype, (R, N)), call.arg(gamma, dtype), call.arg(beta, dtype), float(eps),
        y.arg, mean.arg, rstd.arg)
    lead = x.shape[:-1]
    return call.result(y, x.shape), call.result(mean, lead), call.result(rstd, lead)


def layernorm_adjoint(x, mean, rstd, gamma, dy):
    """(dx, dgamma, dbeta) of reference.layernorm_adjoint: a row kernel, then a column kernel."""
    if not cuda_floats(x, mean, rstd, gamma, dy) or x.ndim == 0 or size(x) == 0:
        return reference.layernorm_adjoint(x, mean, rstd, gamma, dy)
    N = check_layernorm_adjoint_args(x, mean, rstd, gamma, dy)
    dtype = common_dtype(x, mean, rstd, gamma, dy)
    call = KernelCall(x, mean, rstd, gamma, dy, names=("x", "mean", "rstd", "gamma", "dy"))
    R = _rows(x)[0]
    x_d, dy_d = call.arg(x, dtype, (R, N)), call.arg(dy, dtype, (R, N))
    mean_d, rstd_d = call.arg(mean, dtype, (R,)), call.arg(rstd, dtype, (R,))
    dx, dgamma, dbeta = call.out((R, N), dtype), call.out(N, dtype), call.out(N, dtype)
    blocks, threads = _grid_1d(R)
    _layernorm_adjoint_kernel[blocks, threads](x_d, mean_d, rstd_d, call.arg(gamma, dtype),
                                               dy_d, dx.arg)
    blocks, threads = _grid_1d(N)
    _layernorm_param_kernel[blocks, threads](x_d, mean_d, rstd_d, dy_d, dgamma.arg, dbeta.arg)
    return call.result(dx, x.shape), call.result(dgamma), call.result(dbeta)


def gru_cell(gx, gh, h, dt: float, implicit: bool):
    """(h_new, gates) of reference.gru_cell: one thread per (sample, hidden unit)."""
    if not cuda_floats(gx, gh, h) or size(h) == 0:
        return reference.gru_cell(gx, gh, h, dt, implicit)
    check_gru(h, ("gx", gx, 3), ("gh", gh, 3))
    call, dtype = KernelCall(gx, gh, h, names=("gx", "gh", "h")), common_dtype(gx, gh, h)
    h_new, gates = call.out(h.shape, dtype), call.out(gx.shape, dtype)
    blocks, threads = _grid_1d(size(h))
    _gru_cell_kernel[blocks, threads](*(call.arg(a, dtype) for a in (gx, gh, h)), float(dt),
                                      bool(implicit), h_new.arg, gates.arg)
    return call.result(h_new), call.result(gates)


def gru_cell_adjoint(gates, gh, h, dh_new, dt: float, implicit: bool):
    """(dgx, dgh, dh) of reference.gru_cell_adjoint: one thread per (sample, hidden unit)."""
    if not cuda_floats(gates, gh, h, dh_new) or size(h) == 0:
        return reference.gru_cell_adjoint(gates, gh, h, dh_new, dt, implicit)
    check_gru(h, ("gates", gates, 3), ("gh", gh, 3), ("dh_new", dh_new, 1))
    dtype = common_dtype(gates, gh, h, dh_new)
    call = KernelCall(gates, gh, h, dh_new, names=("gates", "gh", "h", "dh_new"))
    dgx, dgh, dh = call.out(gates.shape, dtype), call.out(gates.shape, dtype), call.out(h.shape,
                                                                                       dtype)
    blocks, threads = _grid_1d(size(h))
    _gru_cell_adjoint_kernel[blocks, threads](
        *(call.arg(a, dtype) for a in (gates, gh, h, dh_new)), float(dt), bool(implicit),
        dgx.arg, dgh.arg, dh.arg)
    return call.result(dgx), call.result(dgh), call.result(dh)
