"""The layer-parallel gradient over MPI: layers distributed over ranks, batches over groups.

Same mathematics as :mod:`refbraid.layer_parallel` (same propagators, same MGRIT
solves, same per-layer gradient formula); only the communicator and the ownership change::

    forward   y[0] = opening(x)  on layer rank 0, broadcast (the solve's u0)
              MGRIT forward solve: rank q holds y[i] for i in its block [b_q, b_{q+1})
              logits = closing(y[N]), L, λ[N] = closing'ᵀ ∂L/∂logits   on the last rank
    adjoint   λ[N] broadcast;  MGRIT adjoint solve on the reversed grid
    gradient  ∂L/∂θ_a = (∂Φ_a/∂θ_a)ᵀ λ[a+1] at y[a]: the fine adjoint step a+1 → a,
              taken by the owner of λ[a] in the solve's last relaxation; rows go home
              ∂L/∂θ_open = opening'ᵀ λ[0]  on layer rank 0

Ownership (:class:`~refbraid.distributed.ownership.BlockPlan`). Rank q owns the layers
(weights θ_n, states y[n]) of its forward block [b_q, b_{q+1}); the blocks start at
coarsest-grid points. What it needs from others travels through
:class:`refbraid.parallel.ops.RowExchange` (linear operators with adjoints):

* forward ghost weights: a coarse step from t_a to t_{a+m} uses θ_a (injection), and the step
  into the block's first point starts on the previous block: θ at the last point of the
  previous block on every level (always on rank q−1);
* adjoint ownership is shifted: the adjoint step a+m → a runs on the owner of λ[a] and needs
  θ_a and y[a]. The backward layout mirrors the forward one when the grids allow it (rank q
  then owns λ[i] for i in (b_q, b_{q+1}]) and the only extra rows are θ and y at b_{q+1},
  from rank q+1; otherwise the default backward partition is used and more rows move;
* gradient rows: the fine adjoint step a+1 → a is ``step.adjoint(θ_a, cache(y[a]), λ[a+1])``,
  which also yields ∂L/∂θ_a. As in one process
  (:mod:`refbraid.layer_parallel`), :class:`CapturingAdjoint` keeps it from the
  solve's last relaxation and :class:`CachingForward` supplies the forward caches of the final
  states, so no layer is evaluated twice. The row of
  the boundary layer b_{q+1} is computed on rank q and sent home to rank q+1 by the ADJOINT
  of a RowExchange whose forward would fetch those rows (DistDL: the adjoint of a halo fetch
  adds the halos back into their owners).

Data parallelism (:func:`refbraid.parallel.mpi.split_world`): D groups of Q = P/D ranks; group
g takes the contiguous shard of B_g samples of every batch, and its loss and λ[N] are scaled by
B_g/B, so summing over groups gives the mean over the full batch. MGRIT's residual norms are
reduced over the whole world, so every group stops exactly when one process would.

Parameter holding, two modes (documented honestly):

* replicated (:meth:`DistributedGradient.__call__`): every rank holds all parameters, computes
  the gradient rows it owns, and the full gradient is assembled by one sum over the world
  (bit-identical on every rank); the unchanged trainer then takes the same optimizer step on
  every rank. Simple, but each rank stores everything and the sum moves the whole gradient.
* sharded (:meth:`DistributedGradient.sharded`,
  :class:`~refbraid.distributed.sharded.ShardedTrainer`): each rank holds only its rows of
  ``steps.*`` (plus opening on layer rank 0, closing on the last), fetches ghost weights each
  step, and its optimizer updates only its shard; gradients are summed only over its block's
  data-parallel group; checkpoints gather the shards to world rank 0 (``refbraid train``).
Chained blocks and tied weights (encoder–decoder, tied GPT): refbraid.distributed.chained.

Both give the serial gradient (layer_parallel_gradient on the full batch) to round-off
(tests/mpi/test_distributed.py: ≤ 1e-12). Shapes: N layers, P ranks, D groups, Q = P/D
layer ranks, B batch, B_g shard, S state.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..backends import Backend, get_backend
from ..backends.host import host_float, to_host
from ..backends.portable import copy_of, namespace, zeros_on
from ..layer_parallel import (
    CachingForward,
    CapturingAdjoint,
    LayerParallelSettings,
    mgrit_forward,
)
from ..mgrit import GradientWorkspace, Problem, solve
from ..network import Network, Params, backprop, check_batch, group, row
from ..parallel.mpi import Topology, split_world
from ..parallel.ops import Broadcast, RowExchange
from ..sequence.block_gradient import block_backprop
from ..sequence.losses import IGNORE, cross_entropy
from .engine import gather_shards, place_rows, replicated_rows
from .ownership import BlockPlan, Rows


# ----------------------------------------------------------------------------- the gradient
def shard_sizes(batch: int, n_groups: int) -> list[int]:
    """Contiguous shard sizes: B // D each, one more for the first B % D groups."""
    if batch < n_groups:
        raise ValueError(f"`x`: a batch of {batch} samples cannot be split over "
                         f"{n_groups} data-parallel groups; use a batch of at least {n_groups}.")
    return [batch // n_groups + (1 if g < batch % n_groups else 0) for g in range(n_groups)]


class DistributedGradient:
    """Layer-parallel (× data-parallel) gradient on this rank of ``topology``.

    ``gradient(params, x, labels) -> (loss, grads, stats)`` (replicated parameters, the
    trainer's gradient signature) or ``gradient.sharded(shard, x, labels)`` (owned rows
    only). Every rank must call with the same full batch ``x, labels``; the result is the
    same on every rank. Construction is collective (it builds the message plans).
    """

    __name__ = "layer-parallel-mpi"

    def __init__(self, net: Network, topology: Topology,
                 settings: LayerParallelSettings | None = None, bk: Backend | str = "numpy"):
        if not isinstance(net, Network):
            raise TypeError(f"`net` must be a refbraid Network, got {type(net).__name__}.")
        if not isinstance(topology, Topology):
            raise TypeError(f"`topology` must be a refbraid.parallel.mpi.Topology (from "
                            f"split_world), got {type(topology).__name__}.")
        self.bk = get_backend(bk)
        if self.bk.xp is not np:  # device arrays travel as buffers (direct or staged)
            topology = topology.carrying(self.bk.asarray)
        self.net, self.topo = net, topology
        self.settings = LayerParallelSettings() if settings is None else settings
        self.plan = BlockPlan.build(net.n_layers, self.settings, topology.layer.size)
        #: one layer rank and one MGRIT level both ways: the group's gradient is backprop
        self.sequential = topology.layer.size == 1 and self.settings.forward.levels == 1 \
            and self.settings.backward.levels == 1
        q, layer = topology.layer.rank, topology.layer
        p = self.plan
        self.q, self.last = q, layer.size - 1
        self.owned = p.owned_layers(q)
        self.y_owned = p.forward_points(q)
        self.grad_rows = p.gradient_rows(q)
        weight_in = sorted(set(p.weight_rows(q)) - set(self.owned))
        state_in = sorted(set(p.backward_rows(q)) - set(self.y_owned))
        self.weights_x = RowExchange(layer, self.owned, weight_in)  # collective
        self.states_x = RowExchange(layer, self.y_owned, state_in)
        self.grads_x = RowExchange(layer, self.owned, self.grad_rows)  # used through .adjoint
        self.last_solves: dict[str, Any] = {}  # this rank's MGRIT records of the last call
        self.workspace = GradientWorkspace()  # reused by every call: last_solves' arrays too
        self.last_timings: dict[str, float] = {}  # and its seconds per phase
        self.bcast_y0 = Broadcast(layer, root=0)
        self.bcast_lam = Broadcast(layer, root=self.last)

    @property
    def is_root(self) -> bool:
        """World rank 0: the rank that prints and writes files in a training run."""
        return self.topo.is_root

    def logits(self, params: Params, x):
        """Logits of the network this gradient trains (MGRIT forward, TorchBraid's way of
        measuring accuracy), computed in this process: the same numbers as the distributed
        forward solve. The trainer's evaluation hook (``gradient.logits``)."""
        return mgrit_forward(self.net, params, x, self.settings.forward, self.bk)[0]

    # -- parameters ---------------------------------------------------------------------
    def holds(self, key: str) -> bool:
        """Whether this rank's shard holds parameter ``key`` (or rows of it); a key
        ``buffer/name`` (optimizer state) follows its parameter ``name``."""
        g = key.rpartition("/")[2].partition(".")[0]
        return g == "steps" or (g == "opening" and self.q == 0) or \
            (g == "closing" and self.q == self.last)

    def shard(self, params: Params) -> Params:
        """This rank's part of full ``params``: owned ``steps.*`` rows (copies), opening on
        layer rank 0, closing on the last layer rank. Keys ``[buffer/]name`` as :meth:`gather`."""
        lo, hi = int(self.owned[0]), int(self.owned[-1]) + 1
        out = {}
        for k, v in params.items():
            if self.holds(k):
                is_rows = k.rpartition("/")[2].startswith("steps.")
                out[k] = copy_of(v[lo:hi, ...] if is_rows else v)
        return out

    def gather(self, shard: dict[str, Any], root: int = 0) -> dict[str, Any] | None:
        """Full arrays on world rank ``root`` from group 0's shards (keys ``[buffer/]name``);
        ``steps.*`` rows are stacked in layer order. Collective over the world."""
        return gather_shards(self.topo, shard, root)

    def _rows(self, shard: Params, fetched: dict[int, dict[str, Any]] | None) -> dict[str, Rows]:
        """Per step-parameter name, the rows this rank may read: owned + fetched ghosts."""
        steps = group(shard, "steps")
        lo = int(self.owned[0])
        out = {}
        for k, v in steps.items():
            rows = {int(n): row(v, int(n) - lo) for n in self.owned}
            if fetched is not None:
                rows.update({i: r[k] for i, r in fetched.items()})
            out[k] = Rows(f"steps.{k}", self.q, rows)
        return out

    # -- the gradient -------------------------------------------------------------------
    def __call__(self, params: Params, x, labels) -> tuple[float, Params, dict[str, float]]:
        """Replicated mode: full params on every rank in, the full gradient on every rank out."""
        rows = replicated_rows(self.plan, self.q, params)
        loss, part, stats = self._gradient(rows, params, x, labels)
        t0 = time.perf_counter()
        grads = place_rows({k: zeros_on(v, v.shape) for k, v in params.items()}, part)
        grads = _unpack(self.topo.world.sum_to_all(_pack(grads)), grads)
        self.last_timings["assemble_s"] = time.perf_counter() - t0
        return loss, grads, stats

    def sharded(self, shard: Params, x, labels) -> tuple[float, Params, dict[str, float]]:
        """Sharded mode: this rank's shard in, the gradient of its shard out (summed over the
        data-parallel groups). Ghost weights are fetched from their owners first."""
        t0 = time.perf_counter()
        rows = self.shard_rows(shard)
        fetch_s = time.perf_counter() - t0
        loss, part, stats = self._gradient(rows, shard, x, labels)
        t0 = time.perf_counter()
        grads = self.sum_groups(self.rows_home(part, shard))
        self.last_timings["assemble_s"] = time.perf_counter() - t0 + fetch_s
        return loss, grads, stats

    def shard_rows(self, shard: Params) -> dict[str, Rows]:
        """The step rows this rank reads: its own and the ghosts fetched (collective)."""
        steps = group(shard, "steps")
        lo = int(self.owned[0])
        mine = {int(n): {k: row(v, int(n) - lo) for k, v in steps.items()} for n in self.owned}
        return self._rows(shard, self.weights_x.forward(mine))

    def rows_home(self, part: Params, shard: Params) -> Params:
        """∂L/∂shard of this group from the rows this rank computed: gradient rows go home
        to their owners (the adjoint of the ghost fetch). Collective over the layer ranks."""
        if self.sequential:  # one layer rank: every gradient is already complete here
            return {k: part[k] for k in shard}
        computed = {int(a): {k[len("steps."):]: v[a] for k, v in part.items()
                             if k.startswith("steps.")} for a in self.grad_rows}
        mine = self.grads_x.adjoint(computed)  # ∇θ rows go home to their owners (Σ of one)
        grads = {}
        for k in shard:
            if k.startswith("steps."):
                rows = [mine[int(n)][k[len("steps."):]] for n in self.owned]
                grads[k] = namespace(rows[0]).stack(rows)
            else:
                grads[k] = part[k]
        return grads

    def sum_groups(self, grads: Params) -> Params:
        """Σ over the data-parallel groups (every group's gradient of the same shard)."""
        if self.topo.n_groups > 1:
            grads = _unpack(self.topo.data.sum_to_all(_pack(grads)), grads)
        return grads

    def _backprop(self, params: Params, xs, ys, weight: float, t_start: float, dloss=None):
        """Pure data parallelism (one layer rank, one MGRIT level): the group's gradient is
        sequential backprop on its shard, scaled by B_g/B; no MGRIT machinery."""
        if dloss is not None:  # the seed is given, already weighted (a chained block)
            loss, part, _ = block_backprop(self.net, params, xs,
                                           lambda z: dloss(z, ys, weight), self.bk)
        elif ys.ndim == 1:
            loss, grads, _ = backprop(self.net, params, xs, ys, self.bk)
        else:  # a token model's per-token labels (IGNORE allowed)
            loss, grads, _ = block_backprop(self.net, params, xs,
                                            lambda z: cross_entropy(z, ys, self.bk), self.bk)
        if dloss is None:
            loss, part = weight * loss, {k: v * weight for k, v in grads.items()}
        self.last_solves = {}
        loss_total = self.topo.world.allreduce_sum(loss)
        n = 2.0 * self.net.n_layers  # N forward + N adjoint steps, like a 1-level solve pair
        self.last_timings = {"gradient_s": time.perf_counter() - t_start}
        return loss_total, part, {"phi_calls": n, "rank_phi_calls": n}

    def _shard_batch(self, x, labels):
        """This group's samples and its weight in the mean loss: B_g/B, or S_g/S for
        per-token labels (S = tokens scored, i.e. not IGNORE)."""
        sizes = shard_sizes(x.shape[0], self.topo.n_groups)
        lo = sum(sizes[: self.topo.group])
        hi = lo + sizes[self.topo.group]
        if labels.ndim == 1:
            return x[lo:hi, ...], labels[lo:hi], sizes[self.topo.group] / x.shape[0]
        xp = namespace(labels)  # tokens scored per sample: B numbers through the host door
        scored = np.asarray(to_host(xp.sum(xp.astype(labels != IGNORE, labels.dtype), axis=1)))
        if not all(int(scored[sum(sizes[:g]):sum(sizes[:g + 1])].sum()) for g in
                   range(len(sizes))):
            raise ValueError("`--data-parallel`: a group's share of the batch scores no token "
                             "(all its labels are IGNORE); use fewer groups or larger batches.")
        return (x[lo:hi, ...], labels[lo:hi, ...],
                float(scored[lo:hi].sum()) / float(scored.sum()))

    def _close(self, params: Params, y_N, ys, weight: float, part: Params, dloss=None):
        """(λ[N] on every layer rank, this rank's weighted loss). The closing runs on the last
        layer rank, then the loss: cross-entropy scaled by ``weight``, or ``dloss(out, ys,
        weight) -> (loss, ∂L/∂out)`` (weighted; called on every layer rank with ``out`` None
        off the last, so it may be collective: the seed of a chained block)."""
        bk, closing, loss_part = self.bk, group(params, "closing"), 0.0
        out = close_cache = dout = lam_N = None
        if self.q == self.last:
            out, close_cache = self.net.closing.forward(closing, y_N, bk)
        if dloss is not None:
            loss_part, dout = dloss(out, ys, weight)
        elif out is not None and out.ndim == 3:  # per-token logits (IGNORE labels allowed)
            loss, dout = cross_entropy(out, ys, bk)
            loss_part, dout = weight * host_float(loss), dout * weight
        elif out is not None:
            loss, probs = bk.softmax_cross_entropy(out, ys)
            loss_part = weight * host_float(loss)
            dout = bk.softmax_cross_entropy_adjoint(probs, ys, weight)
        if self.q == self.last:
            lam_N, dclose = self.net.closing.adjoint(closing, close_cache, dout, bk)
            part.update({f"closing.{k}": v for k, v in dclose.items()})
        return self.bcast_lam.forward(lam_N), loss_part

    def _gradient(self, rows: dict[str, Rows], params: Params, x, labels, dloss=None):
        """Both solves; returns (loss, part, stats) with ``part["steps.k"] = {a: ∂L/∂θ_a[k]}``
        for the layers a whose gradient this rank computed, and opening/closing arrays where
        they live. ``params`` supplies the opening and closing weights; ``dloss`` replaces
        the cross-entropy (:meth:`_close`)."""
        net, bk, plan, layer = self.net, self.bk, self.plan, self.topo.layer
        check_batch(net, x, labels if labels.ndim == 1 else None)  # per token: the loss checks
        t_start = time.perf_counter()
        xs, ys, weight = self._shard_batch(x, labels)
        if self.sequential:
            return self._backprop(params, xs, ys, weight, t_start, dloss)
        N, part = net.n_layers, {}
        y0 = open_cache = None
        if self.q == 0:
            y0, open_cache = net.opening.forward(group(params, "opening"), xs, bk)
        y0 = self.bcast_y0.forward(y0)
        forward = CachingForward(net, rows, bk)
        fwd = solve(Problem(forward, y0, N, transfer=self.settings.forward_transfer),
                    self.settings.forward, comm=layer, layout=plan.forward_layout,
                    workspace=self.workspace.forward)
        states = {int(i): row(fwd.solution, j) for j, i in enumerate(fwd.fine_indices)}
        lam_N, loss_part = self._close(params, states.get(N), ys, weight, part, dloss)
        states.update(self.states_x.forward({i: states[i] for i in self.y_owned}))
        spatial = self.settings.spatial
        adjoint = CapturingAdjoint(net, rows, Rows("y", self.q, states), forward.caches, bk,
                                   spatial.restriction if spatial else "average")
        bwd = solve(Problem(adjoint, lam_N, N, direction="backward",
                            transfer=self.settings.backward_transfer), self.settings.backward,
                    comm=layer, layout=plan.backward_layout, workspace=self.workspace.backward)
        missing = [int(a) for a in self.grad_rows if int(a) not in adjoint.grads]
        if missing:  # cannot happen: the final relaxation makes every fine adjoint step
            raise RuntimeError(f"rank {self.q}: no captured gradient for layers {missing[:8]}.")
        for k in adjoint.grads[int(self.grad_rows[0])]:
            part[f"steps.{k}"] = {int(a): adjoint.grads[int(a)][k] for a in self.grad_rows}
        if self.q == 0:
            lam0 = row(bwd.solution, list(bwd.fine_indices).index(0))
            _, dopen = net.opening.adjoint(group(params, "opening"), open_cache, lam0, bk)
            part.update({f"opening.{k}": v for k, v in dopen.items()})
        self.last_solves = {"forward": fwd, "backward": bwd, **adjoint.counts}
        world = self.topo.world
        loss_total = world.allreduce_sum(loss_part)
        stats = solve_stats(fwd, bwd, world, copies=self.topo.n_groups)
        self.last_timings = {"fwd_s": fwd.solve_seconds, "bwd_s": bwd.solve_seconds,
                             "gradient_s": time.perf_counter() - t_start}
        return loss_total, part, stats


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


def _pack(arrays: dict[str, Any]):
    """All arrays as one flat vector where they live (one message, not one per key)."""
    if not arrays:
        return np.zeros(0)
    xp = namespace(next(iter(arrays.values())))
    return xp.concat([xp.reshape(a, (-1,)) for a in arrays.values()])


def _unpack(flat, like: dict[str, Any]) -> dict[str, Any]:
    xp, out, o = namespace(flat), {}, 0
    for k, v in like.items():
        size = int(np.prod(v.shape))
        part = xp.reshape(flat[o : o + size], tuple(v.shape))
        out[k] = part if part.dtype == v.dtype else xp.astype(part, v.dtype)
        o += size
    return out


def distributed_gradient(net: Network, settings: LayerParallelSettings | None = None,
                         bk: Backend | str = "numpy", data_parallel: int = 1,
                         world=None) -> DistributedGradient:
    """The trainer's gradient callable ``(params, x, labels) -> (loss, grads, stats)`` over
    MPI: ``COMM_WORLD`` (or ``world``) split into ``data_parallel`` groups of layer ranks.

    Every rank must call it with the same parameters and the same full batch; it returns the
    same loss and gradient everywhere (replicated mode, see the module docstring). Raises the
    same ValueError on every rank for a bad split (D not dividing P, more layer ranks than
    coarsest intervals) before any message is sent.
    """
    return DistributedGradient(net, split_world(data_parallel, world), settings, bk)
