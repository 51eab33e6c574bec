"""Matrix products a CUDA graph can record: cuBLAS called directly, with a handle of our own.

CuPy 14 refuses every cuBLAS call on a capturing stream (its ``setStream`` raises
``NotImplementedError: calling cuBLAS API during stream capture is currently unsupported``),
although cuBLAS itself records into graphs. While :func:`recordable_gemms` is in force,
``cupy.matmul`` is :func:`matmul` here: the same product through
``cublas{S,D}gemmStridedBatched`` (ctypes), on the current stream; the fused dense adjoint's
``out += a @ b`` (β = 1) takes the same road (:func:`active`).

Row-major ``C = A·B`` (shapes ``(..., M, K)`` and ``(..., K, N)``) is the column-major
product ``Cᵀ = Bᵀ·Aᵀ``: a row-major operand's memory *is* its transpose in column-major order
(``op = N``, leading dimension its row stride), a transposed view's memory is the matrix
itself (``op = T``, leading dimension its column stride); a batch is one stride over the
broadcast batch axes (0 for a 2-D operand). An operand that fits neither is copied
C-contiguous first (a launch, recorded like any other). :func:`gemm_plan` is that
bookkeeping, on shapes and strides alone (tested against NumPy without a GPU).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

OP_N, OP_T = 0, 1


class Operand(NamedTuple):
    """How cuBLAS reads one operand: ``op`` (OP_N / OP_T), leading dimension ``ld`` and
    ``batch_stride`` in elements; ``copy``: make it C-contiguous (broadcast) first."""

    op: int
    ld: int
    batch_stride: int
    copy: bool


def _layout(shape, strides, itemsize: int, batch: tuple[int, ...]) -> Operand:
    """:class:`Operand` of one array (module docstring)."""
    r, c = shape[-2:]
    st = [s // itemsize for s in strides]
    if any(s < 0 for s in st) or any(s % itemsize for s in strides):
        return Operand(OP_N, max(c, 1), r * c, True)
    own = tuple(shape[:-2])
    if not own:
        bstride = 0
    elif own != batch:
        return Operand(OP_N, max(c, 1), r * c, True)
    else:
        axes = [(n, s) for n, s in zip(own, st[:-2], strict=True) if n != 1]
        bstride = axes[-1][1] if axes else r * c
        for (_, outer), (n_in, inner) in zip(axes, axes[1:], strict=False):
            if outer != inner * n_in:
                return Operand(OP_N, max(c, 1), r * c, True)
    row, col = st[-2], st[-1]
    if (col == 1 or c == 1) and (r == 1 or row >= max(c, 1)):
        return Operand(OP_N, row if r > 1 else max(c, 1), bstride, False)
    if (row == 1 or r == 1) and (c == 1 or col >= max(r, 1)):
        return Operand(OP_T, col if c > 1 else max(r, 1), bstride, False)
    return Operand(OP_N, max(c, 1), r * c, True)


def gemm_plan(a_shape, a_strides, b_shape, b_strides, itemsize: int):
    """(batch shape, M, N, K, the A operand, the B operand) of ``matmul(a, b)`` for 2-D or
    batched operands (module docstring); ValueError on mismatched inner sizes."""
    if len(a_shape) < 2 or len(b_shape) < 2:
        raise ValueError("recordable matmul needs operands of at least 2 dimensions.")
    (M, K), (K2, N) = a_shape[-2:], b_shape[-2:]
    if K != K2:
        raise ValueError(f"matmul: inner sizes differ ({K} and {K2}).")
    batch = tuple(np.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2])))
    return (batch, M, N, K, _layout(a_shape, a_strides, itemsize, batch),
            _layout(b_shape, b_strides, itemsize, batch))


class _Cublas:
    """libcublas through ctypes, one handle (created on first use)."""

    def __init__(self):
        lib = None
        for name in ("libcublas.so.13", "libcublas.so.12", "libcublas.so"):
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if lib is None:
            raise OSError("libcublas (13, 12) could not be loaded for recordable GEMMs.")
        self.lib, self.handle = lib, ctypes.c_void_p()
        self._check(lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        vp, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        for fn in (lib.cublasSgemmStridedBatched, lib.cublasDgemmStridedBatched):
            fn.argtypes = [vp, i, i, i, i, i, vp, vp, i, ll, vp, i, ll, vp, vp, i, ll, i]
        lib.cublasSetStream_v2.argtypes = [vp, vp]

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed with cuBLAS status {status}.")

    def gemm(self, dtype, stream_ptr: int, opb: int, opa: int, m: int, n: int, k: int,
             b_ptr: int, ldb: int, sb: int, a_ptr: int, lda: int, sa: int, c_ptr: int,
             ldc: int, sc: int, count: int, beta: float = 0.0) -> None:
        scalar = ctypes.c_float if dtype == np.float32 else ctypes.c_double
        fn = self.lib.cublasSgemmStridedBatched if dtype == np.float32 else \
            self.lib.cublasDgemmStridedBatched
        one, zero = scalar(1.0), scalar(beta)
        self._check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream_ptr)),
                    "cublasSetStream")
        self._check(fn(self.handle, opb, opa, m, n, k, ctypes.byref(one), b_ptr, ldb, sb,
                       a_ptr, lda, sa, ctypes.byref(zero), c_ptr, ldc, sc, count),
                    "cublas gemm (strided batched)")


_CUBLAS: _Cublas | None = None


_active = 0  # > 0 inside recordable_gemms()


def active() -> bool:
    """True inside :func:`recordable_gemms` (the fused kernels' own GEMMs route here too)."""
    return _active > 0


def matmul(a, b, out=None, beta: float = 0.0):
    """``cupy.matmul(a, b)`` for float32/float64 operands of 2+ dimensions through cuBLAS
    directly (module docstring); with ``out`` (C-contiguous, the product's shape) and
    ``beta = 1``: ``out += a @ b`` in cuBLAS's epilogue. NotImplementedError naming anything
    else."""
    import cupy

    global _CUBLAS
    if a.dtype != b.dtype or a.dtype not in (np.float32, np.float64):
        raise NotImplementedError(f"a recorded matmul takes two float32 or float64 operands, "
                                  f"got {a.dtype} and {b.dtype}.")
    batch, M, N, K, pa, pb = gemm_plan(a.shape, a.strides, b.shape, b.strides, a.itemsize)
    if pa.copy:
        a = cupy.ascontiguousarray(cupy.broadcast_to(a, (*batch, M, K)))
        pa = _layout(a.shape, a.strides, a.itemsize, batch)
    if pb.copy:
        b = cupy.ascontiguousarray(cupy.broadcast_to(b, (*batch, K, N)))
        pb = _layout(b.shape, b.strides, b.itemsize, batch)
    if out is None:
        out = cupy.empty((*batch, M, N), dtype=a.dtype)
    elif out.shape != (*batch, M, N) or out.dtype != a.dtype or not out.flags.c_contiguous:
        raise ValueError(f"`out` must be a C-contiguous {a.dtype} array of shape "
                         f"{(*batch, M, N)}, got {out.dtype} {out.shape}.")
    count = math.prod(batch)
    if out.size == 0 or (K == 0 and beta == 1.0):
        return out
    if K == 0:
        out.fill(0)
        return out
    if _CUBLAS is None:
        _CUBLAS = _Cublas()
    stream = cupy.cuda.get_current_stream().ptr
    _CUBLAS.gemm(a.dtype, stream, pb.op, pa.op, N, M, K, b.data.ptr, pb.ld, pb.batch_stride,
                 a.data.ptr, pa.ld, pa.batch_stride, out.data.ptr, N, M * N, count, beta)
    return out


@contextmanager
def recordable_gemms(cupy) -> Iterator[None]:
    """``cupy.matmul`` is :func:`matmul` inside (module docstring)."""
    global _active
    saved = cupy.matmul
    cupy.matmul = matmul
    _active += 1
    try:
        yield
    finally:
        _active -= 1
        cupy.matmul = saved
