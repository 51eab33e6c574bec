"""Row splits of an image and the two-sided halo exchange of a 3×3 stencil, with its adjoint.

A (B, C, H, W) feature map is split by rows: rank p owns rows [o_p, o_{p+1}) (n_p ≥ 1 rows,
any split; :meth:`RowSplit.even` gives H // P each, one more on the first H % P ranks).
A 3×3 convolution of row i reads rows i−1, i, i+1, so rank p needs one ghost row from each
neighbour::

    forward   ỹ_p = [y_{p−1}[last row]; y_p; y_{p+1}[first row]]     (zero beyond the image:
                                                                        the conv's zero padding)
    adjoint   y_p = ỹ_p[1:−1];  y_p[last row]  += ỹ_{p+1}[0]           (add the halos back
              y_p[first row] += ỹ_{p−1}[−1]                             into their owners)

Built from :class:`~refbraid.parallel.ops.HaloExchange` (ghost from the previous block) on the
communicator and on its reverted copy (ghost from the next block, the rows read backwards), so
it inherits their distributed dot-product test; its own is in tests/mpi/test_space.py.

Shape legend: P ranks, B batch, C channels, H rows, W columns, n_p rows on rank p.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..parallel.ops import HaloExchange, LinearOperator

ROW_AXIS = 2  # NCHW: rows are axis 2


@dataclass(frozen=True)
class RowSplit:
    """Rows per rank ``counts`` (n_p ≥ 1, in rank order) of an image of ``sum(counts)`` rows."""

    counts: tuple[int, ...]

    def __post_init__(self):
        if not self.counts or any(isinstance(c, bool) or not isinstance(c, (int, np.integer))
                                  or c < 1 for c in self.counts):
            raise ValueError(f"`counts` must be positive row counts, one per rank, got "
                             f"{self.counts!r}.")
        object.__setattr__(self, "counts", tuple(int(c) for c in self.counts))

    @classmethod
    def even(cls, rows: int, ranks: int) -> RowSplit:
        """H // P rows each, one more on the first H % P ranks; needs H ≥ P."""
        if rows < ranks:
            raise ValueError(f"`rows`: an image of {rows} rows cannot be split over {ranks} "
                             f"ranks (every rank needs at least one row); use at most {rows} "
                             "space-parallel ranks.")
        return cls(tuple(rows // ranks + (1 if p < rows % ranks else 0) for p in range(ranks)))

    @property
    def rows(self) -> int:
        return sum(self.counts)

    @property
    def ranks(self) -> int:
        return len(self.counts)

    def bounds(self, rank: int) -> tuple[int, int]:
        """Rows [lo, hi) of ``rank``."""
        lo = sum(self.counts[:rank])
        return lo, lo + self.counts[rank]

    def local(self, full, rank: int):
        """Rank ``rank``'s rows of a full (B, C, H, W) array (a copy)."""
        lo, hi = self.bounds(rank)
        return np.array(full[:, :, lo:hi], copy=True)


class SpatialHalo(LinearOperator):
    """``ỹ_p = [ghost above; y_p; ghost below]`` along the row axis (module docstring)."""

    def __init__(self, comm):
        super().__init__(comm)
        self.from_above = HaloExchange(comm)  # prepends the previous block's last row
        self.from_below = HaloExchange(comm.reverted())  # on reversed rows: the next's first

    def forward(self, y):
        rows = np.moveaxis(np.asarray(y), ROW_AXIS, 0)  # n_p,B,C,W
        above = self.from_above.forward(rows)[:1]
        below = self.from_below.forward(rows[::-1])[:1]
        return np.moveaxis(np.concatenate([above, rows, below], axis=0), 0, ROW_AXIS)

    def adjoint(self, dy_halo):
        rows = np.moveaxis(np.asarray(dy_halo), ROW_AXIS, 0)  # n_p+2,B,C,W
        inner = rows[1:-1]
        zeros = np.zeros_like(inner)
        top = self.from_above.adjoint(np.concatenate([rows[:1], zeros], axis=0))
        bottom = self.from_below.adjoint(np.concatenate([rows[-1:], zeros], axis=0))[::-1]
        return np.ascontiguousarray(np.moveaxis(inner + top + bottom, 0, ROW_AXIS))

    def __repr__(self) -> str:
        return f"SpatialHalo({self.comm!r})"
