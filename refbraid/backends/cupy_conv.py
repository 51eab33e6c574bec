"""Convolutions on CuPy as one gather kernel and one GEMM (im2col), for the ``cupy`` backend.

The reference convolution (:func:`refbraid.backends.reference.conv2d`) sums the s² stencil
offsets one by one, a tensordot and an accumulation each: about 3·s² launches forward and
5·s² for the adjoint on a GPU (28 and 45 for a 3×3 kernel). Here the column ("im2col")
matrix of the zero-padded input is made by one kernel, and the contraction over (c, p, q) is
one GEMM::

    x̃ = x zero-padded by r = s // 2 on both spatial axes
    cols[(c,p,q), (n,i,j)] = x̃[n, c, i+p, j+q]                          (C·s², B·H·W)
    z[n,o,i,j] = Σ_{(c,p,q)} W₂[o,(c,p,q)] · cols[(c,p,q),(n,i,j)]      W₂ = W as (O, C·s²)

and the adjoint (``dz = ∂L/∂z``, ``dz₂`` = dz as (O, B·H·W))::

    dW₂ = dz₂ · colsᵀ,     db[o] = Σ_{n,i,j} dz[n,o,i,j]
    dx  = z-convolution of dz with W̃,   W̃[c,o,p,q] = W[o,c,s−1−p,s−1−q]

(the transposed convolution is the correlation of dz, padded by r, with the kernel flipped in
both spatial axes and its channel axes swapped: ``dx[n,c,i,j] = Σ_{o,p,q} W[o,c,p,q]
dz[n,o,i+r−p,j+r−q]``, and ``i + r − p = i + p' − r`` with ``p' = s − 1 − p``). Every function
takes a leading row axis too (k rows, row j with its own weights ``W[j]``: MGRIT's batched
sweeps), the GEMM then batched over the rows.

The column matrix (:func:`columns`) is one thread block per row ``((c,p,q), n)`` of
``cols``, its threads along (i, j): each reads ``x[n, c, i+p−r, j+q−r]``, or writes 0 where
that falls in the padding (the ``im2col`` kernel below; the input's rows of a batched call
may be a strided view: MGRIT's every m-th state, read in place). Its values are the
strided-window view's of the zero-padded input (:func:`strided_columns`, the path off a
GPU): the same elements copied, bit for bit. It replaces three launches of the strided
form — the padded array's fill, the copy of x into it, the windows' copy — and their memory
traffic: per column matrix the input is read once and the matrix written once, where the
strided form also wrote and read the padded array (``python -m benchmarks quick counts``
counts both).

Launches (3×3 kernel, one step or k rows alike): a convolution 2 (the columns, the GEMM);
its adjoint 3 for dx (the flipped kernel's copy and a convolution), 4 more with dW and db
(dz₂'s copy, the columns of x again, the GEMM, the sum).

Round-off: a GEMM sums the C·s² products of a point in its own order, not offset by offset
as the reference, so the results agree with the reference to round-off, not bit for bit
(tests/test_cupy_conv.py states the tolerance). The products are the reference's.

Memory: the column matrix holds s² copies of the input (a 3×3 step on B 64, 16×32×32 in
float32: 38 MB; k rows at once, k times that). Above :data:`COLUMN_BYTES` (:func:`fits`) the
``cupy`` backend keeps the reference's offset-by-offset convolution, which needs no such
matrix.

Shape legend: k rows (optional), B batch, C input channels, O output channels, H × W the
image, s the (odd) kernel size.
"""

from __future__ import annotations

import importlib
import math

import numpy as np

from .cupy_blas import product
from .cupy_raw import address, compiled, on_host, real_cupy
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
    counted as the kernel's one launch)."""
    if not real_cupy(x):
        return on_host("im2col", lambda a: strided_columns(a, s), x)
    import cupy  # pragma: no cover - needs a GPU (the emulator runs this branch)

    *lead, B, C, H, Wd = x.shape
    layout = _row_layout(x)
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


def _row_layout(x):
    """``(base, offset, row_stride)`` when x (..., B, C, H, W) is rows of C-ordered images
    evenly spaced in a C-contiguous array ``base`` (MGRIT's every m-th state of a level:
    a strided view): lead row l starts ``offset + l · row_stride`` elements into it. None
    otherwise (the kernel then reads a contiguous copy)."""
    item = x.itemsize
    *lead, B, C, H, Wd = x.shape
    inner = (C * H * Wd * item, H * Wd * item, Wd * item, item)
    if any(n > 1 and st != want for n, st, want in zip(x.shape[-4:], x.strides[-4:], inner,
                                                        strict=True)):
        return None
    row_stride, rows = 0, 1  # bytes between lead rows; rows spanned so far, innermost first
    for n, st in reversed(list(zip(lead, x.strides[:-4], strict=True))):
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
    if (not base.flags.c_contiguous or base.dtype != x.dtype or row_stride < 0
            or row_stride % item or offset < 0 or offset % item):
        return None
    return base, offset // item, row_stride // item


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


def conv2d(x, W):
    """``z = W * x`` without bias ('same' cross-correlation, stride 1, as reference.conv2d):
    x (..., B, C, H, W), W (..., O, C, s, s) -> z (..., B, O, H, W), a permuted view of the
    GEMM's (..., O, B, H, W) result (4 launches)."""
    xp = namespace(x)
    *lead, B, C, H, Wd = x.shape
    O, s = W.shape[-4], W.shape[-1]
    W2 = xp.reshape(contiguous(W), (*lead, O, C * s * s))
    Z = xp.reshape(product(W2, columns(x, s)), (*lead, O, B, H, Wd))
    n = len(lead)
    return xp.permute_dims(Z, (*range(n), n + 1, n, n + 2, n + 3))


def conv2d_adjoint(x, W, dz, grads: bool = True):
    """The adjoint of :func:`conv2d` (plus a bias): ``(dx, dW, db)``; dW and db are None
    unless ``grads``. dx is a permuted view (..., B, C, H, W)."""
    xp = namespace(x)
    *lead, B, O, H, Wd = dz.shape
    s = W.shape[-1]
    n = len(lead)
    swap = (*range(n), n + 1, n, n + 2, n + 3)  # (..., a, b, s, s) -> (..., b, a, s, s)
    W_flipped = contiguous(xp.permute_dims(xp.flip(W, axis=(-2, -1)), swap))  # (..., C, O, s, s)
    dx = conv2d(dz, W_flipped)
    if not grads:
        return dx, None, None
    dz2 = xp.reshape(contiguous(xp.permute_dims(dz, swap)), (*lead, O, B * H * Wd))
    cols = columns(x, s)  # (..., C·s², B·H·W)
    dW = xp.reshape(product(dz2, xp.permute_dims(cols, (*range(n), n + 1, n))), W.shape)
    return dx, dW, xp.sum(dz2, axis=-1)
