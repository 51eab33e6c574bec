"""Two-level rank groups for hierarchical data parallelism (DASO; docs/references.md §4, §12).

P = D data-parallel ranks are split into G "nodes" of L = D/G consecutive ranks::

    world rank r  →  node g = r // L,  local rank l = r % L
    node comm     the L ranks of node g        (fast links: gradients summed every step)
    global comm   the G ranks with local rank l (slow links: parameters averaged every k steps)

On a real cluster G is the number of machines and L the GPUs per machine; here a "node" is
just a block of MPI ranks, chosen by ``--dp-groups``. Bytes are counted with the ring
allreduce model of seed 002 (:func:`ring_bytes_per_rank`), the volume NCCL's ring moves,
whatever algorithm the local MPI library picks.

Shape legend: D ranks, G nodes, L = D/G ranks per node, n bytes of one message.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CollectiveError
from .mpi import MPIComm, mpi_module


def ring_bytes_per_rank(nbytes: float, p: int) -> float:
    """Bytes one rank sends in a ring allreduce of ``nbytes`` over ``p`` ranks: 2(p−1)/p·n."""
    return 0.0 if p <= 1 else 2.0 * (p - 1) / p * nbytes


def check_groups(world_size: int, groups: int) -> int:
    """Ranks per node L = P / G; a CollectiveError (same on every rank) unless G divides P."""
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"`dp_groups` (--dp-groups) must be a positive integer, got "
                         f"{groups!r}.")
    if world_size % groups:
        divisors = [g for g in range(1, world_size + 1) if world_size % g == 0]
        raise CollectiveError(f"`dp_groups` (--dp-groups) = {groups} does not divide the "
                              f"{world_size} data-parallel ranks; use one of {divisors}.")
    return world_size // groups


@dataclass(frozen=True, eq=False)
class NodeSplit:
    """This rank's place in the two-level split (see the module docstring)."""

    world: MPIComm  # all D ranks
    node: MPIComm  # the L ranks of this node
    across: MPIComm  # the G ranks with this local rank, one per node
    node_index: int  # g
    n_nodes: int  # G

    @property
    def local_rank(self) -> int:
        return self.node.rank

    @property
    def ranks_per_node(self) -> int:
        return self.node.size


def split_nodes(groups: int, world=None) -> NodeSplit:
    """Split ``world`` (default ``COMM_WORLD``) into ``groups`` nodes of consecutive ranks."""
    if world is None:
        world = mpi_module().COMM_WORLD
    elif isinstance(world, MPIComm):
        world = world.mpi
    size, rank = int(world.Get_size()), int(world.Get_rank())
    per_node = check_groups(size, groups)
    g, local = divmod(rank, per_node)
    node = world.Split(color=g, key=local)
    across = world.Split(color=local, key=g)
    return NodeSplit(world=MPIComm(world.Dup()), node=MPIComm(node), across=MPIComm(across),
                     node_index=g, n_nodes=int(groups))
