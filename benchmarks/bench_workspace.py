"""What kept per-level arrays and F-sweeps into the iterate save, one process, CPU time.

For the MNIST conv network (N = 128, batch 50, numba backend, float32 and float64) and the
dense ResNet (width 32, batch 64, numpy, N = 128 and 512) times the layer-parallel gradient
with TorchBraid's settings in two variants, *alternating call by call* in one process (so
both see the same machine load and allocator history), CPU time (``time.process_time``):

* ``fresh``: no workspace, and steps never handed ``out=`` (every F-step's result a new
  array copied into the iterate: the solver before kept per-level arrays, minus small fixes);
* ``kept``: a :class:`refbraid.mgrit.GradientWorkspace` reused by every call, and ``out=``.

Prints the medians, their ratio, and whether the gradients of both are bit-identical.

    python benchmarks/bench_workspace.py [--repeat 11] [--cases conv32 conv64 dense128 dense512]

``--plain`` times only the gradient as the package computes it without a workspace (no
patching; runs on trees without refbraid.mgrit.workspace too): for main-vs-branch A/B runs
in alternating processes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from functools import partial

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402


def _case(name: str):
    from refbraid import Network, init_params
    from refbraid.layers import Classifier, DenseLift, DenseStep
    from refbraid.training.models import build_network

    if name.startswith("conv"):
        dtype = "float32" if name == "conv32" else "float64"
        net = build_network("conv", (1, 28, 28), 10, 128, 4, 1.0, "relu")
        params = init_params(net, 0, np.dtype(dtype))
        rng = np.random.default_rng(0)
        x = rng.standard_normal((50, 1, 28, 28)).astype(dtype)
        return net, params, x, rng.integers(0, 10, 50), "numba"
    N = int(name.removeprefix("dense"))
    net = Network(DenseLift(2, 32), DenseStep(32, "tanh"), Classifier((32,), 5), N, 3.0)
    rng = np.random.default_rng(0)
    return net, init_params(net, 0), rng.standard_normal((64, 2)), rng.integers(0, 5, 64), \
        "numpy"


def _cpu(fn) -> tuple[float, object]:
    t0 = time.process_time()
    out = fn()
    return time.process_time() - t0, out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=11)
    ap.add_argument("--cases", nargs="+", default=["conv32", "conv64", "dense128", "dense512"])
    ap.add_argument("--plain", action="store_true")
    args = ap.parse_args(argv)
    from refbraid.layer_parallel import LayerParallelSettings, layer_parallel_gradient

    settings = LayerParallelSettings()
    print(f"CPU ms per LP gradient, medians of {args.repeat}; load "
          f"{os.getloadavg()[0]:.2f}")
    if args.plain:
        for name in args.cases:
            net, p, x, y, bk = _case(name)
            grad = partial(layer_parallel_gradient, net, p, x, y, settings, bk)
            grad()  # warm-up (compilation)
            ts = [_cpu(grad)[0] for _ in range(args.repeat)]
            print(f"{name:<10} plain {1e3 * statistics.median(ts):9.2f}", flush=True)
        return
    import refbraid.mgrit.problem as problem_module
    from refbraid.mgrit import GradientWorkspace

    takes_out = problem_module._takes_out
    print(f"{'case':<10} {'fresh':>9} {'kept':>9} {'kept/fresh':>10} {'identical':>9}")
    for name in args.cases:
        net, p, x, y, bk = _case(name)
        grad = partial(layer_parallel_gradient, net, p, x, y, settings, bk)
        ws = GradientWorkspace()
        t = {"fresh": [], "kept": []}
        same = True
        for i in range(args.repeat + 1):
            order = ("fresh", "kept") if i % 2 else ("kept", "fresh")
            got = {}
            for variant in order:
                problem_module._takes_out = takes_out if variant == "kept" else (lambda s: False)
                kw = {"workspace": ws} if variant == "kept" else {}
                dt, (loss, g, _) = _cpu(partial(grad, **kw))
                got[variant] = (loss, g)
                if i:  # call 0 warms up (compilation, first allocations)
                    t[variant].append(dt)
            (la, ga), (lb, gb) = got["fresh"], got["kept"]
            same = same and la == lb and all(np.array_equal(ga[k], gb[k]) for k in ga)
        problem_module._takes_out = takes_out
        f, k = (1e3 * statistics.median(t[v]) for v in ("fresh", "kept"))
        print(f"{name:<10} {f:9.2f} {k:9.2f} {k / f:10.3f} {str(same):>9}", flush=True)


if __name__ == "__main__":
    main()
