"""What every hand-written CuPy kernel of the ``cupy`` backend shares: compiled once per
element type on a GPU; off a GPU, the reference run in its place and counted as one launch.

The ``RawKernel`` modules (:mod:`.cupy_layernorm`, :mod:`.cupy_softmax`, :mod:`.cupy_gru`)
keep their CUDA C source per kernel with ``T`` the element type; :func:`compiled` builds it
for float or double on first use. Off a GPU (NumPy arrays, or the CuPy stand-in of
:mod:`.cupy_standin`) :func:`on_host` runs the reference kernel the CUDA source reproduces,
on the stand-in's NumPy storage, and reports ONE launch to the active launch counter: what
the kernel costs a GPU. :mod:`.cupy_fused`'s element-wise kernels take the same two doors
(:func:`real_cupy` to choose, :func:`on_host` off a GPU).
"""

from __future__ import annotations

import math
import sys

import numpy as np

from .launch_model import current

#: CUDA C element type of each NumPy dtype the kernels take
CUDA_TYPES = {"float64": "double", "float32": "float"}

#: device functions of the row kernels (one thread block per row, blockDim.x a power of
#: two): the block's sum and maximum of one double per thread, in a fixed-order tree
BLOCK_REDUCTIONS = """
__device__ double block_sum(double* buf, double v) {
  int t = threadIdx.x;
  buf[t] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) buf[t] += buf[t + s];
    __syncthreads();
  }
  double total = buf[0];
  __syncthreads();
  return total;
}
__device__ double block_max(double* buf, double v) {
  int t = threadIdx.x;
  buf[t] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) buf[t] = fmax(buf[t], buf[t + s]);
    __syncthreads();
  }
  double total = buf[0];
  __syncthreads();
  return total;
}
"""


def real_cupy(a) -> bool:
    """True for an array of an imported CuPy that can build kernels (not a stand-in)."""
    cupy = sys.modules.get("cupy")
    return (cupy is not None and hasattr(cupy, "ElementwiseKernel")
            and isinstance(a, getattr(cupy, "ndarray", ())))


def address(a) -> int:
    """The device address of ``a``'s first element, as a kernel or cuBLAS receives it: a CuPy
    array's ``data.ptr``; a NumPy array's data pointer (the CUDA C emulator's device arrays,
    tests/cuda_c)."""
    ptr = getattr(getattr(a, "data", None), "ptr", None)
    return int(ptr) if ptr is not None else int(a.__array_interface__["data"][0])


def row_layout(x, inner: int = 4):
    """``(base, offset, row_stride)`` when x (..., *item) — its last ``inner`` axes one
    C-ordered item: an image (B, C, H, W), a state (B, C) — is rows of such items evenly
    spaced in a C-contiguous array ``base`` (MGRIT's every m-th state of a level: a strided
    view; a negative stride: those rows in descending order, as the adjoint's sweeps read the
    forward states): lead row l starts ``offset + l · row_stride`` elements into it. None
    otherwise (a kernel then reads a contiguous copy, or writes a new array)."""
    item = x.itemsize
    dims = x.shape[x.ndim - inner:]
    want = [item * math.prod(dims[i + 1:]) for i in range(len(dims))]  # C-order strides
    if any(n > 1 and st != w for n, st, w in zip(dims, x.strides[x.ndim - inner:], want,
                                                  strict=True)):
        return None
    row_stride, rows = 0, 1  # bytes between lead rows; rows spanned so far, innermost first
    for n, st in reversed(list(zip(x.shape[:x.ndim - inner], x.strides[:x.ndim - inner],
                                   strict=True))):
        if n == 1:
            continue
        if rows == 1:
            row_stride = st
        elif st != row_stride * rows:
            return None
        rows *= n
    base = x
    while getattr(base, "base", None) is not None and isinstance(base.base, type(x)):
        base = base.base
    offset = address(x) - address(base)
    if (not base.flags.c_contiguous or base.dtype != x.dtype
            or row_stride % item or offset < 0 or offset % item):
        return None
    return base, offset // item, row_stride // item


def row_args(a, inner: int = 4):
    """:func:`row_layout` of ``a``, or where its rows are not evenly spaced C-ordered items
    that of a contiguous copy (``(copy, 0, item size)``): what a kernel reading rows by
    offset and row stride is handed."""
    layout = row_layout(a, inner)
    if layout is None:
        import cupy  # pragma: no cover - needs a GPU (the emulator runs this branch)

        a = cupy.ascontiguousarray(a)
        layout = a, 0, math.prod(a.shape[a.ndim - inner:])
    return layout


def read_by_rows(*operands) -> list:
    """The ``(array, inner)`` operands of a kernel reading rows by offset and row stride, as
    its GPU branch hands them over (:func:`row_args`), for its path off a GPU: on the CuPy
    stand-in an operand whose storage :func:`row_layout` cannot describe is copied first (an
    ``ascontiguousarray`` launch, the copy ``row_args`` makes on a GPU); any other array as
    it is. Returns the arrays."""
    from .standin_array import ndarray as DeviceArray
    from .standin_array import run

    return [run("ascontiguousarray", np.ascontiguousarray, (a,))
            if isinstance(a, DeviceArray) and row_layout(a._a, inner) is None else a
            for a, inner in operands]


def compiled(source, name: str, dtype, cache: dict = {}):  # noqa: B006 - one per process
    """The CuPy ``RawKernel`` ``name`` of ``source(name, T)`` for ``dtype`` (built once)."""
    import cupy

    text = source(name, CUDA_TYPES[np.dtype(dtype).name])
    if (name, text) not in cache:
        cache[name, text] = cupy.RawKernel(text, name)
    return cache[name, text]


def on_host(name: str, fn, *args):
    """``fn`` (a reference kernel) on the NumPy storage of stand-in arrays, its outputs back
    on the stand-in, reported as ONE launch ``name`` to the active launch counter (plain
    NumPy arrays pass straight through)."""
    return on_host_into(name, fn, None, *args)


def on_host_into(name: str, fn, into, *args):
    """:func:`on_host` for a kernel that writes some of its outputs into given arrays (MGRIT's
    rows of an iterate): output i goes into the stand-in array ``into[i]`` where that is not
    None — its storage written, that memory reported as the launch's write — else into new
    memory (``into`` None: all new). Returns the outputs (the given arrays where given)."""
    from .standin_array import ndarray as DeviceArray

    device = [a for a in args if isinstance(a, DeviceArray)]
    if not device and into is None:
        return fn(*args)
    raw = [a._a if isinstance(a, DeviceArray) else a for a in args]
    outs = fn(*raw)
    outs = outs if isinstance(outs, tuple) else (outs,)
    t, written, results = current(), [], []
    for o, target in zip(outs, into or (None,) * len(outs), strict=True):
        if target is None:
            # the kernel writes new memory: a reference output that views an input is copied
            # (else the counter would take it for the input and forget who wrote that)
            o = o.copy() if any(np.may_share_memory(o, r) for r in raw
                                if isinstance(r, np.ndarray)) else o
            if t is not None:
                t.fresh(o)
            written.append(o)
            results.append(DeviceArray(o))
        else:
            target._a[...] = o
            written.append(target._a)
            results.append(target)
    if t is not None:
        t.launch([a._a for a in device], written, name)
    return tuple(results) if len(results) > 1 else results[0]
