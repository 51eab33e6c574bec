"""The communicator interface and the solver on several (thread-simulated) ranks.

Oracle: the serial run of the same settings. Only the norms' summation order differs between
1 and P ranks, so with a fixed number of iterations the solutions must be bit-identical.
"""

import numpy as np
import pytest

from refbraid.mgrit import MGRITSettings, gather_solution, solve
from refbraid.mgrit.problems import LinearODE, nonlinear_ode
from refbraid.parallel import SerialComm, exchange_ghost, pipeline, run_ranks


def test_serial_comm_has_no_neighbours():
    c = SerialComm()
    assert (c.rank, c.size, c.position) == (0, 1, 0)
    assert exchange_ghost(c, 5) is None and c.reverted() is c
    assert c.allreduce_sum(2.5) == 2.5 and c.gather("x") == ["x"]
    assert pipeline(c, lambda ghost: [ghost, 1], last=lambda out: out[-1]) == [None, 1]


@pytest.mark.parametrize("reverted", [False, True])
def test_thread_comm_exchange_reduce_gather(reverted):
    def body(comm):
        comm = comm.reverted() if reverted else comm
        ghost = exchange_ghost(comm, np.array([comm.position]))
        total = comm.allreduce_sum(comm.rank + 1)
        chain = pipeline(comm, lambda g: (0 if g is None else g) + 1, last=lambda x: x)
        ghost = None if ghost is None else int(ghost[0])
        return comm.position, ghost, total, chain, comm.gather(comm.rank)

    out = run_ranks(4, body)
    for rank, (pos, ghost, total, chain, gathered) in enumerate(out):
        assert pos == (3 - rank if reverted else rank)
        assert ghost == (None if pos == 0 else pos - 1)  # previous block in solver order
        assert total == 10.0 and chain == pos + 1
        assert gathered == ([0, 1, 2, 3] if rank == 0 else None)


def test_run_ranks_reraises_a_rank_failure():
    def body(comm):
        if comm.rank == 1:
            raise ValueError("boom on rank 1")
        return comm.allreduce_sum(1.0)

    with pytest.raises(ValueError, match="boom on rank 1"):
        run_ranks(3, body)


def _distributed(problem, settings, size):
    def body(comm):
        res = solve(problem, settings, comm=comm)
        return gather_solution(res, comm), res.norms, res.status

    return run_ranks(size, body)


SETTINGS = [
    MGRITSettings(levels=3, cfactor=2, relax="F", abs_tol=None, max_iter=3, min_coarse=1),
    MGRITSettings(levels=3, cfactor=3, relax=("F", "FCF"), cycle="F", abs_tol=None, max_iter=3,
                  min_coarse=1),
    MGRITSettings(levels=2, cfactor=4, relax="FCF", cf_sweeps=2, abs_tol=None, max_iter=2,
                  fmg=True),
    MGRITSettings(levels=4, cfactor=2, abs_tol=None, max_iter=2, skip_first_down=True,
                  min_coarse=1),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: f"L{s.levels}-{s.cycle}")
@pytest.mark.parametrize("size", [2, 3, 4])
def test_distributed_forward_solve_is_bit_identical_to_serial(settings, size):
    problem = nonlinear_ode(50, T=1.0, dim=3)
    serial = solve(problem, settings)
    out = _distributed(problem, settings, size)
    full, norms, status = out[0]
    np.testing.assert_array_equal(full, serial.solution)
    np.testing.assert_allclose(norms, serial.norms, rtol=1e-13)
    assert all(o[2] == status == serial.status for o in out)


@pytest.mark.parametrize("size", [2, 4])
def test_distributed_adjoint_solve_is_bit_identical_to_serial(size):
    ode = LinearODE(45, dim=2)
    g = np.random.default_rng(0).standard_normal((46, 2))
    problem = ode.adjoint_problem(np.ones(2), g=g)
    for settings in SETTINGS[:2]:
        serial = solve(problem, settings)
        full, _, _ = _distributed(problem, settings, size)[0]
        np.testing.assert_array_equal(full, serial.solution)


