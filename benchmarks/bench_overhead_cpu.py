"""The overhead column of bench_training.py in CPU time, with and without a fixed malloc.

    python benchmarks/bench_overhead_cpu.py [--repeat 21] [--depths 32 128 512] [--fixed-malloc]

Times serial backprop and the layer-parallel gradient (dense width 32, batch 64, NumPy,
TorchBraid's settings; built as in bench_training.py, in its order: per N serial, then LP)
with ``time.process_time`` medians, and prints overhead = (LP / serial) / work ratio.

glibc's malloc serves blocks above its *dynamic* mmap threshold with fresh pages (a page fault
per 4 KiB on first touch); the LP gradient's (k, B, C) temporaries and trajectories sit around
that threshold, so the default allocator's times move with the process's allocation history
(docs/scaling_overhead.md §4). ``--fixed-malloc`` reruns this script with
``MALLOC_MMAP_THRESHOLD_=8388608 MALLOC_TRIM_THRESHOLD_=67108864`` (glibc only), which takes the
page faults out of both columns.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np
from cpu_timing import median_time as cpu_median

from refbraid import Network, backprop, get_backend, init_params
from refbraid.layer_parallel import LayerParallelSettings, layer_parallel_gradient
from refbraid.layers import Classifier, DenseLift, DenseStep

FIXED = {"MALLOC_MMAP_THRESHOLD_": "8388608", "MALLOC_TRIM_THRESHOLD_": "67108864"}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=21)
    ap.add_argument("--depths", type=int, nargs="+", default=[32, 128, 512])
    ap.add_argument("--workspace", action="store_true",
                    help="LP gradients reuse a GradientWorkspace (as the trainers do)")
    ap.add_argument("--fixed-malloc", action="store_true",
                    help="rerun with glibc's mmap and trim thresholds fixed (see above)")
    args = ap.parse_args(argv)
    if args.fixed_malloc and os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:
        rest = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--fixed-malloc"]
        sys.exit(subprocess.call([sys.executable, __file__, *rest], env={**os.environ, **FIXED}))
    bk, settings = get_backend("numpy"), LayerParallelSettings()
    rng = np.random.default_rng(0)
    malloc = ("fixed thresholds" if os.environ.get("MALLOC_MMAP_THRESHOLD_")
              else "default malloc")
    print(f"CPU ms, medians of {args.repeat}; {malloc}; load {os.getloadavg()[0]:.2f}")
    print(f"{'N':>5} {'serial':>8} {'LP':>8} {'time ratio':>10} {'work ratio':>10} "
          f"{'overhead':>8}")
    for N in args.depths:
        C = 32
        net = Network(DenseLift(2, C), DenseStep(C, "tanh"), Classifier((C,), 5), N, 3.0)
        params = init_params(net, 0)
        x, y = rng.standard_normal((64, 2)), rng.integers(0, 5, 64)
        t_s = cpu_median(lambda net=net, p=params, x=x, y=y: backprop(net, p, x, y, bk),
                         args.repeat)
        kw = {}
        if args.workspace:  # the solves' arrays kept across calls (refbraid.mgrit.workspace)
            from refbraid.mgrit import GradientWorkspace
            kw = {"workspace": GradientWorkspace()}
        t_lp = cpu_median(lambda net=net, p=params, x=x, y=y: layer_parallel_gradient(
            net, p, x, y, settings, bk, **kw), args.repeat)  # noqa: B023 (called here)
        _, _, info = layer_parallel_gradient(net, params, x, y, settings, bk)
        work = int(info.stats()["phi_calls"]) / (2 * N)
        print(f"{N:>5d} {1e3 * t_s:>8.2f} {1e3 * t_lp:>8.2f} {t_lp / t_s:>10.2f} {work:>10.2f} "
              f"{t_lp / t_s / work:>8.2f}")


if __name__ == "__main__":
    main()
