"""MGRIT settings whose ideal 2-rank step beats serial, by the virtual cluster.

    python benchmarks/bench_fast_settings.py [--layers 128] [--ranks 2] [--dtypes float64 float32]
        [--no-error]

For TorchBraid's MNIST conv network (batch 50, numba) this measures the unit costs of one step
here — c_f (forward), c_bg (fine adjoint with its weight gradient), c_bc (coarse adjoint:
forward recomputed + transposed step), as ``bench_mpi.py`` does — and replays the
layer-parallel gradient of each candidate setting on the cost-only virtual cluster
(:func:`refbraid.scaling.virtual_step.simulate_gradient_schedule`, α = β = 0: no messages, no
bookkeeping). It prints the ideal critical path of P ranks against serial backprop's step work
N·(c_f + c_bg), and (float64, one process) the relative gradient error against backprop at the
initial weights (``--no-error`` skips it). The named settings are ``bench_mpi.named_settings``;
the rest is a grid over levels, cfactor, forward / adjoint iterations and coarse relaxation.
Whether a candidate still *trains* is checked with ``refbraid train`` (docs/scaling_overhead.md
§6 has the runs).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_mpi's helpers


def candidates() -> dict:
    """{label: LayerParallelSettings}: the named settings, then the grid."""
    from bench_mpi import SETTINGS, named_settings

    from refbraid.layer_parallel import LayerParallelSettings
    from refbraid.mgrit import MGRITSettings

    out = {name: named_settings(name) for name in SETTINGS}
    for levels, cf, fwd, bwd, coarse in itertools.product((2, 3), (4, 8, 16), (0, 1), (0, 1),
                                                          ("FCF", "F")):
        if levels == 2 and coarse == "F":
            continue  # 2 levels: only the fine level relaxes
        relax = tuple("F" if lv == 0 else coarse for lv in range(levels - 1))

        def mg(it, levels=levels, cf=cf, relax=relax):
            return MGRITSettings.torchbraid(levels=levels, cfactor=cf, max_iter=it, relax=relax)

        label = f"{levels}L cf{cf} it {fwd + 1}/{bwd + 1} {'/'.join(relax)}"
        out[label] = LayerParallelSettings(forward=mg(fwd), backward=mg(bwd))
    return out


def main(argv=None) -> int:
    from bench_mpi import _unit_costs

    from refbraid.backends import get_backend
    from refbraid.layer_parallel import layer_parallel_gradient
    from refbraid.network import backprop, init_params
    from refbraid.parallel.costs import StepCosts
    from refbraid.relative_error import relative_gradient_error
    from refbraid.runtime import pin_allocator
    from refbraid.scaling.virtual_step import simulate_gradient_schedule
    from refbraid.training.models import build_network

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=128)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--dtypes", nargs="+", default=["float64", "float32"],
                    choices=("float64", "float32"))
    ap.add_argument("--no-error", action="store_true", help="skip the gradient errors")
    ap.add_argument("--top", type=int, default=12, help="grid rows shown (best first)")
    args = ap.parse_args(argv)
    pin_allocator()
    bk = get_backend("numba")
    N, P = args.layers, args.ranks
    net = build_network("conv", (1, 28, 28), 10, N, 4, 1.0, "relu")
    rng = np.random.default_rng(0)
    x64, y = rng.standard_normal((50, 1, 28, 28)), rng.integers(0, 10, 50)
    cands = candidates()
    errors = {}
    if not args.no_error:
        params = init_params(net, 0, np.dtype("float64"))
        _, exact, _ = backprop(net, params, x64, y, bk)
        for label, st in cands.items():
            try:
                _, g, _ = layer_parallel_gradient(net, params, x64, y, st, bk)
            except ValueError:
                continue
            errors[label] = relative_gradient_error(g, exact)
    print(f"MNIST conv network, N = {N}, batch 50, numba; ideal critical path of P = {P} ranks "
          f"(virtual cluster, unit step costs, α = β = 0) ÷ serial step work N·(c_f + c_bg); "
          f"load {os.getloadavg()[0]:.2f}")
    for dtype in args.dtypes:
        params = init_params(net, 0, np.dtype(dtype))
        u = _unit_costs(net, params, x64.astype(dtype), bk)
        costs = StepCosts(forward=u["c_f"], backward=(u["c_bg"], u["c_bc"]))
        serial = N * (u["c_f"] + u["c_bg"])
        state_bytes = 50 * int(np.prod(net.step.state_shape)) * np.dtype(dtype).itemsize
        rows = []
        for label, st in cands.items():
            try:
                ideal = simulate_gradient_schedule(N, state_bytes, P, st, costs).wall_time
                one = simulate_gradient_schedule(N, state_bytes, 1, st, costs).wall_time
            except ValueError:  # too many levels or ranks for N: not a candidate here
                continue
            rows.append((label, ideal / serial, one / serial))
        named = [r for r in rows if " " not in r[0]]
        grid = sorted((r for r in rows if " " in r[0]), key=lambda r: r[1])[: args.top]
        print(f"\n{dtype}: c_f {1e6 * u['c_f']:.0f} µs, c_bg {1e6 * u['c_bg']:.0f} µs, c_bc "
              f"{1e6 * u['c_bc']:.0f} µs; serial step work {1e3 * serial:.1f} ms")
        print(f"{'settings':<30} {f'P={P} ideal ÷ serial':>20} {'P=1 ÷ serial':>13} "
              f"{'grad error (f64, init)':>23}")
        for label, ratio, one in named + grid:
            err = f"{errors[label]:.2e}" if label in errors else "-"
            print(f"{label:<30} {ratio:>20.3f} {one:>13.3f} {err:>23}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
