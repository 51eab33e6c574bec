"""The catalogue on a real GPU (``NUMBA_ENABLE_CUDASIM=0 pytest -m gpu``); skipped without one.

What the simulator and the strict stand-in cannot show: the Numba CUDA kernels compiled for
a device and the CuPy route on device memory, in float64 and float32. Each test compares
with the NumPy reference (refbraid.verify's dot-product, finite-difference and backend checks;
PyTorch autograd when torch is installed) and runs whole layer-parallel training steps.
Together with the cupy- and cuda-parametrised tests of the other files (marked ``gpu`` in
conftest.BACKEND_PARAMS) this is the whole catalogue on the device.
"""

import numpy as np
import pytest

from refbraid.backends import available_backends, get_backend

pytestmark = pytest.mark.gpu


def _on_a_gpu(name: str) -> bool:
    if name == "cuda":
        from refbraid.backends.numba_cuda import is_usable, simulated

        return is_usable() and not simulated()
    return name in available_backends()


@pytest.fixture(params=["cuda", "cupy"])
def gpu_backend(request) -> str:
    if not _on_a_gpu(request.param):
        pytest.skip(f"`{request.param}` on a real GPU: none here (or NUMBA_ENABLE_CUDASIM=1)")
    return request.param


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_verification_catalogue_passes_on_the_gpu(gpu_backend, dtype):
    from refbraid.verify.suite import run_all

    results = run_all([gpu_backend], dtypes=(dtype,))
    failed = [str(r) for r in results if not r.passed]
    assert results and not failed, "\n".join(failed[:20])


def test_pytorch_agrees_on_the_gpu_backends(gpu_backend):
    pytest.importorskip("torch")
    from refbraid.verify.suite import run_all

    failed = [str(r) for r in run_all([gpu_backend], torch=True) if not r.passed]
    assert not failed, "\n".join(failed[:20])


@pytest.mark.parametrize("name", ["dense", "conv", "transformer", "gru"])
def test_a_layer_parallel_training_step_on_the_gpu_equals_numpy(gpu_backend, name):
    from test_cudasim_training_step import _model, _step

    from refbraid.backends.host import to_host

    net, params, x, labels = _model(name, np.random.default_rng(0))
    want_loss, want, _ = _step(net, params, x, labels, get_backend("numpy"))
    bk = get_backend(gpu_backend)
    loss, got, _ = _step(net, params, bk.asarray(x), bk.asarray(labels), bk)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    for k, v in want.items():
        np.testing.assert_allclose(to_host(got[k]), v, rtol=1e-11, atol=1e-14, err_msg=k)


