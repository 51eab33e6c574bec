"""Suite ``solver``: MGRIT against a sequential solve, and against PyMGRIT on its problems.

    python -m benchmarks full solver [-o rel_tol=1e-10] [-o nx=101]

Case ``mgrit`` (one process; :mod:`refbraid.mgrit.problems`: a scalar Dahlquist problem,
backward Euler; the 1-D heat equation, backward Euler, a dense cached inverse per step size; a
nonlinear ODE, forward Euler), each solved sequentially and with MGRIT V-cycles for several
levels L, cfactors m and relaxations, to ``rel_tol``. Values:

    iters        cycles to converge
    Φ/iter ÷N    step applications per iteration (all levels) per fine step: the serial work
                 of one iteration, in sequential solves
    Φ tot ÷N     all step applications of the solve ÷ N
    t/iter       median wall time of one iteration; ÷ t_seq: over the sequential solve's time
    tot ÷ t_seq  whole MGRIT solve ÷ sequential solve (> 1: serially MGRIT only costs more)
    S(P)         docs/references.md §4 model of the speedup on P ranks, equal cost per step on
                 all levels, no latency: N / (iters · (W/P + C) + init/P), W = Φ per iteration
                 outside the coarsest solve, C = coarsest-level steps per iteration

Case ``pymgrit`` (:mod:`refbraid.mgrit.pymgrit_twins`): PyMGRIT's Dahlquist (λ = −1,
t ∈ [0, 5]) and Heat1D (x ∈ [0, 1], ``nx`` points, a = 1, t ∈ [0, 2]), 3 levels, cfactor 4,
FCF, nested iteration, PyMGRIT tol 1e-10. PyMGRIT 1.0.6 runs to its tolerance; refbraid per
step (``batched_step`` removed) and batched run exactly PyMGRIT's number of cycles. Values:
seconds of each (CPU time of this process, all three in this one thread), PyMGRIT ÷ batched
and ÷ per-step (the speedups), whether the batched and per-step histories are bit-identical,
and the largest relative and absolute difference of refbraid's history from PyMGRIT's.
Without PyMGRIT (``pip install pymgrit``) the case runs refbraid alone to ``abs_tol`` = tol.
"""

from __future__ import annotations

import dataclasses
import statistics

import numpy as np

from benchmarks.harness import Result, measure

OPTIONS = {"rel_tol": 1e-10, "tol": 1e-10, "nx": 101}
CONFIGS = [  # (levels, cfactor, relax)
    (2, 2, "F"), (2, 4, "F"), (2, 8, "F"), (2, 4, "FCF"), (3, 4, "F"), (3, 4, "FCF"),
    (3, 8, "FCF"), (4, 4, "FCF"), (5, 2, "FCF"),
]
P_MODEL = (16, 64)  # ranks of the speedup model (none when P exceeds the coarsest intervals)
#: per size: (N of the mgrit problems, heat n_x), repeats, PyMGRIT's Dahlquist N, heat N
SIZES = {"full": ((1024, 200), 3, (1024, 4096, 16384), (1024, 4096)),
         "quick": ((256, 64), 3, (1024,), (256,)),
         "tiny": ((32, 8), 1, (64,), (32,))}


