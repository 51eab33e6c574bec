"""``final_fc_relax`` under MPI: the gathered solution equals one process's, forward and
adjoint (launched by tests/test_mpi_launch.py for N = 1..4 ranks, uneven splits)."""

import numpy as np
import pytest

from refbraid.mgrit import MGRITSettings, gather_solution, solve
from refbraid.mgrit.problems import LinearODE, nonlinear_ode


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_final_fc_relax_equals_serial(world, direction):
    if direction == "forward":
        problem = nonlinear_ode(70, T=1.0, dim=3)
    else:
        g = np.random.default_rng(0).standard_normal((46, 2))
        problem = LinearODE(45, dim=2).adjoint_problem(np.ones(2), g=g)
    s = MGRITSettings.torchbraid(max_iter=1, abs_tol=None, final_fc_relax=True, cfactor=2)
    serial = solve(problem, s)
    full = gather_solution(solve(problem, s, comm=world), world)
    if world.rank == 0:
        np.testing.assert_array_equal(full, serial.solution)
