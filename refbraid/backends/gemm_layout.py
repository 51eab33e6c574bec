"""How cuBLAS's strided-batched GEMM reads row-major operands: bookkeeping on shapes and
strides alone, shared by :mod:`.cupy_blas` (which calls cuBLAS with it) and the CuPy
stand-in's launch counter (:func:`.standin_array.matmul`, which copies what it copies).

Row-major ``C = A·B`` (shapes ``(..., M, K)`` and ``(..., K, N)``) is the column-major
product ``Cᵀ = Bᵀ·Aᵀ``: a row-major operand's memory *is* its transpose in column-major order
(``op = N``, leading dimension its row stride), a transposed view's memory is the matrix
itself (``op = T``, leading dimension its column stride); a batch is one stride over the
broadcast batch axes (0 for a 2-D operand). An operand that fits neither is copied
C-contiguous first.
"""

from __future__ import annotations

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


def layout(shape, strides, itemsize: int, batch: tuple[int, ...]) -> Operand:
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
        raise ValueError("the strided-batched GEMM needs operands of at least 2 dimensions.")
    (M, K), (K2, N) = a_shape[-2:], b_shape[-2:]
    if K != K2:
        raise ValueError(f"matmul: inner sizes differ ({K} and {K2}).")
    batch = tuple(np.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2])))
    return (batch, M, N, K, layout(a_shape, a_strides, itemsize, batch),
            layout(b_shape, b_strides, itemsize, batch))
