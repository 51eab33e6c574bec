"""CuPy backend (``"cupy"``): the reference kernels, run on CuPy arrays on the GPU.

The reference kernels in :mod:`refbraid.backends.reference` look up the array module of
their inputs (``array_namespace``), so on ``cupy.ndarray`` inputs the very same code runs on
the GPU: ``x @ W.T`` is cuBLAS, the element-wise lines are CuPy kernels, ``einsum`` is
cuBLAS/cuTENSOR, and exact GELU uses ``cupyx.scipy.special.erf``. This backend *is* the
tested reference code on another array type, except for the element-wise chains of the ODE
step: ``OVERRIDES`` are the fused kernels of :mod:`refbraid.backends.cupy_fused` (a dense
step, one or k at once, is its GEMMs plus one fused kernel for bias, activation and Euler
update; its adjoint the GEMMs, ``h σ'(z) ⊙ dy`` in one kernel and ``dy_next + s W`` with the
bias gradient's column sums in another), and every 2-D convolution one direct kernel, its
adjoint two (dx; dW and db), or with ``REFBRAID_CUPY_CONV=im2col`` a column-matrix kernel and
a GEMM (:mod:`refbraid.backends.cupy_conv`: equal to the reference to round-off) where the
reference sums the stencil offsets one launch set each; layer norm is one kernel
forward and three launches for its adjoint (:mod:`refbraid.backends.cupy_layernorm`, equal to
the reference to round-off: sums in double) where the reference makes ten and thirteen, and
a GRU cell's gate algebra one launch each way (:mod:`refbraid.backends.cupy_gru`) where it
makes about twenty. These
fall back to the
reference code for complex inputs (the verification's complex step) or inside
``cupy_fused.fused(False)``.

The reference kernels use the array API standard's functions (``permute_dims``, ``concat``,
``astype``, ``take``), which CuPy's main namespace has since it mirrors the NumPy 2 API;
:func:`is_usable` says no to a CuPy without them.

``xp`` is the ``cupy`` module, imported on first use so that importing this module (for
:func:`is_usable`) never fails on a machine without CuPy or without a GPU; asking for
``xp`` there raises an ImportError that says so.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import numpy as np

from .cupy_blas import product, routes_batched
from .cupy_fused import fusable, one_float_dtype
from .device_batching import transposed_once

OVERRIDES: tuple[str, ...] = (
    "activation", "euler_act", "activation_adjoint", "dense_step", "dense_step_adjoint",
    "dense_step_batched", "dense_step_batched_adjoint", "conv_step", "conv_step_adjoint",
    "conv_step_batched", "conv_step_batched_adjoint", "conv2d", "conv2d_adjoint",
    "conv2d_batched", "conv2d_adjoint_batched")


# ----------------------------------------------------------------------------- fused kernels
def activation(z, act: str):
    """reference.activation ``σ(z)``: one fused launch (cupy_fused.ACTIVATION)."""
    from . import reference
    from .cupy_fused import ACTIVATION

    reference.check_activation(act)
    if not fusable(z):
        return reference.activation(z, act)
    return ACTIVATION(act, z)


def euler_act(y, z, h: float, act: str, out=None):
    """reference.euler_act ``y + h σ(z)``: one fused launch (cupy_fused.EULER_ACT)."""
    from . import reference
    from .cupy_fused import EULER_ACT

    reference.check_activation(act)
    if out is not None or not fusable(y, z):
        return reference.euler_act(y, z, h, act, out)
    return EULER_ACT(act, y, z, h)


def activation_adjoint(z, dy, act: str):
    """reference.activation_adjoint ``σ'(z) ⊙ dy``: one fused launch."""
    from . import reference
    from .cupy_fused import ACT_ADJOINT_KERNEL

    reference.check_activation(act)
    if not fusable(z, dy):
        return reference.activation_adjoint(z, dy, act)
    return ACT_ADJOINT_KERNEL(act, z, dy)


def _writable_rows(Y, out, add) -> bool:
    """Whether MGRIT's F-sweep rows ``out`` (and its right-hand side ``add``) are given and
    of Y's float dtype: the fused kernels then write ``result + add`` there."""
    return out is not None and one_float_dtype(Y, out, *(() if add is None else (add,)))


