"""DASO: hierarchical data parallelism (Coquelin et al.; Heat's ``heat.optim.DASO``;
docs/references.md §4 and §12).

D data-parallel ranks form G nodes of L = D/G ranks (:mod:`refbraid.parallel.hierarchy`).
Training runs in three phases, by epoch::

    warm-up  (first ``warmup_epochs``)      synchronous: plain data parallelism, every step
    cycling                                 node-local: gradients summed within the node only
                                            (θ_g ← opt(θ_g, ḡ_g), ḡ_g the node's mean gradient)
                                            + every k batches a global average of θ over nodes,
                                            applied w batches later (stale), merged as
                                                θ_g ← (2w·θ_g + Σ_h θ_h(sent)) / (G + 2w)
                                            (w = 0: θ_g ← Σ_h θ_h / G, blocking)
    cool-down (last ``cooldown_epochs``)    synchronous again

At the end of every cycling epoch the nodes are averaged blocking (parameters and the
optimizer's buffers), so every epoch ends with one model on every rank (it is evaluated and
checkpointed as in one process). The rate adapts as Heat's does: cycling starts at
k = ``max_global_skips`` and w = k // 4; when the epoch's training loss plateaus (no relative
improvement over the best of more than ``stability_level`` for ``patience`` epochs) both
are divided by ``reduction``; when k reaches 1 they reset to the maximum.

Where this differs from Heat's DASO (on purpose, for a reference):

* synchronous steps sum *gradients* over the world with the very code of plain data
  parallelism (:meth:`DistributedGradient.sharded`), so DASO with k = 1 (or all-synchronous
  phases) IS plain data parallelism, bit for bit; Heat averages parameters in its warm-up;
* the global messages stay float64 (Heat down-casts them to bfloat16);
* the "non-blocking" global average is computed when it is sent (a blocking collective) and
  applied w batches later: the same numbers as an ``Iallreduce`` received late, but no
  overlap, so no time is saved on this machine (the prediction, :mod:`refbraid.scaling.daso`,
  models the overlap);
* the end-of-epoch average includes the optimizer buffers (Adam's moments), so synchronous
  epochs after cycling start from one common optimizer state.

Bytes are counted per rank with the ring model (:func:`ring_bytes_per_rank`), split into
intra-node and inter-node traffic (:attr:`DasoGradient.bytes_sent`).

Shape legend: D ranks, G nodes, L = D/G ranks per node, B batch, B_g node batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import CollectiveError
from ..network import Network, Params
from ..parallel.hierarchy import NodeSplit, ring_bytes_per_rank, split_nodes
from ..parallel.mpi import split_world, sum_to_all
from .engine import WorldHooks, host_backend, pack, shard_sizes, unpack
from .network import DistributedGradient

PHASES = ("warm-up", "cycling", "cool-down")


# ----------------------------------------------------------------------------- the schedule
@dataclass(frozen=True)
class DasoSchedule:
    """DASO's knobs (defaults: Heat's, except the phase lengths, which suit short runs)."""

    groups: int = 1  # G nodes (--dp-groups)
    max_global_skips: int = 1  # k_max (--global-sync-every); 1 = plain data parallelism
    warmup_epochs: int = 1  # synchronous epochs at the start (Heat: 4)
    cooldown_epochs: int = 1  # synchronous epochs at the end (Heat: 4)
    adaptive: bool = True  # adapt k and w on loss plateaus (False: fixed k, w = k // 4)
    stability_level: float = 0.05  # relative improvement below which an epoch is "flat"
    patience: int = 2  # flat epochs before the rate is reduced
    reduction: int = 2  # k and w are divided by this on a plateau

    def __post_init__(self):
        for name in ("groups", "max_global_skips", "patience", "reduction"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {v!r}.")
        for name in ("warmup_epochs", "cooldown_epochs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"`{name}` must be a non-negative integer, got {v!r}.")
        if self.reduction < 2:
            raise ValueError(f"`reduction` must be at least 2, got {self.reduction!r}.")
        if not 0.0 < float(self.stability_level) < 1.0:
            raise ValueError(f"`stability_level` must be in (0, 1), got "
                             f"{self.stability_level!r}.")

    def phase(self, epoch: int, epochs: int) -> str:
        """The phase of 1-based ``epoch`` of ``epochs``: warm-up, cycling or cool-down."""
        if self.max_global_skips == 1 or self.groups == 1 or epoch <= self.warmup_epochs:
            return "warm-up"
        return "cool-down" if epoch > epochs - self.cooldown_epochs else "cycling"


@dataclass(frozen=True)
class SyncRate:
    """Global averaging every ``every`` = k batches, applied ``wait`` = w batches later."""

    every: int
    wait: int


def initial_rate(schedule: DasoSchedule) -> SyncRate:
    """k = k_max, w = k_max // 4 (Heat's start of the cycling phase)."""
    k = schedule.max_global_skips
    return SyncRate(k, k // 4)


def next_rate(rate: SyncRate, plateaued: bool, schedule: DasoSchedule) -> SyncRate:
    """On a plateau: k ← k // r, w ← w // r; once k would reach 1, back to the start."""
    if not (plateaued and schedule.adaptive):
        return rate
    k = rate.every // schedule.reduction
    return initial_rate(schedule) if k <= 1 else SyncRate(k, rate.wait // schedule.reduction)


class Plateau:
    """A loss plateau detector (mode min, relative threshold, like ``ReduceLROnPlateau``):
    an epoch is flat unless ``loss < best·(1 − level)``; ``patience`` flat epochs in a row
    report a plateau and restart the count."""

    def __init__(self, level: float, patience: int):
        self.level, self.patience = float(level), int(patience)
        self.best, self.flat = math.inf, 0

    def update(self, loss: float) -> bool:
        if loss < self.best * (1.0 - self.level):
            self.best, self.flat = loss, 0
            return False
        self.best = min(self.best, loss)
        self.flat += 1
        if self.flat >= self.patience:
            self.flat = 0
            return True
        return False


def stale_merge(theta_now: np.ndarray, sent_sum: np.ndarray, n_nodes: int,
                wait: int) -> np.ndarray:
    """θ ← (2w·θ_now + Σ_h θ_h) / (G + 2w): the local model weighs as 2w stale copies
    (Heat's stale weighting); w = 0 is the plain average Σ_h θ_h / G."""
    if wait == 0:
        return sent_sum / n_nodes
    return (2.0 * wait * theta_now + sent_sum) / (n_nodes + 2.0 * wait)


# ----------------------------------------------------------------------------- the gradient
class DasoGradient(WorldHooks):
    """The trainer's gradient callable for DASO under ``mpiexec`` (every rank one data shard).

    ``gradient(params, x, labels) -> (loss, grads, stats)``: every rank passes the same full
    batch; the loss is the full batch's mean on every rank. Hooks :func:`fit` calls:
    ``begin_epoch(epoch)`` and ``end_epoch(epoch, state, train_loss)`` (the end-of-epoch
    average and the rate adaptation), ``share`` and ``is_root``. Construction is collective.
    """

    __name__ = "daso-mpi"

    def __init__(self, net: Network, schedule: DasoSchedule, epochs: int, settings=None,
                 bk="numpy", world=None):
        if not isinstance(schedule, DasoSchedule):
            raise TypeError(f"`schedule` must be a DasoSchedule, got {type(schedule).__name__}.")
        host_backend(bk, "DASO")
        self.schedule, self.epochs = schedule, int(epochs)
        self.nodes: NodeSplit = split_nodes(schedule.groups, world)
        self.world = self.nodes.world
        D, L = self.nodes.world.size, self.nodes.ranks_per_node
        #: plain data parallelism over all D ranks: the synchronous steps
        self.sync = DistributedGradient(net, split_world(D, world), settings, bk)
        #: data parallelism inside this node: the node-local steps
        self.local = DistributedGradient(net, split_world(L, self.nodes.node.mpi), settings, bk)
        self.logits = self.sync.logits
        self.rate = initial_rate(schedule)
        self.plateau = Plateau(schedule.stability_level, schedule.patience)
        self.epoch, self.batch = 1, 0
        self.pending: list[tuple[int, dict[str, np.ndarray]]] = []  # (due batch, Σ_h θ_h)
        self.drifted = False
        #: bytes this rank sent on average (ring model), by link kind; and counts
        self.bytes_sent = {"intra": 0.0, "inter": 0.0}
        self.counts = {"sync_steps": 0, "local_steps": 0, "global_averages": 0}

    # -- hooks ----------------------------------------------------------------------------
    @property
    def phase(self) -> str:
        return self.schedule.phase(self.epoch, self.epochs)

    def begin_epoch(self, epoch: int) -> None:
        self.epoch, self.batch = int(epoch), 0

    def end_epoch(self, epoch: int, state, train_loss: float) -> None:
        """Cycling epochs end with a blocking average of θ and the optimizer buffers over the
        nodes (pending stale averages are applied first); then the rate adapts."""
        if self.phase != "cycling":
            return
        for _, sent in self.pending:  # clipped to the epoch, as Heat clips to the last batch
            self._merge(state.params, sent, self.rate.wait)
        self.pending.clear()
        if self.drifted:
            self._average(state.params)
            opt = state.optimizer.state_dict()
            bufs = {k: v for k, v in opt.items() if k != "step"}
            if bufs:
                self._average(bufs)
                state.optimizer.load_state_dict({"step": opt["step"], **bufs}, state.params)
            self.drifted = False
        self.rate = next_rate(self.rate, self.plateau.update(float(train_loss)), self.schedule)

    # -- one step -------------------------------------------------------------------------
    def __call__(self, params: Params, x, labels) -> tuple[float, Params, dict[str, float]]:
        """One step; ``stats`` adds k (``daso_every``) and this step's bytes per rank."""
        before = dict(self.bytes_sent)
        loss, grads, stats = self._step(params, x, labels)
        for kind, total in self.bytes_sent.items():
            stats[f"bytes_{kind}"] = total - before[kind]
        return loss, grads, stats

    def _step(self, params: Params, x, labels) -> tuple[float, Params, dict[str, float]]:
        b, self.batch = self.batch, self.batch + 1
        n_grad = float(sum(np.asarray(v).nbytes for v in params.values()))
        if self.phase != "cycling":
            if self.drifted:  # cannot happen: cycling epochs end averaged
                raise RuntimeError("DASO: a synchronous step on drifted parameters.")
            loss, grads, stats = self.sync.sharded(params, x, labels)
            self._count_flat_ring(n_grad)
            self.counts["sync_steps"] += 1
            return loss, grads, {**stats, "daso_every": 1.0}
        k, w = self.rate.every, self.rate.wait
        for _due, sent in [p for p in self.pending if p[0] <= b]:
            self._merge(params, sent, w)
        self.pending = [p for p in self.pending if p[0] > b]
        if b > 0 and b % k == 0:  # send θ as it is after update b−1
            sent = self._sum_over_nodes(params)
            if w == 0:
                self._merge(params, sent, 0)
            else:
                self.pending.append((b + w, sent))
        xs, ys, node_share = self._node_batch(x, labels)
        node_loss, grads, stats = self.local.sharded(params, xs, ys)
        loss = self.nodes.across.allreduce_sum(node_share * node_loss)
        self.bytes_sent["intra"] += ring_bytes_per_rank(n_grad, self.nodes.ranks_per_node)
        self.counts["local_steps"] += 1
        self.drifted = True
        return loss, grads, {**stats, "daso_every": float(k)}

    # -- pieces ---------------------------------------------------------------------------
    def _node_batch(self, x, labels):
        """This node's contiguous part of the batch: the union of its ranks' shards."""
        sizes = shard_sizes(x.shape[0], self.nodes.world.size)
        L, g = self.nodes.ranks_per_node, self.nodes.node_index
        lo, hi = sum(sizes[: g * L]), sum(sizes[: (g + 1) * L])
        return x[lo:hi], labels[lo:hi], (hi - lo) / x.shape[0]

    def _sum_over_nodes(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Σ_h θ_h over the G nodes, the same bits on every rank: summed among the local-rank-0
        ranks (one per node), then broadcast inside each node."""
        flat = pack(arrays)
        total = sum_to_all(self.nodes.across.mpi, flat) if self.nodes.local_rank == 0 else None
        total = self.nodes.node.bcast(total, root=0)
        L, G = self.nodes.ranks_per_node, self.nodes.n_nodes
        self.bytes_sent["inter"] += ring_bytes_per_rank(flat.nbytes, G) / L
        self.bytes_sent["intra"] += flat.nbytes * (L - 1) / L
        self.counts["global_averages"] += 1
        return unpack(total, arrays)

    def _merge(self, params: dict[str, np.ndarray], sent: dict[str, np.ndarray],
               wait: int) -> None:
        for k, v in params.items():
            v[...] = stale_merge(v, sent[k], self.nodes.n_nodes, wait)

    def _average(self, arrays: dict[str, np.ndarray]) -> None:
        self._merge(arrays, self._sum_over_nodes(arrays), 0)

    def _count_flat_ring(self, nbytes: float) -> None:
        """Plain data parallelism: one ring over all D ranks in rank order; G of its D links
        cross nodes (none with one node)."""
        D, G = self.nodes.world.size, self.nodes.n_nodes
        per_rank = ring_bytes_per_rank(nbytes, D)
        inter = per_rank * (G / D if G > 1 else 0.0)
        self.bytes_sent["inter"] += inter
        self.bytes_sent["intra"] += per_rank - inter


def daso_gradient(net: Network, schedule: DasoSchedule, epochs: int, settings=None,
                  bk="numpy", world=None) -> DasoGradient:
    """:class:`DasoGradient` over ``COMM_WORLD`` (or ``world``): every rank one data shard.

    A CollectiveError (the same on every rank) when G does not divide the ranks or the
    network is not a :class:`Network`."""
    if not isinstance(net, Network):
        raise CollectiveError("`--dp-groups`: DASO trains the resnet and conv models; train "
                              "sequence models without it (plain `--data-parallel`).")
    return DasoGradient(net, schedule, epochs, settings, bk, world)
