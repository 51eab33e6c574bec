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
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the suite the namespace asks for; 0 when every check passes, 1 otherwise."""
    if args.torch and importlib.util.find_spec("torch") is None:
        print("refbraid verify: error: --torch needs PyTorch, which is not installed "
              "(pip install torch; the CPU build is enough).", file=sys.stderr)
        return 2
    results = run_all(args.backend, DTYPE_CHOICES[args.dtype], torch=args.torch)
    print(format_table(results))
    return 0 if all(r.passed for r in results) else 1
