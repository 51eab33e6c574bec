"""The numba backend's whole conv ODE step (refbraid/backends/numba_cpu_conv_step.py).

Oracles: the composed Numba kernels the layer used before (``conv2d``, ``euler_act``;
``activation_adjoint``, ``conv2d_adjoint``, the sum) — bit for bit, since the fused kernels
make the same roundings; the NumPy reference within round-off; a dot-product test and
finite differences of the step for the adjoint (float64).
"""

import numpy as np
import pytest

from refbraid.backends import get_backend, reference_conv_step
from refbraid.backends.numba_cpu_conv_step import conv_step, conv_step_adjoint
from refbraid.layers import ConvStep

NB = get_backend("numba")
ACTS = ("relu", "gelu", "identity", "tanh")
SHAPES = [(5, 4, 9, 7), (2, 3, 28, 28), (1, 8, 4, 5), (3, 1, 1, 1)]  # B, C, H, W


def _args(shape, dtype, seed=0):
    g = np.random.default_rng(seed)
    B, C, H, W = shape
    y = g.standard_normal(shape).astype(dtype)
    Wt = (0.3 * g.standard_normal((C, C, 3, 3))).astype(dtype)
    b = g.standard_normal(C).astype(dtype)
    return y, Wt, b, g.standard_normal(shape).astype(dtype)


def _composed_forward(y, W, b, h, act):
    z = NB.conv2d(y, W, b)
    return NB.euler_act(y, z, h, act), z


def _composed_adjoint(y, z, dy_next, W, h, act):
    s = h * NB.activation_adjoint(z, dy_next, act)
    dys, dW, db = NB.conv2d_adjoint(y, W, s)
    return dy_next + dys, dW, db


def _same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_step_has_the_bits_of_the_composed_kernels(shape, act, dtype):
    y, W, b, dy_next = _args(shape, dtype)
    h = 0.37
    y_ref, z_ref = _composed_forward(y, W, b, h, act)
    y1, z1 = conv_step(y, W, b, h, act)
    assert _same(y1, y_ref) and _same(z1, z_ref)
    out = np.full_like(y, np.nan)
    y2, _ = conv_step(y, W, b, h, act, out=out)
    assert y2 is out and _same(out, y_ref)

    dy_ref, dW_ref, db_ref = _composed_adjoint(y, z_ref, dy_next, W, h, act)
    dy, dW, db = conv_step_adjoint(y, z_ref, dy_next, W, h, act)
    assert _same(dy, dy_ref) and _same(dW, dW_ref) and _same(db, db_ref)
    out = np.full_like(y, np.nan)
    dy2, dW2, db2 = conv_step_adjoint(y, z_ref, dy_next, W, h, act, grads=False, out=out)
    assert dy2 is out and _same(out, dy_ref) and dW2 is None and db2 is None


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-5), (np.float64, 1e-12)])
def test_the_step_equals_the_numpy_reference(dtype, tol):
    y, W, b, dy_next = _args((3, 4, 6, 5), dtype, seed=1)
    for act in ACTS:
        y_ref, z_ref = reference_conv_step.conv_step(y, W, b, 0.25, act)
        y1, z1 = conv_step(y, W, b, 0.25, act)
        np.testing.assert_allclose(y1, y_ref, rtol=tol, atol=tol)
        np.testing.assert_allclose(z1, z_ref, rtol=tol, atol=tol)
        ref = reference_conv_step.conv_step_adjoint(y, z_ref, dy_next, W, 0.25, act)
        for got, want in zip(conv_step_adjoint(y, z_ref, dy_next, W, 0.25, act), ref,
                             strict=True):
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_what_the_fused_kernels_do_not_take_goes_the_composed_way():
    """5×5 kernels, mixed dtypes, a NumPy-scalar h, an out of another dtype or overlapping y:
    the composed kernels' results (and out ignored where it cannot be written)."""
    y, W, b, dy_next = _args((2, 3, 6, 6), np.float64)
    g = np.random.default_rng(2)
    W5 = g.standard_normal((3, 3, 5, 5))
    cases = [(y, W5, b, 0.5), (y.astype(np.float32), W, b, 0.5), (y, W, b, np.float64(0.5))]
    for yy, WW, bb, h in cases:
        got, z = conv_step(yy, WW, bb, h, "relu")
        want, z_ref = _composed_forward(yy, WW, bb, h, "relu")
        assert _same(got, want) and _same(z, z_ref)
        dy = conv_step_adjoint(yy, z_ref, dy_next.astype(yy.dtype), WW, h, "relu")
        dy_ref = _composed_adjoint(yy, z_ref, dy_next.astype(yy.dtype), WW, h, "relu")
        for a, c in zip(dy, dy_ref, strict=True):
            assert _same(a, c)
    bad_out = np.empty(y.shape, np.float32)
    got, _ = conv_step(y, W, b, 0.5, "relu", out=bad_out)
    assert got is not bad_out and _same(got, _composed_forward(y, W, b, 0.5, "relu")[0])
    got, _ = conv_step(y, W, b, 0.5, "relu", out=y)  # out overlapping y: a new array
    assert got is not y


