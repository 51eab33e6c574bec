"""Which rank owns which time points: a block partition aligned with the coarsest grid.

MGRIT runs over the solver-order index ``s = 0..N`` (``s = i`` for a forward solve and
``s = N - i`` for an adjoint solve on the reversed grid, see :mod:`refbraid.mgrit.problem`).
``P`` ranks own contiguous blocks of it::

    block p = [starts[p], starts[p+1]),      starts[0] = 0,   starts[P] = N + 1

and every ``starts[p]`` is a point of the COARSEST grid. Every coarsest point is a C-point on
every finer level, so on every level each block starts with a C-point and holds whole
F-intervals (a C-point and the F-points after it). Consequences the solver relies on:

* F-relaxation needs no communication;
* C-relaxation, the residual and the FAS right-hand side need one value from the previous
  block on the same level: its last point stepped across the boundary
  (``refbraid.mgrit.cycle.exchange_stepped``);
* the coarsest solve is a pipeline through the blocks in order.

The partition balances the number of coarsest intervals per block (the first ``K mod P``
blocks get one more); the last block also holds the trailing points after the last coarsest
point. ``P`` larger than the number ``K`` of coarsest intervals is an error.

A step from ``start`` to ``stop`` is computed by the owner of ``start`` (its layer's owner)
and stored by the owner of ``stop``: across a block boundary the result is sent on. (XBraid
computes it on the owner of ``stop`` from the sent ``start`` value; that gives the later block
one step more per level and sweep, and the adjoint's boundary layer to a rank that does not
own it.)

Shape legend: N fine steps (N + 1 points), P blocks, K coarsest intervals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import CollectiveError


@dataclass(frozen=True)
class Layout:
    """Contiguous blocks of the solver-order grid ``0..n_steps``: ``[starts[p], starts[p+1])``."""

    n_steps: int
    starts: tuple[int, ...]

    def __post_init__(self):
        n, s = self.n_steps, self.starts
        if (
            len(s) < 1
            or s[0] != 0
            or any(b <= a for a, b in zip(s, s[1:], strict=False))
            or s[-1] > n
        ):
            raise ValueError(
                "`starts` must be strictly increasing, begin at 0 and stay <= "
                f"n_steps={n}, got {s!r}."
            )

    @property
    def n_blocks(self) -> int:
        return len(self.starts)

    def bounds(self, block: int) -> tuple[int, int]:
        """Half-open solver-index range ``[lo, hi)`` of ``block``."""
        if not 0 <= block < self.n_blocks:
            raise ValueError(f"`block` must be in [0, {self.n_blocks}), got {block!r}.")
        hi = self.starts[block + 1] if block + 1 < self.n_blocks else self.n_steps + 1
        return self.starts[block], hi

    def owner(self, s: int) -> int:
        """Block that owns solver index ``s``."""
        if not 0 <= s <= self.n_steps:
            raise ValueError(f"`s` must be in [0, {self.n_steps}], got {s!r}.")
        return int(np.searchsorted(self.starts, s, side="right")) - 1

    def positions(self, points: np.ndarray, block: int) -> slice:
        """Slice of a level's sorted ``points`` (solver indices) that ``block`` owns."""
        lo, hi = self.bounds(block)
        return slice(int(np.searchsorted(points, lo)), int(np.searchsorted(points, hi)))

    def fine_indices(self, block: int, direction: str = "forward") -> np.ndarray:
        """Problem (fine) indices owned by ``block``: ``i = s`` forward, ``i = N - s`` backward."""
        lo, hi = self.bounds(block)
        s = np.arange(lo, hi)
        if direction == "forward":
            return s
        if direction == "backward":
            return self.n_steps - s
        raise ValueError(f"`direction` must be 'forward' or 'backward', got {direction!r}.")


def partition(coarsest_points, n_steps: int, n_blocks: int) -> Layout:
    """Balanced blocks starting at coarsest points: ⌊K/P⌋ intervals each, +1 for the first K % P."""
    pts = np.asarray(coarsest_points, dtype=np.int64)
    if isinstance(n_blocks, bool) or not isinstance(n_blocks, (int, np.integer)) or n_blocks < 1:
        raise ValueError(
            f"`n_blocks` (number of ranks) must be a positive integer, got {n_blocks!r}."
        )
    k = max(len(pts) - 1, 1)  # a one-point grid (N = 0) is one block
    if n_blocks > k:
        intervals = f"{k} interval" + ("s" if k != 1 else "")
        ranks = f"{k} rank" + ("s" if k != 1 else "")
        raise CollectiveError(
            f"{n_blocks} ranks exceed the {intervals} of the coarsest MPI grid (every rank "
            f"needs at least one coarsest interval); use at most {ranks}, fewer levels, a "
            f"smaller `--cfactor` or more `--layers`."
        )
    sizes = [k // n_blocks + (1 if p < k % n_blocks else 0) for p in range(n_blocks)]
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return Layout(n_steps=int(n_steps), starts=tuple(int(pts[j]) for j in first))


def check_layout(layout: Layout, coarsest_points, n_steps: int) -> None:
    """Raise ValueError unless every block starts at a coarsest point of an ``n_steps`` grid."""
    if layout.n_steps != n_steps:
        raise ValueError(f"`layout` is for n_steps={layout.n_steps}, the problem has {n_steps}.")
    pts = np.asarray(coarsest_points, dtype=np.int64)  # sorted
    starts = np.asarray(layout.starts, dtype=np.int64)
    at = np.minimum(np.searchsorted(pts, starts), max(len(pts) - 1, 0))
    found = pts[at] == starts if len(pts) else np.zeros(len(starts), dtype=bool)
    bad = [int(s) for s in starts[~found]]
    if bad:
        raise ValueError(
            f"`layout` block starts {bad} are not coarsest-grid points; every F-interval must lie "
            "on one rank (use refbraid.parallel.layout.partition)."
        )
