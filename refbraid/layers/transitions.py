"""Shape-changing transitions between stages of a conv network (plain layers, not residual),
2-D (C, H, W) and 3-D (C, D, H, W), each with its adjoint side by side.

=================  ==========================================  ====================================
layer              forward                                     adjoint
=================  ==========================================  ====================================
Pool("avg")        out[m] = (1/P) Σ_{window m} x               dx[i] = dout[⌊i/2⌋] / P
Pool("max")        out[m] = x[argmax of window m]              dx = dout routed to the arg-max
StridedConv        out = σ(z), z = W *₂ x + b (stride 2)        dz = σ'(z) dout, dx = W *₂ᵀ dz
ChannelWiden(1x1)  out[o] = Σ_c W[o,c] x[c] + b[o]             dx[c] = Σ_o W[o,c] dout[o]
ChannelWiden(zero) out = [x; 0]  (C_in → C_out channels)       dx = dout[:C_in]
=================  ==========================================  ====================================

Pooling windows are 2 wide on every spatial axis, stride 2 (``P = 2^s`` values; an odd trailing
row is dropped, as torch's pooling). The strided conv is 3 wide, stride 2, padding 1
(``torch.nn.Conv2d(C_in, C_out, 3, stride=2, padding=1)``): ⌈n/2⌉ outputs per axis, the kernels
``conv_stride2``/``conv_stride2_adjoint`` (z[m] = b + Σ_t W[t] x̃[2m + t]).

Shape legend: B batch, C channels, S… spatial axes, m an output position, P window size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backends.portable import zeros_on
from ..backends.reference import check_activation
from ..backends.reference_spatial import pooled_shape
from .conv import KERNEL_SIZE
from .init import check_adjoint, check_dtype, check_positive_int, uniform_fan_in
from .spatial import Resizable, check_spatial, conv_same, conv_same_adjoint, strided_shape

POOL_KINDS = ("avg", "max")
WIDEN_MODES = ("conv1x1", "zeros")


def _check_input(layer, x) -> None:
    if tuple(x.shape[1:]) != tuple(layer.in_shape):
        raise ValueError(f"`x` must have shape (batch, {', '.join(map(str, layer.in_shape))}), "
                         f"got {tuple(x.shape)}.")


@dataclass(frozen=True)
class Pool(Resizable):
    """2×2 (2×2×2) average or max pooling, stride 2, on (C, S…) images; no weights."""

    channels: int
    spatial: tuple[int, ...]
    kind: str = "avg"

    def __post_init__(self):
        check_positive_int("channels", self.channels)
        object.__setattr__(self, "spatial", check_spatial("spatial", self.spatial))
        if self.kind not in POOL_KINDS:
            raise ValueError(f"`kind` must be one of {POOL_KINDS}, got {self.kind!r}.")
        if min(self.spatial) < 2:
            raise ValueError(f"`spatial` must be at least 2 on every axis to pool 2×2, got "
                             f"{self.spatial}.")

    @property
    def in_shape(self) -> tuple[int, ...]:
        return (self.channels, *self.spatial)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(pooled_shape((1, *self.in_shape))[1:])

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        return {}

    def forward(self, params, x, bk):
        _check_input(self, x)
        if self.kind == "avg":
            return bk.avgpool(x), (x.shape, None)
        out, index = bk.maxpool(x)
        return out, (x.shape, index)

    def adjoint(self, params, cache, dout, bk):
        in_shape, index = cache
        check_adjoint("dout", dout, pooled_shape(in_shape))
        if self.kind == "avg":
            return bk.avgpool_adjoint(dout, in_shape), {}
        return bk.maxpool_adjoint(dout, index, in_shape), {}


@dataclass(frozen=True)
class StridedConv(Resizable):
    """Down-sampling ``out = σ(Conv(C_in→C_out, 3^s, stride 2, pad 1)(x))`` on (C_in, S…)."""

    in_channels: int
    out_channels: int
    spatial: tuple[int, ...]
    activation: str = "relu"

    def __post_init__(self):
        check_positive_int("in_channels", self.in_channels)
        check_positive_int("out_channels", self.out_channels)
        object.__setattr__(self, "spatial", check_spatial("spatial", self.spatial))
        check_activation(self.activation)

    @property
    def in_shape(self) -> tuple[int, ...]:
        return (self.in_channels, *self.spatial)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.out_channels, *strided_shape(self.spatial))

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        k, s = KERNEL_SIZE, len(self.spatial)
        fan_in = self.in_channels * k**s
        shape = (self.out_channels, self.in_channels, *(k,) * s)
        return {"W": uniform_fan_in(rng, shape, fan_in, dtype),
                "b": uniform_fan_in(rng, (self.out_channels,), fan_in, dtype)}

    def forward(self, params, x, bk):
        _check_input(self, x)
        check_dtype("x", x, params)
        z = bk.conv_stride2(x, params["W"], params["b"])  # B,C_out,⌈S/2⌉…
        return bk.activation(z, self.activation), (x, z)

    def adjoint(self, params, cache, dout, bk):
        x, z = cache
        check_adjoint("dout", dout, z.shape)
        dz = bk.activation_adjoint(z, dout, self.activation)
        dx, dW, db = bk.conv_stride2_adjoint(x, params["W"], dz)
        return dx, {"W": dW, "b": db}


@dataclass(frozen=True)
class ChannelWiden(Resizable):
    """C_in → C_out channels at every position: a 1×1 convolution (``"conv1x1"``, weights W, b)
    or zero channels appended (``"zeros"``, no weights; C_out ≥ C_in)."""

    in_channels: int
    out_channels: int
    spatial: tuple[int, ...]
    mode: str = "conv1x1"

    def __post_init__(self):
        check_positive_int("in_channels", self.in_channels)
        check_positive_int("out_channels", self.out_channels)
        object.__setattr__(self, "spatial", check_spatial("spatial", self.spatial))
        if self.mode not in WIDEN_MODES:
            raise ValueError(f"`mode` must be one of {WIDEN_MODES}, got {self.mode!r}.")
        if self.mode == "zeros" and self.out_channels < self.in_channels:
            raise ValueError(f"`out_channels` must be ≥ in_channels = {self.in_channels} for "
                             f"mode 'zeros', got {self.out_channels}.")

    @property
    def in_shape(self) -> tuple[int, ...]:
        return (self.in_channels, *self.spatial)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.out_channels, *self.spatial)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        if self.mode == "zeros":
            return {}
        shape = (self.out_channels, self.in_channels, *(1,) * len(self.spatial))
        return {"W": uniform_fan_in(rng, shape, self.in_channels, dtype),
                "b": uniform_fan_in(rng, (self.out_channels,), self.in_channels, dtype)}

    def forward(self, params, x, bk):
        _check_input(self, x)
        check_dtype("x", x, params)
        if self.mode == "conv1x1":
            return conv_same(bk, x, params["W"], params["b"]), x
        out = zeros_on(x, (x.shape[0], *self.out_shape))  # B,C_out,S…
        out[:, : self.in_channels, ...] = x
        return out, x

    def adjoint(self, params, cache, dout, bk):
        x = cache
        check_adjoint("dout", dout, (x.shape[0], *self.out_shape))
        if self.mode == "zeros":
            return bk.xp.asarray(dout[:, : self.in_channels, ...], copy=True), {}
        dx, dW, db = conv_same_adjoint(bk, x, params["W"], dout)
        return dx, {"W": dW, "b": db}
