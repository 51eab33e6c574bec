"""The ``cuda`` backend's whole conv ODE step, one at a time (numba_cuda_conv_step), in Numba's
CUDA simulator.

Oracles: the batched fused step with k = 1 (the same roundings: bit for bit, every
activation, both dtypes); the per-operation ``cuda`` path it replaces (bit for bit in
float64; float32 to round-off: its Euler kernel multiplies by h in float64); the NumPy
reference; the dot-product test of the adjoint (float64); launch counts before and after
(the CuPy stand-in counts the glue). The kernels' compilation for real targets is in
tests/test_cuda_compile.py's workload.
"""

from __future__ import annotations

import numpy as np
import pytest

from refbraid.backends import get_backend, reference_conv_step
from refbraid.backends.reference import ACTIVATIONS

numba = pytest.importorskip("numba")
if not numba.config.ENABLE_CUDASIM:
    pytest.skip("small simulator-sized cases (NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)
pytest.importorskip("numba.cuda")

from refbraid.backends import numba_cuda_conv_batched as NCB  # noqa: E402
from refbraid.backends import numba_cuda_conv_step as NCS  # noqa: E402
from refbraid.verify.result import array_rel_error

TOL = {np.float64: 1e-12, np.float32: 1e-5}  # of the largest entry, against NumPy
SHAPE = (2, 3, 4, 5)  # B, C, H, W


def _case(dtype, seed=0):
    rng = np.random.default_rng(seed)
    B, C = SHAPE[:2]
    y, dy = (rng.standard_normal(SHAPE).astype(dtype) for _ in range(2))
    W = (0.4 * rng.standard_normal((C, C, 3, 3))).astype(dtype)
    return y, W, rng.standard_normal(C).astype(dtype), dy



@pytest.fixture(scope="module")
def bk():
    return get_backend("cuda")


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_one_step_has_the_bits_of_the_batched_step_and_numpys_values(bk, act, dtype):
    y, W, b, dy = _case(dtype, 1)
    assert {"conv_step", "conv_step_adjoint"} <= set(bk.overrides)
    d = [bk.asarray(a) for a in (y, W, b, dy)]
    y_next, z = NCS.conv_step(d[0], d[1], d[2], 0.375, act)
    Yb, Zb = NCB.conv_step_batched(*(bk.asarray(a[None]) for a in (y, W, b)), [0.375], act)
    np.testing.assert_array_equal(bk.to_numpy(y_next), bk.to_numpy(Yb)[0])
    np.testing.assert_array_equal(bk.to_numpy(z), bk.to_numpy(Zb)[0])
    y_ref, z_ref = reference_conv_step.conv_step(y, W, b, 0.375, act)
    assert array_rel_error(bk.to_numpy(y_next), y_ref)[0] <= TOL[dtype]
    assert array_rel_error(bk.to_numpy(z), z_ref)[0] <= TOL[dtype]
    for grads in (True, False):
        got = NCS.conv_step_adjoint(d[0], z, d[3], d[1], 0.375, act, grads)
        batched = NCB.conv_step_batched_adjoint(bk.asarray(y[None]),
                                                bk.asarray(bk.to_numpy(z)[None]),
                                                bk.asarray(dy[None]), bk.asarray(W[None]),
                                                [0.375], act, grads)
        ref = reference_conv_step.conv_step_adjoint(y, bk.to_numpy(z), dy, W, 0.375, act,
                                                    grads)
        for name, g, bb, r in zip(("dy", "dW", "db"), got, batched, ref, strict=True):
            if r is None:
                assert g is None and bb is None, name
                continue
            assert bk.to_numpy(g).dtype == dtype, name
            assert array_rel_error(bk.to_numpy(g), r)[0] <= TOL[dtype], (name, grads)
            np.testing.assert_array_equal(bk.to_numpy(g), bk.to_numpy(bb)[0], err_msg=name)


def test_float64_has_the_bits_of_the_per_operation_path(bk):
    y, W, b, dy = _case(np.float64, 2)
    d = [bk.asarray(a) for a in (y, W, b, dy)]
    y_next, z = NCS.conv_step(d[0], d[1], d[2], 0.25, "tanh")
    z_ops = bk.conv2d(d[0], d[1], d[2])
    np.testing.assert_array_equal(bk.to_numpy(z), bk.to_numpy(z_ops))
    np.testing.assert_array_equal(bk.to_numpy(y_next),
                                  bk.to_numpy(bk.euler_act(d[0], z_ops, 0.25, "tanh")))
    dy_ops, dW_ops, db_ops = bk.conv2d_adjoint(
        d[0], d[1], 0.25 * bk.activation_adjoint(z, d[3], "tanh"))
    got = NCS.conv_step_adjoint(d[0], z, d[3], d[1], 0.25, "tanh")
    np.testing.assert_array_equal(bk.to_numpy(got[0]), bk.to_numpy(d[3] + dy_ops))
    np.testing.assert_array_equal(bk.to_numpy(got[1]), bk.to_numpy(dW_ops))
    np.testing.assert_array_equal(bk.to_numpy(got[2]), bk.to_numpy(db_ops))


def test_the_adjoint_passes_the_dot_product_test_in_float64(bk):
    """<J (v, δW, δb), w> = <v, dy> + <δW, dW> + <δb, db>, J = v + h σ'(z) ⊙ (W * v + δW * y
    + δb), the convolutions by the NumPy reference."""
    from refbraid.backends.reference import conv2d

    y, W, b, w = _case(np.float64, 3)
    rng = np.random.default_rng(4)
    v, dW_dir, db_dir = (rng.standard_normal(a.shape) for a in (y, W, b))
    _, z = NCS.conv_step(bk.asarray(y), bk.asarray(W), bk.asarray(b), 0.5, "tanh")
    z = bk.to_numpy(z)
    Jv = v + 0.5 * (1 - np.tanh(z) ** 2) * (conv2d(v, W, None) + conv2d(y, dW_dir, None)
                                           + db_dir[None, :, None, None])
    dy, dW, db = map(bk.to_numpy, NCS.conv_step_adjoint(
        bk.asarray(y), bk.asarray(z), bk.asarray(w), bk.asarray(W), 0.5, "tanh"))
    lhs, rhs = np.vdot(Jv, w), np.vdot(v, dy) + np.vdot(dW_dir, dW) + np.vdot(db_dir, db)
    np.testing.assert_allclose(lhs, rhs, rtol=1e-12)


def test_launches_before_and_after():
    """One step: forward 2 launches (convolution, Euler update) → 1; the adjoint 6 (σ'·dy,
    ×h, dx, dW, db, +) → 2 without the weight gradient and 4 with it."""
    from refbraid.backends import launch_count
    from refbraid.layers import ConvStep

    y, W, b, dy = _case(np.float64, 5)
    layer = ConvStep(SHAPE[1], SHAPE[2], SHAPE[3], "tanh")
    with launch_count.counting("cuda") as cbk:
        yd, Wd, bd, dyd = (cbk.asarray(a) for a in (y, W, b, dy))
        params = {"W": Wd, "b": bd}

        def composed_forward():
            return cbk.euler_act(yd, cbk.conv2d(yd, Wd, bd), 0.5, "tanh")

        def composed_adjoint():
            s = 0.5 * cbk.activation_adjoint(z, dyd, "tanh")
            return dyd + cbk.conv2d_adjoint(yd, Wd, s)[0]

        count = launch_count.count
        _, (_, z) = layer.forward(params, yd, 0.5, cbk)
        assert count(composed_forward).launches == 2
        assert count(lambda: layer.forward(params, yd, 0.5, cbk)).launches == 1
        assert count(composed_adjoint).launches == 6
        assert count(lambda: layer.adjoint(params, (yd, z), dyd, 0.5, cbk, grads=False)
                     ).launches == 2
        assert count(lambda: layer.adjoint(params, (yd, z), dyd, 0.5, cbk)).launches == 4


def test_bad_arguments_are_named(bk):
    y, W, b, _ = _case(np.float64, 6)
    W2 = np.concatenate([W, W], axis=0)  # 2C output channels
    with pytest.raises(ValueError, match="`W` must map the 3 channels"):
        NCS.conv_step(y, W2, np.concatenate([b, b]), 0.5, "tanh")
    with pytest.raises(ValueError, match="`b` must have shape"):
        NCS.conv_step(y, W, b[:1], 0.5, "tanh")
