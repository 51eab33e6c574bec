"""The tied GPT and the autoregressive encoder–decoder under MPI: one sharded training gradient
on P = 1..4 ranks (layer parallelism, and layer × data at P = 4), against one process.

    python benchmarks/bench_seq_mpi.py [--quick] [--repeat 5] [--ranks 1 2 3 4]

Runs itself under ``mpiexec -n P`` (``python -m mpi4py``, one thread per rank) for every P and
prints one table per model: the median over ``--repeat`` calls (after one warm-up) of the
slowest rank's time for ``gradient.sharded`` (:mod:`refbraid.distributed.chained`), the
largest per-rank count of step applications (``rank_phi_calls``, the work on the critical
rank) and the total (``phi_calls``), and whether the loss and the gathered gradient equal the
single-process ``model.layer_parallel_gradient`` bit for bit (layer parallelism) or how far
they are (data parallelism). MGRIT: 2 levels, cfactor 4, 2 forward / 1 backward iterations
(TorchBraid's defaults), so 16 layers give 4 coarse intervals: P = 3 splits them unevenly.

Timings on a shared 2-core machine: with P > 2 ranks oversubscribe the cores, so the time
column shows the message and bookkeeping overhead, not a speed-up; the counts are exact.
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

TAG = "BENCH "
ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "gpt": dict(model="gpt", layers=16, width=32, samples=64),
    "transformer-seq2seq": dict(model="transformer-seq2seq", data="seq-reverse", layers=16,
                                width=32, samples=64),
}


def _config(name: str, quick: bool):
    from refbraid.training.config import TrainConfig

    case = dict(CASES[name])
    if quick:
        case.update(width=16, layers=8)
    return TrainConfig(**case, levels=2, cfactor=4 if not quick else 2, fwd_iters=2,
                       bwd_iters=1, batch_size=32, seed=0, quiet=True)


def worker(spec: dict) -> None:
    """One P: every model, every split; rank 0 prints a JSON line per row."""
    from mpi4py import MPI

    from refbraid.distributed.chained import sequence_distributed_gradient
    from refbraid.layer_parallel import relative_gradient_error
    from refbraid.training.models import as_network_input
    from refbraid.training.run import setup
    from refbraid.training.trainer import layer_parallel_settings

    comm = MPI.COMM_WORLD
    P = comm.Get_size()
    for name in CASES:
        config = _config(name, spec["quick"])
        model, data, state, bk = setup(config)
        settings = layer_parallel_settings(config)
        x = as_network_input(model, data.x_train[:32])
        y = data.y_train[:32]
        loss1, g1, _ = model.layer_parallel_gradient(state.params, x, y, settings, bk)
        for D in [1, 2] if P == 4 else [1]:
            grad = sequence_distributed_gradient(model, settings, bk, data_parallel=D)
            shard = grad.shard(state.params)
            out = grad.sharded(shard, x, y)  # warm-up
            times = []
            for _ in range(spec["repeat"]):
                comm.Barrier()
                t0 = time.perf_counter()
                out = grad.sharded(shard, x, y)
                times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
            loss, gshard, stats = out
            full = grad.gather(gshard)
            busiest = comm.allreduce(stats["rank_phi_calls"], op=MPI.MAX)
            if comm.Get_rank() == 0:
                same = loss == loss1 and all(np.array_equal(full[k], g1[k]) for k in g1)
                print(TAG + json.dumps({
                    "model": name, "P": P, "D": D, "s": statistics.median(times),
                    "busiest": busiest, "phi": stats["phi_calls"], "identical": same,
                    "err": relative_gradient_error(full, g1, bk)}), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 3, 4])
    args = ap.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    from refbraid.parallel.launch import run_mpi

    spec = json.dumps({"quick": args.quick, "repeat": args.repeat})
    rows = []
    for n in args.ranks:
        run = run_mpi(n, [str(Path(__file__).resolve()), "--worker", spec], timeout=600,
                      cwd=ROOT)
        if not run.ok:
            print(run.output[-3000:], file=sys.stderr)
            return 1
        rows += [json.loads(line[len(TAG):]) for line in run.output.splitlines()
                 if line.startswith(TAG)]
    print(f"load: {os.getloadavg()[0]:.1f} (1-min average at the end), {os.cpu_count()} cores")
    for name in CASES:
        print(f"\n{name}: one sharded gradient, batch 32 (median of {args.repeat}, slowest "
              f"rank)")
        print(f"{'P':>3} {'D':>3} {'time s':>8} {'× P=1':>6} {'Φ busiest':>10} {'Φ total':>8}"
              f"  vs one process")
        base = next(r["s"] for r in rows if r["model"] == name and r["P"] == rows[0]["P"])
        for r in (r for r in rows if r["model"] == name):
            check = "bit-identical" if r["identical"] else f"rel. error {r['err']:.1e}"
            print(f"{r['P']:>3} {r['D']:>3} {r['s']:>8.3f} {r['s'] / base:>6.2f} "
                  f"{r['busiest']:>10.0f} {r['phi']:>8.0f}  {check}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
