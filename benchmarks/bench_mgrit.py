"""MGRIT cost per iteration and step counts against a sequential solve (one process).

    python benchmarks/bench_mgrit.py [--repeat 3] [--quick]

Problems (refbraid.mgrit.problems): a scalar Dahlquist problem (backward Euler), the 1-D heat
equation (backward Euler, a few hundred unknowns, dense cached inverse per step size) and a
nonlinear ODE (forward Euler). Each is solved sequentially and with MGRIT V-cycles for several
levels, cfactors and relaxations, to ``rel_tol`` (default 1e-10).

Columns
    iters        cycles to converge
    Φ/iter ÷N    step applications per iteration (all levels) per fine step of the sequential
                 solve: the serial work of one iteration, in sequential solves
    Φ tot ÷N     all step applications of the solve ÷ N
    t/iter       median wall time of one iteration (relax + residual + coarse correction)
    ÷ t_seq      that time ÷ the median sequential solve time, measured in the same run
    tot ÷ t_seq  whole MGRIT solve ÷ sequential solve (> 1: serially MGRIT only costs more)
    S(P)         docs/references.md §4 model of the speedup on P ranks, equal cost per step on all
                 levels, no latency: N / (iters · (W/P + C) + init), W = Φ per iteration
                 outside the coarsest solve, C = coarsest-level steps per iteration (serial)

Timings are medians of ``--repeat`` runs; ratios are formed within one run of this script.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from refbraid.mgrit import MGRITSettings, sequential_solve, solve  # noqa: E402
from refbraid.mgrit.problems import dahlquist, heat_1d, nonlinear_ode  # noqa: E402

CONFIGS = [  # (levels, cfactor, relax)
    (2, 2, "F"),
    (2, 4, "F"),
    (2, 8, "F"),
    (2, 4, "FCF"),
    (3, 4, "F"),
    (3, 4, "FCF"),
    (3, 8, "FCF"),
    (4, 4, "FCF"),
    (5, 2, "FCF"),
]
P_MODEL = (16, 64)  # ranks for the speedup model ('-' when P exceeds the coarsest intervals)


def problems(quick: bool):
    n = 256 if quick else 1024
    n_x = 64 if quick else 200
    return {
        "scalar (Dahlquist, BE)": dahlquist(-1.0, n, T=4.0),
        f"heat 1-D (n_x={n_x}, BE)": heat_1d(n_x=n_x, n_steps=n // 2, T=0.1),
        "nonlinear ODE (FE)": nonlinear_ode(n, T=n * 0.09 / 64, dim=4),
    }


def median_time(fn, repeat: int):
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def row(name, problem, levels, cfactor, relax, t_seq, repeat, rel_tol):
    n = problem.n_steps
    s = MGRITSettings(levels=levels, cfactor=cfactor, relax=relax, abs_tol=None, rel_tol=rel_tol,
                      max_iter=100, keep_residuals=False, min_coarse=2)
    t_tot, res = median_time(lambda: solve(problem, s), repeat)
    recs = res.records
    per_iter_t = statistics.median(r.seconds for r in recs[1:]) if len(recs) > 1 else float("nan")
    counts = np.array([r.step_counts for r in recs])
    per_iter_phi = np.diff(counts, axis=0).sum(axis=1)
    phi_iter = float(np.median(per_iter_phi)) if len(per_iter_phi) else float("nan")
    n_coarsest = res.hierarchy.coarsest.n_intervals
    init = counts[0].sum()
    w = phi_iter - n_coarsest

    def model(p):
        if p > n_coarsest:
            return f"{'-':>7}"
        return f"{n / (res.iterations * (w / p + n_coarsest) + init / p):>7.2f}"

    return (
        f"{name:<24} {n:>5} {levels:>2} {cfactor:>2} {relax:>4} {res.iterations:>5} "
        f"{phi_iter / n:>10.2f} {res.total_steps / n:>9.1f} {per_iter_t * 1e3:>9.2f} "
        f"{per_iter_t / t_seq:>7.2f} {t_tot / t_seq:>11.1f} "
        + " ".join(model(p) for p in P_MODEL)
        + ("" if res.converged else f"  ({res.status})")
    )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per timing (median)")
    ap.add_argument("--quick", action="store_true", help="smaller problems")
    ap.add_argument("--rel-tol", type=float, default=1e-10)
    args = ap.parse_args(argv)
    header = (
        f"{'problem':<24} {'N':>5} {'L':>2} {'m':>2} {'rlx':>4} {'iters':>5} "
        f"{'Φ/iter ÷N':>10} {'Φ tot ÷N':>9} {'t/iter ms':>9} {'÷ t_seq':>7} {'tot ÷ t_seq':>11} "
        + " ".join(f"{f'S({p})':>7}" for p in P_MODEL)
    )
    print(f"MGRIT vs sequential, rel_tol={args.rel_tol:g}, V-cycles, median of {args.repeat} runs")
    print(header)
    print("-" * len(header))
    for name, problem in problems(args.quick).items():
        t_seq, _ = median_time(lambda p=problem: sequential_solve(p), args.repeat)
        print(f"{name:<24} {problem.n_steps:>5}  sequential: {t_seq * 1e3:.2f} ms "
              f"({t_seq / problem.n_steps * 1e6:.1f} µs per step)")
        for levels, cfactor, relax in CONFIGS:
            try:
                print(row(name, problem, levels, cfactor, relax, t_seq, args.repeat, args.rel_tol))
            except ValueError as err:  # grid too short for this hierarchy
                print(f"{name:<24} {problem.n_steps:>5} {levels:>2} {cfactor:>2} {relax:>4}  "
                      f"skipped: {err}")
        print()


if __name__ == "__main__":
    main()
