"""MPI communicators for MGRIT and layer-parallel training, over mpi4py.

:class:`MPIComm` implements the :class:`refbraid.parallel.comm.Comm` interface (``send_next``,
``recv_prev``, ``allreduce_sum``, ``gather``, ``reverted``) on an mpi4py communicator, so
:func:`refbraid.mgrit.solve` runs distributed without a line of MPI in the solver. It adds the
collectives the distributed gradient and :mod:`refbraid.parallel.ops` need (``bcast``,
``allgather``, ``alltoall``, ``scatter``, ``sum_to_all``).

Layer parallelism × data parallelism (docs/references.md §4). A world of ``P`` ranks is split into
``D`` groups of ``Q = P / D`` ranks::

    world rank w  ─►  group g = w // Q   (which shard of every batch it takes)
                      layer rank q = w % Q (which block of layers it owns)

    layer communicator  the Q ranks of one group: MGRIT's neighbour messages
    data communicator   the D ranks with the same q: gradient averaging (allreduce)

The residual norm MGRIT stops on is reduced over the WHOLE world (``reduce_comm``), so every
group sees the norm of the full batch and takes the same decisions as one process would.

Determinism. ``allreduce_sum`` gathers every rank's float and sums them in rank order, so every
rank holds the same float (the serial communicators do the same). ``sum_to_all`` reduces an
array to rank 0 and broadcasts the result: every rank holds the same bits, which keeps
replicated parameters identical across ranks.

Faults. Run programs as ``mpiexec -n N python -m mpi4py ...``: an uncaught exception on any
rank then calls ``MPI_Abort`` and ends the job with that rank's traceback instead of leaving
the others blocked in a receive. :func:`abort_on_error` does the same for entry points that
are not started through ``-m mpi4py`` (e.g. ``mpiexec -n 2 refbraid train``).

mpi4py is imported only when a communicator is built (it is the optional ``mpi`` extra).

Shape legend: P world ranks, D data-parallel groups, Q = P / D layer-parallel ranks per group.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CollectiveError

#: Message tag of MGRIT's neighbour messages (one tag: MPI keeps them in order per pair).
TAG_NEIGHBOUR = 17

#: Environment variables set by MPI launchers (MPICH/Hydra, Open MPI, PMIx, Slurm).
LAUNCHER_ENV = ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


def mpi_module():
    """``mpi4py.MPI`` (initialises MPI); ImportError with the install command when missing."""
    try:
        from mpi4py import MPI
    except ImportError as err:  # pragma: no cover - depends on the installation
        raise ImportError(
            "MPI support needs mpi4py and an MPI library: pip install 'refbraid[mpi]' "
            "(brings mpi4py and the MPICH wheel, whose mpiexec lands next to python)."
        ) from err
    return MPI


def launched_by_mpiexec() -> bool:
    """True when an MPI launcher started this process (its environment variables are set)."""
    return any(v in os.environ for v in LAUNCHER_ENV)


def world_size() -> int:
    """Ranks in ``COMM_WORLD``: 1 unless an MPI launcher started this process (then mpi4py is
    imported and MPI initialised)."""
    if not launched_by_mpiexec():
        return 1
    return int(mpi_module().COMM_WORLD.Get_size())


def is_world_root() -> bool:
    """True for world rank 0, and for a process that no MPI launcher started."""
    if not launched_by_mpiexec():
        return True
    return mpi_module().COMM_WORLD.Get_rank() == 0


def _check_root(root, size: int) -> int:
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < size:
        raise ValueError(f"`root` must be a rank in [0, {size}), got {root!r}.")
    return int(root)


class MPIComm:
    """MGRIT's communicator interface over an mpi4py communicator (see the module docstring).

    comm         the mpi4py communicator of the ranks that share the time grid
    reduce_comm  communicator for ``allreduce_sum`` (the residual norms); default ``comm``
    """

    def __init__(self, comm, reduce_comm=None, *, _reverted: bool = False, _pending=None,
                 _counters=None):
        for name in ("Get_rank", "Get_size", "isend", "recv"):
            if not callable(getattr(comm, name, None)):
                raise TypeError(f"`comm` must be an mpi4py communicator, got {comm!r}.")
        self.mpi = comm
        self.reduce_mpi = comm if reduce_comm is None else reduce_comm
        self.rank = int(comm.Get_rank())
        self.size = int(comm.Get_size())
        self._reverted = bool(_reverted)
        self._pending: list[Any] = [] if _pending is None else _pending  # shared by reverted()
        #: neighbour messages sent / received and seconds spent waiting in ``recv_prev``
        self.counters = {"sends": 0, "recvs": 0, "wait_s": 0.0} if _counters is None \
            else _counters

    @classmethod
    def world(cls) -> MPIComm:
        """A communicator over a duplicate of ``COMM_WORLD`` (library messages stay apart)."""
        return cls(mpi_module().COMM_WORLD.Dup())

    # -- the Comm interface -------------------------------------------------------------
    @property
    def position(self) -> int:
        """This rank's block index in solver order (reversed when ``reverted``)."""
        return self.size - 1 - self.rank if self._reverted else self.rank

    def reverted(self) -> MPIComm:
        """The same ranks in reverse solver order (the adjoint's reversed grid)."""
        return MPIComm(self.mpi, self.reduce_mpi, _reverted=not self._reverted,
                       _pending=self._pending, _counters=self.counters)

    def _neighbour(self, offset: int) -> int | None:
        pos = self.position + offset
        if not 0 <= pos < self.size:
            return None
        return self.size - 1 - pos if self._reverted else pos

    def send_next(self, value: Any) -> None:
        """Non-blocking send of ``value`` to the next block (a copy is taken now)."""
        nxt = self._neighbour(+1)
        if nxt is None:
            return
        self._pending = [r for r in self._pending if not r.Test()]
        self._pending.append(self.mpi.isend(value, dest=nxt, tag=TAG_NEIGHBOUR))
        self.counters["sends"] += 1

    def recv_prev(self) -> Any | None:
        """The previous block's value (blocking), or None on the first block."""
        prv = self._neighbour(-1)
        if prv is None:
            return None
        t0 = time.perf_counter()
        value = self.mpi.recv(source=prv, tag=TAG_NEIGHBOUR)
        self.counters["wait_s"] += time.perf_counter() - t0
        self.counters["recvs"] += 1
        return value

    def allreduce_sum(self, value: float) -> float:
        """Σ over ``reduce_comm`` of ``value``, summed in rank order: the same float everywhere."""
        return float(sum(float(v) for v in self.reduce_mpi.allgather(float(value))))

    def gather(self, value: Any, root: int = 0) -> list[Any] | None:
        """Every rank's ``value`` in rank order on ``root``; None elsewhere."""
        return self.mpi.gather(value, root=_check_root(root, self.size))

    # -- collectives used by the distributed gradient and the linear operators ------------
    def bcast(self, value: Any, root: int = 0) -> Any:
        """``root``'s value on every rank."""
        return self.mpi.bcast(value, root=_check_root(root, self.size))

    def allgather(self, value: Any) -> list[Any]:
        """Every rank's value, in rank order, on every rank."""
        return self.mpi.allgather(value)

    def alltoall(self, values: list[Any]) -> list[Any]:
        """``values[q]`` goes to rank q; returns what every rank sent to this one."""
        if len(values) != self.size:
            raise ValueError(f"`values` must hold one entry per rank ({self.size}), "
                             f"got {len(values)}.")
        return self.mpi.alltoall(values)

    def scatter(self, values: list[Any] | None, root: int = 0) -> Any:
        """``values[q]`` (given on ``root``) to rank q."""
        root = _check_root(root, self.size)
        if self.rank == root and (values is None or len(values) != self.size):
            raise ValueError(f"`values` on the root must hold one entry per rank ({self.size}).")
        return self.mpi.scatter(values, root=root)

    def sum_to_all(self, array: np.ndarray) -> np.ndarray:
        """Σ over ranks of ``array`` on every rank, bit-identical everywhere (Reduce + Bcast)."""
        return sum_to_all(self.mpi, array)

    def barrier(self) -> None:
        self.mpi.Barrier()

    def wait_sends(self) -> None:
        """Complete every outstanding ``send_next`` (call before freeing the communicator)."""
        for r in self._pending:
            r.wait()
        self._pending.clear()

    def __repr__(self) -> str:
        return (f"MPIComm(rank={self.rank}, size={self.size}, reverted={self._reverted}, "
                f"reduce_size={self.reduce_mpi.Get_size()})")