def test_each_rank_holds_its_block_and_converges_with_the_others():
    problem = nonlinear_ode(64, T=1.0, dim=2)
    s = MGRITSettings(levels=3, cfactor=4, abs_tol=1e-12, min_coarse=1)

    def body(comm):
        res = solve(problem, s, comm=comm)
        return res.fine_indices, res.iterations, res.step_counts

    out = run_ranks(4, body)
    blocks = [list(o[0]) for o in out]
    assert blocks == [list(range(16 * r, 16 * r + 16 + (r == 3))) for r in range(4)]
    assert len({o[1] for o in out}) == 1  # same iteration count everywhere
    assert sum(o[2][0] for o in out) == solve(problem, s).step_counts[0]  # work is split


def test_more_ranks_than_coarsest_intervals_is_an_error():
    problem = nonlinear_ode(16, T=1.0, dim=1)
    s = MGRITSettings(levels=3, cfactor=2)  # coarsest grid: 4 intervals

    with pytest.raises(ValueError, match="exceed the 4 intervals of the coarsest"):
        run_ranks(5, lambda comm: solve(problem, s, comm=comm))


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_every_step_is_made_by_the_rank_that_owns_its_start_point(direction):
    """Each rank steps only from its own points, on every level: a step across a block
    boundary is made where it starts and its result sent on (the layer's owner applies the
    layer). With blocks of equal length every rank makes as many steps per level as the
    others (XBraid's convention gives each later block one more per level and sweep); the
    solution stays the serial one, bit for bit."""
    from refbraid.mgrit import Problem
    from refbraid.mgrit.grid import build_hierarchy
    from refbraid.parallel.layout import partition

    N = 64
    s = MGRITSettings.torchbraid()
    made = {}

    def phi(u, start, stop):  # a smooth step of either direction (fine indices)
        return u + 0.01 * abs(stop - start) * np.sin(u + start)

    def body(comm):
        seen = []

        def step(u, start, stop):
            seen.append((start, stop))
            return phi(u, start, stop)

        problem = Problem(step, np.ones(2), N, direction=direction)
        res = solve(problem, s, comm=comm)
        made[comm.rank] = seen
        return gather_solution(res, comm), res.step_counts

    out = run_ranks(2, body)
    serial = solve(Problem(phi, np.ones(2), N, direction=direction), s)
    np.testing.assert_array_equal(out[0][0], serial.solution)
    assert out[0][1] == out[1][1]  # the same number of steps on every level
    layout = partition(build_hierarchy(N, s.cfactors, s.min_coarse).coarsest.points, N, 2)
    for rank, steps in made.items():
        position = rank if direction == "forward" else 1 - rank
        starts = {a if direction == "forward" else N - a for a, _ in steps}
        assert {layout.owner(p) for p in starts} == {position}


def test_a_stepped_ghost_gives_the_floats_of_the_ghost_stepped_here():
    """Every use of the previous block's last point (propagation, the FAS restriction, the
    fused residual row, the coarsest solve) reads Φ(ghost) from a Stepped ghost as it would
    have computed it."""
    from refbraid.mgrit import batched
    from refbraid.mgrit.coarse import forward_substitution
    from refbraid.mgrit.fused import first_residual_row, restrict_fas
    from refbraid.mgrit.problem import CountingStep
    from refbraid.mgrit.relax import Stepped, propagate_at

    problem = nonlinear_ode(12, T=1.0, dim=3)
    step = CountingStep(problem)
    rng = np.random.default_rng(4)
    points = np.arange(4, 9)
    u, g, r = (rng.standard_normal((5, 3)) for _ in range(3))
    ghost = rng.standard_normal(3)
    stepped = Stepped(step(ghost, 3, 4))
    for plain, ready in [
        (propagate_at(u, g, points, [0, 2], step, ghost, 3),
         propagate_at(u, g, points, [0, 2], step, stepped, 3)),
        (batched.propagate_at(u, g, points, [0, 2], step, ghost, 3),
         batched.propagate_at(u, g, points, [0, 2], step, stepped, 3)),
        (forward_substitution(g, points, step, ghost, 3),
         forward_substitution(g, points, step, stepped, 3)),
        (first_residual_row(r.copy(), u, g, points, step, ghost, 3),
         first_residual_row(r.copy(), u, g, points, step, stepped, 3)),
        (restrict_fas(u, r, points, step, ghost, 3)[1],
         restrict_fas(u, r, points, step, stepped, 3)[1]),
    ]:
        np.testing.assert_array_equal(ready, plain)
