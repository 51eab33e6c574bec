"""A staged network over MPI: ``--model conv-stages`` under ``mpiexec``, with batch norm,
pooling or strided transitions and spatial coarsening.

The engine (:mod:`.engine`) splits the N fine steps (ODE steps and transitions alike); the
chain is :func:`refbraid.stages.staged_layer_parallel_gradient`'s (staged steps Φ, packed
states, stage-wise cold start). What is the staged network's own:

* states change shape at transitions (S_i, :attr:`StagedNetwork.state_shapes`). Inside the
  solves every point is a packed row of its level (:mod:`refbraid.stages.packing`); the
  states fetched for the adjoint travel at the shape the state has at their point
  (``(B, *S_i)``) and are packed again on arrival;
* the fine adjoint step a+1 → a reads the FORWARD CACHE of fine step a, made by the owner of
  y[a] (every step is made where it starts): on the same rank when the backward blocks
  mirror the forward ones, else fetched from it;
* batch norm: the running statistics are updated once per step from the final fine sweep
  (:mod:`refbraid.stages.batchnorm`); each rank reads the statistics of the fine steps it
  made, the lists are gathered over the layer ranks, and every rank folds the same list into
  its model (``model.record_batch_stats``). With D > 1 groups a BN layer normalises with the
  statistics of the FULL batch (:mod:`.sync_batchnorm`), and the final sweep's statistics are
  combined over the groups: the gradient and the running statistics then match one process
  to round-off (the sums are regrouped), bit for bit with one group.

Parameters are replicated (:class:`~.engine.Replicated`: the owned-shard mode is not built for
staged networks); a checkpoint is the single-process format. Shape legend: N fine steps,
B_g shard, S_i the state shape at point i.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backends import Backend
from ..backends.host import host_float
from ..layer_parallel import LayerParallelSettings
from ..mgrit import Problem
from ..network import Params, group
from ..parallel.mpi import Topology
from ..parallel.ops import RowExchange
from ..stages.batchnorm import final_sweep_stats, has_batch_norm
from ..stages.layer_parallel import StagedAdjoint, StagedForward, stage_guesses
from ..stages.network import StagedNetwork, accumulate
from ..stages.network import forward as staged_forward
from ..stages.packing import PackedTransfer, Packing
from .engine import LayerRanks, Replicated, captured, host_backend
from .sync_batchnorm import combined_batch_stats, synchronised_backend


def staged_network_of(model) -> StagedNetwork | None:
    """The :class:`StagedNetwork` a training model trains (``model.net`` of a
    ``ConvStagesModel``, or the network itself), None for any other model."""
    if isinstance(model, StagedNetwork):
        return model
    net = getattr(model, "net", None)
    return net if isinstance(net, StagedNetwork) else None


@dataclass
class StagedMPIInfo:
    """What one distributed step reports besides loss and gradient: the BN statistics of the
    final fine sweep (every BN layer, gathered from all layer ranks, in fine-step order)."""

    batch_stats: list = field(default_factory=list)


class StagedChain:
    """The :class:`~refbraid.distributed.engine.Chain` of a staged network for one call:
    packed states, the stage-wise cold start, the forward caches of the boundary steps
    fetched for the adjoint, the final sweep's batch-norm statistics."""

    def __init__(self, g: StagedDistributedGradient, params: Params, pk: Packing):
        self.g, self.params, self.pk = g, params, pk
        s = g.settings
        self.transfers = (None, None) if s.spatial is None else \
            (PackedTransfer(pk, s.forward_transfer), PackedTransfer(pk, s.backward_transfer))
        self.phi = self.psi = self.adjoint_guess = None
        self.made, self.stats_here = {}, []

    def open(self, xs):
        return self.g.net.opening.forward(group(self.params, "opening"), xs, self.g.bk)

    def forward(self, y0) -> Problem:
        g, pk = self.g, self.pk
        self.phi = StagedForward(g.net, self.params, pk, g.step_bk)
        y_guess, self.adjoint_guess = stage_guesses(g.net, self.params, y0, g.step_bk)
        return Problem(self.phi, pk.pack(y0, 0), g.plan.n_layers, transfer=self.transfers[0],
                       guess=lambda i: pk.pack(y_guess(i), 0))

    def close(self, y_N, ys, weight: float):
        g, bk, net = self.g, self.g.bk, self.g.net
        missing = [a for a in g.made if a not in self.phi.caches]
        if missing:  # cannot happen: the last relaxation makes every fine step of the block
            raise RuntimeError(f"rank {g.q}: no forward cache of fine steps {missing[:8]}.")
        self.made = {a: self.phi.caches[a] for a in g.made}
        if g.batch_norm:
            self.stats_here = final_sweep_stats(net, self.made, bk, g.made)
        if g.sync_bn:  # the full batch's statistics (collective over the groups)
            self.stats_here = combined_batch_stats(self.stats_here, g.topo.data)
        if g.q != g.last:
            return 0.0, None, {}
        N, closing = g.plan.n_layers, group(self.params, "closing")
        logits, cache = net.closing.forward(closing, self.pk.unpack(y_N, 0, N), bk)
        loss, probs = bk.softmax_cross_entropy(logits, ys)
        dlogits = bk.softmax_cross_entropy_adjoint(probs, ys, weight)
        lam_N, dclose = net.closing.adjoint(closing, cache, dlogits, bk)
        return weight * host_float(loss), lam_N, {f"closing.{k}": v for k, v in dclose.items()}

    def adjoint(self, lam_N, states) -> Problem:
        g, pk = self.g, self.pk
        caches = {**self.made, **g.fetch_caches(self.made)}
        restriction = g.settings.spatial.restriction if g.settings.spatial else "average"
        self.psi = StagedAdjoint(g.net, self.params, pk, states, caches, g.step_bk, restriction)
        lam_guess = self.adjoint_guess(lam_N)
        return Problem(self.psi, pk.pack(lam_N, 0), g.plan.n_layers, direction="backward",
                       transfer=self.transfers[1], guess=lambda i: pk.pack(lam_guess(i), 0))

    def gradient(self, rows: list[int], bwd=None) -> Params:
        part = {k: np.zeros_like(v) for k, v in self.params.items()}  # full arrays: a world
        for grads in captured(self.psi.grads, rows, self.g.q).values():  # sum assembles them
            accumulate(part, grads)
        return part

    def open_adjoint(self, cache, lam0) -> Params:
        _, dopen = self.g.net.opening.adjoint(group(self.params, "opening"), cache,
                                              self.pk.unpack(lam0, 0, 0), self.g.bk)
        return {f"opening.{k}": v for k, v in dopen.items()}