def _step_sizes(like, h):
    """The k step sizes as a Python float when all equal (a kernel argument: no copy), else
    an array (k, 1, …, 1) of ``like``'s rank on its device (one host→device copy per distinct
    set of step sizes, :func:`refbraid.backends.device_batching.values_on`)."""
    from .device_batching import values_on

    h = [float(v) for v in h]
    if all(v == h[0] for v in h):
        return h[0]
    return values_on(like, h, like.dtype)[(slice(None),) + (None,) * (like.ndim - 1)]


def _conv_kernels(x, W, *others) -> bool:
    """The convolution of ``x`` with ``W`` takes cupy_conv's kernels: real floats of one
    dtype, fused kernels on, and either the direct kernels (no column matrix) or column
    matrices (of x, and of the image-shaped ``others``: an adjoint's dz) within
    cupy_conv_columns.COLUMN_BYTES."""
    from .cupy_conv import direct_tiling
    from .cupy_conv_columns import fits
    from .cupy_conv_direct import MAX_WEIGHT_SIDE

    if not one_float_dtype(x, W, *others):
        return False
    if direct_tiling(x, W) is not None and W.shape[-1] <= MAX_WEIGHT_SIDE:
        return True
    return all(fits(a, W.shape[-1]) for a in (x, *others) if a.ndim >= 4)


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
        return _plus_unless_written(y_next, add, None), z
    # xp.matmul, not `@`: a CUDA graph recording replaces it (refbraid.backends.cupy_blas)
    args = (array_namespace(y).matmul(y, W.T), b, y, h)  # B,C each
    into = out if _writable_rows(y, out, add) else None
    if into is None:
        z, y_next = BIAS_ACT_EULER(act, *args)
    elif add is None:
        z, y_next = BIAS_ACT_EULER.into(act, (None, into), *args)
    else:
        z, y_next = BIAS_ACT_EULER_ADD.into(act, (None, into), *args, add)
    return _plus_unless_written(y_next, add, into), z


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
        return _plus_unless_written(dy, add, None), dW, db
    if not grads:  # s and a copy of dy_next in one launch, + s W in the GEMM (β = 1): two
        from .cupy_fused import GEMM_ACCUMULATE, SCALED_ACT_ADJOINT_COPY

        into = (out if _writable_rows(dy_next, out, add) and out.flags.c_contiguous
                else None)
        s, dy = SCALED_ACT_ADJOINT_COPY.into(act, (None, into), z, dy_next, h)
        GEMM_ACCUMULATE(s, W, dy)
        if into is not None and add is not None:  # the row's dy_next + s W, then + add there
            np.add(dy, add, out=dy)
            return dy, None, None
        return _plus_unless_written(dy, add, None), None, None
    dy, dW, db = _products(SCALED_ACT_ADJOINT(act, z, dy_next, h), y, dy_next, W, grads)
    return _plus_unless_written(dy, add, None), dW, db


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
    args = (P, b[:, None, :], Y, _step_sizes(Y, h))
    if not _writable_rows(Y, out, add):
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
    S = SCALED_ACT_ADJOINT(act, Z, dY_next, _step_sizes(dY_next, h))  # k,B,C
    if not _writable_rows(Y, out, add):
        return _products(S, Y, dY_next, W, grads)
    if grads:  # dY_next + S W (+ add) into the rows and db, in the column-sum kernel's launch
        return _products(S, Y, dY_next, W, grads, out, add)
    P = product(S, W)
    if add is None:  # dY_next + S W (addition commutes exactly: the same bits) into the rows
        np.add(P, dY_next, out=out)
        return out, None, None
    return SUM_PLUS.into("identity", (out,), P, dY_next, add), None, None


