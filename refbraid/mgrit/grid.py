"""The MGRIT time-grid hierarchy: points of every level and their C/F split.

Indices are solver-order indices ``s = 0..N`` of the finest grid (docs/references.md §2)::

    level 0 points:    0, 1, 2, ..., N
    level ℓ:           points p_0 < p_1 < ... < p_{n_ℓ}   (p_0 = 0)
    C-points of ℓ:     positions k with k mod m_ℓ == 0    (m_ℓ = cfactor of level ℓ)
    level ℓ+1 points:  the C-points of ℓ, so n_{ℓ+1} = ⌊n_ℓ / m_ℓ⌋

Any ``N`` works: when ``m_ℓ`` does not divide ``n_ℓ`` the last interval of level ℓ is shorter
(its last points are F-points after the last C-point, updated by F-relaxation from it). The
coarsest level ``L-1`` has no F-points: all its points are solved for directly, and they are
marked as C-points.

A coarse step from ``p_{k-1}`` to ``p_k`` spans ``p_k - p_{k-1}`` fine steps; the problem's
step function receives those fine indices (e.g. step size ``t[p_k] - t[p_{k-1}]``).

Shape legend: N fine steps, n_ℓ intervals on level ℓ (n_ℓ + 1 points), L levels.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class Level:
    """One grid level: points (solver indices) and C/F split; ``cfactor`` None on the coarsest."""

    index: int
    points: np.ndarray  # (n_ℓ + 1,) int64, increasing
    cfactor: int | None

    @property
    def n_intervals(self) -> int:
        return len(self.points) - 1

    @cached_property
    def is_c(self) -> np.ndarray:
        """Boolean mask of C-points (all True on the coarsest level); read-only, computed once."""
        k = np.arange(len(self.points))
        mask = k % self.cfactor == 0 if self.cfactor else np.ones(len(self.points), dtype=bool)
        return _readonly(mask)

    @property
    def c_points(self) -> np.ndarray:
        return self.points[self.is_c]

    @property
    def f_points(self) -> np.ndarray:
        return self.points[~self.is_c]

    def step_sizes(self, t) -> np.ndarray:
        """Step sizes ``t[p_k] - t[p_{k-1}]`` of this level for a time grid ``t`` (solver order)."""
        t = np.asarray(t)
        return np.diff(t[self.points])


@dataclass(frozen=True, eq=False)
class Hierarchy:
    """Levels 0 (finest) .. L-1 (coarsest) over ``n_steps`` fine steps."""

    n_steps: int
    levels: tuple[Level, ...]

    def __len__(self) -> int:
        return len(self.levels)

    def __getitem__(self, i: int) -> Level:
        return self.levels[i]

    def __iter__(self):
        return iter(self.levels)

    @property
    def coarsest(self) -> Level:
        return self.levels[-1]

    @property
    def cfactors(self) -> tuple[int, ...]:
        return tuple(lvl.cfactor for lvl in self.levels[:-1])

    def __repr__(self) -> str:
        sizes = ", ".join(str(lvl.n_intervals) for lvl in self.levels)
        return f"Hierarchy(n_steps={self.n_steps}, cfactors={self.cfactors}, intervals=[{sizes}])"


def max_levels(n_steps: int, cfactor: int | tuple[int, ...], min_coarse: int = 2) -> int:
    """Largest L such that every coarse level keeps at least ``min_coarse`` intervals.

    ``cfactor`` is one factor for every level, or a tuple (then L <= len(cfactor) + 1).
    """
    if isinstance(cfactor, tuple):
        factors = iter(cfactor)
    else:
        if cfactor < 2:
            raise ValueError(f"`cfactor` must be an integer >= 2, got {cfactor!r}.")
        factors = iter(lambda: cfactor, None)  # endless
    n, L = int(n_steps), 1
    for m in factors:
        if n // m < min_coarse:
            break
        n, L = n // m, L + 1
    return L


def build_hierarchy(n_steps: int, cfactors: tuple[int, ...], min_coarse: int = 2) -> Hierarchy:
    """Levels by repeated injection: level ℓ+1 = C-points of ℓ (``len(cfactors) + 1`` levels).

    Raises ValueError naming ``levels`` when a coarse level would have fewer than
    ``min_coarse`` intervals. A hierarchy is immutable (read-only arrays), so equal arguments
    get one shared object from a small cache: the ranks of a simulated run
    (:mod:`refbraid.parallel.virtual`) do not each rebuild the same O(N) arrays.
    """
    if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) or n_steps < 1:
        raise ValueError(f"`n_steps` must be a positive integer, got {n_steps!r}.")
    return _build_hierarchy(int(n_steps), tuple(cfactors), min_coarse)


@lru_cache(maxsize=16)
def _build_hierarchy(n_steps: int, cfactors: tuple[int, ...], min_coarse: int) -> Hierarchy:
    points = np.arange(int(n_steps) + 1, dtype=np.int64)
    levels = []
    for ell, m in enumerate(cfactors):
        n_coarse = (len(points) - 1) // m
        if n_coarse < min_coarse:
            L = len(cfactors) + 1
            raise ValueError(
                f"`levels`={L} is too many for n_steps={n_steps} with cfactor {tuple(cfactors)}: "
                f"level {ell + 1} would have {n_coarse} interval(s) < min_coarse={min_coarse}; "
                f"use levels <= {ell + 1} or a longer grid."
            )
        levels.append(Level(ell, _readonly(points), int(m)))
        points = points[::m].copy()
    levels.append(Level(len(cfactors), _readonly(points), None))
    return Hierarchy(int(n_steps), tuple(levels))
