"""Calibrating the step costs from the code as it runs: steady state, interleaved, traced.

One measurement session (:func:`measure_session`) times, in the same process and in
interleaved rounds (so that a slow drift, another tenant or the allocator's state affects
every quantity alike)::

    round r = 1 … R:   serial(b)      one sequential training step per shard batch b
                       T_step         one layer-parallel TRAINING step as it runs
                                      (``training_step``: gradient + optimizer; e.g. the
                                      one-rank sharded step of ``mpiexec -n 1 refbraid train``)
                       T_grad         one layer-parallel gradient, trace off
                       T_traced, d_i  one layer-parallel gradient, trace on: its total and
                                      every step application's duration d_i

after ``warmup`` untimed rounds. Every time is the median over the R rounds. Why this order and
not "gradient first, then the rest" (the calibration before this module): the first calls of a
process run on a cold heap — glibc's malloc raises its mmap threshold only as large blocks are
freed, so early layer-parallel gradients page-fault on fresh temporaries
(docs/scaling_overhead.md §4) — and a median over 7 calls right after one warm-up read 1.1–1.3×
the steady state, which is what ``mpiexec -n 1`` measures after its own warm-ups.

Step costs (:func:`step_costs`). Tracing costs time itself (one ``Event`` per step; measured
4–6 % of the dense gradient at width 32), so the traced call only tells how the gradient's time
SPLITS: the share ``s`` of a traced call inside step boxes (median over the traced calls of
``Σ_i d_i / T_traced``), and the relative weight of each level and direction (the median box,
robust to a call preempted by another tenant)::

    c(ℓ, dir) = k · median{d_i : step i on level ℓ, direction dir} + o,
    k         = s · T_grad / Σ_{steps of one call} median(level, dir of the step),
    o         = (1 − s) · T_grad / n_steps     (MGRIT bookkeeping, opening, closing, loss)

so the virtual cluster with one rank charges exactly ``T_grad`` (trace off), and
``extra = T_step − T_grad`` (optimizer, sharding glue) is what :mod:`.predict` adds.

Shape legend: R rounds, b shard batch, n_steps step applications of one gradient.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..parallel.costs import StepCosts
from ..parallel.trace import STEP, Event, Recorder, recording


@dataclass(frozen=True)
class Session:
    """Medians of one interleaved measurement session (module docstring), seconds."""

    serial: dict[int, float]  # shard batch b → sequential training step
    step: float  # T_step: the layer-parallel training step as it runs
    gradient: float  # T_grad: the layer-parallel gradient, trace off
    traced: float  # T_traced: the same, trace on
    steps: tuple[Event, ...]  # the step events of every traced call (all rounds)
    calls: int  # traced calls the events come from
    rounds: int  # R
    covered: float = 1.0  # s: median share of a traced call inside step boxes

    @property
    def trace_factor(self) -> float:
        """T_grad / T_traced: what tracing costs (< 1: the trace slows the gradient)."""
        return self.gradient / self.traced if self.traced > 0 else 1.0


def _timed(fn: Callable[[], object], clock) -> float:
    t0 = clock()
    fn()
    return clock() - t0


def measure_session(serial_steps: dict[int, Callable[[], object]],
                    training_step: Callable[[], object], gradient: Callable[[], object],
                    rounds: int = 7, warmup: int = 2,
                    clock: Callable[[], float] = time.perf_counter,
                    statistic: Callable[[list[float]], float] = statistics.median) -> Session:
    """Time everything in interleaved rounds (module docstring); ``statistic`` (the median;
    ``min`` on a loaded machine: the calls no other tenant preempted) over ``rounds``."""
    if rounds < 1 or warmup < 0:
        raise ValueError(f"`rounds` must be >= 1 and `warmup` >= 0, got {rounds}, {warmup}.")
    for _ in range(warmup):
        for fn in (*serial_steps.values(), training_step, gradient):
            fn()
    serial = {b: [] for b in serial_steps}
    step, grad, traced, events, shares = [], [], [], [], []
    for _ in range(rounds):
        for b, fn in serial_steps.items():
            serial[b].append(_timed(fn, clock))
        step.append(_timed(training_step, clock))
        grad.append(_timed(gradient, clock))
        rec = Recorder()
        with recording(rec):
            traced.append(_timed(gradient, clock))
        boxes = [e for e in rec.trace() if e.kind == STEP]
        events.extend(boxes)
        shares.append(min(sum(e.duration for e in boxes) / traced[-1], 1.0)
                      if traced[-1] > 0 else 1.0)
    st = statistic
    return Session({b: st(t) for b, t in serial.items()}, st(step), st(grad), st(traced),
                   tuple(events), rounds, rounds, statistics.median(shares))


def step_costs(session: Session) -> StepCosts:
    """c(ℓ, dir) of the module docstring: per level and direction, forward and adjoint."""
    events, calls = session.steps, max(session.calls, 1)
    levels = 1 + max((e.level for e in events), default=0)
    weight: dict[tuple[int, str], float] = {}
    for direction in ("forward", "backward"):
        for level in range(levels):
            d = [e.duration for e in events if e.level == level and e.direction == direction]
            weight[level, direction] = (statistics.median(d) if d else
                                        weight.get((level - 1, direction), 0.0))
    per_call = len(events) / calls
    total_weight = sum(weight[e.level, e.direction] for e in events) / calls
    k = session.covered * session.gradient / total_weight if total_weight > 0 else 0.0
    overhead = (1.0 - session.covered) * session.gradient / max(per_call, 1.0)
    if total_weight == 0:  # no boxes seen: all of it is spread over the steps
        overhead = session.gradient / max(per_call, 1.0)
    table = {direction: tuple(k * weight[level, direction] + overhead
                              for level in range(levels))
             for direction in ("forward", "backward")}
    return StepCosts(**table)
