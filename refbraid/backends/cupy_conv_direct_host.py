"""What the direct convolution kernels of :mod:`refbraid.backends.cupy_conv_direct` compute,
in NumPy: their path off a GPU (on the CuPy stand-in each is charged as the one launch the
kernel is) and the oracle of their CUDA C (tests/cuda_c).

With x̃ = x zero-padded by r = s // 2 (shape legend and sums as in that module)::

    conv_direct        z  = K * x        the column-matrix GEMM  K₂ · cols(x̃)
                       (+ its epilogues: add, the ODE step's bias, σ and Euler update, + g;
                       its prologue: x scaled to h σ'(z) ⊙ x first, as SCALED_ACT_ADJOINT)
    conv_weight_grad   dW = dz₂ · cols(x̃)ᵀ,  db = Σ dz₂

with K = W, or the transposed convolution's kernel :func:`transposed_kernel` (``flip``).
Their sums run in another order than the kernels' (a GEMM's, not channel chunks and taps):
the kernels agree with them to round-off.
"""

from __future__ import annotations

import numpy as np

from .cupy_conv_columns import strided_columns
from .cupy_fused import BIAS_ACT_EULER, SCALED_ACT_ADJOINT
from .cupy_raw import on_host, on_host_into, read_by_rows
from .portable import contiguous


def convolution_on_host(x, W, flip, add, step, into, g, scale=None):
    """:func:`~refbraid.backends.cupy_conv_direct.convolution` off a GPU: the column-matrix
    GEMM and the epilogue in NumPy, one
    launch on the stand-in (writing into ``into`` where given), after the copies the kernel's
    GPU branch makes of operands whose rows it cannot address (``cupy_raw.read_by_rows``);
    with ``scale`` its input ``h σ'(z) ⊙ x`` formed first, by cupy_fused.SCALED_ACT_ADJOINT's
    NumPy path."""
    x, W, add, g = read_by_rows((x, 4), (W, 4), (add, 4), (g, 4))
    if scale is not None:
        scale = (read_by_rows((scale[0], 4))[0], *scale[1:])
    if step is not None:
        b, y = read_by_rows((step[0], 1), (step[1], 4))
        step = (b, y, *step[2:])
    if step is None:
        def summed(a, w, *more):  # more: (z, h) with scale, then add, then g, in that order
            if scale is not None:
                a, more = SCALED_ACT_ADJOINT.reference(scale[2], more[0], a, more[1]), more[2:]
            v = direct_on_host(a, w, flip)
            for extra in more:
                v = v + extra
            return v

        args = (x, W, *(() if scale is None else scale[:2]),
                *(() if add is None else (add,)), *(() if g is None else (g,)))
        if into is None:
            return on_host("conv_direct", summed, *args)
        return on_host_into("conv_direct", summed, (into,), *args)
    b, y, h, act = step

    def kernel(a, w, bb, yy, hh, *gg):
        z, y_next = BIAS_ACT_EULER.reference(act, direct_on_host(a, w, flip),
                                             bb[..., None, :, None, None], yy, hh)
        return (z, y_next + gg[0]) if gg else (z, y_next)

    args = (x, W, b, y, h, *(() if g is None else (g,)))
    if into is None:
        return on_host("conv_direct", kernel, *args)
    return on_host_into("conv_direct", kernel, (None, into), *args)


def direct_on_host(x, W, flip: bool):
    """What the ``conv_direct`` kernel sums, in NumPy (the column-matrix GEMM)."""
    if flip:
        W = transposed_kernel(np, W)
    *lead, B, C, H, Wd = x.shape
    O, s = W.shape[-4], W.shape[-1]
    W2 = np.reshape(np.ascontiguousarray(W), (*lead, O, C * s * s))
    Z = np.reshape(np.matmul(W2, strided_columns(x, s)), (*lead, O, B, H, Wd))
    return np.ascontiguousarray(np.swapaxes(Z, -4, -3))


def weight_gradient_on_host(x, dz, s: int, scale: tuple | None = None):
    """What the ``conv_weight_grad`` kernel computes, in NumPy: ``dW₂ = dz₂ · colsᵀ`` and
    ``db = Σ dz₂`` (with ``scale = (z, h, act)`` of ``h σ'(z) ⊙ dz``, as SCALED_ACT_ADJOINT
    makes it); one launch on the stand-in, after the copies of operands whose rows the
    kernel cannot address (``cupy_raw.read_by_rows``)."""
    x, dz = read_by_rows((x, 4), (dz, 4))
    if scale is not None:
        scale = (read_by_rows((scale[0], 4))[0], *scale[1:])

    def sums(a, g, *zh):
        if zh:
            g = SCALED_ACT_ADJOINT.reference(scale[2], zh[0], g, zh[1])
        *lead, B, O, H, Wd = g.shape
        C = a.shape[-3]
        dz2 = np.reshape(np.swapaxes(g, -4, -3), (*lead, O, B * H * Wd))
        dW = np.matmul(dz2, np.swapaxes(strided_columns(a, s), -1, -2))
        return np.reshape(dW, (*lead, O, C, s, s)), np.sum(dz2, axis=-1)

    return on_host("conv_weight_grad", sums, x, dz, *(() if scale is None else scale[:2]))


def transposed_kernel(xp, W):
    """The transposed convolution's kernel ``W̃[..., c, o, p, q] = W[..., o, c, s−1−p,
    s−1−q]`` as a C-ordered copy (one launch)."""
    n = W.ndim - 4
    swap = (*range(n), n + 1, n, n + 2, n + 3)
    return contiguous(xp.permute_dims(xp.flip(W, axis=(-2, -1)), swap))