# ----------------------------------------------------------------------------- convolutions
# The catalogue's 2-D convolutions (reference.conv2d, conv2d_adjoint and their k-row forms in
# reference_batched) by cupy_conv's kernels: direct, 1 launch forward (+1 for the bias), 2 for
# the adjoint (column matrix: 2 and 7), instead of ≈ 3 and 5 per stencil offset.
def _kernel_conv(x, W, b, reference_conv):
    """``W * x + b`` by cupy_conv.conv2d (one step, or k rows with their own W and b: the bias
    (..., O) broadcast over (B, H, W)), or by ``reference_conv`` where _conv_kernels says no."""
    from . import cupy_conv
    from .portable import contiguous

    if not _conv_kernels(x, W, *(() if b is None else (b,))):
        return reference_conv(x, W, b)
    z = cupy_conv.conv2d(x, W)
    return contiguous(z) if b is None else z + b[..., None, :, None, None]


def _kernel_conv_adjoint(x, W, dz, grads: bool, reference_adjoint):
    """(dx, dW, db) of :func:`_kernel_conv` (cupy_conv.conv2d_adjoint), dx C-ordered, or
    ``reference_adjoint()`` where _conv_kernels says no."""
    from . import cupy_conv
    from .portable import contiguous

    if not _conv_kernels(x, W, dz):
        return reference_adjoint()
    dx, dW, db = cupy_conv.conv2d_adjoint(x, W, dz, grads)
    return contiguous(dx), dW, db


def conv2d(x, W, b):
    """reference.conv2d ``z = W * x + b`` by cupy_conv.conv2d."""
    from . import reference

    return _kernel_conv(x, W, b, reference.conv2d)


def conv2d_adjoint(x, W, dz):
    """reference.conv2d_adjoint: (dx, dW, db) by cupy_conv.conv2d_adjoint."""
    from . import reference

    return _kernel_conv_adjoint(x, W, dz, True, lambda: reference.conv2d_adjoint(x, W, dz))


def conv2d_batched(X, W, b):
    """reference_batched.conv2d_batched, row j ``W[j] * X[j] + b[j]``, all rows at once."""
    from . import reference_batched

    return _kernel_conv(X, W, b, reference_batched.conv2d_batched)


def conv2d_adjoint_batched(X, W, dZ, grads: bool = True):
    """reference_batched.conv2d_adjoint_batched, all rows at once."""
    from . import reference_batched

    return _kernel_conv_adjoint(X, W, dZ, grads, lambda: reference_batched.conv2d_adjoint_batched(
        X, W, dZ, grads))


# ----------------------------------------------------------------------------- conv ODE steps
# ConvStep's forward and adjoint, one step and k at once (reference_conv_step), by cupy_conv:
# forward one direct kernel whose epilogue is the bias, activation and Euler update
# (cupy_fused.BIAS_ACT_EULER's arithmetic; column matrix: its GEMM, then that kernel, the
# bias (C,) broadcast over B×C×H×W), adjoint h σ'(z) ⊙ dy in one launch and the transposed
# convolution with dy_next added in its epilogue (+ one for dW and db). The element-wise
# arithmetic is the reference's in its order (the bias added after the convolution's sum,
# as reference.conv2d adds it); the convolutions agree with the reference's to round-off.
def conv_step(y, W, b, h: float, act: str, out=None, add=None):
    """reference_conv_step.conv_step: ``z = W * y + b``, ``y_next = y + h σ(z)`` (``+ add``);
    returns (y_next, z). With ``out`` (a row of MGRIT's iterate: the coarsest solve's)
    ``y_next + add`` is written there by the convolution's own launch where it can
    (cupy_conv.ode_step; y_next is ``out`` then), else y_next is new."""
    from . import cupy_conv, reference, reference_conv_step

    reference.check_activation(act)
    if b is None or not _conv_kernels(y, W, b):
        return reference_conv_step.conv_step(y, W, b, h, act, add=add)
    into = out if _writable_rows(y, out, add) else None
    z, y_next = cupy_conv.ode_step(y, W, b, h, act, into=into, g=None if into is None else add)
    return _plus_unless_written(y_next, add, into), z


def _plus_unless_written(result, add, into):
    """``result + add``, or ``result`` itself where a kernel wrote ``result + add`` into the
    rows ``into`` (``result is into``)."""
    from .into import plus

    return result if into is not None and result is into else plus(result, add)


