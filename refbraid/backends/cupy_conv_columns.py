"""The column ("im2col") matrix of a convolution on CuPy: one gather kernel.

For an s×s kernel and x̃ = x zero-padded by r = s // 2 on both spatial axes::

    cols[(c,p,q), (n,i,j)] = x̃[n, c, i+p, j+q]                          (C·s², B·H·W)

so that a convolution is one GEMM, ``z₂ = W₂ · cols`` (W₂ = W as (O, C·s²)), and its weight
gradient another, ``dW₂ = dz₂ · colsᵀ`` (:mod:`refbraid.backends.cupy_conv`). :func:`columns`
launches one thread block per row ``((c,p,q), n)`` of ``cols``, its threads along (i, j):
each reads ``x[n, c, i+p−r, j+q−r]``, or writes 0 where that falls in the padding (the
``im2col`` kernel below). Its values are the strided-window view's of the zero-padded input
(:func:`strided_columns`, the path off a GPU): the same elements copied, bit for bit. It
replaces three launches of the strided form — the padded array's fill, the copy of x into
it, the windows' copy — and their memory traffic.

The input's rows of a batched call may be a strided view (MGRIT's every m-th state of a
level): :func:`row_layout` finds the rows' offset and stride in their C-contiguous base, which
the kernels read in place (this module's and :mod:`refbraid.backends.cupy_conv_direct`'s).

Memory: the column matrix holds s² copies of the input (a 3×3 step on B 64, 16×32×32 in
float32: 38 MB; k rows at once, k times that); :func:`fits` says whether it stays within
:data:`COLUMN_BYTES`.

Shape legend: k rows (optional, any lead axes), B batch, C channels, H × W the image, s the
(odd) kernel size.
"""

from __future__ import annotations

import importlib
import math

import numpy as np

from .cupy_raw import compiled, on_host, read_by_rows, real_cupy, row_layout
from .portable import contiguous, namespace, zeros_on

#: the largest column matrix (bytes) the cupy backend builds; larger inputs take the reference
COLUMN_BYTES = 1 << 30

#: most threads of one block of the im2col kernel (one block per row of the column matrix)
THREADS = 256

_SOURCES = {
    "im2col": """
// x: lead row l's images (B, C, H, W), C-ordered, start offset + l row_stride elements in
extern "C" __global__ void im2col(const T* x, T* cols, long long offset, long long row_stride,
    int B, int C, int H, int W, int s) {
  // block o = (((l C + c) s + p) s + q) B + n: row (c, p, q) of lead row l, sample n
  long long o = blockIdx.x;
  int n = (int)(o % B);
  long long rest = o / B;
  int q = (int)(rest % s);
  rest /= s;
  int p = (int)(rest % s);
  rest /= s;
  int c = (int)(rest % C);
  long long l = rest / C;
  int r = s / 2, HW = H * W;
  const T* src = x + offset + l * row_stride + ((long long)n * C + c) * HW;
  T* dst = cols + o * HW;
  for (int t = threadIdx.x; t < HW; t += blockDim.x) {
    int i = t / W, j = t - i * W;
    int yi = i + p - r, xj = j + q - r;
    dst[t] = (yi >= 0 && yi < H && xj >= 0 && xj < W) ? src[yi * W + xj] : (T)0;
  }
}
""",
}

#: the kernels (the compile check walks these)
KERNELS = tuple(_SOURCES)


def cuda_source(name: str, T: str = "double") -> str:
    """The complete CUDA C source of kernel ``name`` for element type ``T``."""
    return f"typedef {T} T;\n{_SOURCES[name]}"


def fits(x, s: int) -> bool:
    """Whether the column matrix of ``x`` for an s×s kernel stays within COLUMN_BYTES."""
    return x.size * s * s * x.dtype.itemsize <= COLUMN_BYTES


def _as_strided(xp):
    """``cupy.lib.stride_tricks.as_strided`` of the array module ``xp``."""
    lib = getattr(xp, "lib", None)
    tricks = getattr(lib, "stride_tricks", None) if lib is not None else None
    if tricks is None:
        tricks = importlib.import_module(f"{xp.__name__}.lib.stride_tricks")
    return tricks.as_strided


def _padded(x, r: int):
    """x (..., B, C, H, W) zero-padded by r on both spatial axes (a fill and a copy)."""
    *lead, B, C, H, Wd = x.shape
    xpad = zeros_on(x, (*lead, B, C, H + 2 * r, Wd + 2 * r))
    xpad[..., r:r + H, r:r + Wd] = x
    return xpad


def columns(x, s: int):
    """The im2col matrix of x (..., B, C, H, W) for an s×s kernel: ``cols[..., (c,p,q),
    (n,i,j)] = x̃[..., n, c, i+p, j+q]``, (..., C·s², B·H·W), C-ordered: one launch of the
    ``im2col`` kernel on a GPU; elsewhere :func:`strided_columns` (on the CuPy stand-in
    counted as the kernel's one launch, after the copy its GPU branch makes of rows it cannot
    address: ``cupy_raw.read_by_rows``)."""
    if not real_cupy(x):
        return on_host("im2col", lambda a: strided_columns(a, s), *read_by_rows((x, 4)))
    import cupy  # pragma: no cover - needs a GPU (the emulator runs this branch)

    *lead, B, C, H, Wd = x.shape
    layout = row_layout(x)
    if layout is None:
        x = cupy.ascontiguousarray(x)
        layout = x, 0, B * C * H * Wd
    base, offset, row_stride = layout
    cols = cupy.empty((*lead, C * s * s, B * H * Wd), dtype=x.dtype)
    blocks = math.prod(lead) * C * s * s * B
    if blocks and H * Wd:
        threads = min(THREADS, 32 * -(-(H * Wd) // 32))
        compiled(cuda_source, "im2col", x.dtype)((blocks,), (threads,), (
            base, cols, np.int64(offset), np.int64(row_stride), np.int32(B), np.int32(C),
            np.int32(H), np.int32(Wd), np.int32(s)))
    return cols


def strided_columns(x, s: int):
    """:func:`columns` as array operations: the s² shifted windows of the zero-padded input
    as one strided view, made contiguous (3 launches: the padded array's fill and copy, the
    windows' copy)."""
    xp = namespace(x)
    *lead, B, C, H, Wd = x.shape
    xpad = _padded(x, s // 2)
    *lead_strides, sB, sC, sH, sW = xpad.strides
    windows = _as_strided(xp)(xpad, shape=(*lead, C, s, s, B, H, Wd),
                              strides=(*lead_strides, sC, sH, sW, sB, sH, sW))  # a view
    return xp.reshape(contiguous(windows), (*lead, C * s * s, B * H * Wd))
