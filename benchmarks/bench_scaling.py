"""The virtual cluster against reality, then strong scaling to 1,024 ranks.

    python benchmarks/bench_scaling.py [--quick] [--float32] [--repeat 7] [--calibrations 3]
        [--no-conv] [--layers 64 256] [--max-ranks 1024] [--no-scaling]
        [--cpu] [--min] [--default-malloc] [--alpha S --beta S]

For the lead, on an idle machine: ``python benchmarks/bench_scaling.py --float32
--calibrations 3`` (≈ 10 min on 2 cores); on a loaded one add ``--min`` (wall time of the
fastest call, both sides) and read P = 1 only.

1. Predicted vs measured. For bench_mpi.py's networks (dense ResNet, width 32, batch 64,
   N = 64 … 1024, NumPy; TorchBraid's MNIST conv network, batch 50, N = 32 and 128, Numba,
   float64 and with ``--float32`` float32), this script's MPI worker measures the
   layer-parallel training step as ``mpiexec -n P refbraid train`` runs it (``ShardedTrainer``:
   sharded gradient + Adam; slowest rank; median — or ``--min`` fastest — of ``--repeat``,
   or of as many as fill 0.5 s (≤ 101), after two warm-ups; wall — or ``--cpu`` CPU — time)
   under ``mpiexec -n 1`` and ``-n 2``. Then
   the machine model is calibrated (:func:`refbraid.scaling.predict.
   calibrate_network` with the one-rank sharded step: one interleaved steady-state session,
   refbraid/scaling/calibration.py; α and β from a 2-rank ping-pong or given) and the virtual
   cluster predicts P = 1 and 2 — each calibration in a fresh process (as ``refbraid scale``
   runs), so it does not inherit this script's allocation history: ``pred`` the MGRIT
   solves' schedule (cost-only) + extra on the busiest rank's share of the layers; ``dist``
   the whole distributed step (``DistributedGradient``, sharded, real values: ghost weights,
   both solves, broadcasts, state rows, gradient rows home, the reductions;
   :func:`refbraid.scaling.virtual_training.predict_steps`) + the same extra. ``ratio`` =
   pred / meas at P = 1 and model / meas at P = 2;
   PASS within 15 % (P = 2: ``model`` = ``dist`` with two measured costs it lacks, a memory-bus
   factor ``bus×`` and the per-rank fixed cost ``F``, benchmarks/two_rank_gap.py), else
   ``miss`` and the predicted P = 2 critical path (steps per level and
   direction, messages, collectives, extra, idle share) is printed under the row, to compare
   with the measured time, and the measured traced parts per rank beside the virtual twin's.
   ``trace×`` = untraced ÷ traced gradient (the trace's own cost).
   ``--calibrations K`` repeats the calibration K times against the one measurement: the
   spread of P = 1 pred/meas is the calibration's own consistency.
2. Strong scaling of the dense network at N = 4096 and the (last) conv network at N = 128 with
   the calibrated model: P = 1 … ``--max-ranks`` (the ``refbraid scale`` table).

Every process of the bench (the mpiexec workers, each calibration process, this one) pins
glibc malloc's thresholds first (:func:`refbraid.runtime.pin_allocator`, as ``refbraid
train`` and ``scale`` do; docs/scaling_overhead.md §5); ``--default-malloc`` leaves them
dynamic on both sides (``REFBRAID_PIN_ALLOCATOR=0``). The header says which was used, and the
bench stops if a worker's allocator differs from this process's.

The machine is shared: the load is printed before and after; two ranks on two cores shared
with other tenants measure the OS scheduler (an MPI receive busy-waits), so P = 2 rows are
only meaningful idle. docs/scaling_calibration.md has the measured tables.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))


TAG = "SCALING "
ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 0.15  # |pred / meas − 1| ≤ 15 %: PASS
MIN_TIMED, MAX_REPEAT = 0.5, 101  # the workers time ≥ 0.5 s of steps per case (≤ 101 steps)


def _problem(case: dict):
    from bench_mpi import _data, _network

    from refbraid.backends import get_backend
    from refbraid.network import init_params

    net = _network(case)
    bk = get_backend(case["backend"])
    params = init_params(net, 0, np.dtype(case["dtype"]))
    x, y = _data(net, case["batch"])
    return net, params, x.astype(case["dtype"]), y, bk


def _sharded_step(net, params, x, y, bk, world):
    """The layer-parallel training step as ``mpiexec -n P refbraid train`` runs it: the
    sharded distributed gradient + Adam on this rank's shard (ShardedTrainer)."""
    from refbraid.distributed.network import distributed_gradient
    from refbraid.distributed.sharded import ShardedTrainer
    from refbraid.layer_parallel import LayerParallelSettings
    from refbraid.training.optim import make_optimizer

    grad = distributed_gradient(net, LayerParallelSettings(), bk, world=world)
    trainer = ShardedTrainer(grad, params, make_optimizer("adam", 1e-4))
    return lambda: trainer.step(x, y)


