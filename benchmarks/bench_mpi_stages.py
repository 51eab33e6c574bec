"""``--model conv-stages`` over MPI: seconds per gradient and the difference from one process.

    python benchmarks/bench_mpi_stages.py [--ranks 1 2 4] [--repeat 5] [--layers 31]
                                          [--batch 32] [--width 4]

Runs itself under ``mpiexec -n P`` (``python -m mpi4py``, one thread per rank) for every P and
prints one table. The network is ``refbraid train --model conv-stages`` on 8×8 inputs (the
digits shape): lift → N/2 conv ODE steps on 8×8 → 2×2 pooling + zero channels (or a strided
conv) → N/2 steps on 4×4 → classifier, optionally with batch norm. MGRIT: 3 levels, cfactor 2,
FCF, one forward and one adjoint cycle (the model's defaults).

Per (P, D, case): the median over ``--repeat`` calls (after a warm-up) of the slowest rank's
time for one gradient (:class:`~refbraid.distributed.stages.
StagedDistributedGradient`: both solves, the cache/state exchanges, the gradient sum, the BN
statistics); the same gradient in one process (``ConvStagesModel.layer_parallel_gradient``,
measured in the P = 1 run); and ``max |g − g_1|`` against the single-process gradient on
every rank (0 means bit-identical). D = P is pure data parallelism (BN synchronised over the
groups), D = 1 pure layer parallelism. The machine is shared: the load is printed; rerun
before trusting small differences.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

TAG = "BENCH "
ROOT = Path(__file__).resolve().parents[1]
CASES = [("pool", False), ("pool", True), ("strided", True)]  # (transition, batch norm)


def _settings():
    from refbraid.layer_parallel import LayerParallelSettings
    from refbraid.mgrit import MGRITSettings

    one = MGRITSettings(levels=3, cfactor=2, relax="FCF", max_iter=1, abs_tol=None, min_coarse=1)
    return LayerParallelSettings(forward=one, backward=one)


def _case(spec: dict, transition: str, bn: bool, x, y, world) -> None:
    """One (transition, BN) case at every D in (1, P); rank 0 prints one JSON line each."""
    from bench_mpi import _median_step as _median
    from mpi4py import MPI

    from refbraid.distributed.stages import staged_distributed_gradient
    from refbraid.parallel.mpi import MPIComm
    from refbraid.stages.model import ConvStagesModel

    def model():
        return ConvStagesModel((1, 8, 8), 10, spec["layers"], spec["width"], 1.0, "tanh", bn,
                               transition)

    P, settings, serial = world.Get_size(), _settings(), model()
    params = serial.init_params(np.random.default_rng(1))
    _, g0, _ = serial.layer_parallel_gradient(params, x, y, settings)
    one = _median(lambda: serial.layer_parallel_gradient(params, x, y, settings),
                  spec["repeat"], world) if P == 1 else None
    for D in (1, P) if P > 1 else (1,):
        grad = staged_distributed_gradient(model(), settings, data_parallel=D,
                                           world=MPIComm.world())
        _, g, _ = grad(params, x, y)
        diff = world.allreduce(max(float(np.max(np.abs(g[k] - g0[k]))) for k in g0),
                               op=MPI.MAX)
        t = _median(lambda grad=grad: grad(params, x, y), spec["repeat"], world)
        if world.Get_rank() == 0:
            print(TAG + json.dumps({"P": P, "D": D, "transition": transition, "bn": bn,
                                    "seconds": t, "one_process": one, "max_diff": diff}),
                  flush=True)


def worker(spec: dict) -> None:
    """Under mpiexec: every case at every D in (1, P)."""
    from mpi4py import MPI

    rng = np.random.default_rng(0)
    x = rng.standard_normal((spec["batch"], 1, 8, 8))
    y = rng.integers(0, 10, spec["batch"])
    for transition, bn in CASES:
        _case(spec, transition, bn, x, y, MPI.COMM_WORLD)


def _run(n: int, spec: dict) -> list[dict]:
    from refbraid.parallel.launch import run_mpi

    run = run_mpi(n, [str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
                  timeout=1200, cwd=ROOT)
    if not run.ok:
        raise SystemExit(f"mpiexec -n {n} failed:\n{run.output[-4000:]}")
    return [json.loads(line[len(TAG):]) for line in run.output.splitlines()
            if line.startswith(TAG)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--layers", type=int, default=31)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    spec = {"layers": args.layers, "batch": args.batch, "width": args.width,
            "repeat": args.repeat}
    rows = [r for n in args.ranks for r in _run(n, spec)]
    one = {(r["transition"], r["bn"]): r["one_process"] for r in rows if r["one_process"]}
    print(f"conv-stages, {args.layers + 1} fine steps, width {args.width}, batch {args.batch}, "
          f"8×8 inputs; MGRIT 3 levels, cfactor 2, FCF, 1 + 1 cycles; median of "
          f"{args.repeat}; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'case':<16} {'P':>2} {'D':>2} {'s/gradient':>11} {'1 process':>10} "
          f"{'speedup':>8} {'max|g-g1|':>10}")
    for r in rows:
        case = f"{r['transition']}{' + BN' if r['bn'] else ''}"
        base = one.get((r["transition"], r["bn"]))
        speed = f"{base / r['seconds']:.2f}" if base else "-"
        print(f"{case:<16} {r['P']:>2} {r['D']:>2} {r['seconds']:>11.4f} "
              f"{base if base is None else round(base, 4)!s:>10} {speed:>8} "
              f"{r['max_diff']:>10.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
