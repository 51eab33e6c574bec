"""Predicted time per training step for serial, layer-parallel, data-parallel and DP × LP runs.

Calibration (:func:`calibrate`, on this machine, for a ``refbraid train`` configuration):

* ``serial(b)`` — one sequential-backprop training step (gradient + optimizer) at batch b,
  for b = B, B/2, B/4, … (the data-parallel shards);
* step costs — the layer-parallel gradient in one process is traced
  (:mod:`refbraid.parallel.trace`): every step application's duration (scaled by
  ``T_grad / T_traced``, the trace's own cost), averaged per level and direction, plus the
  MGRIT bookkeeping between steps spread evenly over the steps,
  ``o = (T_grad − Σ step durations) / steps``, so the virtual cluster with one rank reproduces
  the measured one-process gradient;
* ``extra`` — what the virtual run does not charge (optimizer; sharding glue when the
  training step as it runs is given): ``T_step − virtual(P = 1)``. On P ranks it is charged
  in proportion to the busiest rank's share of the layers, ``extra · max_q n_q / N``
  (:func:`extra_on`): in the sharded step (``mpiexec refbraid train``) each rank's optimizer
  and sharding glue touch only its own rows, so a constant would overpredict P ≥ 2 (measured:
  this per-row part is most of ``extra``; the constant rest — the opening's and closing's
  few parameters, a loss reduction — makes it err slightly fast);
* all of these from ONE session of interleaved rounds after warm-up, medians
  (:mod:`refbraid.scaling.calibration`: the steady state, not a cold process's first calls);
* α, β — a two-rank ping-pong through ``MPIComm`` (:mod:`refbraid.scaling.messages`), or given.

Prediction (:func:`predict`), for P = 1, 2, 4, …:

* layer-parallel ``LP(P)`` = the virtual cluster's time for the real MGRIT schedule of one
  gradient on P ranks (cost-only mode, the iteration counts of the calibration run) + extra;
  only where every rank gets at least one coarsest interval;
* data-parallel ``DP(D)`` = ``serial(B/D) + ring(n_grad, D)`` with seed 002's ring allreduce
  ``ring(n, p) = 2(p−1)·α + 2(p−1)/p · n·β`` (docs/references.md §4), for D ≤ B;
* ``DP×LP(D, Q)`` on P = D·Q ranks = ``LP_Q`` with step costs scaled by
  ``serial(B/D)/serial(B)`` (the shard's batch) + ``ring(n_grad/Q, D)`` (each layer rank reduces
  its layers' gradient with its D peers); the best split over D | P is reported.

Speedups are ``serial(B) / time``. Given step costs (``--step-cost``) replace the measured
ones, and then ``serial(b) = (b/B)·N·(c_fwd + c_adj)`` on the finest level.

Shape legend: N layers, B batch, P ranks, D data-parallel groups, Q = P/D layer ranks.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..distributed.ownership import BlockPlan
from ..layer_parallel import LayerParallelSettings, layer_parallel_gradient
from ..models import as_network_input
from ..network import Network, backprop
from ..parallel.costs import StepCosts
from ..training.config import TrainConfig
from ..training.gradients import layer_parallel_settings
from ..training.optim import make_optimizer
from ..training.run import setup
from .calibration import measure_session
from .calibration import step_costs as step_costs_of
from .virtual_step import simulate_gradient_schedule

#: α, β used when no MPI ping-pong can run here (measured on the 2-core development machine).
DEFAULT_ALPHA = 2.4e-6
DEFAULT_BETA = 0.085e-9
REPEAT = 7  # timed repetitions per measurement (median), after one warm-up


def ring_allreduce(nbytes: float, p: int, alpha: float, beta: float) -> float:
    """Seconds of a ring allreduce of ``nbytes`` over ``p`` ranks: 2(p−1)α + 2(p−1)/p·n·β."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta


