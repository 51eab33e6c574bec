"""Settings and problem validation: bad input raises an error naming the setting."""

import numpy as np
import pytest

from refbraid.mgrit import MGRITSettings, Problem, as_problem, sequential_solve, solve


def _scalar_problem(n=16, step=None):
    return Problem(step or (lambda u, a, b: 0.9 * u), np.array([1.0]), n)


@pytest.mark.parametrize(
    "changes, name",
    [
        (dict(cfactor=1), "cfactor"),
        (dict(cfactor=(2, 1), levels=3), "cfactor"),
        (dict(cfactor=(2,), levels=3), "cfactor"),
        (dict(cfactor=2.0), "cfactor"),
        (dict(levels=0), "levels"),
        (dict(levels=True), "levels"),
        (dict(abs_tol=0.0), "abs_tol"),
        (dict(abs_tol=-1e-8), "abs_tol"),
        (dict(rel_tol=0), "rel_tol"),
        (dict(rel_tol=float("nan")), "rel_tol"),
        (dict(max_iter=-1), "max_iter"),
        (dict(relax="C"), "relax"),
        (dict(relax=("F", "FCF"), levels=2), "relax"),
        (dict(cf_sweeps=0), "cf_sweeps"),
        (dict(cycle="W"), "cycle"),
        (dict(min_coarse=0), "min_coarse"),
        (dict(on_divergence="ignore"), "on_divergence"),
        (dict(max_growth=1.0), "max_growth"),
        (dict(skip_first_down=True, fmg=True), "skip_first_down"),
    ],
)
def test_bad_settings_name_the_setting(changes, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        MGRITSettings(**changes)


def test_bool_flags_are_type_checked():
    with pytest.raises(TypeError, match="`keep_iterates`"):
        MGRITSettings(keep_iterates=1)


def test_per_level_settings_and_torchbraid_preset():
    s = MGRITSettings(levels=3, cfactor=(4, 2), relax=("F", "FCF"), cf_sweeps=(1, 2))
    assert s.cfactors == (4, 2)
    assert [s.relax_on(0), s.relax_on(1)] == ["F", "FCF"]
    assert [s.sweeps_on(0), s.sweeps_on(1)] == [0, 2]  # F-relaxation has no CF sweeps
    tb = MGRITSettings.torchbraid()
    assert (tb.levels, tb.cfactors, tb.skip_first_down, tb.rel_tol) == (3, (4, 4), True, None)
    assert [tb.relax_on(0), tb.relax_on(1)] == ["F", "FCF"]
    assert MGRITSettings.torchbraid(levels=4).relax == ("F", "FCF", "FCF")
    assert s.replace(max_iter=3).max_iter == 3
    with pytest.raises(ValueError, match="`max_iter`"):
        s.replace(max_iter=-2)


def test_too_many_levels_for_the_grid_names_levels():
    with pytest.raises(ValueError, match="`levels`=4 is too many for n_steps=20"):
        solve(_scalar_problem(20), MGRITSettings(levels=4, cfactor=4))


def test_step_with_wrong_shape_names_step():
    p = _scalar_problem(step=lambda u, a, b: np.concatenate([u, u]))
    with pytest.raises(ValueError, match=r"`step` returned \(2,\) for start=0, stop=1"):
        solve(p, MGRITSettings())
    with pytest.raises(ValueError, match="`step`"):
        sequential_solve(_scalar_problem(step=lambda u, a, b: float(u[0])))


@pytest.mark.parametrize(
    "kwargs, err, name",
    [
        (dict(n_steps=0), ValueError, "n_steps"),
        (dict(n_steps=2.5), ValueError, "n_steps"),
        (dict(u0="x"), TypeError, "u0"),
        (dict(step=3), TypeError, "step"),
        (dict(g=np.zeros((5, 1))), ValueError, "g"),
        (dict(t=np.ones(17)), ValueError, "t"),
        (dict(t=np.linspace(0, 1, 5)), ValueError, "t"),
        (dict(direction="sideways"), ValueError, "direction"),
    ],
)
def test_bad_problem_names_the_field(kwargs, err, name):
    base = dict(step=lambda u, a, b: u, u0=np.zeros(1), n_steps=16)
    base.update(kwargs)
    with pytest.raises(err, match=f"`{name}`"):
        Problem(**base)


def test_solve_rejects_bad_arguments_by_name():
    p = _scalar_problem()
    with pytest.raises(ValueError, match="`u_init`"):
        solve(p, MGRITSettings(), u_init=np.zeros((16, 1)))
    with pytest.raises(TypeError, match="`settings`"):
        solve(p, {"levels": 2})
    with pytest.raises(TypeError, match="`comm`"):
        solve(p, MGRITSettings(), comm=object())
    with pytest.raises(TypeError, match="`problem`"):
        solve(lambda u, a, b: u, MGRITSettings())


def test_problem_protocol_objects_and_step_objects_are_accepted():
    class Decay:
        def step(self, u, start, stop):
            return u * 0.5 ** (stop - start)

    class MyProblem:
        step = Decay().step
        u0 = np.array([1.0])
        n_steps = 8

    p = as_problem(MyProblem())
    np.testing.assert_allclose(sequential_solve(p)[:, 0], 0.5 ** np.arange(9))
    q = Problem(Decay(), np.array([1.0]), 8)  # an object with a `step` method
    np.testing.assert_allclose(solve(q, MGRITSettings(abs_tol=1e-14)).solution, sequential_solve(p))
    assert Problem(lambda u, a, b: u, 2.0, 3).u0.shape == ()  # numbers become 0-d arrays


def test_sequential_solve_is_forward_substitution_in_both_directions():
    g = np.arange(6.0)[:, None]
    fwd = Problem(lambda u, a, b: 2 * u, np.array([1.0]), 5, g=g)
    u = sequential_solve(fwd)[:, 0]
    expected = [1.0]
    for i in range(1, 6):
        expected.append(2 * expected[-1] + g[i, 0])
    np.testing.assert_array_equal(u, expected)
    calls = []
    def spy(u, a, b):
        calls.append((a, b))
        return 2 * u

    bwd = Problem(spy, np.array([1.0]), 5, g=g, direction="backward")
    lam = sequential_solve(bwd)[:, 0]
    assert calls == [(5, 4), (4, 3), (3, 2), (2, 1), (1, 0)]  # start > stop
    expected = [1.0]
    for i in range(4, -1, -1):
        expected.append(2 * expected[-1] + g[i, 0])
    np.testing.assert_array_equal(lam, expected[::-1])
