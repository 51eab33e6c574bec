"""Data × space × depth (refbraid/distributed/space.py) against one process, every split
that divides.

For the world size this runs under (1..4) and every D, S with D·S | P (Q = P/(D·S) layer
ranks): the loss and gradient equal the single-process layer-parallel gradient with the same
MGRIT settings, and with one MGRIT level sequential backprop, to round-off (≤ 1e-12).
"""

import numpy as np
import pytest

from refbraid.distributed.space import space_depth_gradient
from refbraid.errors import CollectiveError
from refbraid.layer_parallel import LayerParallelSettings, layer_parallel_gradient
from refbraid.models import build_network
from refbraid.network import backprop, init_params

TOL = 1e-12
SETTINGS = {"exact": LayerParallelSettings.exact(),
            "mgrit-L2": LayerParallelSettings.with_iterations(2, 2, levels=2, cfactor=2,
                                                              min_coarse=1)}


def _splits(P):
    return [(d, s) for d in range(1, P + 1) for s in range(1, P + 1) if P % (d * s) == 0]


def _max_rel(a, b):
    return float(np.abs(a - b).max()) / max(float(np.abs(b).max()), 1e-300)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_every_split_equals_one_process(world, name):
    settings = SETTINGS[name]
    net = build_network("conv", (1, 5, 4), 3, 8, 2, 1.0, "tanh")
    params = init_params(net, 0)
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((6, 1, 5, 4)), rng.integers(0, 3, 6)
    if name == "exact":
        loss, grads, _ = backprop(net, params, x, y)
    else:
        loss, grads, _ = layer_parallel_gradient(net, params, x, y, settings)
    for d, s in _splits(world.size):
        gradient = space_depth_gradient(net, settings, data_parallel=d, space_parallel=s)
        got_loss, got, _ = gradient(params, x, y)
        assert abs(got_loss - loss) <= TOL * abs(loss), (d, s)
        for k in grads:
            assert _max_rel(got[k], grads[k]) <= TOL, (d, s, k, _max_rel(got[k], grads[k]))


def test_bad_three_way_splits(world):
    net = build_network("conv", (1, 3, 4), 3, 8, 2, 1.0, "tanh")
    with pytest.raises(CollectiveError, match="does not divide"):
        space_depth_gradient(net, data_parallel=world.size + 1)
    with pytest.raises(CollectiveError, match="the images have 3 rows"):
        space_depth_gradient(net, space_parallel=4 * world.size)
    dense = build_network("resnet", (2,), 3, 8, 2, 1.0, "tanh")
    with pytest.raises(CollectiveError, match="needs the conv model"):
        space_depth_gradient(dense)
