"""The GRU models under MPI: MGRIT over the sequence positions, split over ranks.

The engine (:mod:`.engine`) splits the L positions as it splits layers; the chain is the
model's own (:meth:`refbraid.sequence.gru_model.GRUModel.layer_parallel_gradient`: h[0] = 0,
:class:`~refbraid.sequence.gru_model.GRUForward` and ``GRUAdjoint``, the classifier on h[L]).
What is the GRU's own is the tie: ONE cell weight θ serves every position, so::

    ∂L/∂θ = Σ_k (∂Φ(h[k]; k → k+1)/∂θ)ᵀ λ[k+1],  k = 0..L−1

rank q computes the terms of its positions k ∈ [b_q, b_{q+1}) (λ[k+1] fetched where the
adjoint blocks are not the forward ones shifted by one) and adds them, in order, to the partial
sum it receives from rank q−1 before passing it on: ((0 + t_0) + t_1) + … is the one-process
sum, so the result is bit-identical (a tree reduction would not be); the last rank broadcasts
Σ and ∂L/∂closing. Parameters are replicated (:class:`~.engine.Replicated`); one rank per
group with one MGRIT level (``--serial``) is backprop through time on the shard.

Shape legend: L sequence length (MGRIT steps), Q sequence ranks per group, H hidden size.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..backends import Backend
from ..errors import CollectiveError
from ..layer_parallel import LayerParallelSettings, as_settings
from ..mgrit import Problem, build_hierarchy
from ..network import Params, group
from ..parallel.mpi import Topology
from ..parallel.ops import Broadcast, RowExchange
from ..sequence.gru_model import CELL_WEIGHTS, GRUAdjoint, GRUModel
from ..sequence.losses import cross_entropy
from .engine import LayerRanks, Replicated, host_backend, pack, unpack
from .ownership import BlockPlan, Rows


class GRUChain:
    """The :class:`~refbraid.distributed.engine.Chain` of a GRU model for one call: the
    model's own forward problem (h[0] = 0), its classifier on h[L], its adjoint, and the
    shared cell weight's gradient summed in position order through the ranks."""

    def __init__(self, g: SequenceParallelGRU, params: Params, xs):
        self.g, self.params, self.xs = g, params, xs
        self.cell = group(params, "cell")
        self.states = self.closing_grads = None

    def open(self, xs):
        return None, None  # h[0] = 0 is the forward problem's own

    def forward(self, y0) -> Problem:
        return self.g.model.forward_problem(self.cell, self.xs, self.g.bk)

    def close(self, h_L, ys, weight: float):
        g, model, bk = self.g, self.g.model, self.g.bk
        if g.q != g.last:
            return 0.0, None, {}
        closing = group(self.params, "closing")
        logits, cache = model.closing.forward(closing, h_L, bk)
        loss, dlogits = cross_entropy(logits, ys, bk)
        if weight != 1.0:
            dlogits = dlogits * weight
        lam_L, self.closing_grads = model.closing.adjoint(closing, cache, dlogits, bk)
        return weight * float(loss), lam_L, {}

    def adjoint(self, lam_L, states: Rows) -> Problem:
        self.states = states
        return Problem(step=GRUAdjoint(self.g.model, self.cell, self.xs, states, self.g.bk),
                       u0=lam_L, n_steps=self.g.model.seq_len, direction="backward")

    def gradient(self, rows: list[int], bwd) -> Params:
        """Σ over all positions (:meth:`SequenceParallelGRU.ordered_sum`) and the head's
        gradient, packed on the last rank and broadcast: the full gradient on every rank."""
        g = self.g
        lams = dict(zip((int(i) for i in bwd.fine_indices), bwd.solution, strict=True))
        lam_next = Rows("λ", g.q, g.lams_x.forward({i: lams[i] for i in g.lam_owned}))
        dcell = g.ordered_sum(self.cell, self.xs, self.states, lam_next)
        names = sorted(self.params)  # one packing order on every rank
        total = None
        if g.q == g.last:
            full = {**{f"cell.{k}": dcell[k] for k in CELL_WEIGHTS},
                    **{f"closing.{k}": v for k, v in self.closing_grads.items()}}
            total = pack({k: full[k] for k in names})
        return unpack(g.bcast_grads.forward(total),
                      {k: np.zeros_like(self.params[k]) for k in names})

    def open_adjoint(self, cache, lam0) -> Params:
        return {}


