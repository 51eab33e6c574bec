"""The layer-parallel gradient with batched network steps equals the per-step one, bit for bit.

Oracle: the same gradient with the propagators' ``batched_step`` off (``batchable`` patched
to False: MGRIT then calls the layer's step per interval, the reference path). The dense
step's batched forward and adjoint do each row's floating-point operations as the per-step
calls do on the NumPy backend, so gradients, trajectories and records are identical.
"""

import numpy as np
import pytest

import refbraid.layer_parallel as lp
from refbraid import Network, backprop, init_params
from refbraid.layer_parallel import LayerParallelSettings, layer_parallel_gradient
from refbraid.layers import Classifier, DenseLift, DenseStep
from refbraid.parallel import run_ranks


def _case(n_layers=37, width=6, batch=5, act="tanh", dtype=np.float64):
    net = Network(DenseLift(3, width), DenseStep(width, act), Classifier((width,), 4),
                  n_layers, 2.0)
    rng = np.random.default_rng(0)
    params = {k: v.astype(dtype) for k, v in init_params(net, 0).items()}
    return net, params, rng.standard_normal((batch, 3)).astype(dtype), rng.integers(0, 4, batch)


SETTINGS = [
    LayerParallelSettings(),  # TorchBraid's defaults
    LayerParallelSettings.with_iterations(3, 2, levels=3, cfactor=2, skip_first_down=True),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=["torchbraid", "L3-m2"])
@pytest.mark.parametrize("act,dtype", [("tanh", np.float64), ("relu", np.float64),
                                       ("tanh", np.float32)], ids=["tanh", "relu", "float32"])
def test_batched_gradient_is_bit_identical_to_per_step(monkeypatch, settings, act, dtype):
    net, params, x, y = _case(act=act, dtype=dtype)
    assert lp.batchable(net, lp.get_backend("numpy"))
    loss_b, g_b, info_b = layer_parallel_gradient(net, params, x, y, settings)
    monkeypatch.setattr(lp, "batchable", lambda net, bk: False)
    loss_p, g_p, info_p = layer_parallel_gradient(net, params, x, y, settings)
    assert loss_b == loss_p
    for k in g_p:
        np.testing.assert_array_equal(g_b[k], g_p[k], err_msg=k)
    np.testing.assert_array_equal(info_b.states, info_p.states)
    np.testing.assert_array_equal(info_b.adjoints, info_p.adjoints)
    assert info_b.stats() == info_p.stats()
    assert all(g.dtype == dtype for g in g_b.values()) and info_b.states.dtype == dtype


def test_batched_gradient_converges_to_backprop():
    net, params, x, y = _case()
    s = LayerParallelSettings.with_iterations(12, 12, levels=3, cfactor=2)
    _, g, _ = layer_parallel_gradient(net, params, x, y, s)
    _, g_ref, _ = backprop(net, params, x, y)
    for k in g_ref:
        np.testing.assert_allclose(g[k], g_ref[k], rtol=1e-9, atol=1e-12, err_msg=k)


def test_batched_forward_solve_on_thread_ranks_equals_serial():
    net, params, x, _ = _case(n_layers=67)  # 4 coarsest intervals on 3 ranks: uneven
    s = LayerParallelSettings().forward

    def body(comm):
        from refbraid.mgrit import Problem, gather_solution, solve
        from refbraid.network import group

        y0, _ = net.opening.forward(group(params, "opening"), x, lp.get_backend("numpy"))
        prop = lp.CachingForward(net, group(params, "steps"), lp.get_backend("numpy"))
        res = solve(Problem(prop, y0, net.n_layers), s, comm=comm)
        return gather_solution(res, comm)

    serial = run_ranks(1, body)[0]
    np.testing.assert_array_equal(run_ranks(3, body)[0], serial)
