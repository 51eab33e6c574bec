"""refbraid's own strided-batched GEMM (refbraid.backends.cupy_blas), its ctypes call into
libcublas made against the emulator's cuBLAS (tests/cuda_c/emulator.py: cuBLAS's column-major
semantics and argument checks on host memory): every operand layout against NumPy's product.

What this shares with a GPU: the call — which matrix goes in which slot, operation flags,
leading dimensions, batch strides, α and β — and the copies made before it. What it cannot
see: cuBLAS's own kernels and their summation order (NumPy's stand in), streams.
"""

from __future__ import annotations

import numpy as np
import pytest

from refbraid.backends import cupy_blas

from .emulator import fake_cupy


def _r(rng, dtype, *shape):
    return rng.standard_normal(shape).astype(dtype)


LAYOUTS = ["2d", "a transposed", "b transposed", "both transposed", "batched by 2d",
           "batched by batched", "batched transposed", "row slices", "broadcast batch",
           "vector rows", "every m-th state", "transposed batch of states", "strided batch",
           "axes that do not collapse"]


def _operands(case, rng, dtype):
    def r(*shape):
        return _r(rng, dtype, *shape)

    return {
        "2d": (r(5, 3), r(3, 4)),
        "a transposed": (r(3, 5).T, r(3, 4)),
        "b transposed": (r(5, 3), r(4, 3).T),
        "both transposed": (r(3, 5).T, r(4, 3).T),
        "batched by 2d": (r(2, 6, 5, 3), r(3, 4)),
        "batched by batched": (r(6, 5, 3), r(6, 3, 4)),
        "batched transposed": (np.swapaxes(r(6, 3, 5), 1, 2), r(4, 3).T),
        "row slices": (r(10, 7)[::2, 2:5], r(3, 8)[:, ::2]),
        "broadcast batch": (r(1, 5, 3), r(6, 3, 4)),
        "vector rows": (r(1, 3), r(3, 1)),
        "every m-th state": (r(12, 5, 3)[1::4], np.swapaxes(r(3, 4, 3), 1, 2)),  # Y Wᵀ
        "transposed batch of states": (np.swapaxes(r(9, 5, 3)[::3], 1, 2), r(9, 5, 4)[::3]),
        "strided batch": (r(4, 2, 5, 3)[:, 1], r(4, 3, 6)),
        "axes that do not collapse": (r(2, 3, 5, 3)[:, :2], r(2, 2, 3, 4)),  # copied first
    }[case]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", LAYOUTS)
def test_the_strided_batched_gemm_call_computes_numpys_product(case, dtype):
    a, b = _operands(case, np.random.default_rng(0), dtype)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    with fake_cupy() as fake:
        got = cupy_blas.matmul(a, b)
        assert fake.cublas_library.calls == 1
    assert got.shape == want.shape and got.dtype == dtype and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-13,
                               atol=1e-5 if dtype == np.float32 else 1e-13)


def test_beta_one_adds_the_product_into_out():
    rng = np.random.default_rng(1)
    s, W, dy = _r(rng, np.float64, 6, 4), _r(rng, np.float64, 4, 4), _r(rng, np.float64, 6, 4)
    out = dy.copy()
    with fake_cupy():
        cupy_blas.matmul(s, W, out=out, beta=1.0)
    np.testing.assert_allclose(out, dy + s @ W, rtol=1e-14)


def test_a_call_cublas_refuses_is_an_error_that_names_it():
    """A leading dimension shorter than the rows it must span: cuBLAS's
    CUBLAS_STATUS_INVALID_VALUE, raised as an error naming the call and the status."""
    a = np.zeros((3, 3))
    with fake_cupy(), pytest.raises(RuntimeError, match="cublas gemm .* status 7"):
        cupy_blas._CUBLAS.gemm(np.float64, 0, 0, 0, 3, 3, 3, a.ctypes.data, 2, 9,
                               a.ctypes.data, 3, 9, a.ctypes.data, 3, 9, 1)


def test_the_backend_sends_batched_products_through_it_and_two_d_ones_to_cupy(monkeypatch):
    """cupy_blas.product: a batched float product through the strided-batched GEMM (no
    copy of MGRIT's strided rows), a 2-D one through the arrays' own matmul; with
    REFBRAID_CUPY_GEMM=cupy every one through the arrays' own matmul."""
    rng = np.random.default_rng(2)
    Y, W = _r(rng, np.float32, 8, 5, 3)[::2], _r(rng, np.float32, 3, 4)
    with fake_cupy() as fake:
        batched, flat = cupy_blas.product(Y, W), cupy_blas.product(Y[0], W)
        assert fake.cublas_library.calls == 1
        monkeypatch.setenv(cupy_blas.GEMM_ENV, "cupy")
        again = cupy_blas.product(Y, W)
        assert fake.cublas_library.calls == 1
    np.testing.assert_allclose(batched, Y @ W, rtol=1e-6)
    np.testing.assert_array_equal(flat, Y[0] @ W)
    np.testing.assert_array_equal(again, Y @ W)


@pytest.mark.parametrize("model, mode", [("dense", "lp-per-step"), ("dense", "lp-batched"),
                                         ("conv", "lp-batched")])
def test_the_gradients_a_recording_computes_through_its_own_gemms_equal_numpy(model, mode,
                                                                           monkeypatch):
    """Inside ``recordable_gemms`` (what a CUDA graph recording runs under) the cupy
    backend's batched products and the fused dense adjoint's β = 1 GEMM (per-step sweeps
    without the weight gradient) go through the strided-batched GEMM, here the emulated
    libcublas: the layer-parallel gradient (TorchBraid's settings, float64) equals the NumPy
    backend's to 1e-10. The conv network's convolutions as column-matrix GEMMs
    (``REFBRAID_CUPY_CONV=im2col``; by default they are direct kernels without a GEMM). Not
    seen here: the 2-D products, which reach NumPy's ``matmul`` (the emulator's arrays are
    NumPy's, whose namespace is NumPy; on a GPU, the recording's ``cupy.matmul``); the
    capture and the replay (tests/test_cuda_graphs.py's gpu tests)."""
    from refbraid.backends import assemble, cupy_conv, get_backend, launch_count
    from refbraid.backends.device_batching import sweeps_batched
    from refbraid.training.gradients import mgrit_gradient

    monkeypatch.setenv(cupy_conv.CONV_ENV, "im2col")
    net, params, x, labels = launch_count.build_model(model, 16, np.random.default_rng(0))

    def gradient(bk):
        return mgrit_gradient(net, launch_count.default_settings(), bk)(params, x, labels)

    with sweeps_batched(mode == "lp-batched"):
        loss, want, _ = gradient(get_backend("numpy"))
        with fake_cupy() as fake, cupy_blas.recordable_gemms(fake):
            got_loss, got, _ = gradient(assemble("cupy", fake))
            assert fake.cublas_library.calls > 0
    assert got_loss == pytest.approx(loss, rel=1e-12)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=0, atol=1e-10 * max(1.0, np.max(np.abs(v))),
                                   err_msg=k)
