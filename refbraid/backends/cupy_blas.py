"""Matrix products a CUDA graph can record: cuBLAS called directly, with a handle of our own.

CuPy 14 refuses every cuBLAS call on a capturing stream (its ``setStream`` raises
``NotImplementedError: calling cuBLAS API during stream capture is currently unsupported``),
although cuBLAS itself records into graphs. While :func:`recordable_gemms` is in force,
``cupy.matmul`` is :func:`matmul` here: the same product through
``cublas{S,D}gemmStridedBatched`` (ctypes), on the current stream; the fused dense adjoint's
``out += a @ b`` (β = 1) takes the same road (:func:`active`). One cuBLAS handle per process,
made on the device current at the first product (refbraid runs one GPU per process).

How each operand is read — its operation flag, leading dimension and batch stride, or a
C-contiguous copy first (a launch, recorded like any other) when no strides describe it — is
:func:`~.gemm_layout.gemm_plan`'s bookkeeping, on shapes and strides alone.

Outside a recording the cupy backend's batched products take the same road
(:func:`product`): CuPy's batched ``matmul`` copies every operand that is not C-contiguous
before its GEMM (MGRIT's strided rows of states, the weight gradient's transposed operands),
where the strided-batched GEMM reads them in place. ``REFBRAID_CUPY_GEMM=cupy`` sends them
back to CuPy's ``matmul``. Off a GPU the CUDA C emulator of the tests
(tests/cuda_c/emulator.py) stands in for libcublas behind this module's ctypes call, with
cuBLAS's column-major semantics, so the call itself — operation flags, leading dimensions,
batch strides, β — is checked against NumPy's product without a GPU.
"""

from __future__ import annotations

import ctypes
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from .cupy_raw import address, real_cupy
from .gemm_layout import OP_N, OP_T, Operand, gemm_plan, layout
from .portable import namespace
from .standin_array import matmul as standin_matmul
from .standin_array import ndarray as DeviceArray

__all__ = ["OP_N", "OP_T", "Operand", "gemm_plan", "matmul", "product", "recordable_gemms"]


class _Cublas:
    """libcublas through ctypes, one handle (created on first use); ``lib``: a loaded library
    or a stand-in with its functions (the tests' emulator), else libcublas 13 or 12."""

    def __init__(self, lib=None):
        for name in () if lib is not None else ("libcublas.so.13", "libcublas.so.12",
                                                  "libcublas.so"):
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
        raise NotImplementedError(f"refbraid's strided-batched GEMM takes two float32 or float64 "
                                  f"operands, got {a.dtype} and {b.dtype}.")
    batch, M, N, K, pa, pb = gemm_plan(a.shape, a.strides, b.shape, b.strides, a.itemsize)
    if pa.copy:
        a = cupy.ascontiguousarray(cupy.broadcast_to(a, (*batch, M, K)))
        pa = layout(a.shape, a.strides, a.itemsize, batch)
    if pb.copy:
        b = cupy.ascontiguousarray(cupy.broadcast_to(b, (*batch, K, N)))
        pb = layout(b.shape, b.strides, b.itemsize, batch)
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
    _CUBLAS.gemm(a.dtype, stream, pb.op, pa.op, N, M, K, address(b), pb.ld, pb.batch_stride,
                 address(a), pa.ld, pa.batch_stride, address(out), N, M * N, count, beta)
    return out


#: ``REFBRAID_CUPY_GEMM=cupy``: the cupy backend's batched products through CuPy's ``matmul``
#: (:func:`product`), as before they went through :func:`matmul`
GEMM_ENV = "REFBRAID_CUPY_GEMM"


def routes_batched(a, b) -> bool:
    """Whether :func:`product` takes ``a @ b`` through :func:`matmul`: a batched product
    (either operand over 2-D) of two float32 or two float64 arrays, unless
    ``REFBRAID_CUPY_GEMM=cupy``."""
    return (max(a.ndim, b.ndim) > 2 and a.dtype == b.dtype
            and a.dtype in (np.float32, np.float64)
            and os.environ.get(GEMM_ENV, "cublas") != "cupy")


def product(a, b):
    """``a @ b`` as the cupy backend's own kernels take it. A batched float product goes
    through :func:`matmul` (:func:`routes_batched`): its operands are read by strides — MGRIT's
    every m-th state, a transposed weight or column matrix, a 2-D weight broadcast over the
    batch — where CuPy's batched ``matmul`` first copies every operand that is not
    C-contiguous (a launch and a pass over the operand each); on the CuPy stand-in it is
    counted so. A 2-D product is the arrays' own ``matmul`` (CuPy reads C- and F-ordered
    operands in place; inside a recording that is :func:`matmul` as well)."""
    if real_cupy(a) and real_cupy(b) and routes_batched(a, b):
        return matmul(a, b)
    if isinstance(a, DeviceArray) and isinstance(b, DeviceArray):
        return standin_matmul(a, b, strided_gemm=routes_batched(a, b))
    return namespace(a).matmul(a, b)


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
