"""What a GPU pays for, counted without one: launches, copies, synchronisations, critical path.

A GPU gradient whose layers are small is bound by launches, not by arithmetic: every kernel
launch costs the host a few microseconds (more from Python), whatever the kernel does. So the
cost model here counts events, never times. A :class:`Tracker` is told, in program order,
what the device does:

* :meth:`Tracker.launch` — one kernel (a CuPy operation, a Numba CUDA kernel, a cuBLAS GEMM)
  reading some arrays and writing others;
* :meth:`Tracker.to_device` — a host→device copy (an ``asarray`` of host data, a NumPy index
  array handed to a device array);
* :meth:`Tracker.to_host` — a device→host copy; the host waits for the value, so it is also a
  synchronisation (``float(x)``, ``x.get()``, ``refbraid.backends.host.to_host``);
* :meth:`Tracker.fresh` — new memory (an allocation carries no history, even where an
  allocator hands back an address used before).

**Critical path** (the longest chain of dependent launches). Launch B *depends on* launch A
when B reads memory A wrote (true dependence), writes memory A read (anti-dependence) or
writes memory A wrote (output dependence), over overlapping byte ranges; and B depends on
every launch whose result the host waited for before issuing B (a synchronisation orders
what follows behind the value it read). With ``depth(B) = 1 + max(depth of the launches B
depends on)`` (0 for none), the critical path is the largest depth. It is the number of
launches one after another that no amount of streams, graphs or hardware parallelism can
overlap: serial backprop's is about its launch count (each layer reads the last one's
output); a layer-parallel sweep's independent intervals add their launches to the *count*
but only one interval's worth to the *depth*. On one stream every launch still pays its
issue cost, so both numbers matter: the count is the host's issue time, the critical path
the bound a batched (or multi-stream, or graph-captured) schedule can approach.

Byte ranges are those of the NumPy memory behind each array (a strided view spans from its
first to its last element): exact for rows and slabs of C-ordered stacks, conservative for
strided views (they may depend on rows between their elements).

**Bytes moved** (what the device's memory carries: the floor of a launch's time once the
host's cost per launch is gone, as in a CUDA graph's replay). Each launch is charged the
bytes of every array it reads and every array it writes, once each:
``min(elements × itemsize, span)`` with ``span`` the byte range above — a window view that
reads each element of its base nine times (im2col's) is charged its base's bytes once. That
is the traffic of a kernel that reads what it needs once and keeps nothing between launches:
a GPU's caches can make the real traffic smaller (an H200's 50 MB L2 holds a small
network's state from one launch to the next) and a kernel that re-reads from memory larger.
A count, never a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Tally:
    """Counts of one run: ``launches`` kernels, ``h2d`` / ``d2h`` copies, ``syncs`` host
    synchronisations, the ``critical_path`` in launches and the ``bytes_moved`` by the
    launches (module docstring); per launch name, the launches and their bytes."""

    launches: int = 0
    h2d: int = 0
    d2h: int = 0
    syncs: int = 0
    critical_path: int = 0
    bytes_moved: int = 0
    by_name: dict[str, int] = field(default_factory=dict)
    bytes_by_name: dict[str, int] = field(default_factory=dict)

    @property
    def copies(self) -> int:
        return self.h2d + self.d2h

    def row(self) -> dict[str, int]:
        return {"launches": self.launches, "critical_path": self.critical_path,
                "copies": self.copies, "h2d": self.h2d, "d2h": self.d2h, "syncs": self.syncs}


def _extent(a: np.ndarray) -> tuple[int, int, int]:
    """(buffer key, first byte, one past the last byte) of the memory ``a`` views."""
    base = a
    while isinstance(base.base, np.ndarray):
        base = base.base
    start = a.__array_interface__["data"][0]
    lo = hi = start
    for n, s in zip(a.shape, a.strides, strict=True):
        if n == 0:
            return base.__array_interface__["data"][0], start, start
        if s < 0:
            lo += (n - 1) * s
        else:
            hi += (n - 1) * s
    return base.__array_interface__["data"][0], lo, hi + a.itemsize


class Tracker:
    """Receives the device events of a run and keeps the :class:`Tally` (module docstring)."""

    def __init__(self):
        self.tally = Tally()
        self._frontier = 0  # depth the host has waited for (synchronisations)
        # per buffer: [lo, hi, depth, wrote] records of the latest accesses
        self._records: dict[int, list[list]] = {}

    # ------------------------------------------------------------------ dependencies
    def _depth_of(self, extent: tuple[int, int, int], writing: bool) -> int:
        key, lo, hi = extent
        depth = 0
        for r in self._records.get(key, ()):
            if r[0] < hi and lo < r[1] and (writing or r[3]):
                depth = max(depth, r[2])
        return depth

    def _record(self, extent: tuple[int, int, int], depth: int, wrote: bool) -> None:
        key, lo, hi = extent
        recs = self._records.setdefault(key, [])
        if wrote:  # a write after everything it overlaps: records it covers are dominated
            recs[:] = [r for r in recs if not (lo <= r[0] and r[1] <= hi)]
        recs.append([lo, hi, depth, wrote])

    # ------------------------------------------------------------------ events
    def launch(self, reads: Iterable[np.ndarray], writes: Iterable[np.ndarray],
               name: str = "kernel") -> int:
        """One kernel reading ``reads`` and writing ``writes``; returns its depth."""
        accesses = [(a, _extent(a), False) for a in reads]
        accesses += [(a, _extent(a), True) for a in writes]
        depth = 1 + max([self._frontier,
                         *(self._depth_of(ext, wrote) for _, ext, wrote in accesses)])
        for _, ext, wrote in accesses:
            self._record(ext, depth, wrote)
        # each array once, at the smaller of its elements' bytes and its span (docstring)
        moved = sum(min(a.nbytes, hi - lo) for a, (_, lo, hi), _ in accesses)
        t = self.tally
        t.launches += 1
        t.critical_path = max(t.critical_path, depth)
        t.bytes_moved += moved
        t.by_name[name] = t.by_name.get(name, 0) + 1
        t.bytes_by_name[name] = t.bytes_by_name.get(name, 0) + moved
        return depth

    def fresh(self, a: np.ndarray) -> None:
        """``a`` is new memory: forget what happened at its addresses before."""
        key, lo, hi = _extent(a)
        recs = self._records.get(key)
        if recs:
            recs[:] = [r for r in recs if not (r[0] < hi and lo < r[1])]
        if a.base is None and key in self._records and not self._records[key]:
            del self._records[key]

    def to_device(self, a: np.ndarray) -> None:
        """A host→device copy into the new array ``a`` (ordered after what the host waited
        for, before nothing else: no launch)."""
        self.fresh(a)
        self._record(_extent(a), self._frontier, True)
        self.tally.h2d += 1

    def to_host(self, a: np.ndarray) -> None:
        """A device→host copy of ``a``: the host waits for the launches that wrote it."""
        self._frontier = max(self._frontier, self._depth_of(_extent(a), False))
        self.tally.d2h += 1
        self.tally.syncs += 1

    def synchronize(self) -> None:
        """A whole-device synchronisation: the host waits for every launch so far."""
        self._frontier = self.tally.critical_path
        self.tally.syncs += 1


_active: list[Tracker] = []


def current() -> Tracker | None:
    """The tracker counting now (innermost :func:`tracking`), or None."""
    return _active[-1] if _active else None


@contextmanager
def paused() -> Iterator[None]:
    """Nothing is counted inside (a CUDA graph's replay: its launches are the device's, the
    host issues one; :class:`~refbraid.backends.graphs.StandinRecording`)."""
    _active.append(None)
    try:
        yield
    finally:
        _active.pop()


class tracking:
    """``with tracking() as tracker:`` — count the device events of the block."""

    def __enter__(self) -> Tracker:
        self.tracker = Tracker()
        _active.append(self.tracker)
        return self.tracker

    def __exit__(self, *exc) -> None:
        _active.remove(self.tracker)