def sum_to_all(comm, array: np.ndarray) -> np.ndarray:
    """Σ over the ranks of ``comm`` of a NumPy array, the same bits on every rank.

    ``MPI_Reduce`` to rank 0, then ``MPI_Bcast``: one rank does the arithmetic, so replicated
    copies cannot drift apart by round-off (an ``MPI_Allreduce`` may order sums differently
    on different ranks).
    """
    a = np.ascontiguousarray(array)
    if a.dtype.kind not in "fc":
        raise TypeError(f"`array` must be a floating-point array, got dtype {a.dtype}.")
    if comm.Get_size() == 1:
        return a.copy()
    MPI = mpi_module()
    out = np.empty_like(a)
    comm.Reduce(a, out if comm.Get_rank() == 0 else None, op=MPI.SUM, root=0)
    comm.Bcast(out, root=0)
    return out


# ----------------------------------------------------------------------------- world split
@dataclass(frozen=True, eq=False)
class Topology:
    """A world split into ``n_groups`` data-parallel groups of ``layer.size`` layer ranks."""

    world: MPIComm  # all P ranks
    layer: MPIComm  # the Q ranks of this group (norms reduced over the world)
    data: MPIComm  # the D ranks holding the same layer block
    group: int  # this rank's data-parallel group g (batch shard)
    n_groups: int  # D

    @property
    def is_root(self) -> bool:
        """World rank 0: the one that prints and writes files."""
        return self.world.rank == 0

    def describe(self) -> str:
        return (f"world rank {self.world.rank}/{self.world.size}: group {self.group}/"
                f"{self.n_groups}, layer rank {self.layer.rank}/{self.layer.size}")


