"""The GRU under MPI (MGRIT over the sequence) and --bias-control under MPI: time and exactness.

    python benchmarks/bench_gru_mpi.py [--quick] [--repeat 5] [--max-ranks 4]

Runs itself under ``mpiexec -n P`` (``python -m mpi4py``, one thread per rank) and prints:

1. GRU gradient (:class:`refbraid.distributed.gru.SequenceParallelGRU`), L positions,
   hidden H, batch B, 2 levels, cfactor 4, 2 forward / 1 adjoint cycles: median seconds per
   gradient (the slowest rank's), with P sequence ranks (D = 1) and with D = P data-parallel
   groups; beside it, whether the gradient equals the one-process
   ``GRUModel.layer_parallel_gradient`` bit for bit, and the largest relative difference.
   For reference, BPTT (``GRUModel.backprop``) in the same run.
2. ``--bias-control`` over MPI (:mod:`refbraid.distributed.bias_control`), a dense ResNet:
   median seconds of a plain layer-parallel step and of a step that also measures bias and
   noise (gathers on rank 0, M + 1 backprops there, one broadcast), and of a step after the
   switch to serial backprop.

Every ratio compares timings of this one run. The machine may be shared: read ``uptime``.
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


def _median_slowest(world, fn, repeat: int) -> float:
    """Median over ``repeat`` calls (after one warm-up) of the slowest rank's seconds."""
    fn()
    times = []
    for _ in range(repeat):
        world.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(max(world.allgather(time.perf_counter() - t0)))
    return statistics.median(times)


def _gru_worker(spec: dict) -> None:
    from refbraid.distributed.gru import sequence_parallel_gradient
    from refbraid.layer_parallel import LayerParallelSettings
    from refbraid.parallel.mpi import MPIComm
    from refbraid.sequence.gru_model import GRUModel

    world = MPIComm.world()
    L, H, B = spec["L"], spec["H"], spec["B"]
    model = GRUModel(L, 4, H, 4)
    rng = np.random.default_rng(0)
    params = model.init_params(rng)
    x, y = rng.standard_normal((B, L, 4)), rng.integers(0, 4, B)
    settings = LayerParallelSettings.with_iterations(2, 1, levels=2, cfactor=4)
    _, ref, _ = model.layer_parallel_gradient(params, x, y, settings)
    grad = sequence_parallel_gradient(model, settings, data_parallel=spec["D"])
    _, g, _ = grad(params, x, y)
    same = all(np.array_equal(g[k], ref[k]) for k in ref)
    rel = max(float(np.abs(g[k] - ref[k]).max() / max(np.abs(ref[k]).max(), 1e-300))
              for k in ref)
    t = _median_slowest(world, lambda: grad(params, x, y), spec["repeat"])
    res = {"P": world.size, "D": spec["D"], "seconds": t, "bit_identical": same, "rel": rel}
    if world.size == 1:
        res["bptt"] = _median_slowest(world, lambda: model.backprop(params, x, y),
                                      spec["repeat"])
    if world.rank == 0:
        print(TAG + json.dumps(res), flush=True)


def _bias_worker(spec: dict) -> None:
    from refbraid.parallel.mpi import MPIComm
    from refbraid.training.config import TrainConfig
    from refbraid.training.gradients import mpi_gradient
    from refbraid.training.models import as_network_input
    from refbraid.training.run import setup
    from refbraid.training.trainer import layer_parallel_settings

    world = MPIComm.world()
    config = TrainConfig(model="resnet", layers=spec["N"], width=8, samples=400, levels=2,
                         cfactor=4, fwd_iters=2, bwd_iters=1, batch_size=64, seed=0,
                         quiet=True, bias_control="serial", bias_every=10 ** 9,
                         bias_threshold=1e9, bias_micro=4)
    net, data, state, bk = setup(config)
    _, grad = mpi_gradient(config, net, net, layer_parallel_settings(config), bk)
    grad.localize(state)
    x = as_network_input(net, data.x_train[:64])
    y = data.y_train[:64]
    core = grad.core
    plain = _median_slowest(world, lambda: grad(state.params, x, y), spec["repeat"])

    def measured():
        core.calls = core.control.every - 1  # the next call measures (ratio < threshold)
        grad(state.params, x, y)

    measure = _median_slowest(world, measured, spec["repeat"])
    core.serial = True
    serial = _median_slowest(world, lambda: grad(state.params, x, y), spec["repeat"])
    if world.rank == 0:
        print(TAG + json.dumps({"P": world.size, "plain": plain, "measured": measure,
                                "serial": serial}), flush=True)


def _launch(n: int, spec: dict, timeout: float = 600) -> list[dict]:
    from refbraid.parallel.launch import run_mpi

    run = run_mpi(n, [str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
                  timeout=timeout, cwd=ROOT)
    if not run.ok:
        raise RuntimeError(f"mpiexec -n {n} failed:\n{run.output[-3000:]}")
    return [json.loads(line[len(TAG):]) for line in run.output.splitlines()
            if line.startswith(TAG)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="small sizes, 3 repeats")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--max-ranks", type=int, default=4)
    args = ap.parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        (_gru_worker if spec["kind"] == "gru" else _bias_worker)(spec)
        return 0
    repeat = 3 if args.quick else args.repeat
    L, H, B = (64, 16, 32) if args.quick else (256, 32, 64)
    print(f"uptime: {os.popen('uptime').read().strip()}")
    print(f"\n1. GRU gradient, L={L} H={H} B={B}, 2 levels cfactor 4, 2/1 cycles "
          f"(median of {repeat}, slowest rank)")
    print(f"{'P':>3} {'D':>3} {'s/gradient':>11} {'vs P=1':>7} {'bit-identical':>14} "
          f"{'max rel diff':>13}")
    base = None
    for P in range(1, args.max_ranks + 1):
        for D in sorted({1, P}):
            r = _launch(P, {"kind": "gru", "L": L, "H": H, "B": B, "D": D, "repeat": repeat})[0]
            base = r["seconds"] if base is None else base
            print(f"{P:>3} {D:>3} {r['seconds']:>11.4f} {base / r['seconds']:>6.2f}x "
                  f"{str(r['bit_identical']):>14} {r['rel']:>13.1e}")
            if "bptt" in r:
                print(f"{'':>3} {'':>3} {r['bptt']:>11.4f}  (BPTT, one process)")
    N = 64 if args.quick else 256
    print(f"\n2. --bias-control over MPI, resnet N={N} width 8 batch 64 (M = 4 micro-batches)")
    print(f"{'P':>3} {'plain step':>11} {'measuring step':>15} {'serial step':>12}")
    for P in sorted({1, min(2, args.max_ranks), args.max_ranks}):
        r = _launch(P, {"kind": "bias", "N": N, "repeat": repeat})[0]
        print(f"{P:>3} {r['plain']:>11.4f} {r['measured']:>15.4f} {r['serial']:>12.4f}")
    print(f"\nuptime: {os.popen('uptime').read().strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
