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

Messages: arrays travel as raw bytes behind a small shape/dtype header, other values pickled
(:mod:`refbraid.parallel.codec` has the layout and why). Device arrays (``to_device`` given:
the backend's ``asarray``) go straight from device memory with CUDA-aware MPI, else staged
through host buffers; never pickled (:mod:`refbraid.parallel.device_messages`).

Determinism. ``allreduce_sum`` gathers every rank's float and sums them in rank order, so every
rank holds the same float (the serial communicators do the same). ``sum_to_all`` reduces an
array to rank 0 and broadcasts the result: every rank holds the same bits, which keeps
replicated parameters identical across ranks.

Faults: :mod:`refbraid.parallel.faults` (an error on one rank ends the job, never a hang).

mpi4py is imported only when a communicator is built (it is the optional ``mpi`` extra).

Shape legend: P world ranks, D data-parallel groups, Q = P / D layer-parallel ranks per group.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.dtypes import numpy_dtype
from ..backends.host import to_host
from ..backends.portable import copy_of
from ..errors import CollectiveError
from .codec import DirectHeader, decode_message, encode_message, travels_raw
from .comm import SolverOrder, sums_in_rank_order
from .device_messages import (
    cuda_aware_mpi,
    exports_device_buffer,
    is_device_array,
    refuse_device,
    stage_tree,
    unstage_tree,
)
from .trace import active_recorder, payload_bytes

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


class MPIComm(SolverOrder):
    """MGRIT's communicator interface over an mpi4py communicator (see the module docstring).

    comm         the mpi4py communicator of the ranks that share the time grid
    reduce_comm  communicator for ``allreduce_sum`` (the residual norms); default ``comm``
    to_device    host array → device array (the backend's ``asarray``): lets device arrays
                 travel (direct with CUDA-aware MPI, else staged); None: host arrays only
    """

    def __init__(self, comm, reduce_comm=None, *, to_device=None, _reverted: bool = False,
                 _pending=None, _counters=None):
        for name in ("Get_rank", "Get_size", "Isend", "Mprobe"):
            if not callable(getattr(comm, name, None)):
                raise TypeError(f"`comm` must be an mpi4py communicator, got {comm!r}.")
        self.mpi = comm
        self._MPI = mpi_module()
        self.reduce_mpi = comm if reduce_comm is None else reduce_comm
        self.to_device = to_device
        #: device buffers go to MPI directly (CUDA-aware MPI), else through host buffers
        self.direct = to_device is not None and cuda_aware_mpi(self._MPI)
        self.rank = int(comm.Get_rank())
        self.size = int(comm.Get_size())
        self._reverted = bool(_reverted)
        #: (request, buffer) of every send not yet known complete; shared by ``reverted()``
        self._pending: list[tuple[Any, np.ndarray]] = [] if _pending is None else _pending
        #: neighbour messages sent / received, their bytes on the wire (header included) and
        #: seconds spent waiting in ``recv_prev``; shared by ``reverted()``
        self.counters = {"sends": 0, "recvs": 0, "bytes_sent": 0, "bytes_recv": 0,
                         "wait_s": 0.0} if _counters is None else _counters

    @classmethod
    def world(cls) -> MPIComm:
        """A communicator over a duplicate of ``COMM_WORLD`` (library messages stay apart)."""
        return cls(mpi_module().COMM_WORLD.Dup())

    # -- the Comm interface -------------------------------------------------------------
    def reverted(self) -> MPIComm:
        """The same ranks in reverse solver order (the adjoint's reversed grid)."""
        return type(self)(self.mpi, self.reduce_mpi, to_device=self.to_device,
                       _reverted=not self._reverted, _pending=self._pending,
                       _counters=self.counters)

    def send_next(self, value: Any) -> None:
        """Non-blocking send of ``value`` to the next block (a copy is taken now).

        Arrays travel as raw bytes, anything else pickled (see the module docstring)."""
        device = is_device_array(value)
        if device and self.to_device is None:  # on every rank, the last one too
            refuse_device(value)
        nxt = self._neighbour(+1)
        if nxt is None:
            return
        MPI = self._MPI
        t0 = time.perf_counter()
        self._pending[:] = [(r, b) for r, b in self._pending if not r.Test()]
        direct = device and self.direct and exports_device_buffer(value)
        buf = encode_message(value, direct=direct)
        request = self.mpi.Isend([buf, MPI.BYTE], dest=nxt, tag=TAG_NEIGHBOUR)
        self._pending.append((request, buf))  # the buffer lives until the send completes
        if direct:  # the device buffer itself, a copy: the caller may overwrite its array
            payload = value.copy()
            request = self.mpi.Isend([payload, MPI.BYTE], dest=nxt, tag=TAG_NEIGHBOUR)
            self._pending.append((request, payload))
        self.counters["sends"] += 1
        self.counters["bytes_sent"] += buf.nbytes
        rec = active_recorder()
        if rec is not None:
            rec.send(nxt, payload_bytes(value), t0, time.perf_counter())

    def recv_prev(self) -> Any | None:
        """The previous block's value (blocking), or None on the first block."""
        prv = self._neighbour(-1)
        if prv is None:
            return None
        MPI = self._MPI
        t0 = time.perf_counter()
        status = MPI.Status()
        message = self.mpi.Mprobe(source=prv, tag=TAG_NEIGHBOUR, status=status)
        buf = np.empty(status.Get_count(MPI.BYTE), np.uint8)
        message.Recv([buf, MPI.BYTE])
        t1 = time.perf_counter()
        self.counters["wait_s"] += t1 - t0
        self.counters["recvs"] += 1
        self.counters["bytes_recv"] += buf.nbytes
        value = decode_message(buf, self.to_device)
        if isinstance(value, DirectHeader):  # the device buffer follows (CUDA-aware MPI)
            value = self.to_device(np.empty(value.shape, value.dtype))
            self.mpi.Recv([value, MPI.BYTE], source=prv, tag=TAG_NEIGHBOUR)
        rec = active_recorder()
        if rec is not None:
            rec.recv(prv, payload_bytes(value), t0, t1)
        return value

    def allreduce_sum(self, value: float) -> float:
        """Σ over ``reduce_comm`` of ``value``, summed in rank order: the same float everywhere."""
        return self.allreduce_sums([value])[0]

    def allreduce_sums(self, values) -> list[float]:
        """:meth:`allreduce_sum` of each of ``values``, in one ``Allgather``.

        The floats are gathered into a float64 buffer (exact: a Python float is a float64) and
        summed in Python, in rank order, so the order never depends on the MPI library."""
        t0 = time.perf_counter()
        mine = np.array([float(v) for v in values], np.float64)
        every = np.empty((self.reduce_mpi.Get_size(), mine.size), np.float64)
        self.reduce_mpi.Allgather(mine, every)
        rec = active_recorder()
        if rec is not None:
            rec.collective("allreduce", mine.nbytes, t0, time.perf_counter())
        return sums_in_rank_order(every)

    def gather(self, value: Any, root: int = 0) -> list[Any] | None:
        """Every rank's ``value`` in rank order on ``root``; None elsewhere."""
        t0 = time.perf_counter()
        out = self.mpi.gather(stage_tree(value, self.to_device), root=_check_root(root, self.size))
        out = unstage_tree(out, self.to_device)
        rec = active_recorder()
        if rec is not None:
            rec.collective("gather", payload_bytes(value), t0, time.perf_counter())
        return out

    # -- collectives used by the distributed gradient and the linear operators ------------
    def bcast(self, value: Any, root: int = 0) -> Any:
        """``root``'s value on every rank (a copy on ``root`` too; ``value`` is ignored elsewhere).

        A numeric NumPy array (:func:`travels_raw`) goes in two collectives: its dtype and shape
        pickled, then its bytes with ``Bcast`` into an array every rank allocates (C order).
        Anything else is pickled (one collective)."""
        root = _check_root(root, self.size)
        t0 = time.perf_counter()
        out = self._bcast(value, root)
        rec = active_recorder()
        if rec is not None:
            rec.collective("bcast", payload_bytes(out), t0, time.perf_counter())
        return out

    def _bcast(self, value: Any, root: int) -> Any:
        head = mine = None
        if self.rank == root:
            if is_device_array(value):  # staged: its host copy travels, back to the device
                if self.to_device is None:
                    refuse_device(value)
                if self.size == 1:  # nobody to send to: a copy on the device
                    return copy_of(value)
                value, mine = np.asarray(to_host(value)), copy_of(value)
                head = ("staged", value.dtype.str, value.shape)
            else:
                head = ("raw", value.dtype.str, value.shape) if travels_raw(value) \
                    else ("pickled", value)
        head = self.mpi.bcast(head, root=root)
        if head[0] == "pickled":
            return head[1]
        out = np.empty(head[2], np.dtype(head[1]))
        if self.rank == root:
            np.copyto(out, value)
        self.mpi.Bcast([out.reshape(-1).view(np.uint8), self._MPI.BYTE], root=root)
        if mine is not None:  # the root keeps its own device copy: no trip back
            return mine
        return self.to_device(out) if head[0] == "staged" else out

    def allgather(self, value: Any) -> list[Any]:
        """Every rank's value, in rank order, on every rank."""
        return unstage_tree(self.mpi.allgather(stage_tree(value, self.to_device)), self.to_device)

    def alltoall(self, values: list[Any]) -> list[Any]:
        """``values[q]`` goes to rank q; returns what every rank sent to this one."""
        if len(values) != self.size:
            raise ValueError(f"`values` must hold one entry per rank ({self.size}), "
                             f"got {len(values)}.")
        sent = stage_tree(list(values), self.to_device)
        return unstage_tree(self.mpi.alltoall(sent), self.to_device)

    def scatter(self, values: list[Any] | None, root: int = 0) -> Any:
        """``values[q]`` (given on ``root``) to rank q."""
        root = _check_root(root, self.size)
        if self.rank == root and (values is None or len(values) != self.size):
            raise ValueError(f"`values` on the root must hold one entry per rank ({self.size}).")
        values = stage_tree(values, self.to_device)
        return unstage_tree(self.mpi.scatter(values, root=root), self.to_device)

    def sum_to_all(self, array: np.ndarray) -> np.ndarray:
        """Σ over ranks of ``array`` on every rank, bit-identical everywhere (Reduce + Bcast);
        a device array directly with CUDA-aware MPI, else through a host buffer."""
        if not is_device_array(array):
            return sum_to_all(self.mpi, array)
        if self.to_device is None:
            refuse_device(array)
        if self.size == 1:  # a sum over one rank: a copy where the array lives
            return copy_of(array)
        if self.direct and exports_device_buffer(array):
            return sum_to_all(self.mpi, array.copy(), on_device=True)
        return self.to_device(sum_to_all(self.mpi, np.asarray(to_host(array))))

    def barrier(self) -> None:
        self.mpi.Barrier()

    def wait_sends(self) -> None:
        """Complete every outstanding ``send_next`` (call before freeing the communicator)."""
        self._MPI.Request.Waitall([r for r, _ in self._pending])
        self._pending.clear()

    def __repr__(self) -> str:
        return (f"MPIComm(rank={self.rank}, size={self.size}, reverted={self._reverted}, "
                f"reduce_size={self.reduce_mpi.Get_size()})")


def sum_to_all(comm, array: np.ndarray, on_device: bool = False) -> np.ndarray:
    """Σ over the ranks of ``comm`` of a NumPy array, the same bits on every rank.

    ``MPI_Reduce`` to rank 0, then ``MPI_Bcast``: one rank does the arithmetic, so replicated
    copies cannot drift apart by round-off (an ``MPI_Allreduce`` may order sums differently
    on different ranks). ``on_device``: ``array`` is a contiguous device array (CuPy) that a
    CUDA-aware MPI reads in place; it is overwritten with the sum.
    """
    a = array if on_device else np.ascontiguousarray(array)
    if numpy_dtype(a.dtype).kind not in "fc":
        raise TypeError(f"`array` must be a floating-point array, got dtype {a.dtype}.")
    if comm.Get_size() == 1:
        return a.copy()
    MPI = mpi_module()
    out = a.copy() if on_device else np.empty_like(a)
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

    def carrying(self, to_device) -> Topology:
        """The same ranks and communicators, able to move device arrays (``to_device``: the
        backend's ``asarray``; see :class:`MPIComm`). ``self`` when they already can."""
        if self.world.to_device == to_device:
            return self

        def on(c: MPIComm) -> MPIComm:
            return MPIComm(c.mpi, c.reduce_mpi, to_device=to_device)

        return Topology(world=on(self.world), layer=on(self.layer), data=on(self.data),
                        group=self.group, n_groups=self.n_groups)


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
    """Split ``world`` (default ``COMM_WORLD``) into ``data_parallel`` groups (see module doc);
    :meth:`Topology.carrying` lets device arrays travel on them (:class:`MPIComm`).

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
