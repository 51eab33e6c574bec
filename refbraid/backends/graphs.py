"""Record a device function once as a CUDA graph; replay it with one launch (``cupy``).

A gradient on one GPU is bound by the host: hundreds of small launches, each costing tens of
microseconds of Python, CuPy and driver time while the GPU idles (docs/gpu_layer_parallel.md).
A CUDA graph records those launches once — their kernels, arguments and memory addresses —
and replays all of them with one call. :func:`record` does it for a function of no
arguments that reads and writes device arrays:

1. *warm-up*: the function runs once for real, inside
   :func:`~refbraid.backends.capture_state.host_reads_deferred`: kernels compile, caches of
   index arrays are copied over, the memory pool learns the sizes;
2. *capture*: it runs again on a capturing stream, inside
   :func:`~refbraid.backends.capture_state.recording_graph` (no host↔device traffic: a
   capture cannot wait for the device, and a recorded copy would read freed host memory);
   nothing executes, every launch is recorded (``cupy.matmul`` then calls cuBLAS directly,
   :mod:`.cupy_blas`: CuPy refuses cuBLAS on a capturing stream; the warm-up uses the same
   path);
3. *replay*: :meth:`Recording.replay` launches the graph; the arrays the capture returned
   (:attr:`Recording.outputs`) then hold the replay's results.

A replay reads and writes the very addresses of the capture, so both passes allocate from a
memory pool of the recording's own, which nothing else allocates from afterwards: memory
freed during the capture and reused by it is reused identically by every replay, and no
array made later by other code can sit where a replay writes. Inputs are whatever arrays the
function reads: overwrite them in place (``a[...] = new``) before a replay. The stream is
ordered after the caller's current stream at each replay, and the caller's stream after it.

On the CuPy stand-in of the tests (:mod:`.cupy_standin`) a :class:`StandinRecording` runs
the function again at each replay under the same contexts: it proves what the stand-in
shares with a capture — no host read, no host→device copy, no host-made address table, the
inputs flowing through — and not what it does not: that CuPy's kernels record, or that the
replayed addresses are sound (the ``gpu`` tests compare replays with eager gradients).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .capture_state import host_reads_deferred, recording_graph
from .cupy_blas import recordable_gemms


class Recording:
    """A recorded function: :attr:`outputs` (what it returned when recorded) and
    :meth:`replay`."""

    outputs: Any

    def replay(self) -> Any:  # pragma: no cover - the subclasses'
        raise NotImplementedError


class CupyRecording(Recording):
    """A CUDA graph of ``fn`` on CuPy (module docstring)."""

    def __init__(self, fn: Callable[[], Any], cupy, warmups: int = 1):
        self._cupy = cupy
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.pool = cupy.cuda.MemoryPool()  # this recording's own (module docstring)
        caller = cupy.cuda.get_current_stream()
        self.stream.wait_event(caller.record())
        with cupy.cuda.using_allocator(self.pool.malloc), self.stream, \
                recordable_gemms(cupy):  # CuPy's own matmul refuses a capturing stream
            with host_reads_deferred():
                for _ in range(warmups):
                    fn()
            self.stream.begin_capture()
            try:
                with recording_graph():
                    self.outputs = fn()
            except BaseException:
                try:
                    self.stream.end_capture()
                except Exception:  # the capture was invalidated: the first error is the news
                    pass
                raise
            self.graph = self.stream.end_capture()
        self.graph.upload(self.stream)
        caller.wait_event(self.stream.record())

    def replay(self) -> Any:
        caller = self._cupy.cuda.get_current_stream()
        self.stream.wait_event(caller.record())
        self.graph.launch(self.stream)
        caller.wait_event(self.stream.record())
        return self.outputs


class StandinRecording(Recording):
    """The stand-in's recording: ``fn`` runs again at each replay (module docstring)."""

    def __init__(self, fn: Callable[[], Any], warmups: int = 1):
        from .launch_model import tracking

        self._fn = fn
        with host_reads_deferred():
            for _ in range(warmups):
                fn()
        with recording_graph(), tracking() as capture:
            self.outputs = fn()
        #: the launches the capture made: the kernel nodes a CUDA graph of ``fn`` holds (what
        #: the device, not the host, works through at each replay), and their counts (the
        #: bytes they move: :class:`~refbraid.backends.launch_model.Tally`)
        self.nodes = capture.tally.launches
        self.work = capture.tally

    def replay(self) -> Any:
        """Run the function again; a counting tracker sees one launch (the graph's), which
        writes the outputs' arrays."""
        from .launch_model import current, paused
        from .standin_array import storage_of

        tracker = current()
        with paused(), recording_graph():
            self.outputs = self._fn()
        if tracker is not None:
            tracker.launch([], storage_of(self.outputs), "graph")
        return self.outputs


def record(fn: Callable[[], Any], xp, warmups: int = 1) -> Recording:
    """Record ``fn()`` (no arguments; device arrays in, device arrays out) on the array
    module ``xp``: CuPy (a CUDA graph) or the CuPy stand-in. ValueError for anything else:
    NumPy and Numba's CUDA kernels (launched on the legacy default stream) cannot be
    captured."""
    if getattr(xp, "STANDIN", False):
        return StandinRecording(fn, warmups)
    if getattr(xp, "__name__", "") == "cupy" and hasattr(xp, "cuda"):
        return CupyRecording(fn, xp, warmups)
    raise ValueError(f"CUDA graphs need the `cupy` backend (CuPy arrays); the arrays here "
                     f"are {getattr(xp, '__name__', xp)!r}.")
