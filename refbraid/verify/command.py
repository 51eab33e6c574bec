"""``refbraid verify``: run the verification suite, print the table, exit non-zero on a failure."""

from __future__ import annotations

import argparse
import importlib.util
import sys

import numpy as np

from ..backends import BACKENDS
from .result import format_table
from .suite import run_all

DTYPE_CHOICES = {"float64": (np.float64,), "float32": (np.float32,),
                 "both": (np.float64, np.float32)}


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``refbraid verify`` on an argparse sub-parser collection."""
    parser = subparsers.add_parser(
        "verify",
        help="check every layer's adjoint and every backend (dot-product, finite differences)",
        description=(
            "Dot-product tests (complex-step tangent vs the backend's adjoint), central finite "
            "differences (float64), every backend against the NumPy reference and, with "
            "--torch, against PyTorch autograd; for every catalogued layer, the loss and two "
            "small networks. Prints a table; exits 1 when any check fails."),
        epilog=(
            "The cuda backend is listed only when numba.cuda.is_available(): without a GPU, "
            "include it on Numba's CUDA simulator with NUMBA_ENABLE_CUDASIM=1 in the "
            "environment, e.g. `NUMBA_ENABLE_CUDASIM=1 refbraid verify --backend cuda`."),
    )
    parser.add_argument(
        "--backend", action="append", choices=BACKENDS, metavar="NAME",
        help=f"backend to check, one of {', '.join(BACKENDS)}; repeatable "
             "(default: every available backend)")
    parser.add_argument("--dtype", choices=tuple(DTYPE_CHOICES), default="float64",
                        help="precision to check in (default float64; finite differences "
                             "run in float64 only)")
    parser.add_argument("--torch", action="store_true",
                        help="also compare with PyTorch autograd on copied weights (needs torch)")
    parser.add_argument("--layer-parallel", action="store_true",
                        help="instead, print the layer-parallel gradient error against "
                             "sequential backprop as MGRIT cycles grow, for the default "
                             "training network on a Peaks batch")
    parser.set_defaults(func=run)
    return parser


#: What --layer-parallel demands: one level exact, and round-off once MGRIT has converged.
EXACT_TOL, CONVERGED_TOL = 1e-12, 1e-10


def run_layer_parallel(stream=None) -> int:
    """Gradient error table for the default ``refbraid train`` network on one Peaks batch."""
    from ..gradient_error import format_gradient_error_table, gradient_error_study
    from ..training.config import TrainConfig
    from ..training.gradients import layer_parallel_settings
    from ..training.run import setup

    config = TrainConfig(quiet=True)
    net, data, state, bk = setup(config)
    x, y = data.x_train[: config.batch_size], data.y_train[: config.batch_size]
    rows = gradient_error_study(net, state.params, x, y, range(0, 16), bk,
                                default=layer_parallel_settings(config))
    print(f"layer-parallel gradient vs sequential backprop: {config.data} batch of {len(y)}, "
          f"N = {net.n_layers} layers, {config.levels} levels, cfactor {config.cfactor}",
          file=stream)
    print(format_gradient_error_table(rows), file=stream)
    exact, last = rows[0].grad_error, rows[-1].grad_error
    ok = exact <= EXACT_TOL and last <= CONVERGED_TOL
    print(f"{'PASS' if ok else 'FAIL'}: 1 level {exact:.1e} (<= {EXACT_TOL:g}), converged "
          f"{last:.1e} (<= {CONVERGED_TOL:g})", file=stream)
    return 0 if ok else 1


def run(args: argparse.Namespace) -> int:
    """Run the suite the namespace asks for; 0 when every check passes, 1 otherwise."""
    if args.layer_parallel:
        return run_layer_parallel()
    if args.torch and importlib.util.find_spec("torch") is None:
        print("refbraid verify: error: --torch needs PyTorch, which is not installed "
              "(pip install torch; the CPU build is enough).", file=sys.stderr)
        return 2
    results = run_all(args.backend, DTYPE_CHOICES[args.dtype], torch=args.torch)
    print(format_table(results))
    return 0 if all(r.passed for r in results) else 1