class StagedDistributedGradient(Replicated, LayerRanks):
    """Layer-parallel (× data-parallel) gradient of a staged network on this rank.

    ``gradient(params, x, labels) -> (loss, grads, stats)``: every rank passes the same full
    parameters and the same full batch and gets the same loss and full gradient (module
    docstring). With a model holding BN running statistics, each call also updates them
    (once, on every rank, from the final fine sweep). Construction is collective.
    """

    def __init__(self, model, topology: Topology, settings: LayerParallelSettings | None = None,
                 bk: Backend | str = "numpy"):
        net = staged_network_of(model)
        if net is None:
            raise TypeError(f"`model` must be a StagedNetwork or a model with one as `.net` "
                            f"(ConvStagesModel), got {type(model).__name__}.")
        super().__init__(topology, settings, net.n_steps, host_backend(bk))
        self.model, self.net = model, net
        self.batch_norm = has_batch_norm(net)
        #: the backend of the staged steps: full-batch BN statistics over the groups (D > 1)
        self.sync_bn = self.batch_norm and topology.n_groups > 1
        self.step_bk = synchronised_backend(self.bk, topology.data) if self.sync_bn \
            else self.bk
        #: fine steps a → a+1 this rank makes in the forward solve: a in its block (each
        #: step is made by the owner of its start point)
        self.made = [int(a) for a in self.plan.owned_layers(self.q)]
        #: the plan of the forward caches' exchange (caches are tuples of arrays and
        #: layers: they travel by ``alltoall`` on this plan, not through RowExchange's copies)
        self.caches_plan = RowExchange(topology.layer, self.made,
                                       sorted(set(self.grad_rows) - set(self.made)))

    def logits(self, params: Params, x):
        """The forward pass this gradient trains, in this process (evaluation mode): MGRIT's
        forward solve, or the sequential forward with one level (as one process)."""
        if isinstance(self.model, StagedNetwork):  # a bare network (no running statistics)
            return staged_forward(self.model, params, x, self.bk)[0]
        if self.settings.forward.levels == 1:
            return self.model.logits(params, x, self.bk)
        spatial = {"spatial": self.settings.spatial} if self.settings.spatial else {}
        return self.model.mgrit_logits(params, x, self.settings.forward, self.bk, **spatial)

    def __call__(self, params: Params, x, labels) -> tuple[float, Params, dict[str, float]]:
        """Full params in, the full gradient out (the same on every rank)."""
        xs, ys, weight = self.batch_share(x, labels)
        s = self.settings
        pk = Packing.build(self.net.state_shapes, xs.shape[0],
                           max(s.forward.levels, s.backward.levels), s.spatial)
        chain = StagedChain(self, params, pk)
        loss, part, stats = self.run(chain, xs, ys, weight, move=(
            lambda y, i: pk.unpack(y, 0, i), lambda y, i: pk.pack(y, 0)))
        t0 = time.perf_counter()
        grads = self.sum_world(part)
        record = getattr(self.model, "record_batch_stats", None)
        if self.batch_norm and record is not None:  # once per step, on every rank, the
            layer = self.topo.layer  # final sweep's statistics of all layer ranks in order
            info = StagedMPIInfo([st for part in layer.allgather(chain.stats_here)
                                  for st in part])
            record(info, self.bk)
        self.last_timings["assemble_s"] = time.perf_counter() - t0
        return loss, grads, stats

    def fetch_caches(self, made: dict[int, Any]) -> dict[int, Any]:
        """The forward caches of the fine steps whose adjoint this rank makes but another
        rank made the forward of (only where the backward blocks do not mirror the forward
        ones): maker → user."""
        plan, layer = self.caches_plan, self.topo.layer
        got = layer.alltoall([{a: made[a] for a in rows} if q != self.q else {}
                              for q, rows in enumerate(plan.send_to)])
        return {a: cache for part in got for a, cache in part.items()}
