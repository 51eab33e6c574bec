"""Data × space × depth: layer-parallel MGRIT whose time blocks are groups of space ranks.

XBraid's spatial communicator: P = D·Q·S ranks, world rank r = (g·Q + q)·S + s::

    data group g   (D)  a contiguous shard of every batch, weighted B_g / B
    layer rank q   (Q)  one block of layers in both MGRIT solves (as
                        :class:`~refbraid.distributed.network.DistributedGradient`)
    space rank s   (S)  rows [o_s, o_{s+1}) of every feature map: each Φ and Ψ step is the
                        halo-exchanged conv step of :mod:`refbraid.space.layers`

Each space rank s runs the same MGRIT solve as its peers on its rows: the solver is unchanged
(its communicator is the Q ranks with the same g and s; residual norms are reduced over the
whole world, so every rank stops together), only the step is the split one. Opening on q = 0,
classifier on q = Q−1 (its logits on s = 0 by a SumReduce, λ[N] back by a Broadcast). Every
rank returns partial gradients; one sum over the world (replicated mode,
:meth:`DistributedGradient.__call__`) gives the full gradient on every rank. Results are those
of one process to round-off (tests/mpi/test_space_depth.py). The split layers live in
:mod:`refbraid.space` (which knows nothing of training); this module glues them into the
layer-parallel gradient.

Shape legend: N layers, B batch, x_p (B_g, C_in, n_s, W) the rows of space rank s.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CollectiveError
from ..layer_parallel import LayerParallelSettings
from ..layers.conv import ConvLift, ConvStep
from ..network import Network
from ..parallel.mpi import MPIComm, Topology, mpi_module
from ..space import RowSplit, SpatialClassifier, SpatialConvLift, SpatialConvStep
from .network import DistributedGradient


@dataclass(frozen=True, eq=False)
class SpaceTopology:
    """The three-way split of the module docstring, for this rank."""

    topo: Topology  # world, layer (MGRIT, norms over the world), data (same q, s), group, D
    space: MPIComm  # the S ranks with this rank's g and q
    split: RowSplit  # rows per space rank


def split_three(data_parallel: int, space_parallel: int, rows: int, world=None
                ) -> SpaceTopology:
    """Split ``world`` (default ``COMM_WORLD``) into D × Q × S (Q = P / (D·S)); the same
    CollectiveError on every rank unless D·S divides P and S ≤ rows."""
    if world is None:
        world = mpi_module().COMM_WORLD
    elif isinstance(world, MPIComm):
        world = world.mpi
    size, rank = int(world.Get_size()), int(world.Get_rank())
    for name, flag, v in (("data_parallel", "--data-parallel", data_parallel),
                          ("space_parallel", "--space-parallel", space_parallel)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise CollectiveError(f"`{name}` ({flag}) must be a positive integer, got {v!r}.")
    if space_parallel > rows:
        raise CollectiveError(f"`--space-parallel {space_parallel}`: the images have {rows} "
                              f"rows; use at most {rows} space ranks.")
    if size % (data_parallel * space_parallel):
        raise CollectiveError(
            f"`--data-parallel {data_parallel}` × `--space-parallel {space_parallel}` = "
            f"{data_parallel * space_parallel} does not divide the {size} MPI ranks; the layer "
            f"ranks are the rest, P / (D·S).")
    Q = size // (data_parallel * space_parallel)
    S = space_parallel
    g, rest = divmod(rank, Q * S)
    q, s = divmod(rest, S)
    world_dup = world.Dup()
    layer = world.Split(color=g * S + s, key=q)
    data = world.Split(color=q * S + s, key=g)
    space = world.Split(color=g * Q + q, key=s)
    topo = Topology(world=MPIComm(world_dup), layer=MPIComm(layer, reduce_comm=world_dup),
                    data=MPIComm(data), group=g, n_groups=int(data_parallel))
    return SpaceTopology(topo, MPIComm(space), RowSplit.even(rows, S))


@dataclass(frozen=True, eq=False)
class _SplitSteps:
    """What the propagators read from a network (``step``, ``h``), with the split step."""

    step: SpatialConvStep
    h: float
    n_layers: int


class SpaceDepthGradient(DistributedGradient):
    """:class:`~refbraid.distributed.network.DistributedGradient` with every feature map split
    over the space ranks: the same engine and chain, with the split steps, opening and
    closing of :mod:`refbraid.space` and this rank's rows of every sample.

    ``gradient(params, x, labels)`` (replicated): every rank passes the same full batch and
    gets the full loss and gradient. Construction is collective.
    """

    __name__ = "space-depth-mpi"

    def __init__(self, net: Network, split: SpaceTopology,
                 settings: LayerParallelSettings | None = None, bk="numpy"):
        if not (isinstance(net, Network) and isinstance(net.opening, ConvLift)
                and isinstance(net.step, ConvStep)):
            raise CollectiveError("`--space-parallel` splits image rows: it needs the conv "
                                  "model (`--model conv`).")
        super().__init__(net, split.topo, settings, bk)
        self.space, self.split = split.space, split.split
        self.sequential = False  # the split steps always run (a 1-level solve is sequential)
        self.copies = self.topo.n_groups * self.space.size  # every space rank makes each step
        self.view = _SplitSteps(SpatialConvStep(net.step, self.space), net.h, net.n_layers)
        self.opening = SpatialConvLift(net.opening, self.space)
        self.closing = SpatialClassifier(net.closing, self.space, self.split)
        self.transfers, self.restriction = (None, None), "average"  # rows split, not coarsened

    def local(self, xs):
        """This space rank's rows of every sample."""
        return self.split.local(xs, self.space.rank)  # B_g, C_in, n_s, W

    def sharded(self, shard, x, labels):
        raise NotImplementedError("space parallelism trains with replicated parameters "
                                  "(call the gradient); sharded mode is not built yet.")


def space_depth_gradient(net: Network, settings: LayerParallelSettings | None = None,
                         bk="numpy", data_parallel: int = 1, space_parallel: int = 1,
                         world=None) -> SpaceDepthGradient:
    """The trainer's gradient over ``COMM_WORLD`` split D × Q × S (module docstring)."""
    if not (isinstance(net, Network) and isinstance(net.step, ConvStep)):
        raise CollectiveError("`--space-parallel` splits image rows: it needs the conv model "
                              "(`--model conv`).")
    return SpaceDepthGradient(net, split_three(data_parallel, space_parallel,
                                               net.step.height, world), settings, bk)
