"""A virtual cluster: P ranks as threads of one process, each with a virtual clock.

The ranks run the REAL code (MGRIT's cycle, the layer-parallel gradient, anything written
against the communicator interface of :mod:`refbraid.parallel.comm`), so their results are
those of one process bit for bit. What is simulated is only *time*: every rank carries a
clock that advances by a cost model instead of by the wall clock::

    step Φ on level ℓ, direction d     clock += cost(ℓ, d)                     (CountingStep)
    send (non-blocking)                the message leaves at the sender's clock t_s;
                                       the sender's clock does not move
    receive                            clock = max(clock, t_s + α + β·nbytes)
    collective over G ranks            every clock = max over ranks of the entry clocks
                                                     + cost(kind, G, nbytes)

with the costs of :mod:`refbraid.parallel.costs` (e.g. an allreduce over G ranks adds
⌈log₂ G⌉·(α + β·b), a ``sum_to_all`` of b bytes the ring allreduce 2(G−1)α + 2(G−1)/G·β·b;
with G = 1 a collective is free). A collective synchronises the ranks of ITS communicator
(the world, or a layer- or data-parallel group from :meth:`VirtualComm.subgroup`; the shared
state is :mod:`refbraid.parallel.virtual_world`). A gather synchronises every member (a
simplification: in MPI only the root has to wait); a barrier is an allreduce of 0 bytes.
Work that is not a step application (the opening and closing layers, the loss, array copies,
the solver's bookkeeping) costs nothing: the model charges what scales with the number of
layers and ranks.

The clocks depend only on each rank's program and on the order of each pair's messages,
never on how the OS schedules the threads, so a run is deterministic. The result:

* ``wall_time`` — the largest clock at the end (the predicted time to solution);
* ``trace`` — every event with its virtual start and end (:class:`~refbraid.parallel.trace.Trace`);
* ``critical_path`` — the chain of events that determines ``wall_time``
  (:func:`~refbraid.parallel.trace.critical_path`: a late receive's predecessor is its send,
  a collective's the rank that arrived last, otherwise the rank's previous event).

Execution: one OS thread per rank, only one running at a time
(:mod:`refbraid.parallel.scheduler`), so thousands of ranks do not fight over the interpreter
lock and a communication deadlock is raised as :class:`DeadlockError` instead of hanging.
Thread stacks are :data:`STACK_BYTES` each.

Shape legend: P ranks, E events.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from .comm import SolverOrder, sums_in_rank_order
from .costs import CostModel, StepCosts, as_cost, ceil_log2, check_seconds, collective_cost
from .scheduler import Aborted, DeadlockError
from .trace import RECV, Event, Trace, critical_path, path_breakdown, payload_bytes, recording
from .virtual_world import Group, VirtualRecorder, VirtualWorld, detach

#: Stack size of a simulated rank's thread (the MGRIT recursion is shallow).
STACK_BYTES = 4 * 1024 * 1024

__all__ = ["CostModel", "DeadlockError", "StepCosts", "VirtualComm", "VirtualRecorder",
           "VirtualRun", "as_cost", "ceil_log2", "collective_cost", "simulate",
           "virtual_topology"]


def _check_root(root, size: int) -> int:
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < size:
        raise ValueError(f"`root` must be a rank in [0, {size}), got {root!r}.")
    return int(root)


class VirtualComm(SolverOrder):
    """One rank of a virtual cluster: MGRIT's communicator interface (as
    :class:`~refbraid.parallel.comm.ThreadComm`) plus what the distributed gradient and
    :mod:`refbraid.parallel.ops` need from :class:`~refbraid.parallel.mpi.MPIComm`:
    ``bcast``, ``allgather``, ``alltoall``, ``scatter``, ``sum_to_all``, ``barrier``, and
    ``send_to`` / ``recv_from`` for glue code. Values sent are copied (no shared memory).

    Created by :func:`simulate` (the world); :meth:`subgroup` gives the communicator of some
    of its ranks (:func:`refbraid.parallel.virtual_topology.virtual_topology` splits a world
    into layer-parallel and data-parallel groups as :func:`~refbraid.parallel.mpi.split_world`
    does). ``rank`` and ``size`` are this communicator's; ``clock`` is this rank's virtual
    time. ``allreduce_sum`` reduces over ``reduce_group`` (default: this communicator's ranks),
    like MPIComm's ``reduce_comm``.
    """

    def __init__(self, world: VirtualWorld, rank: int, reverted: bool = False,
                 group: Group | None = None, reduce_group: Group | None = None):
        self._world = world
        self._group = world.everyone if group is None else group
        self._reduce = self._group if reduce_group is None else reduce_group
        self.rank = rank
        self.size = self._group.size
        self._reverted = reverted

    @property
    def world_rank(self) -> int:
        """This rank's number in the whole virtual world."""
        return self._group.members[self.rank]

    @property
    def clock(self) -> float:
        """This rank's virtual time in seconds."""
        return self._world.recorders[self.world_rank].clock

    def reverted(self) -> VirtualComm:
        return VirtualComm(self._world, self.rank, not self._reverted, self._group, self._reduce)

    def subgroup(self, members, reduce_members=None) -> VirtualComm:
        """The communicator of world ranks ``members`` (in that rank order; this rank must be
        one of them), reducing norms over ``reduce_members`` (default ``members``)."""
        members = tuple(int(m) for m in members)
        if self.world_rank not in members:
            raise ValueError(f"`members` must include this rank ({self.world_rank}), got "
                             f"{members!r}.")
        group = self._world.group(members)
        reduce = None if reduce_members is None else \
            self._world.group(tuple(int(m) for m in reduce_members))
        return VirtualComm(self._world, members.index(self.world_rank), False, group, reduce)

    # -- neighbours (MGRIT) ------------------------------------------------------------------
    def send_next(self, value: Any) -> None:
        nxt = self._neighbour(+1)
        if nxt is not None:
            self._world.send(self._group, self.world_rank, self._group.members[nxt], value)

    def recv_prev(self) -> Any | None:
        prv = self._neighbour(-1)
        if prv is None:
            return None
        return self._world.recv(self._group, self._group.members[prv], self.world_rank)

    # -- any pair ----------------------------------------------------------------------------
    def send_to(self, dest: int, value: Any) -> None:
        """Non-blocking send of ``value`` to rank ``dest``."""
        dest = self._group.members[_check_root(dest, self.size)]
        self._world.send(self._group, self.world_rank, dest, value)

    def recv_from(self, source: int) -> Any:
        """The next message from rank ``source`` (waits for it)."""
        source = self._group.members[_check_root(source, self.size)]
        return self._world.recv(self._group, source, self.world_rank)

    # -- collectives -------------------------------------------------------------------------
    def _collective(self, kind: str, value: Any, **cost) -> list[Any]:
        return self._world.collective(self._group, self.rank, kind, value, **cost)

    def allreduce_sum(self, value: float) -> float:
        return self.allreduce_sums([value])[0]

    def allreduce_sums(self, values) -> list[float]:
        """Σ over the reduce group of each value, in rank order on every rank (the same
        floats)."""
        group = self._reduce
        rank = self.rank if group is self._group else group.members.index(self.world_rank)
        mine = [float(v) for v in values]  # floats, not an array: never scaled as a state
        return sums_in_rank_order(self._world.collective(group, rank, "allreduce", mine,
                                                         nbytes=8 * len(mine)))

    def gather(self, value: Any, root: int = 0) -> list[Any] | None:
        root = _check_root(root, self.size)
        values = self._collective("gather", value)
        return [detach(v) for v in values] if self.rank == root else None

    def allgather(self, value: Any) -> list[Any]:
        return [detach(v) for v in self._collective("allgather", value)]

    def bcast(self, value: Any, root: int = 0) -> Any:
        root = _check_root(root, self.size)
        mine = value if self.rank == root else None
        return detach(self._collective("bcast", mine)[root])

    def alltoall(self, values: list[Any]) -> list[Any]:
        """``values[q]`` goes to rank q; returns what every rank sent to this one. Costed by
        the bytes this rank sends to the others (:mod:`refbraid.parallel.costs`)."""
        if len(values) != self.size:
            raise ValueError(f"`values` must hold one entry per rank ({self.size}), "
                             f"got {len(values)}.")
        sent = sum(self._world.sizeof(v) for q, v in enumerate(values) if q != self.rank)
        every = self._collective("alltoall", list(values), nbytes=sent)
        return [detach(every[p][self.rank]) for p in range(self.size)]

    def scatter(self, values: list[Any] | None, root: int = 0) -> Any:
        """``values[q]`` (given on ``root``) to rank q; costed by the largest block."""
        root = _check_root(root, self.size)
        if self.rank == root and (values is None or len(values) != self.size):
            raise ValueError(f"`values` on the root must hold one entry per rank ({self.size}).")
        mine = list(values) if self.rank == root else None
        block = max((self._world.sizeof(v) for v in mine), default=0) if mine else 0
        return detach(self._collective("scatter", mine, nbytes=block)[root][self.rank])

    def sum_to_all(self, array: np.ndarray) -> np.ndarray:
        """Σ over ranks of ``array`` on every rank, the same bits everywhere, added as a
        binomial tree: ranks 2i and 2i+1 first, then pairs of pairs, … — the association of
        MPICH's ``MPI_Reduce`` (binomial, or reduce-scatter for long arrays) that
        :meth:`MPIComm.sum_to_all` runs, so the bits match the MPI run (tested for P ≤ 4).
        Costed as a ring allreduce (REFERENCES.md §4); traced as ``allreduce``."""
        if not isinstance(array, np.ndarray) or array.dtype.kind not in "fc":
            raise TypeError(f"`array` must be a floating-point NumPy array, got "
                            f"{getattr(array, 'dtype', type(array).__name__)}.")
        # the arrivals are already copies (VirtualWorld.collective detaches them), and the
        # tree makes new arrays: a list of them is enough
        parts = list(self._collective("allreduce", array, model="ring"))
        mask = 1
        while mask < len(parts):
            for i in range(0, len(parts) - mask, 2 * mask):
                parts[i] = parts[i] + parts[i + mask]
            mask *= 2
        return parts[0]

    def barrier(self) -> None:
        self._collective("allreduce", None)

    def __repr__(self) -> str:
        return (f"VirtualComm(rank={self.rank}, size={self.size}, world_rank="
                f"{self.world_rank}, reverted={self._reverted})")


def virtual_topology(comm: VirtualComm, data_parallel: int = 1):
    """``comm``'s ranks split into ``data_parallel`` groups as
    :func:`refbraid.parallel.mpi.split_world` splits an MPI world: world rank w is in group
    g = w // Q at layer rank q = w % Q (Q = P / D); the layer communicator reduces norms over
    the whole of ``comm``. Returns a :class:`~refbraid.parallel.mpi.Topology` of
    :class:`VirtualComm` s, which :class:`~refbraid.distributed.network.DistributedGradient`
    takes as it takes the MPI one. No messages: every rank computes the same split."""
    from .mpi import Topology, check_split

    members = comm._group.members
    q = check_split(comm.size, data_parallel)
    group, layer_rank = divmod(comm.rank, q)
    layer = comm.subgroup([members[group * q + i] for i in range(q)], reduce_members=members)
    data = comm.subgroup([members[d * q + layer_rank] for d in range(int(data_parallel))])
    return Topology(world=comm, layer=layer, data=data, group=group, n_groups=int(data_parallel))


# ----------------------------------------------------------------------------- running
@dataclass(frozen=True, eq=False)
class VirtualRun:
    """What :func:`simulate` returns.

    results    ``fn(comm)`` of every rank, in rank order
    trace      every event with virtual times (:class:`~refbraid.parallel.trace.Trace`)
    wall_time  the predicted time: the largest clock at the end
    clocks     every rank's clock at the end
    """

    results: list[Any]
    trace: Trace
    wall_time: float
    clocks: tuple[float, ...]

    @cached_property
    def critical_path(self) -> list[Event]:
        """The events that determine ``wall_time``, earliest first."""
        return critical_path(self.trace)

    def breakdown(self) -> dict[str, float]:
        """Seconds of the critical path per kind (steps per level and direction, message
        latency, collectives); they add up to ``wall_time``."""
        return path_breakdown(self.critical_path)

    def idle_fraction(self) -> float:
        """Share of rank-seconds spent waiting (receives and collectives) up to ``wall_time``."""
        if self.wall_time == 0:
            return 0.0
        waiting = sum(e.duration for e in self.trace if e.kind == RECV or e.is_collective)
        idle_end = sum(self.wall_time - c for c in self.clocks)
        return (waiting + idle_end) / (self.wall_time * len(self.clocks))


def simulate(fn: Callable[[VirtualComm], Any], size: int, costs: CostModel = 1.0,
             alpha: float = 0.0, beta: float = 0.0,
             sizeof: Callable[[Any], int] = payload_bytes) -> VirtualRun:
    """Run ``fn(comm)`` on ``size`` virtual ranks and predict its time (module docstring).

    fn      the rank body, as for :func:`~refbraid.parallel.comm.run_ranks`
    size    number of ranks P ≥ 1
    costs   step costs: :class:`StepCosts`, ``cost(level, direction)``, or seconds per step
    alpha   seconds of latency per message (and per round of a collective)
    beta    seconds per byte
    sizeof  bytes of a message's payload (default :func:`~refbraid.parallel.trace.payload_bytes`)

    An exception on any rank stops every rank and is re-raised here (a communication deadlock
    as :class:`DeadlockError`).
    """
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"`size` must be a positive integer, got {size!r}.")
    size = int(size)
    cost = as_cost(costs)
    alpha, beta = check_seconds("alpha", alpha), check_seconds("beta", beta)
    if not callable(sizeof):
        raise TypeError(f"`sizeof` must be a callable value -> bytes, got {sizeof!r}.")
    world = VirtualWorld(size, cost, alpha, beta, sizeof)
    sched = world.sched
    results: list[Any] = [None] * size
    errors: list[BaseException | None] = [None] * size

    def body(rank: int) -> None:
        try:
            sched.wait_start(rank)
            with recording(world.recorders[rank]):
                results[rank] = fn(VirtualComm(world, rank))
        except Aborted:
            pass
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller
            errors[rank] = err
            sched.abort(err)
        finally:
            sched.finish()

    threads = _start_threads(body, size)
    sched.start()
    sched.done.wait()
    for t in threads:
        t.join()
    first = next((e for e in errors if e is not None), None) or sched.failed
    if first is not None:
        raise first
    clocks = tuple(r.clock for r in world.recorders)
    trace = Trace.merge(r.trace() for r in world.recorders)
    return VirtualRun(results, trace, max(clocks), clocks)


def _start_threads(body: Callable[[int], None], size: int) -> Sequence[threading.Thread]:
    old = threading.stack_size()
    try:
        threading.stack_size(STACK_BYTES)
        threads = [threading.Thread(target=body, args=(r,), daemon=True,
                                    name=f"virtual-rank-{r}") for r in range(size)]
        for t in threads:
            t.start()
    finally:
        threading.stack_size(old)
    return threads
