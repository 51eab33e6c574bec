"""Convolutional layers (NCHW, 3×3, padding 1, as ``torch.nn.Conv2d(C, C, 3, padding=1)``).

ODE step and its discrete adjoint (docs/references.md §1); ``*`` is the 'same' cross-correlation
and ``*ᵀ`` its adjoint, the transposed convolution::

    z      = W * y + b                     # B,C,H,W
    y_next = y + h σ(z)
    s      = h σ'(z) ⊙ dy_next
    dy     = dy_next + W *ᵀ s
    dW     = Σ_{B,H,W} s ⊗ ỹ (shifted),  db = Σ_{B,H,W} s

Opening ("lift") layer: ``out = σ(W * x + b)`` from C_in to C channels.
Shape legend: B batch, C channels, H height, W width.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backends.device_batching import values_on
from ..backends.into import add_into, euler_act_into, plus, rows_options
from ..backends.reference import check_activation
from .init import (
    check_adjoint,
    check_dtype,
    check_positive_int,
    check_step_size,
    uniform_fan_in,
)

KERNEL_SIZE = 3  # 3×3 stencils, padding 1, as in TorchBraid's MNIST example


@dataclass(frozen=True)
class ConvStep:
    """One step ``y_next = y + h σ(Conv2d(C→C, 3×3, pad 1)(y))`` on (C, height, width) images."""

    channels: int
    height: int
    width: int
    activation: str = "relu"

    #: MGRIT's sweeps keep per-step calls: k steps at once (:meth:`forward_batched`) measured
    #: 0.70–1.06× the per-step time on the NumPy reference (4 channels, 28×28, batch 50, k = 2…32:
    #: a retired benchmark, docs/batched.md). A step's arithmetic
    #: (~3–5 ms) dwarfs the Python of a call (~20 µs), and k stacked states (k × 1.25 MB) leave
    #: the cache that one state stays in. The batched methods stay, tested, for a device where
    #: one launch per sweep matters.
    batched_sweeps_pay = False

    #: the cache ``(y, z)`` of :meth:`forward` does not depend on h (``z = W * y + b``): a
    #: coarse adjoint step (step size m·h) from the same y may reuse a fine step's cache
    #: (refbraid.propagators.CapturingAdjoint)
    cache_independent_of_h = True

    def __post_init__(self):
        for name in ("channels", "height", "width"):
            check_positive_int(name, getattr(self, name))
        check_activation(self.activation)

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.channels, self.height, self.width)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        C, k = self.channels, KERNEL_SIZE
        fan_in = C * k * k
        return {
            "W": uniform_fan_in(rng, (C, C, k, k), fan_in, dtype),
            "b": uniform_fan_in(rng, (C,), fan_in, dtype),
        }

    def forward(self, params, y, h: float, bk, out=None, add=None):
        """y_next = y + h σ(W * y + b) (+ add); returns (y_next, cache). ``out``: an array to
        write y_next into where the backend can (backends/into.py; else y_next is new);
        ``add``: a state to add to y_next (MGRIT's right-hand side row: in the same pass on
        numba, else a sum after it — the same numbers)."""
        h = check_step_size("h", h)
        check_dtype("y", y, params)
        if "conv_step" in bk.overrides:  # the step whole (numba: per image; cupy: one
            # fused kernel after the convolution)
            y_next, z = bk.conv_step(y, params["W"], params["b"], h, self.activation, out=out,
                                     add=add)
            return y_next, (y, z)
        z = bk.conv2d(y, params["W"], params["b"])  # B,C,H,W
        return plus(euler_act_into(bk, y, z, h, self.activation, out), add, out), (y, z)

    def adjoint(self, params, cache, dy_next, h: float, bk, grads: bool = True, out=None,
                add=None):
        """dy = dy_next + Wᵀ ⋆ (h σ'(z) ⊙ dy_next) (+ add); with grads, also dW, db. ``out``:
        where dy may be written (NumPy, backends/into.py; else dy is new); ``add`` as in
        :meth:`forward`."""
        y, z = cache
        h = check_step_size("h", h)
        check_adjoint("dy_next", dy_next, y.shape)
        if "conv_step_adjoint" in bk.overrides:  # numba: one pass for s, dy without dx,
            # no weight gradient without grads; cupy: s in one launch
            dy, dW, db = bk.conv_step_adjoint(y, z, dy_next, params["W"], h, self.activation,
                                              grads, out=out, add=add)
            return dy, ({"W": dW, "b": db} if grads else None)
        s = h * bk.activation_adjoint(z, dy_next, self.activation)  # B,C,H,W
        dys, dW, db = bk.conv2d_adjoint(y, params["W"], s)
        return plus(add_into(dy_next, dys, out), add, out), ({"W": dW, "b": db} if grads else None)

    # -- k steps at once (MGRIT's batched sweeps; the catalogue's conv2d_batched kernels) -----
    def forward_batched(self, params, Y, h, bk, out=None, add=None):
        """k steps at once, row j as :meth:`forward` with ``params[·][j]`` and ``h[j]``:
        ``Z = W * Y + b``, ``Y_next = Y + h σ(Z)``. Y (k,B,C,H,W), W (k,C,C,3,3), b (k,C),
        h (k,); returns (Y_next, Z). Bit-identical to k :meth:`forward` calls on the NumPy
        backend (:mod:`refbraid.backends.reference_batched`). Whole
        (``conv_step_batched``: one fused launch set) where the backend overrides it. ``out``,
        ``add`` (MGRIT's F-sweep rows and right-hand side): where the backend's kernel takes
        them, ``Y_next + add`` is written into ``out`` (returned as Y_next); else ignored
        (layers/forward_into.py writes)."""
        if "conv_step_batched" in bk.overrides:
            kw = rows_options(bk.conv_step_batched, out, add)
            return bk.conv_step_batched(Y, params["W"], params["b"], h, self.activation, **kw)
        h = values_on(Y, h, Y.dtype)[:, None, None, None, None]  # copied once per content
        Z = bk.conv2d_batched(Y, params["W"], params["b"])  # k,B,C,H,W
        return Y + h * bk.activation(Z, self.activation), Z

    def adjoint_batched(self, params, Y, Z, dY_next, h, bk, grads: bool = True, out=None,
                        add=None):
        """:meth:`adjoint` of k steps at once: ``S = h σ'(Z) ⊙ dY_next``, ``dY = dY_next +
        W *ᵀ S``; with grads ``dW = S ⋆ Ỹ``, ``db = Σ_{B,H,W} S`` per row (stacked). Whole
        (``conv_step_batched_adjoint``) where the backend overrides it. ``out``, ``add``: as
        :meth:`forward_batched`'s, for dY."""
        if "conv_step_batched_adjoint" in bk.overrides:
            kw = rows_options(bk.conv_step_batched_adjoint, out, add)
            dY, dW, db = bk.conv_step_batched_adjoint(Y, Z, dY_next, params["W"], h,
                                                      self.activation, grads, **kw)
            return dY, ({"W": dW, "b": db} if grads else None)
        h = values_on(dY_next, h, dY_next.dtype)[:, None, None, None, None]
        S = h * bk.activation_adjoint(Z, dY_next, self.activation)  # k,B,C,H,W
        dYs, dW, db = bk.conv2d_adjoint_batched(Y, params["W"], S, grads)
        return dY_next + dYs, ({"W": dW, "b": db} if grads else None)


@dataclass(frozen=True)
class ConvLift:
    """Opening layer ``out = σ(Conv2d(C_in→C, 3×3, pad 1)(x))`` on (C_in, height, width) images."""

    in_channels: int
    channels: int
    height: int
    width: int
    activation: str = "relu"

    def __post_init__(self):
        for name in ("in_channels", "channels", "height", "width"):
            check_positive_int(name, getattr(self, name))
        check_activation(self.activation)

    @property
    def in_shape(self) -> tuple[int, ...]:
        return (self.in_channels, self.height, self.width)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.channels, self.height, self.width)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        k = KERNEL_SIZE
        fan_in = self.in_channels * k * k
        return {
            "W": uniform_fan_in(rng, (self.channels, self.in_channels, k, k), fan_in, dtype),
            "b": uniform_fan_in(rng, (self.channels,), fan_in, dtype),
        }

    def forward(self, params, x, bk):
        check_dtype("x", x, params)
        z = bk.conv2d(x, params["W"], params["b"])
        return bk.activation(z, self.activation), (x, z)

    def adjoint(self, params, cache, dout, bk):
        x, z = cache
        check_adjoint("dout", dout, z.shape)
        dz = bk.activation_adjoint(z, dout, self.activation)
        dx, dW, db = bk.conv2d_adjoint(x, params["W"], dz)
        return dx, {"W": dW, "b": db}
