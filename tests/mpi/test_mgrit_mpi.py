"""Distributed MGRIT over MPI against the serial solve of the same settings.

Oracle: ``solve(problem, settings)`` in one process. Each rank solves its block through an
:class:`~refbraid.parallel.mpi.MPIComm`; only the residual norms' summation order differs, so
with fixed iteration counts the gathered solution must be bit-identical (forward and adjoint),
the norms equal to 1e-13, and with a tolerance the iteration counts equal.
"""

import numpy as np
import pytest

from refbraid.mgrit import MGRITSettings, gather_solution, solve
from refbraid.mgrit.problems import LinearODE, heat_1d, nonlinear_ode

SETTINGS = [
    MGRITSettings(levels=3, cfactor=2, relax="F", abs_tol=None, max_iter=3, min_coarse=1),
    MGRITSettings(levels=3, cfactor=3, relax=("F", "FCF"), cycle="F", abs_tol=None, max_iter=3,
                  min_coarse=1),
    MGRITSettings.torchbraid(max_iter=2, abs_tol=None),
    MGRITSettings(levels=2, cfactor=4, relax="FCF", cf_sweeps=2, abs_tol=None, max_iter=2,
                  fmg=True),
]
IDS = ["V-F", "F-cycle-FCF", "torchbraid", "FMG-FCF2"]


def _compare(world, problem, settings):
    serial = solve(problem, settings)
    res = solve(problem, settings, comm=world)
    full = gather_solution(res, world)
    if world.rank == 0:
        np.testing.assert_array_equal(full, serial.solution)
    else:
        assert full is None
    np.testing.assert_allclose(res.norms, serial.norms, rtol=1e-13, atol=1e-300)
    assert res.status == serial.status and res.iterations == serial.iterations
    counts = world.allgather(res.step_counts[0])
    assert sum(counts) == serial.step_counts[0]  # the fine-level work is split, not repeated
    return res


@pytest.mark.parametrize("settings", SETTINGS, ids=IDS)
def test_forward_solve_equals_serial(world, settings):
    _compare(world, nonlinear_ode(70, T=1.0, dim=3), settings)


@pytest.mark.parametrize("settings", SETTINGS[:3], ids=IDS[:3])
def test_adjoint_solve_equals_serial(world, settings):
    ode = LinearODE(67, dim=2)
    g = np.random.default_rng(0).standard_normal((68, 2))
    res = _compare(world, ode.adjoint_problem(np.ones(2), g=g), settings)
    assert res.direction == "backward"


def test_converged_solve_takes_the_same_iterations(world):
    problem = heat_1d(n_x=16, n_steps=64, T=0.1)
    s = MGRITSettings(levels=3, cfactor=4, abs_tol=1e-10, min_coarse=1)
    res = _compare(world, problem, s)
    assert res.status == "converged"


def test_blocks_cover_the_grid_once(world):
    problem = nonlinear_ode(64, T=1.0, dim=2)
    res = solve(problem, SETTINGS[0], comm=world)
    blocks = world.allgather(res.fine_indices.tolist())
    flat = [i for b in blocks for i in b]
    assert flat == list(range(65))


def test_too_many_ranks_is_a_clear_error_on_every_rank(world):
    s = MGRITSettings(levels=3, cfactor=4, min_coarse=1)  # N = 16: one coarsest interval
    problem = nonlinear_ode(16, T=1.0, dim=1)
    if world.size == 1:
        assert solve(problem, s, comm=world).status in ("converged", "max_iter")
    else:
        with pytest.raises(ValueError, match=f"{world.size} ranks exceed the 1 interval of"):
            solve(problem, s, comm=world)
