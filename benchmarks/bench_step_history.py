"""Does a training step's time depend on what ran before it in the process? (issue 10, item 6)

    python benchmarks/bench_step_history.py [--layers 128] [--dtype float64] [--repeat 15]
        [--rounds 2] [--histories none bench_mpi] [--mallocs default pinned heap]
        [--settings torchbraid 2level fast fast-2level] [--ranks 1 2]

``bench_mpi.py`` and ``bench_two_rank_breakdown.py`` measured the same 2-rank float64 step of
TorchBraid's MNIST conv network (N = 128, batch 50, numba, TorchBraid's settings) at 549 ms and
at 249–336 ms. The difference between them: bench_mpi's worker runs the dense cases (N = 64 …
1024, layer- and data-parallel) and the conv network at N = 32 in the same process before it.

This script times that step (and serial backprop + Adam in one process, the baseline) in a
fresh ``mpiexec`` per cell, crossing

* history   ``none``: nothing before the step (warm-up step only);
            ``bench_mpi``: bench_mpi's own worker on its dense cases and conv N = 32 first;
* malloc    ``default``: glibc's dynamic thresholds;
            ``pinned``: :func:`refbraid.runtime.pin_allocator` (fixed mmap/trim thresholds);
            ``heap``: pinned and ``M_MMAP_MAX = 0`` (no block is ever mmapped);

* settings  the MGRIT settings of the 2-rank step (``bench_mpi.named_settings``; serial has
            none);

and per cell prints the median and minimum step (the slowest rank's wall time, ``--repeat``
steps after one warm-up, the timer of bench_mpi), CPU ms per step, minor page faults per step
(``resource.getrusage``) and the peak RSS. Cells run in alternating order over ``--rounds``
rounds, so a drift of the machine's load hits every cell alike. The load is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

TAG = "HISTORY "
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _malloc(mode: str) -> None:
    from refbraid.runtime import OPT_OUT_ENV, pin_allocator

    if mode == "default":  # and keep bench_mpi's worker (the history) from pinning them
        os.environ[OPT_OUT_ENV] = "0"
        return
    os.environ.pop(OPT_OUT_ENV, None)
    if not pin_allocator():
        raise SystemExit("pin_allocator() did nothing here (not glibc?)")
    if mode == "heap":
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-4, 0)  # M_MMAP_MAX = 0: never mmap a block


def _history(world) -> None:
    """bench_mpi's worker on its default dense cases and the conv network at N = 32."""
    import contextlib
    import io

    from bench_mpi import worker as bench_mpi_worker

    P = world.Get_size()
    dense = [{"model": "resnet", "layers": n, "width": 32, "batch": 64, "backend": "numpy",
              "dtype": "float64", "dp_groups": max(P, 2)} for n in (64, 128, 256, 512, 1024)]
    conv = [{"model": "conv", "layers": 32, "batch": 50, "backend": "numba",
             "dtype": "float64"}]
    with contextlib.redirect_stdout(io.StringIO()):
        bench_mpi_worker({"cases": dense + conv, "repeat": 5})


