"""Fused element-wise kernels of the ``cupy`` backend: one launch where the reference makes
three to five.

The reference kernels (:mod:`refbraid.backends.reference`) are one CuPy operation per
array-API call: ``y + h σ(z)`` is three launches (σ, ×h, +y), tanh's adjoint four. On a GPU
each is a launch of a few microseconds around a kernel of less (docs/gpu_layer_parallel.md).
Here each is one CuPy ``ElementwiseKernel`` whose body is the reference's arithmetic in the
same order (T is the array dtype; the step size is cast to T first, as NumPy casts a Python
float against a T array)::

    activation          a = σ(z)                                      (GELU: 5 launches)
    euler_act           out = y + (T)h · σ(z)                        (per-step forward)
    act_adjoint         dz  = σ'(z) · dy                              (per-step adjoint)
    bias_act_euler      z = p + b,  y_next = y + (T)h · σ(z)          (forward, p = y Wᵀ)
    bias_act_euler_add  z = p + b,  y_next = (y + (T)h · σ(z)) + g    (an F-sweep on a coarse
                        level: Φ + g, written into the rows of MGRIT's iterate)
    sum_plus            dy = (p + dy_next) + g                        (the adjoint's F-sweep,
                        p = s W, written into the rows of MGRIT's iterate)
    scaled_act_adjoint  s = (T)h · (σ'(z) · dy)                       (adjoint)
    add_column_sums     dy = dy_next + p,  db = Σ_B s                 (adjoint, p = s W)
    scaled_act_adjoint_copy  s as scaled_act_adjoint, and a copy of dy  (adjoint without
                        the weight gradient, one step: then ``gemm_accumulate`` adds s W
                        into the copy, cuBLAS's GEMM with β = 1)
    plus_difference     out = a + (b − c)                             (MGRIT's FAS right-hand
                        side r + (v − Φ_Δ) and its correction u[C] + (w − v), in place)

with σ, σ' in :data:`ACT` / :data:`ACT_ADJOINT` (tanh, relu, gelu, identity); the last is a
``RawKernel`` with a block of 32 × 32 threads per 32 columns (an element-wise kernel cannot
sum): 32 partial sums down each column, then a fixed-order tree, in double; on (B, C) or
stacked (k, B, C) arrays of one dtype. On CuPy arrays
the CUDA source runs (compiled by CuPy on first use; the source is compiled for sm_90 with
NVRTC in tests/test_gpu_fused.py, no GPU needed). On any other array (NumPy, the CuPy
stand-in of :mod:`refbraid.backends.cupy_standin`) :meth:`Fused.__call__` runs the
NumPy-equivalent reference path — the same operations, one at a time — and reports ONE
launch to the launch counter: what the fused kernel costs a GPU.

Round-off: on NumPy the reference path gives the reference kernels' bits (tested); on a GPU
the CUDA math library's tanh/erf/exp and the compiler's fused multiply-adds change the last
bits (as every CuPy operation already does against NumPy): within 4 ulp per element.

:func:`fused` switches the fused kernels off (``with fused(False):``) to count or time the
reference operations instead (``python -m benchmarks quick counts -o fused=False``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from .cupy_raw import on_host, on_host_into, read_by_rows, real_cupy, row_args, row_layout
from .into import written_into
from .launch_model import current

_ON: list[bool] = [True]


@contextmanager
def fused(on: bool) -> Iterator[None]:
    """``with fused(False):`` — the cupy backend runs its reference operations instead."""
    _ON.append(bool(on))
    try:
        yield
    finally:
        _ON.pop()


def is_on() -> bool:
    return _ON[-1]


def fusable(*arrays) -> bool:
    """The fused kernels take real floating arrays, while switched on (:func:`fused`)."""
    from .dtypes import dtype_kind

    return is_on() and all(dtype_kind(a.dtype) == "f" for a in arrays)


def one_float_dtype(*arrays) -> bool:
    """:func:`fusable`, and all of one dtype (the hand-written kernels' operands)."""
    return fusable(*arrays) and len({a.dtype for a in arrays}) == 1


#: σ(z) in CUDA C (T the dtype), as reference.activation computes it. Constants are
#: literals: NVRTC, which compiles these bodies, has no math.h macros (M_SQRT2 and the like).
ACT = {"tanh": "tanh(z)", "relu": "max(z, (T)0)", "identity": "z",
       "gelu": "(T)0.5 * z * ((T)1 + erf(z / (T)1.4142135623730951))"}  # √2
#: σ'(z) · dy in CUDA C, as reference.activation_adjoint computes it.
ACT_ADJOINT = {
    "tanh": "((T)1 - tanh(z) * tanh(z)) * dy",
    "relu": "(z > (T)0 ? dy : (T)0)",
    "identity": "dy",
    "gelu": "((T)0.5 * ((T)1 + erf(z / (T)1.4142135623730951)) "  # √2
            "+ z * (exp((T)-0.5 * z * z) / (T)2.5066282746310002)) * dy",  # √(2π)
}


def _act(z, act):
    from .reference import activation

    return activation(z, act)


def _act_adjoint(z, dy, act):
    from .reference import activation_adjoint

    return activation_adjoint(z, dy, act)


class Fused:
    """One fused kernel: its CuPy ``ElementwiseKernel`` (params, body per activation) and
    the NumPy-equivalent ``reference(act, *inputs) -> outputs``."""

    def __init__(self, name: str, in_params: str, out_params: str, body: str, reference):
        self.name, self.in_params, self.out_params = name, in_params, out_params
        self.body, self.reference = body, reference
        self._kernels: dict[str, object] = {}

    def source(self, act: str) -> str:
        """The element-wise operation for activation ``act``."""
        return self.body.replace("SIGMA_PRIME_DY", ACT_ADJOINT[act]).replace("SIGMA", ACT[act])

    def cuda_kernel(self, act: str, T: str = "double") -> str:
        """A complete CUDA C kernel of :meth:`source` over contiguous arrays of ``T`` (what
        CuPy generates, reduced to the arithmetic; for compile checks). Nothing is added to
        the body that CuPy's ``ElementwiseKernel`` would not have: no macro, no header."""
        params = [p.split() for p in (self.in_params + ", " + self.out_params).split(",")]
        args = ", ".join(f"{'double' if t == 'float64' else 'T'}* {n}_" for t, n in params)
        loads = " ".join(f"{'double' if t == 'float64' else 'T'}& {n} = {n}_[i];"
                         for t, n in params)
        return (f"typedef {T} T;\n"
                f'extern "C" __global__ void {self.name}_{act}({args}, long long n) {{\n'
                f"  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
                f"  if (i >= n) return;\n  {loads}\n  {self.source(act)};\n}}\n")

    def __call__(self, act: str, *args):
        if real_cupy(args[0]):
            return self._cupy(act, *args)  # pragma: no cover - needs a GPU
        return on_host(self.name, lambda *raw: self.reference(act, *raw), *args)

    def into(self, act: str, into, *args):
        """:meth:`__call__` with output i written into ``into[i]`` where that is not None (an
        array of the output's shape and dtype, any strides: e.g. rows of MGRIT's iterate);
        returns the outputs (the given arrays where given)."""
        if real_cupy(args[0]):  # pragma: no cover - needs a GPU
            import cupy

            shape = cupy.broadcast(*[a for a in args if isinstance(a, cupy.ndarray)]).shape
            dtype = next(a.dtype for a in args if isinstance(a, cupy.ndarray))
            outs = [cupy.empty(shape, dtype) if o is None else o for o in into]
            self._cupy(act, *args, *outs)
            return tuple(outs) if len(outs) > 1 else outs[0]
        return on_host_into(self.name, lambda *raw: self.reference(act, *raw), into, *args)

    def _cupy(self, act, *args):  # pragma: no cover - needs a GPU
        import cupy

        kernel = self._kernels.get(act)
        if kernel is None:
            kernel = cupy.ElementwiseKernel(self.in_params, self.out_params, self.source(act),
                                            f"refbraid_{self.name}_{act}")
            self._kernels[act] = kernel
        return kernel(*args)


# The NumPy-equivalent paths, written against the array API (they also run on stand-ins): a
# Python float h is cast to T by the multiplication, as in the reference kernels.
def _euler_act_ref(act, y, z, h):
    return y + h * _act(z, act)  # reference.euler_act


def _bias_act_euler_ref(act, p, b, y, h):
    z = p + b
    out = _act(z, act) * h  # reference_batched._dense_forward: σ(Z), ×h, +Y
    return z, out + y


def _plus(z_and_out, g):
    z, out = z_and_out
    return z, out + g  # the F-sweep's Φ + g, after the step's own rounding


def _scaled_act_adjoint_ref(act, z, dy, h):
    return _act_adjoint(z, dy, act) * h  # reference_batched._dense_adjoint: S *= h


ACTIVATION = Fused("activation", "T z", "T a", "a = SIGMA", lambda act, z: _act(z, act))
EULER_ACT = Fused("euler_act", "T y, T z, T h", "T out", "out = y + h * SIGMA",
                  _euler_act_ref)
ACT_ADJOINT_KERNEL = Fused("act_adjoint", "T z, T dy", "T dz", "dz = SIGMA_PRIME_DY",
                           lambda act, z, dy: _act_adjoint(z, dy, act))
BIAS_ACT_EULER = Fused("bias_act_euler", "T p, T b, T y, T h", "T z, T out",
                       "z = p + b; out = y + h * SIGMA", _bias_act_euler_ref)
BIAS_ACT_EULER_ADD = Fused("bias_act_euler_add", "T p, T b, T y, T h, T g", "T z, T out",
                           "z = p + b; out = y + h * SIGMA; out = out + g",
                           lambda act, p, b, y, h, g: _plus(_bias_act_euler_ref(act, p, b, y, h),
                                                            g))
SUM_PLUS = Fused("sum_plus", "T p, T dy, T g", "T out", "out = p + dy; out = out + g",
                 lambda act, p, dy, g: (p + dy) + g)
SCALED_ACT_ADJOINT = Fused("scaled_act_adjoint", "T z, T dy, T h", "T s",
                           "s = h * (SIGMA_PRIME_DY)", _scaled_act_adjoint_ref)



class AddColumnSums(Fused):
    """``dy = dy_next + p`` and ``db = Σ_B s`` in one launch. A block of 32 × 32 threads takes
    32 neighbouring columns of one row j of a stack: thread (c, r) walks rows r, r + 32, …
    of column c, writing dy and summing s (coalesced: a warp reads 32 neighbouring columns),
    then the 32 partial sums of each column are added in a fixed tree in shared memory (in
    double; db rounded to T once). So k ⌈C/32⌉ blocks of 1024 threads, not k·C threads
    walking all B rows each (a 1024 × 256 state had 256 threads on a 132-multiprocessor
    GPU). The order of the sum depends on B alone: a row's db is the same bits whether it
    is computed alone or in a stack. A CuPy ``RawKernel`` on a GPU.

    ``dy_next`` is read, and ``dy`` written, by row offset and row stride into their
    C-contiguous base arrays (cupy_raw.row_layout): MGRIT's every m-th state in place, no
    copy. :meth:`into_rows` writes ``(dy_next + p) + g`` (g None: 0; MGRIT's right-hand side,
    read the same way) into given rows — an adjoint F-sweep's rows of the iterate."""

    THREADS = 1024  # 32 columns × 32 row groups

    def __init__(self):
        super().__init__("add_column_sums", "T p, T dy_next, T s", "T dy, T db", "",
                         _add_column_sums_ref)

    def __call__(self, p, dy_next, s):
        if not real_cupy(p):  # off a GPU: the copy the kernel's branch makes (row_args)
            (dy_next,) = read_by_rows((dy_next, 2))
        return super().__call__("identity", p, dy_next, s)

    def into_rows(self, p, dy_next, s, out, g=None):
        """(out, db): ``(dy_next + p) + g`` written into the rows ``out`` (dy_next's shape and
        dtype; g None: ``dy_next + p``) and the column sums of s, in one launch (off a GPU
        after the copies of rows the kernel cannot address: ``cupy_raw.read_by_rows``)."""
        if real_cupy(p):  # pragma: no cover - needs a GPU (the emulator runs this branch)
            return self._cupy("identity", p, dy_next, s, out, g)
        dy_next, g = read_by_rows((dy_next, 2), (g, 2))
        if g is None:
            return on_host_into(self.name, lambda *raw: self.reference("identity", *raw),
                                (out, None), p, dy_next, s)
        return on_host_into(self.name, _add_column_sums_plus_ref, (out, None), p, dy_next, s,
                            g)

    def source(self, act: str) -> str:
        return ("  __shared__ double part[1024];\n"
                "  long long tiles = (C + 31) / 32;\n"
                "  long long j = blockIdx.x / tiles;\n"
                "  long long c = (blockIdx.x % tiles) * 32 + threadIdx.x % 32;\n"
                "  int r = threadIdx.x / 32;\n"
                "  double acc = 0;\n"
                "  if (c < C) {\n"
                "    for (long long n = r; n < B; n += 32) {\n"
                "      long long i = (j * B + n) * C + c;\n"
                "      long long e = n * C + c;\n"
                "      T v = dy_next[dn_off + j * dn_stride + e] + p[i];\n"
                "      if (has_g) v = v + g[g_off + j * g_stride + e];\n"
                "      dy[dy_off + j * dy_stride + e] = v;\n"
                "      acc += s[i];\n"
                "    }\n"
                "  }\n"
                "  part[threadIdx.x] = acc;\n"
                "  __syncthreads();\n"
                "  for (int half = 16; half > 0; half >>= 1) {\n"
                "    if (r < half) part[threadIdx.x] += part[threadIdx.x + 32 * half];\n"
                "    __syncthreads();\n"
                "  }\n"
                "  if (r == 0 && c < C) db[j * C + c] = (T)part[threadIdx.x];\n")

    def cuda_kernel(self, act: str = "identity", T: str = "double") -> str:
        return (f"typedef {T} T;\n"
                f'extern "C" __global__ void {self.name}(const T* p, const T* dy_next, '
                f"long long dn_off, long long dn_stride, const T* s, T* dy, long long dy_off, "
                f"long long dy_stride, const T* g, long long g_off, long long g_stride, "
                f"int has_g, T* db, long long k, long long B, long long C) {{\n"
                f"{self.source(act)}}}\n")

    def _cupy(self, act, p, dy_next, s, out=None, g=None):  # pragma: no cover - needs a GPU
        import cupy

        T = {"float64": "double", "float32": "float"}[p.dtype.name]
        kernel = self._kernels.get(T)
        if kernel is None:
            kernel = cupy.RawKernel(self.cuda_kernel(act, T), self.name)
            self._kernels[T] = kernel
        p, s = cupy.ascontiguousarray(p), cupy.ascontiguousarray(s)
        k, (B, C) = (1 if p.ndim == 2 else p.shape[0]), p.shape[-2:]
        rows = row_args(dy_next, 2)
        dy = cupy.empty_like(p) if out is None else out
        dest = row_layout(dy, 2) if out is not None else (dy, 0, B * C)
        if dest is None:  # rows the kernel cannot address: a new dy, then copied there
            dy, db = self._cupy(act, p, dy_next, s)
            return written_into(dy, out, g), db
        plus = row_args(g, 2) if g is not None else (p, 0, 0)
        db = cupy.empty(p.shape[:-2] + (C,), dtype=p.dtype)
        kernel((k * ((C + 31) // 32),), (self.THREADS,),
               (p, rows[0], np.int64(rows[1]), np.int64(rows[2]), s, dest[0],
                np.int64(dest[1]), np.int64(dest[2]), plus[0], np.int64(plus[1]),
                np.int64(plus[2]), np.int32(g is not None), db, np.int64(k), np.int64(B),
                np.int64(C)))
        return dy, db


def _add_column_sums_plus_ref(p, dy_next, s, g):
    dy, db = _add_column_sums_ref("identity", p, dy_next, s)
    return dy + g, db  # (dy_next + p) + g: the F-sweep's Φ + g after the step's own rounding


class GemmAccumulate:
    """``out += a @ b`` on 2-D arrays in ONE launch: cuBLAS's GEMM with β = 1
    (``cupy.cublas.gemm``) on a GPU; off it NumPy's product added in place (the product
    rounded to the dtype, then the sum: the reference's ``dy_next + s W`` bits), counted as
    one launch that reads a, b and out and writes out. On a GPU cuBLAS forms α·ab + β·out in
    its epilogue, possibly with a fused multiply-add: the last bit of the sum may differ."""

    name = "gemm_accumulate"

    def __call__(self, a, b, out) -> None:
        if real_cupy(out):  # pragma: no cover - needs a GPU
            import cupy
            import cupy.cublas

            from . import cupy_blas

            if cupy_blas.active():  # a CUDA graph recording: CuPy's cuBLAS would refuse
                cupy_blas.matmul(a, b, out=out, beta=1.0)
                return
            cupy.cublas.gemm("N", "N", cupy.ascontiguousarray(a), cupy.ascontiguousarray(b),
                             out=out, alpha=1.0, beta=1.0)
            return
        from .standin_array import ndarray as DeviceArray

        raw = [x._a if isinstance(x, DeviceArray) else x for x in (a, b, out)]
        raw[2] += np.matmul(raw[0], raw[1])
        t = current()
        if isinstance(out, DeviceArray) and t is not None:
            t.launch(raw, [raw[2]], self.name)


def _scaled_act_adjoint_copy_ref(act, z, dy, h):
    return _scaled_act_adjoint_ref(act, z, dy, h), dy.copy()


#: ``s = h σ'(z) ⊙ dy`` and a copy of dy, for :class:`GemmAccumulate` to add ``s W`` into
#: (the dense adjoint without the weight gradient: two launches, ``dy_next + s W`` in the GEMM).
SCALED_ACT_ADJOINT_COPY = Fused("scaled_act_adjoint_copy", "T z, T dy, T h", "T s, T dy_copy",
                                "s = h * (SIGMA_PRIME_DY); dy_copy = dy",
                                _scaled_act_adjoint_copy_ref)
GEMM_ACCUMULATE = GemmAccumulate()


def _add_column_sums_ref(act, p, dy_next, s):
    from .reference import array_namespace

    # dy_next + s W and Σ_B s as reference.linear_adjoint / reference_batched sum them
    return dy_next + p, array_namespace(s).sum(s, axis=-2)


ADD_COLUMN_SUMS = AddColumnSums()

#: ``out = a + (b − c)``: two of MGRIT's passes over whole levels in one launch, with the
#: additions of the two NumPy operations they replace — the FAS right-hand side
#: ``g_Δ = r + (v − Φ_Δ(v))`` and the correction ``u[C] ← u[C] + (w − v)``.
PLUS_DIFFERENCE = Fused("plus_difference", "T a, T b, T c", "T out", "out = a + (b - c)",
                        lambda act, a, b, c: a + (b - c))


def plus_difference(out, a, b, c) -> bool:
    """``out = a + (b − c)`` in one launch (:data:`PLUS_DIFFERENCE`) where the fused kernels
    take the arrays — CuPy's, or the stand-in's, all of ``out``'s shape and of one floating
    dtype, while switched on (:func:`fused`); returns False, writing nothing, where they do
    not. ``out`` may be ``a`` or ``c`` itself (the same array object: each element is read
    before it is written, and CuPy copies no input that *is* an output)."""
    from array_api_compat import is_cupy_array

    arrays = (out, a, b, c)
    if not (all(map(is_cupy_array, arrays)) and one_float_dtype(*arrays)
            and all(x.shape == out.shape for x in arrays)):
        return False
    PLUS_DIFFERENCE.into("identity", (out,), a, b, c)
    return True

#: Every fused kernel (the compile check walks this).
KERNELS = (ACTIVATION, EULER_ACT, ACT_ADJOINT_KERNEL, BIAS_ACT_EULER, BIAS_ACT_EULER_ADD,
           SUM_PLUS, SCALED_ACT_ADJOINT, ADD_COLUMN_SUMS, SCALED_ACT_ADJOINT_COPY,
           PLUS_DIFFERENCE)

