"""Run the ``cupy`` backend's CUDA C kernels on the CPU: a stand-in that shares their source.

The CuPy stand-in runs the reference in a hand-written kernel's place, so it proves nothing
about the kernel's own CUDA C. This emulator compiles that very source as C++ (g++, C++20)
and runs it: every block in turn, the threads of a block as fibers of one host thread
switched round-robin at each ``__syncthreads`` (so every thread reaches a barrier before any
passes it; a thread that returns drops out; a kernel without barriers runs its threads one
after another), ``__shared__`` memory one static
array per kernel (blocks run one at a time). :func:`fake_cupy` then puts a ``cupy`` module
into ``sys.modules`` whose arrays are NumPy's and whose ``RawKernel`` is this emulator, so
the backend's GPU branch — array preparation, grid, argument order, kernel — runs end to end.
:class:`FakeCublasLibrary` likewise stands behind :mod:`refbraid.backends.cupy_blas`'s ctypes
call into libcublas: ``cublas{S,D}gemmStridedBatched`` with cuBLAS's column-major semantics
and argument checks, on host memory.

What it shares with a GPU: the kernel's arithmetic, indexing, block reductions and barriers,
and the Python that launches it. What it cannot see: warps and their scheduling, memory
coalescing, races a barrier would not order (threads here interleave differently), CUDA's
math library (its exp/tanh/erf round differently from glibc's), fused multiply-adds the
GPU compiler forms, launch limits, streams.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from refbraid.backends import cupy_blas

_PRELUDE = r"""
#include <cmath>
#include <cstring>
#include <ucontext.h>
#include <vector>
using namespace std;
struct Dim3 { long long x, y, z; };
static Dim3 threadIdx, blockIdx, blockDim, gridDim;
// The threads of a block are fibers of one host thread, switched round-robin: a fiber runs
// until __syncthreads or its end, then the next one not finished runs; after the last, the
// first again. So every fiber reaches a barrier before any passes it.
static std::vector<ucontext_t> fibers;
static std::vector<char> finished;
static ucontext_t scheduler;
static long long current_fiber;
static void next_fiber(ucontext_t* from) {
  long long n = (long long)fibers.size(), k = current_fiber;
  for (long long step = 1; step <= n; ++step) {
    long long c = (k + step) % n;
    if (!finished[c]) {
      current_fiber = c;
      threadIdx = {c, 0, 0};
      swapcontext(from, &fibers[c]);
      return;
    }
  }
  swapcontext(from, &scheduler);
}
static void sync_threads() {
  long long me = current_fiber;
  next_fiber(&fibers[me]);
  threadIdx = {me, 0, 0};
}
#define __global__
#define __device__ static
#define __shared__ static
#define __syncthreads() sync_threads()
// blocks run one after another and a block's threads never preempt each other
#define __threadfence() ((void)0)
static inline unsigned int atomicAdd(unsigned int* p, unsigned int v) {
  unsigned int old = *p; *p = old + v; return old;
}
static inline double __longlong_as_double(long long v) { double d; memcpy(&d, &v, 8); return d; }
"""

_SEQUENTIAL = r"""
extern "C" void emulate_{name}(long long gx, long long gy, long long bx, void** args) {{
  blockDim = {{bx, 1, 1}};
  gridDim = {{gx, gy, 1}};
  for (long long by = 0; by < gy; ++by)
    for (long long b = 0; b < gx; ++b) {{
      blockIdx = {{b, by, 0}};
      for (long long t = 0; t < bx; ++t) {{
        threadIdx = {{t, 0, 0}};
        {name}({call});
      }}
    }}
}}
"""

_LAUNCHER = r"""
static void fiber_{name}(int lo, int hi) {{
  void** args = (void**)(((unsigned long long)(unsigned)hi << 32) | (unsigned)lo);
  {name}({call});
  finished[current_fiber] = 1;
  next_fiber(&fibers[current_fiber]);
}}
extern "C" void emulate_{name}(long long gx, long long gy, long long bx, void** args) {{
  blockDim = {{bx, 1, 1}};
  gridDim = {{gx, gy, 1}};
  std::vector<std::vector<char>> stacks(bx, std::vector<char>(1 << 16));
  unsigned long long a = (unsigned long long)args;
  for (long long by = 0; by < gy; ++by)
    for (long long b = 0; b < gx; ++b) {{
      blockIdx = {{b, by, 0}};
      fibers.assign(bx, ucontext_t());
      finished.assign(bx, 0);
      for (long long t = 0; t < bx; ++t) {{
        getcontext(&fibers[t]);
        fibers[t].uc_stack.ss_sp = stacks[t].data();
        fibers[t].uc_stack.ss_size = stacks[t].size();
        fibers[t].uc_link = &scheduler;
        makecontext(&fibers[t], (void (*)())fiber_{name}, 2, (int)(a & 0xffffffffu),
                    (int)(a >> 32));
      }}
      current_fiber = 0;
      threadIdx = {{0, 0, 0}};
      swapcontext(&scheduler, &fibers[0]);  // back when every fiber has finished
    }}
}}
"""


def available() -> bool:
    """Whether a C++20 compiler (g++) is at hand."""
    return shutil.which("g++") is not None


def _parameters(source: str, name: str) -> list[str]:
    match = re.search(rf"void\s+{name}\s*\(([^)]*)\)", source)
    if match is None:
        raise ValueError(f"kernel {name!r} not found in its source")
    return [" ".join(p.split()) for p in match.group(1).split(",")]


def _argument(i: int, param: str) -> str:
    ctype = param.rsplit(" ", 1)[0] if "*" not in param else param[: param.rindex("*") + 1]
    return f"({ctype})args[{i}]" if "*" in param else f"*({ctype}*)args[{i}]"


_LIBRARIES: dict[str, ctypes.CDLL] = {}
_FLAGS = ["g++", "-std=c++20", "-O0", "-fPIC", "-w"]


def _folder() -> Path:
    folder = Path(tempfile.gettempdir()) / "refbraid-cuda-c-emulator"
    folder.mkdir(exist_ok=True)
    return folder


def _prelude_header() -> Path:
    """The prelude as a header, precompiled once (every kernel includes it: the C++ library
    headers are parsed once, not per kernel)."""
    key = hashlib.sha256(_PRELUDE.encode()).hexdigest()[:16]
    header = _folder() / f"prelude-{key}.hpp"
    if not Path(f"{header}.gch").exists():
        tmp = _folder() / f"prelude-{key}.{os.getpid()}.hpp"
        tmp.write_text(_PRELUDE)
        tmp.replace(header)  # atomic, and the same text whoever writes it
        gch = _folder() / f"prelude-{key}.{os.getpid()}.gch"
        subprocess.run([*_FLAGS, "-x", "c++-header", str(header), "-o", str(gch)],
                       check=True, capture_output=True, text=True)
        gch.replace(f"{header}.gch")  # atomic: parallel test workers may race here
    return header


def _library(source: str) -> ctypes.CDLL:
    """The source's every ``__global__`` kernel, compiled once (one shared library per
    source text: give several kernels in one source to compile them together)."""
    names = re.findall(r'__global__\s+void\s+(\w+)\s*\(', source)
    # without a barrier the threads of a block are independent: run them one after another
    template = _LAUNCHER if "__syncthreads" in source else _SEQUENTIAL
    launchers = "".join(template.format(name=n, call=", ".join(
        _argument(i, p) for i, p in enumerate(_parameters(source, n)))) for n in names)
    code = (f'#include "{_prelude_header()}"\n' + source.replace('extern "C" __global__', "")
            + launchers)
    name = names[0] if names else "none"
    key = hashlib.sha256(code.encode()).hexdigest()[:16]
    if key not in _LIBRARIES:
        folder = _folder()
        lib = folder / f"{name}-{key}.so"
        if not lib.exists():
            src = folder / f"{name}-{key}.cpp"
            src.write_text(code)
            tmp = folder / f"{name}-{key}.{os.getpid()}.so"
            subprocess.run([*_FLAGS, "-shared", "-o", str(tmp), str(src)], check=True,
                           capture_output=True, text=True)
            tmp.replace(lib)  # atomic: parallel test workers may race here
        _LIBRARIES[key] = ctypes.CDLL(str(lib))
    return _LIBRARIES[key]


class RawKernel:
    """``cupy.RawKernel(source, name)`` emulated: called with ``(grid, block, args)``, args
    NumPy arrays (device memory) and NumPy scalars (passed by value, their C type)."""

    def __init__(self, source: str, name: str):
        self.source, self.name = source, name
        self._lib = _library(source)

    def __call__(self, grid, block, args) -> None:
        grid, block = tuple(grid) + (1,) * (2 - len(grid)), tuple(block)
        if len(block) != 1 or grid[1:] != grid[1:2]:
            raise ValueError("the emulator launches 1-D blocks on a 1-D or 2-D grid")
        keep, pointers = [], []
        for a in args:
            if isinstance(a, np.ndarray):
                if not a.flags.c_contiguous:
                    raise ValueError("kernel arrays must be C-contiguous")
                keep.append(a)
                pointers.append(a.ctypes.data)
            elif isinstance(a, np.generic):
                box = np.array(a)
                keep.append(box)
                pointers.append(box.ctypes.data)
            else:
                raise TypeError(f"a kernel argument must be an array or a NumPy scalar, "
                                f"got {type(a).__name__}")
        argv = (ctypes.c_void_p * len(pointers))(*pointers)
        getattr(self._lib, f"emulate_{self.name}")(
            ctypes.c_longlong(grid[0]), ctypes.c_longlong(grid[1]),
            ctypes.c_longlong(block[0]), argv)


_C_TYPES = {"float32": "float", "float64": "double"}


class ElementwiseKernel:
    """``cupy.ElementwiseKernel(in_params, out_params, operation, name)`` emulated: the
    operation runs once per element, as CuPy generates it — array arguments broadcast to
    one shape, scalars cast to their parameter's type (``T``: the arrays' dtype), each
    parameter a reference to its element — compiled and run by :class:`RawKernel`."""

    def __init__(self, in_params: str, out_params: str, operation: str, name: str = "kernel",
                 **_options):
        self.ins = [p.split() for p in in_params.split(",")]
        self.outs = [p.split() for p in out_params.split(",")]
        self.operation, self.name = operation, name

    def __call__(self, *args):
        given = args[len(self.ins):]  # outputs given, as CuPy takes them after the inputs
        if len(args) != len(self.ins) and len(given) != len(self.outs):
            raise TypeError(f"{self.name}: {len(self.ins)} inputs (and optionally "
                            f"{len(self.outs)} outputs) expected, got {len(args)}")
        args = args[:len(self.ins)]
        typed = [a for (t, _), a in zip(self.ins, args, strict=True)
                 if t == "T" and isinstance(a, np.ndarray)]
        T = typed[0].dtype
        if any(a.dtype != T for a in typed):
            raise TypeError(f"{self.name}: the arrays bound to T differ in dtype")
        shape = np.broadcast_shapes(*(np.shape(a) for a in args if isinstance(a, np.ndarray)))

        def dtype(t):
            return T if t == "T" else np.dtype(t)

        ins = [np.ascontiguousarray(np.broadcast_to(np.asarray(a, dtype=dtype(t)), shape))
               for (t, _), a in zip(self.ins, args, strict=True)]
        outs = [np.empty(shape, dtype=dtype(t)) for t, _ in self.outs]
        params = self.ins + self.outs
        decl = ", ".join(f"{_C_TYPES[dtype(t).name]}* {n}_" for t, n in params)
        refs = " ".join(f"{_C_TYPES[dtype(t).name]}& {n} = {n}_[i];" for t, n in params)
        source = (f"typedef {_C_TYPES[T.name]} T;\n#define M_SQRT2 1.4142135623730951\n"
                  f'extern "C" __global__ void {self.name}({decl}, long long n) {{\n'
                  f"  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
                  f"  if (i >= n) return;\n  {refs}\n  {self.operation};\n}}\n")
        n = int(np.prod(shape))
        RawKernel(source, self.name)((max(1, -(-n // 64)),), (64,), (*ins, *outs, np.int64(n)))
        if given:  # any strides, as CuPy writes them: here the contiguous results copied over
            for target, result in zip(given, outs, strict=True):
                target[...] = result
            outs = list(given)
        return tuple(outs) if len(outs) > 1 else outs[0]


# ----------------------------------------------------------------------------- cuBLAS
_INVALID_VALUE = 7  # CUBLAS_STATUS_INVALID_VALUE


def _column_major(ptr: int, dtype, rows: int, cols: int, ld: int, stride: int, count: int):
    """The ``count`` column-major ``rows × cols`` matrices at address ``ptr`` (leading
    dimension ``ld``, ``stride`` elements apart) as a writable NumPy view of that memory."""
    dtype = np.dtype(dtype)
    if count == 0 or rows == 0 or cols == 0:
        return np.zeros((count, rows, cols), dtype=dtype)
    extent = (count - 1) * stride + (rows - 1) + (cols - 1) * ld + 1
    ctype = ctypes.c_float if dtype == np.float32 else ctypes.c_double
    flat = np.ctypeslib.as_array((ctype * extent).from_address(ptr))
    return np.lib.stride_tricks.as_strided(
        flat, shape=(count, rows, cols), strides=(stride * dtype.itemsize, dtype.itemsize,
                                                  ld * dtype.itemsize))


def _gemm_strided_batched(dtype):
    """``cublas{S,D}gemmStridedBatched`` on host memory, with cuBLAS's semantics:
    ``C_i = α op(A_i) op(B_i) + β C_i`` (column-major; op N or T; ``C_i`` not read when
    β = 0), and its argument checks (CUBLAS_STATUS_INVALID_VALUE for a leading dimension
    below the rows it must span, or a negative size)."""

    def gemm(handle, transa, transb, m, n, k, alpha, A, lda, stride_a, B, ldb, stride_b,
             beta, C, ldc, stride_c, count):
        alpha, beta = (float(getattr(v, "_obj", v).value) for v in (alpha, beta))
        rows_a, rows_b = (m if transa == 0 else k), (k if transb == 0 else n)
        if (min(m, n, k, count) < 0 or lda < max(1, rows_a) or ldb < max(1, rows_b)
                or ldc < max(1, m) or transa not in (0, 1) or transb not in (0, 1)):
            return _INVALID_VALUE
        a = _column_major(A, dtype, rows_a, k if transa == 0 else m, lda, stride_a, count)
        b = _column_major(B, dtype, rows_b, n if transb == 0 else k, ldb, stride_b, count)
        c = _column_major(C, dtype, m, n, ldc, stride_c, count)
        op_a = a if transa == 0 else np.swapaxes(a, 1, 2)
        op_b = b if transb == 0 else np.swapaxes(b, 1, 2)
        product = alpha * np.matmul(op_a, op_b)
        c[...] = product if beta == 0 else product + beta * c
        return 0

    return gemm


class FakeCublasLibrary:
    """What :class:`refbraid.backends.cupy_blas._Cublas` calls in libcublas — a handle, a
    stream, the strided-batched GEMMs — on host memory: the module's ctypes call (operation
    flags, leading dimensions, batch strides, α and β by reference) checked by cuBLAS's
    rules and computed by NumPy."""

    def __init__(self):
        self.calls = 0
        single, double = _gemm_strided_batched(np.float32), _gemm_strided_batched(np.float64)

        def counted(gemm):
            def call(*args):
                self.calls += 1
                return gemm(*args)
            return call

        self.cublasSgemmStridedBatched = counted(single)
        self.cublasDgemmStridedBatched = counted(double)
        self.cublasCreate_v2 = lambda handle: 0
        self.cublasSetStream_v2 = lambda handle, stream: 0


def _gemm(transa, transb, a, b, out=None, alpha=1.0, beta=0.0):
    """``cupy.cublas.gemm``: ``out = α op(a) op(b) + β out`` (NumPy's product)."""
    op_a = a.T if transa in ("T", "t") else a
    op_b = b.T if transb in ("T", "t") else b
    product = np.matmul(op_a, op_b)
    if out is None:
        return alpha * product
    out[...] = alpha * product + beta * out if beta else alpha * product
    return out


@contextlib.contextmanager
def fake_cupy() -> Iterator[types.ModuleType]:
    """Within the block ``import cupy`` is NumPy with the emulated ``RawKernel`` and
    ``ElementwiseKernel`` (and ``cupy.cublas.gemm``): the ``cupy`` backend's GPU branches run
    on NumPy arrays, NumPy's functions standing in for CuPy's (and cuBLAS's); and
    :mod:`refbraid.backends.cupy_blas` calls :class:`FakeCublasLibrary` (counting its GEMMs in
    ``fake.cublas_library.calls``) where it would call libcublas."""
    fake = types.ModuleType("cupy")
    fake.__getattr__ = lambda name: getattr(np, name)
    fake.ndarray = np.ndarray
    fake.RawKernel = RawKernel
    fake.ElementwiseKernel = ElementwiseKernel
    fake.cublas = types.ModuleType("cupy.cublas")
    fake.cublas.gemm = _gemm
    fake.lib = np.lib
    fake.cuda = types.SimpleNamespace(
        get_current_stream=lambda: types.SimpleNamespace(ptr=0),  # the null stream
        Device=lambda: types.SimpleNamespace(id=0))
    names = ("cupy", "cupy.cublas")
    saved = {n: sys.modules.get(n) for n in names}
    sys.modules.update({"cupy": fake, "cupy.cublas": fake.cublas})
    saved_cublas = cupy_blas._CUBLAS
    fake.cublas_library = FakeCublasLibrary()
    cupy_blas._CUBLAS = cupy_blas._Cublas(fake.cublas_library)
    try:
        yield fake
    finally:
        cupy_blas._CUBLAS = saved_cublas
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
