"""The layer-parallel gradient of a mixed (staged) network over MPI: ``--model conv-stages``
under ``mpiexec``, with batch norm, pooling or strided transitions and spatial coarsening.

Same mathematics as the single-process :func:`refbraid.stages.staged_layer_parallel_gradient`
(same staged steps Φ, packed states, stage-wise cold start, MGRIT solves); the ownership of
:class:`~refbraid.distributed.ownership.BlockPlan` over the N fine steps (ODE steps and
transitions alike) and the communicator are those of
:mod:`refbraid.distributed.network`::

    forward   y[0] = opening(x) on layer rank 0, broadcast; MGRIT forward solve: rank q
              holds y[i] for i in [b_q, b_{q+1}) and makes every fine step a → a+1 into its
              block (so its caches are those of the fine steps a with a+1 in its block)
              logits = closing(y[N]), L, λ[N] = closing'ᵀ ∂L/∂logits   on the last rank
    adjoint   λ[N] broadcast; MGRIT adjoint solve on the reversed grid, the fine adjoint step
              a+1 → a on the owner of λ[a]: it reads the FORWARD CACHE of fine step a
              (fetched from the owner of y[a+1] when that is another rank) and yields
              ∂L/∂θ of fine step a, as in one process; coarse adjoint steps recompute the
              forward from y[a] (fetched, at its own shape, from the owner of y[a])
    gradient  every row ∂L/∂θ_a is computed by exactly one rank; one world sum assembles
              the full gradient (x + 0 + … + 0 = x: with one data-parallel group the
              gradient is the single-process one BIT FOR BIT)

Messages and shapes. The state changes shape at transitions (S_i, :attr:`StagedNetwork.
state_shapes`). Inside the MGRIT solves every point is a packed row of its level (the state's
values, then zeros up to the level's longest state, :mod:`refbraid.stages.packing`), so the
solver's neighbour messages are packed rows; the states and forward caches fetched for the
adjoint travel at the shape the state has at that point (``(B, *S_i)``) and are packed again
on arrival.

Batch norm. Each BN step normalises with the statistics of the batch it sees; the running
statistics are updated once per training step from the caches of the final fine forward
sweep (:mod:`refbraid.stages.batchnorm`). Over MPI each rank reads the statistics of the fine
steps it made, the lists are gathered over the layer ranks, and every rank folds the same
list into its model's running statistics (``model.record_batch_stats``): every rank's model
then holds the running statistics one process would have, which is what evaluation and
checkpoints read. With data parallelism (D > 1) the D groups take contiguous batch shards
with weights B_g/B; a BN layer then normalises with the statistics of the FULL batch
(synchronised batch norm, :mod:`refbraid.distributed.sync_batchnorm`: one sum over the data
communicator inside every training-mode BN forward and adjoint), and the final sweep's
statistics are combined over the groups before the update. The gradient and the running
statistics then match one process to round-off (not bit for bit: the sums are regrouped).

Parameters are replicated: every rank holds all parameters and takes the same optimizer step
on the same assembled gradient (the replicated mode of :mod:`refbraid.distributed.network`;
the owned-shard mode of the ResNets is not built for staged networks). World rank 0 alone
evaluates and writes checkpoints (the trainer's hooks below), so a checkpoint is the
single-process format and resumes in one process and vice versa.

Shape legend: N fine steps, P world ranks, D groups, Q = P/D layer ranks, B batch, B_g shard,
S_i the state shape at point i, L_ℓ the packed length of level ℓ.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backends import Backend
from ..backends.host import host_float
from ..layer_parallel import LayerParallelSettings, as_settings
from ..mgrit import Problem, solve
from ..network import Params, group
from ..parallel.mpi import Topology, split_world
from ..parallel.ops import Broadcast, RowExchange
from ..stages.batchnorm import final_sweep_stats, has_batch_norm
from ..stages.layer_parallel import StagedAdjoint, StagedForward, stage_guesses
from ..stages.network import StagedNetwork, accumulate
from ..stages.network import forward as staged_forward
from ..stages.packing import PackedTransfer, Packing
from .engine import host_backend
from .network import _pack, _unpack, shard_sizes, solve_stats
from .ownership import BlockPlan
from .sync_batchnorm import combined_batch_stats, synchronised_backend


def staged_network_of(model) -> StagedNetwork | None:
    """The :class:`StagedNetwork` a training model trains (``model.net`` of a
    ``ConvStagesModel``, or the network itself), None for any other model."""
    if isinstance(model, StagedNetwork):
        return model
    net = getattr(model, "net", None)
    return net if isinstance(net, StagedNetwork) else None


class _Trajectory(dict):
    """``{i: packed y[i]}`` read as the adjoint reads a trajectory array: ``states[a, ...]``."""

    def __getitem__(self, key):
        index = key[0] if isinstance(key, tuple) else key
        if int(index) not in self:
            raise KeyError(f"no forward state y[{int(index)}] on this rank (it holds "
                           f"{sorted(self)}); the BlockPlan missed it.")
        return dict.__getitem__(self, int(index))


@dataclass
class StagedMPIInfo:
    """What one distributed step reports besides loss and gradient: the BN statistics of the
    final fine sweep (every BN layer, gathered from all layer ranks, in fine-step order)."""

    batch_stats: list = field(default_factory=list)


class StagedDistributedGradient:
    """Layer-parallel (× data-parallel) gradient of a staged network on this rank.

    ``gradient(params, x, labels) -> (loss, grads, stats)``: every rank passes the same full
    parameters and the same full batch and gets the same loss and full gradient (module
    docstring). With a model holding BN running statistics, each call also updates them
    (once, on every rank, from the final fine sweep). Construction is collective.
    """

    __name__ = "layer-parallel-mpi"

    def __init__(self, model, topology: Topology, settings: LayerParallelSettings | None = None,
                 bk: Backend | str = "numpy"):
        net = staged_network_of(model)
        if net is None:
            raise TypeError(f"`model` must be a StagedNetwork or a model with one as `.net` "
                            f"(ConvStagesModel), got {type(model).__name__}.")
        if not isinstance(topology, Topology):
            raise TypeError(f"`topology` must be a refbraid.parallel.mpi.Topology (from "
                            f"split_world), got {type(topology).__name__}.")
        self.bk = host_backend(bk)
        self.batch_norm = has_batch_norm(net)
        #: the backend of the staged steps: full-batch BN statistics over the groups (D > 1)
        self.sync_bn = self.batch_norm and topology.n_groups > 1
        self.step_bk = synchronised_backend(self.bk, topology.data) if self.sync_bn \
            else self.bk
        self.model, self.net, self.topo = model, net, topology
        self.settings = as_settings(LayerParallelSettings() if settings is None else settings)
        self.plan = BlockPlan.build(net.n_steps, self.settings, topology.layer.size)
        p, q, layer = self.plan, topology.layer.rank, topology.layer
        self.q, self.last = q, layer.size - 1
        self.y_owned = [int(i) for i in p.forward_points(q)]
        #: fine steps a → a+1 this rank makes in the forward solve: a+1 in its block
        self.made = [i - 1 for i in self.y_owned if i > 0]
        self.grad_rows = [int(a) for a in p.gradient_rows(q)]
        state_in = sorted(set(int(i) for i in p.backward_rows(q)) - set(self.y_owned))
        self.states_x = RowExchange(layer, self.y_owned, state_in)  # collective
        #: the plan of the forward caches' exchange (caches are tuples of arrays and
        #: layers: they travel by ``alltoall`` on this plan, not through RowExchange's copies)
        self.caches_plan = RowExchange(layer, self.made, sorted(set(self.grad_rows) -
                                                                set(self.made)))
        self.bcast_y0 = Broadcast(layer, root=0)
        self.bcast_lam = Broadcast(layer, root=self.last)
        self.last_solves: dict[str, Any] = {}
        self.last_timings: dict[str, float] = {}

    @property
    def is_root(self) -> bool:
        """World rank 0: the rank that evaluates, prints and writes files."""
        return self.topo.is_root

    # -- the trainer's hooks (refbraid.training.trainer.fit): rank 0 evaluates and writes ----
    def localize(self, state) -> None:
        """Parameters stay replicated: nothing to shard."""

    def gather_params(self, params: Params, root: int = 0) -> Params | None:
        """The full parameters on world rank ``root`` (every rank holds them), None elsewhere."""
        return params if self.topo.world.rank == root else None

    def gather_optimizer(self, optimizer, params, root: int = 0):
        return optimizer if self.topo.world.rank == root else None

    def share(self, value: Any, root: int = 0) -> Any:
        """World rank ``root``'s ``value`` on every rank. Collective."""
        return self.topo.world.bcast(value, root)

    def logits(self, params: Params, x):
        """The forward pass this gradient trains, in this process (evaluation mode): MGRIT's
        forward solve, or the sequential forward with one level (as one process)."""
        if isinstance(self.model, StagedNetwork):  # a bare network (no running statistics)
            return staged_forward(self.model, params, x, self.bk)[0]
        if self.settings.forward.levels == 1:
            return self.model.logits(params, x, self.bk)
        spatial = {"spatial": self.settings.spatial} if self.settings.spatial else {}
        return self.model.mgrit_logits(params, x, self.settings.forward, self.bk, **spatial)

    # -- the gradient -------------------------------------------------------------------
    def __call__(self, params: Params, x, labels) -> tuple[float, Params, dict[str, float]]:
        """Full params in, the full gradient out (the same on every rank)."""
        loss, part, stats, info = self._gradient(params, x, labels)
        t0 = time.perf_counter()
        grads = _unpack(self.topo.world.sum_to_all(_pack(part)), part)
        record = getattr(self.model, "record_batch_stats", None)
        if self.batch_norm and record is not None:  # once per step, on every rank
            record(info, self.bk)
        self.last_timings["assemble_s"] = time.perf_counter() - t0
        return loss, grads, stats

    def _shard_batch(self, x, labels):
        sizes = shard_sizes(x.shape[0], self.topo.n_groups)
        lo = sum(sizes[: self.topo.group])
        hi = lo + sizes[self.topo.group]
        return x[lo:hi], labels[lo:hi], sizes[self.topo.group] / x.shape[0]

    def _fetch_caches(self, made: dict[int, Any]) -> dict[int, Any]:
        """The forward caches of the fine steps whose adjoint this rank makes but another
        rank made the forward of (the step into a block's first point): owner → user."""
        plan, layer = self.caches_plan, self.topo.layer
        got = layer.alltoall([{a: made[a] for a in rows} if q != self.q else {}
                              for q, rows in enumerate(plan.send_to)])
        return {a: cache for part in got for a, cache in part.items()}

    def _gradient(self, params: Params, x, labels):
        """Both solves; returns (loss, this rank's part of the gradient as full zero-filled
        arrays, solver stats, StagedMPIInfo)."""
        net, bk, s, layer = self.net, self.bk, self.settings, self.topo.layer
        t_start = time.perf_counter()
        xs, ys, weight = self._shard_batch(x, labels)
        N = net.n_steps
        pk = Packing.build(net.state_shapes, xs.shape[0], max(s.forward.levels,
                                                              s.backward.levels), s.spatial)
        fwd_transfer = bwd_transfer = None
        if s.spatial is not None:
            fwd_transfer = PackedTransfer(pk, s.forward_transfer)
            bwd_transfer = PackedTransfer(pk, s.backward_transfer)
        y0 = open_cache = None
        if self.q == 0:
            y0, open_cache = net.opening.forward(group(params, "opening"), xs, bk)
        y0 = self.bcast_y0.forward(y0)
        step_bk = self.step_bk  # the staged steps' (BN synchronised over the groups)
        forward = StagedForward(net, params, pk, step_bk)
        y_guess, adjoint_guess = stage_guesses(net, params, y0, step_bk)
        fwd = solve(Problem(forward, pk.pack(y0, 0), N, transfer=fwd_transfer,
                            guess=lambda i: pk.pack(y_guess(i), 0)), s.forward, comm=layer,
                    layout=self.plan.forward_layout)
        states = _Trajectory(zip((int(i) for i in fwd.fine_indices), fwd.solution, strict=True))
        missing = [a for a in self.made if a not in forward.caches]
        if missing:  # cannot happen: the last relaxation makes every fine step of the block
            raise RuntimeError(f"rank {self.q}: no forward cache of fine steps {missing[:8]}.")
        made = {a: forward.caches[a] for a in self.made}
        stats_here = final_sweep_stats(net, made, bk, self.made) if self.batch_norm else []
        if self.sync_bn:  # the full batch's statistics (collective over the groups)
            stats_here = combined_batch_stats(stats_here, self.topo.data)
        part = {k: np.zeros_like(v) for k, v in params.items()}
        lam_N, loss_part = None, 0.0
        if self.q == self.last:
            closing = group(params, "closing")
            logits, close_cache = net.closing.forward(closing, pk.unpack(states[N], 0, N), bk)
            loss, probs = bk.softmax_cross_entropy(logits, ys)
            dlogits = bk.softmax_cross_entropy_adjoint(probs, ys, weight)
            lam_N, dclose = net.closing.adjoint(closing, close_cache, dlogits, bk)
            part.update({f"closing.{k}": v for k, v in dclose.items()})
            loss_part = weight * host_float(loss)
        lam_N = self.bcast_lam.forward(lam_N)
        # states and caches for the adjoint, each at the shape of its point
        fetched = self.states_x.forward({i: pk.unpack(states[i], 0, i) for i in self.y_owned})
        states.update({i: pk.pack(y, 0) for i, y in fetched.items()})
        caches = {**made, **self._fetch_caches(made)}
        restriction = s.spatial.restriction if s.spatial else "average"
        adjoint = StagedAdjoint(net, params, pk, states, caches, step_bk, restriction)
        lam_guess = adjoint_guess(lam_N)
        bwd = solve(Problem(adjoint, pk.pack(lam_N, 0), N, direction="backward",
                            transfer=bwd_transfer, guess=lambda i: pk.pack(lam_guess(i), 0)),
                    s.backward, comm=layer, layout=self.plan.backward_layout)
        missing = [a for a in self.grad_rows if a not in adjoint.grads]
        if missing:  # cannot happen: the final relaxation makes every fine adjoint step
            raise RuntimeError(f"rank {self.q}: no captured gradient for steps {missing[:8]}.")
        for a in self.grad_rows:
            accumulate(part, adjoint.grads[a])
        if self.q == 0:
            lam0 = bwd.solution[list(bwd.fine_indices).index(0)]
            _, dopen = net.opening.adjoint(group(params, "opening"), open_cache,
                                           pk.unpack(lam0, 0, 0), bk)
            part.update({f"opening.{k}": v for k, v in dopen.items()})
        batch_stats = []
        if self.batch_norm:  # every layer rank's part of the final sweep, in fine-step order
            batch_stats = [st for rank_stats in layer.allgather(stats_here) for st in rank_stats]
        self.last_solves = {"forward": fwd, "backward": bwd}
        world = self.topo.world
        loss_total = world.allreduce_sum(loss_part)
        stats = solve_stats(fwd, bwd, world, copies=self.topo.n_groups)
        self.last_timings = {"fwd_s": fwd.solve_seconds, "bwd_s": bwd.solve_seconds,
                             "gradient_s": time.perf_counter() - t_start}
        return loss_total, part, stats, StagedMPIInfo(batch_stats)


def staged_distributed_gradient(model, settings: LayerParallelSettings | None = None,
                                bk: Backend | str = "numpy", data_parallel: int = 1,
                                world=None) -> StagedDistributedGradient:
    """The trainer's gradient callable for a staged model over MPI: ``COMM_WORLD`` (or
    ``world``) split into ``data_parallel`` groups of layer ranks (module docstring). Raises
    the same error on every rank for a split or a combination that is not supported."""
    topo = split_world(data_parallel, world)
    return StagedDistributedGradient(model, topo, settings, bk)
