"""CuPy backend (``"cupy"``): the reference kernels, run on CuPy arrays on the GPU.

The reference kernels in :mod:`refbraid.backends.reference` look up the array module of
their inputs (``array_namespace``), so on ``cupy.ndarray`` inputs the very same code runs on
the GPU: ``x @ W.T`` is cuBLAS, the element-wise lines are CuPy kernels, ``einsum`` is
cuBLAS/cuTENSOR, and exact GELU uses ``cupyx.scipy.special.erf``. This backend *is* the
tested reference code on another array type, except for the element-wise chains of the ODE
step: ``OVERRIDES`` are the fused kernels of :mod:`refbraid.backends.cupy_fused` (the dense
step, one or k at once, in :mod:`refbraid.backends.cupy_dense`: its GEMMs plus one fused
kernel for bias, activation and Euler update; its adjoint the GEMMs, ``h σ'(z) ⊙ dy`` in one
kernel and ``dy_next + s W`` with the bias gradient's column sums in another), and every
2-D convolution one direct kernel, its
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

from .cupy_fused import fusable, one_float_dtype
from .cupy_rows import plus_unless_written, step_sizes, writable_rows

OVERRIDES: tuple[str, ...] = (
    "activation", "euler_act", "activation_adjoint", "conv_step", "conv_step_adjoint",
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
    into = out if writable_rows(y, out, add) else None
    z, y_next = cupy_conv.ode_step(y, W, b, h, act, into=into, g=None if into is None else add)
    return plus_unless_written(y_next, add, into), z


def conv_step_adjoint(y, z, dy_next, W, h: float, act: str, grads: bool = True, out=None,
                      add=None):
    """reference_conv_step.conv_step_adjoint: ``s = h σ'(z) ⊙ dy_next`` and ``dy = dy_next +
    W *ᵀ s`` (``+ add``) in one launch (s made as the transposed convolution stages its
    input; with ``grads`` dW and db in a second, whose threads form s as they read it);
    returns (dy, dW, db), dW and db None unless ``grads``.
    ``out``: as :func:`conv_step`'s, for dy (by the transposed convolution's launch)."""
    from . import cupy_conv, reference, reference_conv_step

    reference.check_activation(act)
    if not _conv_kernels(y, W, z, dy_next):
        return reference_conv_step.conv_step_adjoint(y, z, dy_next, W, h, act, grads, add=add)
    into = out if writable_rows(dy_next, out, add) else None
    dy, dW, db = cupy_conv.conv2d_adjoint(y, W, dy_next, grads, add=dy_next, into=into,
                                          g=None if into is None else add,
                                          scale=(z, h, act))
    dy = plus_unless_written(dy, add, into)
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
    if not writable_rows(Y, out, add):
        out = add = None
    Z, Y_next = cupy_conv.ode_step(Y, W, b, step_sizes(Y, h), act, into=out, g=add)
    return Y_next, Z


def conv_step_batched_adjoint(Y, Z, dY_next, W, h, act: str, grads: bool = True, out=None,
                              add=None):
    """reference_conv_step.conv_step_batched_adjoint: ``S = h σ'(Z) ⊙ dY_next`` (made by the
    direct kernels as they read it: cupy_conv.conv2d_adjoint's ``scale``), the batched
    transposed convolution (and dW, db with ``grads``) and ``dY_next + W *ᵀ S``; with ``out``
    (MGRIT's F-sweep rows) that sum ``+ add`` is written there by the convolution's launch
    where it can (dY is ``out`` then)."""
    from . import cupy_conv, reference_conv_step
    from .reference import check_activation

    check_activation(act)
    if not _conv_kernels(Y, W, Z, dY_next):
        return reference_conv_step.conv_step_batched_adjoint(Y, Z, dY_next, W, h, act, grads)
    if not writable_rows(Y, out, add):
        out = add = None
    return cupy_conv.conv2d_adjoint(Y, W, dY_next, grads, add=dY_next, into=out, g=add,
                                    scale=(Z, step_sizes(dY_next, h), act))


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
