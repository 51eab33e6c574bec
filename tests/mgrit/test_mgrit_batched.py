"""Batched steps (mgrit/batched.py) against the per-step reference path, and against PyMGRIT.

Oracle: the same solve with the problem's ``batched_step`` removed (the per-point functions of
relax.py). Bit-identical, because every ``batched_step`` here does each row's floating-point
operations exactly as ``step`` does (elementwise NumPy for Dahlquist and the nonlinear ODE,
NumPy's per-row matrix-vector kernel for LinearODE and heat_1d, the PyMGRIT twins' shared
Thomas kernel) and the batched relaxation only changes how many rows one call gets. (A
batched step with one GEMM for all rows would agree to round-off only: ``assert_same`` with
``exact=False`` is the check for such a problem.)
"""

import dataclasses

import numpy as np
import pytest

from refbraid.mgrit import MGRITSettings, Problem, gather_solution, sequential_solve, solve
from refbraid.mgrit.batched import f_sweeps
from refbraid.mgrit.problem import CountingStep
from refbraid.mgrit.problems import LinearODE, dahlquist, heat_1d, nonlinear_ode
from refbraid.mgrit.pymgrit_twins import pymgrit_dahlquist, pymgrit_heat_1d
from refbraid.parallel import run_ranks
from refbraid.parallel.layout import Layout
from refbraid.parallel.trace import Recorder, recording
from refbraid.parallel.virtual import simulate


def per_step(problem: Problem) -> Problem:
    return dataclasses.replace(problem, batched_step=None)


def _linear(direction: str, n: int = 67) -> Problem:
    ode = LinearODE(n, dim=3)
    rng = np.random.default_rng(1)
    g = rng.standard_normal((n + 1, 3))
    if direction == "forward":
        return ode.forward_problem(rng.standard_normal(3), g=g)
    return ode.adjoint_problem(rng.standard_normal(3), g=g)


# name -> (problem, exact: bit-identical expected)
PROBLEMS = {
    "dahlquist": (lambda: dahlquist(np.array([-1.0, -4.0]), 67, T=4.0), True),
    "nonlinear": (lambda: nonlinear_ode(67, T=1.0, dim=3), True),
    "linear_forward": (lambda: _linear("forward"), True),
    "linear_adjoint": (lambda: _linear("backward"), True),
    "pymgrit_dahlquist": (lambda: pymgrit_dahlquist(67), True),
    "pymgrit_heat": (lambda: pymgrit_heat_1d(67, nx=17), True),
    "heat": (lambda: heat_1d(n_x=12, n_steps=67, T=0.1), True),
}
SETTINGS = [
    MGRITSettings(levels=2, cfactor=4, relax="F", abs_tol=None, max_iter=3),
    MGRITSettings(levels=3, cfactor=4, relax="FCF", abs_tol=None, max_iter=3, fmg=True),
    MGRITSettings(levels=4, cfactor=2, relax=("FCF", "F", "FCF"), abs_tol=None, max_iter=2,
                  cycle="F", skip_first_down=True),
    # TorchBraid's: nested iteration writes each coarse level into the C-rows above it
    MGRITSettings.torchbraid(max_iter=2, abs_tol=None),
]
SETTINGS_IDS = ["L2-F", "L3-FCF-fmg", "L4-Fcycle-skip", "torchbraid"]


def assert_same(a, b, exact: bool, what: str):
    if exact:
        np.testing.assert_array_equal(a, b, err_msg=what)
    else:
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-13, err_msg=what)


@pytest.mark.parametrize("settings", SETTINGS, ids=SETTINGS_IDS)
@pytest.mark.parametrize("name", list(PROBLEMS))
def test_batched_equals_per_step_serial(name, settings):
    make, exact = PROBLEMS[name]
    problem = make()
    assert problem.batched_step is not None
    b, p = solve(problem, settings), solve(per_step(problem), settings)
    assert_same(b.solution, p.solution, exact, f"{name}: solution")
    assert_same(b.norms, p.norms, exact, f"{name}: residual history")
    assert_same(b.post_cycle_norms, p.post_cycle_norms, exact, f"{name}: post-cycle history")
    assert b.step_counts == p.step_counts  # every fine step still counted
    assert [r.step_counts for r in b.records] == [r.step_counts for r in p.records]


