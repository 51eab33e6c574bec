"""``refbraid train --trace``: the execution trace of one whole training step, on every rank.

:class:`TracedGradient` wraps a run's gradient and records its :data:`TRACED_STEP`-th call
(the second training step: the first one pays for warm-up — Numba compilation, caches) with a
:class:`~refbraid.parallel.trace.Recorder`: every step application of both MGRIT solves with
its level, fine indices and direction, and — through the communicator — every neighbour
message and reduction. Under ``mpiexec`` every rank records its own events after a barrier (one
time origin per rank, taken as the barrier ends, so the ranks' clocks agree to the barrier's
skew) and :func:`write_trace` gathers them to world rank 0, which writes ``trace.json`` (the
events) and ``timeline.png`` (one row per rank, the critical path drawn in red).

All other calls pass straight through; attributes of the wrapped gradient (the sharded MPI
gradient's hooks, ``logits``, ``is_root``) stay visible.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..atomic import save_figure, write_json
from .mpi import launched_by_mpiexec, mpi_module
from .plots import plot_timeline
from .trace import Recorder, Trace, critical_path, recording

TRACED_STEP = 2  # which call of the gradient is recorded (1-based); the first one warms up
TRACE_FILE = "trace.json"
TIMELINE_FILE = "timeline.png"


def _world():
    if not launched_by_mpiexec():
        return None
    world = mpi_module().COMM_WORLD
    return world if world.Get_size() > 1 else None


class TracedGradient:
    """``gradient(params, x, labels)`` that records its ``step``-th call (module docstring)."""

    def __init__(self, gradient, step: int = TRACED_STEP):
        self.gradient = gradient
        self.step = step
        self.calls = 0
        self.trace: Trace | None = None

    def __call__(self, params, x, labels):
        self.calls += 1
        if self.calls != self.step:
            return self.gradient(params, x, labels)
        world = _world()
        if world is not None:
            world.Barrier()
        rank = 0 if world is None else world.Get_rank()
        with recording(Recorder(rank, time.perf_counter())) as rec:
            out = self.gradient(params, x, labels)
        self.trace = rec.trace()
        return out

    def __getattr__(self, name: str) -> Any:  # the wrapped gradient's hooks and attributes
        return getattr(self.gradient, name)


def write_trace(traced: TracedGradient, out: Path | None, title: str) -> dict[str, Path]:
    """Gather the recorded step to world rank 0 and write the trace and its timeline there.

    Collective under MPI. Returns the files written (none on other ranks, or when no step was
    recorded because the run had fewer than :data:`TRACED_STEP` steps).
    """
    world = _world()
    mine = traced.trace
    traces = [mine] if world is None else world.gather(mine, root=0)
    if out is None or traces is None or any(t is None for t in traces):
        return {}
    trace = Trace.merge(traces)
    path = critical_path(trace)
    events = [e._asdict() for e in trace]
    files = {"trace": write_json(out / TRACE_FILE, {"step": traced.step, "events": events})}
    fig = plot_timeline(trace, path, title=f"{title}: training step {traced.step}")
    files["timeline"] = save_figure(fig, out / TIMELINE_FILE)
    return files
