"""A dense ODE step on a GPU backend is its GEMMs plus fused kernels, and equals the reference.

* ``cupy`` (on the counting device: the fused kernels' NumPy path, what runs off a GPU): the
  step ``y + h σ(y Wᵀ + b)`` is one GEMM and one kernel, its adjoint the GEMMs, one kernel
  for ``h σ'(z) ⊙ dy`` and one for ``dy_next + s W`` with the bias gradient (without it: one
  kernel for ``s`` and a copy of dy, and the GEMM adding ``s W`` into it); bit-identical to
  the NumPy reference, every activation, float32 and float64, per step and batched.
* ``cuda`` (Numba's simulator): the adjoint's new kernels (refbraid.backends.numba_cuda_step)
  are bit-identical to the per-operation cuda path they replace, and within round-off of
  NumPy's reference (the column sum accumulates in float64, the GEMMs in float64: ≤ 1e-12
  relative in float64, ≤ 1e-5 in float32, of the largest entry).
* The adjoint of the fused step passes the dot-product test (float64, exact tangent) and
  central finite differences on both backends.
* The batched sweeps' host→device copies: a gradient copies each distinct index array once,
  a second gradient of the same gradient function none.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest

from refbraid.backends import get_backend, launch_count, reference, reference_batched
from refbraid.backends.device_batching import (
    DeviceCopies,
    copied_once,
    copies_cached,
    gathered_once,
    gathers_cached,
)
from refbraid.backends.host import to_host
from refbraid.backends.launch_model import tracking
from refbraid.backends.reference import ACTIVATIONS
from refbraid.layers import DenseStep

NUMPY = get_backend("numpy")
RTOL = {np.float64: 1e-12, np.float32: 1e-5}


def _data(dtype, *shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _simulated() -> bool:
    from refbraid.backends.numba_cuda import simulated

    return simulated()


def _run_step(layer, bk, params, y, dy, h, grads):
    """(y_next, dy_prev, dW, db) of one step through ``bk``, on the host."""
    p = {k: bk.asarray(v) for k, v in params.items()}
    y_next, cache = layer.forward(p, bk.asarray(y), h, bk)
    dy_prev, d = layer.adjoint(p, cache, bk.asarray(dy), h, bk, grads=grads)
    out = [to_host(y_next), to_host(dy_prev)]
    return out + ([to_host(d["W"]), to_host(d["b"])] if grads else [])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_the_cupy_step_is_one_gemm_and_one_kernel_with_the_reference_bits(act, dtype):
    layer, h = DenseStep(5, act), 0.37
    params = {"W": _data(dtype, 5, 5, seed=1), "b": _data(dtype, 5, seed=2)}
    y, dy = _data(dtype, 4, 5, seed=3), _data(dtype, 4, 5, seed=4)
    for grads in (True, False):
        want = _run_step(layer, NUMPY, params, y, dy, h, grads)
        with launch_count.counting("cupy") as bk:
            p = {k: bk.asarray(v) for k, v in params.items()}
            yd, dyd = bk.asarray(y), bk.asarray(dy)
            with tracking() as fwd:
                _, cache = layer.forward(p, yd, h, bk)
            with tracking() as adj:
                layer.adjoint(p, cache, dyd, h, bk, grads=grads)
            got = _run_step(layer, bk, params, y, dy, h, grads)
        assert fwd.tally.by_name == {"matmul": 1, "bias_act_euler": 1}
        want_adj = ({"scaled_act_adjoint": 1, "matmul": 2, "add_column_sums": 1} if grads
                    else {"scaled_act_adjoint_copy": 1, "gemm_accumulate": 1})
        assert adj.tally.by_name == want_adj
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            np.testing.assert_array_equal(g, w, err_msg=f"output {k}, grads={grads}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_cupy_batched_adjoint_fuses_the_sum_with_the_bias_gradient(dtype):
    W, Y = _data(dtype, 3, 5, 5, seed=1), _data(dtype, 3, 4, 5, seed=2)
    b, dY, h = _data(dtype, 3, 5, seed=3), _data(dtype, 3, 4, 5, seed=4), [0.1, 0.2, 0.1]
    want_next, Z = reference_batched.dense_step_batched(Y, W, b, h, "tanh")
    want = reference_batched.dense_step_batched_adjoint(Y, Z, dY, W, h, "tanh")
    with launch_count.counting("cupy") as bk:
        args = [bk.asarray(a) for a in (Y, Z, dY, W)]
        with tracking() as t:
            got = bk.dense_step_batched_adjoint(*args, h, "tanh")
        got = [to_host(g) for g in got]
    # no copy of Sᵀ before dW = Sᵀ Y: the strided-batched GEMM reads it transposed
    # (cupy_blas.product; CuPy's batched matmul would copy it first)
    assert t.tally.by_name == {"scaled_act_adjoint": 1, "matmul": 2, "add_column_sums": 1}
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def _composed_cuda(y, z, dy, W, h, act, grads):
    """The per-operation cuda path the fused adjoint replaced (numba_cuda_step._composed)."""
    from refbraid.backends import numba_cuda_step

    return numba_cuda_step._composed(y, z, dy, W, h, act, grads)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_the_cuda_adjoint_kernels_equal_the_per_operation_path_and_the_reference(act, dtype):
    if not _simulated():
        pytest.skip("the simulator's device arrays (NUMBA_ENABLE_CUDASIM=1)")
    from refbraid.backends import numba_cuda_step

    bk = get_backend("cuda")
    assert bk.dense_step_adjoint is numba_cuda_step.dense_step_adjoint
    y, z, dy, W = (_data(dtype, *s, seed=i) for i, s in
                   enumerate([(4, 5), (4, 5), (4, 5), (5, 5)]))
    h = 0.37
    dev = [bk.asarray(a) for a in (y, z, dy, W)]
    for grads in (True, False):
        got = bk.dense_step_adjoint(*dev, h, act, grads)
        same = _composed_cuda(*dev, h, act, grads)
        want = reference_batched.dense_step_adjoint(y, z, dy, W, h, act, grads)
        for k, (g, s, w) in enumerate(zip(got, same, want, strict=True)):
            if w is None:
                assert g is None and s is None
                continue
            g = to_host(g)
            np.testing.assert_array_equal(g, to_host(s), err_msg=f"output {k}")
            assert g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=0, atol=RTOL[dtype] * np.abs(w).max(),
                                       err_msg=f"output {k}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_cuda_batched_adjoint_equals_per_step_calls_bit_for_bit(dtype):
    if not _simulated():
        pytest.skip("the simulator's device arrays (NUMBA_ENABLE_CUDASIM=1)")
    bk, k = get_backend("cuda"), 3
    Y, Z, dY = (_data(dtype, k, 4, 5, seed=s) for s in range(3))
    W, h = _data(dtype, k, 5, 5, seed=3), np.array([0.1, 0.25, 0.1])
    dev = [bk.asarray(a) for a in (Y, Z, dY, W)]
    dY_prev, dW, db = bk.dense_step_batched_adjoint(*dev, h, "tanh", True)
    for j in range(k):
        one = bk.dense_step_adjoint(*[a[j, ...] for a in dev], float(h[j]), "tanh", True)
        for got, want in zip((dY_prev, dW, db), one, strict=True):
            np.testing.assert_array_equal(to_host(got)[j], to_host(want))
    want = reference_batched.dense_step_batched_adjoint(Y, Z, dY, W, h, "tanh")
    for got, w in zip((dY_prev, dW, db), want, strict=True):
        np.testing.assert_allclose(to_host(got), w, rtol=0, atol=RTOL[dtype] * np.abs(w).max())


def _tangent(y, W, b, h, act, v, dW, db):
    """J (v, dW, db) of y_next = y + h σ(y Wᵀ + b), exactly: v + h σ'(z) ⊙ (v Wᵀ + y dWᵀ + db)."""
    z = reference.linear(y, W, b)
    return v + h * reference.activation_adjoint(z, v @ W.T + y @ dW.T + db, act)


