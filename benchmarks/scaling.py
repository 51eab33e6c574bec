"""Suite ``scaling``: the virtual cluster's predictions against ``mpiexec`` measurements, then
strong scaling to 1,024 ranks.

    python -m benchmarks full scaling [-o float32=True] [-o calibrations=3] [-o min=True]
        [-o cpu=True] [-o layers=64,256] [-o conv=False] [-o strong=False]
        [-o alpha=S -o beta=S]

On an idle machine: ``-o float32=True -o calibrations=3`` (≈ 10 min on 2 cores); on a loaded
one add ``-o min=True`` (the fastest call, both sides) and read P = 1 only: two ranks on two
cores shared with other tenants measure the OS scheduler (an MPI receive busy-waits).

Case ``<network> N=… <dtype>`` (the step suite's networks: dense ResNet, width 32, batch 64,
N = 64 … 1024, NumPy; TorchBraid's MNIST conv network, batch 50, N = 32 and 128, Numba,
float64 and with ``float32`` float32):

* ``meas P=1``, ``meas P=2``: the layer-parallel training step as ``mpiexec -n P refbraid
  train`` runs it (``ShardedTrainer``: sharded gradient + Adam), the slowest rank's wall time
  (``cpu``: CPU time), median (``min``: fastest) of ``repeat`` steps or of as many as fill
  0.5 s (≤ 101), after two warm-ups;
* ``pred P=1``, ``pred P=2``: the machine model calibrated on the one-rank sharded step
  (:func:`refbraid.scaling.predict.calibrate_network`: one interleaved steady-state session;
  α and β from a 2-rank ping-pong or given), in a FRESH process per calibration (as ``refbraid
  scale`` runs it, so it does not inherit this suite's allocation history): the MGRIT solves'
  schedule (cost-only) + extra on the busiest rank's share of the layers;
* ``dist P=2``: the whole distributed step (``DistributedGradient``, sharded, real values) on
  2 virtual ranks (:func:`refbraid.scaling.virtual_training.predict_steps`) + the same extra;
* ``bus×``: what two ranks computing at once cost: the serial kernel (sequential backprop)
  timed on all ranks at once after a barrier ÷ alone (two warm-ups, median of max(repeat, 9));
* ``F``: the one-rank step's depth-independent part ``2·T(n/2) − T(n)`` (n = min(N, 64 dense,
  32 conv), interleaved rounds, clamped at 0): per-call and per-level work every rank pays
  whole however its layers are split, where the calibration spreads it over the layers;
* ``model P=2``: dist with every compute charge × bus× and ``Machine.per_rank`` = F·bus×
  (:func:`refbraid.scaling.predict.per_rank_on`);
* ``P=1 ratio`` = pred ÷ meas, ``P=2 ratio`` = model ÷ meas; PASS within 15 %;
* ``comm``: the predicted step's communication; ``trace×``: untraced ÷ traced gradient;
  ``compute``/``comm`` per rank, measured (a traced step: steps + rest) and virtual, in the
  JSON file's ``params`` of a miss.

Case ``settings <name> …``: per named MGRIT setting (``-o settings=`` of the step suite), the
MNIST conv network's ideal 2-rank critical path on the virtual cluster (unit step costs
measured here, free messages, no bookkeeping) ÷ serial backprop's step work, and the gradient
error at the initial weights: which settings can beat serial on 2 ranks at all.

``-o calibrations=K`` repeats the calibration K times against the one measurement: the
spread of P = 1 pred ÷ meas is the calibration's own consistency. Case ``strong …`` (``full``
only): the calibrated model's strong scaling of the dense network at N = 4096 and the last conv
network (the ``refbraid scale`` table) up to ``max_ranks``.

Every process (the mpiexec workers, each calibration process, the runner) pins glibc malloc's
thresholds first (``REFBRAID_PIN_ALLOCATOR=0 python -m benchmarks …``: dynamic in all of
them), and the suite stops if a worker's allocator differs from the runner's.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

from benchmarks.harness import (
    ROOT,
    TAG,
    Result,
    emit,
    launch,
    measure,
    prepare_worker,
    records,
    worker_main,
)
from benchmarks.step import SETTINGS, named_settings, problem, unit_costs

TOLERANCE = 0.15  # |pred / meas − 1| ≤ 15 %: PASS
MIN_TIMED, MAX_REPEAT = 0.5, 101  # the workers time ≥ 0.5 s of steps per case (≤ 101 steps)
SMALL_DEPTH = {"resnet": 64, "conv": 32}  # n of F's pair (n/2, n): the smallest bench depth
OPTIONS = {"repeat": 7, "calibrations": 1, "conv": True, "float32": False, "layers": "",
           "max_ranks": 1024, "strong": True, "cpu": False, "min": False, "alpha": 0.0,
           "beta": 0.0, "timeout": 1800.0}
#: per size: dense N, conv at all, strong scaling at all, dense width and batch
SIZES = {"full": ("64,128,256,512,1024", True, True, 32, 64),
         "quick": ("64,256", False, False, 32, 64),  # strong scaling: full only (N = 4096)
         "tiny": ("32", False, False, 4, 4)}
SETTINGS_CASE = {"full": (128, 50), "quick": (128, 50), "tiny": (32, 2)}  # conv N, batch


def sharded_step(net, params, x, y, bk, world):
    """The layer-parallel training step as ``mpiexec -n P refbraid train`` runs it: the
    sharded distributed gradient + Adam on this rank's shard (ShardedTrainer)."""
    from refbraid.distributed.network import distributed_gradient
    from refbraid.distributed.sharded import ShardedTrainer
    from refbraid.layer_parallel import LayerParallelSettings
    from refbraid.training.optim import make_optimizer

    grad = distributed_gradient(net, LayerParallelSettings(), bk, world=world)
    trainer = ShardedTrainer(grad, params, make_optimizer("adam", 1e-4))
    return lambda: trainer.step(x, y)


