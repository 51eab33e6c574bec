"""Adjoint mode: the same solver on the reversed grid solves the transposed system.

Oracle: the forward recurrence is the block lower-bidiagonal system ``A u = g``; the adjoint
``λ[n] = Φ_nᵀ λ[n+1] + g[n]`` is ``Aᵀ λ = g``, solved here with a dense solve.
"""

import numpy as np
import pytest

from refbraid.mgrit import MGRITSettings, sequential_solve, solve
from refbraid.mgrit.problems import LinearODE

RNG = np.random.default_rng(3)


def _adjoint_setup(n, dim=3, T=1.0):
    ode = LinearODE(n, dim=dim, T=T)
    g = RNG.standard_normal((n + 1, dim))
    lam_final = RNG.standard_normal(dim)
    rhs = g.copy()
    rhs[n] = lam_final
    lam_dense = np.linalg.solve(ode.spacetime_matrix().T, rhs.ravel()).reshape(n + 1, dim)
    return ode, ode.adjoint_problem(lam_final, g=g), lam_dense


def test_sequential_backward_solve_is_the_transposed_system():
    _, problem, lam_dense = _adjoint_setup(30)
    np.testing.assert_allclose(sequential_solve(problem), lam_dense, rtol=0, atol=1e-13)


@pytest.mark.parametrize(
    "levels, cfactor, relax, cycle, n",
    [
        (2, 4, "F", "V", 40),
        (3, 3, "FCF", "V", 50),
        (3, 2, ("F", "FCF"), "F", 37),
        (4, 2, "F", "V", 61),
    ],
)
def test_adjoint_mgrit_equals_the_transposed_sequential_solve(levels, cfactor, relax, cycle, n):
    _, problem, lam_dense = _adjoint_setup(n)
    s = MGRITSettings(levels=levels, cfactor=cfactor, relax=relax, cycle=cycle, abs_tol=1e-13)
    res = solve(problem, s)
    assert res.converged and res.direction == "backward"
    assert list(res.fine_indices) == list(range(n + 1))  # returned in fine order
    scale = np.abs(lam_dense).max()
    np.testing.assert_allclose(res.solution, lam_dense, rtol=0, atol=1e-12 * scale)
    np.testing.assert_array_equal(res.solution[n], problem.u0)


def test_adjoint_steps_are_called_with_start_greater_than_stop():
    ode, problem, _ = _adjoint_setup(24)
    calls = []

    def spy(lam, start, stop):
        calls.append((start, stop))
        return problem.step(lam, start, stop)

    from refbraid.mgrit import Problem

    spied = Problem(spy, problem.u0, 24, g=problem.g, direction="backward")
    solve(spied, MGRITSettings(levels=3, cfactor=2, max_iter=2, abs_tol=None))
    assert all(a > b for a, b in calls)
    assert {a - b for a, b in calls} == {1, 2, 4}  # fine, level-1 and level-2 intervals


def test_dot_product_of_forward_and_adjoint_mgrit_solves():
    """<A⁻¹ f, h> = <f, A⁻ᵀ h>, each side computed by a converged MGRIT solve."""
    n, dim = 48, 3
    ode = LinearODE(n, dim=dim)
    f = RNG.standard_normal((n + 1, dim))
    h = RNG.standard_normal((n + 1, dim))
    s = MGRITSettings(levels=3, cfactor=4, relax="FCF", abs_tol=1e-14, max_iter=60, min_coarse=1)
    u = solve(ode.forward_problem(f[0], g=f), s).solution
    lam = solve(ode.adjoint_problem(h[n], g=h), s).solution
    lhs, rhs = np.vdot(u, h), np.vdot(f, lam)
    assert abs(lhs - rhs) <= 1e-12 * max(abs(lhs), abs(rhs))
