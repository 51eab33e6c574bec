"""A virtual cluster: P ranks as threads of one process, each with a virtual clock.

The ranks run the REAL code (MGRIT's cycle, the layer-parallel gradient, anything written
against the communicator interface of :mod:`refbraid.parallel.comm`), so their results are
those of one process bit for bit. What is simulated is only *time*: every rank carries a
clock that advances by a cost model instead of by the wall clock::

    step Φ on level ℓ, direction d     clock += cost(ℓ, d)                     (CountingStep)
    send (non-blocking)                the message leaves at the sender's clock t_s;
                                       the sender's clock does not move
    receive                            clock = max(clock, t_s + α + β·nbytes)
    collective over P ranks            every clock = max over ranks of the entry clocks
                                                     + cost(kind, P, nbytes)

with the costs of :mod:`refbraid.parallel.costs` (e.g. an allreduce over P ranks adds
⌈log₂ P⌉·(α + β·b); with P = 1 a collective is free). A gather synchronises every rank (a
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
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from .comm import SolverOrder
from .costs import (
    DIRECTIONS,
    CostModel,
    StepCosts,
    as_cost,
    ceil_log2,
    check_seconds,
    collective_cost,
)
from .scheduler import Aborted, DeadlockError, Scheduler
from .trace import (
    RECV,
    STEP,
    Event,
    Recorder,
    Trace,
    critical_path,
    path_breakdown,
    payload_bytes,
    recording,
)

#: Stack size of a simulated rank's thread (the MGRIT recursion is shallow).
STACK_BYTES = 4 * 1024 * 1024

__all__ = ["CostModel", "DeadlockError", "StepCosts", "VirtualComm", "VirtualRecorder",
           "VirtualRun", "as_cost", "ceil_log2", "collective_cost", "simulate"]


# ----------------------------------------------------------------------------- one rank's clock
class VirtualRecorder(Recorder):
    """A rank's recorder whose time is its virtual ``clock`` (origin 0).

    The step hook ignores the measured times and advances the clock by ``cost(level,
    direction)``; the communicator sets the clock for messages and collectives.
    """

    def __init__(self, rank: int, cost: Callable[[int, str], float]):
        super().__init__(rank, origin=0.0)
        self.clock = 0.0
        self._cost = cost
        self._table: dict[tuple[int, bool], float] = {}

    def step(self, level: int, start: int, stop: int, t0: float = 0.0, t1: float = 0.0) -> None:
        back = start > stop
        c = self._table.get((level, back))
        if c is None:
            c = check_seconds("costs(level, direction)", self._cost(level, DIRECTIONS[back]))
            self._table[(level, back)] = c
        t = self.clock
        self.clock = t + c
        self.events.append(Event(STEP, self.rank, t, t + c, level, start, stop))

    def steps(self, level: int, starts, stops, t0: float = 0.0, t1: float = 0.0) -> None:
        """A batched call: each of its k applications costs what it costs alone."""
        for start, stop in zip(starts, stops, strict=True):
            self.step(level, int(start), int(stop))


# ----------------------------------------------------------------------------- the world
@dataclass(eq=False)
class _Round:
    """One collective in progress: every rank's value, entry clock and payload size."""

    kind: str
    values: list[Any]
    clocks: list[float]
    nbytes: list[int]
    arrived: int = 0
    waiters: list[int] = field(default_factory=list)
    t_end: float = 0.0


