"""Where a 2-rank layer-parallel training step of the MNIST conv network spends its time.

    python benchmarks/bench_two_rank_breakdown.py [--layers 128] [--repeat 5] [--traced 3]
        [--dtypes float64 float32] [--backend numba] [--ranks 2]
        [--settings torchbraid|2level|fast|fast-2level] [--default-malloc]

Issue 10, item 6: TorchBraid's MNIST conv network (``--model conv``: ConvLift(1→4) + ReLU,
N ConvSteps 3×3 on 28×28, close Linear(4·28·28 → 10); batch 50; TorchBraid's settings: 3
levels, cfactor 4, 2 forward / 1 adjoint iterations), one training step (gradient + Adam):

* serial      backprop + Adam in one process (``mpiexec -n 1``), median of ``--repeat``;
              beside it the serial step work N·(c_f + c_bg) (unit costs of one forward and one
              fine adjoint step, measured in that run) and the rest (opening, closing, loss,
              Adam);
* 2 ranks     :class:`~refbraid.distributed.sharded.ShardedTrainer` on the distributed gradient
              under ``mpiexec -n 2``, median of ``--repeat`` (a step's time: the slowest
              rank's), then ``--traced`` steps with the execution trace on
              (:mod:`refbraid.parallel.trace`), of which the one with the median wall time is
              broken down per rank:

      fine fwd / fine adj      step applications on level 0, forward / adjoint (count, ms)
      coarse fwd / coarse adj  levels ≥ 1 (the coarse adjoint recomputes its forward step)
      wait                     time blocked in receives (the pipeline and late messages)
      send                     time to post the sends; bytes sent, messages
      reductions               collectives (residual norms, broadcasts, the loss)
      Python gap               wall − everything traced: opening, closing, loss, Adam,
                               recomputed caches, MGRIT bookkeeping, the glue; split by
                               phase (:mod:`phase_split`: before, in and between the two
                               solves, after them, the optimizer), wall and untraced ms

* ideal       the virtual cluster (:func:`refbraid.scaling.virtual_step.
              simulate_gradient_schedule`) replaying the same 2-rank schedule with the step
              costs measured in the traced step (mean per level and direction) and free
              messages (α = β = 0): the overhead-free critical path of the gradient; and
              with α, β of a ping-pong in this run.

The closing lines decompose (2-rank − serial) into named parts that add up exactly:

    (ideal − serial step work) + (steps − ideal steps) + (waits − ideal waits) + sends
        + (Python gap − serial rest)

with the serial step work N·(fine fwd + fine adj) at the step costs traced in the 2-rank run
(the schedule term then compares like with like) and the serial rest = serial − that.

and name the largest, i.e. the category that keeps 2 ranks above serial, in ms. On a shared
machine the numbers are only indicative (the load is printed); rerun on an idle one.

Each (dtype, ranks) runs in a fresh ``mpiexec`` with glibc malloc's thresholds pinned
(:func:`refbraid.runtime.pin_allocator`; ``--default-malloc`` leaves them dynamic), and the
step is timed as in ``bench_mpi.py`` (one warm-up step, then the median of the slowest rank's
``perf_counter`` time, :func:`bench_mpi._median_step`), so both benchmarks measure the same
step the same way (docs/scaling_overhead.md §5). ``--settings`` picks the MGRIT settings
(:func:`bench_mpi.named_settings`; TorchBraid's by default).

``--profile DIR`` then profiles ``--profile-steps`` more steps with cProfile, one file per
rank and dtype (``DIR/prof.<dtype>.serial`` for the serial step, ``DIR/prof.<dtype>.<rank>``
for the ranks), and prints each rank's time split by the part of refbraid that owns it
(:mod:`profile_split`): the step kernels, the MGRIT solver's bookkeeping, MPI, the glue.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

TAG = "BREAKDOWN "
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_mpi's helpers


def _case(layers: int, dtype: str, batch: int = 50):
    from refbraid.network import init_params
    from refbraid.training.models import build_network

    net = build_network("conv", (1, 28, 28), 10, layers, 4, 1.0, "relu")
    params = init_params(net, 0, np.dtype(dtype))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 1, 28, 28)).astype(dtype)
    return net, params, x, rng.integers(0, 10, batch)


def rank_breakdown(events, wall: float) -> dict:
    """Per-category seconds, counts and bytes of one rank's traced events (module docstring)."""
    from refbraid.parallel.trace import RECV, SEND, STEP

    out = {"wall": wall}
    for name, level0, direction in (("fine fwd", True, "forward"), ("fine adj", True, "backward"),
                                    ("coarse fwd", False, "forward"),
                                    ("coarse adj", False, "backward")):
        ev = [e for e in events if e.kind == STEP and (e.level == 0) == level0
              and e.direction == direction]
        out[name] = (len(ev), sum(e.duration for e in ev))
    recv = [e for e in events if e.kind == RECV]
    send = [e for e in events if e.kind == SEND]
    coll = [e for e in events if e.is_collective]
    out["wait"] = (len(recv), sum(e.duration for e in recv))
    out["send"] = (len(send), sum(e.duration for e in send))
    out["bytes"] = sum(e.nbytes for e in send)
    out["reductions"] = (len(coll), sum(e.duration for e in coll))
    traced = sum(e.duration for e in events)
    out["gap"] = wall - traced
    return out


