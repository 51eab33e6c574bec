"""3-D convolutional layers (NCDHW, 3×3×3, padding 1, as ``torch.nn.Conv3d(C, C, 3, padding=1)``).

The 2-D step of :mod:`refbraid.layers.conv` on volumes; ``*`` is the 'same' 3-D
cross-correlation (kernel ``conv3d``) and ``*ᵀ`` its adjoint, the transposed convolution::

    z      = W * y + b                     # B,C,D,H,W
    y_next = y + h σ(z)
    s      = h σ'(z) ⊙ dy_next
    dy     = dy_next + W *ᵀ s
    dW     = Σ_{B,D,H,W} s ⊗ ỹ (shifted),  db = Σ_{B,D,H,W} s

Opening ("lift") layer: ``out = σ(W * x + b)`` from C_in to C channels.
Shape legend: B batch, C channels, D depth, H height, W width.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backends.reference import check_activation
from .conv import KERNEL_SIZE
from .init import (
    check_adjoint,
    check_dtype,
    check_positive_int,
    check_step_size,
    uniform_fan_in,
)


def _init_conv3d(rng, out_channels: int, in_channels: int, dtype) -> dict[str, np.ndarray]:
    k = KERNEL_SIZE
    fan_in = in_channels * k**3
    return {"W": uniform_fan_in(rng, (out_channels, in_channels, k, k, k), fan_in, dtype),
            "b": uniform_fan_in(rng, (out_channels,), fan_in, dtype)}


@dataclass(frozen=True)
class Conv3dStep:
    """One step ``y_next = y + h σ(Conv3d(C→C, 3×3×3, pad 1)(y))`` on (C, D, H, W) volumes."""

    channels: int
    depth: int
    height: int
    width: int
    activation: str = "relu"

    def __post_init__(self):
        for name in ("channels", "depth", "height", "width"):
            check_positive_int(name, getattr(self, name))
        check_activation(self.activation)

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.channels, self.depth, self.height, self.width)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        return _init_conv3d(rng, self.channels, self.channels, dtype)

    def forward(self, params, y, h: float, bk):
        h = check_step_size("h", h)
        check_dtype("y", y, params)
        z = bk.conv3d(y, params["W"], params["b"])  # B,C,D,H,W
        return bk.euler_act(y, z, h, self.activation), (y, z)

    def adjoint(self, params, cache, dy_next, h: float, bk, grads: bool = True):
        y, z = cache
        h = check_step_size("h", h)
        check_adjoint("dy_next", dy_next, y.shape)
        s = h * bk.activation_adjoint(z, dy_next, self.activation)  # B,C,D,H,W
        dys, dW, db = bk.conv3d_adjoint(y, params["W"], s)
        return dy_next + dys, ({"W": dW, "b": db} if grads else None)


@dataclass(frozen=True)
class Conv3dLift:
    """Opening layer ``out = σ(Conv3d(C_in→C, 3×3×3, pad 1)(x))`` on (C_in, D, H, W) volumes."""

    in_channels: int
    channels: int
    depth: int
    height: int
    width: int
    activation: str = "relu"

    def __post_init__(self):
        for name in ("in_channels", "channels", "depth", "height", "width"):
            check_positive_int(name, getattr(self, name))
        check_activation(self.activation)

    @property
    def in_shape(self) -> tuple[int, ...]:
        return (self.in_channels, self.depth, self.height, self.width)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.channels, self.depth, self.height, self.width)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        return _init_conv3d(rng, self.channels, self.in_channels, dtype)

    def forward(self, params, x, bk):
        check_dtype("x", x, params)
        z = bk.conv3d(x, params["W"], params["b"])  # B,C,D,H,W
        return bk.activation(z, self.activation), (x, z)

    def adjoint(self, params, cache, dout, bk):
        x, z = cache
        check_adjoint("dout", dout, z.shape)
        dz = bk.activation_adjoint(z, dout, self.activation)
        dx, dW, db = bk.conv3d_adjoint(x, params["W"], dz)
        return dx, {"W": dW, "b": db}
