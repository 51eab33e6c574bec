"""Spatial transfers R, P (refbraid.mgrit.spatial): exact transposes, consistency, errors."""

import numpy as np
import pytest

from refbraid.mgrit import spatial

SHAPES = {1: (3, 8), 2: (2, 3, 6, 4), 3: (2, 2, 4, 6, 4)}


def _coarse(shape, dims):
    return shape[:-dims] + tuple(n // 2 for n in shape[-dims:])


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("kind", spatial.RESTRICTIONS)
def test_restriction_transpose_dot_product(dims, kind):
    rng = np.random.default_rng(dims)
    x = rng.standard_normal(SHAPES[dims])
    y = rng.standard_normal(_coarse(SHAPES[dims], dims))
    lhs = np.vdot(spatial.restrict(x, kind, dims), y)
    rhs = np.vdot(x, spatial.restrict_adjoint(y, kind, dims))
    assert abs(lhs - rhs) <= 1e-13 * max(1.0, abs(lhs)), (kind, dims, lhs, rhs)


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("kind", spatial.INTERPOLATIONS)
def test_interpolation_transpose_dot_product(dims, kind):
    rng = np.random.default_rng(10 + dims)
    v = rng.standard_normal(_coarse(SHAPES[dims], dims))
    x = rng.standard_normal(SHAPES[dims])
    lhs = np.vdot(spatial.interpolate(v, kind, dims), x)
    rhs = np.vdot(v, spatial.interpolate_adjoint(x, kind, dims))
    assert abs(lhs - rhs) <= 1e-13 * max(1.0, abs(lhs)), (kind, dims, lhs, rhs)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_transposes_against_dense_matrices(dims):
    """Build every operator as a matrix column by column; its transpose is the adjoint's."""
    fine = SHAPES[dims][-dims:]
    coarse = tuple(n // 2 for n in fine)
    eye_f, eye_c = np.eye(int(np.prod(fine))), np.eye(int(np.prod(coarse)))
    for kind in spatial.RESTRICTIONS:
        R = np.stack([spatial.restrict(e.reshape(fine), kind, dims).ravel() for e in eye_f], 1)
        Rt = np.stack([spatial.restrict_adjoint(e.reshape(coarse), kind, dims).ravel()
                       for e in eye_c], 1)
        np.testing.assert_allclose(Rt, R.T, atol=1e-15)
    for kind in spatial.INTERPOLATIONS:
        P = np.stack([spatial.interpolate(e.reshape(coarse), kind, dims).ravel() for e in eye_c],
                     1)
        Pt = np.stack([spatial.interpolate_adjoint(e.reshape(fine), kind, dims).ravel()
                       for e in eye_f], 1)
        np.testing.assert_allclose(Pt, P.T, atol=1e-15)


@pytest.mark.parametrize("dims", [2, 3])
def test_consistency_relations(dims):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(SHAPES[dims])
    v = rng.standard_normal(_coarse(SHAPES[dims], dims))
    # P_constant = 2^d R_averageᵀ and R_average P_constant = I
    np.testing.assert_allclose(spatial.interpolate(v, "constant", dims),
                               2**dims * spatial.restrict_adjoint(v, "average", dims))
    np.testing.assert_allclose(spatial.restrict(spatial.interpolate(v, "constant", dims),
                                                "average", dims), v)
    # full weighting is P_linearᵀ / 2^d; both preserve constants
    np.testing.assert_allclose(spatial.restrict(x, "full_weighting", dims),
                               spatial.interpolate_adjoint(x, "linear", dims) / 2**dims)
    ones_f, ones_c = np.ones(SHAPES[dims]), np.ones(v.shape)
    for kind in spatial.RESTRICTIONS:
        np.testing.assert_allclose(spatial.restrict(ones_f, kind, dims), ones_c)
    for kind in spatial.INTERPOLATIONS:
        np.testing.assert_allclose(spatial.interpolate(ones_c, kind, dims), ones_f)


def test_linear_interpolation_is_exact_for_linear_functions_inside():
    """Cell centres of the coarse grid sit at 2j + ½ in fine cell units."""
    j = np.arange(4.0)
    v = 2 * j + 0.5  # f(x) = x at coarse centres
    fine = spatial.interpolate(v, "linear", dims=1)
    np.testing.assert_allclose(fine[1:-1], np.arange(8.0)[1:-1])


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="even extents"):
        spatial.restrict(np.zeros((2, 5, 4)), "average", 2)
    with pytest.raises(ValueError, match="`restriction`"):
        spatial.restrict(np.zeros((4, 4)), "bogus", 2)
    with pytest.raises(ValueError, match="`interpolation`"):
        spatial.interpolate(np.zeros((4, 4)), "cubic", 2)


def test_array_api_strict_namespace():
    xps = pytest.importorskip("array_api_strict")
    x = np.random.default_rng(0).standard_normal((2, 4, 4))
    for kind in spatial.INTERPOLATIONS:
        got = spatial.interpolate_adjoint(xps.asarray(x), kind, 2)
        np.testing.assert_allclose(np.asarray(got), spatial.interpolate_adjoint(x, kind, 2))
