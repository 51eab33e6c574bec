"""Convolutions on CuPy, for the ``cupy`` backend: direct kernels (the default), or a column
matrix and a GEMM.

The reference convolution (:func:`refbraid.backends.reference.conv2d`) sums the s² stencil
offsets one by one, a tensordot and an accumulation each: about 3·s² launches forward and
5·s² for the adjoint on a GPU (28 and 45 for a 3×3 kernel). Here, with x̃ = x zero-padded by
r = s // 2 on both spatial axes::

    z[n,o,i,j]  = Σ_{c,p,q} W[o,c,p,q] · x̃[n,c,i+p,j+q]
    dx[n,c,i,j] = Σ_{o,p,q} W̃[c,o,p,q] · dz̃[n,o,i+p,j+q],   W̃[c,o,p,q] = W[o,c,s−1−p,s−1−q]
    dW[o,c,p,q] = Σ_{n,i,j} dz[n,o,i,j] · x̃[n,c,i+p,j+q],    db[o] = Σ_{n,i,j} dz[n,o,i,j]

each over a leading row axis too (k rows, row j with its own ``W[j]``: MGRIT's batched
sweeps), in one of two forms:

* **direct** (:mod:`refbraid.backends.cupy_conv_direct`): z, or dx reading W̃ from W in place,
  in one launch of ``conv_direct``; dW and db in one launch of ``conv_weight_grad``. No column
  matrix: each reads its inputs and writes its outputs once. The conv ODE step's element-wise
  work is the convolution's epilogue (:func:`ode_step`: ``z = W * y + b``, ``y_next = y +
  h σ(z)``; its adjoint ``dy = dy_next + W *ᵀ s``: the ``add`` of :func:`conv2d_adjoint`).
* **column matrix** (:mod:`refbraid.backends.cupy_conv_columns`; ``REFBRAID_CUPY_CONV=im2col``,
  and where a direct kernel does not apply): ``cols[(c,p,q), (n,i,j)] = x̃[n,c,i+p,j+q]`` by
  one gather kernel, then one GEMM, ``z₂ = W₂ · cols`` (W₂ = W as (O, C·s²)), and for the
  weight gradient ``dW₂ = dz₂ · colsᵀ`` (dz₂ = dz as (O, B·H·W)) — the column matrix is s²
  copies of the input, written and read once each.

Launches (3×3 kernel, one step or k rows alike), direct: a convolution 1 (with the ODE
step's bias, activation and Euler update); its adjoint 1 for dx (with dy_next added), 1 more
for dW and db. Column matrix: a convolution 2 (the columns, the GEMM; the ODE step 1 more);
its adjoint 3 for dx (the flipped kernel's copy, a convolution; dy_next 1 more), 4 more with
dW and db (dz₂'s copy, the columns of x again, the GEMM, the sum). ``python -m benchmarks
quick counts`` counts both forms' launches and bytes in whole gradients.

Round-off: both sum a point's products in their own order, not offset by offset as the
reference, so the results agree with the reference to round-off, not bit for bit
(tests/test_cupy_fused_conv.py and tests/cuda_c state the tolerances).

Shape legend: k rows (optional), B batch, C input channels, O output channels, H × W the
image, s the (odd) kernel size.
"""

from __future__ import annotations

import os

from . import cupy_conv_direct as direct
from .cupy_blas import product
from .cupy_conv_columns import columns
from .cupy_conv_direct_host import transposed_kernel
from .portable import contiguous, namespace

#: ``REFBRAID_CUPY_CONV=im2col``: every convolution of the cupy backend through the column
#: matrix and a GEMM, none by the direct kernels (the A/B of the two forms on a GPU)
CONV_ENV = "REFBRAID_CUPY_CONV"


def direct_tiling(x, W) -> tuple[int, int, int] | None:
    """The direct kernel's tiling of ``W * x`` (:func:`cupy_conv_direct.plan`), or None
    where the column matrix takes it (``REFBRAID_CUPY_CONV=im2col``, or the kernel does not
    apply)."""
    if os.environ.get(CONV_ENV, "direct") == "im2col":
        return None
    return direct.plan(x, W)


