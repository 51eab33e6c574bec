"""Layer-parallel gradients of a conv ODE-net with spatially coarsened MGRIT levels equal
sequential backprop (the converged fixed point is the fine one)."""

import numpy as np
import pytest

from refbraid.layer_parallel import (
    LayerParallelSettings,
    layer_parallel_gradient,
    relative_gradient_error,
)
from refbraid.mgrit import MGRITSettings
from refbraid.mgrit.transfer import SpatialCoarsening
from refbraid.models import build_network
from refbraid.network import backprop, init_params


def _case(n_layers=12):
    net = build_network("conv", (1, 8, 8), 3, n_layers, 3, 1.0)
    params = init_params(net, 0)
    rng = np.random.default_rng(0)
    return net, params, rng.standard_normal((2, 1, 8, 8)), rng.integers(0, 3, 2)


@pytest.mark.parametrize("coarsen,restriction,interp", [
    ((1,), "average", "linear"),
    ((1, 2), "average", "constant"),
    ((2,), "full_weighting", "linear"),
])
def test_converged_spatially_coarsened_gradient_equals_backprop(coarsen, restriction, interp):
    net, params, x, labels = _case()
    loss_ref, ref, _ = backprop(net, params, x, labels)
    ms = MGRITSettings(levels=3, cfactor=2, relax="FCF", max_iter=12, abs_tol=1e-13,
                       rel_tol=None, min_coarse=1)
    sc = SpatialCoarsening(coarsen, restriction, interp)
    loss, grads, info = layer_parallel_gradient(
        net, params, x, labels, LayerParallelSettings(ms, ms, spatial=sc))
    assert info.forward.status == info.backward.status == "converged"
    assert relative_gradient_error(grads, ref) <= 1e-10
    assert abs(loss - loss_ref) <= 1e-12 * abs(loss_ref)


def test_spatial_settings_are_checked():
    with pytest.raises(TypeError, match="`spatial`"):
        LayerParallelSettings(spatial=(1,))