# ----------------------------------------------------------------------------- the worker
def worker(spec: dict) -> None:
    """Under mpiexec: rank 0 prints one JSON line per dtype."""
    from bench_mpi import _median_step, _ping_pong, _unit_costs, named_settings, prepare_worker
    from mpi4py import MPI
    from phase_split import phase_split, timed_solves

    from refbraid.backends import get_backend
    from refbraid.distributed.network import distributed_gradient
    from refbraid.distributed.sharded import ShardedTrainer
    from refbraid.network import backprop
    from refbraid.parallel.trace import Recorder, recording
    from refbraid.training.optim import make_optimizer

    prepare_worker()
    world = MPI.COMM_WORLD
    P, rank, repeat = world.Get_size(), world.Get_rank(), spec["repeat"]
    settings = named_settings(spec.get("settings", "torchbraid"))
    meta = _ping_pong(world) if P > 1 else {}
    bk = get_backend(spec["backend"])
    for dtype in spec["dtypes"]:
        net, params, x, y = _case(spec["layers"], dtype)
        res = {"dtype": dtype, "ranks": P, **meta}
        if P == 1:
            p_serial = {k: v.copy() for k, v in params.items()}
            opt = make_optimizer("adam", 1e-4)

            def serial(p=p_serial, opt=opt, net=net, x=x, y=y):
                _, g, _ = backprop(net, p, x, y, bk)
                opt.step(p, g)

            res["serial_s"] = _median_step(serial, repeat)
            res.update(_unit_costs(net, params, x, bk))
            res["state_bytes"] = int(x.shape[0] * np.prod(net.step.state_shape) * x.itemsize)
            _profile(spec, serial, f"prof.{dtype}.serial")
        grad = distributed_gradient(net, settings, bk)
        tr = ShardedTrainer(grad, params, make_optimizer("adam", 1e-4))
        res["lp_s"] = _median_step(lambda tr=tr, x=x, y=y: tr.step(x, y), repeat, world)
        runs = []
        for _ in range(spec["traced"]):
            world.Barrier()
            origin = time.perf_counter()
            with recording(Recorder(rank, origin)) as rec, timed_solves(origin) as windows:
                _, grads, _ = tr.gradient.sharded(tr.shard, x, y)  # = tr.step, timed in two
                gradient_end = time.perf_counter() - origin
                tr.optimizer.step(tr.shard, grads)
            wall = time.perf_counter() - origin
            runs.append((world.allreduce(wall, op=MPI.MAX), wall, rec.trace(), windows,
                         gradient_end))
        walls = [r[0] for r in runs]
        pick = walls.index(sorted(walls)[len(walls) // 2])  # the same index on every rank
        _, wall, trace, windows, gradient_end = runs[pick]
        mine = rank_breakdown(list(trace), wall)
        mine["phases"] = phase_split(list(trace), windows, gradient_end, wall)
        mine["events"] = [[e.level, e.direction, e.duration] for e in trace if e.kind == "step"]
        solves = grad.last_solves
        mine["iterations"] = [solves["forward"].iterations, solves["backward"].iterations]
        mine["recomputed"] = solves.get("recomputed", 0)
        res["per_rank"] = world.gather(mine, root=0)
        world.Barrier()
        _profile(spec, lambda tr=tr, x=x, y=y: tr.step(x, y), f"prof.{dtype}.{rank}")
        if rank == 0:
            print(TAG + json.dumps(res), flush=True)


def _profile(spec: dict, step, name: str) -> None:
    """``--profile``: cProfile ``--profile-steps`` calls of ``step`` into DIR/name."""
    if not spec.get("profile"):
        return
    import cProfile

    prof = cProfile.Profile(time.process_time)  # CPU time: a descheduled rank charges nothing
    prof.enable()
    for _ in range(spec["profile_steps"]):
        step()
    prof.disable()
    prof.dump_stats(str(Path(spec["profile"]) / name))


# ----------------------------------------------------------------------------- the driver
def _launch(n: int, spec: dict, timeout: float, pinned: bool = True) -> dict[str, dict]:
    """One fresh ``mpiexec -n n`` per dtype; {dtype: rank 0's JSON}."""
    from refbraid.parallel.launch import run_mpi
    from refbraid.runtime import OPT_OUT_ENV

    out = {}
    for dtype in spec["dtypes"]:
        one = json.dumps({**spec, "dtypes": [dtype]})
        run = run_mpi(n, [str(Path(__file__).resolve()), "--worker", one], timeout=timeout,
                      cwd=ROOT, env=None if pinned else {OPT_OUT_ENV: "0"}).check()
        rows = [json.loads(line[len(TAG):]) for line in run.output.splitlines()
                if line.startswith(TAG)]
        out.update({r["dtype"]: r for r in rows})
    return out


def _measured_costs(per_rank):
    """StepCosts with the traced mean step seconds per (level, direction), all ranks."""
    from refbraid.parallel.costs import StepCosts

    table = {}
    for direction in ("forward", "backward"):
        levels = sorted({lv for r in per_rank for lv, d, _ in r["events"] if d == direction})
        row = []
        for lv in range(max(levels) + 1):
            d = [t for r in per_rank for lev, dd, t in r["events"] if lev == lv and dd == direction]
            row.append(statistics.fmean(d) if d else row[-1])
        table[direction] = tuple(row)
    return StepCosts(**table)


def _virtual(layers: int, state_bytes: int, ranks: int, costs, iterations, alpha, beta,
             settings: str = "torchbraid"):
    """(wall, per-rank {'steps', 'wait'}) of the cost-only virtual 2-rank gradient."""
    from bench_mpi import named_settings

    from refbraid.scaling.virtual_step import simulate_gradient_schedule

    run = simulate_gradient_schedule(layers, state_bytes, ranks, named_settings(settings), costs,
                                     alpha, beta, iterations=tuple(iterations))
    per = {}
    for r in range(ranks):
        ev = run.trace.on_rank(r)
        per[r] = {"steps": sum(e.duration for e in ev if e.kind == "step"),
                  "wait": sum(e.duration for e in ev if e.kind == "recv" or e.is_collective)}
    return run.wall_time, per


def report(one: dict, many: dict, layers: int, settings: str = "torchbraid") -> list[str]:
    """The tables and the closing lines for one dtype (module docstring)."""
    ms = 1e3
    P = many["ranks"]
    serial = one["serial_s"]
    serial_steps = layers * (one["c_f"] + one["c_bg"])
    serial_rest = serial - serial_steps
    per = many["per_rank"]
    costs = _measured_costs(per)
    its = per[0]["iterations"]
    ideal, vper = _virtual(layers, one["state_bytes"], P, costs, its, 0.0, 0.0, settings)
    alpha, beta = many.get("ping_pong", {}).get("MPIComm", (0.0, 0.0))
    with_msgs, _ = _virtual(layers, one["state_bytes"], P, costs, its, alpha, beta, settings)
    from refbraid.parallel.costs import StepCosts

    units = StepCosts(forward=one["c_f"], backward=(one["c_bg"], one["c_bc"]))
    ideal_units, _ = _virtual(layers, one["state_bytes"], P, units, its, 0.0, 0.0, settings)
    lines = [f"{many['dtype']}: serial {serial * ms:.1f} ms (steps N·(c_f + c_bg) = "
             f"{serial_steps * ms:.1f}, rest {serial_rest * ms:.1f}); {P} ranks "
             f"{many['lp_s'] * ms:.1f} ms (median), {many['lp_s'] / serial:.2f}× serial"]
    head = f"{'category':<12}" + "".join(f" {'rank ' + str(r) + ' n':>9} {'ms':>8}"
                                          for r in range(P))
    lines += [head, "-" * len(head)]
    for cat in ("fine fwd", "fine adj", "coarse fwd", "coarse adj", "wait", "send",
                "reductions"):
        lines.append(f"{cat:<12}" + "".join(f" {r[cat][0]:>9d} {r[cat][1] * ms:>8.1f}"
                                            for r in per))
    lines.append(f"{'Python gap':<12}" + "".join(f" {'':>9} {r['gap'] * ms:>8.1f}" for r in per))
    lines.append(f"{'wall':<12}" + "".join(f" {'':>9} {r['wall'] * ms:>8.1f}" for r in per))
    lines.append(f"{'bytes sent':<12}" + "".join(f" {r['bytes']:>18,d}" for r in per))
    lines.append(f"ideal critical path (virtual cluster, traced step costs, α = β = 0): "
                 f"{ideal * ms:.1f} ms; with α = {alpha * 1e6:.1f} µs, β = {beta * 1e9:.2f} ns/B:"
                 f" {with_msgs * ms:.1f} ms; with the serial run's unit costs (c_f, c_bg, "
                 f"c_bc): {ideal_units * ms:.1f} ms against its serial step work "
                 f"{serial_steps * ms:.1f} ms ({ideal_units / serial_steps:.2f}×)")
    # the serial step work at the traced costs, so that the schedule term compares like with
    # like (on a loaded machine the unit costs of the serial run and the traced ones differ)
    traced_steps = layers * (costs(0, "forward") + costs(0, "backward"))
    lines.append(f"serial step work at the traced costs N·(fine fwd + fine adj): "
                 f"{traced_steps * ms:.1f} ms; ideal / that = {ideal / traced_steps:.2f}×")
    q = max(range(P), key=lambda r: per[r]["wall"])
    r = per[q]
    steps = sum(r[c][1] for c in ("fine fwd", "fine adj", "coarse fwd", "coarse adj"))
    parts = {
        "schedule (ideal path − serial step work)": ideal - traced_steps,
        "steps slower than in the ideal": steps - vper[q]["steps"],
        "waits beyond the ideal": r["wait"][1] + r["reductions"][1] - vper[q]["wait"],
        "sends": r["send"][1],
        "Python gap − serial rest": r["gap"] - (serial - traced_steps),
    }
    excess = r["wall"] - serial
    lines.append(f"traced step on rank {q} (the slowest): {r['wall'] * ms:.1f} ms, "
                 f"{excess * ms:+.1f} ms against serial = " + " + ".join(
                     f"{k} {v * ms:+.1f}" for k, v in parts.items()))
    from phase_split import phase_lines

    lines += ["the traced step's phases (wall, and the part no traced event covers = its share "
              "of the Python gap):", *phase_lines(per)]
    worst = max(parts, key=parts.get)
    verdict = "above" if excess > 0 else "below"
    lines.append(f"=> {P} ranks are {abs(excess) * ms:.1f} ms {verdict} serial; the largest "
                 f"part is {worst}: {parts[worst] * ms:+.1f} ms")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, default=128)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--traced", type=int, default=3, help="traced steps (median one is shown)")
    ap.add_argument("--dtypes", nargs="+", default=["float64", "float32"],
                    choices=("float64", "float32"))
    ap.add_argument("--backend", default="numba")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--profile", metavar="DIR",
                    help="also cProfile steps per rank into DIR and print the split by owner")
    ap.add_argument("--profile-steps", type=int, default=5)
    ap.add_argument("--settings", default="torchbraid",
                    choices=("torchbraid", "2level", "fast", "fast-2level"),
                    help="MGRIT settings of the layer-parallel step (bench_mpi.named_settings)")
    ap.add_argument("--default-malloc", action="store_true",
                    help="leave glibc malloc's thresholds dynamic (REFBRAID_PIN_ALLOCATOR=0)")
    args = ap.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    spec = {"layers": args.layers, "repeat": args.repeat, "traced": args.traced,
            "dtypes": args.dtypes, "backend": args.backend,
            "profile": str(Path(args.profile).resolve()) if args.profile else None,
            "profile_steps": args.profile_steps, "settings": args.settings}
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    print(f"MNIST conv network, N = {args.layers}, batch 50, backend {args.backend}, settings "
          f"{args.settings}; one mpiexec per dtype, malloc "
          f"{'glibc default' if args.default_malloc else 'pinned'}; load "
          f"{os.getloadavg()[0]:.2f} (numbers on a loaded machine are only indicative)",
          flush=True)
    one = _launch(1, spec, args.timeout, not args.default_malloc)
    many = _launch(args.ranks, spec, args.timeout, not args.default_malloc)
    for dtype in args.dtypes:
        print()
        print("\n".join(report(one[dtype], many[dtype], args.layers, args.settings)), flush=True)
        if args.profile:
            from profile_split import profile_lines

            d = Path(args.profile)
            names = [f"prof.{dtype}.serial"] + [f"prof.{dtype}.{r}" for r in range(args.ranks)]
            print("\n".join(profile_lines([str(d / n) for n in names], args.profile_steps,
                                           ["serial"] + [f"rank {r}" for r in range(args.ranks)])),
                  flush=True)
    print(f"\nload at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
