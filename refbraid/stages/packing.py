"""States of changing shape as MGRIT vectors: pack each point into one flat row per level.

MGRIT stacks a level's states into one array, so every point of a level needs one shape. A
mixed network's state at fine index i has shape S_i (with the batch axis: (B, *S_i)), and a
spatially coarsened level ℓ halves the space axes of every S_i once more (S_i^ℓ). The packing
stores point i of level ℓ as a flat vector of length ``L_ℓ = max_i |S_i^ℓ|``::

    pack(y, ℓ)        = [y.ravel(), 0, ..., 0]          (length L_ℓ)
    unpack(u, ℓ, i)   = u[:|S_i^ℓ|].reshape(S_i^ℓ)

The padding stays exactly zero through every MGRIT operation (steps write zeros there, FAS
sums and differences of zeros are zero), so the packed iteration is the unpacked one.
:class:`PackedTransfer` applies a :class:`~refbraid.mgrit.transfer.SpatialCoarsening` point by
point on the unpacked states, which is why the transfer interface gets the fine index.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from ..backends.portable import zeros_on
from ..mgrit.arrays import namespace


@dataclass(frozen=True, eq=False)
class Packing:
    """Per level ℓ and fine index i the shape (B, *S_i^ℓ), and each level's length L_ℓ."""

    shapes: tuple[tuple[tuple[int, ...], ...], ...]  # [ℓ][i] -> shape with batch axis

    @classmethod
    def build(cls, state_shapes, batch: int, n_levels: int, spatial=None) -> Packing:
        """From S_0..S_N, halving the trailing ``spatial.dims`` axes below coarsened levels."""
        level = [(int(batch), *tuple(s)) for s in state_shapes]
        levels = [tuple(level)]
        for ell in range(n_levels - 1):
            if spatial is not None and spatial.coarsens(ell):
                d = spatial.dims
                for shape in level:
                    if any(n % 2 for n in shape[-d:]):
                        raise ValueError(
                            f"`spatial`: level {ell + 1} halves the states, but a state of "
                            f"shape {shape[1:]} on level {ell} has an odd extent; coarsen "
                            f"fewer levels (`levels`) or use sizes divisible by 2.")
                level = [(*s[:-d], *(n // 2 for n in s[-d:])) for s in level]
            levels.append(tuple(level))
        return cls(tuple(levels))

    def length(self, level: int) -> int:
        return max(prod(s) for s in self.shapes[level])

    def level_of(self, u) -> int:
        """The level a packed row belongs to (lengths differ between differently sized levels)."""
        n = int(u.shape[-1])
        for ell in range(len(self.shapes)):
            if self.length(ell) == n:
                return ell
        raise ValueError(f"a packed state of length {n} matches no level "
                         f"({[self.length(ell) for ell in range(len(self.shapes))]}).")

    def shape(self, level: int, index: int) -> tuple[int, ...]:
        return self.shapes[level][index]

    def pack(self, y, level: int):
        xp = namespace(y)
        flat = xp.reshape(y, (-1,))
        pad = self.length(level) - flat.shape[0]
        return xp.concat([flat, zeros_on(flat, (pad,))]) if pad else flat

    def unpack(self, u, level: int, index: int):
        shape = self.shape(level, index)
        return namespace(u).reshape(u[: prod(shape)], shape)


@dataclass(frozen=True, eq=False)
class PackedTransfer:
    """A spatial transfer (``restrict``/``interpolate``/``coarsens``) on packed rows."""

    packing: Packing
    spatial: object

    def coarsens(self, level: int) -> bool:
        return self.spatial.coarsens(level)

    def restrict(self, u, level: int, index: int):
        y = self.spatial.restrict(self.packing.unpack(u, level, index), level, index)
        return self.packing.pack(y, level + 1)

    def interpolate(self, v, level: int, index: int):
        y = self.spatial.interpolate(self.packing.unpack(v, level + 1, index), level, index)
        return self.packing.pack(y, level)
