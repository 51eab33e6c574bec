"""PyTorch equivalents of the spatial transfers (see
:mod:`refbraid.verify.torch_reference` for how they are compared)::

    R average         avg_pool2d / avg_pool3d (kernel 2)
    R full_weighting  (Pᵀ w) / 2^d with Pᵀ the autograd transpose of interpolate(bilinear /
                      trilinear, align_corners=False)
    P constant        interpolate(scale_factor=2, mode='nearest')
    P linear          interpolate(scale_factor=2, mode='bilinear' | 'trilinear',
                      align_corners=False)  (cell-centred, clamped at the boundary)
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..stages.transfer_layers import SpatialInterpolation, SpatialRestriction

_LINEAR = {1: "linear", 2: "bilinear", 3: "trilinear"}
_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


class _Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _interp(dims, kind):
    mode = "nearest" if kind == "constant" else _LINEAR[dims]
    extra = {} if kind == "constant" else {"align_corners": False}
    return lambda v: F.interpolate(v, scale_factor=2, mode=mode, **extra)


def _full_weighting(dims):
    up = _interp(dims, "linear")

    def fw(x):
        shape = (*x.shape[:2], *(n // 2 for n in x.shape[2:]))
        zero = torch.zeros(shape, dtype=x.dtype, requires_grad=True)
        (pt_x,) = torch.autograd.grad(up(zero), zero, grad_outputs=x, create_graph=True)
        return pt_x / 2**dims
    return fw


def _restriction(layer: SpatialRestriction, h: float):
    if layer.kind == "average":
        return _Fn(lambda x: _POOL[layer.dims](x, 2)), {}
    return _Fn(_full_weighting(layer.dims)), {}


def _interpolation(layer: SpatialInterpolation, h: float):
    return _Fn(_interp(layer.dims, layer.kind)), {}


TRANSFER_EQUIVALENTS = {SpatialRestriction: _restriction, SpatialInterpolation: _interpolation}
