"""The dense ODE step on the ``cupy`` backend: its GEMMs and fused kernels, one step or k.

``y_next = y + h σ(y Wᵀ + b)`` is one GEMM and one fused launch for bias, activation and
Euler update (cupy_fused.BIAS_ACT_EULER); its adjoint ``dy = dy_next + s W`` with ``s = h
σ'(z) ⊙ dy_next`` is one fused launch for s, the GEMMs, and one launch for ``dy_next + s W``
with the bias gradient's column sums (cupy_fused.ADD_COLUMN_SUMS), or without the weight
gradient a copy of dy_next and cuBLAS's GEMM with β = 1 into it. k steps at once (MGRIT's
batched sweeps) take strided-batched GEMMs (:func:`refbraid.backends.cupy_blas.product`).
Given rows of MGRIT's iterate (``out``, ``add``: :mod:`refbraid.backends.cupy_rows`) the
last launch writes ``result + add`` there. Each function falls back to the reference
(:mod:`refbraid.backends.reference_batched`) where the fused kernels do not apply.
"""

from __future__ import annotations

import numpy as np

from .cupy_blas import product, routes_batched
from .cupy_fused import fusable, one_float_dtype
from .cupy_rows import plus_unless_written, step_sizes, writable_rows
from .device_batching import transposed_once

OVERRIDES: tuple[str, ...] = (
    "dense_step", "dense_step_adjoint", "dense_step_batched", "dense_step_batched_adjoint")


def dense_step(y, W, b, h: float, act: str, out=None, add=None):
    """reference_batched.dense_step: one GEMM ``y Wᵀ``, then bias, activation and Euler
    update in one fused launch (cupy_fused.BIAS_ACT_EULER); the reference's arithmetic.
    Returns (y_next + add, z) (add None: 0); with ``out`` (a row of MGRIT's iterate: the
    coarsest solve's) that launch writes the sum there (BIAS_ACT_EULER_ADD with add) and
    returns ``out``, else y_next is new."""
    from . import reference_batched
    from .cupy_fused import BIAS_ACT_EULER, BIAS_ACT_EULER_ADD
    from .reference import array_namespace, check_activation

    check_activation(act)
    if b is None or not fusable(y, W, b):
        y_next, z = reference_batched.dense_step(y, W, b, h, act)
        return plus_unless_written(y_next, add, None), z
    # xp.matmul, not `@`: a CUDA graph recording replaces it (refbraid.backends.cupy_blas)
    args = (array_namespace(y).matmul(y, W.T), b, y, h)  # B,C each
    into = out if writable_rows(y, out, add) else None
    if into is None:
        z, y_next = BIAS_ACT_EULER(act, *args)
    elif add is None:
        z, y_next = BIAS_ACT_EULER.into(act, (None, into), *args)
    else:
        z, y_next = BIAS_ACT_EULER_ADD.into(act, (None, into), *args, add)
    return plus_unless_written(y_next, add, into), z


def dense_step_adjoint(y, z, dy_next, W, h: float, act: str, grads: bool = True, out=None,
                       add=None):
    """reference_batched.dense_step_adjoint: ``s = h σ'(z) ⊙ dy_next`` in one fused launch,
    then the GEMMs, and ``dy_next + s W`` with the bias gradient in one (:func:`_products`);
    without ``grads`` two launches (cupy_fused.SCALED_ACT_ADJOINT_COPY, GEMM_ACCUMULATE).
    Returns (dy + add, dW, db) (add None: 0). ``out`` (a C-contiguous row of MGRIT's iterate),
    without ``grads``: the copy of dy_next is made there and the GEMM adds ``s W`` into it,
    then ``add`` is added in place — ``out`` returned, no new dy and no copy of it."""
    from . import reference_batched
    from .cupy_fused import SCALED_ACT_ADJOINT
    from .reference import check_activation

    check_activation(act)
    if not one_float_dtype(y, z, dy_next, W):
        dy, dW, db = reference_batched.dense_step_adjoint(y, z, dy_next, W, h, act, grads)
        return plus_unless_written(dy, add, None), dW, db
    if not grads:  # s and a copy of dy_next in one launch, + s W in the GEMM (β = 1): two
        from .cupy_fused import GEMM_ACCUMULATE, SCALED_ACT_ADJOINT_COPY

        into = (out if writable_rows(dy_next, out, add) and out.flags.c_contiguous
                else None)
        s, dy = SCALED_ACT_ADJOINT_COPY.into(act, (None, into), z, dy_next, h)
        GEMM_ACCUMULATE(s, W, dy)
        if into is not None and add is not None:  # the row's dy_next + s W, then + add there
            np.add(dy, add, out=dy)
            return dy, None, None
        return plus_unless_written(dy, add, None), None, None
    dy, dW, db = _products(SCALED_ACT_ADJOINT(act, z, dy_next, h), y, dy_next, W, grads)
    return plus_unless_written(dy, add, None), dW, db


