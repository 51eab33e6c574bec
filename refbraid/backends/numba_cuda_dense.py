"""Numba CUDA kernels (backend ``"cuda"``), part 2: the tiled GEMM and the dense layers.

Every public function has the signature and semantics of the same-named function in
:mod:`refbraid.backends.reference`; device arrays in, device arrays out (host arrays in, NumPy
arrays out), memory through :mod:`refbraid.backends.numba_cuda_memory`. Kernels::

    gemm_kernel(dtype)   C = op(A) op(B) (+ bias[None, :]) (+ addend)   TILE×TILE blocks
    _gemm_small_kernel   the same, one thread per output      outputs smaller than one tile

Both are one device function each, :func:`gemm_tile` and :func:`gemm_element`, on 2-D
arrays: the batched GEMMs of :mod:`refbraid.backends.numba_cuda_batched` call the same ones
on the 2-D views ``A[j]``, ``B[j]``, ``C[j]`` of their stacks.
    _column_sum_kernel   db[c] = Σ_n dz[n, c]                 :func:`column_sum_geometry`

Shape legend: ``B`` batch, ``K`` inner dimension, ``C`` features; ``op(A)`` is ``A`` or
``Aᵀ``.

The tiled GEMM: block (bx, by) owns the TILE×TILE tile of C at rows ``by·TILE…``, columns
``bx·TILE…``; for each TILE-wide slab of the inner dimension every thread loads one element
of op(A) and one of op(B) into shared memory, the block synchronises, and each thread adds
TILE products to its accumulator. Reductions are per output thread (no atomics), so results
are deterministic. Shared tiles hold the input dtype (one kernel per dtype,
:func:`gemm_kernel`: a float32 GEMM moves float32 tiles); the accumulator is float64 for both
(exact for float64, more accurate for float32, slower on GPUs with weak float64); outputs
keep the input dtype.

Design (for a GPU course): tiling turns K global loads per output into K/TILE, as every value
loaded into shared memory is used TILE times. Loads are coalesced for both layouts: when an
operand is used transposed (``linear``'s Wᵀ, ``linear_adjoint``'s dzᵀ), neighbouring threads
still read neighbouring addresses of the stored matrix and write the tile's column instead of
its row; the tiles are padded to TILE + 1 columns so that this column write does not hit one
shared-memory bank 16 times. Outputs smaller than one tile use one thread per output (no
shared memory: nothing to share). Not done: register blocking (several outputs per thread)
and tensor cores, which is where cuBLAS (the ``cupy`` backend's ``@``) gets its last factor.
"""

from __future__ import annotations

import numba
import numpy as np

from . import reference
from .numba_cpu_dense import check_linear_args
from .numba_cuda import (
    blocks,
    common_dtype,
    cuda,
    cuda_floats,
    cuda_jit,
    element_type,
    kernel_factory,
)
from .numba_cuda_memory import KernelCall, Output

OVERRIDES = ("matmul", "linear", "linear_adjoint") if cuda is not None else ()

TILE = 16  # side of the shared-memory tiles of the GEMM (TILE×TILE threads per block)
#: Shape of a shared tile, padded by one column; a module constant, so the compiler sees a
#: constant shape (``(TILE, TILE + 1)`` written inside a kernel is typed as a run-time tuple).
SHARED_TILE = (TILE, TILE + 1)
SMALL_BLOCK = 8  # block side of the per-element GEMM used for outputs smaller than a tile


# ----------------------------------------------------------------------------- device functions
@cuda_jit(device=True)
def gemm_tile(A, B, C, trans_a, trans_b, bias, has_bias, addend, has_addend, sA, sB):
    """This block's TILE×TILE tile of C = op(A) op(B) (+ bias[None, :]) (+ addend) on 2-D
    arrays (or 2-D views of a stack), op(A): (M, K), op(B): (K, N), C and addend: (M, N);
    ``sA``, ``sB`` the block's shared tiles (:data:`SHARED_TILE`, the kernel's element type).
    The epilogue is :func:`_store`."""
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    row0 = cuda.blockIdx.y * TILE
    col0 = cuda.blockIdx.x * TILE
    row = row0 + ty
    col = col0 + tx
    M, N = C.shape
    K = A.shape[0] if trans_a else A.shape[1]
    acc = 0.0
    for t0 in range(0, K, TILE):
        # sA[i, k] = op(A)[row0 + i, t0 + k], sB[k, j] = op(B)[t0 + k, col0 + j]. Threads
        # next to each other in x read neighbouring addresses of the stored (row-major)
        # matrix, whether op is the identity or the transpose: coalesced loads.
        if trans_a:  # A is (K, M): thread (ty, tx) reads A[t0 + ty, row0 + tx]
            k, i = t0 + ty, row0 + tx
            sA[tx, ty] = A[k, i] if k < K and i < M else 0.0
        else:  # A is (M, K): thread (ty, tx) reads A[row0 + ty, t0 + tx]
            i, k = row, t0 + tx
            sA[ty, tx] = A[i, k] if i < M and k < K else 0.0
        if trans_b:  # B is (N, K): thread (ty, tx) reads B[col0 + ty, t0 + tx]
            j, k = col0 + ty, t0 + tx
            sB[tx, ty] = B[j, k] if j < N and k < K else 0.0
        else:  # B is (K, N): thread (ty, tx) reads B[t0 + ty, col0 + tx]
            k, j = t0 + ty, col
            sB[ty, tx] = B[k, j] if k < K and j < N else 0.0
        cuda.syncthreads()
        for kk in range(TILE):
            acc += sA[ty, kk] * sB[kk, tx]
        cuda.syncthreads()
    if row < M and col < N:
        _store(C, row, col, acc, bias, has_bias, addend, has_addend)


