"""PyTorch equivalents of the 3-D conv, batch-norm and transition layers, for
refbraid.verify.torch_reference (which merges :data:`SPATIAL_EQUIVALENTS` into its table).

===========================  =====================================================================
refbraid                     torch
===========================  =====================================================================
Conv3dStep(C, D, H, W, σ)    y + h·σ(Conv3d(C, C, 3, padding=1)(y))
Conv3dLift(Cin, C, …, σ)     σ(Conv3d(Cin, C, 3, padding=1)(x))
BatchNorm(C, S, mode)        BatchNorm2d/3d(C, eps), .train() or .eval()
ConvBNStep(C, S, σ, mode)    y + h·σ(BatchNorm(Conv(C, C, 3, padding=1, bias=False)(y)))
Pool(C, S, "avg"/"max")      AvgPool2d/3d(2), MaxPool2d/3d(2)
StridedConv(Cin, Cout, S, σ) σ(Conv(Cin, Cout, 3, stride=2, padding=1)(x))
ChannelWiden conv1x1         Conv(Cin, Cout, 1)(x)
ChannelWiden zeros           torch.nn.functional.pad(x, (0, 0, …, 0, Cout − Cin))
===========================  =====================================================================

Evaluation mode: refbraid's ``running_mean``/``running_var`` params are copied into the torch
module's buffers of the same names; buffers are data (no ``.grad``), as the layer's
``constant_entries`` are, so they are copied and not compared.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..layers import (
    BatchNorm,
    ChannelWiden,
    Conv3dLift,
    Conv3dStep,
    ConvBNStep,
    Pool,
    StridedConv,
)

SPATIAL_EQUIVALENTS: dict[type, Callable[..., tuple[nn.Module, dict[str, object]]]] = {}


def _register(kind: type):
    def wrap(builder):
        SPATIAL_EQUIVALENTS[kind] = builder
        return builder
    return wrap


def _conv(s: int, *args, **kwargs) -> nn.Module:
    return (nn.Conv2d if s == 2 else nn.Conv3d)(*args, dtype=torch.float64, **kwargs)


def _bn(s: int, channels: int, eps: float, mode: str) -> nn.Module:
    bn = (nn.BatchNorm2d if s == 2 else nn.BatchNorm3d)(channels, eps=eps, dtype=torch.float64)
    return bn.train(mode == "train")


def _bn_params(bn: nn.Module, mode: str) -> dict[str, object]:
    params = {"gamma": bn.weight, "beta": bn.bias}
    if mode == "eval":
        params.update(running_mean=bn.running_mean, running_var=bn.running_var)
    return params


class _Euler(nn.Module):
    """y_next = y + h·σ(inner(y))."""

    def __init__(self, inner: nn.Module, act: nn.Module, h: float):
        super().__init__()
        self.inner, self.act, self.h = inner, act, h

    def forward(self, y):
        return y + self.h * self.act(self.inner(y))


class _ZeroChannels(nn.Module):
    """Append ``extra`` zero channels (axis 1)."""

    def __init__(self, s: int, extra: int):
        super().__init__()
        self.pad = (0, 0) * s + (0, extra)

    def forward(self, x):
        return nn.functional.pad(x, self.pad)


def activation_module(act: str) -> nn.Module:
    """The torch module of a refbraid activation name."""
    modules = {"tanh": nn.Tanh, "relu": nn.ReLU, "identity": nn.Identity,
               "gelu": lambda: nn.GELU(approximate="none")}
    if act not in modules:
        raise ValueError(f"`activation` {act!r} has no torch equivalent ({sorted(modules)}).")
    return modules[act]()


@_register(Conv3dStep)
def _conv3d_step(layer: Conv3dStep, h: float):
    inner = _conv(3, layer.channels, layer.channels, 3, padding=1)
    act = activation_module(layer.activation)
    return _Euler(inner, act, h), {"W": inner.weight, "b": inner.bias}


@_register(Conv3dLift)
def _conv3d_lift(layer: Conv3dLift, h: float):
    inner = _conv(3, layer.in_channels, layer.channels, 3, padding=1)
    module = nn.Sequential(inner, activation_module(layer.activation))
    return module, {"W": inner.weight, "b": inner.bias}


@_register(BatchNorm)
def _batchnorm(layer: BatchNorm, h: float):
    bn = _bn(len(layer.spatial), layer.channels, layer.eps, layer.mode)
    return bn, _bn_params(bn, layer.mode)


@_register(ConvBNStep)
def _conv_bn_step(layer: ConvBNStep, h: float):
    s = len(layer.spatial)
    conv = _conv(s, layer.channels, layer.channels, 3, padding=1, bias=False)
    bn = _bn(s, layer.channels, layer.eps, layer.mode)
    module = _Euler(nn.Sequential(conv, bn), activation_module(layer.activation), h)
    return module, {"W": conv.weight, **_bn_params(bn, layer.mode)}


@_register(Pool)
def _pool(layer: Pool, h: float):
    s = len(layer.spatial)
    kinds = {"avg": (nn.AvgPool2d, nn.AvgPool3d), "max": (nn.MaxPool2d, nn.MaxPool3d)}
    return kinds[layer.kind][s - 2](2), {}


@_register(StridedConv)
def _strided_conv(layer: StridedConv, h: float):
    inner = _conv(len(layer.spatial), layer.in_channels, layer.out_channels, 3, stride=2,
                  padding=1)
    module = nn.Sequential(inner, activation_module(layer.activation))
    return module, {"W": inner.weight, "b": inner.bias}


@_register(ChannelWiden)
def _channel_widen(layer: ChannelWiden, h: float):
    s = len(layer.spatial)
    if layer.mode == "zeros":
        return _ZeroChannels(s, layer.out_channels - layer.in_channels), {}
    inner = _conv(s, layer.in_channels, layer.out_channels, 1)
    return inner, {"W": inner.weight, "b": inner.bias}