@dataclass(frozen=True)
class Machine:
    """What the predictions are built from (see the module docstring)."""

    costs: StepCosts  # seconds per step application, per level and direction
    alpha: float  # seconds per message
    beta: float  # seconds per byte
    serial: dict[int, float]  # batch size → seconds per sequential training step
    extra: float  # seconds per layer-parallel step the virtual run does not charge
    state_bytes: int  # bytes of one state y[n] of the batch
    grad_bytes: int  # bytes of the whole gradient
    iterations: tuple[int, int]  # forward, adjoint MGRIT cycles the schedule replays
    n_layers: int  # N
    batch: int  # B
    settings: LayerParallelSettings  # the MGRIT settings of both solves
    lp_measured: float | None = None  # one-process layer-parallel step (gradient + optimizer)
    source: dict[str, str] = field(default_factory=dict)  # where each number came from
    per_rank: float = 0.0  # F: seconds per step every rank pays whole (per call, not per layer)


def _batch(config: TrainConfig):
    net, data, state, bk = setup(config)
    if not isinstance(net, Network):
        raise ValueError(f"`--model {config.model}`: `refbraid scale` models the resnet and "
                         f"conv networks (layers as MGRIT time steps).")
    x = bk.asarray(as_network_input(net, data.x_train[: config.batch_size]))
    y = bk.asarray(data.y_train[: config.batch_size])
    return net, state.params, x, y, bk


def data_parallel_batches(batch: int, max_ranks: int) -> list[int]:
    """Shard sizes ⌈B/D⌉ for D = 1, 2, 4, … ≤ min(B, max_ranks)."""
    out, d = [], 1
    while d <= min(batch, max_ranks):
        out.append(math.ceil(batch / d))
        d *= 2
    return sorted(set(out), reverse=True)


def calibrate(config: TrainConfig, *, max_ranks: int = 1024, alpha: float | None = None,
              beta: float | None = None, step_costs: StepCosts | None = None,
              measure_messages=None) -> Machine:
    """Measure (or take) everything :func:`predict` needs for ``config`` (module docstring)."""
    net, params, x, y, bk = _batch(config)
    return calibrate_network(
        net, params, x, y, layer_parallel_settings(config), bk,
        optimizer=lambda: make_optimizer(config.optimizer, config.lr, config.momentum),
        max_ranks=max_ranks, alpha=alpha, beta=beta, step_costs=step_costs,
        measure_messages=measure_messages)


def calibrate_network(net: Network, params, x, y, settings: LayerParallelSettings, bk, *,
                      optimizer, max_ranks: int = 1024, alpha: float | None = None,
                      beta: float | None = None, step_costs: StepCosts | None = None,
                      measure_messages=None, make_training_step=None, rounds: int = REPEAT,
                      clock=time.perf_counter, statistic=statistics.median) -> Machine:
    """:func:`calibrate` for a network, its parameters and one batch ``x, y`` (B samples);
    ``optimizer()`` makes a fresh optimizer for the timed training steps.

    ``make_training_step()`` (optional) returns the layer-parallel training step *as it runs*
    (a no-argument callable, e.g. the one-rank sharded step of ``mpiexec -n 1 refbraid
    train``); default: layer-parallel gradient + ``optimizer()``. Timings: one interleaved
    session of ``rounds`` rounds (:mod:`refbraid.scaling.calibration`) on ``clock``, reduced
    by ``statistic`` (the median; ``min`` on a loaded machine)."""
    source = {}
    batch = int(x.shape[0])
    grad_bytes = int(sum(np.asarray(v).nbytes for v in params.values()))
    state_bytes = int(batch * np.prod(net.step.state_shape) * np.dtype(x.dtype).itemsize)
    batches = data_parallel_batches(batch, max_ranks)

    def training_step(gradient, b: int = batch):
        xb, yb = x[:b], y[:b]
        p = {k: v.copy() for k, v in params.items()}
        opt = optimizer()

        def step():
            g = gradient(p, xb, yb)
            opt.step(p, g)

        return step

    if step_costs is None:
        serial_steps = {b: training_step(
            lambda p, xb, yb: backprop(net, p, xb, yb, bk)[1], b) for b in batches}
        lp_step = make_training_step() if make_training_step is not None else training_step(
            lambda p, xb, yb: layer_parallel_gradient(net, p, xb, yb, settings, bk)[1])
        last: dict[str, Any] = {}  # the session's last gradient's info: its iteration counts

        def lp_gradient():
            last["info"] = layer_parallel_gradient(net, params, x, y, settings, bk)[2]

        session = measure_session(serial_steps, lp_step, lp_gradient, rounds=rounds,
                                  clock=clock, statistic=statistic)
        costs, serial, lp = step_costs_of(session), session.serial, session.step
        info = last["info"]
        iterations = (info.forward.iterations, info.backward.iterations)
        source["steps"] = ("calibrated here (traced one-process layer-parallel gradient, "
                           f"{session.rounds} interleaved rounds)")
        source["trace_factor"] = f"{session.trace_factor:.3f}"
        source["in_step_boxes"] = f"{session.covered:.3f}"
        source["gradient_s"] = f"{session.gradient:.6g}"
    else:
        costs, lp = step_costs, None
        fine = costs(0, "forward") + costs(0, "backward")
        serial = {b: b / batch * net.n_layers * fine for b in batches}
        iterations = (settings.forward.max_iter, settings.backward.max_iter)
        source["steps"] = "given (--step-cost)"
    if alpha is None or beta is None:
        measured = (measure_messages or _measure_messages)()
        if measured is None:
            measured, how = (DEFAULT_ALPHA, DEFAULT_BETA), "default (no MPI ping-pong here)"
        else:
            how = "calibrated here (2-rank ping-pong)"
        alpha = measured[0] if alpha is None else alpha
        beta = measured[1] if beta is None else beta
        source["messages"] = how
    else:
        source["messages"] = "given (--alpha, --beta)"
    machine = Machine(costs, float(alpha), float(beta), serial, 0.0, state_bytes, grad_bytes,
                      iterations, net.n_layers, batch, settings, lp, source)
    if lp is not None:
        machine = replace(machine, extra=max(lp - _lp_virtual(machine, 1, 1.0), 0.0))
    return machine


