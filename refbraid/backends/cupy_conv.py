"""Convolutions on CuPy as one strided copy and one GEMM (im2col), for the ``cupy`` backend.

The reference convolution (:func:`refbraid.backends.reference.conv2d`) sums the s² stencil
offsets one by one, a tensordot and an accumulation each: about 3·s² launches forward and
5·s² for the adjoint on a GPU (28 and 45 for a 3×3 kernel). Here the s² shifted windows of
the zero-padded input are one strided view (no copy), made contiguous by one launch (the
"im2col" matrix), and the contraction over (c, p, q) is one GEMM::

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

Launches (3×3 kernel, one step or k rows alike): a convolution 4 (pad: a fill and a copy,
the window copy, the GEMM); its adjoint 5 for dx (the flipped kernel's copy and a
convolution), 6 more with dW and db (dz₂'s copy, the windows of x again, the GEMM, the sum).

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

from .portable import contiguous, namespace, zeros_on

#: the largest column matrix (bytes) the cupy backend builds; larger inputs take the reference
COLUMN_BYTES = 1 << 30


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
    (n,i,j)] = x̃[..., n, c, i+p, j+q]``, (..., C·s², B·H·W), C-ordered (3 launches)."""
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
    Z = xp.reshape(xp.matmul(W2, columns(x, s)), (*lead, O, B, H, Wd))
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
    dW = xp.reshape(xp.matmul(dz2, xp.permute_dims(cols, (*range(n), n + 1, n))), W.shape)
    return dx, dW, xp.sum(dz2, axis=-1)
