"""MGRIT's FAS right-hand side and correction in one launch on CuPy arrays.

``g_Δ = r + (v − Φ_Δ(v))`` and ``u[C] ← u[C] + (w − v)`` were two passes over a level each
(a difference, then a sum); ``cupy_fused.plus_difference`` does both operations in one
element-wise kernel, in the same order. Oracles: the NumPy operations they replace (bit for
bit, on the counting CuPy stand-in, which runs the kernel's NumPy path), the whole
layer-parallel gradient with the kernel switched off (bit for bit), and launch counts (each
``plus_difference`` replaces one ``subtract`` and one ``add``). The kernel's CUDA C runs in
tests/cuda_c (the emulator) and compiles in tests/test_gpu_fused.py; what neither sees is
CuPy's own handling of an output that is also an input (it copies no input that *is* an
output array, cupy/_core/_kernel.pyx), checked on a GPU by tests/test_gpu.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from refbraid.backends import cupy_fused, launch_count
from refbraid.backends.host import to_host
from refbraid.mgrit import coarse

SHAPE = (3, 4, 5)


def _blocks(dtype, n=4, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(SHAPE).astype(dtype) for _ in range(n)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("alias", ["none", "a", "c"])
def test_plus_difference_has_the_bits_of_a_difference_then_a_sum(dtype, alias):
    a, b, c, o = _blocks(dtype)
    want = a + (b - c)
    with launch_count.counting("cupy") as bk:
        da, db, dc, do = (bk.asarray(x) for x in (a, b, c, o))
        out = {"none": do, "a": da, "c": dc}[alias]  # the correction: out is a; FAS: out is c
        counted = launch_count.count(lambda: cupy_fused.plus_difference(out, da, db, dc))
        np.testing.assert_array_equal(to_host(out), want)
    assert counted.by_name == {"plus_difference": 1}


def test_plus_difference_declines_what_its_kernel_does_not_take():
    a, b, c, o = _blocks(np.float64)
    assert not cupy_fused.plus_difference(o, a, b, c)  # NumPy arrays: the caller's NumPy path
    with launch_count.counting("cupy") as bk:
        da, db, dc, do = (bk.asarray(x) for x in (a, b, c, o))
        cases = [(do, da, db, bk.asarray(c.astype(np.float32))),  # mixed dtypes
                 (do, da, db, dc[:1]),  # broadcasting
                 (bk.asarray(o.astype(np.int64)), *(bk.asarray(x.astype(np.int64))
                                                    for x in (a, b, c)))]  # not floating
        for args in cases:
            assert not cupy_fused.plus_difference(*args)
        with cupy_fused.fused(False):
            assert not cupy_fused.plus_difference(do, da, db, dc)
        np.testing.assert_array_equal(to_host(do), o)  # nothing written


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_correction_adds_the_difference_into_the_c_rows_in_one_launch(dtype):
    u = np.random.default_rng(1).standard_normal((9, 4, 5)).astype(dtype)
    w, v = _blocks(dtype, 2, seed=2)
    c_pos = np.array([0, 4, 8])
    want = coarse.correct(u, c_pos, w, v)
    with launch_count.counting("cupy") as bk:
        du, dw, dv = (bk.asarray(x) for x in (u, w, v))
        counted = launch_count.count(lambda: coarse.correct(du, c_pos, dw, dv, inplace=True))
        np.testing.assert_array_equal(to_host(du), want)
        with cupy_fused.fused(False):
            before = launch_count.count(lambda: coarse.correct(bk.asarray(u), c_pos, dw, dv,
                                                               inplace=True))
    assert counted.by_name == {"plus_difference": 1}
    assert before.by_name == {"subtract": 1, "add": 1}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_fas_right_hand_side_given_the_coarse_steps_is_one_launch(dtype):
    """fas_sum given Φ_Δ's block: ``r + (v − Φ_Δ)`` as the NumPy path computes it (the
    batched fas_rhs, whose steps write Φ_Δ into g_Δ's rows, in the gradient below)."""
    rr, v, phi = _blocks(dtype, 3, seed=3)
    want = rr + (v - phi)
    with launch_count.counting("cupy") as bk:
        drr, dv, dphi = (bk.asarray(x) for x in (rr, v, phi))
        g = bk.xp.empty(SHAPE, dtype=dtype)
        counted = launch_count.count(lambda: coarse.fas_sum(drr, dv, dphi, out=g))
        np.testing.assert_array_equal(to_host(g), want)
    assert counted.by_name == {"plus_difference": 1}


@pytest.mark.parametrize("model", ["dense", "conv"])
def test_the_layer_parallel_gradient_keeps_its_bits_with_one_launch_per_pair(model,
                                                                             monkeypatch):
    """The whole batched layer-parallel gradient on cupy (TorchBraid's settings): the same
    bits with and without the kernel, and every ``plus_difference`` launch one ``subtract``
    and one ``add`` fewer; both callers (the correction, and the FAS right-hand side whose
    coarse steps wrote Φ_Δ into g_Δ) take it."""
    import sys

    from refbraid.network import to_backend
    from refbraid.training.gradients import mgrit_gradient

    net, params, x, labels = launch_count.build_model(model, 16, np.random.default_rng(0))
    settings = launch_count.default_settings()

    def gradient():
        with launch_count.counting("cupy") as bk:
            grad = mgrit_gradient(net, settings, bk)
            args = (to_backend(params, bk), bk.asarray(x), bk.asarray(labels))
            counted = launch_count.count(lambda: grad(*args))
            loss, g, _ = grad(*args)
            return loss, {k: to_host(v) for k, v in g.items()}, counted

    callers, kernel = set(), cupy_fused.plus_difference

    def recorded(*args):
        callers.add(sys._getframe(1).f_code.co_name)
        return kernel(*args)

    from refbraid.mgrit import batched, coarse

    def use(replacement):  # where MGRIT's modules took the kernel from
        for module in (batched, coarse):
            monkeypatch.setattr(module, "plus_difference", replacement)

    use(recorded)
    loss, fused, after = gradient()
    assert callers == {"correct", "fas_rhs"}
    use(lambda *args: False)
    loss_before, unfused, before = gradient()
    assert loss == loss_before
    for k, v in unfused.items():
        np.testing.assert_array_equal(fused[k], v, err_msg=k)
    pairs = after.by_name.get("plus_difference", 0)
    assert pairs >= 2  # a correction and a FAS right-hand side, at least
    assert before.launches - after.launches == pairs
    assert before.by_name["subtract"] - after.by_name.get("subtract", 0) == pairs
    assert before.by_name["add"] - after.by_name.get("add", 0) == pairs
