"""The distributed engine: one layer-parallel gradient, its steps split over MPI ranks.

Same mathematics as one process (:mod:`refbraid.layer_parallel`: the same propagators, the
same MGRIT solves, the same per-step gradient formula); only the ownership and the
communicator change. This module writes them once, for every model family::

    forward   y[0] = open(x)  on layer rank 0, broadcast (the solve's u0)
              MGRIT forward solve: rank q holds y[i] for i in its block [b_q, b_{q+1})
              out = close(y[N]), L, λ[N] = close'ᵀ ∂L/∂out          on the last layer rank
    adjoint   λ[N] broadcast;  MGRIT adjoint solve on the reversed grid
    gradient  ∂L/∂θ_a = (∂Φ_a/∂θ_a)ᵀ λ[a+1] at y[a]: the fine adjoint step a+1 → a, taken
              by the owner of λ[a+1] in the solve's last relaxation; rows go home
              ∂L/∂θ_open = open'ᵀ λ[0]  on layer rank 0

Ownership (:class:`~refbraid.distributed.ownership.BlockPlan`, no MPI there). Rank q owns the
steps (weights θ_n, states y[n]) of its forward block [b_q, b_{q+1}); blocks start at
coarsest-grid points. What it needs from others travels through
:class:`refbraid.parallel.ops.RowExchange` (linear operators with adjoints):

* every step is made by the rank that owns its start point (:mod:`refbraid.parallel.layout`;
  a step across a block boundary sends its result on): a forward step from t_a uses θ_a, an
  adjoint step a+m → a uses θ_a and y[a]. The backward blocks mirror the forward ones when
  the grids allow it (rank q then owns λ[i] for i in (b_q, b_{q+1}]), and then every rank
  applies its own layers only, both ways: no ghost weight, no state and no gradient row
  crosses ranks;
* otherwise (backward grids that cannot mirror the forward blocks) ghost weights and states
  come in, and the gradient rows of layers computed elsewhere go home by the ADJOINT of the
  RowExchange that fetched them (DistDL: the adjoint of a halo fetch adds the halos back
  into their owners).

Data parallelism (:func:`refbraid.parallel.mpi.split_world`): D groups of Q = P/D layer ranks;
group g takes the contiguous shard of B_g samples of every batch, and its loss and λ[N] are
scaled by B_g/B (S_g/S for per-token labels, S the tokens scored), so summing over groups gives
the mean over the full batch. MGRIT's residual norms are reduced over the whole world, so every
group stops exactly when one process would. The space communicator (data × space × depth,
:mod:`.space`) splits every state once more, over S ranks that run the same solves.

Parameters, two modes. Replicated: every rank holds all parameters, computes the gradient
rows it owns, and one sum over the world assembles the full gradient (x + 0 + … + 0 = x: with
one group, bit for bit one process's); every rank then takes the same optimizer step.
Sharded (:mod:`.sharded`): each rank holds only its rows (plus the opening on layer rank 0 and
the closing on the last), fetches ghosts each step, sends rows home, and sums its gradient over
its block's data-parallel group only.

What a model family brings is a :class:`Chain` (its steps, its ends, what ties its blocks):
docs/architecture.md shows the protocol and a worked adapter. Shapes: N steps, P ranks,
D groups, Q = P/D layer ranks, B batch, B_g shard.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ..backends import Backend, get_backend
from ..backends.host import to_host
from ..backends.portable import namespace, zeros_on
from ..errors import CollectiveError
from ..layer_parallel import LayerParallelSettings, as_settings
from ..mgrit import Problem, solve
from ..network import Params, group, row, set_row
from ..parallel.mpi import Topology
from ..parallel.ops import Broadcast, RowExchange
from ..sequence.losses import IGNORE
from .ownership import BlockPlan, Rows

#: what trains on device arrays under mpiexec (error messages and docs/gpu.md say the same)
DEVICE_RESIDENT_MPI = ("the models whose one Network DistributedGradient distributes: resnet, "
                       "conv, transformer, gpt-untied (sharded or replicated; not with "
                       "--space-parallel, DASO, --bias-control or --mgopt-levels)")


# ----------------------------------------------------------------------------- the protocol
class Chain(Protocol):
    """What one model family brings to the engine for one gradient (built per call, on the
    rank's parameters and batch shard). Everything else is :class:`LayerRanks`'."""

    def open(self, xs) -> tuple[Any, Any]:
        """(y[0], cache) from the shard ``xs``; called on layer rank 0 only (a chain whose
        problem brings its own y[0] returns (None, None))."""

    def forward(self, y0) -> Problem:
        """The forward MGRIT problem from y[0] (its step keeps what the adjoint reuses)."""

    def close(self, y_N, ys, weight: float) -> tuple[float, Any, Params]:
        """(weighted loss, λ[N], closing gradients) on the last layer rank; called on every
        layer rank with ``y_N`` None off the last (so it may be collective)."""

    def adjoint(self, lam_N, states: Rows) -> Problem:
        """The adjoint MGRIT problem from λ[N], reading the states y[i] this rank holds."""

    def gradient(self, rows: list[int], bwd) -> Params:
        """This rank's gradient part after the adjoint solve ``bwd``: ``{"steps.k": {a: row}}``
        for its gradient ``rows``, or whole arrays where the family ties its steps (a weight
        shared by every step, summed in step order)."""

    def open_adjoint(self, cache, lam0) -> Params:
        """The opening's gradients from λ[0]; called on layer rank 0 only."""


# ----------------------------------------------------------------------------- the engine
class WorldHooks:
    """What the trainer (:func:`refbraid.training.trainer.fit`) asks of every MPI gradient
    besides the gradient: which rank is the root, and the root's values on every rank."""

    world: Any  # the MPIComm of all ranks that train together

    @property
    def is_root(self) -> bool:
        """World rank 0: the rank that evaluates, prints and writes files."""
        return self.world.rank == 0

    def share(self, value: Any, root: int = 0) -> Any:
        """World rank ``root``'s ``value`` on every rank. Collective."""
        return self.world.bcast(value, root)


class LayerRanks(WorldHooks):
    """The engine on this rank: topology, MGRIT settings, the BlockPlan over ``n_steps``, the
    broadcasts of y[0] and λ[N], the state exchange of the adjoint, the batch share, the
    solve statistics. A family's gradient derives from it and supplies a :class:`Chain`."""

    __name__ = "layer-parallel-mpi"

    def __init__(self, topology: Topology, settings: LayerParallelSettings | None,
                 n_steps: int, bk: Backend, plan: BlockPlan | None = None):
        if not isinstance(topology, Topology):
            raise TypeError(f"`topology` must be a refbraid.parallel.mpi.Topology (from "
                            f"split_world), got {type(topology).__name__}.")
        self.topo, self.world, self.bk = topology, topology.world, bk
        self.settings = as_settings(settings)
        self.plan = BlockPlan.build(n_steps, self.settings, topology.layer.size) \
            if plan is None else plan
        p, layer = self.plan, topology.layer
        self.q, self.last = layer.rank, layer.size - 1
        self.y_owned = [int(i) for i in p.forward_points(self.q)]
        self.grad_rows = [int(a) for a in p.gradient_rows(self.q)]
        self.states_x = RowExchange(layer, self.y_owned,  # collective
                                    sorted(set(int(i) for i in p.backward_rows(self.q))
                                           - set(self.y_owned)))
        self.bcast_y0 = Broadcast(layer, root=0)
        self.bcast_lam = Broadcast(layer, root=self.last)
        self.copies = topology.n_groups  # copies of the network that run (phi_calls)
        #: one layer rank and one MGRIT level both ways: a group's gradient is backprop
        self.sequential = layer.size == 1 and self.settings.forward.levels == 1 \
            and self.settings.backward.levels == 1
        self.last_solves: dict[str, Any] = {}  # this rank's MGRIT records of the last call
        self.last_timings: dict[str, float] = {}  # and its seconds per phase

    def batch_share(self, x, labels, tokens: bool | None = None):
        """(this group's samples, its labels, its weight in the mean loss): B_g/B, or S_g/S
        for per-token labels (S = tokens scored, i.e. not IGNORE; ``tokens`` None: labels
        with more than one axis are per token)."""
        sizes = shard_sizes(x.shape[0], self.topo.n_groups)
        lo = sum(sizes[: self.topo.group])
        hi = lo + sizes[self.topo.group]
        if not (labels.ndim > 1 if tokens is None else tokens):
            return x[lo:hi, ...], labels[lo:hi], sizes[self.topo.group] / x.shape[0]
        xp = namespace(labels)  # tokens scored per sample: B numbers through the host door
        scored = np.asarray(to_host(xp.sum(xp.astype(labels != IGNORE, labels.dtype), axis=1)))
        if not all(int(scored[sum(sizes[:g]):sum(sizes[:g + 1])].sum()) for g in
                   range(len(sizes))):
            raise ValueError("`--data-parallel`: a group's share of the batch scores no token "
                             "(all its labels are IGNORE); use fewer groups or larger batches.")
        return (x[lo:hi, ...], labels[lo:hi, ...],
                float(scored[lo:hi].sum()) / float(scored.sum()))

    def run(self, chain: Chain, xs, ys, weight: float, workspace=None,
            move: tuple[Callable, Callable] | None = None):
        """Both distributed solves of ``chain`` (module docstring). Returns (the world's loss,
        this rank's gradient part, stats). ``workspace``: the solves' kept arrays
        (:class:`~refbraid.mgrit.GradientWorkspace`); ``move = (out, in)`` converts a state
        ``(y, i)`` before and after it travels (a staged network's packed rows)."""
        t_start = time.perf_counter()
        s, plan, layer, N = self.settings, self.plan, self.topo.layer, self.plan.n_layers
        y0 = open_cache = None
        if self.q == 0:
            y0, open_cache = chain.open(xs)
        y0 = self.bcast_y0.forward(y0)
        fwd = solve(chain.forward(y0), s.forward, comm=layer, layout=plan.forward_layout,
                    workspace=None if workspace is None else workspace.forward)
        states = Rows("y", self.q, {int(i): row(fwd.solution, j)
                                    for j, i in enumerate(fwd.fine_indices)})
        loss_part, lam_N, close_grads = chain.close(states.get(N), ys, weight)
        lam_N = self.bcast_lam.forward(lam_N)
        out, back = move or (lambda y, i: y, lambda y, i: y)
        fetched = self.states_x.forward({i: out(states[i], i) for i in self.y_owned})
        states.update({i: back(y, i) for i, y in fetched.items()})
        bwd = solve(chain.adjoint(lam_N, states), s.backward, comm=layer,
                    layout=plan.backward_layout,
                    workspace=None if workspace is None else workspace.backward)
        part = chain.gradient(self.grad_rows, bwd)
        part.update(close_grads)
        if self.q == 0:
            lam0 = row(bwd.solution, list(bwd.fine_indices).index(0))
            part.update(chain.open_adjoint(open_cache, lam0))
        self.last_solves = {"forward": fwd, "backward": bwd}
        loss = self.world.allreduce_sum(loss_part)
        stats = solve_stats(fwd, bwd, self.world, copies=self.copies)
        self.last_timings = {"fwd_s": fwd.solve_seconds, "bwd_s": bwd.solve_seconds,
                             "gradient_s": time.perf_counter() - t_start}
        return loss, part, stats

    def backprop_share(self, loss, grads: Params, weight: float):
        """Pure data parallelism (one layer rank, one MGRIT level: :attr:`sequential`): the
        world's loss and this group's part from its backprop on its shard, both weighted
        B_g/B (``weight`` 1 for a seed already weighted); the counts of a 1-level solve pair."""
        if weight != 1.0:
            grads = {k: v * weight for k, v in grads.items()}
        self.last_solves = {}
        n = 2.0 * self.plan.n_layers  # N forward + N adjoint steps
        return self.world.allreduce_sum(weight * loss), grads, {"phi_calls": n,
                                                                 "rank_phi_calls": n}

    def assemble(self, part: dict[str, Any], params: Params) -> Params:
        """Replicated mode's full gradient on every rank: this rank's ``part`` written into
        zeros shaped as ``params`` (:func:`place_rows`), summed over the world."""
        return self.sum_world(place_rows({k: zeros_on(v, v.shape) for k, v in params.items()},
                                         part))

    def sum_world(self, grads: Params) -> Params:
        """Replicated mode's assembly: Σ over every rank of the zero-filled parts (one
        message; the same bits on every rank)."""
        return unpack(self.world.sum_to_all(pack(grads)), grads)

    def sum_groups(self, grads: Params) -> Params:
        """Σ over the data-parallel groups (every group's gradient of the same shard)."""
        if self.topo.n_groups > 1:
            grads = unpack(self.topo.data.sum_to_all(pack(grads)), grads)
        return grads


class Replicated(WorldHooks):
    """The trainer's hooks (:func:`refbraid.training.trainer.fit`) of a gradient whose
    parameters every rank holds whole: nothing to shard, and only world rank ``root`` gets
    them back, so only it evaluates and writes checkpoints (the single-process format)."""

    def localize(self, state) -> None:
        """Nothing to cut: every rank keeps all parameters and optimizer state."""

    def shard(self, full: Params) -> Params:
        """This rank's part of full arrays: all of them."""
        return full

    def gather_params(self, params: Params, root: int = 0) -> Params | None:
        """The full parameters on world rank ``root`` (already there), None elsewhere."""
        return params if self.world.rank == root else None

    def gather_optimizer(self, optimizer, params: Params | None, root: int = 0):
        """The optimizer (state of all parameters) on world rank ``root``, None elsewhere."""
        return optimizer if self.world.rank == root else None


# ----------------------------------------------------------------------------- pieces
def host_backend(bk: Backend | str, what: str = "this MPI gradient") -> Backend:
    """``get_backend(bk)``, refused (on every rank alike) unless it computes on NumPy arrays
    (every family but the plain networks, which train on device arrays too)."""
    backend = get_backend(bk)
    if backend.xp is not np:
        raise CollectiveError(
            f"`bk`: {what} handles host (NumPy) arrays only; backend {backend.name!r} keeps "
            f"them on a device. Device-resident MPI training covers {DEVICE_RESIDENT_MPI}. "
            f"Use numpy or numba (`refbraid train --backend cuda` runs this model's kernels "
            f"in host-array mode under mpiexec).")
    return backend


def shard_sizes(batch: int, n_groups: int) -> list[int]:
    """Contiguous shard sizes: B // D each, one more for the first B % D groups."""
    if batch < n_groups:
        raise ValueError(f"`x`: a batch of {batch} samples cannot be split over "
                         f"{n_groups} data-parallel groups; use a batch of at least {n_groups}.")
    return [batch // n_groups + (1 if g < batch % n_groups else 0) for g in range(n_groups)]


def solve_stats(fwd, bwd, world, copies: int) -> dict[str, float]:
    """The keys of LayerParallelInfo.stats() for one distributed gradient, and this rank's
    share of the work. ``phi_calls`` counts one copy of the network: the step applications
    of all ranks (a collective sum) divided by the ``copies`` of it that ran (data-parallel
    groups, times space ranks where each applies every step to its part of the state)."""
    steps_here = fwd.total_steps + bwd.total_steps
    return {
        "fwd_res": float(fwd.norms[-1]),
        "fwd_iters": float(fwd.iterations),
        "bwd_res": float(bwd.norms[-1]),
        "bwd_iters": float(bwd.iterations),
        "phi_calls": world.allreduce_sum(steps_here) / copies,
        "rank_phi_calls": float(steps_here),
    }


def pack(arrays: dict[str, Any]):
    """All arrays as one flat vector where they live (one message, not one per key)."""
    if not arrays:
        return np.zeros(0)
    xp = namespace(next(iter(arrays.values())))
    return xp.concat([xp.reshape(a, (-1,)) for a in arrays.values()])


def unpack(flat, like: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`pack`: arrays shaped (and typed) as ``like``'s."""
    xp, out, o = namespace(flat), {}, 0
    for k, v in like.items():
        size = int(np.prod(v.shape))
        part = xp.reshape(flat[o : o + size], tuple(v.shape))
        out[k] = part if part.dtype == v.dtype else xp.astype(part, v.dtype)
        o += size
    return out


def steps_key(key: str) -> bool:
    """Whether ``key`` (``[buffer/]name``) names a row-stacked parameter ``steps.*``."""
    return key.rpartition("/")[2].startswith("steps.")


def gather_shards(topology, shard: dict[str, Any], root: int = 0,
                  is_rows: Callable[[str], bool] = steps_key) -> dict[str, Any] | None:
    """Full arrays on world rank ``root`` (None elsewhere) from group 0's shards, in layer-rank
    order: keys with ``is_rows(key)`` (and at least one axis) are concatenated along their rows,
    the others are taken from the first shard that has them. Collective over the world."""
    parts = topology.world.gather(shard if topology.group == 0 else None, root=root)
    if parts is None:
        return None
    parts = [s for s in parts if s is not None]  # group 0, in layer-rank order
    full: dict[str, Any] = {}
    for k in sorted({k for s in parts for k in s}):
        have = [s[k] for s in parts if k in s]
        rows = is_rows(k) and len(getattr(have[0], "shape", ())) > 0
        full[k] = namespace(have[0]).concat(have, axis=0) if rows else have[0]
    return full


def replicated_rows(plan, q: int, params: Params) -> dict[str, Rows]:
    """Replicated mode: the rows of ``steps.*`` that layer rank ``q`` reads
    (``plan.weight_rows(q)``), taken from the full ``params``."""
    need = plan.weight_rows(q)
    return {k: Rows(f"steps.{k}", q, {int(n): row(v, int(n)) for n in need})
            for k, v in group(params, "steps").items()}


def captured(grads: dict[int, Any], rows: list[int], rank: int) -> dict[int, Any]:
    """The gradients ``grads[a]`` a capturing adjoint made for the ``rows`` (RuntimeError
    naming the missing ones, which cannot happen: the solve's final relaxation makes every
    fine adjoint step of the rank's block)."""
    missing = [a for a in rows if a not in grads]
    if missing:
        raise RuntimeError(f"rank {rank}: no captured gradient for steps {missing[:8]}.")
    return {a: grads[a] for a in rows}


def place_rows(grads: Params, part: dict[str, Any]) -> Params:
    """``grads`` (zeros) with a rank's gradient ``part`` written in: a dict of rows (the rows
    this rank computed, wherever they are owned) row by row, a whole array as it is."""
    for k, v in part.items():
        if isinstance(v, dict):
            for a, r in v.items():
                set_row(grads[k], a, r)
        else:
            grads[k][...] = v
    return grads
