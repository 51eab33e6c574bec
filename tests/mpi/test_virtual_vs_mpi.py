"""The virtual cluster runs the MPI program: same P, same D, the same gradient bits.

Under ``mpiexec -n P`` (P = 1..4, tests/test_mpi_launch.py) every data-parallel split D of P
runs :class:`DistributedGradient` over MPI and, on world rank 0,
:func:`~refbraid.scaling.virtual_training.simulate_distributed_gradient` with P virtual ranks
and the same D; the gradients and losses must be identical (sharded and replicated mode,
dense and conv networks, 40 coarsest intervals: uneven blocks for P = 3).
"""

import numpy as np
import pytest

from refbraid.distributed.network import distributed_gradient
from refbraid.layer_parallel import LayerParallelSettings
from refbraid.models import build_network
from refbraid.network import init_params
from refbraid.scaling.virtual_training import simulate_distributed_gradient

SETTINGS = LayerParallelSettings.with_iterations(2, 1, levels=2, cfactor=4)


@pytest.mark.parametrize("kind", ["resnet", "conv"])
def test_virtual_gradient_equals_the_mpi_gradient_bit_for_bit(world, kind):
    if kind == "resnet":
        net, B = build_network("resnet", (2,), 5, 160, 4, 3.0, "tanh"), 7
    else:
        net, B = build_network("conv", (1, 5, 5), 3, 48, 2, 1.0, "relu"), 5
    params = init_params(net, 0)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((B, *net.opening.in_shape))
    y = rng.integers(0, net.closing.out_shape[0], B)
    for D in [d for d in range(1, world.size + 1) if world.size % d == 0]:
        grad = distributed_gradient(net, SETTINGS, data_parallel=D)
        loss_r, g_r, _ = grad(params, x, y)
        loss_s, g_s, _ = grad.sharded(grad.shard(params), x, y)
        full = grad.gather(g_s)
        if world.rank != 0:
            continue
        for sharded, loss, g in ((True, loss_s, full), (False, loss_r, g_r)):
            v = simulate_distributed_gradient(net, params, x, y, world.size, D, SETTINGS,
                                              costs=1.0, alpha=1e-6, sharded=sharded)
            assert v.loss == loss, f"D={D} sharded={sharded}"
            for k in g:
                np.testing.assert_array_equal(v.grads[k], g[k], err_msg=f"{k} D={D} {sharded}")