def test_batched_solve_converges_to_the_sequential_solution():
    problem = pymgrit_heat_1d(64, nx=17)
    s = MGRITSettings(levels=3, cfactor=4, relax="FCF", fmg=True, abs_tol=1e-12, max_iter=30)
    res = solve(problem, s)
    assert res.converged
    np.testing.assert_allclose(res.solution, sequential_solve(problem), rtol=0, atol=1e-11)


UNEVEN = [(2, Layout(67, (0, 48))), (3, Layout(67, (0, 16, 64))), (4, Layout(67, (0, 16, 32, 64)))]


@pytest.mark.parametrize("name", ["dahlquist", "linear_forward", "linear_adjoint", "heat"])
@pytest.mark.parametrize("size,layout", UNEVEN, ids=["P2", "P3", "P4"])
def test_batched_on_thread_ranks_with_uneven_blocks(name, size, layout):
    make, exact = PROBLEMS[name]
    problem = make()
    s = MGRITSettings(levels=3, cfactor=4, relax="FCF", abs_tol=None, max_iter=3, fmg=True)
    serial = solve(per_step(problem), s)

    def body(comm):
        res = solve(problem, s, comm=comm, layout=layout)
        return gather_solution(res, comm), res.norms, res.step_counts

    out = run_ranks(size, body)
    counts = np.sum([o[2] for o in out], axis=0)
    assert_same(out[0][0], serial.solution, exact, f"{name} on {size} ranks")
    # only the norms' summation order differs between 1 and P ranks (and heat's GEMM order)
    np.testing.assert_allclose(out[0][1], serial.norms, rtol=1e-12 if exact else 1e-9)
    assert tuple(counts) == serial.step_counts


@pytest.mark.parametrize("size", [1, 3])
def test_virtual_cluster_sees_every_batched_step(size):
    problem = _linear("backward", 67)
    s = MGRITSettings(levels=3, cfactor=4, relax="FCF", abs_tol=None, max_iter=2)
    layout = Layout(67, (0, 16, 64)) if size == 3 else None  # uneven blocks

    def run(p):
        def body(comm):
            res = solve(p, s, comm=comm, layout=layout)
            return res.step_counts, gather_solution(res, comm)

        return simulate(body, size, costs=1e-3)

    batched, looped = run(problem), run(per_step(problem))
    assert batched.wall_time == pytest.approx(looped.wall_time, rel=1e-12)
    assert batched.trace.step_counts() == looped.trace.step_counts()
    assert sum(sum(r[0]) for r in batched.results) == len(batched.trace.of_kind("step"))
    np.testing.assert_array_equal(batched.results[0][1], looped.results[0][1])


def test_trace_records_a_batched_call_as_one_box_per_interval():
    problem = pymgrit_dahlquist(64)
    s = MGRITSettings(levels=3, cfactor=4, relax="FCF", abs_tol=None, max_iter=2, fmg=True)
    with recording(Recorder()) as rec:
        res = solve(problem, s)
    with recording(Recorder()) as rec_p:
        solve(per_step(problem), s)
    steps = rec.trace().of_kind("step")
    assert len(steps) == res.total_steps
    assert rec.trace().step_counts() == rec_p.trace().step_counts()
    assert sorted((e.level, e.start, e.stop) for e in steps) == sorted(
        (e.level, e.start, e.stop) for e in rec_p.trace().of_kind("step"))
    ends = np.array([(e.t0, e.t1) for e in rec.trace().on_rank(0)])
    assert np.all(ends[1:, 0] >= ends[:-1, 1] - 1e-12)  # one thing at a time


def test_f_sweeps_group_the_j_th_f_point_of_every_interval():
    # block positions 0..10 with C-points 0, 4, 8: F-runs 1-3, 5-7, 9-10 (short last interval)
    sweeps = f_sweeps([1, 2, 3, 5, 6, 7, 9, 10])
    assert [s.tolist() for s in sweeps] == [[1, 5, 9], [2, 6, 10], [3, 7]]
    assert f_sweeps([]) == []


def test_batched_step_errors_name_the_argument():
    with pytest.raises(TypeError, match="`batched_step` must be None or a callable"):
        Problem(lambda u, a, b: u, np.ones(2), 4, batched_step=3)
    bad = Problem(lambda u, a, b: u, np.ones(2), 4, batched_step=lambda U, a, b: U[:1])
    with pytest.raises(ValueError, match=r"`batched_step` returned \(1, 2\).*\(3, 2\)"):
        CountingStep(bad).many(np.ones((3, 2)), np.arange(3), np.arange(1, 4))


