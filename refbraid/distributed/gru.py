"""The GRU models under MPI: MGRIT over the sequence positions, split over ranks (issue 13).

Same mathematics as :meth:`refbraid.sequence.gru_model.GRUModel.layer_parallel_gradient`
(same propagators :class:`~refbraid.sequence.gru_model.GRUForward` and
:class:`~refbraid.sequence.gru_model.GRUAdjoint`, same solves); only the ownership changes.
Rank q of a group of Q owns the positions (states h[k]) of its forward block [b_q, b_{q+1}),
blocks starting at coarsest-grid points (:class:`~refbraid.distributed.ownership.BlockPlan`)::

    forward   h[0] = 0 on every rank; MGRIT forward solve over the Q ranks
              logits = closing(h[L]), loss, λ[L] = closing'ᵀ ∂L/∂logits     on the last rank
    adjoint   λ[L] broadcast; MGRIT adjoint solve on the reversed grid; the adjoint step
              b → a runs on the owner of λ[a] and reads h[a] (fetched when a = b_{q+1})
    gradient  ∂L/∂θ = Σ_k (∂Φ(h[k]; k → k+1)/∂θ)ᵀ λ[k+1],  k = 0..L−1
              rank q computes the terms of its positions k ∈ [b_q, b_{q+1}) (λ[k+1] fetched
              where the adjoint blocks are not the forward ones shifted by one) and adds them,
              in order, to the partial sum it receives from rank q−1 before passing it on:
              ((0 + t_0) + t_1) + … is the one-process sum, so the result is bit-identical
              (a tree reduction would not be); the last rank broadcasts Σ and ∂L/∂closing.

The GRU's weights are the same at every position, so every rank holds all parameters
(replicated, like :meth:`refbraid.distributed.network.DistributedGradient.__call__`): the
optimizer takes the same step everywhere and world rank 0 evaluates and checkpoints in the
single-process format, so checkpoints resume across modes. The shard hooks the trainer asks for
(``localize``, ``gather_params``, ``gather_optimizer``) are trivial here: they only make world
rank 0 the one rank that evaluates.

Data parallelism (:func:`refbraid.parallel.mpi.split_world`): D groups; group g takes a
contiguous shard of B_g samples and scales its loss and λ[L] by B_g/B; the groups' gradients
are summed (round-off against one process). MGRIT's residual norms are reduced over the whole
world, so every group stops when one process would. One rank per group with one MGRIT level
(``--serial``) is backprop through time on the shard.

Shape legend: L sequence length (MGRIT steps), P world ranks, D groups, Q = P/D sequence
ranks, B batch, B_g shard, H hidden size.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..backends import Backend
from ..errors import CollectiveError
from ..layer_parallel import LayerParallelSettings
from ..mgrit import Problem, build_hierarchy, solve
from ..network import Params, group
from ..parallel.mpi import Topology, split_world
from ..parallel.ops import Broadcast, RowExchange
from ..sequence.gru_model import CELL_WEIGHTS, GRUAdjoint, GRUModel
from ..sequence.losses import cross_entropy
from .engine import host_backend
from .network import _pack, _unpack, shard_sizes, solve_stats
from .ownership import BlockPlan, Rows


class _RowView:
    """``view[i, ...]`` = ``rows[i]``: lets :class:`GRUAdjoint` (which indexes a stacked
    trajectory) read the states this rank holds."""

    def __init__(self, rows: Rows):
        self.rows = rows

    def __getitem__(self, key):
        return self.rows[int(key[0] if isinstance(key, tuple) else key)]


class SequenceParallelGRU:
    """MGRIT-over-the-sequence (× data-parallel) gradient of a GRU model on this rank.

    ``gradient(params, x, labels) -> (loss, grads, stats)``: every rank passes the same full
    parameters and batch and gets the same loss and full gradient. Construction is collective.
    """

    __name__ = "sequence-parallel-mpi"

    def __init__(self, model: GRUModel, topology: Topology,
                 settings: LayerParallelSettings | None = None, bk: Backend | str = "numpy"):
        if not isinstance(model, GRUModel):
            raise TypeError(f"`model` must be a GRUModel, got {type(model).__name__}.")
        self.bk = host_backend(bk)
        self.model, self.topo = model, topology
        self.settings = LayerParallelSettings() if settings is None else settings
        Q, L = topology.layer.size, model.seq_len
        if Q > 1 and 1 in (self.settings.forward.levels, self.settings.backward.levels):
            raise CollectiveError(f"one MGRIT level (--serial or --levels 1) is a sequential "
                                  f"sweep over the {L} positions: it cannot be split over {Q} "
                                  f"sequence ranks; use `--data-parallel` equal to the number "
                                  f"of MPI ranks, or two or more levels.")
        try:
            self.plan = BlockPlan.build(L, self.settings, Q)
        except ValueError as err:  # the same on every rank: worded for the sequence
            f = self.settings.forward
            K = len(build_hierarchy(L, f.cfactors, f.min_coarse).coarsest.points) - 1
            s = "" if K == 1 else "s"
            raise type(err)(f"sequence-parallel GRU: {Q} ranks per data-parallel group exceed "
                            f"the {K} coarsest interval{s} of the MGRIT grid over the {L} "
                            f"sequence positions (every rank needs at least one); use at most "
                            f"{K} rank{s} per group (more groups: --data-parallel), fewer "
                            f"levels or a smaller cfactor.") from None
        self.sequential = Q == 1 and self.settings.forward.levels == 1 \
            and self.settings.backward.levels == 1
        layer, q = topology.layer, topology.layer.rank
        self.q, self.last = q, Q - 1
        self.h_owned = self.plan.forward_points(q)  # h[k], k ∈ [b_q, b_{q+1})
        self.positions = [int(k) for k in self.h_owned if k < L]  # gradient terms made here
        self.lam_owned = self.plan.backward_points(q)
        self.states_x = RowExchange(layer, self.h_owned, self.plan.backward_rows(q))
        self.lams_x = RowExchange(layer, self.lam_owned, [k + 1 for k in self.positions])
        self.bcast_lam = Broadcast(layer, root=self.last)
        self.bcast_grads = Broadcast(layer, root=self.last)
        self.last_solves: dict[str, Any] = {}
        self.last_timings: dict[str, float] = {}

    @property
    def is_root(self) -> bool:
        """World rank 0: the rank that prints and writes files."""
        return self.topo.is_root

    def logits(self, params: Params, x):
        """Logits of the MGRIT forward this gradient trains, computed in this process (the
        numbers of the distributed forward solve): the trainer's evaluation hook."""
        if self.settings.forward.levels == 1:
            return self.model.logits(params, x, self.bk)
        return self.model.mgrit_logits(params, x, self.settings.forward, self.bk)

    def share(self, value: Any, root: int = 0) -> Any:
        """World rank ``root``'s ``value`` on every rank. Collective."""
        return self.topo.world.bcast(value, root)

    # the trainer's shard hooks (refbraid.training.trainer.fit): every rank's "shard" is the
    # whole parameter set, and only world rank ``root`` gets it back, so only it evaluates
    def localize(self, state) -> None:
        """Nothing to cut: every rank keeps all parameters and optimizer state."""

    def shard(self, full: Params) -> Params:
        """This rank's part of full arrays: all of them."""
        return full

    def gather_params(self, params: Params, root: int = 0) -> Params | None:
        """The full parameters on world rank ``root`` (they are already there), None
        elsewhere."""
        return params if self.topo.world.rank == root else None

    def gather_optimizer(self, optimizer, params: Params | None, root: int = 0):
        """The optimizer (state of all parameters) on world rank ``root``, None elsewhere."""
        return optimizer if self.topo.world.rank == root else None

    def _shard_batch(self, x, labels):
        sizes = shard_sizes(x.shape[0], self.topo.n_groups)
        lo = sum(sizes[: self.topo.group])
        hi = lo + sizes[self.topo.group]
        return x[lo:hi], labels[lo:hi], sizes[self.topo.group] / x.shape[0]

    def __call__(self, params: Params, x, labels) -> tuple[float, Params, dict[str, float]]:
        t_start = time.perf_counter()
        self.model._check(params, x)
        xs, ys, weight = self._shard_batch(x, labels)
        if self.sequential:
            loss, grads, stats = self._backprop(params, xs, ys, weight)
        else:
            loss, grads, stats = self._solves(params, xs, ys, weight)
        if self.topo.n_groups > 1:  # Σ over the groups' shards (round-off vs one process)
            grads = _unpack(self.topo.data.sum_to_all(_pack(grads)), grads)
        self.last_timings["gradient_s"] = time.perf_counter() - t_start
        return loss, {k: grads[k] for k in params}, stats

    def _backprop(self, params, xs, ys, weight):
        """One rank per group and one level: backprop through time on the group's shard."""
        loss, grads, _ = self.model.backprop(params, xs, ys, self.bk)
        if weight != 1.0:
            grads = {k: v * weight for k, v in grads.items()}
        self.last_solves = {}
        n = 2.0 * self.model.seq_len
        return self.topo.world.allreduce_sum(weight * loss), grads, \
            {"phi_calls": n, "rank_phi_calls": n}

    def _solves(self, params, xs, ys, weight):
        """Both distributed solves, the ordered gradient sum, the head on the last rank."""
        model, bk, plan, layer = self.model, self.bk, self.plan, self.topo.layer
        L, cell = model.seq_len, group(params, "cell")
        fwd = solve(model.forward_problem(cell, xs, bk), self.settings.forward, comm=layer,
                    layout=plan.forward_layout)
        states = dict(zip((int(i) for i in fwd.fine_indices), fwd.solution, strict=True))
        lam_L, loss_part, closing_grads = None, 0.0, None
        if self.q == self.last:
            closing = group(params, "closing")
            logits, cc = model.closing.forward(closing, states[L], bk)
            loss, dlogits = cross_entropy(logits, ys, bk)
            if weight != 1.0:
                dlogits = dlogits * weight
            lam_L, closing_grads = model.closing.adjoint(closing, cc, dlogits, bk)
            loss_part = weight * float(loss)
        lam_L = self.bcast_lam.forward(lam_L)
        held = Rows("h", self.q, states)
        held.update(self.states_x.forward({i: states[i] for i in self.h_owned}))
        adjoint = Problem(step=GRUAdjoint(model, cell, xs, _RowView(held), bk), u0=lam_L,
                          n_steps=L, direction="backward")
        bwd = solve(adjoint, self.settings.backward, comm=layer, layout=plan.backward_layout)
        lams = dict(zip((int(i) for i in bwd.fine_indices), bwd.solution, strict=True))
        lam_next = Rows("λ", self.q, self.lams_x.forward({i: lams[i] for i in self.lam_owned}))
        dcell = self._ordered_sum(cell, xs, held, lam_next)
        names = sorted(params)  # one packing order on every rank
        total = None
        if self.q == self.last:  # Σ over all positions and the head's gradient, packed
            full = {**{f"cell.{k}": dcell[k] for k in CELL_WEIGHTS},
                    **{f"closing.{k}": v for k, v in closing_grads.items()}}
            total = _pack({k: full[k] for k in names})
        grads = _unpack(self.bcast_grads.forward(total),
                        {k: np.zeros_like(params[k]) for k in names})
        self.last_solves = {"forward": fwd, "backward": bwd}
        loss_total = self.topo.world.allreduce_sum(loss_part)
        stats = solve_stats(fwd, bwd, self.topo.world, copies=self.topo.n_groups)
        self.last_timings = {"fwd_s": fwd.solve_seconds, "bwd_s": bwd.solve_seconds}
        return loss_total, grads, stats

    def _ordered_sum(self, cell, xs, states: Rows, lams: Rows) -> dict[str, Any] | None:
        """Σ_k (∂Φ(h[k])/∂θ)ᵀ λ[k+1] in position order through the ranks: the terms of this
        rank's positions are added, in order, to rank q−1's partial sum (zeros on rank 0),
        which then goes on to rank q+1. Returns the full sum on the last rank, None elsewhere."""
        model, bk, layer = self.model, self.bk, self.topo.layer
        terms = []  # computed before waiting for the partial sum
        for k in self.positions:
            _, cache = model.step.step(cell, states[k], model.dt, xs[:, k, :], bk)
            terms.append(model.step.adjoint(cell, cache, lams[k + 1], model.dt, bk)[1])
        like = {k: bk.xp.zeros_like(cell[k]) for k in CELL_WEIGHTS}
        got = layer.recv_prev()
        partial = like if got is None else _unpack(got, like)
        for d in terms:
            for name in CELL_WEIGHTS:
                partial[name] += d[name]
        if self.q == self.last:
            return partial
        layer.send_next(_pack(partial))
        return None


def sequence_parallel_gradient(model: GRUModel, settings: LayerParallelSettings | None = None,
                               bk: Backend | str = "numpy", data_parallel: int = 1,
                               world=None) -> SequenceParallelGRU:
    """The trainer's gradient callable for a GRU model over MPI: ``COMM_WORLD`` (or
    ``world``) split into ``data_parallel`` groups of sequence ranks (module docstring)."""
    topo = split_world(data_parallel, world)
    return SequenceParallelGRU(model, topo, settings, bk)

