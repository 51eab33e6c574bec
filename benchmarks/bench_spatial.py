"""Time the 3-D conv, batch-norm and transition layers, forward then adjoint, on the CPU
backends and PyTorch CPU (if present), and the cost of a step on a 2× coarser grid.

The unit timed is forward then adjoint (what an MGRIT sweep or sequential backprop applies):

* ``conv3d``   the step y + h·relu(Conv3d(C→C, 3×3×3)(y)) (refbraid.layers.Conv3dStep), n³;
* ``bn2d``/``bn3d``  the step y + h·relu(BN(Conv(C→C, 3^s, no bias)(y))) in training mode
  (refbraid.layers.ConvBNStep), n² or n³;
* ``maxpool``/``avgpool`` 2×2×2 pooling, ``strided`` the stride-2 conv C→2C, ``batchnorm`` the
  standalone BN transition, all on n³ volumes.

PyTorch (``torch.set_num_threads(1)``) runs the same computation with ``F.conv3d``/``conv2d``,
``F.batch_norm(training=True)``, ``F.max_pool3d`` etc., backward by autograd. Every backend's
output is first compared with the NumPy reference (``check``: max relative difference).
``coarse/fine`` is the numba time of the same layer on an n/2 grid over its time on the n grid
(what a spatially coarsened MGRIT level costs per step; ideally 1/4 in 2-D, 1/8 in 3-D).
Times are medians over ``--repeats`` runs after one warm-up; ratios within one run.

    python benchmarks/bench_spatial.py --quick
    python benchmarks/bench_spatial.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from refbraid.backends import get_backend  # noqa: E402
from refbraid.layers import BatchNorm, Conv3dStep, ConvBNStep, Pool, StridedConv  # noqa: E402

H_STEP = 0.1
#: (kind, C, B, n): channels, batch, grid edge
FULL = [("conv3d", 4, 4, 16), ("conv3d", 8, 8, 16), ("conv3d", 8, 4, 32),
        ("bn2d", 8, 8, 28), ("bn2d", 16, 32, 28), ("bn3d", 8, 8, 16),
        ("batchnorm", 8, 8, 16), ("maxpool", 8, 8, 16), ("avgpool", 8, 8, 16),
        ("strided", 8, 8, 16)]
QUICK = [("conv3d", 4, 4, 16), ("bn2d", 8, 8, 28), ("bn3d", 4, 4, 16), ("maxpool", 8, 8, 16),
         ("strided", 4, 4, 16)]


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up (and Numba compilation)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def make_layer(kind: str, C: int, n: int):
    """(layer, is_step) for one row of the table."""
    if kind == "conv3d":
        return Conv3dStep(C, n, n, n), True
    if kind in ("bn2d", "bn3d"):
        return ConvBNStep(C, (n,) * (2 if kind == "bn2d" else 3)), True
    if kind == "batchnorm":
        return BatchNorm(C, (n, n, n)), False
    if kind in ("maxpool", "avgpool"):
        return Pool(C, (n, n, n), kind[:3]), False
    if kind == "strided":
        return StridedConv(C, 2 * C, (n, n, n)), False
    raise ValueError(f"`kind` must be one of the table's kinds, got {kind!r}.")


def refbraid_run(layer, is_step: bool, params, x, dout, bk):
    """forward then adjoint; returns (out, first adjoint output) on the host."""
    p = {k: bk.asarray(v) for k, v in params.items()}
    if is_step:
        out, cache = layer.forward(p, bk.asarray(x), H_STEP, bk)
        dx, _ = layer.adjoint(p, cache, bk.asarray(dout), H_STEP, bk)
    else:
        out, cache = layer.forward(p, bk.asarray(x), bk)
        dx, _ = layer.adjoint(p, cache, bk.asarray(dout), bk)
    return bk.to_numpy(out), bk.to_numpy(dx)


def torch_run(kind: str, params, x, dout):
    """The same forward then backward with torch's functional ops."""
    import torch
    import torch.nn.functional as F

    t = {k: torch.from_numpy(v).requires_grad_() for k, v in params.items()}
    xt = torch.from_numpy(x).requires_grad_()
    conv = F.conv2d if x.ndim == 4 else F.conv3d
    if kind == "conv3d":
        out = xt + H_STEP * torch.relu(conv(xt, t["W"], t["b"], padding=1))
    elif kind in ("bn2d", "bn3d"):
        z = F.batch_norm(conv(xt, t["W"], None, padding=1), None, None, t["gamma"],
                         t["beta"], training=True)
        out = xt + H_STEP * torch.relu(z)
    elif kind == "batchnorm":
        out = F.batch_norm(xt, None, None, t["gamma"], t["beta"], training=True)
    elif kind == "maxpool":
        out = F.max_pool3d(xt, 2)
    elif kind == "avgpool":
        out = F.avg_pool3d(xt, 2)
    else:  # strided
        out = torch.relu(conv(xt, t["W"], t["b"], stride=2, padding=1))
    out.backward(torch.from_numpy(dout))
    return out.detach().numpy(), xt.grad.numpy()