@cuda_jit(device=True)
def _store(C, row, col, acc, bias, has_bias, addend, has_addend):
    """C[row, col] = acc (+ bias[col], in the float64 accumulator), then, with ``has_addend``,
    C[row, col] = addend[row, col] + C[row, col]: the product is rounded to C's dtype before
    the addition, as a separate ``addend + C`` launch rounds it (the accumulating GEMM of the
    dense adjoint, ``dy = dy_next + s W``, has that launch's bits)."""
    if has_bias:
        acc += bias[col]
    C[row, col] = acc
    if has_addend:
        C[row, col] = addend[row, col] + C[row, col]


@cuda_jit(device=True)
def gemm_element(A, B, C, row, col, trans_a, trans_b, bias, has_bias, addend, has_addend):
    """C[row, col] = (op(A) op(B))[row, col] (+ bias[col]) (+ addend[row, col]), no shared
    memory; 2-D arrays or 2-D views of a stack, as :func:`gemm_tile`; nothing outside C."""
    M, N = C.shape
    if row >= M or col >= N:
        return
    K = A.shape[0] if trans_a else A.shape[1]
    acc = 0.0
    for k in range(K):
        a = A[k, row] if trans_a else A[row, k]
        b = B[col, k] if trans_b else B[k, col]
        acc += a * b
    _store(C, row, col, acc, bias, has_bias, addend, has_addend)


# ----------------------------------------------------------------------------- kernels
@kernel_factory
def gemm_kernel(dtype: str):
    """The tiled GEMM for ``dtype`` (a name: "float32", "float64"), its shared tiles of that
    type (a shared array's shape and type are compile-time constants)."""
    elem = element_type(dtype)

    @cuda_jit
    def _gemm_kernel(A, B, C, trans_a, trans_b, bias, has_bias, addend, has_addend):
        """C = op(A) op(B) (+ bias[None, :]) (+ addend),  op(A): (M, K), op(B): (K, N),
        C: (M, N)."""
        sA = cuda.shared.array(SHARED_TILE, elem)  # TILE + 1 columns: no bank conflicts
        sB = cuda.shared.array(SHARED_TILE, elem)  # when a column is written
        gemm_tile(A, B, C, trans_a, trans_b, bias, has_bias, addend, has_addend, sA, sB)

    return _gemm_kernel


@cuda_jit
def _gemm_small_kernel(A, B, C, trans_a, trans_b, bias, has_bias, addend, has_addend):
    """C = op(A) op(B) (+ bias) (+ addend), one thread per output element, no shared memory.

    Used when C has fewer elements than one TILE×TILE tile, where tiling cannot pay (and
    where the CUDA simulator, one Python thread per CUDA thread, would idle 256 threads).
    """
    row, col = cuda.grid(2)
    gemm_element(A, B, C, row, col, trans_a, trans_b, bias, has_bias, addend, has_addend)


# Column sums Σ_n a[n, c] over B rows: a block of ``width`` neighbouring columns × ``groups``
# row groups; thread (c, g) sums rows g, g + groups, … of column c (coalesced: neighbouring
# threads read neighbouring columns) in float64, then the groups' partial sums are added in a
# fixed tree in shared memory (:func:`column_tree`). One thread per column walking all B rows
# left a GPU nearly idle (a 1024 × 256 sum: 256 threads; now 8 blocks of 32 × 8). A group
# takes about ROWS_PER_THREAD rows, up to ROW_GROUPS groups, so a small batch keeps one
# group (a plain sum down the column, as before, and few threads for Numba's simulator,
# which runs each as a Python thread). The order of the sum depends on ``groups`` alone,
# i.e. on B (:func:`column_sum_geometry`): the fused and the composed adjoint, one step or a
# stack, sum each column the same way.
COLUMN_TILE = 32  #: at most this many columns per block
#: at most this many row groups (a power of two): blocks of at most 32 × 8 = 256 threads.
#: 32 × 32 = 1024 threads failed to launch on an H200 (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
#: a 1024-thread block leaves 64 registers a thread, and the fused adjoint's kernel needs
#: more); 256 leave 255, the most a thread can have, so any of these kernels launches.
ROW_GROUPS = 8
ROWS_PER_THREAD = 32  #: about this many rows per group, before the groups reach ROW_GROUPS
#: the partial sums of one block: a module constant, so the compiler sees a constant shape
COLUMN_SUM_SHARED = (COLUMN_TILE * ROW_GROUPS,)