# ----------------------------------------------------------------------------- the worker
def _parts(events, wall: float) -> dict[str, float]:
    from refbraid.parallel.trace import RECV, SEND, STEP

    steps = sum(e.duration for e in events if e.kind == STEP)
    comm = sum(e.duration for e in events if e.kind in (RECV, SEND) or e.is_collective)
    return {"wall": wall, "steps": steps, "comm": comm, "rest": wall - steps - comm}


def measure_gap(world, net, params, x, y, bk, step, repeat: int, traced: int = 5) -> dict:
    """After ``step`` was timed: the serial kernel with all ranks computing at once (bus×) and
    the traced per-rank parts of the step (the one of ``traced`` with the median wall)."""
    from mpi4py import MPI

    from refbraid.network import backprop
    from refbraid.parallel.trace import Recorder, recording

    kernel = measure(lambda: backprop(net, params, x, y, bk), max(repeat, 9), warmup=2,
                     comm=world).median()
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
    return {"kernel": kernel, "parts": world.gather(pick, root=0)}


def worker(spec: dict) -> None:
    """Under mpiexec: the sharded step of every case, both clocks (slowest rank), then the
    bus factor and the traced parts (after ALL timed steps: run before them, the kernel and
    the traced steps slowed the next cases' P = 2 steps by up to 28 %)."""
    from mpi4py import MPI

    state = prepare_worker()
    world = MPI.COMM_WORLD
    if world.Get_rank() == 0:
        emit({"malloc": state})
    rows = []
    for case in spec["cases"]:
        step = sharded_step(*problem(case), world)
        t = measure(step, spec["repeat"], warmup=2, comm=world, min_seconds=MIN_TIMED,
                    max_repeat=MAX_REPEAT)
        rows.append({"wall": t.median(), "wall_min": t.min(), "cpu": t.median("cpu"),
                     "cpu_min": t.min("cpu")})
    for case, row in zip(spec["cases"], rows, strict=True):
        net, params, x, y, bk = problem(case)
        step = sharded_step(net, params, x, y, bk, world)
        step()
        row.update(measure_gap(world, net, params, x, y, bk, step, spec["repeat"]))
        if world.Get_rank() == 0:
            emit(row)


def _check_malloc(who: str, state: str) -> None:
    """Both sides must run under the same allocator: stop when a worker's differs."""
    from refbraid.runtime import allocator_state

    if state != allocator_state():
        raise SystemExit(f"scaling: {who} ran with {state!r}, the runner with "
                         f"{allocator_state()!r}")


