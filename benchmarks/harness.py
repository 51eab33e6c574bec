"""The one timer, the one result record and its table and JSON file, and the MPI workers.

Timer. :func:`measure` calls ``fn`` ``warmup`` times untimed, then ``repeat`` times timed, and
keeps both clocks of every call: wall (``time.perf_counter``) and CPU time of this process
(``time.process_time``: on a shared machine, the time the call itself used). Under MPI
(``comm``) every timed call starts after a barrier and counts as the slowest rank's time.
``min_seconds`` raises ``repeat`` until the timed calls fill that many seconds (judged from the
last warm-up call, at most ``max_repeat``): a median of seven 6-ms steps is 42 ms of one
process, at the mercy of one burst of another tenant. Report the median (or the minimum: the
call least disturbed) and form ratios from timings taken in the same run.

Results. A suite returns :class:`Result` records — suite, case, the case's parameters and its
named values with units — and :func:`table` prints them all as one table (one line per value),
:func:`write_json` as one JSON file with the run's metadata (load, versions, allocator).

Workers. :func:`launch` runs ``python -m mpi4py -m <module> --worker <json>`` on ``n`` ranks
(one thread each) and returns the JSON records rank 0 printed after :data:`TAG`;
:func:`fresh` runs ``python -m <module> --worker <json>`` in one new process without MPI (for
a case that needs its own environment, e.g. Numba's CUDA simulator switched on). Every
worker calls :func:`prepare_worker` first: glibc malloc's thresholds pinned
(:func:`refbraid.runtime.pin_allocator`), so a case's time does not depend on what ran before
it in the process (docs/scaling_overhead.md §5).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TAG = "BENCH "  # a worker's result line on stdout
SIZES = ("tiny", "quick", "full")  # tiny: the test's sizes (checks the output, times nothing)


# ----------------------------------------------------------------------------- the timer
@dataclass(frozen=True)
class Timing:
    """Seconds of the timed calls of :func:`measure` on both clocks (slowest rank under MPI)."""

    wall: tuple[float, ...]
    cpu: tuple[float, ...]

    def median(self, clock: str = "wall") -> float:
        return statistics.median(getattr(self, clock))

    def min(self, clock: str = "wall") -> float:
        return min(getattr(self, clock))


def measure(fn: Callable[[], object], repeat: int, warmup: int = 1, comm=None,
            min_seconds: float = 0.0, max_repeat: int = 101) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then ``repeat`` (or more, see the module
    docstring) timed ones; ``comm`` an mpi4py communicator whose slowest rank counts."""
    if repeat < 1 or warmup < 0:
        raise ValueError(f"`repeat` must be >= 1 and `warmup` >= 0, got {repeat}, {warmup}.")
    last = 0.0
    for _ in range(warmup):
        last = _timed(fn, comm)[0]
    if min_seconds > 0 and warmup > 0:
        repeat = min(max(repeat, math.ceil(min_seconds / max(last, 1e-6))), max_repeat)
    wall, cpu = zip(*(_timed(fn, comm) for _ in range(repeat)), strict=True)
    return Timing(wall, cpu)


def _timed(fn, comm) -> tuple[float, float]:
    if comm is not None:
        comm.Barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    if comm is not None:
        from mpi4py import MPI

        dt, dc = comm.allreduce(dt, op=MPI.MAX), comm.allreduce(dc, op=MPI.MAX)
    return dt, dc


# ----------------------------------------------------------------------------- results
@dataclass
class Result:
    """One case of one suite: its parameters and its named values (``add`` keeps the order)."""

    suite: str
    case: str
    params: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)
    units: dict = field(default_factory=dict)

    def add(self, name: str, value, unit: str = "") -> Result:
        self.values[name] = value
        self.units[name] = unit
        return self


def _cell(value) -> str:
    if isinstance(value, str):
        return value if len(value) <= 30 else value[:29] + "…"  # the JSON file keeps it whole
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.3e}" if value != 0 and (abs(value) < 1e-2 or abs(value) >= 1e6) \
            else f"{value:.4g}"
    return str(value)


