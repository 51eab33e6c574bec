"""The batch-normalised conv ODE step, 2-D or 3-D: ``y_next = y + h σ(BN(W * y))``.

``*`` is the 'same' 3×3 (3×3×3) convolution without bias (a bias before BN is cancelled by
its mean), BN the batch norm of :mod:`refbraid.layers.batchnorm` (training: batch statistics;
evaluation: running statistics from params). Forward and adjoint::

    z      = W * y                          # B,C,S…
    u      = BN(z) = γ ẑ + β,  ẑ = (z − μ) r
    y_next = y + h σ(u)
    s      = h σ'(u) ⊙ dy_next
    dz, dγ, dβ = BNᵀ(s)                     (batchnorm_adjoint; training couples the batch)
    dy     = dy_next + W *ᵀ dz,   dW = Σ dz ⊗ ỹ (shifted)

In training mode the step couples the samples of a batch (μ, r are batch means), so an MGRIT
state is the whole batch; ``batch_stats(cache, bk)`` returns the statistics this forward used,
for the once-per-step running-statistics update (refbraid.layers.batchnorm).

Shape legend: B batch, C channels, S… the 2 (H, W) or 3 (D, H, W) spatial axes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backends.reference import check_activation
from .batchnorm import EPS, NormalisedLayer, bn_adjoint, bn_forward, check_mode, init_running_stats
from .conv import KERNEL_SIZE
from .init import check_adjoint, check_dtype, check_positive_int, check_step_size, uniform_fan_in
from .layernorm import check_eps
from .spatial import check_spatial, conv_same, conv_same_adjoint


@dataclass(frozen=True)
class ConvBNStep(NormalisedLayer):
    """One step ``y_next = y + h σ(BN(Conv(C→C, 3^s, pad 1, no bias)(y)))`` on (C, S…) images."""

    channels: int
    spatial: tuple[int, ...]
    activation: str = "relu"
    mode: str = "train"
    eps: float = EPS

    def __post_init__(self):
        check_positive_int("channels", self.channels)
        object.__setattr__(self, "spatial", check_spatial("spatial", self.spatial))
        check_activation(self.activation)
        check_mode(self.mode)
        check_eps(self.eps)

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.channels, *self.spatial)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        C, k, s = self.channels, KERNEL_SIZE, len(self.spatial)
        params = {"W": uniform_fan_in(rng, (C, C, *(k,) * s), C * k**s, dtype),
                  "gamma": np.ones(C, dtype), "beta": np.zeros(C, dtype)}
        if self.mode == "eval":
            params.update(init_running_stats(C, dtype))
        return params

    def forward(self, params, y, h: float, bk):
        h = check_step_size("h", h)
        check_dtype("y", y, params)
        z = conv_same(bk, y, params["W"], None)  # B,C,S…
        u, bn_cache = bn_forward(bk, params, z, self.mode, self.eps)  # B,C,S…
        return bk.euler_act(y, u, h, self.activation), (y, u, bn_cache)

    def adjoint(self, params, cache, dy_next, h: float, bk, grads: bool = True):
        y, u, bn_cache = cache
        h = check_step_size("h", h)
        check_adjoint("dy_next", dy_next, y.shape)
        s = h * bk.activation_adjoint(u, dy_next, self.activation)  # B,C,S…
        dz, dgamma, dbeta = bn_adjoint(bk, params, bn_cache, s, self.mode)
        dys, dW, _ = conv_same_adjoint(bk, y, params["W"], dz)
        return dy_next + dys, ({"W": dW, "gamma": dgamma, "beta": dbeta} if grads else None)

    def _bn_cache(self, cache):
        return cache[2]
