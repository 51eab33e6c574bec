"""Print what one gradient costs a GPU, counted without one: kernel launches, critical path
(the longest chain of dependent launches), host↔device copies and host synchronisations, for
serial backprop, layer-parallel with per-step sweeps and layer-parallel with batched sweeps
(refbraid.backends.launch_count; the model: refbraid.backends.launch_model).

    python benchmarks/count_launches.py                       # cupy, all models, N = 64, 256
    python benchmarks/count_launches.py --backend cuda --sizes 16 --models dense
    python benchmarks/count_launches.py --unfused             # cupy without its fused kernels

``cupy``: the cupy backend's operations on a counting CuPy-like device (NumPy underneath).
``cuda``: Numba's CUDA simulator (slow: one Python thread per CUDA thread; tiny widths keep it
minutes) with the glue on the same counting device. Networks are CI-sized (width 4, batch 4;
counts do not depend on widths), MGRIT at TorchBraid's settings (refbraid's defaults).
Deterministic: the same command prints the same table.
"""

from __future__ import annotations

import argparse
import os
import sys

if any(a.endswith("cuda") for a in sys.argv[1:]):  # before Numba is imported
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

from refbraid.backends import launch_count  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["cupy", "cuda"], default="cupy")
    ap.add_argument("--models", nargs="+", default=list(launch_count.MODELS),
                    choices=launch_count.MODELS)
    ap.add_argument("--sizes", nargs="+", type=int, default=[64, 256])
    ap.add_argument("--unfused", action="store_true",
                    help="cupy: the reference operations instead of the fused kernels")
    args = ap.parse_args(argv)
    from refbraid.backends.cupy_fused import fused

    print(f"backend {args.backend}{' (unfused)' if args.unfused else ''}; one gradient; "
          "TorchBraid's MGRIT settings; counts, not times")
    print("| model | N | gradient | launches | critical path | copies h→d + d→h | syncs | "
          "launches ÷ serial | critical path ÷ serial |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    with fused(not args.unfused):
        for model in args.models:
            for n in args.sizes:
                serial = None
                for mode in launch_count.MODES:
                    t = launch_count.gradient_counts(args.backend, model, n, mode)
                    serial = serial or t
                    print(f"| {model} | {n} | {mode} | {t.launches} | {t.critical_path} | "
                          f"{t.h2d} + {t.d2h} | {t.syncs} | "
                          f"{t.launches / serial.launches:.2f} | "
                          f"{t.critical_path / serial.critical_path:.2f} |", flush=True)


if __name__ == "__main__":
    main()