@pytest.mark.parametrize("name", ["cupy", "cuda"])
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_the_fused_adjoint_passes_the_dot_product_test_and_finite_differences(name, act):
    if name == "cuda" and not _simulated():
        pytest.skip("the simulator's device arrays (NUMBA_ENABLE_CUDASIM=1)")
    layer, h, rng = DenseStep(5, act), 0.37, np.random.default_rng(11)
    y, W, b = rng.standard_normal((4, 5)), rng.standard_normal((5, 5)), rng.standard_normal(5)
    v, dW, db, w = (rng.standard_normal(s) for s in ((4, 5), (5, 5), (5,), (4, 5)))
    with launch_count.counting("cupy") if name == "cupy" else nullcontext() as counted:
        bk = counted if name == "cupy" else get_backend("cuda")
        p = {"W": bk.asarray(W), "b": bk.asarray(b)}
        _, cache = layer.forward(p, bk.asarray(y), h, bk)
        ybar, d = layer.adjoint(p, cache, bk.asarray(w), h, bk, grads=True)
        ybar, gW, gb = to_host(ybar), to_host(d["W"]), to_host(d["b"])

        def f(t):
            pt = {"W": bk.asarray(W + t * dW), "b": bk.asarray(b + t * db)}
            return to_host(layer.forward(pt, bk.asarray(y + t * v), h, bk)[0])

        eps = 1e-6
        fd = (f(eps) - f(-eps)) / (2 * eps)
    lhs = np.sum(_tangent(y, W, b, h, act, v, dW, db) * w)
    rhs = np.sum(v * ybar) + np.sum(dW * gW) + np.sum(db * gb)
    assert lhs == pytest.approx(rhs, rel=1e-12), f"{name} {act}: <Jv,w> {lhs} vs <v,Jᵀw> {rhs}"
    assert np.sum(fd * w) == pytest.approx(rhs, rel=1e-7), f"{name} {act}: finite differences"


