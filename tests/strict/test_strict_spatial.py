"""Spatially coarsened layer-parallel gradients (plain and staged networks) and the batched
MGRIT path on the device stand-ins (strict, CuPy-like), each against the same computation on NumPy.

Oracle: the NumPy run in the same test (same seeds, same settings, a fixed number of MGRIT
iterations so that the two runs do the same work): losses, gradients and residual records
agree to round-off, and every gradient lives on the stand-in's device.
"""

import numpy as np
import pytest

from refbraid.backends import get_backend
from refbraid.backends.host import to_host
from refbraid.backends.portable import indexes_with_integer_arrays
from refbraid.layer_parallel import LayerParallelSettings, layer_parallel_gradient
from refbraid.layers import ChannelWiden, Classifier, ConvLift, ConvStep, Pool
from refbraid.mgrit import MGRITSettings, Problem, solve
from refbraid.mgrit.transfer import SpatialCoarsening
from refbraid.models import build_network
from refbraid.network import init_params, to_backend
from refbraid.stages import Stage, StagedNetwork, staged_layer_parallel_gradient
from refbraid.stages import backprop as staged_backprop
from refbraid.stages import init_params as staged_init_params

from .devices import on_device

NUMPY = get_backend("numpy")
TWO_ITERATIONS = MGRITSettings(levels=3, cfactor=2, relax="FCF", abs_tol=None, max_iter=2,
                               min_coarse=1)


def _close(got, want, rtol, what):
    assert on_device(got), what
    np.testing.assert_allclose(to_host(got), want, rtol=rtol, atol=1e-14, err_msg=what)


def _gradients_agree(run, params, x, y, standin, records=True):
    loss, grads, info = run(params, x, y, NUMPY)
    dloss, dgrads, dinfo = run(to_backend(params, standin), standin.asarray(x),
                               standin.asarray(y), standin)
    assert abs(dloss - loss) <= 1e-12 * abs(loss)
    for k in grads:
        _close(dgrads[k], grads[k], 1e-10, k)
    if not records:
        return
    np.testing.assert_allclose(dinfo.forward.norms, info.forward.norms, rtol=1e-10)
    np.testing.assert_allclose(dinfo.backward.norms, info.backward.norms, rtol=1e-10)


@pytest.mark.parametrize("coarsen,restriction,interpolation", [
    ((1,), "average", "linear"),
    ((1, 2), "full_weighting", "constant"),
])
def test_spatially_coarsened_layer_parallel_gradient_equals_numpy(
        standin, coarsen, restriction, interpolation):
    net = build_network("conv", (1, 8, 8), 3, 8, 3, 1.0)
    rng = np.random.default_rng(6)
    x, y = rng.standard_normal((2, 1, 8, 8)), np.array([0, 2])
    sc = SpatialCoarsening(coarsen, restriction, interpolation)
    settings = LayerParallelSettings(TWO_ITERATIONS, TWO_ITERATIONS, spatial=sc)

    def run(params, x, y, bk):
        return layer_parallel_gradient(net, params, x, y, settings, bk)

    _gradients_agree(run, init_params(net, 0), x, y, standin)


def test_staged_network_with_pooling_and_widening_equals_numpy(standin):
    """Stages joined by a 2×2 average pooling and a channel widening, spatially coarsened."""
    net = StagedNetwork(
        ConvLift(1, 2, 8, 8, "tanh"),
        (Stage(ConvStep(2, 8, 8, "tanh"), 4), Stage(ConvStep(2, 4, 4, "tanh"), 3),
         Stage(ConvStep(3, 4, 4, "tanh"), 2)),
        (Pool(2, (8, 8)), ChannelWiden(2, 3, (4, 4), "zeros")),
        Classifier((3, 4, 4), 3),
    )
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((2, 1, 8, 8)), np.array([1, 2])
    settings = LayerParallelSettings(TWO_ITERATIONS, TWO_ITERATIONS,
                                     spatial=SpatialCoarsening((1,)))

    def run(params, x, y, bk):
        return staged_layer_parallel_gradient(net, params, x, y, settings, bk)

    params = staged_init_params(net, 1)
    _gradients_agree(run, params, x, y, standin)
    _gradients_agree(lambda *a: staged_backprop(net, *a), params, x, y, standin, records=False)


def test_a_batched_problem_on_a_device_equals_numpy(standin):
    """The batched sweeps index rows with integer arrays (not in the array API standard): on
    strict arrays MGRIT falls back to the per-step path, on CuPy(-like) arrays it takes batched
    steps; either way the solve equals the batched NumPy solve."""
    rng = np.random.default_rng(3)
    W_host, u0, g = (rng.standard_normal((3, 3)) / 2, rng.standard_normal((2, 3)),
                     rng.standard_normal((13, 2, 3)) / 10)
    calls = {"numpy": 0, standin.name: 0}

    def problem(bk):
        W, xp, h = bk.asarray(W_host), bk.xp, 1.0 / 12

        def step(u, start, stop):
            return u + abs(stop - start) * h * xp.tanh(u @ W.T)

        def batched_step(U, starts, stops):
            calls[bk.name] += 1
            span = bk.asarray(np.abs(stops - starts).astype(float))[:, None, None]
            return U + span * h * xp.tanh(U @ W.T)

        return Problem(step, bk.asarray(u0), 12, g=bk.asarray(g), batched_step=batched_step)

    settings = MGRITSettings(levels=2, cfactor=3, abs_tol=None, max_iter=3, min_coarse=1)
    want, got = solve(problem(NUMPY), settings), solve(problem(standin), settings)
    assert calls["numpy"] > 0
    assert (calls[standin.name] > 0) == indexes_with_integer_arrays(got.solution)
    _close(got.solution, want.solution, 1e-12, "solution")
    assert got.step_counts == want.step_counts


def test_dense_step_batched_kernels_equal_numpy(standin):
    """DenseStep.forward_batched / adjoint_batched (k steps at once) run on the device too;
    only MGRIT's row gathering needs NumPy or CuPy."""
    from refbraid.layers import DenseStep

    layer, rng = DenseStep(3, "tanh"), np.random.default_rng(8)
    params = {"W": rng.standard_normal((4, 3, 3)), "b": rng.standard_normal((4, 3))}
    Y, dY, h = rng.standard_normal((4, 2, 3)), rng.standard_normal((4, 2, 3)), np.full(4, 0.25)

    def run(bk, params, Y, dY):
        Y_next, Z = layer.forward_batched(params, Y, h, bk)
        dY_prev, d = layer.adjoint_batched(params, Y, Z, dY, h, bk)
        return {"Y_next": Y_next, "dY": dY_prev, **d}

    want = run(NUMPY, params, Y, dY)
    got = run(standin, to_backend(params, standin), standin.asarray(Y), standin.asarray(dY))
    for k in want:
        _close(got[k], want[k], 1e-13, k)
