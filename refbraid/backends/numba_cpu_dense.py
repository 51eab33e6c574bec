"""Numba CPU kernels (backend ``"numba"``), part 2: dense layers and the classifier loss.

Every public kernel has the signature and semantics of the same-named function in
:mod:`refbraid.backends.reference`; its docstring says only what it changes. The math::

    linear              z = x Wᵀ + b                          BLAS GEMM, then bias in place
    linear_adjoint      dx = dz W, dW = dzᵀ x, db = Σ_B dz    two BLAS GEMMs, one column sum
    softmax_cross_entropy L, p = softmax(logits)              one kernel: max, log-sum-exp, p
                                                              per row (adjoint: reference)

``matmul`` stays the reference's BLAS ``a @ b`` (nothing to fuse into it), and so does
``softmax_cross_entropy_adjoint`` (one subtraction and one scaling). The GEMMs stay BLAS:
a naive Numba triple loop measured ≈4× slower.

Shape legend: ``B`` batch, ``K`` input features, ``C`` features (or classes).

The shared choices (one thread, no fastmath, non-float inputs to the reference) are listed
in :mod:`refbraid.backends.numba_cpu`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from . import reference
from .numba_cpu import check_ndim, check_size, common_dtype, native_floats

OVERRIDES = ("linear", "linear_adjoint", "softmax_cross_entropy")


# ----------------------------------------------------------------------------- dense
@njit(cache=True)
def _column_sum(a, out):
    """out[c] = Σ_n a[n, c].  a: (B, C)."""
    for c in range(a.shape[1]):
        out[c] = 0.0
    for n in range(a.shape[0]):
        for c in range(a.shape[1]):
            out[c] += a[n, c]


def check_linear_args(x, W, b=None, dz=None) -> None:
    """ValueError unless x: (B, K), W: (C, K), b: (C,) or None, dz: (B, C) or None."""
    check_ndim("x", x, 2, "(batch, in_features)")
    check_ndim("W", W, 2, "(out_features, in_features)")
    check_size("W", W.shape[1], x.shape[1], "in_features (shape[1]) equal to x.shape[1] =")
    if b is not None and b.shape != (W.shape[0],):
        raise ValueError(f"`b` must have shape ({W.shape[0]},), got {b.shape}.")
    if dz is not None and dz.shape != (x.shape[0], W.shape[0]):
        raise ValueError(f"`dz` must have shape {(x.shape[0], W.shape[0])}, got {dz.shape}.")


def linear(x, W, b):
    """z = x Wᵀ + b (reference.linear): BLAS GEMM, then the bias added in place.

    The in-place add is NumPy's ``z += b``: a fused Numba bias loop measured the same at
    256×512 and ≈1 µs slower at 32×32 (its call overhead).
    """
    if not native_floats(x, W, b):
        return reference.linear(x, W, b)
    check_linear_args(x, W, b)
    dtype = common_dtype(x, W, b)
    if x.dtype != dtype or W.dtype != dtype:
        x, W = x.astype(dtype), W.astype(dtype)
    z = x @ W.T  # B,C
    if b is not None:
        z += b
    return z


def linear_adjoint(x, W, dz):
    """(dx, dW, db) = (dz W, dzᵀ x, Σ_B dz) (reference.linear_adjoint): two GEMMs, a column sum."""
    if not native_floats(x, W, dz):
        return reference.linear_adjoint(x, W, dz)
    check_linear_args(x, W, dz=dz)
    dtype = common_dtype(x, W, dz)
    if x.dtype != dtype or W.dtype != dtype or dz.dtype != dtype:
        x, W, dz = x.astype(dtype), W.astype(dtype), dz.astype(dtype)
    db = np.empty(dz.shape[1], dtype)
    _column_sum(dz, db)
    return dz @ W, dz.T @ x, db


# ----------------------------------------------------------------------------- loss
@njit(cache=True)
def _softmax_xent_kernel(logits, labels, probs):
    """probs = softmax rows; returns Σ_b −log p[b, y_b]."""
    total = 0.0
    for b in range(logits.shape[0]):
        m = logits[b, 0]
        for c in range(1, logits.shape[1]):
            if logits[b, c] > m:
                m = logits[b, c]
        s = 0.0
        for c in range(logits.shape[1]):
            s += math.exp(logits[b, c] - m)
        logsum = math.log(s)
        for c in range(logits.shape[1]):
            probs[b, c] = math.exp(logits[b, c] - m - logsum)
        total -= logits[b, labels[b]] - m - logsum
    return total


def _check_labels(labels, B: int, n_classes: int) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu":
        raise TypeError(f"`labels` must be an integer array, got dtype {labels.dtype}.")
    if labels.shape != (B,):
        raise ValueError(f"`labels` must have shape ({B},), got {labels.shape}.")
    if B and (labels.min() < 0 or labels.max() >= n_classes):
        raise ValueError(
            f"`labels` must lie in [0, {n_classes}), got range [{labels.min()}, {labels.max()}]."
        )
    return np.ascontiguousarray(labels, np.int64)


def softmax_cross_entropy(logits, labels):
    """(L, p) as reference.softmax_cross_entropy: one kernel (row max, log-sum-exp, p per row)."""
    if not native_floats(logits) or getattr(logits, "ndim", 0) != 2 or logits.shape[0] == 0:
        return reference.softmax_cross_entropy(logits, labels)
    labels = _check_labels(labels, logits.shape[0], logits.shape[1])
    logits = np.ascontiguousarray(logits)
    probs = np.empty_like(logits)
    total = _softmax_xent_kernel(logits, labels, probs)
    return logits.dtype.type(total / logits.shape[0]), probs