class SequenceParallelGRU(Replicated, LayerRanks):
    """MGRIT-over-the-sequence (× data-parallel) gradient of a GRU model on this rank.

    ``gradient(params, x, labels) -> (loss, grads, stats)``: every rank passes the same full
    parameters and batch and gets the same loss and full gradient. Construction is collective.
    """

    __name__ = "sequence-parallel-mpi"

    def __init__(self, model: GRUModel, topology: Topology,
                 settings: LayerParallelSettings | None = None, bk: Backend | str = "numpy"):
        if not isinstance(model, GRUModel):
            raise TypeError(f"`model` must be a GRUModel, got {type(model).__name__}.")
        bk = host_backend(bk)
        settings = as_settings(settings)
        Q, L = topology.layer.size, model.seq_len
        if Q > 1 and 1 in (settings.forward.levels, settings.backward.levels):
            raise CollectiveError(f"one MGRIT level (--serial or --levels 1) is a sequential "
                                  f"sweep over the {L} positions: it cannot be split over {Q} "
                                  f"sequence ranks; use `--data-parallel` equal to the number "
                                  f"of MPI ranks, or two or more levels.")
        try:
            plan = BlockPlan.build(L, settings, Q)
        except ValueError as err:  # the same on every rank: worded for the sequence
            f = settings.forward
            K = len(build_hierarchy(L, f.cfactors, f.min_coarse).coarsest.points) - 1
            s = "" if K == 1 else "s"
            raise type(err)(f"sequence-parallel GRU: {Q} ranks per data-parallel group exceed "
                            f"the {K} coarsest interval{s} of the MGRIT grid over the {L} "
                            f"sequence positions (every rank needs at least one); use at most "
                            f"{K} rank{s} per group (more groups: --data-parallel), fewer "
                            f"levels or a smaller cfactor.") from None
        super().__init__(topology, settings, L, bk, plan)
        self.model = model
        self.positions = [k for k in self.y_owned if k < L]  # gradient terms made here
        self.lam_owned = plan.backward_points(self.q)
        self.lams_x = RowExchange(topology.layer, self.lam_owned,
                                  [k + 1 for k in self.positions])
        self.bcast_grads = Broadcast(topology.layer, root=self.last)

    def logits(self, params: Params, x):
        """Logits of the MGRIT forward this gradient trains, computed in this process (the
        numbers of the distributed forward solve): the trainer's evaluation hook."""
        if self.settings.forward.levels == 1:
            return self.model.logits(params, x, self.bk)
        return self.model.mgrit_logits(params, x, self.settings.forward, self.bk)

    def __call__(self, params: Params, x, labels) -> tuple[float, Params, dict[str, float]]:
        t_start = time.perf_counter()
        self.model._check(params, x)
        xs, ys, weight = self.batch_share(x, labels)
        if self.sequential:  # one rank per group, one level: backprop through time
            loss, grads, _ = self.model.backprop(params, xs, ys, self.bk)
            loss, grads, stats = self.backprop_share(loss, grads, weight)
        else:
            loss, grads, stats = self.run(GRUChain(self, params, xs), xs, ys, weight)
        grads = self.sum_groups(grads)  # Σ over the groups' shards (round-off vs one process)
        self.last_timings["gradient_s"] = time.perf_counter() - t_start
        return loss, {k: grads[k] for k in params}, stats

    def ordered_sum(self, cell, xs, states: Rows, lams: Rows) -> dict[str, Any] | None:
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
        partial = like if got is None else unpack(got, like)
        for d in terms:
            for name in CELL_WEIGHTS:
                partial[name] += d[name]
        if self.q == self.last:
            return partial
        layer.send_next(pack(partial))
        return None
