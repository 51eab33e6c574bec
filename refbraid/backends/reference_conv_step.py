"""Whole conv ODE steps, one and k at once: the reference of the catalogue kernels
``conv_step``, ``conv_step_adjoint``, ``conv_step_batched`` and ``conv_step_batched_adjoint``.

:class:`refbraid.layers.ConvStep` composes its step from the per-operation kernels (the
convolution, then the Euler update; σ'·dy, ×h, the transposed convolution, +). A GPU backend
overrides these whole-step kernels to issue fewer launches (cupy:
:mod:`refbraid.backends.cupy_gpu`, the convolution then one fused kernel; cuda:
:mod:`refbraid.backends.numba_cuda_conv_batched`, k steps in one kernel), and the layer calls
them only where a backend does (numba: :mod:`refbraid.backends.numba_cpu_conv_step`, one
pass an image on the CPU). Here they are that composition on the reference kernels::

    z      = W * y + b                   y_next = y + h σ(z)
    s      = h σ'(z) ⊙ dy_next           dy = dy_next + W *ᵀ s,   dW = s ⋆ ỹ,  db = Σ_{B,H,W} s

row j of a stack with ``W[j]``, ``b[j]``, ``h[j]`` (h cast to the dtype, as a Python float
is against an array of it). The one-step kernels take ``out=`` (where the result may be
written) and ``add=`` (a state added to it: MGRIT's right-hand side row) as every override
must; a backend that cannot write into ``out`` returns a new array.

Shape legend: k rows, B batch, C channels, H, W image size.
"""

from __future__ import annotations

from .device_batching import values_on
from .into import plus
from .reference import activation, activation_adjoint, conv2d, conv2d_adjoint, euler_act
from .reference_batched import conv2d_adjoint_batched, conv2d_batched


def conv_step(y, W, b, h: float, act: str, out=None, add=None):
    """One conv ODE step: y (B,C,H,W), W (C,C,s,s), b (C,), h -> (y_next, z); ``+ add`` when
    given (MGRIT's right-hand side row, added to the rounded step); ``out``: where y_next
    may be written (check ``y_next is out``)."""
    z = conv2d(y, W, b)  # B,C,H,W
    return plus(euler_act(y, z, h, act, out=out), add, out), z


def conv_step_adjoint(y, z, dy_next, W, h: float, act: str, grads: bool = True, out=None,
                      add=None):
    """Its adjoint -> (dy, dW (C,C,s,s), db (C,)); dW and db None unless ``grads``; ``+ add``
    in dy when given; ``out`` is accepted for the signature (the reference makes dy new)."""
    s = h * activation_adjoint(z, dy_next, act)  # B,C,H,W
    dys, dW, db = conv2d_adjoint(y, W, s)
    dy = plus(dy_next + dys, add)
    return (dy, dW, db) if grads else (dy, None, None)


def _column(like, h):
    """The k step sizes as a (k, 1, 1, 1, 1) array of ``like``'s dtype where it lives."""
    return values_on(like, h, like.dtype)[:, None, None, None, None]


def conv_step_batched(Y, W, b, h, act: str):
    """k conv ODE steps: Y (k,B,C,H,W), W (k,C,C,s,s), b (k,C), h (k,) -> (Y_next, Z)."""
    Z = conv2d_batched(Y, W, b)  # k,B,C,H,W
    return Y + _column(Y, h) * activation(Z, act), Z


def conv_step_batched_adjoint(Y, Z, dY_next, W, h, act: str, grads: bool = True):
    """The adjoints of k conv ODE steps -> (dY, dW (k,C,C,s,s), db (k,C)); dW and db None
    unless ``grads``."""
    S = _column(dY_next, h) * activation_adjoint(Z, dY_next, act)  # k,B,C,H,W
    dYs, dW, db = conv2d_adjoint_batched(Y, W, S, grads)
    return dY_next + dYs, dW, db
