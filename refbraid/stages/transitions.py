"""Transitions between the stages of a mixed network, and their rebuilding for coarse maps.

A transition is a plain layer of :mod:`refbraid.layers` (``Pool``, ``StridedConv``,
``ChannelWiden``, ``BatchNorm``): ``in_shape``/``out_shape`` properties, ``init``,
``forward(params, y, bk)``, ``adjoint(params, cache, dy_next, bk)``; it is ONE fine step of
the MGRIT grid (no step size). On a level coarsened in space it receives maps 2^s times
smaller than it was built for; :func:`transition_at` rebuilds it for the maps it gets
(``layer.at(spatial)``, :class:`refbraid.layers.spatial.Resizable`), so its output shape is
computed from its input::

    T^ℓ = T.at(S^ℓ)         same parameters, maps of size S^ℓ (level ℓ's state before T)

:class:`Chain` applies several transitions as one fine step (pool, then widen)::

    Chain(T_1, …, T_k)(y) = T_k(… T_1(y))          adjoint: T_1'ᵀ(… T_k'ᵀ(dy_next))
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def transition_at(transition, in_shape: tuple[int, ...]):
    """``transition`` rebuilt for states of shape ``in_shape`` (C, S…) (itself if it fits)."""
    in_shape = tuple(in_shape)
    if in_shape == tuple(transition.in_shape):
        return transition
    if in_shape[0] != transition.in_shape[0] or not hasattr(transition, "at"):
        raise ValueError(f"a transition built for states of shape {tuple(transition.in_shape)} "
                         f"cannot take states of shape {in_shape} (only the spatial size may "
                         f"differ, and only for a layer with `at(spatial)`).")
    return transition.at(in_shape[1:])


@dataclass(frozen=True)
class Chain:
    """Several transitions applied in order as ONE fine step: ``T_k ∘ … ∘ T_1``.

    Parameters of part j are named ``"{j}_{name}"``; the adjoint runs the parts backwards.
    """

    parts: tuple

    def __post_init__(self):
        if not self.parts:
            raise ValueError("`parts` must hold at least one transition.")
        for j in range(1, len(self.parts)):
            if tuple(self.parts[j].in_shape) != tuple(self.parts[j - 1].out_shape):
                raise ValueError(f"`parts[{j}]` takes states of shape "
                                 f"{tuple(self.parts[j].in_shape)}, `parts[{j - 1}]` gives "
                                 f"{tuple(self.parts[j - 1].out_shape)}.")

    @property
    def in_shape(self) -> tuple[int, ...]:
        return tuple(self.parts[0].in_shape)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(self.parts[-1].out_shape)

    def at(self, spatial) -> Chain:
        """Every part rebuilt for the maps it receives when the chain gets maps ``spatial``."""
        parts, shape = [], (self.in_shape[0], *spatial)
        for part in self.parts:
            parts.append(transition_at(part, shape))
            shape = tuple(parts[-1].out_shape)
        return Chain(tuple(parts))

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict:
        return {f"{j}_{k}": v for j, part in enumerate(self.parts)
                for k, v in part.init(rng, dtype).items()}

    def own(self, params, j: int) -> dict:
        """The params of part j (names without the ``"{j}_"`` prefix)."""
        head = f"{j}_"
        return {k[len(head):]: v for k, v in params.items() if k.startswith(head)}

    def forward(self, params, y, bk):
        caches = []
        for j, part in enumerate(self.parts):
            y, cache = part.forward(self.own(params, j), y, bk)
            caches.append(cache)
        return y, caches

    def adjoint(self, params, cache, dy_next, bk):
        grads = {}
        for j in reversed(range(len(self.parts))):
            dy_next, d = self.parts[j].adjoint(self.own(params, j), cache[j], dy_next, bk)
            grads.update({f"{j}_{k}": v for k, v in d.items()})
        return dy_next, grads
