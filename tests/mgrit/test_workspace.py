"""Kept per-level arrays (refbraid.mgrit.workspace) change memory, never numbers.

Oracle: the same solve without a workspace. Every comparison is exact (``array_equal``): the
workspace only decides where values are written. Before each reuse the workspace is
*scribbled* (NaN in every kept array whose contents a solve must overwrite), so a solve that
read a stale value would give NaN or other numbers.
"""

import numpy as np
import pytest

from refbraid import Network, init_params
from refbraid.layer_parallel import LayerParallelSettings, layer_parallel_gradient
from refbraid.layers import Classifier, DenseLift, DenseStep
from refbraid.mgrit import (
    GradientWorkspace,
    MGRITSettings,
    Problem,
    Workspace,
    gather_solution,
    solve,
)
from refbraid.mgrit.coarse import forward_substitution
from refbraid.mgrit.problem import CountingStep
from refbraid.mgrit.problems import LinearODE, dahlquist, heat_1d, nonlinear_ode
from refbraid.parallel import run_ranks

SETTINGS = [
    MGRITSettings(levels=3, cfactor=4, relax="FCF", fmg=True, abs_tol=1e-10),
    MGRITSettings(levels=3, cfactor=2, relax="F", abs_tol=None, max_iter=3, min_coarse=1),
    MGRITSettings(levels=4, cfactor=2, relax="FCF", cycle="F", abs_tol=None, max_iter=2,
                  min_coarse=1, final_fc_relax=True),
    MGRITSettings.torchbraid(max_iter=1),  # nested, skipped down-cycle (lazily zeroed start)
    MGRITSettings(levels=1),
]


def _forced(direction):
    """A nonlinear forward problem, or a forced linear adjoint (backward) one; N = 33."""
    if direction == "forward":
        return nonlinear_ode(33, T=1.0, dim=3)
    g = np.random.default_rng(5).standard_normal((34, 3)) / 10
    return LinearODE(33, dim=3).adjoint_problem(np.ones(3), g=g)


def _same(a, b):
    assert np.array_equal(a.solution, b.solution)
    assert np.array_equal(a.norms, b.norms)
    assert [[v.norm for v in r.visits] for r in a.records] == \
        [[v.norm for v in r.visits] for r in b.records]


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("make", [lambda: dahlquist(-1.0, 64), lambda: heat_1d(16, 64),
                                  lambda: _forced("forward"), lambda: _forced("backward")])
def test_solve_with_a_workspace_is_bit_identical_and_reuses_its_arrays(settings, make):
    problem = make()
    want = solve(problem, settings)
    ws = Workspace()
    first = solve(problem, settings, workspace=ws)
    made = ws.allocations
    for _ in range(2):
        ws.scribble()
        got = solve(problem, settings, workspace=ws)
        _same(got, want)
    _same(first, want)  # (first.solution IS the kept array: overwritten by the same values)
    assert got.solution is first.solution or settings.levels == 1 or problem.direction \
        == "backward"  # backward: a flipped view of the same array
    assert ws.allocations == made and made >= 1


def test_the_solution_is_the_workspace_array_and_a_warm_start_from_it_works():
    problem = dahlquist(-1.0, 64)
    settings = MGRITSettings(levels=3, cfactor=4, relax="FCF", abs_tol=None, max_iter=2)
    ws = Workspace()
    a = solve(problem, settings, workspace=ws)
    kept = a.solution.copy()
    b = solve(dahlquist(-2.0, 64), settings, workspace=ws)
    assert b.solution is a.solution and not np.array_equal(a.solution, kept)  # documented
    warm_ref = solve(problem, settings, u_init=b.solution.copy())
    warm = solve(problem, settings, u_init=b.solution, workspace=ws)  # u_init IS ws's array
    _same(warm, warm_ref)


def test_distributed_solves_with_workspaces_equal_one_rank():
    problem, settings = _forced("backward"), SETTINGS[1]
    want = solve(problem, settings)

    def body(comm):
        ws = Workspace()
        for _ in range(3):
            ws.scribble()
            res = solve(problem, settings, comm=comm, workspace=ws)
        return gather_solution(res, comm), res.norms

    for size in (2, 3):  # 34 points over 3 ranks: uneven blocks
        full, norms = run_ranks(size, body)[0]
        assert np.array_equal(full, want.solution)
        np.testing.assert_allclose(norms, want.norms, rtol=1e-13)


def test_forward_substitution_block_equals_the_list_path():
    problem = _forced("forward")
    g = np.random.default_rng(1).standard_normal((34, 3))
    points = np.arange(34)
    step = CountingStep(problem)
    rows = [g[0]]
    for j in range(1, 34):
        rows.append(step(rows[-1], j - 1, j) + g[j])
    assert np.array_equal(forward_substitution(g, points, step), np.stack(rows))
    out = np.full_like(g, np.nan)
    assert forward_substitution(g, points, step, out=out) is out
    assert np.array_equal(out, np.stack(rows))
    # a step that changes dtype: the rest of the rows take the list path, as before
    def widening(u, a, b):
        return (u * 0.5).astype(np.float64)
    g32 = g.astype(np.float32)
    p32 = Problem(widening, g32[0], 33)
    got = forward_substitution(g32, points, CountingStep(p32))
    rows = [g32[0]]
    for j in range(1, 34):
        rows.append(widening(rows[-1], j - 1, j) + g32[j])
    assert got.dtype == np.stack(rows).dtype and np.array_equal(got, np.stack(rows))