def test_an_object_with_step_and_batched_step_methods_supplies_both():
    class Decay:
        def step(self, u, start, stop):
            return 0.5 * u

        def batched_step(self, U, starts, stops):
            return 0.5 * U

    problem = Problem(Decay(), np.ones(2), 8)
    assert problem.batched_step is not None
    s = MGRITSettings(levels=2, cfactor=2, abs_tol=None, max_iter=2)
    np.testing.assert_array_equal(solve(problem, s).solution,
                                  solve(per_step(problem), s).solution)


@pytest.mark.parametrize("kind", ["dahlquist", "heat"])
def test_residual_history_matches_pymgrit(kind):
    """PyMGRIT's own solve of its own problem: same cycles, same residuals (its convention:
    after the whole cycle, refbraid's post_cycle_norms[1:])."""
    pytest.importorskip("pymgrit")
    from refbraid.mgrit.pymgrit_twins import pymgrit_solve

    n, nx = 128, 17
    conv, _ = pymgrit_solve(kind, n, levels=3, cfactor=4, tol=1e-10, nx=nx)
    problem = pymgrit_dahlquist(n) if kind == "dahlquist" else pymgrit_heat_1d(n, nx=nx)
    s = MGRITSettings(levels=3, cfactor=4, relax="FCF", fmg=True, max_iter=len(conv),
                      abs_tol=None)
    for p in (problem, per_step(problem)):
        hist = solve(p, s).post_cycle_norms[1:]
        assert hist[-1] < 1e-10 <= hist[-2]  # PyMGRIT's stopping point
        np.testing.assert_allclose(hist, conv, rtol=1e-6, atol=1e-14)  # states are O(1)


@pytest.mark.parametrize("batched_problem", [True, False], ids=["batched_step", "loop"])
def test_batched_kernels_equal_the_per_point_kernels_on_a_later_block(batched_problem):
    """A block that starts at s = 8 (ghost from the previous block) with a short last interval;
    CountingStep.many loops over ``step`` when the problem has no batched_step."""
    from refbraid.mgrit import batched, relax

    problem = _linear("backward", 21)
    problem = problem if batched_problem else per_step(problem)
    points = np.arange(8, 22)  # block of 14 points; C-points every 4: positions 0, 4, 8, 12
    c_pos, f_pos = np.arange(0, 14, 4), np.setdiff1d(np.arange(14), np.arange(0, 14, 4))
    rng = np.random.default_rng(2)
    u, g, ghost = rng.standard_normal((14, 3)), rng.standard_normal((14, 3)), rng.standard_normal(3)
    one, many = CountingStep(problem), CountingStep(problem)
    np.testing.assert_array_equal(
        batched.f_relax(u, g, points, batched.f_sweeps(f_pos), many),
        relax.f_relax(u, g, points, f_pos, one))
    np.testing.assert_array_equal(
        batched.propagate_at(u, g, points, c_pos, many, ghost, 7),
        relax.propagate_at(u, g, points, c_pos, one, ghost, 7))
    assert one.count == many.count == len(f_pos) + len(c_pos)
    with pytest.raises(ValueError, match="needs a `ghost` value"):
        batched.propagate_at(u, g, points, c_pos, many)


def _writing_into_rows(problem: Problem, calls: list) -> Problem:
    """``problem`` with a batched step that takes ``out=`` and ``add=``: ``Φ(U) + add`` written
    into the F-sweep's rows by the step itself (each call recorded)."""
    plain = problem.batched_step

    def batched_step(U, starts, stops, out=None, add=None):
        value = plain(U, starts, stops)
        if out is None:
            return value
        calls.append(add is not None)
        if add is None:
            out[...] = value
        else:
            np.add(value, add, out=out)
        return out

    return dataclasses.replace(problem, batched_step=batched_step)