def _machine(case: dict, max_ranks: int, messages, clock, statistic):
    """The calibrated machine (one interleaved session in this process, trace on and off) for
    the one-rank sharded step as it runs; see refbraid/scaling/calibration.py."""
    from mpi4py import MPI

    from refbraid.layer_parallel import LayerParallelSettings
    from refbraid.scaling.predict import calibrate_network
    from refbraid.training.optim import make_optimizer

    net, params, x, y, bk = _problem(case)
    machine = calibrate_network(
        net, params, x, y, LayerParallelSettings(), bk,
        optimizer=lambda: make_optimizer("adam", 1e-4), max_ranks=max_ranks,
        measure_messages=lambda: messages, clock=clock, statistic=statistic,
        make_training_step=lambda: _sharded_step(net, params, x, y, bk, MPI.COMM_SELF))
    return machine, (net, params, x, y, bk)


def prepare_worker() -> str:
    """First thing in every process of this bench (the mpiexec measurement workers, every
    fresh calibration process, the main process): pin glibc malloc's thresholds
    (:func:`refbraid.runtime.pin_allocator`, as ``refbraid train``/``scale`` do) unless
    ``REFBRAID_PIN_ALLOCATOR=0`` (``--default-malloc``). Returns the allocator's state line."""
    from refbraid.runtime import allocator_state, pin_allocator

    pin_allocator()
    return allocator_state()


# ----------------------------------------------------------------------------- the worker
def worker(spec: dict) -> None:
    """Under mpiexec: the sharded training step of every case, wall and CPU seconds (slowest
    rank; median of ``repeat`` after 2 warm-ups); rank 0 prints one JSON line per case."""
    import json
    import math
    import statistics
    import time

    from mpi4py import MPI
    from two_rank_gap import measure_case

    state = prepare_worker()
    world = MPI.COMM_WORLD
    if world.Get_rank() == 0:
        print(TAG + json.dumps({"malloc": state}), flush=True)
    rows = []
    for case in spec["cases"]:
        net, params, x, y, bk = _problem(case)
        step = _sharded_step(net, params, x, y, bk, world)
        step()
        t0 = time.perf_counter()
        step()
        # at least MIN_TIMED seconds of timed steps (the slowest rank's warm-up sets how many):
        # a median of 7 six-millisecond steps is 42 ms of one launch, at the mercy of a burst
        warm = world.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        repeat = min(max(spec["repeat"], math.ceil(MIN_TIMED / max(warm, 1e-6))), MAX_REPEAT)
        wall, cpu = [], []
        for _ in range(repeat):
            world.Barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            wall.append(world.allreduce(dt, op=MPI.MAX))
            cpu.append(world.allreduce(dc, op=MPI.MAX))
        rows.append({"wall": statistics.median(wall), "wall_min": min(wall),
                     "cpu": statistics.median(cpu), "cpu_min": min(cpu)})
    # after ALL timed steps (run before them, the kernel and the traced steps slowed the next
    # cases' P = 2 steps by up to 28 %): two_rank_gap's bus factor and traced parts
    for case, row in zip(spec["cases"], rows, strict=True):
        net, params, x, y, bk = _problem(case)
        step = _sharded_step(net, params, x, y, bk, world)
        step()
        row.update(measure_case(world, net, params, x, y, bk, step, spec["repeat"]))
        if world.Get_rank() == 0:
            print(TAG + json.dumps(row), flush=True)


