"""Shape-changing transition steps between the stages of a mixed network (minimal set).

A transition is a step ``y_next = T(θ, y)`` with no step size, counted as one fine step of
the MGRIT grid. The interface (what the richer transitions of the layers package plug into:
strided conv, batch-norm transition, ...)::

    out_shape(in_shape) -> shape          state shape (C, *space) after the transition
    init(rng, dtype) -> dict              parameters ({} for parameter-free transitions)
    forward(params, y, bk) -> y_next, cache
    adjoint(params, cache, dy_next, bk) -> dy, dparams      (dparams keyed like params)

Here, on NC(D)HW states (B batch, C channels, trailing ``dims`` axes space)::

    AveragePool     y_next = R y           (2^d average pooling)     dy = Rᵀ dy_next
    WidenChannels   y_next = [y; 0]        (C → C' ≥ C, zero rows)   dy = dy_next[:, :C]
    Chain           several transitions as one fine step             adjoints in reverse
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backends.portable import zeros_on
from ..mgrit import spatial


@dataclass(frozen=True)
class AveragePool:
    """2^d average pooling (``torch.nn.AvgPool2d(2)`` for dims = 2)."""

    dims: int = 2

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        if any(n % 2 for n in in_shape[-self.dims:]):
            raise ValueError(f"AveragePool needs even spatial extents, got state shape "
                             f"{tuple(in_shape)}.")
        return (*in_shape[:-self.dims], *(n // 2 for n in in_shape[-self.dims:]))

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict:
        return {}

    def forward(self, params, y, bk):
        return spatial.restrict(y, "average", self.dims), None  # B,C,H/2,W/2

    def adjoint(self, params, cache, dy_next, bk):
        return spatial.restrict_adjoint(dy_next, "average", self.dims), {}


@dataclass(frozen=True)
class WidenChannels:
    """Zero-pad the channel axis from ``C`` to ``channels``."""

    channels: int

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.channels < in_shape[0]:
            raise ValueError(f"`channels`={self.channels} must be >= the input's "
                             f"{in_shape[0]} channels.")
        return (self.channels, *in_shape[1:])

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict:
        return {}

    def forward(self, params, y, bk):
        xp = bk.xp
        pad = zeros_on(y, (y.shape[0], self.channels - y.shape[1], *y.shape[2:]))
        return xp.concat([y, pad], axis=1), y.shape[1]  # B,C',...

    def adjoint(self, params, cache, dy_next, bk):
        return dy_next[:, :cache, ...], {}


@dataclass(frozen=True)
class Chain:
    """Several transitions applied in order as ONE fine step: ``T_k ∘ … ∘ T_1``.

    Parameters of part j are named ``"{j}_{name}"``; the adjoint runs the parts backwards.
    """

    parts: tuple

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        for part in self.parts:
            in_shape = part.out_shape(in_shape)
        return tuple(in_shape)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict:
        return {f"{j}_{k}": v for j, part in enumerate(self.parts)
                for k, v in part.init(rng, dtype).items()}

    def _own(self, params, j):
        head = f"{j}_"
        return {k[len(head):]: v for k, v in params.items() if k.startswith(head)}

    def forward(self, params, y, bk):
        caches = []
        for j, part in enumerate(self.parts):
            y, cache = part.forward(self._own(params, j), y, bk)
            caches.append(cache)
        return y, caches

    def adjoint(self, params, cache, dy_next, bk):
        grads = {}
        for j in reversed(range(len(self.parts))):
            dy_next, d = self.parts[j].adjoint(self._own(params, j), cache[j], dy_next, bk)
            grads.update({f"{j}_{k}": v for k, v in d.items()})
        return dy_next, grads
