"""What tracing costs, and how fast the virtual cluster simulates.

Table 1 — tracing overhead. One layer-parallel gradient (:func:`refbraid.layer_parallel.
layer_parallel_gradient`, TorchBraid settings) of a dense network with ``--layers`` layers
(width 16, batch 32), three ways, interleaved run by run:

* ``no hooks``: ``CountingStep.__call__`` patched back to its body without the trace hook
  (what the code did before tracing existed);
* ``tracing off``: as shipped, no recorder active (one ``ContextVar`` lookup per step);
* ``tracing on``: a :class:`~refbraid.parallel.trace.Recorder` active (one event per step).

Medians over ``--repeats`` runs after ``--warmup``; ratios to ``no hooks`` in the same run.

Table 2 — the virtual cluster in cost-only mode (:mod:`refbraid.scaling`): for N steps and P
ranks, the seconds it takes to simulate the forward MGRIT solve and the whole layer-parallel
gradient (forward + adjoint), and the predicted time in units of one fine step (unit step
costs, coarse adjoint steps 2, α = ``--alpha`` steps, β = ``--beta`` steps per byte, states
of 4 KiB).

    python benchmarks/bench_virtual.py --quick
    python benchmarks/bench_virtual.py                  # up to N = 65536, P = 1024
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402  (after the thread settings, which BLAS reads on import)

from refbraid import Network, init_params  # noqa: E402
from refbraid.layer_parallel import LayerParallelSettings, layer_parallel_gradient  # noqa: E402
from refbraid.layers import Classifier, DenseLift, DenseStep  # noqa: E402
from refbraid.mgrit.problem import CountingStep  # noqa: E402
from refbraid.parallel.trace import Recorder, recording  # noqa: E402
from refbraid.parallel.virtual import StepCosts  # noqa: E402
from refbraid.scaling import simulate_gradient_schedule, simulate_schedule  # noqa: E402

STATE_BYTES = 4096


def _call_without_hook(self, u, s_start, s_stop):
    """``CountingStep.__call__`` as it was before the trace hook (for the baseline)."""
    p = self.problem
    start, stop = p.to_fine(int(s_start)), p.to_fine(int(s_stop))
    t0 = time.perf_counter()
    out = p.step(u, start, stop)
    self.seconds += time.perf_counter() - t0
    self.count += 1
    shape = getattr(out, "shape", None)
    if shape is None or tuple(shape) != self._shape:
        raise ValueError("`step` returned the wrong shape.")
    return out


def tracing_overhead(layers: int, repeats: int, warmup: int) -> None:
    net = Network(DenseLift(4, 16), DenseStep(16, "tanh"), Classifier((16,), 10), layers, 2.0)
    params = init_params(net, 0)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 4)), rng.integers(0, 10, 32)
    settings = LayerParallelSettings()
    shipped = CountingStep.__call__

    def no_hooks():
        CountingStep.__call__ = _call_without_hook
        try:
            layer_parallel_gradient(net, params, x, y, settings)
        finally:
            CountingStep.__call__ = shipped

    def off():
        layer_parallel_gradient(net, params, x, y, settings)

    def on():
        with recording(Recorder()):
            layer_parallel_gradient(net, params, x, y, settings)

    variants = {"no hooks": no_hooks, "tracing off": off, "tracing on": on}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for i in range(warmup + repeats):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["no hooks"])
    print(f"\nTracing overhead: layer-parallel gradient, {layers} layers, median of {repeats}")
    print(f"{'variant':<12} {'ms':>8} {'ratio':>7}")
    for name in variants:
        med = statistics.median(times[name])
        print(f"{name:<12} {med * 1e3:8.3f} {med / base:7.3f}")


def virtual_speed(cases: list[tuple[int, int]], alpha: float, beta: float) -> None:
    costs = StepCosts(forward=1.0, backward=(1.0, 2.0))
    settings = LayerParallelSettings()
    print(f"\nVirtual cluster, cost-only (unit step costs, alpha={alpha:g}, beta={beta:g}, "
          f"states {STATE_BYTES} B)")
    print(f"{'N':>6} {'P':>5} {'fwd sim s':>9} {'fwd time':>9} {'grad sim s':>10} "
          f"{'grad time':>10} {'events':>8} {'coarsest share':>14}")
    for n, p in cases:
        t0 = time.perf_counter()
        fwd = simulate_schedule(n, settings.forward, p, costs, alpha, beta, STATE_BYTES)
        t1 = time.perf_counter()
        grad = simulate_gradient_schedule(n, STATE_BYTES, p, settings, costs, alpha, beta)
        t2 = time.perf_counter()
        parts = grad.breakdown()
        coarsest = sum(v for k, v in parts.items() if k.startswith("step L2")) / grad.wall_time
        print(f"{n:>6} {p:>5} {t1 - t0:9.2f} {fwd.wall_time:9.0f} {t2 - t1:10.2f} "
              f"{grad.wall_time:10.0f} {len(grad.trace):>8} {coarsest:14.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--beta", type=float, default=1e-4)
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.warmup = 20, 3
        cases = [(4096, 16), (4096, 64)]
    else:
        cases = [(65536, 1), (65536, 16), (65536, 64), (65536, 256), (65536, 1024)]
    tracing_overhead(args.layers, args.repeats, args.warmup)
    virtual_speed(cases, args.alpha, args.beta)


if __name__ == "__main__":
    main()
