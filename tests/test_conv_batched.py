"""The batched conv step (k steps at once, per-interval weights) equals k per-step calls, bit
for bit, passes the adjoint checks, and gives the layer-parallel gradient of the per-step path.

Oracles: the NumPy reference ``conv2d`` / ``conv2d_adjoint`` row by row; ``ConvStep.forward``
/ ``adjoint`` row by row; the dot-product test and central differences of
:func:`refbraid.verify.checks.check_op` (complex-step tangent on the batched map itself); the
layer-parallel gradient with ``batchable`` patched to False (MGRIT then calls the per-step
path) and, on thread ranks with uneven blocks, the one-rank run.
"""

from dataclasses import dataclass

import numpy as np
import pytest

import refbraid.layer_parallel as lp
from refbraid import Network, init_params
from refbraid.backends import get_backend
from refbraid.backends import reference as ref
from refbraid.backends.reference_batched import conv2d_adjoint_batched, conv2d_batched
from refbraid.layer_parallel import LayerParallelSettings, layer_parallel_gradient
from refbraid.layers import Classifier, ConvLift, ConvStep
from refbraid.mgrit import MGRITSettings
from refbraid.mgrit.transfer import SpatialCoarsening
from refbraid.parallel import run_ranks
from refbraid.verify.checks import check_op

BK = get_backend("numpy")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("k,B,C,O,H,Wd", [(3, 2, 4, 4, 7, 5), (1, 3, 2, 5, 6, 6),
                                          (4, 1, 3, 3, 4, 9)])
def test_batched_kernels_are_bit_identical_to_the_reference_per_row(dtype, k, B, C, O, H, Wd):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((k, B, C, H, Wd)).astype(dtype)
    W = rng.standard_normal((k, O, C, 3, 3)).astype(dtype)
    b = rng.standard_normal((k, O)).astype(dtype)
    dZ = rng.standard_normal((k, B, O, H, Wd)).astype(dtype)
    Z = conv2d_batched(X, W, b)
    dX, dW, db = conv2d_adjoint_batched(X, W, dZ)
    dX_only, none_W, none_b = conv2d_adjoint_batched(X, W, dZ, grads=False)
    assert none_W is None and none_b is None
    np.testing.assert_array_equal(dX_only, dX)
    for j in range(k):
        np.testing.assert_array_equal(Z[j], ref.conv2d(X[j], W[j], b[j]), err_msg=f"Z row {j}")
        want = ref.conv2d_adjoint(X[j], W[j], dZ[j])
        for name, got, w in zip(("dX", "dW", "db"), (dX[j], dW[j], db[j]), want, strict=True):
            np.testing.assert_array_equal(got, w, err_msg=f"{name} row {j}")
    assert Z.dtype == dX.dtype == dW.dtype == db.dtype == dtype


@pytest.mark.parametrize("act,dtype", [("relu", np.float64), ("tanh", np.float64),
                                       ("relu", np.float32)])
def test_conv_step_batched_equals_per_step_bit_for_bit(act, dtype):
    layer = ConvStep(3, 5, 4, act)
    rng = np.random.default_rng(2)
    k = 4
    per = [{n: v.astype(dtype) for n, v in layer.init(rng).items()} for _ in range(k)]
    params = {n: np.stack([p[n] for p in per]) for n in per[0]}
    Y = rng.standard_normal((k, 2, 3, 5, 4)).astype(dtype)
    dY = rng.standard_normal(Y.shape).astype(dtype)
    h = np.array([0.1, 0.25, 0.1, 0.4])
    Y_next, Z = layer.forward_batched(params, Y, h, BK)
    dY_prev, d = layer.adjoint_batched(params, Y, Z, dY, h, BK)
    dY_only, none = layer.adjoint_batched(params, Y, Z, dY, h, BK, grads=False)
    assert none is None
    np.testing.assert_array_equal(dY_only, dY_prev)
    for j in range(k):
        y_next, cache = layer.forward(per[j], Y[j], float(h[j]), BK)
        np.testing.assert_array_equal(Y_next[j], y_next)
        np.testing.assert_array_equal(Z[j], cache[1])
        dy, dp = layer.adjoint(per[j], cache, dY[j], float(h[j]), BK)
        np.testing.assert_array_equal(dY_prev[j], dy)
        for n in dp:
            np.testing.assert_array_equal(d[n][j], dp[n], err_msg=f"d{n} row {j}")