# ----------------------------------------------------------------------------- copies
def test_device_copies_are_made_once_per_content_and_device():
    made = []

    def make(v):
        made.append(v.copy())
        return v.copy()

    cache = DeviceCopies(limit=2)
    with copies_cached(cache):
        a = copied_once("gpu0", np.array([1, 2, 3]), make)
        assert copied_once("gpu0", np.array([1, 2, 3]), make) is a
        copied_once("gpu1", np.array([1, 2, 3]), make)  # another device
        copied_once("gpu0", np.array([1, 2, 4]), make)  # other content: the oldest dropped
    assert len(made) == 3 and len(cache) == 2
    copied_once("gpu0", np.array([1, 2, 3]), make)  # outside the block: a fresh copy
    assert len(made) == 4


def test_gathers_are_kept_only_within_their_block():
    rows, calls = np.arange(12.0).reshape(6, 2), []

    def gather():
        calls.append(1)
        return rows[[0, 2]]

    with gathers_cached():
        first = gathered_once(rows, np.array([0, 2]), gather)
        assert gathered_once(rows, np.array([0, 2]), gather) is first
    with gathers_cached(False):
        gathered_once(rows, np.array([0, 2]), gather)
    assert len(calls) == 2


def test_evenly_spaced_weight_rows_are_views_and_descending_ones_share_one_reversed_copy():
    """device_batching.weight_rows: the rows a batched kernel reads in place (cupy's dense and
    conv steps: the strided-batched GEMM, the direct convolution's row offset and stride) —
    ascending evenly spaced rows a view of the stack, descending ones a view of the stack
    reversed (one copy per array within a gradient), anything else the gather; row j is
    ``rows[idx[j]]`` each time, bit for bit."""
    from refbraid.backends.device_batching import evenly_spaced, weight_rows

    rows = np.arange(40.0).reshape(10, 2, 2)
    gathers = []

    def gather(idx):
        return lambda: gathers.append(idx) or rows[idx]

    assert evenly_spaced(np.array([3])) == (3, 1) and evenly_spaced(np.array([9, 5, 1])) == (9, -4)
    assert evenly_spaced(np.array([1, 2, 4])) is None and evenly_spaced(np.array([2, 2])) is None
    with gathers_cached():
        up = weight_rows(rows, np.array([1, 4, 7]), gather([1, 4, 7]))
        down = [weight_rows(rows, np.array(i), gather(i)) for i in ([9, 5, 1], [8, 4], [6])]
        odd = weight_rows(rows, np.array([0, 1, 3]), gather([0, 1, 3]))
    assert np.shares_memory(up, rows) and gathers == [[0, 1, 3]]
    assert len({id(d.base) for d in down[:2]}) == 1 and not np.shares_memory(down[0], rows)
    for got, idx in zip((up, *down, odd), ([1, 4, 7], [9, 5, 1], [8, 4], [6], [0, 1, 3]),
                        strict=True):
        np.testing.assert_array_equal(got, rows[idx])


