"""MGRIT solves against the sequential solve (the oracle), and what the record says.

Test problems (refbraid.mgrit.problems): a time-dependent linear system with forcing and a
nonlinear ODE, both forward Euler, with the time step chosen so the coarsest step stays
stable (coarsest step 0.2 and 0.1): MGRIT then converges to round-off in a few iterations.
"""

import math

import numpy as np
import pytest

from refbraid.mgrit import (
    MGRITDiverged,
    MGRITSettings,
    Problem,
    build_hierarchy,
    sequential_solve,
    solve,
)
from refbraid.mgrit.problems import LinearODE, dahlquist, nonlinear_ode

# (levels, cfactor, N): 2..5 levels, cfactors 2..8 (one mixed per level), N mostly uneven
CASES = [
    (2, 2, 33),
    (2, 8, 70),
    (3, 3, 58),
    (3, 4, 101),
    (3, 6, 110),
    (3, 7, 150),
    (4, 2, 45),
    (4, (2, 4, 3), 75),
    (5, 2, 71),
    (5, 3, 170),
]


def _problems(levels, cfactor, n):
    coarsest = math.prod(cfactor) if isinstance(cfactor, tuple) else cfactor ** (levels - 1)
    ode = LinearODE(n, dim=3, T=n * 0.2 / coarsest)
    g = 0.1 * np.random.default_rng(0).standard_normal((n + 1, 3))
    return {
        "linear": ode.forward_problem(np.ones(3), g=g),
        "nonlinear": nonlinear_ode(n, T=n * 0.1 / coarsest, dim=3),
    }


@pytest.mark.parametrize("levels, cfactor, n", CASES)
def test_converged_mgrit_equals_the_sequential_solve(levels, cfactor, n):
    for name, problem in _problems(levels, cfactor, n).items():
        seq = sequential_solve(problem)
        scale = np.abs(seq).max()
        for relax in ("F", "FCF"):
            for cycle in ("V", "F"):
                s = MGRITSettings(levels=levels, cfactor=cfactor, relax=relax, cycle=cycle,
                                  abs_tol=1e-13, max_iter=40)
                res = solve(problem, s)
                err = np.abs(res.solution - seq).max() / scale
                where = f"{name}, levels={levels}, cfactor={cfactor}, N={n}, {relax}, {cycle}-cycle"
                assert res.converged, where
                assert err <= 1e-12, f"{where}: relative error {err:.2e}"


@pytest.mark.parametrize("n, m", [(24, 2), (24, 4), (30, 4), (41, 5), (64, 8)])
def test_two_level_f_relaxation_is_exact_after_n_over_m_iterations(n, m):
    """Parareal property: after k cycles the first k coarse intervals are exact."""
    problem = nonlinear_ode(n, T=n * 0.1 / m, dim=2)
    seq = sequential_solve(problem)
    n_c = n // m
    s = MGRITSettings(levels=2, cfactor=m, relax="F", abs_tol=None, max_iter=n_c, min_coarse=1)
    res = solve(problem, s)
    np.testing.assert_allclose(res.solution, seq, rtol=0, atol=1e-13 * np.abs(seq).max())
    assert res.norms[-1] <= 1e-13
    for k, u in enumerate(solve(problem, s.replace(keep_iterates=True)).post_cycle_iterates()):
        exact_c = np.arange(0, k * m + 1, m)  # C-points 0..k are exact after k cycles
        np.testing.assert_allclose(u[exact_c], seq[exact_c], rtol=0, atol=1e-13)


