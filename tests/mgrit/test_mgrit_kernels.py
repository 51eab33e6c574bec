"""The pure MGRIT kernels (relax.py, coarse.py) against their defining formulas, on whole
grids and on blocks with a ghost value."""

import numpy as np
import pytest

from refbraid.mgrit.coarse import (
    apply_operator,
    correct,
    fas_rhs,
    forward_substitution,
    inject_up,
    restrict,
)
from refbraid.mgrit.grid import build_hierarchy
from refbraid.mgrit.relax import c_relax, c_residual, f_relax, propagate_at, take_rows

RNG = np.random.default_rng(7)
D = 3
W = RNG.standard_normal((D, D)) / 3


def step(u, s0, s1):
    """Nonlinear, interval-dependent: Φ(u) = u + (s1 - s0)·0.05·tanh(W u) + 0.01·s0."""
    return u + (s1 - s0) * 0.05 * np.tanh(W @ u) + 0.01 * s0


def level(n=23, m=4):
    lvl = build_hierarchy(n, (m,), 1)[0]
    u = RNG.standard_normal((n + 1, D))
    g = RNG.standard_normal((n + 1, D))
    return lvl, u, g


def test_propagate_and_residual_match_the_formula():
    lvl, u, g = level()
    c_pos = np.flatnonzero(lvl.is_c)
    pu = propagate_at(u, g, lvl.points, c_pos, step)
    for j, k in enumerate(c_pos):
        want = g[0] if k == 0 else step(u[k - 1], k - 1, k) + g[k]
        np.testing.assert_array_equal(pu[j], want)
    r = c_residual(u, g, lvl.points, c_pos, step)
    np.testing.assert_array_equal(r, pu - u[c_pos])
    np.testing.assert_array_equal(c_relax(u, pu, c_pos)[c_pos], pu)


def test_f_relax_steps_through_f_points_and_zeroes_their_residual():
    lvl, u, g = level()
    c_pos, f_pos = np.flatnonzero(lvl.is_c), np.flatnonzero(~lvl.is_c)
    u_before = u.copy()
    v = f_relax(u, g, lvl.points, f_pos, step)
    np.testing.assert_array_equal(u, u_before)  # pure: input untouched
    np.testing.assert_array_equal(v[c_pos], u[c_pos])  # C-points untouched
    for k in f_pos:
        np.testing.assert_array_equal(v[k], step(v[k - 1], k - 1, k) + g[k])
    r_f = propagate_at(v, g, lvl.points, f_pos, step) - v[f_pos]
    assert np.abs(r_f).max() == 0.0


@pytest.mark.parametrize("cut", [4, 8, 20])
def test_blocks_with_a_ghost_equal_the_whole_grid(cut):
    lvl, u, g = level(n=23, m=4)
    pts, is_c = lvl.points, lvl.is_c
    whole_f = f_relax(u, g, pts, np.flatnonzero(~is_c), step)
    whole_r = c_residual(whole_f, g, pts, np.flatnonzero(is_c), step)
    whole_fs = forward_substitution(g, pts, step)
    parts_f, parts_r, parts_fs = [], [], []
    ghost_fs = None
    for sl in (slice(0, cut), slice(cut, len(pts))):
        p, c = pts[sl], is_c[sl]
        assert c[0]  # blocks start at C-points
        ghost_pt = int(pts[sl.start - 1]) if sl.start else None
        f = f_relax(u[sl], g[sl], p, np.flatnonzero(~c), step)
        ghost = parts_f[-1][-1] if parts_f else None
        parts_r.append(c_residual(f, g[sl], p, np.flatnonzero(c), step, ghost, ghost_pt))
        parts_f.append(f)
        parts_fs.append(forward_substitution(g[sl], p, step, ghost_fs, ghost_pt))
        ghost_fs = parts_fs[-1][-1]
    np.testing.assert_array_equal(np.concatenate(parts_f), whole_f)
    np.testing.assert_array_equal(np.concatenate(parts_r), whole_r)
    np.testing.assert_array_equal(np.concatenate(parts_fs), whole_fs)


def test_missing_ghost_is_an_error():
    lvl, u, g = level()
    with pytest.raises(ValueError, match="`ghost`"):
        propagate_at(u[4:], g[4:], lvl.points[4:], [0], step)


def test_forward_substitution_solves_the_level_system():
    lvl, _, g = level()
    u = forward_substitution(g, lvl.points, step)
    np.testing.assert_allclose(apply_operator(u, lvl.points, step), g, rtol=0, atol=1e-14)


def test_fas_correction_solves_the_coarse_residual_equation():
    """Linear Φ: FAS with an exact coarse solve gives B_Δ (w - v) = r (linear MGRIT)."""
    h = build_hierarchy(24, (3,), 1)
    fine, coarse = h[0], h[1]
    M = np.eye(D) + 0.1 * W

    def lin(u, s0, s1):
        return np.linalg.matrix_power(M, s1 - s0) @ u * 0.9

    u = RNG.standard_normal((25, D))
    c_pos = np.flatnonzero(fine.is_c)
    r = RNG.standard_normal((len(c_pos), D))
    v = restrict(u, c_pos)
    np.testing.assert_array_equal(v, take_rows(u, c_pos))
    g_c = fas_rhs(r, v, coarse.points, lin)
    w = forward_substitution(g_c, coarse.points, lin)
    e = w - v
    B_e = apply_operator(e, coarse.points, lin)  # linear: A_Δ(w) - A_Δ(v) = A_Δ(e)
    np.testing.assert_allclose(B_e, r, rtol=0, atol=1e-13)
    u_new = correct(u, c_pos, w, v)
    np.testing.assert_allclose(u_new[c_pos], w, atol=1e-14)
    f_pos = np.flatnonzero(~fine.is_c)
    np.testing.assert_array_equal(u_new[f_pos], u[f_pos])  # F-points wait for the F-sweep
    np.testing.assert_array_equal(inject_up(u, c_pos, w)[c_pos], w)
