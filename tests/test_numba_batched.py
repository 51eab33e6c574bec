"""The numba backend's batched dense step equals its per-step path bit for bit.

Oracles: (1) k calls of ``DenseStep.forward`` / ``.adjoint`` on the numba backend (the
per-step path MGRIT takes without batched steps); (2) the NumPy reference, to round-off;
(3) the whole layer-parallel gradient with the propagators' ``batched_step`` off
(``batchable`` patched to False), bit for bit, and on strided (non-contiguous) inputs.
"""

import numpy as np
import pytest

import refbraid.layer_parallel as lp
from refbraid import Network, get_backend, init_params
from refbraid.backends import numba_cpu_batched, with_host_arrays
from refbraid.backends.device_batching import sweeps_batched
from refbraid.layer_parallel import LayerParallelSettings, layer_parallel_gradient
from refbraid.layers import Classifier, DenseLift, DenseStep

ACTS = ["tanh", "relu", "gelu", "identity"]
DTYPES = [np.float64, np.float32]
TOL = {np.float64: 1e-13, np.float32: 2e-5}


def _stack(rng, k=7, B=5, C=6, dtype=np.float64):
    W = rng.uniform(-1, 1, (k, C, C)).astype(dtype)
    b = rng.uniform(-1, 1, (k, C)).astype(dtype)
    Y = rng.standard_normal((k, B, C)).astype(dtype)
    dY = rng.standard_normal((k, B, C)).astype(dtype)
    return {"W": W, "b": b}, Y, dY, rng.uniform(0.01, 0.3, k)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("act", ACTS)
def test_batched_step_equals_numba_per_step_and_reference(act, dtype):
    rng = np.random.default_rng(3)
    nb, ref = get_backend("numba"), get_backend("numpy")
    layer = DenseStep(6, act)
    params, Y, dY, h = _stack(rng, dtype=dtype)
    assert numba_cpu_batched.applies(act, Y, params["W"], params["b"])
    Y_next, Z = layer.forward_batched(params, Y, h, nb)
    dY_prev, d = layer.adjoint_batched(params, Y, Z, dY, h, nb)
    for j in range(Y.shape[0]):
        p = {k: v[j] for k, v in params.items()}
        y_next, cache = layer.forward(p, Y[j], float(h[j]), nb)
        dy, dp = layer.adjoint(p, cache, dY[j], float(h[j]), nb)
        np.testing.assert_array_equal(Y_next[j], y_next)
        np.testing.assert_array_equal(Z[j], cache[1])
        np.testing.assert_array_equal(dY_prev[j], dy)
        for k in dp:
            np.testing.assert_array_equal(d[k][j], dp[k], err_msg=k)
    R_next, RZ = layer.forward_batched(params, Y, h, ref)
    R_prev, Rd = layer.adjoint_batched(params, Y, RZ, dY, h, ref)
    for got, want in [(Y_next, R_next), (dY_prev, R_prev), (d["W"], Rd["W"]), (d["b"], Rd["b"])]:
        assert got.dtype == want.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype])
    no_grads, none = layer.adjoint_batched(params, Y, Z, dY, h, nb, grads=False)
    assert none is None
    np.testing.assert_array_equal(no_grads, dY_prev)


def test_strided_inputs_take_the_fused_kernels_with_the_same_bits():
    rng = np.random.default_rng(4)
    nb = get_backend("numba")
    layer = DenseStep(6, "relu")
    params, Y, dY, h = _stack(rng, k=8, dtype=np.float32)
    Ys, dYs = Y[::2], dY[::2]  # non-contiguous views
    ps = {k: v[::2] for k, v in params.items()}
    assert not Ys.flags.c_contiguous and numba_cpu_batched.applies("relu", Ys, ps["W"])
    a_next, aZ = layer.forward_batched(ps, Ys, h[::2], nb)
    b_next, bZ = layer.forward_batched({k: v.copy() for k, v in ps.items()}, Ys.copy(),
                                       h[::2].copy(), nb)
    np.testing.assert_array_equal(a_next, b_next)
    a_prev, _ = layer.adjoint_batched(ps, Ys, aZ, dYs, h[::2], nb)
    b_prev, _ = layer.adjoint_batched(ps, Ys.copy(), bZ, dYs.copy(), h[::2], nb)
    np.testing.assert_array_equal(a_prev, b_prev)


