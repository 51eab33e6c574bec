"""The ``cuda`` backend's batched convolution (k intervals per launch) in Numba's CUDA simulator.

Oracles: the NumPy reference batched convolution
(:func:`refbraid.backends.reference_batched.conv2d_batched` / ``conv2d_adjoint_batched``, to
round-off: it sums the nine stencil offsets as GEMMs, in another order); the per-step ``cuda``
kernels row by row (bit for bit: the same sums in the same order); the dot-product test of
the adjoint in float64; ``ConvStep``'s batched methods on ``cuda`` against its per-step ones.
"""

from __future__ import annotations

import numpy as np
import pytest

from refbraid.backends import get_backend
from refbraid.backends import reference_batched as RB
from refbraid.layers import ConvStep

numba = pytest.importorskip("numba")
if not numba.config.ENABLE_CUDASIM:
    pytest.skip("small simulator-sized cases (NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)
pytest.importorskip("numba.cuda")

from refbraid.backends import numba_cuda_conv_batched as NCB  # noqa: E402
from refbraid.verify.result import array_rel_error

TOL = {np.float64: 1e-12, np.float32: 1e-5}
SHAPES = [(3, 2, 2, 3, 4, 5, 3), (1, 1, 1, 2, 1, 1, 3), (2, 1, 3, 1, 3, 2, 1)]  # k,B,C,O,H,W,s


def _args(rng, k, B, C, O, H, Wd, s, dtype):
    r = [rng.standard_normal(shape).astype(dtype)
         for shape in ((k, B, C, H, Wd), (k, O, C, s, s), (k, O), (k, B, O, H, Wd))]
    return r  # X, W, b, dZ



@pytest.fixture(scope="module")
def bk():
    return get_backend("cuda")


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_batched_kernels_match_the_numpy_reference_and_per_step_kernels_bit_for_bit(
        bk, shape, dtype):
    assert "conv2d_batched" in bk.overrides and "conv2d_adjoint_batched" in bk.overrides
    X, W, b, dZ = _args(np.random.default_rng(5), *shape, dtype)
    dev = [bk.asarray(a) for a in (X, W, b, dZ)]
    Z = bk.to_numpy(bk.conv2d_batched(*dev[:3]))
    dX, dW, db = map(bk.to_numpy, bk.conv2d_adjoint_batched(dev[0], dev[1], dev[3]))
    dX_only, none_W, none_b = bk.conv2d_adjoint_batched(dev[0], dev[1], dev[3], grads=False)
    assert none_W is None and none_b is None
    np.testing.assert_array_equal(bk.to_numpy(dX_only), dX)
    wants = (RB.conv2d_batched(X, W, b), *RB.conv2d_adjoint_batched(X, W, dZ))
    for name, got, want in zip(("Z", "dX", "dW", "db"), (Z, dX, dW, db), wants, strict=True):
        assert got.dtype == want.dtype == dtype and got.shape == want.shape, name
        assert array_rel_error(got, want)[0] <= TOL[dtype], name
    for j in range(shape[0]):  # row j: the per-step cuda kernels, the same bits
        row = [bk.asarray(a[j]) for a in (X, W, b, dZ)]
        np.testing.assert_array_equal(Z[j], bk.to_numpy(bk.conv2d(*row[:3])), err_msg=f"Z {j}")
        per_step = bk.conv2d_adjoint(row[0], row[1], row[3])
        for name, got, want in zip(("dX", "dW", "db"), (dX[j], dW[j], db[j]), per_step,
                                   strict=True):
            np.testing.assert_array_equal(got, bk.to_numpy(want), err_msg=f"{name} {j}")


def test_host_arrays_and_no_bias_take_the_kernels_too(bk):
    X, W, _, dZ = _args(np.random.default_rng(6), 2, 1, 2, 2, 3, 3, 3, np.float64)
    Z = bk.conv2d_batched(X, W, None)  # NumPy in: host-array mode, NumPy out
    assert isinstance(Z, np.ndarray)
    assert array_rel_error(Z, RB.conv2d_batched(X, W, None))[0] <= TOL[np.float64]
    for got, want in zip(bk.conv2d_adjoint_batched(X, W, dZ), RB.conv2d_adjoint_batched(X, W, dZ),
                         strict=True):
        assert array_rel_error(got, want)[0] <= TOL[np.float64]


def test_the_adjoint_passes_the_dot_product_test_in_float64(bk):
    """<W*X + b, G> = <X, dX> + <W, dW> ... split by linearity: the map X -> W*X (no bias),
    W -> W*X and b -> b broadcast, each against its part of the adjoint."""
    rng = np.random.default_rng(7)
    X, W, b, G = _args(rng, 3, 2, 2, 3, 4, 5, 3, np.float64)
    X2, W2 = rng.standard_normal(X.shape), rng.standard_normal(W.shape)
    dev = bk.asarray
    dX, dW, db = map(bk.to_numpy, bk.conv2d_adjoint_batched(dev(X), dev(W), dev(G)))
    dX2, dW2, _ = map(bk.to_numpy, bk.conv2d_adjoint_batched(dev(X2), dev(W), dev(G)))
    lhs_x = np.vdot(bk.to_numpy(bk.conv2d_batched(dev(X2), dev(W), None)), G)
    np.testing.assert_allclose(lhs_x, np.vdot(X2, dX2), rtol=1e-12)  # linear in X
    lhs_w = np.vdot(bk.to_numpy(bk.conv2d_batched(dev(X), dev(W2), None)), G)
    np.testing.assert_allclose(lhs_w, np.vdot(W2, dW), rtol=1e-12)  # linear in W
    bias_only = bk.to_numpy(bk.conv2d_batched(dev(X), dev(np.zeros_like(W)), dev(b)))
    np.testing.assert_allclose(np.vdot(bias_only, G), np.vdot(b, db), rtol=1e-12)
    np.testing.assert_array_equal(dX, bk.to_numpy(bk.conv2d_adjoint_batched(
        dev(X), dev(W), dev(G), grads=False)[0]))  # dX does not depend on X


def test_conv_step_batched_on_cuda_equals_its_per_step_calls(bk):
    """ConvStep.forward_batched / adjoint_batched take the batched kernels; the stacked
    convolutions are the per-step kernels' bits (the glue, h σ(Z) + Y, is element-wise)."""
    layer, k = ConvStep(2, 3, 4, "tanh"), 3
    rng = np.random.default_rng(8)
    per = [layer.init(rng) for _ in range(k)]
    params = {n: np.stack([p[n] for p in per]) for n in per[0]}
    Y, dY = rng.standard_normal((k, 2, 2, 3, 4)), rng.standard_normal((k, 2, 2, 3, 4))
    h = np.array([0.25, 0.5, 0.125])
    dev_p = {n: bk.asarray(v) for n, v in params.items()}
    Y_next, Z = layer.forward_batched(dev_p, bk.asarray(Y), h, bk)
    dY_prev, grads = layer.adjoint_batched(dev_p, bk.asarray(Y), Z, bk.asarray(dY), h, bk)
    for j in range(k):
        p = {n: bk.asarray(v[j]) for n, v in params.items()}
        y_next, cache = layer.forward(p, bk.asarray(Y[j]), float(h[j]), bk)
        dy, g = layer.adjoint(p, cache, bk.asarray(dY[j]), float(h[j]), bk)
        np.testing.assert_array_equal(bk.to_numpy(Z)[j], bk.to_numpy(cache[1]))
        np.testing.assert_allclose(bk.to_numpy(Y_next)[j], bk.to_numpy(y_next), rtol=1e-14)
        np.testing.assert_allclose(bk.to_numpy(dY_prev)[j], bk.to_numpy(dy), rtol=1e-14)
        for n in g:
            np.testing.assert_allclose(bk.to_numpy(grads[n])[j], bk.to_numpy(g[n]), rtol=1e-14,
                                       err_msg=n)


@pytest.mark.parametrize(("args", "match"), [
    (lambda X, W, b, dZ: (X[0], W, b), "`X` must be 5-D"),
    (lambda X, W, b, dZ: (X, W[:1], b), "`W` must have shape"),
    (lambda X, W, b, dZ: (X, W, b[:, :1]), "`b` must have shape"),
])
def test_bad_shapes_are_named(bk, args, match):
    X, W, b, dZ = _args(np.random.default_rng(9), 2, 1, 2, 2, 3, 3, 3, np.float64)
    with pytest.raises(ValueError, match=match):
        bk.conv2d_batched(*args(X, W, b, dZ))
    with pytest.raises(ValueError, match="`dZ` must have shape"):
        NCB.conv2d_adjoint_batched(X, W, dZ[:, :, :1])


def test_the_batched_conv_gradient_on_cuda_takes_the_kernels_and_the_numpy_gradient():
    """MGRIT's batched sweeps of the conv network on ``cuda`` (device-resident, on the
    counting device, where they are on): one batched kernel per pass, fewer launches than
    per-step sweeps, and the NumPy backend's batched layer-parallel gradient to round-off
    (the convolutions sum in another order)."""
    from refbraid.backends import launch_count
    from refbraid.backends.device_batching import sweeps_batched
    from refbraid.backends.host import to_host
    from refbraid.network import to_backend
    from refbraid.training.gradients import mgrit_gradient

    per_step = launch_count.gradient_counts("cuda", "conv", 16, "lp-per-step")
    batched = launch_count.gradient_counts("cuda", "conv", 16, "lp-batched")
    assert "_conv_step_rows_kernel" in batched.by_name  # the fused batched step
    assert "_conv2d_dx_rows_kernel" in batched.by_name
    assert batched.launches < per_step.launches
    net, params, x, labels = launch_count.build_model("conv", 16, np.random.default_rng(0))
    settings = launch_count.default_settings()
    with sweeps_batched(True):
        loss, want, _ = mgrit_gradient(net, settings, get_backend("numpy"))(params, x, labels)
    with launch_count.counting("cuda") as cbk, sweeps_batched(True):
        got_loss, got, _ = mgrit_gradient(net, settings, cbk)(to_backend(params, cbk),
                                                              cbk.asarray(x), cbk.asarray(labels))
        got = {k: to_host(v) for k, v in got.items()}
    np.testing.assert_allclose(got_loss, loss, rtol=1e-12)
    for k, v in want.items():
        assert array_rel_error(got[k], v)[0] <= 1e-13, k
