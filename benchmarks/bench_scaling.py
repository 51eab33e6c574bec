"""The virtual cluster against reality, then strong scaling to 1,024 ranks.

    python benchmarks/bench_scaling.py [--quick] [--repeat 5] [--no-conv] [--max-ranks 1024]
        [--alpha S --beta S]

1. Predicted vs measured. For benchmarks/bench_mpi.py's networks (dense ResNet, width 32,
   batch 64, N = 64 … 1024, NumPy; TorchBraid's MNIST conv network, batch 50, N = 32 and 128,
   Numba), the machine model is calibrated in this process (:func:`refbraid.scaling.predict.
   calibrate_network`: a traced one-process layer-parallel gradient, serial steps, α and β from
   a 2-rank ping-pong) and the virtual cluster predicts one layer-parallel training step on
   P = 1 and 2 ranks; bench_mpi.py's MPI worker measures the same step (``ShardedTrainer``:
   gradient + Adam, slowest rank, median of ``--repeat``) under ``mpiexec -n 1`` and ``-n 2``.
   ``pred/meas`` is the ratio; the goal is within 15 %. At P = 2 a second prediction,
   ``dist``, runs the whole distributed training step itself (``DistributedGradient``, sharded,
   with real values: ghost weights, both solves, broadcasts, state rows, gradient rows home,
   the reductions) on the virtual cluster (:func:`refbraid.scaling.virtual_training.
   predict_steps`) + the same ``extra``; ``comm`` is its critical path's ms in messages and
   collectives.
2. Strong scaling of the dense network at N = 4096 and the conv network at N = 128 with the
   calibrated model: P = 1 … ``--max-ranks`` (the ``refbraid scale`` table).

The machine is shared: the load is printed; rerun before trusting small differences.
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


def _machine(case: dict, max_ranks: int, messages):
    from bench_mpi import _data, _network

    from refbraid.backends import get_backend
    from refbraid.layer_parallel import LayerParallelSettings
    from refbraid.network import init_params
    from refbraid.scaling.predict import calibrate_network
    from refbraid.training.optim import make_optimizer

    net = _network(case)
    bk = get_backend(case["backend"])
    params = init_params(net, 0, np.dtype(case["dtype"]))
    x, y = _data(net, case["batch"])
    x = x.astype(case["dtype"])
    machine = calibrate_network(net, params, x, y, LayerParallelSettings(), bk,
                                optimizer=lambda: make_optimizer("adam", 1e-4),
                                max_ranks=max_ranks, measure_messages=lambda: messages)
    return machine, (net, params, x, y, bk)


def main(argv=None) -> int:
    from bench_mpi import _launch

    from refbraid.scaling.messages import measure_messages
    from refbraid.scaling.predict import format_table, predict
    from refbraid.scaling.virtual_training import predict_steps

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="dense N = 64, 256 only, no conv")
    ap.add_argument("--repeat", type=int, default=5, help="timed steps per case (median)")
    ap.add_argument("--no-conv", action="store_true", help="skip TorchBraid's conv network")
    ap.add_argument("--max-ranks", type=int, default=1024, help="largest P of the tables")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per mpiexec launch")
    ap.add_argument("--alpha", type=float, default=None,
                    help="seconds per message instead of the 2-rank ping-pong (on a loaded "
                    "machine the ping-pong measures the OS scheduler, not the messages)")
    ap.add_argument("--beta", type=float, default=None, help="seconds per byte (with --alpha)")
    args = ap.parse_args(argv)
    dense = [{"model": "resnet", "layers": n, "width": 32, "batch": 64, "backend": "numpy",
              "dtype": "float64"} for n in ([64, 256] if args.quick else [64, 128, 256, 512,
                                                                          1024])]
    conv = [] if (args.quick or args.no_conv) else [
        {"model": "conv", "layers": n, "batch": 50, "backend": "numba", "dtype": "float64"}
        for n in (32, 128)]
    cases = dense + conv
    print(f"load average before: {os.getloadavg()[0]:.2f} (2 cores)")
    if args.alpha is None:
        messages, how = measure_messages(), "2-rank ping-pong"
    else:
        messages, how = (args.alpha, args.beta or 0.0), "given: --alpha, --beta"
    measured = {1: _launch(1, cases, args.repeat, args.timeout),
                2: _launch(2, cases, args.repeat, args.timeout)}
    print(f"α = {messages[0] * 1e6:.2f} µs, β = {messages[1] * 1e9:.3f} ns/byte ({how}); ms "
          f"per layer-parallel training step (gradient + Adam)")
    print("pred: the MGRIT solves' schedule (cost-only) + extra; dist: the whole distributed "
          "step (DistributedGradient, sharded, real values) on the virtual cluster + extra")
    print(f"{'network':>8} {'N':>5} | {'P=1 pred':>8} {'meas':>8} {'ratio':>6} | "
          f"{'P=2 pred':>8} {'dist':>8} {'meas':>8} {'ratio':>6} {'dist/m':>6} | "
          f"{'comm':>6} {'serial':>7}")
    for i, case in enumerate(cases):
        m, (net, params, x, y, bk) = _machine(case, 2, messages)
        rows = predict(m, max_ranks=2)
        dist = {(r.ranks, r.groups): r for r in predict_steps(m, net, params, x, y, bk, 2)}
        cells = []
        for p, row in zip((1, 2), rows, strict=True):
            meas = measured[p][i]["lp_s"]
            pred = row.layer_parallel
            if p == 1:
                cells.append(f"{1e3 * pred:8.2f} {1e3 * meas:8.2f} {pred / meas:6.2f}")
            else:
                d = dist[2, 1].step
                cells.append(f"{1e3 * pred:8.2f} {1e3 * d:8.2f} {1e3 * meas:8.2f} "
                             f"{pred / meas:6.2f} {d / meas:6.2f}")
        serial = measured[1][i]["serial_s"]
        print(f"{case['model']:>8} {case['layers']:5d} | {cells[0]} | {cells[1]} | "
              f"{1e3 * dist[2, 1].comm:6.2f} {1e3 * serial:7.2f}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    for case in ([{**dense[0], "layers": 4096}] + conv[-1:]):
        m, _ = _machine(case, args.max_ranks, messages)
        title = (f"\nstrong scaling, {case['model']} N = {case['layers']}, batch "
                 f"{case['batch']} (calibrated here)")
        print(format_table(m, predict(m, args.max_ranks), title), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
