"""Time one ODE step, forward then adjoint, on the CPU backends (and PyTorch CPU if present).

The unit timed is what MGRIT applies over and over: ``y_next, cache = step.forward(...)``
followed by ``dy, grads = step.adjoint(...)`` for

* the dense step ``y_next = y + h σ(y Wᵀ + b)`` (:class:`refbraid.layers.DenseStep`,
  width C, batch B), and
* the conv step ``y_next = y + h σ(Conv2d(C→C, 3×3, pad 1)(y))``
  (:class:`refbraid.layers.ConvStep`, C channels at H×W, batch B).

PyTorch (``torch.set_num_threads(1)``) runs the same step as a module: ``F.linear`` /
``F.conv2d``, the activation and the Euler update, backward by autograd for (y, W, b).
Before timing, every backend's output and gradients are compared with the NumPy reference
(``check`` column, max-norm relative difference). Times are medians over ``--repeats`` runs
after ``--warmup`` runs; ratios are taken within the same run.

    python benchmarks/bench_layers.py --quick
    python benchmarks/bench_layers.py                      # the full sweep
    python benchmarks/bench_layers.py --dtype float32 --dense-activation gelu
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402  (after the thread settings, which BLAS reads on import)

from refbraid.backends import get_backend  # noqa: E402
from refbraid.layers import ConvStep, DenseStep  # noqa: E402

H_STEP = 0.1  # the Euler step size h (any value; it does not change the cost)

FULL = {
    "dense": [(C, B) for C in (32, 128, 512) for B in (32, 256)],
    "conv": [(C, B) for C in (8, 16, 32) for B in (8, 32)],
}
QUICK = {"dense": [(32, 32), (512, 256)], "conv": [(8, 8), (32, 8)]}


# ----------------------------------------------------------------------------- timing
def median_time(fn, repeats: int, warmup: int) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def rel_diff(a, b) -> float:
    """max |a − b| / max |b| (max-norm relative difference)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


# ----------------------------------------------------------------------------- refbraid steps
def make_case(kind: str, C: int, B: int, activation: str, hw: int, dtype):
    """The layer, its parameters, a state y and an adjoint seed dy_next (all seeded)."""
    rng = np.random.default_rng(0)
    layer = DenseStep(C, activation) if kind == "dense" else ConvStep(C, hw, hw, activation)
    params = layer.init(rng, dtype)
    y = rng.standard_normal((B, *layer.state_shape)).astype(dtype)
    dy_next = rng.standard_normal(y.shape).astype(dtype)
    return layer, params, y, dy_next


def refbraid_step(layer, params, y, dy_next, backend: str):
    """A closure running forward then adjoint on ``backend``; returns (y_next, dy, dW, db)."""
    bk = get_backend(backend)

    def run():
        y_next, cache = layer.forward(params, y, H_STEP, bk)
        dy, grads = layer.adjoint(params, cache, dy_next, H_STEP, bk)
        return y_next, dy, grads["W"], grads["b"]

    return run