def worker(spec: dict) -> None:
    """Under mpiexec: time the step after the history, rank 0 prints one JSON line."""
    from bench_mpi import _data, _network, named_settings
    from mpi4py import MPI

    from refbraid.backends import get_backend
    from refbraid.distributed.network import distributed_gradient
    from refbraid.distributed.sharded import ShardedTrainer
    from refbraid.network import backprop, init_params
    from refbraid.training.optim import make_optimizer

    _malloc(spec["malloc"])
    world = MPI.COMM_WORLD
    P = world.Get_size()
    if spec["history"] == "bench_mpi":
        _history(world)
    case = {"model": "conv", "layers": spec["layers"]}
    net = _network(case)
    bk = get_backend("numba")
    params = init_params(net, 0, np.dtype(spec["dtype"]))
    x, y = _data(net, 50)
    x = x.astype(spec["dtype"])
    if P == 1:
        opt = make_optimizer("adam", 1e-4)

        def step():
            _, g, _ = backprop(net, params, x, y, bk)
            opt.step(params, g)
    else:
        settings = named_settings(spec.get("settings", "torchbraid"))
        tr = ShardedTrainer(distributed_gradient(net, settings, bk), params,
                            make_optimizer("adam", 1e-4))

        def step():
            tr.step(x, y)

    step()  # warm-up, as bench_mpi's _median_step
    walls, cpus, faults = [], [], []
    for _ in range(spec["repeat"]):
        world.Barrier()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        c0, t0 = time.process_time(), time.perf_counter()
        step()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        walls.append(world.allreduce(dt, op=MPI.MAX))
        cpus.append(dc)
        faults.append(r1.ru_minflt - r0.ru_minflt)
    mine = {"cpu": statistics.median(cpus), "faults": statistics.median(faults),
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    per = world.gather(mine, root=0)
    if world.Get_rank() == 0:
        print(TAG + json.dumps({"median": statistics.median(walls), "min": min(walls),
                                "per_rank": per}), flush=True)


def _cell(ranks: int, spec: dict, timeout: float) -> dict:
    from refbraid.parallel.launch import run_mpi

    run = run_mpi(ranks, [str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
                  timeout=timeout, cwd=ROOT).check()
    return next(json.loads(line[len(TAG):]) for line in run.output.splitlines()
                if line.startswith(TAG))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, default=128)
    ap.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2],
                    help="1 = serial backprop + Adam; ≥ 2 = the sharded LP step")
    ap.add_argument("--histories", nargs="+", default=["none", "bench_mpi"],
                    choices=("none", "bench_mpi"))
    ap.add_argument("--mallocs", nargs="+", default=["default", "pinned"],
                    choices=("default", "pinned", "heap"))
    ap.add_argument("--settings", nargs="+", default=["torchbraid"],
                    choices=("torchbraid", "2level", "fast", "fast-2level"))
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    cells = [(p, h, m, s) for p in args.ranks for h in args.histories for m in args.mallocs
             for s in (["-"] if p == 1 else args.settings)]
    print(f"MNIST conv network, N = {args.layers}, {args.dtype}, batch 50, numba; fresh "
          f"mpiexec per cell, {args.rounds} rounds alternating; load "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    results: dict[tuple, list[dict]] = {c: [] for c in cells}
    for rnd in range(args.rounds):
        order = cells if rnd % 2 == 0 else cells[::-1]
        for ranks, history, malloc, settings in order:
            spec = {"layers": args.layers, "dtype": args.dtype, "repeat": args.repeat,
                    "history": history, "malloc": malloc, "settings": settings}
            res = _cell(ranks, spec, args.timeout)
            results[(ranks, history, malloc, settings)].append(res)
            print(f"  round {rnd + 1}: ranks {ranks} {settings:<11} history {history:<9} malloc "
                  f"{malloc:<7} "
                  f"median {1e3 * res['median']:7.1f} ms (load {os.getloadavg()[0]:.2f})",
                  flush=True)
    print(f"\n{'ranks':>5} {'settings':<11} {'history':<10} {'malloc':<8} {'median ms':>18} "
          f"{'min ms':>16} {'CPU ms/rank':>16} {'faults/step':>18} {'peak RSS MB':>16}")
    for (ranks, history, malloc, settings), runs in results.items():
        def span(values, fmt="{:.0f}"):
            lo, hi = min(values), max(values)
            return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else \
                fmt.format(lo) + "-" + fmt.format(hi)

        med = span([1e3 * r["median"] for r in runs], "{:.1f}")
        mn = span([1e3 * r["min"] for r in runs], "{:.1f}")
        cpu = "/".join(span([1e3 * r["per_rank"][q]["cpu"] for r in runs])
                       for q in range(ranks))
        flt = "/".join(span([r["per_rank"][q]["faults"] for r in runs]) for q in range(ranks))
        rss = "/".join(span([r["per_rank"][q]["rss_mb"] for r in runs]) for q in range(ranks))
        print(f"{ranks:>5} {settings:<11} {history:<10} {malloc:<8} {med:>18} "
              f"{mn:>16} {cpu:>16} {flt:>18} {rss:>16}")
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