def _products(S, Y, dY_next, W, grads: bool, out=None, add=None):
    """dY = dY_next + S W; with grads also dW = Sᵀ Y and db = Σ_B S, the sum and the column
    sums in one launch (cupy_fused.ADD_COLUMN_SUMS). S (B, C) or (k, B, C). With grads and
    ``out`` (MGRIT's F-sweep rows) that launch writes ``dY + add`` (add None: 0) there and
    dY is ``out``."""
    from .cupy_fused import ADD_COLUMN_SUMS
    from .reference import array_namespace

    xp = array_namespace(S)
    P = product(S, W)
    if not grads:
        P += dY_next  # dY_next + S W (addition commutes exactly: the same bits)
        return P, None, None
    dY, db = (ADD_COLUMN_SUMS(P, dY_next, S) if out is None
              else ADD_COLUMN_SUMS.into_rows(P, dY_next, S, out, add))
    St = xp.permute_dims(S, (*range(S.ndim - 2), S.ndim - 1, S.ndim - 2))  # Sᵀ per row
    return dY, product(St, Y), db


def dense_step_batched(Y, W, b, h, act: str, out=None, add=None):
    """reference_batched.dense_step_batched: one batched GEMM, then bias, activation and
    Euler update of every row in one fused launch (cupy_fused.BIAS_ACT_EULER); with ``out``
    (MGRIT's F-sweep rows) that launch writes ``Y_next + add`` (add None: 0) there
    (BIAS_ACT_EULER_ADD with add) and returns ``out`` as Y_next."""
    from . import reference_batched
    from .cupy_fused import BIAS_ACT_EULER, BIAS_ACT_EULER_ADD
    from .reference import array_namespace, check_activation

    check_activation(act)
    if not fusable(Y, W, b):
        return reference_batched.dense_step_batched(Y, W, b, h, act)
    # Wᵀ read transposed in place by the strided-batched GEMM (cupy_blas.product); for CuPy's
    # matmul, which would copy it in every call, copied once per gradient instead
    Wt = array_namespace(W).permute_dims(W, (0, 2, 1))
    P = product(Y, Wt if routes_batched(Y, Wt) else transposed_once(W))  # k,B,C
    args = (P, b[:, None, :], Y, step_sizes(Y, h))
    if not writable_rows(Y, out, add):
        Z, Y_next = BIAS_ACT_EULER(act, *args)
    elif add is None:
        Z, Y_next = BIAS_ACT_EULER.into(act, (None, out), *args)
    else:
        Z, Y_next = BIAS_ACT_EULER_ADD.into(act, (None, out), *args, add)
    return Y_next, Z


def dense_step_batched_adjoint(Y, Z, dY_next, W, h, act: str, grads: bool = True, out=None,
                               add=None):
    """reference_batched.dense_step_batched_adjoint with ``S = h σ'(Z) ⊙ dY_next`` in one fused
    launch (cupy_fused.SCALED_ACT_ADJOINT), then :func:`_products`. With ``out`` (MGRIT's
    F-sweep rows): ``dY + add`` (add None: 0) written there by one launch after the GEMM
    (without ``grads``: ``numpy.add`` into the rows, or cupy_fused.SUM_PLUS with add; with
    them: the column-sum kernel, which also sums db), dY is ``out``."""
    from . import reference_batched
    from .cupy_fused import SCALED_ACT_ADJOINT, SUM_PLUS
    from .reference import check_activation

    check_activation(act)
    if not one_float_dtype(Y, Z, dY_next, W):
        return reference_batched.dense_step_batched_adjoint(Y, Z, dY_next, W, h, act, grads)
    S = SCALED_ACT_ADJOINT(act, Z, dY_next, step_sizes(dY_next, h))  # k,B,C
    if not writable_rows(Y, out, add):
        return _products(S, Y, dY_next, W, grads)
    if grads:  # dY_next + S W (+ add) into the rows and db, in the column-sum kernel's launch
        return _products(S, Y, dY_next, W, grads, out, add)
    P = product(S, W)
    if add is None:  # dY_next + S W (addition commutes exactly: the same bits) into the rows
        np.add(P, dY_next, out=out)
        return out, None, None
    return SUM_PLUS.into("identity", (out,), P, dY_next, add), None, None