def test_n_over_m_iterations_are_needed_when_the_coarse_step_is_poor():
    """Forward Euler, a·h = -0.5, m = 4: δ = |λ^m - μ| ≈ 1.06, so E_F^(n_c - 1) ≠ 0."""
    n, m = 24, 4
    problem = dahlquist(-12.0, n, T=1.0, scheme="forward")
    seq = sequential_solve(problem)
    s = MGRITSettings(levels=2, cfactor=m, abs_tol=None, max_iter=n // m - 1)
    assert np.abs(solve(problem, s).solution - seq).max() > 1e-3
    np.testing.assert_allclose(solve(problem, s.replace(max_iter=n // m)).solution, seq, atol=1e-14)


def test_returned_solution_has_exactly_the_last_reported_residual():
    problem = _problems(3, 3, 58)["nonlinear"]
    res = solve(problem, MGRITSettings(levels=3, cfactor=3, relax="FCF", max_iter=2, abs_tol=None))
    u = res.solution
    r = np.array([problem.step(u[i - 1], i - 1, i) - u[i] for i in range(1, 59)])
    c = np.arange(3, 59, 3)
    f = np.setdiff1d(np.arange(1, 59), c)
    assert np.abs(r[f - 1]).max() == 0.0  # F-points: exactly zero after the final F-sweep
    np.testing.assert_allclose(np.linalg.norm(r[c - 1]), res.norms[-1], rtol=1e-12)


def test_step_counts_follow_the_cost_model():
    """Two levels, F-relaxation, N divisible by m: a relaxation + residual costs N fine steps;
    a coarse correction costs N/m coarse steps (FAS right-hand side) + N/m (coarse solve)."""
    n, m = 48, 4
    problem = dahlquist(-1.0, n)
    res = solve(problem, MGRITSettings(levels=2, cfactor=m, abs_tol=None, max_iter=3))
    k = res.iterations
    assert res.step_counts == ((k + 1) * n, k * 2 * n // m)
    assert [rec.step_counts[0] for rec in res.records] == [(i + 1) * n for i in range(k + 1)]
    fcf = solve(problem, MGRITSettings(levels=2, cfactor=m, relax="FCF", cf_sweeps=2,
                                       abs_tol=None, max_iter=3))
    assert fcf.step_counts[0] == (k + 1) * 3 * n  # F, (C, F) × 2 with residuals: 3N


def test_warm_start_from_the_solution_needs_no_cycle():
    problem = _problems(3, 4, 101)["linear"]
    s = MGRITSettings(levels=3, cfactor=4, abs_tol=1e-11)
    cold = solve(problem, s)
    warm = solve(problem, s, u_init=cold.solution)
    assert warm.start == "warm" and warm.iterations == 0 and warm.converged
    nudged = cold.solution + 1e-6 * np.random.default_rng(1).standard_normal(cold.solution.shape)
    assert solve(problem, s, u_init=nudged).iterations < cold.iterations


def test_skip_first_down_starts_from_the_coarse_sequential_solve():
    """Parareal's initial guess: the coarse propagator run sequentially, injected at C-points."""
    n, m = 40, 4
    problem = nonlinear_ode(n, T=1.0, dim=2)
    s = MGRITSettings(levels=2, cfactor=m, skip_first_down=True, keep_iterates=True, abs_tol=1e-12)
    res = solve(problem, s)
    coarse = [problem.u0]
    for j in range(1, n // m + 1):
        coarse.append(problem.step(coarse[-1], (j - 1) * m, j * m))
    np.testing.assert_allclose(res.post_cycle_iterates()[0][::m], np.array(coarse), atol=1e-14)
    assert res.start == "skip" and res.records[0].step_counts[1] == n // m
    np.testing.assert_allclose(res.solution, sequential_solve(problem), atol=1e-11)


@pytest.mark.parametrize("start", ["skip_first_down", "fmg"])
def test_nested_iteration_starts_converge_multilevel(start):
    problem = _problems(4, 2, 45)["nonlinear"]
    s = MGRITSettings(levels=4, cfactor=2, relax=("F", "FCF", "FCF"), abs_tol=1e-12,
                      **{start: True})
    res = solve(problem, s)
    assert res.converged and res.start == ("skip" if start == "skip_first_down" else "fmg")
    np.testing.assert_allclose(res.solution, sequential_solve(problem), atol=1e-11)


def test_one_level_is_the_sequential_solve():
    problem = _problems(2, 2, 33)["linear"]
    res = solve(problem, MGRITSettings(levels=1))
    assert res.converged and res.iterations == 0 and res.norms[0] == 0.0
    np.testing.assert_array_equal(res.solution, sequential_solve(problem))


def test_stopping_rules():
    problem = _problems(3, 3, 58)["linear"]
    base = MGRITSettings(levels=3, cfactor=3, abs_tol=None)
    res = solve(problem, base.replace(rel_tol=1e-6, max_iter=50))
    assert res.converged and res.norms[-1] <= 1e-6 * res.norms[0] < res.norms[-2]
    capped = solve(problem, base.replace(max_iter=2))
    assert capped.status == "max_iter" and capped.iterations == 2 and len(capped.norms) == 3
    zero = solve(problem, base.replace(max_iter=0))
    assert zero.iterations == 0 and zero.step_counts[1:] == (0, 0)


def test_nan_in_a_step_is_divergence_raised_or_flagged():
    def step(u, a, b):
        return u * np.nan if a >= 30 else 0.9 * u

    problem = Problem(step, np.ones(2), 40)
    with pytest.raises(MGRITDiverged, match="NaN|nan") as info:
        solve(problem, MGRITSettings(levels=2, cfactor=4))
    assert info.value.result.status == "diverged"
    flagged = solve(problem, MGRITSettings(levels=2, cfactor=4, on_divergence="flag"))
    assert flagged.status == "diverged" and not flagged.converged


def test_growth_is_divergence():
    """Forward Euler with an unstable coarse step (|μ| = |1 + a·m·h| = 5.25): ‖r‖ grows."""
    problem = dahlquist(-50.0, 64, scheme="forward")
    s = MGRITSettings(levels=2, cfactor=8, abs_tol=1e-12, max_growth=10.0, on_divergence="flag")
    res = solve(problem, s)
    assert res.status == "diverged" and "max_growth" in res.message
    assert res.norms[-1] > 10 * res.norms[0]


def test_record_levels_visits_vectors_and_table():
    problem = _problems(4, 2, 45)["linear"]
    s = MGRITSettings(levels=4, cfactor=2, cycle="F", abs_tol=1e-10, keep_iterates=True)
    res = solve(problem, s)
    h = build_hierarchy(45, (2, 2, 2), 2)
    first = res.records[0]
    # F-cycle: level 1 gets an F-cycle (1, 2, 2) then a V-cycle (1, 2)
    assert [v.level for v in first.visits] == [0, 1, 2, 2, 1, 2]
    assert res.records[-1].visits[0].level == 0 and len(res.records[-1].visits) == 1
    for lvl in range(3):
        r = res.residuals(lvl)[0]
        assert r.shape == (int(h[lvl].is_c.sum()), 3)
        np.testing.assert_allclose(np.linalg.norm(r), res.level_norms(lvl)[0], rtol=1e-12)
        assert res.iterates(lvl)[0].shape == (len(h[lvl].points), 3)
    assert np.isnan(res.level_norms(1)[-1])  # the last iteration stops before its cycle
    np.testing.assert_allclose(res.conv_factors[1:], res.norms[1:] / res.norms[:-1])
    text = str(res)
    assert "XBraid" in text and "conv. factor" in text and "converged" in text
    assert len([ln for ln in text.splitlines() if ln.strip()[:1].isdigit()]) == len(res.records)
    lean = solve(problem, s.replace(keep_iterates=False, keep_residuals=False))
    assert lean.residuals(0)[0] is None and lean.iterates(0)[0] is None
    np.testing.assert_array_equal(lean.norms, res.norms)


def test_fine_relaxation_conventions_coincide_for_f_relaxation():
    problem = _problems(3, 3, 58)["linear"]
    f = solve(problem, MGRITSettings(levels=3, cfactor=3, relax="F", max_iter=4, abs_tol=None))
    np.testing.assert_array_equal(f.norms, f.post_cycle_norms)
    fcf = solve(problem, MGRITSettings(levels=3, cfactor=3, relax="FCF", max_iter=4, abs_tol=None))
    assert np.all(fcf.norms < fcf.post_cycle_norms)  # the extra CF sweep reduces the residual
