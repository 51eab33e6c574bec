"""Numba CPU kernels (backend ``"numba"``), part 9: the dense ODE step on k intervals at once.

MGRIT's batched F-sweeps (:mod:`refbraid.mgrit.batched`) apply the dense step of
:class:`refbraid.layers.DenseStep` to the k intervals of a sweep in one call, row j with its
own weights ``W[j]``, bias ``b[j]`` and step size ``h[j]``::

    forward   Z[j] = Y[j] W[j]ᵀ + b[j]             np.matmul (BLAS GEMM per row), bias in place
              Y_next[j] = Y[j] + h[j] σ(Z[j])      one fused pass   (tanh: numpy.tanh first)
    adjoint   S[j] = h[j] (σ'(Z[j]) ⊙ dY_next[j])  one fused pass   (tanh: numpy.tanh first)
              dY[j] = dY_next[j] + S[j] W[j]       np.matmul
              dW[j] = S[j]ᵀ Y[j],  db[j] = Σ_B S[j]  np.matmul, a fused column-sum kernel

Every row does the floating-point operations of the numba backend's per-step path
(:func:`~refbraid.backends.numba_cpu_dense.linear`, :func:`~refbraid.backends.numba_cpu.euler_act`,
:func:`~refbraid.backends.numba_cpu.activation_adjoint` then ``h * s``,
:func:`~refbraid.backends.numba_cpu_dense.linear_adjoint`) in the same order, so the two are
bit-identical (tests/test_numba_batched.py). The GEMMs stay BLAS (``np.matmul`` runs the 2-D
product per row), as in the per-step path; the element-wise work is fused (no h·σ(Z) or σ'
temporaries over the whole stack).

The catalogue kernels ``dense_step_batched`` / ``dense_step_batched_adjoint``
(:data:`refbraid.backends.KERNELS`, reference in :mod:`refbraid.backends.reference_batched`)
run these when :func:`applies`, else the reference code with the numba backend's activation
kernels (:mod:`refbraid.backends.numba_cuda_batched` is the cuda backend's twin).

Shape legend: k rows (intervals), B batch, C width.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import numba_cpu
from .numba_cpu import GELU, IDENTITY, RELU, TANH, _act, _act_adjoint, activation_code
from .reference_batched import _dense_adjoint, _dense_forward

OVERRIDES = ("dense_step_batched", "dense_step_batched_adjoint")

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def applies(act: str, *arrays) -> bool:
    """True when the fused kernels take these arguments: a known activation and native
    float32/float64 NumPy arrays of ONE dtype (else the array-API code runs). Any strides:
    the kernels read (k, n) views, copies where a view cannot be had."""
    if activation_code(act) < 0:
        return False
    dtype = arrays[0].dtype if type(arrays[0]) is np.ndarray else None
    return dtype in _FLOATS and all(type(a) is np.ndarray and a.dtype == dtype for a in arrays)


# ----------------------------------------------------------------------------- fused kernels
@njit(cache=True)
def _euler_rows(Y, Z, T, h, code):
    """T[j, i] ← Y[j, i] + h[j] σ(Z[j, i]) on (k, n) arrays; for tanh, T already holds tanh Z."""
    for j in range(Y.shape[0]):
        hj = h[j]
        if code == TANH:
            for i in range(Y.shape[1]):
                T[j, i] = Y[j, i] + hj * T[j, i]
        elif code == RELU:
            for i in range(Y.shape[1]):
                T[j, i] = Y[j, i] + hj * _act(Z[j, i], RELU)
        elif code == GELU:
            for i in range(Y.shape[1]):
                T[j, i] = Y[j, i] + hj * _act(Z[j, i], GELU)
        else:
            for i in range(Y.shape[1]):
                T[j, i] = Y[j, i] + hj * _act(Z[j, i], IDENTITY)


@njit(cache=True)
def _scaled_adjoint_rows(T, Z, dY, h, code):
    """T[j, i] ← h[j] (σ'(Z[j, i]) dY[j, i]); for tanh T holds tanh Z and σ'·dY is written
    dY − dY t t as in the per-step kernel (numba_cpu._tanh_adjoint_inplace)."""
    for j in range(T.shape[0]):
        hj = h[j]
        if code == TANH:
            for i in range(T.shape[1]):
                d = dY[j, i]
                t = T[j, i]
                T[j, i] = hj * (d - d * t * t)
        elif code == RELU:  # σ'·dY is stored (rounded to T's dtype) before the scaling,
            for i in range(T.shape[1]):  # as the per-step path's separate `h * s` does
                T[j, i] = _act_adjoint(Z[j, i], dY[j, i], RELU)
                T[j, i] = hj * T[j, i]
        elif code == GELU:
            for i in range(T.shape[1]):
                T[j, i] = _act_adjoint(Z[j, i], dY[j, i], GELU)
                T[j, i] = hj * T[j, i]
        else:
            for i in range(T.shape[1]):
                T[j, i] = _act_adjoint(Z[j, i], dY[j, i], IDENTITY)
                T[j, i] = hj * T[j, i]


@njit(cache=True)
def _column_sums(S, out):
    """out[j, c] = Σ_n S[j, n, c], summed in n order (as numba_cpu_dense._column_sum)."""
    for j in range(S.shape[0]):
        for c in range(S.shape[2]):
            out[j, c] = 0.0
        for n in range(S.shape[1]):
            for c in range(S.shape[2]):
                out[j, c] += S[j, n, c]


# ----------------------------------------------------------------------------- the step
def _rows(a: np.ndarray) -> np.ndarray:
    """``a`` (k, ...) as (k, n): a view of a C-contiguous array, else a C-contiguous copy
    (only ever of an input: the outputs written through it are fresh arrays)."""
    return np.ascontiguousarray(a).reshape(a.shape[0], -1)


def dense_forward_batched(Y, W, b, h, act: str):
    """(Y_next, Z) of k dense steps (module docstring). Y (k,B,C), W (k,C,C), b (k,C),
    h (k,) step sizes (cast to Y's dtype, as the per-step path casts a Python float)."""
    h = np.asarray(h, dtype=Y.dtype)
    Z = np.matmul(Y, W.transpose(0, 2, 1))  # k,B,C
    Z += b[:, None, :]
    code = activation_code(act)
    out = np.tanh(Z) if code == TANH else np.empty_like(Z)
    _euler_rows(_rows(Y), _rows(Z), _rows(out), h, code)
    return out, Z


def dense_adjoint_batched(Y, Z, dY_next, W, h, act: str, grads: bool = True):
    """(dY, dW, db) of k dense adjoint steps (module docstring); dW, db None without grads."""
    h = np.asarray(h, dtype=dY_next.dtype)
    code = activation_code(act)
    S = np.tanh(Z) if code == TANH else np.empty_like(Z)
    _scaled_adjoint_rows(_rows(S), _rows(Z), _rows(dY_next), h, code)  # k,B,C
    dY = dY_next + np.matmul(S, W)
    if not grads:
        return dY, None, None
    db = np.empty((S.shape[0], S.shape[2]), S.dtype)
    _column_sums(S, db)
    return dY, np.matmul(S.transpose(0, 2, 1), Y), db


# ----------------------------------------------------------------------------- catalogue entries
def dense_step_batched(Y, W, b, h, act: str):
    """reference_batched.dense_step_batched: the fused kernels where :func:`applies`."""
    if applies(act, Y, W, b):
        return dense_forward_batched(Y, W, b, h, act)
    return _dense_forward(Y, W, b, h, act, numba_cpu.activation)


def dense_step_batched_adjoint(Y, Z, dY_next, W, h, act: str, grads: bool = True):
    """reference_batched.dense_step_batched_adjoint: the fused kernels where :func:`applies`."""
    if applies(act, Y, Z, dY_next, W):
        return dense_adjoint_batched(Y, Z, dY_next, W, h, act, grads)
    return _dense_adjoint(Y, Z, dY_next, W, h, act, grads, numba_cpu.activation_adjoint)