def conv2d(x, W):
    """``z = W * x`` without bias ('same' cross-correlation, stride 1, as reference.conv2d):
    x (..., B, C, H, W), W (..., O, C, s, s) -> z (..., B, O, H, W): the direct kernel's
    C-ordered result (1 launch), or where it does not apply (:func:`direct_tiling`) a permuted
    view of the column-matrix GEMM's (..., O, B, H, W) result (2 launches and W's copy when
    it is not C-ordered)."""
    tiling = direct_tiling(x, W)
    if tiling is not None:
        return direct.convolution(x, W, tiling)
    xp = namespace(x)
    *lead, B, C, H, Wd = x.shape
    O, s = W.shape[-4], W.shape[-1]
    W2 = xp.reshape(contiguous(W), (*lead, O, C * s * s))
    Z = xp.reshape(product(W2, columns(x, s)), (*lead, O, B, H, Wd))
    n = len(lead)
    return xp.permute_dims(Z, (*range(n), n + 1, n, n + 2, n + 3))


def ode_step(y, W, b, h, act: str, into=None, g=None):
    """The conv ODE step's forward, ``z = W * y + b`` and ``y_next = y + h σ(z)``: ``(z,
    y_next)``; b (..., O), h a float or one per lead row, (k, 1, 1, 1, 1). Direct: one launch
    (the convolution with cupy_fused.BIAS_ACT_EULER's arithmetic as its epilogue); column
    matrix: :func:`conv2d`, then BIAS_ACT_EULER. With ``into`` (rows of MGRIT's iterate)
    ``y_next + g`` (g None: 0) is written there by that same launch and ``into`` returned as
    y_next — unless a GPU kernel cannot write those rows in place (not evenly spaced
    C-ordered images): then y_next is new, without g (the caller writes it: ``y_next is
    into`` tells)."""
    from .cupy_fused import BIAS_ACT_EULER, BIAS_ACT_EULER_ADD

    bias = b[..., None, :, None, None]
    tiling = direct_tiling(y, W)
    if tiling is not None:
        return direct.convolution(y, W, tiling, step=(b, y, h, act), into=into, g=g)
    if into is None:
        return BIAS_ACT_EULER(act, conv2d(y, W), bias, y, h)
    if g is None:
        return BIAS_ACT_EULER.into(act, (None, into), conv2d(y, W), bias, y, h)
    return BIAS_ACT_EULER_ADD.into(act, (None, into), conv2d(y, W), bias, y, h, g)


def conv2d_adjoint(x, W, dz, grads: bool = True, add=None, into=None, g=None, scale=None):
    """The adjoint of :func:`conv2d` (plus a bias): ``(dx, dW, db)``, with ``add`` (dx's
    shape) ``dx = add + W *ᵀ dz`` (direct: in the convolution's launch); dW and db are None
    unless ``grads``. dx (..., B, C, H, W): the direct kernel's C-ordered result, or (column
    matrix) a permuted view when ``add`` is None. With ``add`` and ``into`` (rows of MGRIT's
    iterate) the direct kernel writes ``dx + g`` (g None: 0) there and returns ``into`` as
    dx, as :func:`ode_step` does (the column-matrix form, or rows a kernel cannot write in
    place: dx new, without g). ``scale = (z, h, act)``: ``dz`` stands for ``h σ'(z) ⊙ dz``
    (the conv ODE step's adjoint), made by the direct kernels as they read it (the
    transposed convolution as it stages its input, the weight gradient's threads as they
    sum: no array of it, no launch of its own), else by cupy_fused.SCALED_ACT_ADJOINT
    first."""
    xp = namespace(x)
    *lead, B, O, H, Wd = dz.shape
    s = W.shape[-1]
    n = len(lead)
    swap = (*range(n), n + 1, n, n + 2, n + 3)  # (..., a, b, s, s) -> (..., b, a, s, s)
    tiling = direct_tiling(dz, W)
    if add is None:  # the rows take dx + add (+ g): without add nothing is written there
        into = g = None
    weights_direct = tiling is not None and s <= direct.MAX_WEIGHT_SIDE
    if scale is not None and (tiling is None or (grads and not weights_direct)):
        from .cupy_fused import SCALED_ACT_ADJOINT

        z, h, act = scale
        dz, scale = SCALED_ACT_ADJOINT(act, z, dz, h), None
    if tiling is not None:
        dx = direct.convolution(dz, W, tiling, flip=True, add=add, into=into, g=g, scale=scale)
    else:
        dx = conv2d(dz, transposed_kernel(xp, W))
        dx = dx if add is None else add + dx
    if not grads:
        return dx, None, None
    if weights_direct:
        return (dx, *direct.weight_gradient(x, dz, s, scale))
    dz2 = xp.reshape(contiguous(xp.permute_dims(dz, swap)), (*lead, O, B * H * Wd))
    cols = columns(x, s)  # (..., C·s², B·H·W)
    dW = xp.reshape(product(dz2, xp.permute_dims(cols, (*range(n), n + 1, n))), W.shape)
    return dx, dW, xp.sum(dz2, axis=-1)