def _launch(n: int, cases: list[dict], repeat: int, timeout: float) -> list[dict]:
    import json

    from refbraid.parallel.launch import run_mpi

    spec = json.dumps({"cases": cases, "repeat": repeat})
    run = run_mpi(n, [str(Path(__file__).resolve()), "--worker", spec], timeout=timeout,
                  cwd=ROOT).check()
    rows = [json.loads(line[len(TAG):]) for line in run.output.splitlines()
            if line.startswith(TAG)]
    _check_malloc(f"mpiexec -n {n} workers", rows.pop(0)["malloc"])
    return rows


def _check_malloc(who: str, state: str) -> None:
    """Both sides must run under the same allocator: stop when a worker's differs."""
    from refbraid.runtime import allocator_state

    if state != allocator_state():
        raise SystemExit(f"bench_scaling: {who} run with {state!r}, this process with "
                         f"{allocator_state()!r}")


def _verdict(ratio: float) -> str:
    return "PASS" if abs(ratio - 1.0) <= TOLERANCE else "miss"


def _path_line(machine, dist) -> str:
    """The predicted P = 2 step's critical path (steps per level and direction, messages,
    collectives), extra and idle share: printed under a miss, to read where it differs."""
    from refbraid.parallel.trace import path_breakdown

    run, t0 = dist.run.run, dist.run.t0
    end = t0 + dist.run.step_time  # the setup before and the shards' gather after: untimed
    timed = [e for e in run.critical_path if t0 <= e.t0 < end]
    parts = ", ".join(f"{k} {1e3 * v:.2f}" for k, v in sorted(path_breakdown(timed).items())
                      if v > 0)
    return (f"    P=2 critical path (ms): {parts}; extra {1e3 * machine.extra:.2f}; "
            f"idle {100 * run.idle_fraction():.0f} %")


def predict_case(spec: dict) -> dict:
    """Calibrate and predict one case (run in a FRESH process: the calibration must not
    inherit the bench's allocation history, docs/scaling_calibration.md §1)."""
    import statistics
    import time
    from dataclasses import replace

    from two_rank_gap import fixed_cost, virtual_parts

    from refbraid.scaling.predict import _scaled, extra_on, per_rank_on, predict
    from refbraid.scaling.virtual_training import predict_steps

    state = prepare_worker()
    clock = time.process_time if spec["cpu"] else time.perf_counter
    statistic = min if spec["min"] else statistics.median
    m, (net, params, x, y, bk) = _machine(spec["case"], 2, tuple(spec["messages"]), clock,
                                          statistic)
    rows = predict(m, max_ranks=2)
    dist = predict_steps(m, net, params, x, y, bk, 2)
    d = next(r for r in dist if (r.ranks, r.groups) == (2, 1))
    # the memory-bus factor measured on the kernel (two_rank_gap.py): every compute charge of
    # the 2-rank step (step costs with their bookkeeping, extra) × bus; messages unchanged
    bus = spec.get("bus", 1.0)
    fixed, half, full = fixed_cost(spec["case"])  # F: per rank, not per layer (two_rank_gap)
    mb = replace(m, costs=_scaled(m.costs, bus), extra=m.extra * bus, per_rank=fixed * bus)
    db = next(r for r in predict_steps(mb, net, params, x, y, bk, 2)
              if (r.ranks, r.groups) == (2, 1))
    model = db.step  # dist × bus + F·bus·(1 − busiest share) (predict.per_rank_on)
    return {"p1": rows[0].layer_parallel, "p2": rows[1].layer_parallel, "dist": d.step,
            "bus_dist": db.step, "fixed": fixed, "fixed_from": [half, full], "model": model,
            "comm": d.comm, "trace": float(m.source["trace_factor"]),
            "path": _path_line(mb, db),
            "virtual": virtual_parts(db, extra_on(mb, 2) + per_rank_on(mb, 2)),
            "malloc": state}


