"""The whole dense step (catalogue kernels ``dense_step`` / ``dense_step_adjoint``, one step and
k at once) on the device stand-ins: on the CuPy-like stand-in the ``cupy`` backend's fused
kernels run their reference arithmetic, on the strict one the reference kernels run; both
give NumPy's bits, float32 and float64, with and without the weight gradient."""

import numpy as np
import pytest

from refbraid.backends import get_backend
from refbraid.backends.host import to_host
from refbraid.layers import DenseStep

NUMPY = get_backend("numpy")


def _step(layer, bk, params, y, dy, h, grads):
    p = {k: bk.asarray(v) for k, v in params.items()}
    y_next, cache = layer.forward(p, bk.asarray(y), h, bk)
    dy_prev, d = layer.adjoint(p, cache, bk.asarray(dy), h, bk, grads=grads)
    out = [y_next, dy_prev] + ([d["W"], d["b"]] if grads else [])
    return [to_host(a) for a in out]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", ["tanh", "gelu"])
def test_the_whole_dense_step_has_numpys_bits_on_the_stand_ins(standin, act, dtype):
    rng, layer, h = np.random.default_rng(4), DenseStep(5, act), 0.3
    params = {"W": rng.standard_normal((5, 5)).astype(dtype),
              "b": rng.standard_normal(5).astype(dtype)}
    y, dy = (rng.standard_normal((3, 5)).astype(dtype) for _ in range(2))
    for grads in (True, False):
        want = _step(layer, NUMPY, params, y, dy, h, grads)
        got = _step(layer, standin, params, y, dy, h, grads)
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w, err_msg=f"{standin.name} output {k}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_batched_dense_step_has_numpys_bits_on_the_stand_ins(standin, dtype):
    rng, layer, h = np.random.default_rng(5), DenseStep(4, "tanh"), np.array([0.1, 0.2, 0.1])
    params = {"W": rng.standard_normal((3, 4, 4)).astype(dtype),
              "b": rng.standard_normal((3, 4)).astype(dtype)}
    Y, dY = (rng.standard_normal((3, 2, 4)).astype(dtype) for _ in range(2))

    def run(bk):
        p = {k: bk.asarray(v) for k, v in params.items()}
        Y_next, Z = layer.forward_batched(p, bk.asarray(Y), h, bk)
        dY_prev, d = layer.adjoint_batched(p, bk.asarray(Y), Z, bk.asarray(dY), h, bk)
        return [to_host(a) for a in (Y_next, dY_prev, d["W"], d["b"])]

    for k, (g, w) in enumerate(zip(run(standin), run(NUMPY), strict=True)):
        np.testing.assert_array_equal(g, w, err_msg=f"{standin.name} output {k}")
