"""A :class:`~refbraid.network.Network`'s layers over MPI ranks, batches over groups: the
resnet, conv, transformer and untied GPT models (and, through them, :mod:`.chained`,
:mod:`.space` and :mod:`.daso`).

The chain is the network's own (:mod:`refbraid.layer_parallel`): y[0] = opening(x), the steps
Φ_n(y) = step(θ_n, y, h) with :class:`~refbraid.propagators.CachingForward` keeping each fine
step's cache, the closing and cross-entropy (per token for token models), and
:class:`~refbraid.propagators.CapturingAdjoint`, whose fine adjoint step a+1 → a also yields
∂L/∂θ_a from the solve's last relaxation, so no layer is evaluated twice. The engine
(:mod:`.engine`) does the rest: ownership, ghosts, rows home, replicated and sharded modes.

With one layer rank and one MGRIT level both ways a group's gradient is sequential backprop on
its shard. Both modes give the serial gradient (layer_parallel_gradient on the full batch) to
round-off, bit for bit with one group (tests/mpi/test_distributed.py).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..backends import Backend, get_backend
from ..backends.host import host_float
from ..backends.portable import copy_of, namespace
from ..input_checks import check_batch
from ..layer_parallel import LayerParallelSettings, mgrit_forward
from ..mgrit import GradientWorkspace, Problem
from ..network import Network, Params, backprop, group, row
from ..parallel.mpi import Topology, split_world
from ..parallel.ops import RowExchange
from ..propagators import CachingForward, CapturingAdjoint
from ..sequence.block_gradient import block_backprop
from ..sequence.losses import cross_entropy
from .engine import LayerRanks, captured, gather_shards, replicated_rows, steps_key
from .ownership import Rows


class NetworkChain:
    """The :class:`~refbraid.distributed.engine.Chain` of a Network (module docstring), for
    one call: ``rows`` the step weights this rank reads, ``params`` its opening and closing.
    ``dloss(out, ys, weight) -> (loss, ∂L/∂out)`` replaces the cross-entropy (weighted; called
    on every layer rank with ``out`` None off the last: the seed of a chained block)."""

    def __init__(self, g: DistributedGradient, rows: dict[str, Rows], params: Params,
                 dloss=None):
        self.g, self.rows, self.params, self.dloss = g, rows, params, dloss
        self.phi = self.psi = None

    def open(self, xs):
        return self.g.opening.forward(group(self.params, "opening"), xs, self.g.bk)

    def forward(self, y0) -> Problem:
        self.phi = CachingForward(self.g.view, self.rows, self.g.bk)
        return Problem(self.phi, y0, self.g.plan.n_layers, transfer=self.g.transfers[0])

    def close(self, y_N, ys, weight: float):
        g, bk, closing = self.g, self.g.bk, group(self.params, "closing")
        out = cache = dout = lam_N = None
        loss_part, grads = 0.0, {}
        if g.q == g.last:
            out, cache = g.closing.forward(closing, y_N, bk)
        if self.dloss is not None:
            loss_part, dout = self.dloss(out, ys, weight)
        elif out is not None and out.ndim == 3:  # per-token logits (IGNORE labels allowed)
            loss, dout = cross_entropy(out, ys, bk)
            loss_part, dout = weight * host_float(loss), dout * weight
        elif out is not None:  # (a space-split closing has its logits on space rank 0 only)
            loss, probs = bk.softmax_cross_entropy(out, ys)
            loss_part = weight * host_float(loss)
            dout = bk.softmax_cross_entropy_adjoint(probs, ys, weight)
        if g.q == g.last:
            lam_N, dclose = g.closing.adjoint(closing, cache, dout, bk)
            grads = {f"closing.{k}": v for k, v in dclose.items()}
        return loss_part, lam_N, grads

    def adjoint(self, lam_N, states: Rows) -> Problem:
        g = self.g
        self.psi = CapturingAdjoint(g.view, self.rows, states, self.phi.caches, g.bk,
                                    g.restriction)
        return Problem(self.psi, lam_N, g.plan.n_layers, direction="backward",
                       transfer=g.transfers[1])

    def gradient(self, rows: list[int], bwd=None) -> Params:
        grads = captured(self.psi.grads, rows, self.g.q)
        return {f"steps.{k}": {a: grads[a][k] for a in rows} for k in self.rows}

    def open_adjoint(self, cache, lam0) -> Params:
        _, dopen = self.g.opening.adjoint(group(self.params, "opening"), cache, lam0,
                                          self.g.bk)
        return {f"opening.{k}": v for k, v in dopen.items()}


class DistributedGradient(LayerRanks):
    """Layer-parallel (× data-parallel) gradient of a Network on this rank of ``topology``.

    ``gradient(params, x, labels) -> (loss, grads, stats)`` (replicated parameters, the
    trainer's gradient signature) or ``gradient.sharded(shard, x, labels)`` (owned rows
    only). Every rank must call with the same full batch ``x, labels``; the result is the
    same on every rank. Construction is collective (it builds the message plans).
    """

    def __init__(self, net: Network, topology: Topology,
                 settings: LayerParallelSettings | None = None, bk: Backend | str = "numpy"):
        if not isinstance(net, Network):
            raise TypeError(f"`net` must be a refbraid Network, got {type(net).__name__}.")
        bk = get_backend(bk)
        if bk.xp is not np and isinstance(topology, Topology):  # device arrays travel as
            topology = topology.carrying(bk.asarray)  # buffers (direct or staged)
        super().__init__(topology, settings, net.n_layers, bk)
        self.net = net
        #: what the propagators read (``step``, ``h``, ``n_layers``) and the network's ends
        self.view, self.opening, self.closing = net, net.opening, net.closing
        spatial = self.settings.spatial
        self.transfers = (self.settings.forward_transfer, self.settings.backward_transfer)
        self.restriction = spatial.restriction if spatial else "average"
        layer, q = topology.layer, self.q
        self.owned = self.plan.owned_layers(q)
        weight_in = sorted(set(self.plan.weight_rows(q)) - set(self.owned))
        self.weights_x = RowExchange(layer, self.owned, weight_in)  # collective
        self.grads_x = RowExchange(layer, self.owned, self.grad_rows)  # used through .adjoint
        self.workspace = GradientWorkspace()  # reused by every call: last_solves' arrays too

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
        return {k: copy_of(v[lo:hi, ...] if steps_key(k) else v)
                for k, v in params.items() if self.holds(k)}

    def gather(self, shard: dict[str, Any], root: int = 0) -> dict[str, Any] | None:
        """Full arrays on world rank ``root`` from group 0's shards (keys ``[buffer/]name``);
        ``steps.*`` rows are stacked in layer order. Collective over the world."""
        return gather_shards(self.topo, shard, root)

    # -- the two modes ------------------------------------------------------------------
    def __call__(self, params: Params, x, labels) -> tuple[float, Params, dict[str, float]]:
        """Replicated mode: full params on every rank in, the full gradient on every rank out."""
        rows = replicated_rows(self.plan, self.q, params)
        loss, part, stats = self._gradient(rows, params, x, labels)
        t0 = time.perf_counter()
        grads = self.assemble(part, params)
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
        """Per step-parameter name, the rows this rank reads: its own and the ghosts fetched
        from their owners (collective)."""
        steps, lo = group(shard, "steps"), int(self.owned[0])
        mine = {int(n): {k: row(v, int(n) - lo) for k, v in steps.items()} for n in self.owned}
        fetched = self.weights_x.forward(mine)
        out = {}
        for k, v in steps.items():
            rows = {int(n): row(v, int(n) - lo) for n in self.owned}
            rows.update({i: r[k] for i, r in fetched.items()})
            out[k] = Rows(f"steps.{k}", self.q, rows)
        return out

    def rows_home(self, part: Params, shard: Params) -> Params:
        """∂L/∂shard of this group from the rows this rank computed: gradient rows go home
        to their owners (the adjoint of the ghost fetch). Collective over the layer ranks."""
        if self.sequential:  # one layer rank: every gradient is already complete here
            return {k: part[k] for k in shard}
        computed = {a: {k[len("steps."):]: v[a] for k, v in part.items() if steps_key(k)}
                    for a in self.grad_rows}
        mine = self.grads_x.adjoint(computed)  # ∇θ rows go home to their owners (Σ of one)
        grads = {}
        for k in shard:
            if steps_key(k):
                rows = [mine[int(n)][k[len("steps."):]] for n in self.owned]
                grads[k] = namespace(rows[0]).stack(rows)
            else:
                grads[k] = part[k]
        return grads

    # -- the gradient -------------------------------------------------------------------
    def _gradient(self, rows: dict[str, Rows], params: Params, x, labels, dloss=None):
        """(loss, part, stats) with ``part["steps.k"] = {a: ∂L/∂θ_a[k]}`` for the layers a
        whose gradient this rank computed, and opening/closing arrays where they live."""
        check_batch(self.net, x, labels if labels.ndim == 1 else None)  # per token: the loss
        t_start = time.perf_counter()
        xs, ys, weight = self.batch_share(x, labels)
        if self.sequential:
            return self._backprop(params, xs, ys, weight, t_start, dloss)
        xs = self.local(xs)
        chain = NetworkChain(self, rows, params, dloss)
        loss, part, stats = self.run(chain, xs, ys, weight, self.workspace)
        self.last_solves.update(chain.psi.counts)
        return loss, part, stats

    def local(self, xs):
        """The part of the shard's samples this rank's steps see: all of them (a space split
        keeps its rows, :mod:`.space`)."""
        return xs

    def _backprop(self, params: Params, xs, ys, weight: float, t_start: float, dloss=None):
        """Pure data parallelism (one layer rank, one MGRIT level): the group's gradient is
        sequential backprop on its shard, scaled by B_g/B; no MGRIT machinery."""
        if dloss is not None:  # the seed is given, already weighted (a chained block)
            loss, grads, _ = block_backprop(self.net, params, xs,
                                            lambda z: dloss(z, ys, weight), self.bk)
            weight = 1.0
        elif ys.ndim == 1:
            loss, grads, _ = backprop(self.net, params, xs, ys, self.bk)
        else:  # a token model's per-token labels (IGNORE allowed)
            loss, grads, _ = block_backprop(self.net, params, xs,
                                            lambda z: cross_entropy(z, ys, self.bk), self.bk)
        result = self.backprop_share(loss, grads, weight)
        self.last_timings = {"gradient_s": time.perf_counter() - t_start}
        return result


def distributed_gradient(net: Network, settings: LayerParallelSettings | None = None,
                         bk: Backend | str = "numpy", data_parallel: int = 1,
                         world=None) -> DistributedGradient:
    """The trainer's gradient callable ``(params, x, labels) -> (loss, grads, stats)`` over
    MPI: ``COMM_WORLD`` (or ``world``) split into ``data_parallel`` groups of layer ranks.

    Every rank must call it with the same parameters and the same full batch; it returns the
    same loss and gradient everywhere (replicated mode). Raises the same ValueError on every
    rank for a bad split (D not dividing P, more layer ranks than coarsest intervals) before
    any message is sent.
    """
    return DistributedGradient(net, split_world(data_parallel, world), settings, bk)