def _measure_messages():
    from .messages import measure_messages

    return measure_messages()


def _scaled(costs: StepCosts, factor: float) -> StepCosts:
    return StepCosts(forward=tuple(c * factor for c in costs.forward),
                     backward=tuple(c * factor for c in (costs.backward or costs.forward)))


def _lp_virtual(machine: Machine, ranks: int, scale: float):
    """Virtual time of one layer-parallel gradient on ``ranks`` ranks (None: no such split)."""
    try:
        BlockPlan.build(machine.n_layers, machine.settings, ranks)
    except ValueError:
        return None
    run = simulate_gradient_schedule(
        machine.n_layers, int(machine.state_bytes * scale), ranks, machine.settings,
        _scaled(machine.costs, scale), machine.alpha, machine.beta, machine.iterations)
    return run.wall_time


def extra_on(machine: Machine, ranks: int) -> float:
    """``extra`` on ``ranks`` layer ranks: ``extra · max_q n_q / N`` with n_q the layers rank q
    owns (:class:`~refbraid.distributed.ownership.BlockPlan`); 0-safe; the whole on one rank."""
    if ranks <= 1 or machine.extra == 0.0:
        return machine.extra
    try:
        plan = BlockPlan.build(machine.n_layers, machine.settings, ranks)
    except ValueError:
        return machine.extra
    layout = plan.forward_layout
    most = max(min(hi, machine.n_layers) - lo for lo, hi in map(layout.bounds, range(ranks)))
    return machine.extra * most / machine.n_layers


def per_rank_on(machine: Machine, ranks: int) -> float:
    """The per-rank fixed cost the spread calibration misses on ``ranks`` layer ranks:

        F · (1 − max_q n_q / N)

    The calibration spreads the one-rank step over its layers, so the busiest rank is charged
    F times its share; but F (per sweep, per solve and level, per optimizer call: measured as
    2·T(n/2) − T(n), benchmarks/scaling.py) is paid whole by every rank. 0 on one rank
    and when ``machine.per_rank`` is 0 (the default: predictions unchanged)."""
    if ranks <= 1 or machine.per_rank == 0.0:
        return 0.0
    return machine.per_rank * (1.0 - extra_on(replace(machine, extra=1.0), ranks))


@dataclass(frozen=True)
class ScalingRow:
    """Predicted seconds per training step on P ranks (None: that split is not possible)."""

    ranks: int
    layer_parallel: float | None
    data_parallel: float | None
    best: float | None  # best DP × LP split
    best_split: tuple[int, int] | None  # (D groups, Q layer ranks)


