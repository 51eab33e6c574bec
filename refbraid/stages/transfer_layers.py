"""Spatial transfers as parameter-free layers, for the verification harness.

``refbraid verify`` checks plain layers (``in_shape``, ``out_shape``, ``init``, ``forward``,
``adjoint``) by dot products, central differences, backend vs NumPy and (``--torch``)
PyTorch autograd. These adapters put the MGRIT grid transfers of
:mod:`refbraid.mgrit.spatial` through the same checks (the stage transitions are layers of
:mod:`refbraid.layers`, checked in its catalogue)::

    SpatialRestriction     out = R x      (average | full_weighting),  dx = Rᵀ dout
    SpatialInterpolation   out = P x      (constant | linear),         dx = Pᵀ dout

Shapes exclude the batch axis; ``dims`` trailing axes are space.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..mgrit import spatial


def _halve(shape, dims):
    return (*shape[:-dims], *(n // 2 for n in shape[-dims:]))


def _double(shape, dims):
    return (*shape[:-dims], *(2 * n for n in shape[-dims:]))


@dataclass(frozen=True)
class SpatialRestriction:
    """R on (C, *space) states, as a layer."""

    in_shape: tuple[int, ...]
    kind: str = "average"
    dims: int = 2

    @property
    def out_shape(self) -> tuple[int, ...]:
        return _halve(self.in_shape, self.dims)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict:
        return {}

    def forward(self, params, x, bk):
        return spatial.restrict(x, self.kind, self.dims), None

    def adjoint(self, params, cache, dout, bk):
        return spatial.restrict_adjoint(dout, self.kind, self.dims), {}


@dataclass(frozen=True)
class SpatialInterpolation:
    """P on (C, *space) states, as a layer."""

    in_shape: tuple[int, ...]
    kind: str = "linear"
    dims: int = 2

    @property
    def out_shape(self) -> tuple[int, ...]:
        return _double(self.in_shape, self.dims)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict:
        return {}

    def forward(self, params, x, bk):
        return spatial.interpolate(x, self.kind, self.dims), None

    def adjoint(self, params, cache, dout, bk):
        return spatial.interpolate_adjoint(dout, self.kind, self.dims), {}


def transfer_catalog() -> list[tuple[str, object]]:
    """R and P (2-D and 3-D) at sizes small enough for the simulator."""
    out: list[tuple[str, object]] = []
    for dims, shape in ((2, (2, 4, 6)), (3, (2, 4, 2, 4))):
        for kind in spatial.RESTRICTIONS:
            out.append((f"restrict[{kind},{dims}d]", SpatialRestriction(shape, kind, dims)))
        for kind in spatial.INTERPOLATIONS:
            out.append((f"interpolate[{kind},{dims}d]",
                        SpatialInterpolation(_halve(shape, dims), kind, dims)))
    return out
