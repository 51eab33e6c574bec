"""Whole dense ODE steps (one, and k at once), and k conv layers at once: MGRIT's batched sweeps.

One dense ODE step (catalogue kernels ``dense_step`` / ``dense_step_adjoint``): the
composition :class:`refbraid.layers.DenseStep` makes of the per-operation kernels, ``z =
linear(y, W, b)``, ``y_next = euler_act(y, z, h)``; ``s = h σ'(z) ⊙ dy_next``, ``dy = dy_next
+ s W``, ``dW = sᵀ y``, ``db = Σ_B s``. A GPU backend overrides them to issue one GEMM per
product and one fused kernel per element-wise chain (:mod:`refbraid.backends.cupy_gpu`,
:mod:`refbraid.backends.numba_cuda_step`); the layer calls them only where a backend does.

Dense ODE steps (catalogue kernels ``dense_step_batched`` / ``dense_step_batched_adjoint``,
:data:`refbraid.backends.KERNELS`; the numba and cuda backends override them with fused
kernels, :mod:`refbraid.backends.numba_cpu_batched`, :mod:`refbraid.backends.numba_cuda_batched`),
row j with weights ``W[j]``, bias ``b[j]`` and step size ``h[j]``::

    Z[j] = Y[j] W[j]ᵀ + b[j],   Y_next[j] = Y[j] + h[j] σ(Z[j])
    S[j] = h[j] σ'(Z[j]) ⊙ dY_next[j],   dY[j] = dY_next[j] + S[j] W[j],
    dW[j] = S[j]ᵀ Y[j],   db[j] = Σ_B S[j]

written against the array API (``matmul`` of the stacks: on NumPy the per-step 2-D GEMM per
row, so each row has the bits of :meth:`refbraid.layers.DenseStep.forward` / ``adjoint``).

Convolutions (``conv2d_batched``, ``conv2d_adjoint_batched``, not catalogue kernels): the
reference :func:`refbraid.backends.reference.conv2d` and ``conv2d_adjoint`` applied to the
k rows of a stack, row j with weights ``W[j]``::

    Z[j]  = W[j] * X[j] + b[j]                     (k, B, O, H, W)
    dX[j] = W[j] *ᵀ dZ[j],   dW[j] = dZ[j] ⋆ X̃[j],   db[j] = Σ_{B,H,W} dZ[j]

Bit-identical to k reference calls on NumPy: per stencil offset (p, q) the reference's
``tensordot`` is one 2-D product of two C-ordered copies (the window with channels last,
the weights as (C, O)); here ``np.matmul`` makes the same 2-D product per row from the same
C-ordered operands (one BLAS GEMM each, the same shapes), and the offsets are summed in the
same order (tests/test_conv_batched.py compares every entry). What it saves is Python: one
pass over the 9 offsets for k rows instead of k passes.

Shape legend: k rows, B batch, C input channels (dense: width), O output channels, H height,
W width.
"""

from __future__ import annotations

import numpy as np

from .device_batching import values_on
from .portable import contiguous, zeros_on
from .reference import (
    activation,
    activation_adjoint,
    array_namespace,
    check_activation,
    euler_act,
    linear,
    linear_adjoint,
    matmul,
)


def _dense_forward(Y, W, b, h, act: str, sigma):
    """(Y_next, Z) of :func:`dense_step_batched` with the activation kernel ``sigma``."""
    check_activation(act)
    xp = array_namespace(Y)
    h = values_on(Y, h, Y.dtype)[:, None, None]  # as a Python float h is: Y's dtype
    Z = xp.matmul(Y, xp.permute_dims(W, (0, 2, 1)))  # k,B,C
    Z += b[:, None, :]
    # Y + h σ(Z), updating the fresh σ(Z) in place (h σ, then + Y: the same two roundings
    # as the expression, one (k, B, C) temporary fewer per call)
    out = sigma(Z, act)
    out *= h
    out += Y
    return out, Z


def _dense_adjoint(Y, Z, dY_next, W, h, act: str, grads: bool, sigma_adjoint):
    """(dY, dW, db) of :func:`dense_step_batched_adjoint` with the kernel ``sigma_adjoint``."""
    check_activation(act)
    xp = array_namespace(dY_next)
    h = values_on(dY_next, h, dY_next.dtype)[:, None, None]  # copied once per content
    S = sigma_adjoint(Z, dY_next, act)  # k,B,C, a fresh array
    S *= h  # h σ'(Z) ⊙ dY_next
    dY = xp.matmul(S, W)
    dY += dY_next  # dY_next + S W (addition commutes exactly: the same bits)
    if not grads:
        return dY, None, None
    return dY, xp.matmul(xp.permute_dims(S, (0, 2, 1)), Y), xp.sum(S, axis=1)