@pytest.mark.parametrize("name", ["dense", "transformer"])
def test_the_cuda_backend_keeps_a_training_step_on_the_device(name, monkeypatch):
    """On a GPU with CuPy, the cuda kernels work on CuPy memory: during a whole step no
    ``numba.cuda`` copy or allocation happens, every kernel output is a CuPy array, and only
    a handful of scalars and flag vectors reach the host (tests/test_cudasim_training_step.py
    proves the same in the simulator)."""
    if not _on_a_gpu("cuda"):
        pytest.skip("`cuda` on a real GPU: none here (or NUMBA_ENABLE_CUDASIM=1)")
    from numba import cuda
    from numba.cuda.cudadrv import devicearray
    from test_cudasim_training_step import _model, _step

    from refbraid.backends import Backend
    from refbraid.backends.host import COUNTS
    from refbraid.backends.numba_cuda_memory import MODE, is_backend_array

    if MODE != "cupy":
        pytest.skip(f"the cuda backend runs in {MODE!r} mode here (no usable CuPy)")
    copies, host_outputs = [], []

    def counted(attr, original):
        def call(*args, **kwargs):
            copies.append(attr)
            return original(*args, **kwargs)
        return call

    for owner, attr in ((cuda, "to_device"), (cuda, "device_array"),
                        (devicearray.DeviceNDArrayBase, "copy_to_host")):
        monkeypatch.setattr(owner, attr, counted(attr, getattr(owner, attr)))
    bk = get_backend("cuda")

    def checked(kernel_name, kernel):
        def call(*args, **kwargs):
            result = kernel(*args, **kwargs)
            for r in result if isinstance(result, tuple) else (result,):
                if hasattr(r, "shape") and not is_backend_array(r):
                    host_outputs.append(kernel_name)
            return result
        return call

    bk = Backend(bk.name, bk.xp, {k: checked(k, f) if k in bk.overrides else f
                                  for k, f in bk.kernels.items()}, bk.overrides, bk.device)
    net, params, x, labels = _model(name, np.random.default_rng(0))
    door = COUNTS["to_host"]
    _step(net, params, x, labels, bk)
    assert copies == [] and host_outputs == [], (copies, host_outputs)
    assert COUNTS["to_host"] - door <= 16


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_direct_convolution_kernels_match_numpy_at_their_full_tile_sizes(dtype):
    """The cupy backend's direct convolution kernels (cupy_conv_direct) with their own sizes
    — 16×16 tiles, 16 output channels a thread, 32 kB of staged input and weights, 256-thread
    weight-gradient blocks — on images wider than a tile, more output channels than a group,
    more input channels than a chunk (8 float64, 17 float32 at 3×3), k rows with their own
    weights read from MGRIT-like strided rows: z, dx and (dW, db) against NumPy's; then the
    rows running downwards (the adjoint's order: states and weights by a negative stride, the
    weights a view of the stack reversed, as device_batching.weight_rows hands them over)."""
    if "cupy" not in available_backends():
        pytest.skip("the cupy backend on a real GPU: none here")
    import cupy

    from refbraid.backends import cupy_conv, reference_batched
    from refbraid.backends.device_batching import weight_rows

    rng = np.random.default_rng(7)
    k, B, C, O, H, Wd, s = 3, 4, 24, 20, 33, 18, 3
    X = rng.standard_normal((2 * k, B, C, H, Wd)).astype(dtype)
    Ws = rng.standard_normal((2 * k, O, C, s, s)).astype(dtype)
    dZ = rng.standard_normal((k, B, O, H, Wd)).astype(dtype)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    for rows in (np.arange(1, 2 * k, 2), np.arange(2 * k - 1, 0, -2)):
        Xd = cupy.asarray(X)[rows[0]::rows[1] - rows[0]]  # every second state, in place
        Wv = weight_rows(cupy.asarray(Ws), rows, None)  # views of the stack, read in place
        W = Ws[rows]
        want_z = reference_batched.conv2d_batched(X[rows], W, None)
        want_dx, want_dW, want_db = reference_batched.conv2d_adjoint_batched(X[rows], W, dZ,
                                                                             True)
        assert cupy_conv.direct_tiling(Xd, Wv) is not None
        z = cupy_conv.conv2d(Xd, Wv)
        dx, dW, db = cupy_conv.conv2d_adjoint(Xd, Wv, cupy.asarray(dZ), True)
        for name, got, want in (("z", z, want_z), ("dx", dx, want_dx), ("dW", dW, want_dW),
                                ("db", db, want_db)):
            got = cupy.asnumpy(got)
            assert got.shape == want.shape and got.dtype == want.dtype, name
            np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.max(np.abs(want)),
                                       err_msg=f"{name}, rows {rows.tolist()}")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_conv_step_adjoint_stages_its_scaled_input_on_the_gpu(dtype):
    """The direct kernels forming ``s = h σ'(z) ⊙ dy_next`` as they read it, at their own
    sizes: ``dy_next + W *ᵀ s`` (the transposed convolution's prologue) and dW, db of s (the
    weight gradient's threads) — tanh and GELU, per-row h, dy and z every second state read
    in place — against the separate scaled-adjoint kernel, then the same kernels: CUDA's
    tanh/erf in both, so to a few ulps of the sums (the same arithmetic, another
    compilation)."""
    if "cupy" not in available_backends():
        pytest.skip("the cupy backend on a real GPU: none here")
    import cupy

    from refbraid.backends import cupy_conv
    from refbraid.backends.cupy_fused import SCALED_ACT_ADJOINT

    rng = np.random.default_rng(8)
    k, B, C, H, Wd = 3, 4, 24, 33, 18
    U = cupy.asarray(rng.standard_normal((2 * k, B, C, H, Wd)).astype(dtype))
    dY, Z = U[::2], U[1::2]
    W = cupy.asarray((0.2 * rng.standard_normal((k, C, C, 3, 3))).astype(dtype))
    h = cupy.asarray(np.array([0.25, 0.5, 0.125], dtype)[:, None, None, None, None])
    tol = 1e-12 if dtype == np.float64 else 1e-5
    X = cupy.asarray(rng.standard_normal((k, B, C, H, Wd)).astype(dtype))
    for act in ("tanh", "gelu"):
        want = cupy_conv.conv2d_adjoint(X, W, SCALED_ACT_ADJOINT(act, Z, dY, h), True, add=dY)
        got = cupy_conv.conv2d_adjoint(X, W, dY, True, add=dY, scale=(Z, h, act))
        for name, g, w in zip(("dx", "dW", "db"), got, want, strict=True):
            w = cupy.asnumpy(w)
            np.testing.assert_allclose(cupy.asnumpy(g), w, rtol=0,
                                       atol=tol * np.max(np.abs(w)), err_msg=f"{act} {name}")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_column_sum_kernel_writes_mgrit_rows_on_the_gpu(dtype):
    """cupy_fused.ADD_COLUMN_SUMS reading dy_next from every m-th state of an iterate and
    writing ``(dy_next + p) + g`` into other rows of it (offset and row stride, no copies):
    the contiguous kernel's dy plus g bit for bit, the rows between untouched, db the same."""
    if "cupy" not in available_backends():
        pytest.skip("the cupy backend on a real GPU: none here")
    import cupy

    from refbraid.backends.cupy_fused import ADD_COLUMN_SUMS

    k, B, C, m = 3, 1030, 257, 4
    rng = np.random.default_rng(8)
    u, rhs = (cupy.asarray(rng.standard_normal((k * m + 1, B, C)).astype(dtype))
              for _ in range(2))
    p, s = (cupy.asarray(rng.standard_normal((k, B, C)).astype(dtype)) for _ in range(2))
    dy_next, rows, g = u[0:k * m:m], u[1::m][:k], rhs[1::m][:k]
    plain_dy, plain_db = ADD_COLUMN_SUMS(p, cupy.ascontiguousarray(dy_next), s)
    want = cupy.asnumpy(plain_dy + g)
    before = cupy.asnumpy(u)
    got, db = ADD_COLUMN_SUMS.into_rows(p, dy_next, s, rows, g)
    after = cupy.asnumpy(u)
    assert got is rows
    np.testing.assert_array_equal(after[1::m][:k], want)
    untouched = np.ones(len(after), bool)
    untouched[1:k * m:m] = False
    np.testing.assert_array_equal(after[untouched], before[untouched])
    np.testing.assert_array_equal(cupy.asnumpy(db), cupy.asnumpy(plain_db))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_residual_kernel_on_the_gpu(dtype):
    """cupy_residual.subtract_sum_squares with all its blocks (65 states of 64 × 1024
    values, u every 4th state of an iterate, read in place): r − u bit for bit,
    Σ r² to round-off of NumPy's in double, and the same bits at every launch (the last
    block adds the partial sums in a fixed order; its counter is back at 0 each time)."""
    if "cupy" not in available_backends():
        pytest.skip("the cupy backend on a real GPU: none here")
    import cupy

    from refbraid.backends import cupy_residual

    rng = np.random.default_rng(12)
    u = rng.standard_normal((4 * 65, 64, 1024)).astype(dtype)
    r = rng.standard_normal((65, 64, 1024)).astype(dtype)
    want = r - u[::4]
    ud = cupy.asarray(u)
    sums = []
    for _ in range(3):
        rd = cupy.asarray(r)
        sums.append(float(cupy_residual.subtract_sum_squares(rd, ud[::4])))
        np.testing.assert_array_equal(cupy.asnumpy(rd), want)
    assert sums[0] == sums[1] == sums[2]
    assert sums[0] == pytest.approx(float(np.sum(np.square(want, dtype=np.float64))),
                                    rel=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_plus_difference_kernel_writes_in_place_on_the_gpu(dtype):
    """cupy_fused.plus_difference as MGRIT calls it: ``u[C] + (w − v)`` into the C-rows (a
    strided view that is also the first input) and ``r + (v − g)`` into g (also the third
    input): NumPy's two operations bit for bit (additions only: nothing to contract), and
    CuPy copying no input that is the output (the result would be the same; the launch
    count would not: one launch)."""
    if "cupy" not in available_backends():
        pytest.skip("the cupy backend on a real GPU: none here")
    import cupy

    from refbraid.backends.cupy_fused import plus_difference

    rng = np.random.default_rng(13)
    u = rng.standard_normal((4 * 33, 64, 256)).astype(dtype)
    w, v, r = (rng.standard_normal((33, 64, 256)).astype(dtype) for _ in range(3))
    ud, wd, vd, rd = (cupy.asarray(a) for a in (u, w, v, r))
    rows = ud[::4]
    assert plus_difference(rows, rows, wd, vd)
    want = u.copy()
    want[::4] += w - v
    np.testing.assert_array_equal(cupy.asnumpy(ud), want)
    g = cupy.asarray(u[:33])
    assert plus_difference(g, rd, vd, g)
    np.testing.assert_array_equal(cupy.asnumpy(g), r + (v - u[:33]))