def check_split(world_size: int, data_parallel: int) -> int:
    """Number Q = P / D of layer-parallel ranks per group; ValueError unless D divides P."""
    if isinstance(data_parallel, bool) or not isinstance(data_parallel, (int, np.integer)) \
            or data_parallel < 1:
        raise ValueError(f"`data_parallel` (--data-parallel) must be a positive integer, got "
                         f"{data_parallel!r}.")
    if world_size % data_parallel:
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise CollectiveError(
            f"`data_parallel` (--data-parallel) = {data_parallel} does not divide the "
            f"{world_size} MPI ranks; use one of {divisors} (or run mpiexec -n "
            f"{data_parallel * max(1, world_size // data_parallel)}).")
    return world_size // int(data_parallel)


def split_world(data_parallel: int = 1, world=None) -> Topology:
    """Split ``world`` (default ``COMM_WORLD``) into ``data_parallel`` groups (see module doc).

    The check runs on every rank before any communication, so a bad split raises the same
    :class:`~refbraid.errors.CollectiveError` on every rank.
    """
    if world is None:
        world = mpi_module().COMM_WORLD
    elif isinstance(world, MPIComm):
        world = world.mpi
    size, rank = int(world.Get_size()), int(world.Get_rank())
    q = check_split(size, data_parallel)
    group, layer_rank = divmod(rank, q)
    world_dup = world.Dup()
    layer = world.Split(color=group, key=layer_rank)
    data = world.Split(color=layer_rank, key=group)
    return Topology(world=MPIComm(world_dup), layer=MPIComm(layer, reduce_comm=world_dup),
                    data=MPIComm(data), group=group, n_groups=int(data_parallel))


# ----------------------------------------------------------------------------- faults
#: Seconds a failing rank waits before MPI_Abort, so ranks failing the same way can print too.
ABORT_GRACE_S = 1.0


def root_decides(decide: Callable[[], Any]) -> Any:
    """Run ``decide()`` on world rank 0 only and let every rank share its verdict.

    Returns ``decide()``'s result on rank 0 and None elsewhere. If it raised a user error
    (``ValueError``, ``TypeError``, ``OSError``), every rank raises
    :class:`~refbraid.errors.CollectiveError` with its message — before any rank has started
    work — so the job stops cleanly and the message is printed once. Outside MPI it is just
    ``decide()``.
    """
    if not launched_by_mpiexec():
        return decide()
    world = mpi_module().COMM_WORLD
    if world.Get_size() == 1:
        return decide()
    result, message = None, None
    if world.Get_rank() == 0:
        try:
            result = decide()
        except (ValueError, TypeError, OSError) as err:
            message = str(err)
    message = world.bcast(message, root=0)
    if message is not None:
        raise CollectiveError(message)
    return result


def one_line(err: BaseException) -> str:
    """``Type: message`` of an exception, without a traceback."""
    return "".join(traceback.format_exception_only(type(err), err)).strip()


@contextlib.contextmanager
def abort_on_error(comm=None, grace_s: float = ABORT_GRACE_S,
                   describe: Callable[[BaseException], str] = one_line, debug: bool = False):
    """Turn an exception on this rank into ``MPI_Abort`` of the whole job, after printing it.

    Use around entry points not started through ``python -m mpi4py`` so that one failing rank
    never leaves the others blocked. The rank prints ``describe(err)`` prefixed with its rank
    (one line; the traceback too with ``debug``), waits ``grace_s`` seconds — ranks that fail
    at the same moment print theirs meanwhile — and aborts. A
    :class:`~refbraid.errors.CollectiveError` is raised on every rank alike, so it propagates
    unchanged (no rank is left waiting; the caller prints it once). Outside MPI, or on one
    rank, every exception propagates unchanged.
    """
    try:
        yield
    except (SystemExit, CollectiveError):
        raise
    except BaseException as err:
        if not launched_by_mpiexec():
            raise
        MPI = mpi_module()
        world = comm.mpi if isinstance(comm, MPIComm) else (comm or MPI.COMM_WORLD)
        if world.Get_size() == 1:
            raise
        rank = MPI.COMM_WORLD.Get_rank()
        text = traceback.format_exc() if debug else describe(err)
        sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in text.splitlines()))
        sys.stderr.flush()
        time.sleep(grace_s)
        world.Abort(1)
        raise  # Abort does not return; never swallow the error if it did