def conv_step_adjoint(y, z, dy_next, W, h: float, act: str, grads: bool = True, out=None,
                      add=None):
    """reference_conv_step.conv_step_adjoint: ``s = h σ'(z) ⊙ dy_next`` in one launch, ``dy =
    dy_next + W *ᵀ s`` (``+ add``); returns (dy, dW, db), dW and db None unless ``grads``.
    ``out``: as :func:`conv_step`'s, for dy (by the transposed convolution's launch)."""
    from . import cupy_conv, reference, reference_conv_step
    from .cupy_fused import SCALED_ACT_ADJOINT

    reference.check_activation(act)
    if not _conv_kernels(y, W, z, dy_next):
        return reference_conv_step.conv_step_adjoint(y, z, dy_next, W, h, act, grads, add=add)
    into = out if _writable_rows(dy_next, out, add) else None
    dy, dW, db = cupy_conv.conv2d_adjoint(y, W, SCALED_ACT_ADJOINT(act, z, dy_next, h), grads,
                                          add=dy_next, into=into,
                                          g=None if into is None else add)
    dy = _plus_unless_written(dy, add, into)
    return (dy, dW, db) if grads else (dy, None, None)


def conv_step_batched(Y, W, b, h, act: str, out=None, add=None):
    """reference_conv_step.conv_step_batched: the batched convolution with the bias,
    activation and Euler update of all k rows (cupy_conv.ode_step: one launch, direct);
    returns (Y_next, Z). With ``out`` (MGRIT's F-sweep rows) ``Y_next + add`` is written there
    by that launch where it can (Y_next is ``out`` then)."""
    from . import cupy_conv, reference_conv_step
    from .reference import check_activation

    check_activation(act)
    if not _conv_kernels(Y, W, b):
        return reference_conv_step.conv_step_batched(Y, W, b, h, act)
    if not _writable_rows(Y, out, add):
        out = add = None
    Z, Y_next = cupy_conv.ode_step(Y, W, b, _step_sizes(Y, h), act, into=out, g=add)
    return Y_next, Z


def conv_step_batched_adjoint(Y, Z, dY_next, W, h, act: str, grads: bool = True, out=None,
                              add=None):
    """reference_conv_step.conv_step_batched_adjoint: ``S = h σ'(Z) ⊙ dY_next`` in one fused
    launch, then the batched transposed convolution (and dW, db with ``grads``) and
    ``dY_next + W *ᵀ S``; with ``out`` (MGRIT's F-sweep rows) that sum ``+ add`` is written
    there by the convolution's launch where it can (dY is ``out`` then)."""
    from . import cupy_conv, reference_conv_step
    from .cupy_fused import SCALED_ACT_ADJOINT
    from .reference import check_activation

    check_activation(act)
    if not _conv_kernels(Y, W, Z, dY_next):
        return reference_conv_step.conv_step_batched_adjoint(Y, Z, dY_next, W, h, act, grads)
    S = SCALED_ACT_ADJOINT(act, Z, dY_next, _step_sizes(dY_next, h))  # k,B,C,H,W
    if not _writable_rows(Y, out, add):
        out = add = None
    return cupy_conv.conv2d_adjoint(Y, W, S, grads, add=dY_next, into=out, g=add)


def _import_cupy() -> ModuleType:
    try:
        return importlib.import_module("cupy")
    except Exception as err:
        raise ImportError(
            f"the `cupy` backend needs CuPy and a CUDA GPU: `import cupy` failed ({err})."
        ) from err


def __getattr__(name: str):
    """Lazy module attribute ``xp`` = the cupy module (PEP 562)."""
    if name == "xp":
        return _import_cupy()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_usable() -> bool:
    """True when CuPy imports, sees a GPU, and a tiny array op (with erf, for GELU) works."""
    try:
        cupy = _import_cupy()
        if not cupy.cuda.is_available():
            return False
        if not all(hasattr(cupy, f) for f in ("permute_dims", "concat", "astype")):
            return False  # an older CuPy: no array API functions in the main namespace
        import cupyx.scipy.special

        a = cupy.arange(4, dtype=cupy.float64)
        return float(cupyx.scipy.special.erf(a @ a)) > 0.0
    except Exception:  # no CuPy, no driver, no device, a broken toolkit: all mean "no"
        return False
