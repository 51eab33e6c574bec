"""The Python gap of a traced layer-parallel training step, split by phase (wall clock).

``bench_two_rank_breakdown.py`` names "Python gap" = wall − traced events. This module cuts a
rank's step into phases on the trace's clock, and for each phase reports its wall time and the
part of it no traced event covers (its share of the Python gap):

    before fwd solve   shard_rows (ghost weights fetched), batch check, opening, y0 broadcast
    fwd solve          MGRIT forward solve: the untraced part is the solver's bookkeeping
    between solves     closing, loss, states exchange, the adjoint's set-up
    bwd solve          MGRIT adjoint solve: the untraced part is the solver's bookkeeping
    after bwd solve    captured gradients, opening adjoint, loss allreduce, stats, rows home
    optimizer          Adam on this rank's shard

The solve windows come from :func:`timed_solves`, which wraps the ``solve`` that
:mod:`refbraid.distributed.network` calls (benchmark instrumentation; nothing in the package
changes). The untraced parts add up to the Python gap exactly.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

PHASES = ("before fwd solve", "fwd solve", "between solves", "bwd solve", "after bwd solve",
          "optimizer")


@contextlib.contextmanager
def timed_solves(origin: float) -> Iterator[list[tuple[float, float]]]:
    """Within the block, every MGRIT solve the distributed gradient runs appends its window
    ``(t0, t1)`` (seconds since ``origin``) to the yielded list."""
    from refbraid.distributed import network as distributed

    windows: list[tuple[float, float]] = []
    inner = distributed.solve

    def solve(*args, **kwargs):
        t0 = time.perf_counter() - origin
        try:
            return inner(*args, **kwargs)
        finally:
            windows.append((t0, time.perf_counter() - origin))

    distributed.solve = solve
    try:
        yield windows
    finally:
        distributed.solve = inner


def _covered(events, lo: float, hi: float) -> float:
    """Seconds of traced events inside [lo, hi) (events do not overlap on one rank)."""
    return sum(max(0.0, min(e.t1, hi) - max(e.t0, lo)) for e in events)


def phase_split(events, windows, gradient_end: float, wall: float) -> dict[str, tuple]:
    """{phase: (wall seconds, untraced seconds)} for one rank (module docstring); ``windows``
    the forward and the backward solve, ``gradient_end`` when the sharded gradient returned."""
    (f0, f1), (b0, b1) = windows
    edges = [0.0, f0, f1, b0, b1, gradient_end, wall]
    out = {}
    for name, lo, hi in zip(PHASES, edges[:-1], edges[1:], strict=True):
        out[name] = (hi - lo, hi - lo - _covered(events, lo, hi))
    return out


def phase_lines(per_rank: list[dict]) -> list[str]:
    """The table: per rank, each phase's wall ms and its untraced (Python gap) ms."""
    ms = 1e3
    head = f"{'phase':<17}" + "".join(f" {'rank ' + str(r) + ' wall':>12} {'untraced':>9}"
                                      for r in range(len(per_rank)))
    lines = [head, "-" * len(head)]
    for name in PHASES:
        lines.append(f"{name:<17}" + "".join(
            f" {r['phases'][name][0] * ms:>12.1f} {r['phases'][name][1] * ms:>9.1f}"
            for r in per_rank))
    lines.append(f"{'sum':<17}" + "".join(
        f" {sum(v[0] for v in r['phases'].values()) * ms:>12.1f}"
        f" {sum(v[1] for v in r['phases'].values()) * ms:>9.1f}" for r in per_rank))
    return lines