def test_the_dense_and_conv_sweeps_read_their_weights_without_a_gather():
    """On the counting device (cupy's launches): the stacked weights of a batched dense or
    conv sweep cost no launch for ascending layers and one copy per weight for all the
    descending sweeps of a gradient together (the reversed stack); the transformer's and the
    GRU's weights are still gathered (their kernels copy strided operands at every call)."""
    from refbraid.backends.device_batching import rows_read_in_place
    from refbraid.layers import ConvStep, EncoderStep, GRUCell
    from refbraid.network import layers_params, to_backend

    with launch_count.counting("cupy") as bk:
        steps = to_backend({"W": np.ones((16, 4, 4, 3, 3)), "b": np.ones((16, 4))}, bk)
        for layer in (DenseStep(4), ConvStep(4, 5, 5)):
            with gathers_cached(), tracking() as t:
                for idx in ([0, 4, 8, 12], [1, 5, 9, 13], [15, 11, 7, 3], [14, 10, 6, 2]):
                    got = layers_params(steps, np.array(idx), bk, rows_read_in_place(layer, bk))
                    np.testing.assert_array_equal(to_host(got["W"]), to_host(steps["W"])[idx])
            assert t.tally.launches == 2, t.tally.row()  # W and b reversed, once each
    assert not rows_read_in_place(DenseStep(4), NUMPY)
    assert not rows_read_in_place(EncoderStep(8, 2, 16, 5), bk)
    assert not rows_read_in_place(GRUCell(4, 4), bk)


@pytest.mark.parametrize("model", ["dense", "conv", "gru"])
def test_a_batched_gradient_copies_each_index_array_once_and_the_next_gradient_none(model):
    from refbraid.backends.device_batching import sweeps_batched
    from refbraid.network import to_backend
    from refbraid.training.gradients import mgrit_gradient

    net, params, x, labels = launch_count.build_model(model, 16, np.random.default_rng(0))
    with launch_count.counting("cupy") as bk:
        p, xb, yb = to_backend(params, bk), bk.asarray(x), bk.asarray(labels)
        grad = mgrit_gradient(net, launch_count.default_settings(), bk)
        with sweeps_batched(True):
            with tracking() as first:
                loss1, g1, _ = grad(p, xb, yb)
            with tracking() as second:
                loss2, g2, _ = grad(p, xb, yb)
        g1 = {k: to_host(v) for k, v in g1.items()}
        g2 = {k: to_host(v) for k, v in g2.items()}
    assert second.tally.h2d == 0, second.tally.row()
    assert 0 < first.tally.h2d
    assert loss1 == loss2
    for k in g1:
        np.testing.assert_array_equal(g1[k], g2[k], err_msg=k)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_cuda_column_sums_split_rows_and_columns_and_agree_with_each_other(dtype):
    """The column sums of the cuda backend fill a block with up to 32 columns × 8 row
    groups, the groups' partial sums added in a fixed tree: four groups of 18 rows and a
    partial last tile of columns here (Numba's simulator). The fused adjoint's db equals
    the composed path's (``linear_adjoint``'s column-sum kernel) bit for bit, one row of a
    stack equals the same row alone, and both are NumPy's sums to round-off."""
    if not _simulated():
        pytest.skip("the simulator's kernels")
    from refbraid.backends import numba_cuda_dense, numba_cuda_step
    from refbraid.backends.numba_cuda_memory import KernelCall

    assert numba_cuda_dense.column_sum_geometry(1024, 256) == (32, 8)  # a GPU-sized step
    assert numba_cuda_dense.column_sum_geometry(70, 40) == (32, 4)  # below: 2 tiles, a tree
    assert numba_cuda_dense.column_sum_geometry(4, 3) == (4, 1)
    k, B, C = 2, 70, 40
    p, dy_next, s = (_data(dtype, k, B, C, seed=i) for i in range(3))

    def fused(p, dy_next, s):
        n = p.shape[0]
        call = KernelCall(p, dy_next, s)
        args = [call.arg(a, dtype, (n * B * C,)) for a in (p, s)]
        dY, db = numba_cuda_step.add_column_sums(call, args[0], dy_next, args[1], dtype, n,
                                                 B, C)
        return call.result(dY), call.result(db)

    dY, db = fused(p, dy_next, s)
    np.testing.assert_array_equal(dY, dy_next + p)
    np.testing.assert_allclose(db, s.sum(axis=1, dtype=np.float64).astype(dtype),
                               rtol=RTOL[dtype], atol=RTOL[dtype] * np.abs(s).sum(axis=1).max())
    alone = fused(*(np.ascontiguousarray(a[1:]) for a in (p, dy_next, s)))[1]
    np.testing.assert_array_equal(alone[0], db[1])
    W = _data(dtype, C, 3, seed=5)
    composed_db = numba_cuda_dense.linear_adjoint(_data(dtype, B, 3, seed=6), W, s[0])[2]
    np.testing.assert_array_equal(composed_db, db[0])
