"""The only door between MGRIT and other ranks: a small communicator interface.

MGRIT's math (:mod:`refbraid.mgrit.relax`, :mod:`refbraid.mgrit.coarse`) never communicates;
the cycle asks a communicator for exactly four things (docs/references.md §5 lists their adjoints):

==================  ==================================================================
primitive           use in MGRIT
==================  ==================================================================
``send_next(x)``    hand the last owned value to the next block (C-relaxation, residual,
                    FAS right-hand side, coarsest pipeline). Must not block until matched.
``recv_prev()``     the previous block's last value, or ``None`` for the first block
``allreduce_sum``   Σ over ranks of local ‖r‖² (every rank gets the same float)
``gather(x)``       list of every rank's value on ``root`` (``None`` elsewhere)
==================  ==================================================================

Optional: ``allreduce_sums(values)``, several such sums in one reduction (the solver's
end-of-solve norms and finiteness flag); :func:`allreduce_sums` falls back to one
``allreduce_sum`` per value for a communicator without it, with the same floats.

"Next" and "previous" are in solver order. ``reverted()`` returns the same communicator with
the rank order reversed (XBraid's ``braid_SetRevertedRanks``): the adjoint solve runs on the
reversed grid, so block ``position = size - 1 - rank`` of the solver order lives on ``rank``
and neighbour exchanges go the other way.

Two helpers build the collective patterns from the primitives: :func:`exchange_ghost`
(everyone sends its last value forward and receives one ghost) and :func:`pipeline` (the
sequential coarsest solve: wait for the previous block, compute, pass on).

Implementations here: :class:`SerialComm` (one rank: the whole grid, no ghosts) and
:class:`ThreadComm` (``size`` simulated ranks in threads of one process, for tests and
lessons). An MPI communicator implements the same methods with mpi4py; the solver does not
change. :class:`refbraid.parallel.virtual.VirtualComm` runs the ranks on a virtual clock.

Tracing (:mod:`refbraid.parallel.trace`): when a recorder is active in the calling thread,
every message and reduction is recorded; otherwise each method pays one lookup.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from ..backends.portable import copy_of
from .trace import Trace, active_recorder, payload_bytes, traced

#: Seconds a simulated rank waits for a neighbour or a collective before giving up.
THREAD_TIMEOUT = 120.0


@runtime_checkable
class Comm(Protocol):
    """What MGRIT needs from a communicator (see the module docstring)."""

    rank: int
    size: int

    @property
    def position(self) -> int: ...  # this rank's block index in solver order

    def reverted(self) -> Comm: ...

    def send_next(self, value: Any) -> None: ...

    def recv_prev(self) -> Any | None: ...

    def allreduce_sum(self, value: float) -> float: ...

    def gather(self, value: Any, root: int = 0) -> list[Any] | None: ...


def allreduce_sums(comm: Comm, values) -> list[float]:
    """``[Σ_ranks v for v in values]`` in one reduction where ``comm`` has ``allreduce_sums``,
    else one ``allreduce_sum`` each: the same floats either way (each sum in rank order)."""
    many = getattr(comm, "allreduce_sums", None)
    if many is not None:
        return many([float(v) for v in values])
    return [comm.allreduce_sum(v) for v in values]


def sums_in_rank_order(rows) -> list[float]:
    """Element-wise sums of equally long rows (one per rank, in rank order), each summed as
    ``allreduce_sum`` sums one float: ``0 + row_0[i] + row_1[i] + …``."""
    return [float(sum(float(r[i]) for r in rows)) for i in range(len(rows[0]))]


def exchange_ghost(comm: Comm, last: Any, copy: bool = True) -> Any | None:
    """Send ``last`` to the next block and return the previous block's last value (None first).

    With ``copy`` a copy travels (a row of a level array, which the sender relaxes in place
    afterwards); without, ``last`` must be an array nobody changes while it travels (the
    solver sends a step's new result: refbraid.mgrit.cycle.exchange_stepped)."""
    if copy and comm.size > 1:
        last = copy_of(last) if hasattr(last, "shape") else last  # CuPy too (no
        # __array_namespace__): the copy is made where the array lives
    comm.send_next(last)
    return comm.recv_prev()


def pipeline(comm: Comm, solve_block: Callable[[Any | None], Any], last: Callable[[Any], Any]):
    """Sweep the blocks in order: ``out = solve_block(ghost)``, then send ``last(out)`` on."""
    ghost = comm.recv_prev()
    out = solve_block(ghost)
    comm.send_next(last(out))
    return out


class SerialComm:
    """One rank owning the whole grid: no neighbours, reductions are the identity."""

    rank = 0
    size = 1
    position = 0

    def reverted(self) -> SerialComm:
        return self

    def send_next(self, value: Any) -> None:
        return None

    def recv_prev(self) -> None:
        return None

    def allreduce_sum(self, value: float) -> float:
        return self.allreduce_sums([value])[0]

    def allreduce_sums(self, values) -> list[float]:
        rec = active_recorder()
        if rec is not None:
            t = time.perf_counter()
            rec.collective("allreduce", 8 * len(values), t, t)
        return [float(v) for v in values]

    def gather(self, value: Any, root: int = 0) -> list[Any]:
        rec = active_recorder()
        if rec is not None:
            t = time.perf_counter()
            rec.collective("gather", payload_bytes(value), t, t)
        return [value]

    def __repr__(self) -> str:
        return "SerialComm()"


class SolverOrder:
    """Block positions in solver order for a communicator with ``rank``, ``size`` and
    ``_reverted``: ``position = size - 1 - rank`` on the reversed grid, else ``rank``;
    ``_neighbour(offset)`` is the rank ``offset`` positions away (None past either end).
    Shared by the thread, virtual and MPI communicators."""

    rank: int
    size: int
    _reverted: bool

    @property
    def position(self) -> int:
        """This rank's block index in solver order (reversed when ``reverted``)."""
        return self.size - 1 - self.rank if self._reverted else self.rank

    def _neighbour(self, offset: int) -> int | None:
        pos = self.position + offset
        if not 0 <= pos < self.size:
            return None
        return self.size - 1 - pos if self._reverted else pos


class _ThreadWorld:
    """Shared mailboxes and a barrier for ``size`` simulated ranks."""

    def __init__(self, size: int):
        self.size = size
        self.mail = {(a, b): queue.Queue() for a in range(size) for b in range(size) if a != b}
        self.barrier = threading.Barrier(size, timeout=THREAD_TIMEOUT)
        self.slots: list[Any] = [None] * size


class ThreadComm(SolverOrder):
    """A simulated rank: same interface as an MPI communicator, ranks are threads of one process.

    Values sent are copied (``x.copy()`` when available) so no rank aliases another's memory.
    Use :func:`run_ranks` to launch ``size`` ranks.
    """

    def __init__(self, world: _ThreadWorld, rank: int, reverted: bool = False):
        self._world = world
        self.rank = rank
        self.size = world.size
        self._reverted = reverted

    def reverted(self) -> ThreadComm:
        return ThreadComm(self._world, self.rank, not self._reverted)

    def send_next(self, value: Any) -> None:
        nxt = self._neighbour(+1)
        if nxt is not None:
            rec = active_recorder()
            t0 = time.perf_counter() if rec is not None else 0.0
            self._world.mail[(self.rank, nxt)].put(
                value.copy() if hasattr(value, "copy") else value
            )
            if rec is not None:
                rec.send(nxt, payload_bytes(value), t0, time.perf_counter())

    def recv_prev(self) -> Any | None:
        prv = self._neighbour(-1)
        if prv is None:
            return None
        rec = active_recorder()
        t0 = time.perf_counter() if rec is not None else 0.0
        try:
            value = self._world.mail[(prv, self.rank)].get(timeout=THREAD_TIMEOUT)
        except queue.Empty:
            raise RuntimeError(f"rank {self.rank}: no message from rank {prv}") from None
        if rec is not None:
            rec.recv(prv, payload_bytes(value), t0, time.perf_counter())
        return value

    def _collect(self, value: Any) -> list[Any]:
        w = self._world
        w.slots[self.rank] = value
        w.barrier.wait()
        values = list(w.slots)
        w.barrier.wait()  # nobody overwrites a slot before everyone has read it
        return values

    def allreduce_sum(self, value: float) -> float:
        return self.allreduce_sums([value])[0]

    def allreduce_sums(self, values) -> list[float]:
        rec = active_recorder()
        t0 = time.perf_counter() if rec is not None else 0.0
        # the same order on every rank: the same floats
        out = sums_in_rank_order(self._collect([float(v) for v in values]))
        if rec is not None:
            rec.collective("allreduce", 8 * len(values), t0, time.perf_counter())
        return out

    def gather(self, value: Any, root: int = 0) -> list[Any] | None:
        rec = active_recorder()
        t0 = time.perf_counter() if rec is not None else 0.0
        values = self._collect(value)
        if rec is not None:
            rec.collective("gather", payload_bytes(value), t0, time.perf_counter())
        return values if self.rank == root else None

    def __repr__(self) -> str:
        return f"ThreadComm(rank={self.rank}, size={self.size}, reverted={self._reverted})"


def run_ranks(size: int, fn: Callable[[ThreadComm], Any]) -> list[Any]:
    """Run ``fn(comm)`` on ``size`` simulated ranks (threads); return the results in rank order.

    An exception on any rank aborts the others and is re-raised here.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"`size` must be a positive integer, got {size!r}.")
    world = _ThreadWorld(size)
    results: list[Any] = [None] * size
    errors: list[BaseException | None] = [None] * size

    def body(rank: int) -> None:
        try:
            results[rank] = fn(ThreadComm(world, rank))
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller
            errors[rank] = err
            world.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = next(
        (e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)),
        None,
    )
    first = first or next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results


def run_traced(size: int, fn: Callable[[Any], Any]) -> tuple[list[Any], Trace]:
    """:func:`run_ranks` with every rank traced on one time axis:
    returns (results in rank order, merged trace) with measured (wall-clock) times."""
    out = run_ranks(size, traced(fn, time.perf_counter()))
    return [o[0] for o in out], Trace.merge(o[1] for o in out)