# ----------------------------------------------------------------------------- PyTorch
def torch_step(kind: str, activation: str, params, y, dy_next):
    """The same step as a PyTorch computation, backward by autograd; None without torch."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    torch.set_num_threads(1)
    acts = {
        "tanh": torch.tanh,
        "relu": torch.relu,
        "gelu": F.gelu,  # exact erf GELU, as the reference
        "identity": lambda z: z,
    }
    act = acts[activation]
    W0, b0 = torch.from_numpy(params["W"]), torch.from_numpy(params["b"])
    y0, g = torch.from_numpy(y), torch.from_numpy(dy_next)

    def run():
        yt = y0.detach().requires_grad_(True)
        W = W0.detach().requires_grad_(True)
        b = b0.detach().requires_grad_(True)
        if kind == "dense":
            z = F.linear(yt, W, b)
        else:
            z = F.conv2d(yt, W, b, padding=W.shape[-1] // 2)
        y_next = yt + H_STEP * act(z)
        dy, dW, db = torch.autograd.grad(y_next, (yt, W, b), grad_outputs=g)
        return y_next.detach().numpy(), dy.numpy(), dW.numpy(), db.numpy()

    return run


# ----------------------------------------------------------------------------- driver
def bench(args) -> list[dict]:
    dtype = np.dtype(args.dtype)
    sizes = QUICK if args.quick else FULL
    rows = []
    for kind in ("dense", "conv"):
        if kind not in args.layers:
            continue
        activation = args.dense_activation if kind == "dense" else args.conv_activation
        for C, B in sizes[kind]:
            layer, params, y, dy_next = make_case(kind, C, B, activation, args.hw, dtype)
            runs = {name: refbraid_step(layer, params, y, dy_next, name) for name in args.backends}
            torch_run = None if args.no_torch else torch_step(kind, activation, params, y, dy_next)
            if torch_run is not None:
                runs["torch"] = torch_run
            expected = refbraid_step(layer, params, y, dy_next, "numpy")()
            row = {"layer": kind, "act": activation, "C": C, "B": B}
            for name, run in runs.items():
                pairs = zip(run(), expected, strict=True)
                row[f"check_{name}"] = max(rel_diff(g, e) for g, e in pairs)
                row[name] = median_time(run, args.repeats, args.warmup)
            rows.append(row)
            print(format_row(row, list(runs)), flush=True)
    return rows


def header(names: list[str]) -> str:
    cols = "".join(f"{n + ' ms':>11}" for n in names)
    ratios = "".join(f"{r:>13}" for r in ratio_names(names))
    return f"{'layer':<6}{'act':<6}{'C':>5}{'B':>5}{cols}{ratios}{'max check':>11}"


def ratio_names(names: list[str]) -> list[str]:
    out = []
    if "numba" in names and "numpy" in names:
        out.append("numba/numpy")
    if "numba" in names and "torch" in names:
        out.append("numba/torch")
    return out


def format_row(row: dict, names: list[str]) -> str:
    cols = "".join(f"{row[n] * 1e3:11.3f}" for n in names)
    ratios = ""
    for r in ratio_names(names):
        a, b = r.split("/")
        ratios += f"{row[a] / row[b]:13.2f}"
    check = max(row[f"check_{n}"] for n in names)
    return f"{row['layer']:<6}{row['act']:<6}{row['C']:>5}{row['B']:>5}{cols}{ratios}{check:11.1e}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two sizes per layer, 5 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs (20; quick 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs first (default 2)")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--backends", default="numpy,numba", help="comma list of backends")
    parser.add_argument("--layers", default="dense,conv", help="comma list (default dense,conv)")
    parser.add_argument("--dense-activation", default="tanh")
    parser.add_argument("--conv-activation", default="relu")
    parser.add_argument("--hw", type=int, default=28, help="conv image height = width (default 28)")
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch even if installed")
    args = parser.parse_args(argv)
    args.backends = [b for b in args.backends.split(",") if b]
    args.layers = [n for n in args.layers.split(",") if n]
    if args.repeats is None:
        args.repeats = 5 if args.quick else 20
    if args.repeats < 1 or args.warmup < 0:
        parser.error(f"`--repeats` must be ≥ 1 and `--warmup` ≥ 0, got {args.repeats}, "
                     f"{args.warmup}.")
    names = list(args.backends)
    if not args.no_torch:
        try:
            import torch  # noqa: F401

            names.append("torch")
        except ImportError:
            print("(PyTorch not installed: no torch column)")
    threads = {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS")}
    print(f"# forward+adjoint of one step, {args.dtype}, median of {args.repeats} after "
          f"{args.warmup} warm-up; threads {threads}; numpy {np.__version__}, python "
          f"{sys.version.split()[0]}")
    print(header(names))
    bench(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
