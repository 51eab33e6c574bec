"""k convolutions at once, each with its own weights: MGRIT's batched sweeps of a conv network.

The reference :func:`refbraid.backends.reference.conv2d` and ``conv2d_adjoint`` applied to the
k rows of a stack, row j with weights ``W[j]``::

    Z[j]  = W[j] * X[j] + b[j]                     (k, B, O, H, W)
    dX[j] = W[j] *ᵀ dZ[j],   dW[j] = dZ[j] ⋆ X̃[j],   db[j] = Σ_{B,H,W} dZ[j]

Bit-identical to k reference calls on NumPy: per stencil offset (p, q) the reference's
``tensordot`` is one 2-D product of two C-ordered copies (the window with channels last,
the weights as (C, O)); here ``np.matmul`` makes the same 2-D product per row from the same
C-ordered operands (one BLAS GEMM each, the same shapes), and the offsets are summed in the
same order (tests/test_conv_batched.py compares every entry). What it saves is Python: one
pass over the 9 offsets for k rows instead of k passes.

Shape legend: k rows, B batch, C input channels, O output channels, H height, W width.
"""

from __future__ import annotations

import numpy as np


def _pad_hw(X, r: int):
    """X (k, B, C, H, W) zero-padded by r on both spatial axes."""
    k, B, C, H, Wd = X.shape
    Xpad = np.zeros((k, B, C, H + 2 * r, Wd + 2 * r), dtype=X.dtype)
    Xpad[:, :, :, r : r + H, r : r + Wd] = X
    return Xpad


def conv2d_batched(X, W, b):
    """``Z[j] = conv2d(X[j], W[j], b[j])``: X (k,B,C,H,W), W (k,O,C,s,s), b (k,O) or None."""
    k, B, C, H, Wd = X.shape
    O, s = W.shape[1], W.shape[-1]
    Xpad = _pad_hw(X, s // 2)
    Z = np.zeros((k, B, O, H, Wd), dtype=X.dtype)
    for p in range(s):
        for q in range(s):
            # window with channels last, (k, B·H·W, C), and weights (k, C, O), both C-ordered
            A = np.ascontiguousarray(
                Xpad[:, :, :, p : p + H, q : q + Wd].transpose(0, 1, 3, 4, 2)
            ).reshape(k, B * H * Wd, C)
            Wt = np.ascontiguousarray(W[:, :, :, p, q].transpose(0, 2, 1))  # k,C,O
            Z += np.matmul(A, Wt).reshape(k, B, H, Wd, O).transpose(0, 1, 4, 2, 3)
    if b is not None:
        Z += b[:, None, :, None, None]
    return Z


def conv2d_adjoint_batched(X, W, dZ, grads: bool = True):
    """``conv2d_adjoint(X[j], W[j], dZ[j])`` for every row: returns (dX, dW, db), with dW and
    db None unless ``grads`` (dX does not depend on them)."""
    k, B, C, H, Wd = X.shape
    O, s = W.shape[1], W.shape[-1]
    r = s // 2
    Xpad = _pad_hw(X, r) if grads else None
    dXpad = np.zeros((k, B, C, H + 2 * r, Wd + 2 * r), dtype=X.dtype)
    dW = np.zeros_like(W) if grads else None
    G = np.ascontiguousarray(dZ.transpose(0, 1, 3, 4, 2)).reshape(k, B * H * Wd, O)
    Gt = None  # dZ with the output channels first, (k, O, B·H·W), for dW
    if grads:
        Gt = np.ascontiguousarray(dZ.transpose(0, 2, 1, 3, 4)).reshape(k, O, B * H * Wd)
    for p in range(s):
        for q in range(s):
            win = (slice(None), slice(None), slice(None), slice(p, p + H), slice(q, q + Wd))
            Wpq = np.ascontiguousarray(W[:, :, :, p, q])  # k,O,C
            dXpad[win] += np.matmul(G, Wpq).reshape(k, B, H, Wd, C).transpose(0, 1, 4, 2, 3)
            if grads:
                A = np.ascontiguousarray(Xpad[win].transpose(0, 1, 3, 4, 2)).reshape(
                    k, B * H * Wd, C)
                dW[:, :, :, p, q] = np.matmul(Gt, A)
    dX = np.ascontiguousarray(dXpad[:, :, :, r : r + H, r : r + Wd])
    if not grads:
        return dX, None, None
    db = np.stack([np.sum(dZ[j], axis=(0, 2, 3)) for j in range(k)])
    return dX, dW, db
