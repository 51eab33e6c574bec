"""What a real ``mpiexec -n P`` sharded step pays that the virtual cluster does not charge.

bench_scaling.py's MPI worker calls :func:`measure_case` after timing a case; it measures, on
every rank, two things beside the untraced step time:

* ``kernel``  the serial step kernel, i.e. sequential backprop of the whole network
              (``network.backprop``: every step application forward and adjoint, no MPI),
              timed on ALL ranks at once after a barrier (two warm-ups, then the median of
              max(``repeat``, 9), slowest rank).
              Under ``-n 1`` it runs alone; under ``-n 2`` two processes run it together and
              share the memory bus and caches (and, on a VM, the host's cores). The ratio

                  bus(P) = kernel(P ranks at once) / kernel(1 rank alone)

              is a measured contention factor: how much slower the same arithmetic is when P
              ranks compute at the same time on this machine. It is measured on the kernel,
              NOT on the layer-parallel step being predicted;
* ``parts``   the sharded step traced (``traced`` steps, the one with the median wall time):
              per rank the time inside step boxes, inside communication (receives, sends,
              collectives: the waits included) and the rest (wall − both: opening, closing,
              loss, MGRIT bookkeeping, sharding glue, the optimizer).

:func:`virtual_parts` splits the virtual twin (``DistributedGradient`` on the virtual
cluster, :mod:`refbraid.scaling.virtual_training`) the same way per rank: the calibrated
step costs carry the bookkeeping ``o`` inside the step boxes, so its "steps + rest" is the
boxes plus ``extra`` on the rank's share, and its comm is its receives and collectives. The
bench prints both side by side for every P = 2 row that misses, in ms: the measured part the
model lacks.
"""

from __future__ import annotations

import statistics
import time

#: the depth n of :func:`fixed_cost`'s pair (n/2, n): the smallest bench depth per network
SMALL_DEPTH = {"resnet": 64, "conv": 32}


def _parts(events, wall: float) -> dict[str, float]:
    from refbraid.parallel.trace import RECV, SEND, STEP

    steps = sum(e.duration for e in events if e.kind == STEP)
    comm = sum(e.duration for e in events if e.kind in (RECV, SEND) or e.is_collective)
    return {"wall": wall, "steps": steps, "comm": comm, "rest": wall - steps - comm}


def measure_case(world, net, params, x, y, bk, step, repeat: int, traced: int = 5) -> dict:
    """Under mpiexec, after ``step`` (the sharded training step) was timed: the kernel time
    with all ranks computing at once and the traced per-rank parts (module docstring).
    Returns rank 0's view: ``{"kernel": s, "parts": [per rank dict]}`` (others: None)."""
    from mpi4py import MPI

    from refbraid.network import backprop
    from refbraid.parallel.trace import Recorder, recording

    def kernel():
        backprop(net, params, x, y, bk)

    kernel()
    kernel()
    times = []
    for _ in range(max(repeat, 9)):
        world.Barrier()
        t0 = time.perf_counter()
        kernel()
        times.append(world.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    runs = []
    for _ in range(traced):
        world.Barrier()
        origin = time.perf_counter()
        with recording(Recorder(world.Get_rank(), origin)) as rec:
            step()
        wall = time.perf_counter() - origin
        runs.append((world.allreduce(wall, op=MPI.MAX), _parts(list(rec.trace()), wall)))
    walls = sorted(r[0] for r in runs)
    pick = next(p for w, p in runs if w == walls[len(walls) // 2])  # same index on all ranks
    parts = world.gather(pick, root=0)
    return {"kernel": statistics.median(times), "parts": parts} if world.Get_rank() == 0 \
        else {}


def virtual_parts(dist, extra: float) -> list[dict[str, float]]:
    """Per virtual rank of the predicted step (``StepPrediction.run``): steps (boxes, the
    bookkeeping ``o`` included) + ``extra`` on the busiest share as "compute", and comm."""
    from refbraid.parallel.trace import RECV, SEND, STEP

    run, t0 = dist.run.run, dist.run.t0
    end = t0 + dist.run.step_time
    out = []
    for r in range(len(run.results)):
        ev = [e for e in run.trace if e.rank == r and t0 <= e.t0 < end]
        steps = sum(e.duration for e in ev if e.kind == STEP)
        comm = sum(e.duration for e in ev if e.kind in (RECV, SEND) or e.is_collective)
        out.append({"compute": steps + extra, "comm": comm})
    return out


def gap_line(measured: dict, virtual: list[dict], bus: float) -> str:
    """The P = 2 decomposition printed under a miss: per rank measured compute (steps + rest)
    and comm against the virtual twin's, and the memory-bus factor, ms."""
    cells = []
    for r, (m, v) in enumerate(zip(measured["parts"], virtual, strict=True)):
        compute = m["steps"] + m["rest"]
        cells.append(f"rank {r}: compute {1e3 * compute:.2f} (steps {1e3 * m['steps']:.2f} + "
                     f"rest {1e3 * m['rest']:.2f}) vs virtual {1e3 * v['compute']:.2f}, comm "
                     f"{1e3 * m['comm']:.2f} vs {1e3 * v['comm']:.2f}")
    return f"    measured vs virtual (ms, traced): {'; '.join(cells)}; bus× {bus:.3f}"


def fixed_cost(case: dict, rounds: int = 7, warmup: int = 2) -> tuple[float, float, float]:
    """The part of the one-rank sharded training step that does not grow with the depth:

        F = 2·T(n/2) − T(n)        (T(n) = a·n + F  ⇒  F)

    with T the one-rank sharded step (gradient + Adam, ``MPI.COMM_SELF``) of the case at n and
    n/2 layers, n = min(N, ``SMALL_DEPTH``): F does not depend on the depth, and at large N the
    difference of two long steps is mostly noise (measured: clamped to 0 at N = 512, 1024);
    timed in ``rounds`` interleaved rounds after ``warmup`` (medians). On P
    ranks every rank pays F whole (opening/closing, loss, per-solve and per-level setup,
    sharding glue, optimizer calls: per rank, not per layer), while the calibration spreads
    it over the layers; ``Machine.per_rank`` = F makes
    :func:`refbraid.scaling.predict.per_rank_on` add the difference. Returns (F, T(N/2),
    T(N)); F is clamped at 0 (a negative difference is noise, and is printed as such)."""
    from bench_scaling import _problem, _sharded_step
    from mpi4py import MPI

    n = min(case["layers"], SMALL_DEPTH[case["model"]])
    steps = []
    for layers in (n // 2, n):
        net, params, x, y, bk = _problem({**case, "layers": layers})
        steps.append(_sharded_step(net, params, x, y, bk, MPI.COMM_SELF))
    for _ in range(warmup):
        for fn in steps:
            fn()
    times: list[list[float]] = [[], []]
    for _ in range(rounds):
        for i, fn in enumerate(steps):
            t0 = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t0)
    half, full = (statistics.median(t) for t in times)
    return max(2 * half - full, 0.0), half, full