# ----------------------------------------------------------------------------- mgrit
def problems(n: int, n_x: int) -> dict:
    from refbraid.mgrit.problems import dahlquist, heat_1d, nonlinear_ode

    return {"Dahlquist BE": dahlquist(-1.0, n, T=4.0),
            f"heat 1-D n_x={n_x} BE": heat_1d(n_x=n_x, n_steps=n // 2, T=0.1),
            "nonlinear ODE FE": nonlinear_ode(n, T=n * 0.09 / 64, dim=4)}


def mgrit_case(name, problem, config, t_seq: float, repeat: int, rel_tol: float) -> Result:
    from refbraid.mgrit import MGRITSettings, solve

    levels, cfactor, relax = config
    n = problem.n_steps
    res = Result("solver", f"mgrit {name} N={n} L={levels} m={cfactor} {relax}",
                 {"problem": name, "N": n, "levels": levels, "cfactor": cfactor, "relax": relax})
    s = MGRITSettings(levels=levels, cfactor=cfactor, relax=relax, abs_tol=None,
                      rel_tol=rel_tol, max_iter=100, keep_residuals=False, min_coarse=2)
    try:
        out = solve(problem, s)
    except ValueError as err:  # the grid is too short for this hierarchy
        res.params["skipped"] = str(err)
        return res.add("skipped", "grid too short")
    t_tot = measure(lambda: solve(problem, s), repeat, warmup=0).median()
    recs = out.records
    per_iter_t = statistics.median(r.seconds for r in recs[1:]) if len(recs) > 1 else np.nan
    counts = np.array([r.step_counts for r in recs])
    per_iter_phi = np.diff(counts, axis=0).sum(axis=1)
    phi_iter = float(np.median(per_iter_phi)) if len(per_iter_phi) else np.nan
    coarsest = out.hierarchy.coarsest.n_intervals
    init = counts[0].sum()
    res.add("iters", out.iterations).add("Φ/iter ÷N", phi_iter / n)
    res.add("Φ tot ÷N", out.total_steps / n).add("t/iter", 1e3 * per_iter_t, "ms")
    res.add("t/iter ÷ t_seq", per_iter_t / t_seq).add("tot ÷ t_seq", t_tot / t_seq)
    for p in P_MODEL:
        if p <= coarsest:
            w = phi_iter - coarsest
            res.add(f"S({p})", n / (out.iterations * (w / p + coarsest) + init / p), "×")
    if not out.converged:
        res.add("status", out.status)
    return res


# ----------------------------------------------------------------------------- pymgrit
def pymgrit_case(kind: str, n: int, repeat: int, nx: int, tol: float) -> Result:
    from refbraid.mgrit import MGRITSettings, solve
    from refbraid.mgrit.pymgrit_twins import pymgrit_dahlquist, pymgrit_heat_1d, pymgrit_solve

    heat = {"nx": nx} if kind == "heat" else {}
    name = f"heat nx={nx}" if kind == "heat" else "Dahlquist"
    res = Result("solver", f"pymgrit {name} N={n}", {"problem": kind, "N": n, **heat})
    problem = pymgrit_heat_1d(n, nx=nx) if kind == "heat" else pymgrit_dahlquist(n)
    s = MGRITSettings(levels=3, cfactor=4, relax="FCF", fmg=True, max_iter=100,
                      abs_tol=tol, rel_tol=None, keep_residuals=False)
    conv, t_py = None, None
    try:
        pymgrit_solve("dahlquist", 16, 2, 2, tol)  # warm-up: MPI start-up of PyMGRIT's comm
        timing = measure(lambda: pymgrit_solve(kind, n, 3, 4, tol, **heat), repeat, warmup=0)
        conv, t_py = pymgrit_solve(kind, n, 3, 4, tol, **heat)[0], timing.median("cpu")
        s = s.replace(max_iter=len(conv), abs_tol=None)  # PyMGRIT's cycles, tolerances off
    except ImportError:
        pass
    per_step = dataclasses.replace(problem, batched_step=None)
    solve(problem, s.replace(max_iter=1))  # warm-up: Numba compilation, step caches
    t_b = measure(lambda: solve(problem, s), repeat, warmup=0).median("cpu")
    t_p = measure(lambda: solve(per_step, s), repeat, warmup=0).median("cpu")
    hist_b = solve(problem, s).post_cycle_norms[1:]
    hist_p = solve(per_step, s).post_cycle_norms[1:]
    res.add("iters", len(hist_b)).add("per-step", t_p, "s").add("batched", t_b, "s")
    if conv is not None:
        res.add("PyMGRIT", t_py, "s").add("PyMGRIT ÷ batched", t_py / t_b, "×")
        res.add("PyMGRIT ÷ per-step", t_py / t_p, "×")
    res.add("batched = per-step", bool(np.array_equal(hist_b, hist_p)))
    if conv is not None:
        res.add("Δrel vs PyMGRIT", float(np.max(np.abs(hist_b - conv) / conv)))
        res.add("max |Δ| vs PyMGRIT", float(np.max(np.abs(hist_b - conv))))
    return res


def run(size: str, opts: dict, notes: list[str]) -> list[Result]:
    from refbraid.mgrit import sequential_solve

    (n, n_x), repeat, dahlquist_sizes, heat_sizes = SIZES[size]
    notes.append(f"mgrit: V-cycles to rel_tol {opts['rel_tol']:g}, wall time, median of "
                 f"{repeat}; pymgrit: 3 levels, cfactor 4, FCF, nested iteration, PyMGRIT tol "
                 f"{opts['tol']:g}, CPU time of this process, median of {repeat}")
    out = []
    for name, problem in problems(n, n_x).items():
        t_seq = measure(lambda p=problem: sequential_solve(p), repeat, warmup=1).median()
        out.append(Result("solver", f"sequential {name} N={problem.n_steps}",
                          {"problem": name, "N": problem.n_steps})
                   .add("t_seq", 1e3 * t_seq, "ms")
                   .add("per step", 1e6 * t_seq / problem.n_steps, "µs"))
        out += [mgrit_case(name, problem, c, t_seq, repeat, opts["rel_tol"]) for c in CONFIGS]
    try:
        import pymgrit  # noqa: F401
    except ImportError:
        notes.append("PyMGRIT is not installed (pip install pymgrit): refbraid alone, to tol")
    out += [pymgrit_case("dahlquist", k, repeat, opts["nx"], opts["tol"])
            for k in dahlquist_sizes]
    out += [pymgrit_case("heat", k, repeat, opts["nx"], opts["tol"]) for k in heat_sizes]
    return out