@dataclass(frozen=True)
class BatchedStepOp:
    """The k-row map ``Y_next = Φ_batched(θ, Y)`` at fixed step sizes, as an op the checks of
    refbraid.verify.checks take (forward, adjoint with the parameter gradients)."""

    step: ConvStep
    h: tuple
    input_name = "y"
    differentiate_input = True

    def forward(self, params, Y, bk):
        Y_next, Z = self.step.forward_batched(params, Y, np.asarray(self.h), bk)
        return Y_next, (Y, Z)

    def adjoint(self, params, cache, dY_next, bk):
        Y, Z = cache
        return self.step.adjoint_batched(params, Y, Z, dY_next, np.asarray(self.h), bk)


@pytest.mark.parametrize("act", ["tanh", "relu"])
def test_batched_conv_adjoint_passes_dot_product_and_finite_differences(act):
    layer = ConvStep(2, 4, 5, act)
    rng = np.random.default_rng(3)
    k = 3
    per = [layer.init(rng) for _ in range(k)]
    params = {n: np.stack([p[n] for p in per]) for n in per[0]}
    Y = rng.standard_normal((k, 2, 2, 4, 5))
    results = check_op(BatchedStepOp(layer, (0.3, 0.1, 0.2)), f"ConvStep batched {act}",
                       params, Y, "numpy", np.float64, n_fd=6)
    checks = {r.check for r in results}
    assert {"dot:y", "dot:W", "dot:b", "fd:y", "fd:W", "fd:b"} <= checks
    bad = [f"{r.check}: {r.detail}" for r in results if not r.passed]
    assert not bad, bad


def _conv_case(n_layers=37, dtype=np.float64, H=6, Wd=5):
    net = Network(ConvLift(1, 2, H, Wd, "relu"), ConvStep(2, H, Wd, "relu"),
                  Classifier((2, H, Wd), 3), n_layers, 1.0)
    rng = np.random.default_rng(0)
    params = {k: v.astype(dtype) for k, v in init_params(net, 0).items()}
    x = rng.standard_normal((3, 1, H, Wd)).astype(dtype)
    return net, params, x, rng.integers(0, 3, 3)


def _spatial() -> LayerParallelSettings:
    """TorchBraid's hierarchy with level 1 on half-resolution images (FCF there, as needed):
    the adjoint's coarse steps linearise at R y, so they take the per-step fallback."""
    fcf = dict(relax="FCF", abs_tol=None, rel_tol=None)
    return LayerParallelSettings(MGRITSettings.torchbraid(max_iter=1, **fcf),
                                 MGRITSettings.torchbraid(max_iter=1, **fcf),
                                 spatial=SpatialCoarsening((1,)))


@pytest.mark.parametrize("dtype,spatial", [(np.float64, False), (np.float32, False),
                                           (np.float64, True)],
                         ids=["float64", "float32", "spatial"])
def test_conv_layer_parallel_gradient_batched_is_bit_identical_to_per_step(monkeypatch, dtype,
                                                                           spatial):
    net, params, x, y = _conv_case(dtype=dtype, H=8, Wd=6)
    settings = _spatial() if spatial else LayerParallelSettings()
    assert not lp.batchable(net, BK)  # off by default: it does not pay on the CPU
    monkeypatch.setattr(ConvStep, "batched_sweeps_pay", True)
    assert lp.batchable(net, BK)
    loss_b, g_b, info_b = layer_parallel_gradient(net, params, x, y, settings)
    monkeypatch.setattr(lp, "batchable", lambda net, bk: False)
    loss_p, g_p, info_p = layer_parallel_gradient(net, params, x, y, settings)
    assert loss_b == loss_p
    for name in g_p:
        np.testing.assert_array_equal(g_b[name], g_p[name], err_msg=name)
    np.testing.assert_array_equal(info_b.states, info_p.states)
    np.testing.assert_array_equal(info_b.adjoints, info_p.adjoints)
    assert info_b.stats() == info_p.stats()


def test_conv_batched_forward_solve_on_uneven_thread_ranks_equals_one_rank(monkeypatch):
    monkeypatch.setattr(ConvStep, "batched_sweeps_pay", True)
    net, params, x, _ = _conv_case(n_layers=67)  # 5 coarsest intervals on 3 ranks: uneven
    s = LayerParallelSettings().forward

    def body(comm):
        from refbraid.mgrit import Problem, gather_solution, solve
        from refbraid.network import group

        y0, _ = net.opening.forward(group(params, "opening"), x, BK)
        prop = lp.CachingForward(net, group(params, "steps"), BK)
        assert prop.batched_step is not None
        res = solve(Problem(prop, y0, net.n_layers), s, comm=comm)
        return gather_solution(res, comm)

    np.testing.assert_array_equal(run_ranks(3, body)[0], run_ranks(1, body)[0])