def table(results: Sequence[Result]) -> str:
    """All results as one table: suite, case, value name, value, unit (one line per value)."""
    rows = [("suite", "case", "quantity", "value", "unit")]
    for r in results:
        rows += [(r.suite, r.case, k, _cell(v), r.units.get(k, "")) for k, v in r.values.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = []
    for i, row in enumerate(rows):
        cells = [c.ljust(w) if j < 3 else c.rjust(w) if j == 3 else c
                 for j, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("-" * len(lines[0]))
    return "\n".join(lines)


def metadata(size: str, suites: Sequence[str]) -> dict:
    """What a reader needs to judge the numbers: when, where, how loaded, which versions."""
    import numpy as np

    from refbraid.runtime import allocator_state

    return {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "size": size,
            "suites": list(suites), "host": platform.node(), "cpus": os.cpu_count(),
            "load_average": os.getloadavg()[0], "python": sys.version.split()[0],
            "numpy": np.__version__, "allocator": allocator_state(),
            "threads": {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS")}}


def write_json(path: str | os.PathLike, meta: dict, notes: dict, results: Sequence[Result]) \
        -> None:
    """``{"meta": …, "notes": {suite: [lines]}, "results": [Result as a dict, …]}``."""
    doc = {"meta": meta, "notes": notes, "results": [asdict(r) for r in results]}
    Path(path).write_text(json.dumps(doc, indent=1, default=str) + "\n")


# ----------------------------------------------------------------------------- workers
def prepare_worker() -> str:
    """First thing in every process that times: pin malloc's thresholds (unless
    ``REFBRAID_PIN_ALLOCATOR=0``); returns the allocator's state line."""
    from refbraid.runtime import allocator_state, pin_allocator

    pin_allocator()
    return allocator_state()


def emit(record: dict) -> None:
    """A worker's result: one tagged JSON line on stdout (rank 0 only, by the caller)."""
    print(TAG + json.dumps(record), flush=True)


def records(output: str) -> list[dict]:
    return [json.loads(line[len(TAG):]) for line in output.splitlines() if line.startswith(TAG)]


def launch(n: int, module: str, spec: dict, timeout: float = 1800,
           env: dict[str, str] | None = None) -> list[dict]:
    """Run ``module``'s worker on ``n`` ranks (``mpiexec``) and return its records."""
    from refbraid.parallel.launch import run_mpi

    argv = ["-m", module, "--worker", json.dumps(spec)]
    return records(run_mpi(n, argv, timeout=timeout, cwd=ROOT, env=env).check().output)


class WorkerFailed(RuntimeError):
    """A worker process exited with an error; ``records`` holds what it emitted before."""

    def __init__(self, message: str, found: list[dict]):
        super().__init__(message)
        self.records = found


def fresh(module: str, spec: dict, env: dict[str, str] | None = None,
          timeout: float = 1800) -> list[dict]:
    """Run ``module``'s worker in one new process (no MPI; ``env`` added to this environment)
    and return its records; a failing worker raises :class:`WorkerFailed` with its output's
    tail (and the records it emitted before, for a suite that streams its rows)."""
    argv = [sys.executable, "-m", module, "--worker", json.dumps(spec)]
    proc = subprocess.run(argv, cwd=ROOT, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise WorkerFailed(f"`{' '.join(argv[1:3])}` failed (exit {proc.returncode}):\n"
                           + (proc.stdout + proc.stderr)[-4000:], records(proc.stdout))
    return records(proc.stdout)


def worker_main(worker: Callable[[dict], None], argv: Sequence[str] | None = None) -> None:
    """The ``__main__`` of a suite module run by :func:`launch`: ``--worker <json>``."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "--worker":
        raise SystemExit("run the suites with `python -m benchmarks` (this is a worker)")
    worker(json.loads(argv[1]))
