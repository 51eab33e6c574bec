"""The dense step's adjoint without the weight gradient (MGRIT's relaxation): two launches.

``dy = dy_next + s W`` with ``s = h σ'(z) ⊙ dy_next``: the addition rides in the GEMM.

* ``cuda`` (Numba's simulator): the tiled / per-element GEMM adds ``dy_next`` in its epilogue
  (``numba_cuda_dense._store``, the product rounded first), one step and k at once: the
  scaled-adjoint kernel and the GEMM, before three launches (+ in the glue).
* ``cupy`` (the counting stand-in), one step: ``s`` and a copy of ``dy_next`` in one kernel,
  then cuBLAS's GEMM with β = 1 into the copy (``cupy_fused.GEMM_ACCUMULATE``), before three
  launches (the kernel, the GEMM, +). k at once stays three (CuPy offers no batched GEMM
  with β = 1).

Oracles: dy with the weight gradient (the same roundings: bit for bit), the NumPy reference
(cupy: bit for bit; cuda: within 1e-12 / 1e-5 of the largest entry, its GEMM sums in
float64), per-step against batched rows, the dot-product test and central finite differences
in float64, launch counts before and after.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest

from refbraid.backends import get_backend, launch_count, reference, reference_batched
from refbraid.backends.host import to_host
from refbraid.backends.launch_model import tracking
from refbraid.backends.reference import ACTIVATIONS

RTOL = {np.float64: 1e-12, np.float32: 1e-5}
K, B, C = 3, 4, 5
STEPS = np.array([0.1, 0.25, 0.1])


def _data(dtype, *shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _cuda():
    from refbraid.backends.numba_cuda import simulated

    if not simulated():
        pytest.skip("the simulator's device arrays (NUMBA_ENABLE_CUDASIM=1)")
    return get_backend("cuda")


def _args(dtype):
    return [_data(dtype, K, *s, seed=i) for i, s in enumerate([(B, C), (B, C), (B, C), (C, C)])]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("name", ["cuda", "cupy"])
def test_dy_without_the_weight_gradient_has_the_bits_of_dy_with_it(name, act, dtype):
    Y, Z, dY, W = _args(dtype)
    with launch_count.counting("cupy") if name == "cupy" else nullcontext() as counted:
        bk = counted if name == "cupy" else _cuda()
        dev = [bk.asarray(a) for a in (Y, Z, dY, W)]
        for j in range(K):  # one step
            row = [a[j, ...] for a in dev]
            h = float(STEPS[j])
            alone = to_host(bk.dense_step_adjoint(*row, h, act, False)[0])
            np.testing.assert_array_equal(alone, to_host(bk.dense_step_adjoint(*row, h, act)[0]))
            want = reference_batched.dense_step_adjoint(Y[j], Z[j], dY[j], W[j], h, act, False)[0]
            _close(name, alone, want, dtype)
        batched = to_host(bk.dense_step_batched_adjoint(*dev, STEPS, act, False)[0])
        np.testing.assert_array_equal(
            batched, to_host(bk.dense_step_batched_adjoint(*dev, STEPS, act, True)[0]))
        _close(name, batched,
               reference_batched.dense_step_batched_adjoint(Y, Z, dY, W, STEPS, act, False)[0],
               dtype)
        if name == "cuda":  # every batched row: the per-step call's bits
            for j in range(K):
                one = bk.dense_step_adjoint(*[a[j, ...] for a in dev], float(STEPS[j]), act,
                                            False)[0]
                np.testing.assert_array_equal(batched[j], to_host(one))


def _close(name, got, want, dtype):
    assert got.dtype == want.dtype == dtype
    if name == "cupy":  # the stand-in runs the reference's operations: its bits
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=0, atol=RTOL[dtype] * np.abs(want).max())


@pytest.mark.parametrize("name", ["cuda", "cupy"])
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_the_adjoint_passes_the_dot_product_test_and_finite_differences(name, act):
    """float64: <J v, w> = <v, dy> with J v = v + h σ'(z) ⊙ (v Wᵀ) at z = y Wᵀ + b, and
    central differences (ε 1e-6) of <Φ(y), w> along v."""
    rng = np.random.default_rng(3)
    y, v, w = (rng.standard_normal((B, C)) for _ in range(3))
    W, b, h = rng.standard_normal((C, C)), rng.standard_normal(C), 0.37
    z = reference.linear(y, W, b)
    with launch_count.counting("cupy") if name == "cupy" else nullcontext() as counted:
        bk = counted if name == "cupy" else _cuda()
        dy = to_host(bk.dense_step_adjoint(*(bk.asarray(a) for a in (y, z, w, W)), h, act,
                                           False)[0])
    Jv = v + h * reference.activation_adjoint(z, v @ W.T, act)
    assert np.vdot(Jv, w) == pytest.approx(np.vdot(v, dy), rel=1e-12), f"{name} {act}"

    def phi(t):
        return reference_batched.dense_step(y + t * v, W, b, h, act)[0]

    fd = np.vdot((phi(1e-6) - phi(-1e-6)) / 2e-6, w)
    assert fd == pytest.approx(np.vdot(v, dy), rel=1e-7), f"{name} {act}: finite differences"


def test_cuda_launches_before_and_after():
    """One step and k at once: the scaled-adjoint kernel and one GEMM (2), where the GEMM
    and the glue's + were two (3 in all)."""
    from refbraid.backends import numba_cuda_dense

    _cuda()
    Y, Z, dY, W = _args(np.float64)
    with launch_count.counting("cuda") as bk:
        dev = [bk.asarray(a) for a in (Y, Z, dY, W)]
        row = [a[0, ...] for a in dev]
        S = bk.asarray(Z[0])
        before = launch_count.count(lambda: row[2] + numba_cuda_dense.matmul(S, row[3]))
        assert before.launches == 2  # + the scaled-adjoint kernel: 3
        with tracking() as t:
            bk.dense_step_adjoint(*row, 0.1, "tanh", False)
        assert t.tally.by_name == {"_scaled_adjoint_kernel": 1, "_gemm_small_kernel": 1}
        with tracking() as t:
            bk.dense_step_batched_adjoint(*dev, STEPS, "tanh", False)
        assert t.tally.by_name == {"_scaled_adjoint_rows_kernel": 1,
                                   "_gemm_batched_small_kernel": 1}