def test_other_inputs_fall_back_to_the_array_api_code():
    assert not numba_cpu_batched.applies("tanh", np.zeros((2, 3), np.float32), np.zeros(2))
    assert not numba_cpu_batched.applies("tanh", np.zeros((2, 3), np.int64))
    assert not numba_cpu_batched.applies("tanh", np.zeros((2, 3)), [[0.0, 0.0]])
    nb, layer = get_backend("numba"), DenseStep(3, "tanh")  # float32 weights, float64 states:
    rng = np.random.default_rng(5)  # the array-API code promotes, as the per-step path does
    params, Y, _, h = _stack(rng, k=2, C=3, dtype=np.float32)
    Y_next, _ = layer.forward_batched(params, Y.astype(np.float64), h, nb)
    assert Y_next.dtype == np.float64


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("act", ["tanh", "relu"])
def test_layer_parallel_gradient_on_numba_is_bit_identical_batched_or_not(monkeypatch, act,
                                                                          dtype):
    net = Network(DenseLift(3, 6), DenseStep(6, act), Classifier((6,), 4), 37, 2.0)
    rng = np.random.default_rng(0)
    params = {k: v.astype(dtype) for k, v in init_params(net, 0).items()}
    x, y = rng.standard_normal((5, 3)).astype(dtype), rng.integers(0, 4, 5)
    settings = LayerParallelSettings()
    assert lp.batchable(net, get_backend("numba"))
    loss_b, g_b, info_b = layer_parallel_gradient(net, params, x, y, settings, bk="numba")
    loss_r, g_r, _ = layer_parallel_gradient(net, params, x, y, settings, bk="numpy")
    monkeypatch.setattr(lp, "batchable", lambda net, bk: False)
    loss_p, g_p, info_p = layer_parallel_gradient(net, params, x, y, settings, bk="numba")
    assert loss_b == loss_p
    for k in g_p:
        np.testing.assert_array_equal(g_b[k], g_p[k], err_msg=k)
        np.testing.assert_allclose(g_b[k], g_r[k], rtol=TOL[dtype], atol=TOL[dtype], err_msg=k)
    np.testing.assert_array_equal(info_b.states, info_p.states)
    np.testing.assert_array_equal(info_b.adjoints, info_p.adjoints)
    assert info_b.stats() == info_p.stats()


# ----------------------------------------------------------------------------- cuda backend
@pytest.mark.parametrize("shape", [(3, 4, 5), (2, 16, 16)], ids=["per-element", "tiled"])
@pytest.mark.parametrize("act,dtype", [("tanh", np.float64), ("relu", np.float32),
                                       ("gelu", np.float32)])
def test_cuda_batched_step_equals_cuda_per_step(shape, act, dtype):
    """The cuda backend (in the simulator on CI: sizes ≤ 16) batched against per step."""
    pytest.importorskip("numba.cuda")
    from refbraid.backends import numba_cuda_batched

    k, B, C = shape
    bk = with_host_arrays(get_backend("cuda"))  # NumPy arrays: the batched kernels' case
    rng = np.random.default_rng(6)
    layer = DenseStep(C, act)
    params, Y, dY, h = _stack(rng, k=k, B=B, C=C, dtype=dtype)
    assert numba_cuda_batched.applies(act, Y, params["W"], params["b"])
    Y_next, Z = layer.forward_batched(params, Y, h, bk)
    dY_prev, d = layer.adjoint_batched(params, Y, Z, dY, h, bk)
    for j in range(k):
        p = {n: v[j] for n, v in params.items()}
        y_next, cache = layer.forward(p, Y[j], float(h[j]), bk)
        dy, dp = layer.adjoint(p, cache, dY[j], float(h[j]), bk)
        np.testing.assert_array_equal(Y_next[j], y_next)
        np.testing.assert_array_equal(Z[j], cache[1])
        np.testing.assert_array_equal(dY_prev[j], dy)
        for n in dp:
            np.testing.assert_array_equal(d[n][j], dp[n], err_msg=n)
    R_next, _ = layer.forward_batched(params, Y, h, get_backend("numpy"))
    np.testing.assert_allclose(Y_next, R_next, rtol=TOL[dtype], atol=TOL[dtype])


def test_layer_parallel_gradient_on_cuda_is_bit_identical_batched_or_not(monkeypatch):
    """Per step (forced off) and batched (the cuda default, by launch counts): the gradient
    keeps its bits."""
    pytest.importorskip("numba.cuda")
    net = Network(DenseLift(3, 4), DenseStep(4, "tanh"), Classifier((4,), 3), 8, 1.0)
    rng = np.random.default_rng(0)
    params = init_params(net, 0)
    x, y = rng.standard_normal((3, 3)), rng.integers(0, 3, 3)
    settings = LayerParallelSettings.with_iterations(1, 1, levels=2, cfactor=2, min_coarse=1)
    bk = with_host_arrays(get_backend("cuda"))  # NumPy arrays: the batched kernels' case
    assert lp.batchable(net, bk)
    with sweeps_batched(False):
        loss_p, g_p, _ = layer_parallel_gradient(net, params, x, y, settings, bk=bk)
    loss_b, g_b, _ = layer_parallel_gradient(net, params, x, y, settings, bk=bk)
    assert loss_b == loss_p
    for k in g_p:
        np.testing.assert_array_equal(g_b[k], g_p[k], err_msg=k)
    _, g_n, _ = layer_parallel_gradient(net, params, x, y, settings, bk="numpy")  # batched
    for k in g_n:  # the cuda batched gradient against NumPy's: round-off (float64)
        np.testing.assert_allclose(g_b[k], g_n[k], rtol=1e-12, atol=1e-14, err_msg=k)


def test_cuda_batched_sweeps_are_on_by_launch_counts():
    """refbraid.backends.device_batching: one launch set per sweep issues fewer launches per
    gradient (tests/test_launch_count.py counts it); the catalogue kernels are the cuda
    backend's own."""
    pytest.importorskip("numba.cuda")
    from refbraid.backends import numba_cuda_batched

    assert numba_cuda_batched.SWITCHED_ON is True
    bk = get_backend("cuda")
    assert bk.dense_step_batched is numba_cuda_batched.dense_step_batched
    assert {"dense_step_batched", "dense_step_batched_adjoint"} <= set(bk.overrides)