def _predict_fresh(case: dict, messages, args, bus: float = 1.0) -> dict:
    import json
    import subprocess

    spec = json.dumps({"case": case, "messages": list(messages), "cpu": args.cpu,
                       "min": args.min, "bus": bus})
    out = subprocess.run([sys.executable, __file__, "--predict", spec], check=True,
                         capture_output=True, text=True, cwd=ROOT).stdout
    line = next(v for v in out.splitlines() if v.startswith(TAG))
    result = json.loads(line[len(TAG):])
    _check_malloc("the calibration process", result["malloc"])
    return result


def main(argv=None) -> int:
    import statistics
    import time
    from dataclasses import replace

    from two_rank_gap import gap_line

    from refbraid.scaling.messages import measure_messages
    from refbraid.scaling.predict import format_table, predict

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="dense N = 64, 256 only, no conv")
    ap.add_argument("--repeat", type=int, default=7, help="timed steps per case (median)")
    ap.add_argument("--calibrations", type=int, default=1,
                    help="independent calibrations per case (the spread of P=1 pred/meas)")
    ap.add_argument("--no-conv", action="store_true", help="skip TorchBraid's conv network")
    ap.add_argument("--float32", action="store_true", help="also the conv rows in float32")
    ap.add_argument("--layers", type=int, nargs="+", default=None, help="dense N (override)")
    ap.add_argument("--max-ranks", type=int, default=1024, help="largest P of the tables")
    ap.add_argument("--no-scaling", action="store_true", help="skip the strong-scaling tables")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per mpiexec launch")
    ap.add_argument("--cpu", action="store_true",
                    help="CPU time (process_time) for the calibration and the comparison: "
                    "on a loaded machine the idle-core time, where wall time is not")
    ap.add_argument("--min", action="store_true",
                    help="the fastest call instead of the median, on both sides (a loaded "
                    "machine: the calls no other tenant preempted)")
    ap.add_argument("--default-malloc", action="store_true",
                    help="leave glibc malloc's thresholds dynamic in every process "
                    "(REFBRAID_PIN_ALLOCATOR=0, both sides); default: pinned")
    ap.add_argument("--alpha", type=float, default=None,
                    help="seconds per message instead of the 2-rank ping-pong (on a loaded "
                    "machine the ping-pong measures the OS scheduler, not the messages)")
    ap.add_argument("--beta", type=float, default=None, help="seconds per byte (with --alpha)")
    args = ap.parse_args(argv)
    if args.default_malloc:  # inherited by the calibration processes and mpiexec's workers
        from refbraid.runtime import OPT_OUT_ENV

        os.environ[OPT_OUT_ENV] = "0"
    malloc = prepare_worker()
    layers = args.layers or ([64, 256] if args.quick else [64, 128, 256, 512, 1024])
    dense = [{"model": "resnet", "layers": n, "width": 32, "batch": 64, "backend": "numpy",
              "dtype": "float64"} for n in layers]
    dtypes = ("float64", "float32") if args.float32 else ("float64",)
    conv = [] if (args.quick or args.no_conv) else [
        {"model": "conv", "layers": n, "batch": 50, "backend": "numba", "dtype": dt}
        for dt in dtypes for n in (32, 128)]
    cases = dense + conv
    clock_name, key = ("CPU time", "cpu") if args.cpu else ("wall time", "wall")
    clock = time.process_time if args.cpu else time.perf_counter
    statistic = min if args.min else statistics.median
    key += "_min" if args.min else ""
    clock_name += ", fastest call" if args.min else ", median"
    print(f"load average before: {os.getloadavg()[0]:.2f} (2 cores); {malloc}; {clock_name}")
    if args.alpha is None:
        messages, how = measure_messages(), "2-rank ping-pong"
    else:
        messages, how = (args.alpha, args.beta or 0.0), "given: --alpha, --beta"
    measured = {p: _launch(p, cases, args.repeat, args.timeout) for p in (1, 2)}
    print(f"α = {messages[0] * 1e6:.2f} µs, β = {messages[1] * 1e9:.3f} ns/byte ({how}); ms "
          f"per layer-parallel training step (sharded gradient + Adam, as mpiexec runs it); "
          f"meas: mpiexec -n P, slowest rank, {'min' if args.min else 'median'} of "
          f"max({args.repeat}, ≥ {MIN_TIMED} s of steps)")
    print("pred: the MGRIT solves' schedule (cost-only) + extra; dist: the whole distributed "
          "step (DistributedGradient, sharded, real values) on the virtual cluster + extra; "
          f"PASS: |pred/meas − 1| ≤ {TOLERANCE:.0%} (P=2: model, below)")
    print("bus×: kernel (serial backprop) time with 2 ranks computing at once ÷ alone, measured "
          "in the mpiexec workers; F: the one-rank step's depth-independent part 2·T(n/2) − "
          "T(n) at n = min(N, 64 dense, 32 conv), measured in the calibration process; "
          "model: dist with every compute charge × bus×, + F·bus×·(1 − busiest share): "
          "every rank pays F whole "
          "(benchmarks/two_rank_gap.py); P=2 PASS/miss is on model/meas")
    head = (f"{'network':>8} {'dtype':>7} {'N':>5} | {'P=1 pred':>8} {'meas':>8} {'ratio':>6} "
            f"{'':>4} | {'P=2 pred':>8} {'dist':>8} {'bus×':>6} {'F':>6} {'model':>8} "
            f"{'meas':>8} {'mod/m':>6} {'':>4} | {'comm':>6} {'trace×':>6}")
    print(head + "\n" + "-" * len(head))
    spread = []
    for i, case in enumerate(cases):
        m1, m2 = measured[1][i][key], measured[2][i][key]
        bus = measured[2][i]["kernel"] / measured[1][i]["kernel"]
        runs = [_predict_fresh(case, messages, args, bus) for _ in range(args.calibrations)]
        r = runs[-1]
        p1, p2, d, db = r["p1"], r["p2"], r["dist"], r["model"]
        print(f"{case['model']:>8} {case['dtype']:>7} {case['layers']:5d} | {1e3 * p1:8.2f} "
              f"{1e3 * m1:8.2f} {p1 / m1:6.2f} {_verdict(p1 / m1):>4} | {1e3 * p2:8.2f} "
              f"{1e3 * d:8.2f} {bus:6.3f} {1e3 * r['fixed']:6.2f} {1e3 * db:8.2f} "
              f"{1e3 * m2:8.2f} {db / m2:6.2f} {_verdict(db / m2):>4} | {1e3 * r['comm']:6.2f} "
              f"{r['trace']:6.3f}", flush=True)
        if _verdict(db / m2) == "miss":
            print(f"{r['path']}; meas − model {1e3 * (m2 - db):+.2f}", flush=True)
            print(gap_line(measured[2][i], r["virtual"], bus), flush=True)
        spread.append((case, [v["p1"] / m1 for v in runs]))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.calibrations > 1:
        print(f"\ncalibration consistency: P=1 pred/meas over {args.calibrations} independent "
              "calibrations (one measurement per case)")
        for case, r in spread:
            print(f"{case['model']:>8} {case['dtype']:>7} {case['layers']:5d}: "
                  + " ".join(f"{v:.3f}" for v in r)
                  + f"   min {min(r):.3f} max {max(r):.3f}")
    if args.no_scaling:
        return 0
    for case in ([{**dense[0], "layers": 4096}] + conv[-1:]):
        m, _ = _machine(case, args.max_ranks, messages, clock, statistic)
        m = replace(m, source={**m.source, "messages": how})  # not "calibrated" when given
        title = (f"\nstrong scaling, {case['model']} N = {case['layers']}, batch "
                 f"{case['batch']} (calibrated here)")
        print(format_table(m, predict(m, args.max_ranks), title), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] in ("--worker", "--predict"):
        import json

        if sys.argv[1] == "--worker":
            worker(json.loads(sys.argv[2]))
        else:
            print(TAG + json.dumps(predict_case(json.loads(sys.argv[2]))), flush=True)
    else:
        sys.exit(main())