def test_cupy_launches_before_and_after():
    """One step: ``scaled_act_adjoint_copy`` and ``gemm_accumulate`` (2), where the fused
    scaled adjoint, the GEMM and + were 3; k at once unchanged (3)."""
    from refbraid.backends.cupy_fused import SCALED_ACT_ADJOINT

    Y, Z, dY, W = _args(np.float64)
    with launch_count.counting("cupy") as bk:
        dev = [bk.asarray(a) for a in (Y, Z, dY, W)]
        y, z, dy, Wj = (a[0, ...] for a in dev)
        before = launch_count.count(
            lambda: dy + SCALED_ACT_ADJOINT("tanh", z, dy, 0.1) @ Wj).launches
        after = launch_count.count(lambda: bk.dense_step_adjoint(y, z, dy, Wj, 0.1, "tanh",
                                                                 False))
        assert (before, after.launches) == (3, 2)
        assert after.by_name == {"scaled_act_adjoint_copy": 1, "gemm_accumulate": 1}
        batched = launch_count.count(lambda: bk.dense_step_batched_adjoint(
            *dev, np.full(K, 0.1), "tanh", False))
        assert batched.launches == 3


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cupy_steps_write_y_next_plus_g_into_a_row_of_the_iterate(dtype):
    """The coarsest solve hands a dense step (forward, and the adjoint without the weight
    gradient) a row of its block and the right-hand side there: ``y_next + g`` written by
    bias_act_euler_add (one launch after the GEMM, as without the row), ``dy_next + s W``
    made in the row by the copy and the GEMM, then ``+ g`` in place (three launches, where a
    new sum and its copy made four). The same bits as the step followed by ``+ g``."""
    from refbraid.layers import DenseStep

    layer = DenseStep(C, "tanh")
    params = layer.init(np.random.default_rng(1), dtype)
    y, g, dy = (_data(dtype, B, C, seed=s) for s in (2, 3, 4))
    with launch_count.counting("cupy") as bk:
        p = {n: bk.asarray(v) for n, v in params.items()}
        yd, gd, dyd = bk.asarray(y), bk.asarray(g), bk.asarray(dy)
        block = bk.xp.zeros((3, B, C), dtype=dtype)
        y_next, cache = layer.forward(p, yd, 0.25, bk)
        dy_prev, _ = layer.adjoint(p, cache, dyd, 0.25, bk, False)
        cases = [
            (lambda: layer.forward(p, yd, 0.25, bk, out=block[1], add=gd)[0], y_next + gd, 2),
            (lambda: layer.adjoint(p, cache, dyd, 0.25, bk, False, out=block[2], add=gd)[0],
             dy_prev + gd, 3)]
        for j, (run, want, launches) in enumerate(cases):
            assert run() is not None
            np.testing.assert_array_equal(to_host(block[j + 1]), to_host(want))
            assert launch_count.count(run).launches == launches