def dense_step(y, W, b, h: float, act: str):
    """One dense ODE step: y (B,C), W (C,C), b (C,), h -> (y_next, z) (module docstring)."""
    z = linear(y, W, b)  # B,C
    return euler_act(y, z, h, act), z


def dense_step_adjoint(y, z, dy_next, W, h: float, act: str, grads: bool = True):
    """Its adjoint -> (dy, dW (C,C), db (C,)); dW and db None unless ``grads``."""
    s = h * activation_adjoint(z, dy_next, act)  # B,C
    if not grads:
        return dy_next + matmul(s, W), None, None
    ds_W, dW, db = linear_adjoint(y, W, s)
    return dy_next + ds_W, dW, db


def dense_step_batched(Y, W, b, h, act: str):
    """k dense ODE steps: Y (k,B,C), W (k,C,C), b (k,C), h (k,) -> (Y_next, Z) (module
    docstring)."""
    return _dense_forward(Y, W, b, h, act, activation)


def dense_step_batched_adjoint(Y, Z, dY_next, W, h, act: str, grads: bool = True):
    """The adjoints of k dense ODE steps -> (dY, dW (k,C,C), db (k,C)); dW and db None
    unless ``grads``."""
    return _dense_adjoint(Y, Z, dY_next, W, h, act, grads, activation_adjoint)


def _pad_hw(X, r: int):
    """X (k, B, C, H, W) zero-padded by r on both spatial axes (made where X lives)."""
    k, B, C, H, Wd = X.shape
    Xpad = zeros_on(X, (k, B, C, H + 2 * r, Wd + 2 * r))
    Xpad[:, :, :, r : r + H, r : r + Wd] = X
    return Xpad


def conv2d_batched(X, W, b):
    """``Z[j] = conv2d(X[j], W[j], b[j])``: X (k,B,C,H,W), W (k,O,C,s,s), b (k,O) or None."""
    xp = array_namespace(X)
    k, B, C, H, Wd = X.shape
    O, s = W.shape[1], W.shape[-1]
    Xpad = _pad_hw(X, s // 2)
    Z = zeros_on(X, (k, B, O, H, Wd))
    for p in range(s):
        for q in range(s):
            # window with channels last, (k, B·H·W, C), and weights (k, C, O), both C-ordered
            A = xp.reshape(contiguous(xp.permute_dims(Xpad[:, :, :, p : p + H, q : q + Wd],
                                                      (0, 1, 3, 4, 2))), (k, B * H * Wd, C))
            Wt = contiguous(xp.permute_dims(W[:, :, :, p, q], (0, 2, 1)))  # k,C,O
            Z += xp.permute_dims(xp.reshape(xp.matmul(A, Wt), (k, B, H, Wd, O)),
                                 (0, 1, 4, 2, 3))
    if b is not None:
        Z += b[:, None, :, None, None]
    return Z


def conv2d_adjoint_batched(X, W, dZ, grads: bool = True):
    """``conv2d_adjoint(X[j], W[j], dZ[j])`` for every row: returns (dX, dW, db), with dW and
    db None unless ``grads`` (dX does not depend on them). On NumPy the bias gradient is
    summed row by row (the per-step call's order); elsewhere in one reduction."""
    xp = array_namespace(X)
    k, B, C, H, Wd = X.shape
    O, s = W.shape[1], W.shape[-1]
    r = s // 2
    Xpad = _pad_hw(X, r) if grads else None
    dXpad = zeros_on(X, (k, B, C, H + 2 * r, Wd + 2 * r))
    dW = xp.zeros_like(W) if grads else None
    G = xp.reshape(contiguous(xp.permute_dims(dZ, (0, 1, 3, 4, 2))), (k, B * H * Wd, O))
    Gt = None  # dZ with the output channels first, (k, O, B·H·W), for dW
    if grads:
        Gt = xp.reshape(contiguous(xp.permute_dims(dZ, (0, 2, 1, 3, 4))), (k, O, B * H * Wd))
    for p in range(s):
        for q in range(s):
            win = (slice(None), slice(None), slice(None), slice(p, p + H), slice(q, q + Wd))
            Wpq = contiguous(W[:, :, :, p, q])  # k,O,C
            dXpad[win] += xp.permute_dims(xp.reshape(xp.matmul(G, Wpq), (k, B, H, Wd, C)),
                                          (0, 1, 4, 2, 3))
            if grads:
                A = xp.reshape(contiguous(xp.permute_dims(Xpad[win], (0, 1, 3, 4, 2))),
                               (k, B * H * Wd, C))
                dW[:, :, :, p, q] = xp.matmul(Gt, A)
    dX = contiguous(dXpad[:, :, :, r : r + H, r : r + Wd])
    if not grads:
        return dX, None, None
    if xp is np:
        db = np.stack([np.sum(dZ[j], axis=(0, 2, 3)) for j in range(k)])
    else:
        db = xp.sum(dZ, axis=(1, 3, 4))
    return dX, dW, db