def _detach(value):
    """A copy sharing no memory with ``value`` (arrays, and dicts/lists/tuples of them)."""
    if isinstance(value, dict):
        return {k: _detach(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_detach(v) for v in value)
    copy = getattr(value, "copy", None)
    return copy() if callable(copy) else value


class _VirtualWorld:
    """Mailboxes, collectives, clocks (the ranks' :class:`VirtualRecorder`) and the scheduler."""

    def __init__(self, size: int, cost, alpha: float, beta: float, sizeof):
        self.size = size
        self.alpha, self.beta, self.sizeof = alpha, beta, sizeof
        self.sched = Scheduler(size)
        self.recorders = [VirtualRecorder(r, cost) for r in range(size)]
        self.mail: dict[tuple[int, int], deque] = defaultdict(deque)
        self.waiting: dict[tuple[int, int], int] = {}
        self.round: _Round | None = None

    def send(self, src: int, dst: int, value: Any) -> None:
        rec = self.recorders[src]
        nbytes = self.sizeof(value)
        self.mail[(src, dst)].append((_detach(value), rec.clock, nbytes))
        rec.send(dst, nbytes, rec.clock, rec.clock)
        waiter = self.waiting.pop((src, dst), None)
        if waiter is not None:
            self.sched.make_ready(waiter)

    def recv(self, src: int, dst: int) -> Any:
        box = self.mail[(src, dst)]
        while not box:
            self.waiting[(src, dst)] = dst
            self.sched.block(dst, f"a message from rank {src}")
        value, t_sent, nbytes = box.popleft()
        rec = self.recorders[dst]
        c0 = rec.clock
        rec.clock = max(c0, t_sent + self.alpha + self.beta * nbytes)
        rec.recv(src, nbytes, c0, rec.clock)
        return value

    def collective(self, rank: int, kind: str, value: Any) -> list[Any]:
        """Every rank's ``value`` in rank order, after synchronising the clocks."""
        rnd = self.round
        if rnd is None:
            n = self.size
            rnd = self.round = _Round(kind, [None] * n, [0.0] * n, [0] * n)
        elif rnd.kind != kind:
            raise RuntimeError(f"rank {rank} called {kind} while other ranks are in "
                               f"{rnd.kind}: every rank must call the same collectives in "
                               f"the same order.")
        rec = self.recorders[rank]
        rnd.values[rank], rnd.clocks[rank] = value, rec.clock
        rnd.nbytes[rank] = self.sizeof(value)
        rnd.arrived += 1
        if rnd.arrived < self.size:
            rnd.waiters.append(rank)
            self.sched.block(rank, f"the other ranks in {kind}")
        else:
            self.round = None
            rnd.t_end = max(rnd.clocks) + collective_cost(kind, self.size, max(rnd.nbytes),
                                                          self.alpha, self.beta)
            for w in rnd.waiters:
                self.sched.make_ready(w)
        rec.collective(kind, rnd.nbytes[rank], rnd.clocks[rank], rnd.t_end)
        rec.clock = rnd.t_end
        return rnd.values


def _check_root(root, size: int) -> int:
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < size:
        raise ValueError(f"`root` must be a rank in [0, {size}), got {root!r}.")
    return int(root)


class VirtualComm(SolverOrder):
    """One rank of a virtual cluster: MGRIT's communicator interface (as
    :class:`~refbraid.parallel.comm.ThreadComm`) plus ``bcast``, ``allgather``, ``send_to``,
    ``recv_from`` and ``barrier`` for glue code. Values sent are copied (no shared memory).
    Created by :func:`simulate`; ``clock`` is this rank's virtual time.
    """

    def __init__(self, world: _VirtualWorld, rank: int, reverted: bool = False):
        self._world = world
        self.rank = rank
        self.size = world.size
        self._reverted = reverted

    @property
    def clock(self) -> float:
        """This rank's virtual time in seconds."""
        return self._world.recorders[self.rank].clock

    def reverted(self) -> VirtualComm:
        return VirtualComm(self._world, self.rank, not self._reverted)

    # -- neighbours (MGRIT) ------------------------------------------------------------------
    def send_next(self, value: Any) -> None:
        nxt = self._neighbour(+1)
        if nxt is not None:
            self._world.send(self.rank, nxt, value)

    def recv_prev(self) -> Any | None:
        prv = self._neighbour(-1)
        return None if prv is None else self._world.recv(prv, self.rank)

    # -- any pair ----------------------------------------------------------------------------
    def send_to(self, dest: int, value: Any) -> None:
        """Non-blocking send of ``value`` to rank ``dest``."""
        self._world.send(self.rank, _check_root(dest, self.size), value)

    def recv_from(self, source: int) -> Any:
        """The next message from rank ``source`` (waits for it)."""
        return self._world.recv(_check_root(source, self.size), self.rank)

    # -- collectives -------------------------------------------------------------------------
    def allreduce_sum(self, value: float) -> float:
        values = self._world.collective(self.rank, "allreduce", float(value))
        return float(sum(values))  # rank order on every rank: the same float

    def gather(self, value: Any, root: int = 0) -> list[Any] | None:
        root = _check_root(root, self.size)
        values = self._world.collective(self.rank, "gather", value)
        return [_detach(v) for v in values] if self.rank == root else None

    def allgather(self, value: Any) -> list[Any]:
        return [_detach(v) for v in self._world.collective(self.rank, "allgather", value)]

    def bcast(self, value: Any, root: int = 0) -> Any:
        root = _check_root(root, self.size)
        mine = value if self.rank == root else None
        return _detach(self._world.collective(self.rank, "bcast", mine)[root])

    def barrier(self) -> None:
        self._world.collective(self.rank, "allreduce", None)

    def __repr__(self) -> str:
        return f"VirtualComm(rank={self.rank}, size={self.size}, reverted={self._reverted})"


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
    world = _VirtualWorld(size, cost, alpha, beta, sizeof)
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