@pytest.mark.parametrize("writes_out", [True, False], ids=["into-out", "new-array"])
def test_forward_substitution_lets_a_step_that_takes_add_write_phi_plus_g(writes_out):
    """A step with ``out=`` and ``add=`` writes ``Φ(u) + g`` itself (one pass): the block
    is the list path's, whether the step wrote into ``out`` or returned a new array."""
    g = np.random.default_rng(2).standard_normal((9, 3))
    adds = []

    def step(u, a, b, out=None, add=None):
        val = u * 0.5 + np.sin(a)
        if add is not None:
            adds.append(b)
            if writes_out and out is not None:
                np.add(val, add, out=out)
                return out
            return val + add
        return val

    counting = CountingStep(Problem(step, g[0], 8))
    assert counting.takes_add
    rows = [g[0]]
    for j in range(1, 9):
        rows.append(step(rows[-1], j - 1, j) + g[j])
    assert np.array_equal(forward_substitution(g, np.arange(9), counting), np.stack(rows))
    assert adds == list(range(1, 9))


@pytest.mark.parametrize("N", [16, 37])
def test_layer_parallel_gradient_with_a_workspace_is_bit_identical(N):
    net = Network(DenseLift(2, 6), DenseStep(6, "tanh"), Classifier((6,), 3), N, 2.0)
    params = init_params(net, 0)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((5, 2)), rng.integers(0, 3, 5)
    for settings in (LayerParallelSettings(), LayerParallelSettings.exact(),
                     LayerParallelSettings.with_iterations(2, 1, levels=3, cfactor=2,
                                                           min_coarse=1)):
        loss, grads, info = layer_parallel_gradient(net, params, x, y, settings)
        ws = GradientWorkspace()
        for _ in range(3):
            ws.scribble()
            loss_w, grads_w, info_w = layer_parallel_gradient(net, params, x, y, settings,
                                                              workspace=ws)
            assert loss_w == loss
            assert all(np.array_equal(grads_w[k], grads[k]) for k in grads)
            assert np.array_equal(info_w.states, info.states)
            assert np.array_equal(info_w.adjoints, info.adjoints)
            assert np.array_equal(info_w.forward.norms, info.forward.norms)
            assert np.array_equal(info_w.backward.norms, info.backward.norms)
        made = ws.allocations
        layer_parallel_gradient(net, params, x, y, settings, workspace=ws)
        assert ws.allocations == made


def test_workspace_keys_separate_dtypes_and_shapes():
    ws = Workspace()
    a = ws.empty("u", 0, np.zeros(3), (4, 3))
    assert ws.empty("u", 0, np.zeros(3), (4, 3)) is a
    assert ws.empty("u", 0, np.zeros(3, np.float32), (4, 3)) is not a
    assert ws.empty("u", 1, np.zeros(3), (4, 3)) is not a
    assert ws.empty("u", 0, np.zeros(3), (5, 3)) is not a
    z = ws.zeros("rhs unforced", 0, np.zeros(3), (4, 3))
    ws.scribble()
    assert np.isnan(a).all() and not z.any()
    assert ws.allocations == 5 and len(ws) == 5
    ws.clear()
    assert len(ws) == 0


@pytest.mark.parametrize("start", [0, 4], ids=["initial", "ghost"])
def test_forward_substitution_on_a_device_stacks_no_first_row(start):
    """On CuPy arrays (the counting stand-in) the block's first row is ``g[0]`` read in place
    by the first step (and copied into the block once), or ``Φ(ghost) + g[0]``: no block of
    one row stacked on the solve's critical path. The block equals NumPy's."""
    from refbraid.backends import launch_count
    from refbraid.backends.host import to_host

    rng = np.random.default_rng(3)
    g, ghost = rng.standard_normal((9, 3)), rng.standard_normal(3)
    points = np.arange(start, start + 9)

    def step(u, a, b, out=None, add=None):
        val = u * 0.5
        if add is None:
            return val
        np.add(val, add, out=out)
        return out

    problem = Problem(step, g[0], 16)

    def solve(g, ghost):
        return forward_substitution(g, points, CountingStep(problem), ghost if start else None,
                                    start - 1)

    want = solve(g, ghost)
    with launch_count.counting("cupy") as bk:
        dg, dghost = bk.asarray(g), bk.asarray(ghost)
        counted = launch_count.count(lambda: solve(dg, dghost))
        np.testing.assert_array_equal(to_host(solve(dg, dghost)), want)
    steps = 8 + (start > 0)  # the ghost's step too
    assert counted.by_name == {"multiply": steps, "add": steps, "setitem": 1}
