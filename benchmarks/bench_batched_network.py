"""Is a batched dense ODE step worth it? k network steps in one call against k calls.

    python benchmarks/bench_batched_network.py [--backend numpy|numba] [--width 32]
        [--batch 64] [--repeat 7]

The layer-parallel gradient applies the dense ResNet step ``y_next = y + h σ(y Wᵀ + b)`` (and
its adjoint ``dy = dy_next + (h σ'(z) ⊙ dy_next) W``) to the k intervals of an F-sweep. This
times, per step application, on the chosen backend:

* per-step   k calls of ``DenseStep.forward`` / ``.adjoint`` (what MGRIT's relaxation does
             without batched steps, with the layer's argument checks);
* batched    one call of ``DenseStep.forward_batched`` / ``.adjoint_batched`` on stacked
             states Y (k, B, C), per-interval weights W (k, C, C) and biases (k, C):
             ``np.matmul`` (a loop of GEMMs inside NumPy) and the element-wise update on the
             whole stack (fused Numba kernels on the numba backend,
             :mod:`refbraid.backends.numba_cpu_batched`);
* numpy b.   (numba only) the NumPy backend's batched call, for comparison (and, in the
             solve table, the NumPy backend's batched solve and its time over numba's).

It prints µs per step application, the speedup and the largest difference between per-step
and batched (0: bit-identical). A second table times the whole MGRIT forward solve of a dense
network and its adjoint solve (N = 512, TorchBraid's settings) with the layer-parallel
propagators, with their batched steps (what the gradient runs) and with ``batched_step``
removed, for the batch sizes of ``--batches``. CPU seconds of this process
(``time.process_time``), medians of ``--repeat``. The adoption decision: docs/batched.md.

``--conv`` times instead the whole layer-parallel gradient of TorchBraid's MNIST conv network
(``--model conv``: ConvLift(1→4) + ReLU, N ConvSteps 3×3 on 28×28, batch 50, TorchBraid's
settings) with batched conv steps (``ConvStep.forward_batched`` / ``adjoint_batched``, NumPy
reference; ``ConvStep.batched_sweeps_pay`` is False, so these rows patch it on) against
per-step calls (``batchable`` patched off), in float64 and float32, and beside them the
per-step gradient on the Numba backend (which has no batched conv step):

    python benchmarks/bench_batched_network.py --conv [--conv-layers 32 128] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np
from cpu_timing import median_time

from refbraid import Network, get_backend, init_params
from refbraid.layer_parallel import LayerParallelSettings, adjoint_problem, forward_problem
from refbraid.layers import Classifier, DenseLift, DenseStep
from refbraid.mgrit import sequential_solve, solve
from refbraid.network import group


def row(k: int, C: int, B: int, h: float, repeat: int, rng, backend: str) -> str:
    """One table row: k intervals, per-step loop against one batched call (the adjoint
    without weight gradients, as MGRIT's coarse and relaxation sweeps call it)."""
    bk, ref = get_backend(backend), get_backend("numpy")
    layer = DenseStep(C, "tanh")
    stacked = {"W": rng.uniform(-0.2, 0.2, (k, C, C)), "b": rng.uniform(-0.2, 0.2, (k, C))}
    Y = rng.standard_normal((k, B, C))
    dY = rng.standard_normal((k, B, C))
    hs = np.full(k, h)
    params = [{n: v[j] for n, v in stacked.items()} for j in range(k)]

    def fwd_loop():
        return [layer.forward(params[j], Y[j], h, bk) for j in range(k)]

    caches = [c for _, c in fwd_loop()]

    def adj_loop():
        return [layer.adjoint(params[j], caches[j], dY[j], h, bk, grads=False)[0]
                for j in range(k)]

    def fwd_batched(backend=bk):
        return layer.forward_batched(stacked, Y, hs, backend)

    Y_next, Z = fwd_batched()

    def adj_batched(backend=bk):
        return layer.adjoint_batched(stacked, Y, Z, dY, hs, backend, grads=False)[0]

    t_fl = median_time(fwd_loop, repeat)
    t_fb = median_time(fwd_batched, repeat)
    t_al = median_time(adj_loop, repeat)
    t_ab = median_time(adj_batched, repeat)
    d_f = np.max(np.abs(np.stack([y for y, _ in fwd_loop()]) - Y_next))
    d_a = np.max(np.abs(np.stack(adj_loop()) - adj_batched()))
    us = 1e6 / k
    line = (f"{k:>5} {t_fl * us:>12.2f} {t_fb * us:>11.2f} {t_fl / t_fb:>7.2f} {d_f:>9.1e}")
    if bk is not ref:
        line += f" {median_time(lambda: fwd_batched(ref), repeat) * us:>9.2f}"
    line += f"   {t_al * us:>12.2f} {t_ab * us:>11.2f} {t_al / t_ab:>7.2f} {d_a:>9.1e}"
    if bk is not ref:
        line += f" {median_time(lambda: adj_batched(ref), repeat) * us:>9.2f}"
    return line


def solve_rows(n_layers: int, C: int, B: int, repeat: int, backend: str) -> list[str]:
    """MGRIT forward and adjoint solves of a dense network with the propagators of
    refbraid.layer_parallel: their batched steps (as the gradient runs them) against the same
    problems with ``batched_step`` removed (one call per interval)."""
    import dataclasses

    bk = get_backend(backend)
    net = Network(DenseLift(2, C), DenseStep(C, "tanh"), Classifier((C,), 5), n_layers, 3.0)
    params = init_params(net, 0)
    steps = group(params, "steps")
    rng = np.random.default_rng(1)
    y0, _ = net.opening.forward(group(params, "opening"), rng.standard_normal((B, 2)), bk)
    fwd = forward_problem(net, steps, y0, bk)
    states = sequential_solve(fwd)  # (N + 1, B, C), fine order
    lam_N = rng.standard_normal((B, C))
    adj = adjoint_problem(net, steps, states, lam_N, bk)
    ref = get_backend("numpy")  # the same problems on the NumPy backend (numba: a column)
    ref_fwd = forward_problem(net, steps, y0, ref)
    ref_adj = adjoint_problem(net, steps, states, lam_N, ref)
    rows = []
    for name, batched, numpy_batched, settings in (
            ("forward", fwd, ref_fwd, LayerParallelSettings().forward),
            ("adjoint", adj, ref_adj, LayerParallelSettings().backward)):
        assert batched.batched_step is not None
        per_step = dataclasses.replace(batched, batched_step=None)
        t_p = median_time(lambda p=per_step, s=settings: solve(p, s), repeat)
        t_b = median_time(lambda p=batched, s=settings: solve(p, s), repeat)
        d = np.max(np.abs(solve(per_step, settings).solution - solve(batched, settings).solution))
        line = (f"{name:<8} {n_layers:>5} {B:>6} {1e3 * t_p:>12.2f} {1e3 * t_b:>11.2f} "
                f"{t_p / t_b:>7.2f} {d:>9.1e}")
        if bk is not ref:
            t_n = median_time(lambda p=numpy_batched, s=settings: solve(p, s), repeat)
            line += f" {1e3 * t_n:>11.2f} {t_n / t_b:>9.2f}"
        rows.append(line)
    return rows


def conv_rows(layers: list[int], repeat: int) -> None:
    """The conv network's layer-parallel gradient: NumPy batched vs per-step, and Numba."""
    from unittest import mock

    import refbraid.layer_parallel as lp
    from refbraid.layers import ConvStep
    from refbraid.training.models import build_network

    print(f"TorchBraid's MNIST conv network (4 channels, 28×28, batch 50), layer-parallel "
          f"gradient, TorchBraid's settings; CPU ms per gradient, median of {repeat}; load "
          f"{os.getloadavg()[0]:.2f}")
    head = (f"{'N':>5} {'dtype':>8} {'numpy per-step':>15} {'numpy batched':>14} {'speedup':>7} "
            f"{'max |Δ|':>8} {'numba per-step':>15}")
    print(head)
    print("-" * len(head))
    rng = np.random.default_rng(0)
    for N in layers:
        net = build_network("conv", (1, 28, 28), 10, N, 4, 1.0, "relu")
        for dtype in (np.float64, np.float32):
            params = {k: v.astype(dtype) for k, v in init_params(net, 0).items()}
            x = rng.standard_normal((50, 1, 28, 28)).astype(dtype)
            y = rng.integers(0, 10, 50)

            def grad(bk, p=params, x=x, y=y, net=net):
                return lp.layer_parallel_gradient(net, p, x, y, LayerParallelSettings(), bk)

            with mock.patch.object(ConvStep, "batched_sweeps_pay", True):  # off by default
                t_b = median_time(lambda g=grad: g(get_backend("numpy")), repeat)
                g_b = grad(get_backend("numpy"))[1]
            with mock.patch.object(lp, "batchable", lambda net, bk: False):
                t_p = median_time(lambda g=grad: g(get_backend("numpy")), repeat)
                g_p = grad(get_backend("numpy"))[1]
            t_n = median_time(lambda g=grad: g(get_backend("numba")), repeat)
            d = max(float(np.max(np.abs(g_b[k] - g_p[k]))) for k in g_p)
            print(f"{N:>5} {np.dtype(dtype).name:>8} {1e3 * t_p:>15.1f} {1e3 * t_b:>14.1f} "
                  f"{t_p / t_b:>7.2f} {d:>8.1e} {1e3 * t_n:>15.1f}", flush=True)
    print("max |Δ| = 0: batched and per-step gradients are bit-identical.")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--k", type=int, nargs="+", default=[8, 32, 128, 512])
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--layers", type=int, default=512)
    ap.add_argument("--conv", action="store_true",
                    help="time the MNIST conv network's gradient instead (module docstring)")
    ap.add_argument("--conv-layers", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--backend", choices=("numpy", "numba"), default="numpy")
    args = ap.parse_args(argv)
    if args.conv:
        return conv_rows(args.conv_layers, args.repeat)
    rng = np.random.default_rng(0)
    print(f"dense ODE step, width {args.width}, batch {args.batch}, tanh, float64, backend "
          f"{args.backend}; CPU µs per step application, median of {args.repeat}; load "
          f"{os.getloadavg()[0]:.2f}")
    extra = f" {'numpy b.':>9}" if args.backend != "numpy" else ""
    head = (f"{'k':>5} {'fwd per-step':>12} {'fwd batched':>11} {'speedup':>7} {'max |Δ|':>9}"
            f"{extra}   {'adj per-step':>12} {'adj batched':>11} {'speedup':>7} {'max |Δ|':>9}"
            f"{extra}")
    print(head)
    print("-" * len(head))
    for k in args.k:
        print(row(k, args.width, args.batch, 0.01, args.repeat, rng, args.backend), flush=True)
    print(f"\nMGRIT solves of the dense network (TorchBraid's settings), backend "
          f"{args.backend}, CPU ms")
    head = (f"{'solve':<8} {'N':>5} {'batch':>6} {'per-step ms':>12} {'batched ms':>11} "
            f"{'speedup':>7} {'max |Δ|':>9}")
    if args.backend != "numpy":
        head += f" {'numpy b. ms':>11} {'vs numpy':>9}"
    print(head)
    print("-" * len(head))
    for B in args.batches:
        for line in solve_rows(args.layers, args.width, B, args.repeat, args.backend):
            print(line, flush=True)


if __name__ == "__main__":
    main()
