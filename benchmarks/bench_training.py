"""Per-batch cost of serial backprop vs layer-parallel MGRIT (one process).

For a dense ResNet (width C, batch B) of N = 32, 128, 512 layers, times one gradient
(forward + backward) by

* serial backprop: N forward steps + N adjoint steps;
* layer-parallel: MGRIT forward solve + MGRIT adjoint solve (TorchBraid's defaults); the
  parameter gradient comes from the adjoint solve's last relaxation (no extra pass).

Prints median times over repeats, the Φ applications of each, and the *work ratio*
(layer-parallel work / serial work): on P ranks the layer-parallel gradient can only win when
P exceeds roughly this ratio (docs/references.md §4), which is what the MPI version has to beat.

    python benchmarks/bench_training.py [--quick] [--repeat 5] [--width 32] [--batch 64]
                                        [--workspace]

``--sequence`` times the sequence models instead (refbraid.sequence): the GRU with MGRIT over
L = 16, 64, 256 positions (hidden 32, 4 features) and the encoder-only transformer with N = 8,
32 layers (width 16, 10 tokens), both with their ``refbraid train`` defaults (3 levels,
cfactor 2, 2 forward / 1 adjoint cycles after the skipped down-cycle).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import numpy as np

from refbraid import Network, backprop, get_backend, init_params
from refbraid.layer_parallel import LayerParallelSettings, layer_parallel_gradient
from refbraid.layers import Classifier, DenseLift, DenseStep


def median_time(fn, repeat: int) -> float:
    fn()  # warm-up (Numba compilation, caches)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 32 and 128 only, 2 repeats")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--backend", default="numpy")
    parser.add_argument("--T", type=float, default=3.0)
    parser.add_argument("--workspace", action="store_true",
                        help="LP gradients reuse a GradientWorkspace (as the trainers do)")
    parser.add_argument("--sequence", action="store_true",
                        help="time the GRU and transformer models instead of the ResNet")
    args = parser.parse_args(argv)
    if args.sequence:
        return sequence_table(args)
    depths = (32, 128) if args.quick else (32, 128, 512)
    repeat = 2 if args.quick else args.repeat
    bk = get_backend(args.backend)
    settings = LayerParallelSettings()
    rng = np.random.default_rng(0)

    print(f"dense ResNet, width {args.width}, batch {args.batch}, T = {args.T}, backend "
          f"{bk.name}; layer-parallel: {settings.forward.levels} levels, cfactor "
          f"{settings.forward.cfactors[0]}, TorchBraid's 2 forward / 1 adjoint iterations; "
          f"median of {repeat}")
    head = (f"{'N':>5} {'serial ms':>10} {'LP ms':>9} {'time ratio':>10} {'Φ serial':>9} "
            f"{'Φ LP':>7} {'work ratio':>10} {'overhead':>8} {'fwd ‖r‖':>9} {'grad err':>9}")
    print(head)
    print("-" * len(head))
    for N in depths:
        C = args.width
        net = Network(DenseLift(2, C), DenseStep(C, "tanh"), Classifier((C,), 5), N, args.T)
        params = {k: bk.asarray(v) for k, v in init_params(net, 0).items()}
        x = bk.asarray(rng.standard_normal((args.batch, 2)))
        y = bk.asarray(rng.integers(0, 5, args.batch))
        args_ = (net, params, x, y)
        t_serial = median_time(lambda a=args_: backprop(*a, bk), repeat)
        kw = {}
        if args.workspace:  # the solves' arrays kept across calls (refbraid.mgrit.workspace)
            from refbraid.mgrit import GradientWorkspace
            kw = {"workspace": GradientWorkspace()}
        t_lp = median_time(
            lambda a=args_, kw=kw: layer_parallel_gradient(*a, settings, bk, **kw), repeat)
        _, g_ref, _ = backprop(net, params, x, y, bk)
        _, g, info = layer_parallel_gradient(net, params, x, y, settings, bk)
        num = sum(float(np.sum((bk.to_numpy(g[k]) - bk.to_numpy(g_ref[k])) ** 2)) for k in g)
        den = sum(float(np.sum(bk.to_numpy(g_ref[k]) ** 2)) for k in g)
        phi_serial = 2 * N
        phi_lp = int(info.stats()["phi_calls"])
        print(f"{N:>5d} {1e3 * t_serial:>10.2f} {1e3 * t_lp:>9.2f} {t_lp / t_serial:>10.2f} "
              f"{phi_serial:>9d} {phi_lp:>7d} {phi_lp / phi_serial:>10.2f} "
              f"{t_lp / t_serial / (phi_lp / phi_serial):>8.2f} "
              f"{info.forward.norms[-1]:>9.2e} {np.sqrt(num / den):>9.2e}")
    print("work ratio = Φ applications of the layer-parallel gradient / those of serial "
          "backprop;\noverhead = time ratio / work ratio (1.0: the solver costs nothing beyond "
          "its steps; the target is <= 1.15);\nwith P ranks and perfect overlap the "
          "layer-parallel gradient needs P well above the work ratio to win.")


def sequence_table(args) -> None:
    """Serial BPTT/backprop vs the layer-parallel gradient of the sequence models."""
    from refbraid.layer_parallel import relative_gradient_error
    from refbraid.sequence import GRUModel, TransformerModel

    repeat = 2 if args.quick else args.repeat
    bk = get_backend(args.backend)
    settings = LayerParallelSettings.with_iterations(2, 1, levels=3, cfactor=2,
                                                     skip_first_down=True)
    rng = np.random.default_rng(0)
    B = args.batch
    cases = [(f"gru L={L}", GRUModel(L, 4, 32, 4), rng.standard_normal((B, L, 4)),
              rng.integers(0, 4, B)) for L in ((16, 64) if args.quick else (16, 64, 256))]
    cases += [(f"transformer N={N}", TransformerModel(8, 10, 2, N, 16, 2, 32, 2.0),
               rng.integers(0, 8, (B, 10)), rng.integers(0, 2, B)) for N in (8, 32)]
    print(f"sequence models, batch {B}, backend {bk.name}; layer-parallel: 3 levels, cfactor 2, "
          f"2 forward / 1 adjoint cycles; median of {repeat}")
    head = (f"{'model':<17} {'serial ms':>10} {'LP ms':>9} {'time ratio':>10} {'Φ LP':>7} "
            f"{'fwd ‖r‖':>9} {'grad err':>9}")
    print(head)
    print("-" * len(head))
    for name, model, x, y in cases:
        params = {k: bk.asarray(v) for k, v in model.init_params(np.random.default_rng(1)).items()}
        x, y = bk.asarray(x), bk.asarray(y)
        batch = (params, x, y)
        t_serial = median_time(lambda m=model, a=batch: m.backprop(*a, bk), repeat)
        t_lp = median_time(lambda m=model, a=batch: m.layer_parallel_gradient(*a, settings, bk),
                           repeat)
        _, g_ref, _ = model.backprop(params, x, y, bk)
        _, g, info = model.layer_parallel_gradient(params, x, y, settings, bk)
        phi_lp = int(info.stats()["phi_calls"]) + 2 * model.n_layers
        print(f"{name:<17} {1e3 * t_serial:>10.2f} {1e3 * t_lp:>9.2f} {t_lp / t_serial:>10.2f} "
              f"{phi_lp:>7d} {info.forward.norms[-1]:>9.2e} "
              f"{relative_gradient_error(g, g_ref, bk):>9.2e}")


if __name__ == "__main__":
    main()
