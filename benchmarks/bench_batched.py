"""Batched F-relaxation against the per-step loop and against PyMGRIT, on PyMGRIT's problems.

    python benchmarks/bench_batched.py [--sizes 1024 4096] [--repeat 3] [--nx 101] [--quick]

Problems (refbraid.mgrit.pymgrit_twins): PyMGRIT's Dahlquist (λ = -1, t ∈ [0, 5], backward
Euler) and its Heat1D example (x ∈ [0, 1], ``--nx`` grid points, a = 1, t ∈ [0, 2], backward
Euler, forcing with exact solution sin(πx) cos t). Settings: 3 levels, cfactor 4,
FCF, nested iteration (refbraid ``fmg=True``), PyMGRIT tol 1e-10.

Each row solves one problem three ways:

* PyMGRIT 1.0.6 until its residual < tol: its history ``conv`` (residual after each cycle) and
  its wall time (setup with its nested iteration, plus solve);
* refbraid per step (the problem's ``step`` only) and refbraid batched (``batched_step``: one
  call per sweep), both running exactly PyMGRIT's number of cycles (``max_iter`` = PyMGRIT's
  iterations, tolerances off), so the three do the same cycles; refbraid's history in
  PyMGRIT's convention is ``post_cycle_norms[1:]``.

Columns
    iters        cycles (PyMGRIT's count; refbraid runs the same)
    per-step s   refbraid, per-step path (median wall time of the solve)
    batched s    refbraid, batched path
    PyMGRIT s    PyMGRIT setup + solve (the median of its runs, each timed by CPU time here)
    ÷batched     PyMGRIT time ÷ batched time (the speedup; target ≥ 10)
    ÷per-step    PyMGRIT time ÷ per-step time
    b=p          batched and per-step histories bit-identical
    Δrel         max over iterations of |r_refbraid - r_PyMGRIT| / r_PyMGRIT (batched path)
    max |Δ|      max |r_refbraid - r_PyMGRIT| (states are O(1): round-off is ~1e-15; the
                 relative difference grows as the residual falls towards that floor)

Timings are medians of ``--repeat`` runs after one warm-up (Numba compilation), in CPU
seconds of this process (``time.process_time``); ratios are formed within one run of this
script. Single thread (OMP/OPENBLAS/NUMBA threads = 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np

from refbraid.mgrit import MGRITSettings, solve
from refbraid.mgrit.pymgrit_twins import pymgrit_dahlquist, pymgrit_heat_1d, pymgrit_solve


def median_time(fn, repeat: int):
    """Median CPU seconds of this process over ``repeat`` runs (all three solvers run in this
    one thread, so on an idle machine this is their wall time; on a shared one it leaves out
    the waits for a core)."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.process_time()
        out = fn()
        times.append(time.process_time() - t0)
    return statistics.median(times), out


def row(kind: str, n: int, repeat: int, nx: int, tol: float) -> str:
    heat = {"nx": nx} if kind == "heat" else {}
    t_py, (conv, _) = median_time(lambda: pymgrit_solve(kind, n, 3, 4, tol, **heat), repeat)
    # (pymgrit_solve's own wall-clock seconds are not used: CPU time for all three)
    problem = pymgrit_heat_1d(n, nx=nx) if kind == "heat" else pymgrit_dahlquist(n)
    per_step = dataclasses.replace(problem, batched_step=None)
    s = MGRITSettings(levels=3, cfactor=4, relax="FCF", fmg=True, max_iter=len(conv),
                      abs_tol=None, rel_tol=None, keep_residuals=False)
    solve(problem, s.replace(max_iter=1))  # warm-up: Numba compilation, step caches
    t_b, res_b = median_time(lambda: solve(problem, s), repeat)
    t_p, res_p = median_time(lambda: solve(per_step, s), repeat)
    hist_b, hist_p = res_b.post_cycle_norms[1:], res_p.post_cycle_norms[1:]
    same = "yes" if np.array_equal(hist_b, hist_p) else "no"
    d_rel = float(np.max(np.abs(hist_b - conv) / conv))
    d_abs = float(np.max(np.abs(hist_b - conv)))
    name = f"heat nx={nx}" if kind == "heat" else "Dahlquist"
    return (f"{name:<14} {n:>6} {len(conv):>5} {t_p:>10.3f} {t_b:>10.4f} {t_py:>10.3f} "
            f"{t_py / t_b:>9.1f} {t_py / t_p:>9.2f} {same:>4} {d_rel:>9.1e} {d_abs:>9.1e}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--heat-sizes", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--repeat", type=int, default=3, help="runs per timing (median)")
    ap.add_argument("--nx", type=int, default=101, help="heat: grid points (PyMGRIT's nx)")
    ap.add_argument("--tol", type=float, default=1e-10)
    ap.add_argument("--quick", action="store_true", help="N = 256 only, 1 repeat")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.heat_sizes, args.repeat = [256], [256], 1
    header = (f"{'problem':<14} {'N':>6} {'iters':>5} {'per-step s':>10} {'batched s':>10} "
              f"{'PyMGRIT s':>10} {'÷batched':>9} {'÷per-step':>9} {'b=p':>4} {'Δrel':>9} "
              f"{'max |Δ|':>9}")
    print(f"3 levels, cfactor 4, FCF, nested iteration, PyMGRIT tol {args.tol:g}; "
          f"median of {args.repeat}; load: {os.getloadavg()[0]:.2f}")
    print(header)
    print("-" * len(header))
    pymgrit_solve("dahlquist", 16, 2, 2, args.tol)  # warm-up: MPI start-up of PyMGRIT's comm
    for n in args.sizes:
        print(row("dahlquist", n, args.repeat, args.nx, args.tol), flush=True)
    for n in args.heat_sizes:
        print(row("heat", n, args.repeat, args.nx, args.tol), flush=True)


if __name__ == "__main__":
    main()