@pytest.mark.parametrize("act", ["gelu", "identity", "tanh"])
def test_the_adjoint_passes_the_dot_product_test_and_finite_differences(act):
    """⟨w, J v⟩ = ⟨Jᵀ w, v⟩ for the state and the weights, J v by central differences
    (float64; relu's kink left out of the FD check)."""
    y, W, b, w = _args((2, 3, 5, 4), np.float64, seed=3)
    g = np.random.default_rng(4)
    v, V, vb = g.standard_normal(y.shape), g.standard_normal(W.shape), g.standard_normal(3)
    h, eps = 0.3, 1e-6
    _, z = conv_step(y, W, b, h, act)
    dy, dW, db = conv_step_adjoint(y, z, w, W, h, act)

    def jvp(dy_, dW_, db_):
        plus = conv_step(y + eps * dy_, W + eps * dW_, b + eps * db_, h, act)[0]
        minus = conv_step(y - eps * dy_, W - eps * dW_, b - eps * db_, h, act)[0]
        return (plus - minus) / (2 * eps)

    zero_W, zero_b = np.zeros_like(W), np.zeros_like(b)
    assert np.vdot(w, jvp(v, zero_W, zero_b)) == pytest.approx(np.vdot(dy, v), rel=1e-7)
    assert np.vdot(w, jvp(np.zeros_like(y), V, zero_b)) == pytest.approx(np.vdot(dW, V),
                                                                          rel=1e-7)
    assert np.vdot(w, jvp(np.zeros_like(y), zero_W, vb)) == pytest.approx(np.vdot(db, vb),
                                                                           rel=1e-7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_conv_layer_on_numba_is_the_composed_step(dtype):
    """ConvStep.forward / adjoint on numba route to the whole step and keep its cache and
    out= contract: the bits of the composition the other backends make."""
    layer = ConvStep(4, 6, 5, "relu")
    params = layer.init(np.random.default_rng(5), dtype)
    y, _, _, dy_next = _args((3, 4, 6, 5), dtype, seed=6)
    out = np.empty_like(y)
    y_next, (y_c, z) = layer.forward(params, y, 0.125, NB, out=out)
    want, z_ref = _composed_forward(y, params["W"], params["b"], 0.125, "relu")
    assert y_next is out and _same(y_next, want) and _same(z, z_ref) and y_c is y
    dy, grads = layer.adjoint(params, (y, z), dy_next, 0.125, NB)
    dy_ref, dW_ref, db_ref = _composed_adjoint(y, z, dy_next, params["W"], 0.125, "relu")
    assert _same(dy, dy_ref) and _same(grads["W"], dW_ref) and _same(grads["b"], db_ref)
    dy, none = layer.adjoint(params, (y, z), dy_next, 0.125, NB, grads=False)
    assert _same(dy, dy_ref) and none is None


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_addend_is_added_to_the_rounded_step(act, dtype):
    """``add`` (MGRIT's right-hand side row): ``(step) + add`` with the step rounded first,
    the bits of the sum the sweep made after the step; into ``out`` or new; an addend the
    kernel does not take (other dtype, strided) gives the same sum the composed way."""
    y, W, b, g = _args((3, 4, 6, 5), dtype, seed=7)
    dy_next = np.random.default_rng(8).standard_normal(y.shape).astype(dtype)
    want = _composed_forward(y, W, b, 0.25, act)[0] + g
    out = np.full_like(y, np.nan)
    got, z = conv_step(y, W, b, 0.25, act, out=out, add=g)
    assert got is out and _same(got, want)
    assert _same(conv_step(y, W, b, 0.25, act, add=g)[0], want)
    strided = np.repeat(g, 2, axis=-1)[..., ::2]
    assert _same(conv_step(y, W, b, 0.25, act, add=strided)[0], want)
    other = g.astype(np.float32 if dtype == np.float64 else np.float64)
    assert _same(conv_step(y, W, b, 0.25, act, add=other)[0],
                 _composed_forward(y, W, b, 0.25, act)[0] + other)

    dy_ref = _composed_adjoint(y, z, dy_next, W, 0.25, act)[0] + g
    out = np.full_like(y, np.nan)
    dy, _, _ = conv_step_adjoint(y, z, dy_next, W, 0.25, act, grads=False, out=out, add=g)
    assert dy is out and _same(dy, dy_ref)
    assert _same(conv_step_adjoint(y, z, dy_next, W, 0.25, act, add=g)[0], dy_ref)
    ref = reference_conv_step.conv_step(y, W, b, 0.25, act, add=g)[0]
    np.testing.assert_allclose(ref, want, rtol=2e-5 if dtype == np.float32 else 1e-12,
                               atol=2e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("model, shape", [("resnet", (3, 4)), ("conv", (2, 2, 5, 5))])
@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_forward_and_adjoint_into_add_the_addend_for_every_layer(model, shape, backend):
    """forward_into / adjoint_into with ``add``: inside the layer where its method takes
    ``add=`` (ConvStep), after it otherwise (DenseStep): the same bits as adding after."""
    from refbraid.layers.forward_into import adjoint_into, forward_into
    from refbraid.models import build_network
    from refbraid.network import group, init_params, layer_params

    bk = get_backend(backend)
    net = build_network(model, (2,) if model == "resnet" else (1, 5, 5), 3, 2, shape[1], 1.0)
    layer, params = net.step, layer_params(group(init_params(net, 0), "steps"), 1)
    rng = np.random.default_rng(9)
    y, g, lam = (rng.standard_normal(shape) for _ in range(3))
    y_next, cache = layer.forward(params, y, 0.25, bk)
    out = np.full_like(y, np.nan)
    got, _ = forward_into(layer, params, y, 0.25, bk, out, g)
    assert _same(got, y_next + g) and (got is out or model == "resnet" and backend == "numpy")
    dy, _ = layer.adjoint(params, cache, lam, 0.25, bk, grads=False)
    got, _ = adjoint_into(layer, params, cache, lam, 0.25, bk, False, np.empty_like(y), g)
    assert _same(got, dy + g)