def predict(machine: Machine, max_ranks: int = 1024) -> list[ScalingRow]:
    """The table of the module docstring for P = 1, 2, 4, … ≤ ``max_ranks``."""
    if not isinstance(machine, Machine):
        raise TypeError(f"`machine` must be a Machine (e.g. from calibration), got "
                        f"{type(machine).__name__}.")
    B = machine.batch
    full = machine.serial[max(machine.serial)]
    lp_cache: dict[tuple[int, int], float | None] = {}

    def lp(q: int, d: int) -> float | None:
        if (q, d) not in lp_cache:
            b = math.ceil(B / d)
            scale = machine.serial.get(b, full * b / B) / full
            t = _lp_virtual(machine, q, scale)
            lp_cache[q, d] = None if t is None else \
                t + (extra_on(machine, q) + per_rank_on(machine, q)) * scale
        return lp_cache[q, d]

    def dp(d: int) -> float | None:
        b = math.ceil(B / d)
        if d > B or b not in machine.serial:
            return None
        return machine.serial[b] + ring_allreduce(machine.grad_bytes, d, machine.alpha,
                                                  machine.beta)

    rows, p = [], 1
    while p <= max_ranks:
        best, split = None, None
        d = 1
        while d <= p:
            q = p // d
            if q == 1:  # pure data parallelism (d = 1: serial training)
                t = dp(d)
            elif d == 1:
                t = lp(q, 1)
            else:
                t = lp(q, d)
                if t is not None and d <= B:
                    t += ring_allreduce(machine.grad_bytes / q, d, machine.alpha, machine.beta)
                else:
                    t = None
            if t is not None and (best is None or t < best):
                best, split = t, (d, q)
            d *= 2
        rows.append(ScalingRow(p, lp(p, 1), dp(p), best, split))
        p *= 2
    return rows


def serial_time(machine: Machine) -> float:
    """Seconds per sequential training step at the full batch."""
    return machine.serial[max(machine.serial)]


def format_table(machine: Machine, rows: list[ScalingRow], title: str = "") -> str:
    """The table ``refbraid scale`` prints: ms per training step and speedups over serial."""
    t0 = serial_time(machine)

    def ms(t):
        return "       -" if t is None else f"{1e3 * t:8.2f}"

    def sp(t):
        return "      -" if t is None else f"{t0 / t:7.2f}"

    lines = [title] if title else []
    lines += [
        f"serial (sequential backprop + optimizer): {1e3 * t0:.2f} ms per step; "
        f"α = {machine.alpha * 1e6:.2f} µs, β = {machine.beta * 1e9:.3f} ns/byte "
        f"({machine.source.get('messages', '')}); step costs "
        f"{machine.source.get('steps', '')}",
        f"{'P':>5} {'LP ms':>8} {'LP ×':>7} {'DP ms':>8} {'DP ×':>7} {'best ms':>8} "
        f"{'best ×':>7}  {'split D×Q':>9}",
    ]
    lines.append("-" * len(lines[-1]))
    for r in rows:
        split = "-" if r.best_split is None else f"{r.best_split[0]}×{r.best_split[1]}"
        lines.append(f"{r.ranks:5d} {ms(r.layer_parallel)} {sp(r.layer_parallel)} "
                     f"{ms(r.data_parallel)} {sp(r.data_parallel)} {ms(r.best)} {sp(r.best)}"
                     f"  {split:>9}")
    return "\n".join(lines)


def as_json(machine: Machine, rows: list[ScalingRow]) -> dict[str, Any]:
    """Everything behind the table, for ``scaling.json``."""
    return {
        "layers": machine.n_layers, "batch": machine.batch,
        "serial_s": serial_time(machine),
        "alpha_s": machine.alpha, "beta_s_per_byte": machine.beta,
        "step_costs_s": {"forward": list(machine.costs.forward),
                         "backward": list(machine.costs.backward or machine.costs.forward)},
        "extra_s": machine.extra, "per_rank_s": machine.per_rank,
        "lp_one_process_measured_s": machine.lp_measured,
        "serial_by_batch_s": {str(k): v for k, v in machine.serial.items()},
        "iterations": list(machine.iterations), "source": machine.source,
        "rows": [r.__dict__ for r in rows],
    }