# ----------------------------------------------------------------------------- the model
def fixed_cost(case: dict, rounds: int = 7, warmup: int = 2) -> tuple[float, float, float]:
    """``F = 2·T(n/2) − T(n)`` (``T(n) = a·n + F``) of the one-rank sharded step (``MPI.
    COMM_SELF``), n = min(N, SMALL_DEPTH): at large N the difference of two long steps is
    mostly noise. Interleaved rounds after ``warmup``, medians. Returns (F ≥ 0, T(n/2), T(n))."""
    from mpi4py import MPI

    n = min(case["layers"], SMALL_DEPTH[case["model"]])
    steps = [sharded_step(*problem({**case, "layers": k}), MPI.COMM_SELF) for k in (n // 2, n)]
    for _ in range(warmup):
        for fn in steps:
            fn()
    times: list[list[float]] = [[], []]
    for _ in range(rounds):
        for i, fn in enumerate(steps):
            times[i] += measure(fn, 1, warmup=0).wall
    half, full = (statistics.median(t) for t in times)
    return max(2 * half - full, 0.0), half, full


def virtual_parts(dist, extra: float) -> list[dict[str, float]]:
    """Per virtual rank of the predicted step: steps (+ ``extra`` on the busiest share) as
    "compute", and comm."""
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


def critical_path(machine, dist) -> dict[str, float]:
    """The predicted P = 2 step's critical path, ms per part, with extra and the idle share."""
    from refbraid.parallel.trace import path_breakdown

    run, t0 = dist.run.run, dist.run.t0
    end = t0 + dist.run.step_time  # the setup before and the shards' gather after: untimed
    timed = [e for e in run.critical_path if t0 <= e.t0 < end]
    out = {k: 1e3 * v for k, v in sorted(path_breakdown(timed).items()) if v > 0}
    return {**out, "extra": 1e3 * machine.extra, "idle %": 100 * run.idle_fraction()}


def calibrate(case: dict, max_ranks: int, messages, clock, statistic):
    """The calibrated machine for the one-rank sharded step (refbraid/scaling/calibration.py)."""
    from mpi4py import MPI

    from refbraid.layer_parallel import LayerParallelSettings
    from refbraid.scaling.predict import calibrate_network
    from refbraid.training.optim import make_optimizer

    net, params, x, y, bk = problem(case)
    machine = calibrate_network(
        net, params, x, y, LayerParallelSettings(), bk,
        optimizer=lambda: make_optimizer("adam", 1e-4), max_ranks=max_ranks,
        measure_messages=lambda: messages, clock=clock, statistic=statistic,
        make_training_step=lambda: sharded_step(net, params, x, y, bk, MPI.COMM_SELF))
    return machine, (net, params, x, y, bk)


def predict_case(spec: dict) -> dict:
    """Calibrate and predict one case (in a FRESH process, docs/scaling_calibration.md §1)."""
    from dataclasses import replace

    from refbraid.scaling.predict import _scaled, extra_on, per_rank_on, predict
    from refbraid.scaling.virtual_training import predict_steps

    state = prepare_worker()
    clock = time.process_time if spec["cpu"] else time.perf_counter
    statistic = min if spec["min"] else statistics.median
    m, (net, params, x, y, bk) = calibrate(spec["case"], 2, tuple(spec["messages"]), clock,
                                           statistic)
    rows = predict(m, max_ranks=2)
    d = next(r for r in predict_steps(m, net, params, x, y, bk, 2) if (r.ranks, r.groups) == (2, 1))
    bus = spec["bus"]  # every compute charge of the 2-rank step × bus; messages unchanged
    fixed, half, full = fixed_cost(spec["case"])
    mb = replace(m, costs=_scaled(m.costs, bus), extra=m.extra * bus, per_rank=fixed * bus)
    db = next(r for r in predict_steps(mb, net, params, x, y, bk, 2)
              if (r.ranks, r.groups) == (2, 1))
    return {"p1": rows[0].layer_parallel, "p2": rows[1].layer_parallel, "dist": d.step,
            "fixed": fixed, "fixed_from": [half, full], "model": db.step, "comm": d.comm,
            "trace": float(m.source["trace_factor"]), "path": critical_path(mb, db),
            "virtual": virtual_parts(db, extra_on(mb, 2) + per_rank_on(mb, 2)),
            "malloc": state}


def _predict_fresh(case: dict, messages, opts: dict, bus: float) -> dict:
    spec = {"case": case, "messages": list(messages), "cpu": opts["cpu"], "min": opts["min"],
            "bus": bus}
    out = subprocess.run([sys.executable, "-m", "benchmarks.scaling", "--predict",
                          json.dumps(spec)], check=True, capture_output=True, text=True,
                         cwd=ROOT).stdout
    result = records(out)[0]
    _check_malloc("the calibration process", result["malloc"])
    return result


# ----------------------------------------------------------------------------- the suite
def _verdict(ratio: float) -> str:
    return "PASS" if abs(ratio - 1.0) <= TOLERANCE else "miss"


def strong_scaling(case: dict, max_ranks: int, messages, how: str, clock, statistic) -> list:
    """Case ``strong``: the calibrated model's table for P = 1 … ``max_ranks``."""
    from dataclasses import replace

    from refbraid.scaling.predict import predict, serial_time

    m, _ = calibrate(case, max_ranks, messages, clock, statistic)
    m = replace(m, source={**m.source, "messages": how})
    t0 = serial_time(m)
    out = []
    for row in predict(m, max_ranks):
        r = Result("scaling", f"strong {case['model']} N={case['layers']} P={row.ranks}",
                   {**case, "ranks": row.ranks, "serial_s": t0})
        for name, t in (("LP", row.layer_parallel), ("DP", row.data_parallel),
                        ("best", row.best)):
            if t is not None:
                r.add(name, 1e3 * t, "ms").add(f"{name} speedup", t0 / t, "×")
        if row.best_split is not None:
            r.add("best D×Q", f"{row.best_split[0]}×{row.best_split[1]}")
        out.append(r)
    return out


def settings_cases(layers: int, batch: int, dtypes, ranks: int = 2) -> list[Result]:
    """Case ``settings``: per named MGRIT setting (:func:`benchmarks.step.named_settings`) of
    the MNIST conv network, the ideal critical path of ``ranks`` ranks on the virtual cluster
    (:func:`refbraid.scaling.virtual_step.simulate_gradient_schedule`: unit step costs
    measured here, α = β = 0, no bookkeeping) ÷ serial backprop's step work N·(c_f + c_bg),
    and the relative gradient error against backprop at the initial weights (float64)."""
    import numpy as np

    from refbraid.layer_parallel import layer_parallel_gradient
    from refbraid.network import backprop
    from refbraid.parallel.costs import StepCosts
    from refbraid.relative_error import relative_gradient_error
    from refbraid.scaling.virtual_step import simulate_gradient_schedule

    case = {"model": "conv", "layers": layers, "batch": batch, "backend": "numba"}
    net, params, x, y, bk = problem({**case, "dtype": "float64"})
    _, exact, _ = backprop(net, params, x, y, bk)
    errors = {name: relative_gradient_error(
        layer_parallel_gradient(net, params, x, y, named_settings(name), bk)[1], exact)
        for name in SETTINGS}
    out = []
    for dtype in dtypes:
        net, params, x, y, bk = problem({**case, "dtype": dtype})
        u = unit_costs(net, params, x, bk)
        costs = StepCosts(forward=u["c_f"], backward=(u["c_bg"], u["c_bc"]))
        serial = layers * (u["c_f"] + u["c_bg"])
        state_bytes = batch * int(np.prod(net.step.state_shape)) * np.dtype(dtype).itemsize
        for name in SETTINGS:
            st = named_settings(name)
            ideal = simulate_gradient_schedule(layers, state_bytes, ranks, st, costs).wall_time
            one = simulate_gradient_schedule(layers, state_bytes, 1, st, costs).wall_time
            res = Result("scaling", f"settings {name} conv N={layers} {dtype}",
                         {**case, "dtype": dtype, "settings": name, "ranks": ranks})
            res.add(f"ideal P={ranks} ÷ serial work", ideal / serial)
            res.add("P=1 ÷ serial work", one / serial)
            out.append(res.add("grad error (f64, init)", errors[name], "rel"))
    return out


def run(size: str, opts: dict, notes: list[str]) -> list[Result]:
    from refbraid.runtime import allocator_state
    from refbraid.scaling.messages import measure_messages

    layers, conv_on, strong_on, width, batch = SIZES[size]
    layers = [int(v) for v in (opts["layers"] or layers).split(",") if v]
    dense = [{"model": "resnet", "layers": n, "width": width, "batch": batch,
              "backend": "numpy", "dtype": "float64"} for n in layers]
    dtypes = ("float64", "float32") if opts["float32"] else ("float64",)
    conv = [{"model": "conv", "layers": n, "batch": 50, "backend": "numba", "dtype": dt}
            for dt in dtypes for n in (32, 128)] if conv_on and opts["conv"] else []
    cases = dense + conv
    key = ("cpu" if opts["cpu"] else "wall") + ("_min" if opts["min"] else "")
    clock = time.process_time if opts["cpu"] else time.perf_counter
    statistic = min if opts["min"] else statistics.median
    if opts["alpha"] > 0:
        messages, how = (opts["alpha"], opts["beta"]), "given: alpha, beta"
    else:
        messages, how = measure_messages() or (0.0, 0.0), "2-rank ping-pong"
    measured = {}
    for p in (1, 2):
        rows = launch(p, "benchmarks.scaling", {"cases": cases, "repeat": opts["repeat"]},
                      opts["timeout"])
        _check_malloc(f"mpiexec -n {p} workers", rows.pop(0)["malloc"])
        measured[p] = rows
    notes.append(f"α = {messages[0] * 1e6:.2f} µs, β = {messages[1] * 1e9:.3f} ns/byte ({how}); "
                 f"{allocator_state()}; meas: {key.replace('_', ', ')} of max({opts['repeat']}, "
                 f"≥ {MIN_TIMED} s of steps), slowest rank; PASS: |ratio − 1| ≤ {TOLERANCE:.0%}")
    out = []
    for i, case in enumerate(cases):
        m1, m2 = measured[1][i][key], measured[2][i][key]
        bus = measured[2][i]["kernel"] / measured[1][i]["kernel"]
        runs = [_predict_fresh(case, messages, opts, bus) for _ in range(opts["calibrations"])]
        r = runs[-1]
        res = Result("scaling", f"{case['model']} N={case['layers']} {case['dtype']}", case)
        res.add("pred P=1", 1e3 * r["p1"], "ms").add("meas P=1", 1e3 * m1, "ms")
        res.add("P=1 ratio", r["p1"] / m1).add("P=1", _verdict(r["p1"] / m1))
        res.add("pred P=2", 1e3 * r["p2"], "ms").add("dist P=2", 1e3 * r["dist"], "ms")
        res.add("bus×", bus).add("F", 1e3 * r["fixed"], "ms")
        res.add("model P=2", 1e3 * r["model"], "ms").add("meas P=2", 1e3 * m2, "ms")
        res.add("P=2 ratio", r["model"] / m2).add("P=2", _verdict(r["model"] / m2))
        res.add("comm", 1e3 * r["comm"], "ms").add("trace×", r["trace"])
        if opts["calibrations"] > 1:
            spread = [v["p1"] / m1 for v in runs]
            res.add("P=1 ratio min", min(spread)).add("P=1 ratio max", max(spread))
        if _verdict(r["model"] / m2) == "miss":  # where it differs, for the JSON reader
            res.params.update(path_ms=r["path"], measured_parts=measured[2][i]["parts"],
                              virtual_parts=r["virtual"])
        out.append(res)
    out += settings_cases(*SETTINGS_CASE[size], dtypes)
    if strong_on and opts["strong"]:
        for case in [{**dense[0], "layers": 4096}] + conv[-1:]:
            out += strong_scaling(case, opts["max_ranks"], messages, how, clock, statistic)
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["--predict"]:
        print(TAG + json.dumps(predict_case(json.loads(sys.argv[2]))), flush=True)
    else:
        worker_main(worker)