@pytest.mark.parametrize("settings", SETTINGS, ids=SETTINGS_IDS)
@pytest.mark.parametrize("name", ["dahlquist", "linear_forward", "linear_adjoint", "heat"])
def test_a_batched_step_that_writes_the_f_sweep_rows_gives_the_same_bits(name, settings):
    """A ``batched_step`` taking ``out=`` and ``add=`` is handed the F-sweep's rows of the
    iterate (a view) and the right-hand side there (None where the level has none): the same
    solution and residual history bit for bit."""
    problem, _ = PROBLEMS[name]
    problem, calls = problem(), []
    into = _writing_into_rows(problem, calls)
    assert CountingStep(into).batched_into and not CountingStep(problem).batched_into
    a, b = solve(into, settings), solve(problem, settings)
    np.testing.assert_array_equal(a.solution, b.solution)
    np.testing.assert_array_equal(a.norms, b.norms)
    assert calls


def test_a_batched_step_with_out_but_no_add_is_not_handed_the_rows():
    """Only a step that takes both keywords writes the rows (the contract is ``Φ + add``)."""
    problem = dahlquist(np.array([-1.0]), 16)
    only_out = dataclasses.replace(
        problem, batched_step=lambda U, starts, stops, out=None: problem.batched_step(
            U, starts, stops))
    assert not CountingStep(only_out).batched_into


@pytest.mark.parametrize("name", ["dahlquist", "linear_forward", "heat"])
@pytest.mark.parametrize("size,layout", UNEVEN[:2], ids=["P2", "P3"])
def test_a_step_writing_rows_on_thread_ranks_with_uneven_blocks(name, size, layout):
    """Later blocks start with a Stepped ghost: the residual's first row is the ghost's value
    (+ g there), its other rows written by the step; the solution equals one rank's."""
    problem = _writing_into_rows(PROBLEMS[name][0](), [])
    s = MGRITSettings(levels=3, cfactor=4, relax="FCF", abs_tol=None, max_iter=3, fmg=True)
    serial = solve(problem, s)

    def body(comm):
        res = solve(problem, s, comm=comm, layout=layout)
        return gather_solution(res, comm), res.norms

    out = run_ranks(size, body)
    np.testing.assert_array_equal(out[0][0], serial.solution)
    np.testing.assert_allclose(out[0][1], serial.norms, rtol=1e-12)


@pytest.mark.parametrize("first", [0, 8], ids=["initial", "ghost"])
@pytest.mark.parametrize("unforced", [False, True])
def test_the_residual_written_row_by_row_equals_the_stacked_block(first, unforced):
    """batched.residual_at with a step that writes rows = propagate_at − u[C] (the stacked
    block), and batched.c_relax_at = that block in u[C]; unforced: g zero but at the initial
    point, its `+ g` left out (the same values)."""
    from refbraid.mgrit import batched
    from refbraid.mgrit.relax import Stepped

    calls = []
    problem = _writing_into_rows(_linear("backward", 21), calls)
    points = np.arange(first, first + 14)
    c_pos = np.arange(0, 14, 4)
    rng = np.random.default_rng(3)
    u, g = rng.standard_normal((14, 3)), rng.standard_normal((14, 3))
    if unforced:
        g[points != 0] = 0.0
    ghost = None if first == 0 else rng.standard_normal(3)
    step = CountingStep(problem)
    pu = batched.propagate_at(u, g, points, c_pos, step, ghost, first - 1)
    want = pu - u[c_pos]
    stepped = None if ghost is None else Stepped(step(ghost, first - 1, first))
    calls.clear()
    got = batched.residual_at(u, g, points, c_pos, step, stepped, first - 1, unforced=unforced)
    np.testing.assert_array_equal(got, want)
    assert calls == [not unforced]  # the rows after the first written by the step
    assert not np.may_share_memory(got, u)
    # a plain ghost is stepped here: the stacked block, as before
    if ghost is not None:
        np.testing.assert_array_equal(
            batched.residual_at(u, g, points, c_pos, step, ghost, first - 1), want)
    # C-relaxation writes the same rows into u[C] itself, the F-rows untouched
    relaxed = u.copy()
    calls.clear()
    assert batched.c_relax_at(relaxed, g, points, c_pos, step, stepped, first - 1,
                              unforced=unforced) is relaxed
    np.testing.assert_array_equal(relaxed[c_pos], pu)
    np.testing.assert_array_equal(np.delete(relaxed, c_pos, 0), np.delete(u, c_pos, 0))
    assert calls == [not unforced]
