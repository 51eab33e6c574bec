"""What TorchBraid's final FC relaxation of the adjoint does to the layer-parallel gradient,
and what ``refbraid compare`` costs, on TorchBraid's MNIST conv network.

Network (as benchmarks/bench_mpi.py): open Conv2d(1→4, 3×3)+ReLU, N steps
``x + h·ReLU(Conv2d(4→4, 3×3)(x))``, close Flatten + Linear(4·28·28 → 10), T = 1, built in
PyTorch (float64, ``torch.manual_seed(seed)``) and converted with ``refbraid.interop``; a batch
of 50 random 28×28 inputs. Settings: TorchBraid's defaults (3 levels, cfactor 4, 2 forward and
1 backward iterations, skip, F on the fine level, FCF below, abs tol 1e-9), the adjoint with
and without its final FC relaxation.

Columns: relative gradient error against exact backprop (all parameters, the opening
weights), the relative difference between the two conventions, the forward residual XBraid
prints, and the median seconds of one ``compare`` (exact + layer-parallel gradient + the
flipped-convention gradient when a user gradient is checked).

    python benchmarks/bench_compare.py [--layers 32] [--seeds 0 1 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def build(n_layers: int, seed: int):
    import torch
    from torch import nn

    torch.manual_seed(seed)

    class MNISTNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.opening = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU())
            self.steps = nn.ModuleList(nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU())
                                       for _ in range(n_layers))
            self.closing = nn.Sequential(nn.Flatten(), nn.Linear(4 * 28 * 28, 10))
            self.T = 1.0

    return MNISTNet().double()


def main() -> None:
    from refbraid.interop import TorchBraidSettings, from_torch, xbraid_stats
    from refbraid.interop.compare import compare, gradient_errors
    from refbraid.layer_parallel import layer_parallel_gradient

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"TorchBraid's MNIST network, N = {args.layers}, batch 50, float64, NumPy backend")
    head = (f"{'seed':>4} {'bwd final FC':>12} {'err total':>10} {'err opening':>11} "
            f"{'conv. diff':>10} {'diff opening':>12} {'fwd ‖r‖ (XBraid)':>17} "
            f"{'compare s':>9}")
    print(head)
    print("-" * len(head))
    for seed in args.seeds:
        conv = from_torch(build(args.layers, seed), (1, 28, 28))
        rng = np.random.default_rng(seed)
        x, y = rng.standard_normal((50, 1, 28, 28)), rng.integers(0, 10, 50)
        grads = {}
        for final in (False, True):
            s = TorchBraidSettings(bwd_finalrelax=final).to_refbraid()
            _, g, info = layer_parallel_gradient(conv.net, conv.params, x, y, s)
            grads[final] = (g, info)
        diff = gradient_errors(grads[True][0], grads[False][0])
        for final in (False, True):
            s = TorchBraidSettings(bwd_finalrelax=final).to_refbraid()
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                report, _ = compare(conv, x, y, s, their_gradient=grads[final][0])
                times.append(time.perf_counter() - t0)
            err = report["layer_parallel"]["gradient_error"]
            fwd = xbraid_stats(grads[final][1].forward).norms
            print(f"{seed:>4} {str(final):>12} {err['total']:>10.3e} {err['opening.W']:>11.3e} "
                  f"{diff['total']:>10.3e} {diff['opening.W']:>12.3e} "
                  f"{', '.join(f'{v:.10g}' for v in fwd):>17} "
                  f"{statistics.median(times):>9.2f}")


if __name__ == "__main__":
    main()
