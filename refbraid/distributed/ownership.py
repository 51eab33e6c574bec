"""Who owns what in the distributed layer-parallel solve (no MPI calls here: pure bookkeeping).

Rank q owns the layers (θ_n, y[n]) of its forward block [b_q, b_{q+1}); blocks start at
coarsest-grid points. :class:`BlockPlan` derives, for the forward and the adjoint solve, the
ghost weights and states each rank must fetch and the gradient rows it must send home (see
:mod:`refbraid.distributed.network` for the mathematics).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..layer_parallel import LayerParallelSettings, as_settings
from ..mgrit import MGRITSettings, build_hierarchy
from ..mgrit.grid import Hierarchy
from ..parallel.layout import Layout, check_layout, partition


def _hierarchy(n_layers: int, s: MGRITSettings) -> Hierarchy:
    return build_hierarchy(n_layers, s.cfactors, s.min_coarse)


def _mirrored_layout(forward: Layout, backward: Hierarchy) -> Layout | None:
    """Backward layout in which rank q owns λ[i] for i in (b_q, b_{q+1}] (None if impossible).

    In solver order s = N − i, block position p (rank Q−1−p) starts at N − b_{Q−p}; every
    start must be a coarsest point of the backward hierarchy.
    """
    N, b = forward.n_steps, forward.starts
    starts = (0, *(N - b[len(b) - p] for p in range(1, len(b))))
    coarse = {int(s) for s in backward.coarsest.points}
    if any(s not in coarse for s in starts[1:]):
        return None
    return Layout(n_steps=N, starts=starts)


@dataclass(frozen=True, eq=False)
class BlockPlan:
    """Blocks of the forward and adjoint solves and the rows every rank needs (no MPI here).

    forward_layout   solver (= fine) indices [b_q, b_{q+1}) of y owned by rank q
    backward_layout  solver indices s = N − i of λ; block position p lives on rank Q−1−p
    mirrored         True when the backward blocks are the forward ones shifted by one
    """

    n_layers: int
    n_ranks: int
    forward_hierarchy: Hierarchy
    backward_hierarchy: Hierarchy
    forward_layout: Layout
    backward_layout: Layout
    mirrored: bool

    @classmethod
    def build(cls, n_layers: int, settings: LayerParallelSettings, n_ranks: int) -> BlockPlan:
        """Balanced forward blocks and (mirrored if possible) backward blocks for ``n_ranks``."""
        settings = as_settings(settings)  # TypeError naming `settings` unless it is one
        fh = _hierarchy(n_layers, settings.forward)
        bh = _hierarchy(n_layers, settings.backward)
        try:
            fl = partition(fh.coarsest.points, n_layers, n_ranks)
            bl = partition(bh.coarsest.points, n_layers, n_ranks)
        except ValueError as err:  # the same on every rank (CollectiveError): said once
            raise type(err)(f"layer-parallel over {n_ranks} ranks with {n_layers} layers: {err} "
                            "(or use data parallelism: --data-parallel)") from err
        mirror = _mirrored_layout(fl, bh)
        plan = cls(n_layers, n_ranks, fh, bh, fl, mirror or bl, mirror is not None)
        check_layout(plan.backward_layout, bh.coarsest.points, n_layers)
        return plan

    def _check_rank(self, rank: int) -> int:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) \
                or not 0 <= rank < self.n_ranks:
            raise ValueError(f"`rank` must be in [0, {self.n_ranks}), got {rank!r}.")
        return int(rank)

    def forward_points(self, rank: int) -> np.ndarray:
        """Fine indices i of the states y[i] rank owns after the forward solve."""
        return self.forward_layout.fine_indices(self._check_rank(rank), "forward")

    def backward_points(self, rank: int) -> np.ndarray:
        """Fine indices i of the adjoints λ[i] rank owns after the adjoint solve."""
        pos = self.n_ranks - 1 - self._check_rank(rank)
        return np.sort(self.backward_layout.fine_indices(pos, "backward"))

    def owned_layers(self, rank: int) -> np.ndarray:
        """Layers n (weights θ_n, gradient rows) rank owns: its forward points below N."""
        pts = self.forward_points(rank)
        return pts[pts < self.n_layers]

    def forward_weight_rows(self, rank: int) -> np.ndarray:
        """Layers a whose weights the forward solve uses on rank: starts of its steps a → b,
        which start at its points on every level (the step across a block boundary is made
        by the block where it starts)."""
        rows: set[int] = set()
        for lvl in self.forward_hierarchy:
            sl = self.forward_layout.positions(lvl.points, self._check_rank(rank))
            rows.update(int(lvl.points[k]) for k in _step_starts(sl, len(lvl.points)))
        return np.array(sorted(rows), dtype=np.int64)

    def backward_rows(self, rank: int) -> np.ndarray:
        """Layers a whose θ_a and y[a] the adjoint solve uses on rank: stops a = N − s' of
        its steps s → s' (solver indices), which start at its points on every level."""
        pos = self.n_ranks - 1 - self._check_rank(rank)
        N, rows = self.n_layers, set()
        for lvl in self.backward_hierarchy:
            sl = self.backward_layout.positions(lvl.points, pos)
            rows.update(N - int(lvl.points[k + 1]) for k in _step_starts(sl, len(lvl.points)))
        return np.array(sorted(rows), dtype=np.int64)

    def gradient_rows(self, rank: int) -> np.ndarray:
        """Layers a whose gradient rank computes: the fine adjoint steps a+1 → a it makes,
        one from each of its adjoint points above 0 (returned to the owners by a RowExchange
        adjoint; with mirrored blocks they are its own layers)."""
        pts = self.backward_points(rank)
        return pts[pts > 0] - 1

    def weight_rows(self, rank: int) -> np.ndarray:
        """Every layer whose weights rank uses: owned, forward ghosts, adjoint rows."""
        rows = set(self.owned_layers(rank)) | set(self.forward_weight_rows(rank)) \
            | set(self.backward_rows(rank))
        return np.array(sorted(int(r) for r in rows), dtype=np.int64)

    def table(self) -> str:
        """One line per rank: owned layers, adjoints, and the rows that cross ranks (ghost
        weights in, states in, gradient rows out)."""
        lines = [f"{'rank':>4}  {'layers':>12}  {'λ owned':>12}  {'ghost θ':>7}  "
                 f"{'y in':>5}  {'∇θ out':>6}"]
        for q in range(self.n_ranks):
            own, fp = self.owned_layers(q), self.forward_points(q)
            ghosts = len(set(self.weight_rows(q)) - set(own))
            y_in = len(set(self.backward_rows(q)) - set(fp))
            g_out = len(set(self.gradient_rows(q)) - set(own))
            lines.append(f"{q:>4}  {_span(own):>12}  {_span(self.backward_points(q)):>12}  "
                         f"{ghosts:>7}  {y_in:>5}  {g_out:>6}")
        return "\n".join(lines)


def _step_starts(block: slice, n_points: int) -> range:
    """Positions on a level whose step to the next point a block makes: its own, but the
    level's last point (where no step starts)."""
    return range(block.start, min(block.stop, n_points - 1))


def _span(a: np.ndarray) -> str:
    return f"{int(a[0])}..{int(a[-1])}" if len(a) else "-"


class Rows(dict):
    """``{global row index: array}``; a missing row names the rank and what it holds.
    ``rows[i, ...]`` reads row i as a propagator reads a stacked trajectory."""

    def __init__(self, name: str, rank: int, rows: dict[int, Any]):
        super().__init__(rows)
        self.name, self.rank = name, rank

    def __getitem__(self, key):
        return dict.__getitem__(self, int(key[0] if isinstance(key, tuple) else key))

    def __missing__(self, key):
        raise KeyError(f"rank {self.rank} holds no row {key!r} of {self.name} "
                       f"(it holds {_span(np.array(sorted(self)))}); the BlockPlan missed it.")
