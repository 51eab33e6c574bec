"""MGRIT with coarsening in space (Problem.transfer): converges to the sequential solve,
forward and backward, on one and several (thread) ranks; guards and the identity case."""

import numpy as np
import pytest

from refbraid.mgrit import MGRITSettings, Problem, gather_solution, sequential_solve, solve
from refbraid.mgrit.transfer import SpatialCoarsening, restrict_to_shape
from refbraid.parallel import run_ranks


def _step(u, start, stop):
    """A nonlinear 2-D diffusion-reaction step ``u + h tanh(Δu + u)``, h = 0.1·|stop − start|."""
    h = 0.1 * abs(stop - start)
    lap = sum(np.roll(u, s, a) for s in (1, -1) for a in (-1, -2)) - 4 * u
    return u + h * np.tanh(lap + u)


def _problem(direction="forward", transfer=None, n=16):
    u0 = np.random.default_rng(0).standard_normal((2, 8, 8))
    return Problem(_step, u0, n, direction=direction, transfer=transfer)


def _settings(levels, **kw):
    base = dict(levels=levels, cfactor=2, relax="FCF", max_iter=20, abs_tol=1e-12,
                rel_tol=None, min_coarse=1)
    base.update(kw)
    return MGRITSettings(**base)


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("levels,coarsen", [(2, (1,)), (3, (1,)), (3, (1, 2)), (3, (2,))])
@pytest.mark.parametrize("interp", ["linear", "constant"])
def test_spatially_coarsened_mgrit_converges_to_sequential_solve(direction, levels, coarsen,
                                                                 interp):
    sc = SpatialCoarsening(coarsen, interpolation=interp)
    p = _problem(direction, sc if direction == "forward" else sc.transposed())
    res = solve(p, _settings(levels))
    assert res.status == "converged"
    np.testing.assert_allclose(res.solution, sequential_solve(p), atol=1e-12)
    # finite termination: at most one C-interval per iteration (+1 measurement)
    assert res.iterations <= 16 // 2 + 1


def test_coarse_levels_run_on_coarser_states():
    p = _problem(transfer=SpatialCoarsening((1, 2)))
    assert p.level_shapes(3) == [(2, 8, 8), (2, 4, 4), (2, 2, 2)]
    assert _problem().level_shapes(3) == [(2, 8, 8)] * 3


class _Identity:
    def restrict(self, u, level, index):
        return u

    def interpolate(self, v, level, index):
        return v


@pytest.mark.parametrize("fmg", [False, True])
def test_identity_transfer_is_time_only_coarsening(fmg):
    s = _settings(3, max_iter=3, abs_tol=None, fmg=fmg)
    a = solve(_problem(), s)
    b = solve(_problem(transfer=_Identity()), s)
    np.testing.assert_allclose(b.solution, a.solution, atol=1e-14)
    np.testing.assert_allclose(b.norms, a.norms, rtol=1e-12)


@pytest.mark.parametrize("size", [2, 3])
def test_spatial_coarsening_on_several_ranks_equals_one_rank(size):
    p = _problem(transfer=SpatialCoarsening((1, 2)), n=19)  # uneven blocks
    s = _settings(3, max_iter=3, abs_tol=None)
    serial = solve(p, s)

    def body(comm):
        res = solve(p, s, comm=comm)
        return gather_solution(res, comm), res.norms

    full, norms = run_ranks(size, body)[0]
    np.testing.assert_allclose(full, serial.solution, atol=1e-14)
    np.testing.assert_allclose(norms, serial.norms, rtol=1e-12)


def test_f_relaxation_with_spatial_coarsening_is_refused():
    with pytest.raises(ValueError, match="`relax` must be 'FCF' on level"):
        solve(_problem(transfer=SpatialCoarsening((1,))), _settings(2, relax="F"))
    # a level below a time-only coarsening may use F
    solve(_problem(transfer=SpatialCoarsening((2,))), _settings(3, relax=("F", "FCF")))


def test_bad_transfer_and_settings_name_the_argument():
    with pytest.raises(TypeError, match="`transfer`"):
        _problem(transfer=object())
    with pytest.raises(ValueError, match="`levels`"):
        SpatialCoarsening((0,))
    with pytest.raises(ValueError, match="`interpolation`"):
        SpatialCoarsening(interpolation="cubic")
    with pytest.raises(ValueError, match="cannot restrict"):
        restrict_to_shape(np.zeros((2, 4, 4)), (2, 8, 8))


def test_transposed_pairs():
    fw = SpatialCoarsening((1,), "average", "linear")
    adj = fw.transposed()
    assert adj.adjoint and adj.transposed() == fw
    x = np.random.default_rng(1).standard_normal((3, 8, 8))
    # average R with constant P: the adjoint pair is the forward pair
    pc = SpatialCoarsening((1,), "average", "constant")
    np.testing.assert_allclose(pc.transposed().restrict(x, 0, 0), pc.restrict(x, 0, 0))
    v = pc.restrict(x, 0, 0)
    np.testing.assert_allclose(pc.transposed().interpolate(v, 0, 0), pc.interpolate(v, 0, 0))


def _step3d(u, start, stop):
    """The 3-D version of :func:`_step` on (C, D, H, W) states."""
    h = 0.1 * abs(stop - start)
    lap = sum(np.roll(u, s, a) for s in (1, -1) for a in (-1, -2, -3)) - 6 * u
    return u + h * np.tanh(lap + u)


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_trilinear_coarsening_of_3d_states_converges_to_sequential_solve(direction):
    u0 = np.random.default_rng(2).standard_normal((2, 4, 8, 4))
    sc = SpatialCoarsening((1, 2), "average", "linear", dims=3)
    p = Problem(_step3d, u0, 12, direction=direction,
                transfer=sc if direction == "forward" else sc.transposed())
    assert p.level_shapes(3) == [(2, 4, 8, 4), (2, 2, 4, 2), (2, 1, 2, 1)]
    res = solve(p, _settings(3))
    assert res.status == "converged"
    np.testing.assert_allclose(res.solution, sequential_solve(p), atol=1e-12)


def test_guess_sets_the_cold_start_iterate():
    p = _problem()
    guess = Problem(p.step, p.u0, p.n_steps, guess=lambda i: np.full(p.u0.shape, float(i)))
    res = solve(guess, _settings(2, relax="F", max_iter=0, abs_tol=None, skip_first_down=False,
                                 keep_iterates=True))
    first = res.records[0].visits[0].iterate  # after the first F-sweep: C-points untouched
    np.testing.assert_array_equal(first[2], np.full(p.u0.shape, 2.0))
    np.testing.assert_array_equal(first[0], p.u0)
    with pytest.raises(TypeError, match="`guess`"):
        Problem(p.step, p.u0, p.n_steps, guess=3)