def rel(a, b) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def bench_row(kind, C, B, n, repeats, backends, with_torch):
    """Times (ms) per backend, the check against numpy, and numba's coarse/fine ratio."""
    rng = np.random.default_rng(0)
    layer, is_step = make_layer(kind, C, n)
    params = layer.init(rng)
    in_shape = layer.state_shape if is_step else layer.in_shape
    out_shape = in_shape if is_step else layer.out_shape
    x = rng.standard_normal((B, *in_shape))
    dout = rng.standard_normal((B, *out_shape))
    ref = refbraid_run(layer, is_step, params, x, dout, get_backend("numpy"))
    times, checks = {}, {}
    for name in backends:
        bk = get_backend(name)
        got = refbraid_run(layer, is_step, params, x, dout, bk)
        checks[name] = max(rel(g, r) for g, r in zip(got, ref, strict=True))
        times[name] = median_time(lambda bk=bk: refbraid_run(layer, is_step, params, x, dout,
                                                             bk), repeats)
    if with_torch:
        got = torch_run(kind, params, x, dout)
        checks["torch"] = max(rel(g, r) for g, r in zip(got, ref, strict=True))
        times["torch"] = median_time(lambda: torch_run(kind, params, x, dout), repeats)
    coarse, c_step = make_layer(kind, C, n // 2)
    cp = coarse.init(rng)
    cin = coarse.state_shape if c_step else coarse.in_shape
    cout = cin if c_step else coarse.out_shape
    xc, dc = rng.standard_normal((B, *cin)), rng.standard_normal((B, *cout))
    bk = get_backend("numba")
    t_coarse = median_time(lambda: refbraid_run(coarse, c_step, cp, xc, dc, bk), repeats)
    return times, checks, t_coarse / median_time(
        lambda: refbraid_run(layer, is_step, params, x, dout, bk), repeats)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few small sizes")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per cell (median)")
    args = parser.parse_args(argv)
    try:
        import torch

        torch.set_num_threads(1)
        with_torch = True
    except ImportError:
        with_torch = False
    backends = ("numpy", "numba")
    cols = [*backends, *(("torch",) if with_torch else ())]
    print(f"forward + adjoint, float64, one thread; ms (median of {args.repeats}); "
          f"load: {os.getloadavg()[0]:.2f}")
    header = (f"{'layer':<10} {'C':>3} {'B':>3} {'n':>3}  "
              + "  ".join(f"{c:>9}" for c in cols)
              + f"  {'numba/torch':>11}  {'coarse/fine':>11}  {'check':>8}")
    print(header)
    print("-" * len(header))
    for kind, C, B, n in (QUICK if args.quick else FULL):
        times, checks, ratio = bench_row(kind, C, B, n, args.repeats, backends, with_torch)
        vs = f"{times['numba'] / times['torch']:.2f}" if with_torch else "-"
        print(f"{kind:<10} {C:>3} {B:>3} {n:>3}  "
              + "  ".join(f"{times[c] * 1e3:>9.2f}" for c in cols)
              + f"  {vs:>11}  {ratio:>11.3f}  {max(checks.values()):>8.1e}")


if __name__ == "__main__":
    main()
