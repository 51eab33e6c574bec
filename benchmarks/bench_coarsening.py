"""Spatial coarsening in MGRIT for a conv ODE-net: convergence, gradient error, step cost and
the predicted speedup over serial on P = 8…1024 virtual ranks.

    python benchmarks/bench_coarsening.py [--repeat 5] [--quick] [--backend numba]
                                          [--skip-convergence]

Network: ConvLift(1→C) → N ConvSteps (tanh, 3×3) → classifier on the digits images brought
to ``--size``² pixels by bilinear interpolation (Tables 2, 3: ``--cost-size``²), random
weights, batch ``--batch``. MGRIT: 3 levels, cfactor 4, FCF relaxation on every level
(required with spatial coarsening), V-cycles.

Table 1 (convergence)  per hierarchy: the forward solve's mean residual reduction per cycle
    (first 3 cycles), cycles to ‖r‖ ≤ 1e-10·‖r_0‖ (forward / adjoint), and the relative
    gradient error against sequential backprop after (fwd, bwd) = (2, 1) cycles (TorchBraid's
    defaults here: nested start + cycles) and after (4, 4).
Table 2 (cost)  median seconds of one ConvStep forward and adjoint at each level's
    resolution on ``--backend`` (default numba: the NumPy reference's einsum convolution has
    size-dependent slow paths that distort the ratios), and their ratio to the fine step,
    measured in the same run.
Table 3 (prediction)  the virtual cluster (refbraid.parallel.virtual, cost-only schedule of the
    real solver) for N_pred layers with the measured per-level costs (a coarse adjoint step
    recomputes its forward: cost fwd + adj), α, β of refbraid.scaling.predict's defaults,
    (2, 1) cycles, messages charged at the fine state size (pessimistic for coarse levels);
    speedup = N_pred · (c_fwd + c_adj) / (forward + adjoint wall time).

The load of the machine is printed with the tables (os.getloadavg).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from refbraid.backends import get_backend
from refbraid.data.digits import load_digits_dataset
from refbraid.layer_parallel import (
    LayerParallelSettings,
    layer_parallel_gradient,
    relative_gradient_error,
)
from refbraid.layers import ConvStep
from refbraid.mgrit import MGRITSettings, spatial
from refbraid.mgrit.transfer import SpatialCoarsening
from refbraid.network import backprop, init_params
from refbraid.parallel.costs import StepCosts
from refbraid.scaling.predict import DEFAULT_ALPHA, DEFAULT_BETA
from refbraid.scaling.schedule import simulate_schedule
from refbraid.training.models import build_network

LEVELS, CFACTOR = 3, 4
HIERARCHIES = {  # name -> SpatialCoarsening or None
    "time only": None,
    "space @1 (avg, linear)": SpatialCoarsening((1,), "average", "linear"),
    "space @1 (avg, constant)": SpatialCoarsening((1,), "average", "constant"),
    "space @1,2 (avg, linear)": SpatialCoarsening((1, 2), "average", "linear"),
    "space @1,2 (fw, linear)": SpatialCoarsening((1, 2), "full_weighting", "linear"),
}


def _settings(max_iter, tol=None, skip=True):
    return MGRITSettings(levels=LEVELS, cfactor=CFACTOR, relax="FCF", cycle="V",
                         max_iter=max_iter, abs_tol=None, rel_tol=tol, skip_first_down=skip,
                         min_coarse=1)


def _case(args):
    ds = load_digits_dataset(n_samples=max(args.batch, 16), seed=0)
    x = ds.x_train[: args.batch]
    factor = args.size // 8
    while factor > 1:
        x, factor = spatial.interpolate(x, "linear", 2), factor // 2
    x = (x - x.mean()) / x.std()
    net = build_network("conv", x.shape[1:], 10, args.layers, args.width, 1.0, "tanh")
    return net, init_params(net, 0), x, ds.y_train[: args.batch]


def convergence_table(args) -> list[str]:
    net, params, x, labels = _case(args)
    _, ref, _ = backprop(net, params, x, labels)
    lines = [f"{'hierarchy':26s} {'fwd factor':>10s} {'cycles f/b':>10s} "
             f"{'grad err (2,1)':>14s} {'grad err (4,4)':>14s}"]
    for name, sc in HIERARCHIES.items():
        s = LayerParallelSettings(_settings(30, 1e-10, False), _settings(30, 1e-10, False),
                                  spatial=sc)
        _, _, info = layer_parallel_gradient(net, params, x, labels, s)
        r = np.asarray(info.forward.norms)
        factor = float(np.mean(r[1:4] / r[:3]))
        errs = []
        for f, b in ((2, 1), (4, 4)):
            s = LayerParallelSettings(_settings(f), _settings(b), spatial=sc)
            _, g, _ = layer_parallel_gradient(net, params, x, labels, s)
            errs.append(relative_gradient_error(g, ref))
        lines.append(f"{name:26s} {factor:10.3f} "
                     f"{info.forward.iterations:>4d} / {info.backward.iterations:<3d} "
                     f"{errs[0]:14.2e} {errs[1]:14.2e}")
    return lines


def _median(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def step_costs(args, bk) -> list[tuple[int, float, float]]:
    """(resolution, forward seconds, adjoint seconds) at size, size/2, size/4."""
    rng = np.random.default_rng(0)
    step = ConvStep(args.width, args.cost_size, args.cost_size, "tanh")
    theta = {k: bk.asarray(v) for k, v in step.init(rng).items()}
    out = []
    for level in range(LEVELS):
        n = args.cost_size >> level
        y = bk.asarray(rng.standard_normal((args.batch, args.width, n, n)))
        _, cache = step.forward(theta, y, 0.1, bk)
        fwd = _median(lambda y=y: step.forward(theta, y, 0.1, bk), args.repeat)
        adj = _median(lambda c=cache, y=y: step.adjoint(theta, c, y, 0.1, bk), args.repeat)
        out.append((n, fwd, adj))
    return out


def cost_table(costs) -> list[str]:
    f0, a0 = costs[0][1], costs[0][2]
    lines = [f"{'level res':>9s} {'fwd [ms]':>9s} {'adj [ms]':>9s} {'fwd ÷ fine':>10s} "
             f"{'adj ÷ fine':>10s}"]
    for n, f, a in costs:
        lines.append(f"{n:>6d}²   {f * 1e3:9.3f} {a * 1e3:9.3f} {f / f0:10.3f} {a / a0:10.3f}")
    return lines


def _level_costs(costs, sc):
    """Per-level (forward, backward) seconds for a hierarchy: level ℓ's resolution halves at
    every coarsened level above it."""
    fwd, bwd, res = [], [], 0
    for ell in range(LEVELS):
        if sc is not None and ell in sc.levels:
            res += 1
        _, f, a = costs[res]
        fwd.append(f)
        bwd.append(a if ell == 0 else f + a)  # coarse adjoint recomputes its forward
    return StepCosts(forward=tuple(fwd), backward=tuple(bwd))


def prediction_table(args, costs) -> list[str]:
    names = ["time only", "space @1 (avg, linear)", "space @1,2 (avg, linear)"]
    serial = args.n_pred * (costs[0][1] + costs[0][2])
    state_bytes = 8 * args.batch * args.width * args.cost_size**2
    ranks = [p for p in (8, 16, 32, 64, 128, 256, 512, 1024)
             if p <= args.n_pred // CFACTOR ** (LEVELS - 1)]
    lines = [f"N = {args.n_pred} layers, serial = {serial:.3f} s; speedup over serial:",
             f"{'P':>6s} " + " ".join(f"{n:>26s}" for n in names)]
    for p in ranks:
        row = []
        for name in names:
            sc = HIERARCHIES[name]
            c = _level_costs(costs, sc)
            f = simulate_schedule(args.n_pred, _settings(2), p, c, DEFAULT_ALPHA, DEFAULT_BETA,
                                  state_bytes, "forward", iterations=2)
            b = simulate_schedule(args.n_pred, _settings(1), p, c, DEFAULT_ALPHA, DEFAULT_BETA,
                                  state_bytes, "backward", iterations=1)
            row.append(serial / (f.wall_time + b.wall_time))
        lines.append(f"{p:>6d} " + " ".join(f"{s:26.2f}" for s in row))
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=21)
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--backend", default="numba", help="kernels timed in Tables 2 and 3 "
                    "(Table 1 is the NumPy reference: convergence does not depend on it)")
    ap.add_argument("--skip-convergence", action="store_true", dest="skip_convergence",
                    help="only Tables 2 and 3")
    ap.add_argument("--size", type=int, default=16, help="image side (8·2^k), Table 1")
    ap.add_argument("--cost-size", type=int, default=32, dest="cost_size",
                    help="image side of Tables 2 and 3 (8·2^k)")
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--n-pred", type=int, default=16384, dest="n_pred")
    args = ap.parse_args(argv)
    if args.quick:
        args.size, args.cost_size, args.width, args.batch, args.layers, args.n_pred, \
            args.repeat = 16, 16, 4, 4, 32, 1024, 2
    bk = get_backend(args.backend)
    print(f"load average {os.getloadavg()[0]:.2f} (1 min); backend {bk.name}; images "
          f"{args.size}², C = {args.width}, batch {args.batch}; {LEVELS} levels, cfactor "
          f"{CFACTOR}, FCF\n")
    if not args.skip_convergence:
        print(f"Table 1: convergence and gradient error, N = {args.layers}")
        print("\n".join(convergence_table(args)))
    costs = step_costs(args, bk)
    print(f"\nTable 2: cost of one step per resolution (median of {args.repeat}), "
          f"{args.cost_size}², batch {args.batch}, C = {args.width}")
    print("\n".join(cost_table(costs)))
    print("\nTable 3: predicted speedup, virtual cluster, (fwd, bwd) = (2, 1) cycles")
    print("\n".join(prediction_table(args, costs)))
    print(f"\nload average {os.getloadavg()[0]:.2f} (1 min) at the end")


if __name__ == "__main__":
    main()