def _power_of_two_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def column_sum_geometry(B: int, C: int) -> tuple[int, int]:
    """(width, groups) of the column-sum blocks for B rows and C columns: powers of two, at
    most :data:`COLUMN_TILE` columns (no more than C needs) and :data:`ROW_GROUPS` groups of
    about :data:`ROWS_PER_THREAD` rows each (B = 1024: 8 groups of 128; B = 256: 8 of 32;
    B ≤ 32: one)."""
    return (min(COLUMN_TILE, _power_of_two_at_least(C)),
            min(ROW_GROUPS, _power_of_two_at_least(-(-int(B) // ROWS_PER_THREAD))))


@cuda_jit(device=True)
def column_tree(part, t, width, groups):
    """part[t] += part[t + width·g] for g = 1 … groups − 1 in a fixed tree (halving), for
    every thread t of the block; the block's sums end in part[0 … width − 1]."""
    half = groups // 2
    while half > 0:
        if t // width < half:
            part[t] += part[t + width * half]
        cuda.syncthreads()
        half //= 2


@cuda_jit
def _column_sum_kernel(a, out, width, groups):
    """out[c] = Σ_n a[n, c] (float64, rounded once); block b: columns b·width …"""
    part = cuda.shared.array(COLUMN_SUM_SHARED, numba.float64)
    t = cuda.threadIdx.x
    c = cuda.blockIdx.x * width + t % width
    acc = 0.0
    if c < a.shape[1]:
        for n in range(t // width, a.shape[0], groups):
            acc += a[n, c]
    part[t] = acc
    cuda.syncthreads()
    column_tree(part, t, width, groups)
    if t < width and c < a.shape[1]:
        out[c] = part[t]


# ----------------------------------------------------------------------------- host side
def _gemm(call: KernelCall, A, B, trans_a: bool, trans_b: bool, M: int, N: int, dtype,
          bias=None, addend=None) -> Output:
    """Launch the GEMM on kernel arguments (tiled, or per-element below one tile of output),
    ``addend`` (M, N) added to the product (:func:`_store`); returns the output C (M, N)."""
    C = call.out((M, N), dtype)
    b = bias if bias is not None else call.placeholder(dtype)
    add = addend if addend is not None else call.placeholder(dtype, 2)
    flags = (b, bias is not None, add, addend is not None)
    if M * N < TILE * TILE:
        block = (min(M, SMALL_BLOCK), min(N, SMALL_BLOCK))
        grid = (blocks(M, block[0]), blocks(N, block[1]))
        _gemm_small_kernel[grid, block](A, B, C.arg, trans_a, trans_b, *flags)
        return C
    grid = (blocks(N, TILE), blocks(M, TILE))
    gemm_kernel(np.dtype(dtype).name)[grid, (TILE, TILE)](A, B, C.arg, trans_a, trans_b, *flags)
    return C


# ----------------------------------------------------------------------------- dense
def matmul(a, b):
    """c = a @ b (reference.matmul) by the tiled shared-memory GEMM."""
    if not cuda_floats(a, b):
        return reference.matmul(a, b)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"`a` and `b` must be 2-D, got shapes {a.shape} and {b.shape}.")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"`b` must have {a.shape[1]} rows (a.shape[1]), got shape {b.shape}.")
    call, dtype = KernelCall(a, b, names=("a", "b")), common_dtype(a, b)
    C = _gemm(call, call.arg(a, dtype), call.arg(b, dtype), False, False, a.shape[0],
              b.shape[1], dtype)
    return call.result(C)


def linear(x, W, b):
    """z = x Wᵀ + b (reference.linear): tiled GEMM with op(B) = Wᵀ and the bias fused."""
    if not cuda_floats(x, W, b):
        return reference.linear(x, W, b)
    check_linear_args(x, W, b)
    call, dtype = KernelCall(x, W, b, names=("x", "W", "b")), common_dtype(x, W, b)
    bias = None if b is None else call.arg(b, dtype)
    z = _gemm(call, call.arg(x, dtype), call.arg(W, dtype), False, True, x.shape[0],
              W.shape[0], dtype, bias)
    return call.result(z)


def linear_adjoint(x, W, dz):
    """(dz W, dzᵀ x, Σ_B dz) (reference.linear_adjoint): two GEMMs and a column-sum kernel."""
    if not cuda_floats(x, W, dz):
        return reference.linear_adjoint(x, W, dz)
    check_linear_args(x, W, dz=dz)
    call, dtype = KernelCall(x, W, dz, names=("x", "W", "dz")), common_dtype(x, W, dz)
    xd, Wd, dzd = call.arg(x, dtype), call.arg(W, dtype), call.arg(dz, dtype)
    B, K = x.shape
    C = W.shape[0]
    dx = _gemm(call, dzd, Wd, False, False, B, K, dtype)  # B,K = (B,C)(C,K)
    dW = _gemm(call, dzd, xd, True, False, C, K, dtype)  # C,K = (C,B)(B,K)
    db = call.out(C, dtype)
    width, groups = column_sum_geometry(B, C)
    _column_sum_kernel[blocks(C, width), width * groups](dzd, db.arg, width, groups)
    return call.result(dx), call.result(dW), call.result(db)
