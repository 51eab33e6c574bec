"""The ``cuda`` backend's fused conv ODE step, k intervals at once, in Numba's CUDA simulator.

:func:`refbraid.backends.numba_cuda_conv_batched.conv_step_batched` is the whole forward
``Y_next = Y + h σ(W * Y + b)`` in one kernel, ``conv_step_batched_adjoint`` the adjoint in
two launches (four with the weight gradient). Oracles: the per-operation launches they
replace (``_composed_step`` / ``_composed_adjoint``: bit for bit, every activation, float32
and float64); the NumPy reference's :class:`ConvStep` batched methods (to round-off: the
convolutions sum in another order); the per-step ``cuda`` calls; the dot-product test and
central finite differences of the adjoint in float64; launch counts before and after,
counted on the CuPy stand-in; the new kernels compiled by NVVM for compute capability 9.0.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from refbraid.backends import get_backend
from refbraid.backends.reference import ACTIVATIONS
from refbraid.layers import ConvStep

numba = pytest.importorskip("numba")
if not numba.config.ENABLE_CUDASIM:
    pytest.skip("small simulator-sized cases (NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)
pytest.importorskip("numba.cuda")

from refbraid.backends import numba_cuda_conv_batched as NCB  # noqa: E402
from refbraid.verify.result import array_rel_error

TOL = {np.float64: 1e-12, np.float32: 1e-5}  # of the largest entry, against NumPy
K, B, C, H, WD = 3, 2, 2, 3, 4
STEPS = np.array([0.25, 0.5, 0.125])


def _case(dtype, seed=0, act="tanh"):
    """(layer, stacked params, Y, dY_next) on the host."""
    rng = np.random.default_rng(seed)
    layer = ConvStep(C, H, WD, act)
    per = [layer.init(rng, dtype) for _ in range(K)]
    params = {n: np.stack([p[n] for p in per]) for n in per[0]}
    Y, dY = (rng.standard_normal((K, B, C, H, WD)).astype(dtype) for _ in range(2))
    return layer, params, Y, dY



@pytest.fixture(scope="module")
def bk():
    return get_backend("cuda")


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_the_fused_step_has_the_bits_of_the_launches_it_replaces_and_numpys_values(
        bk, act, dtype):
    layer, params, Y, dY = _case(dtype, 1, act)
    d = {n: bk.asarray(v) for n, v in {**params, "Y": Y, "dY": dY}.items()}
    assert "conv_step_batched" in bk.overrides and "conv_step_batched_adjoint" in bk.overrides
    Y_next, Z = NCB.conv_step_batched(d["Y"], d["W"], d["b"], STEPS, act)
    Y_want, Z_want = NCB._composed_step(d["Y"], d["W"], d["b"], STEPS, act)
    np.testing.assert_array_equal(bk.to_numpy(Z), bk.to_numpy(Z_want))
    np.testing.assert_array_equal(bk.to_numpy(Y_next), bk.to_numpy(Y_want))
    np_bk = get_backend("numpy")
    Y_ref, Z_ref = layer.forward_batched(params, Y, STEPS, np_bk)
    assert array_rel_error(bk.to_numpy(Y_next), Y_ref)[0] <= TOL[dtype]
    assert array_rel_error(bk.to_numpy(Z), Z_ref)[0] <= TOL[dtype]
    for grads in (True, False):
        got = NCB.conv_step_batched_adjoint(d["Y"], Z, d["dY"], d["W"], STEPS, act, grads)
        want = NCB._composed_adjoint(d["Y"], Z, d["dY"], d["W"], STEPS, act, grads)
        ref_dY, ref_g = layer.adjoint_batched(params, Y, Z_ref, dY, STEPS, np_bk, grads)
        refs = (ref_dY, *((ref_g["W"], ref_g["b"]) if grads else (None, None)))
        for name, g, w, r in zip(("dY", "dW", "db"), got, want, refs, strict=True):
            if r is None:
                assert g is None and w is None, name
                continue
            np.testing.assert_array_equal(bk.to_numpy(g), bk.to_numpy(w), err_msg=name)
            assert bk.to_numpy(g).dtype == dtype, name
            assert array_rel_error(bk.to_numpy(g), r)[0] <= TOL[dtype], (name, grads)


def test_the_batched_step_equals_the_per_step_cuda_calls(bk):
    """Bit for bit in both dtypes: one step is the fused kernel too (numba_cuda_conv_step,
    the same roundings)."""
    for dtype in (np.float64, np.float32):
        layer, params, Y, dY = _case(dtype, 2)
        dev = {n: bk.asarray(v) for n, v in params.items()}
        Y_next, Z = layer.forward_batched(dev, bk.asarray(Y), STEPS, bk)
        dY_prev, grads = layer.adjoint_batched(dev, bk.asarray(Y), Z, bk.asarray(dY), STEPS, bk)
        for j in range(K):
            p = {n: bk.asarray(v[j]) for n, v in params.items()}
            y_next, cache = layer.forward(p, bk.asarray(Y[j]), float(STEPS[j]), bk)
            dy, g = layer.adjoint(p, cache, bk.asarray(dY[j]), float(STEPS[j]), bk)
            pairs = [("Y_next", Y_next, y_next), ("Z", Z, cache[1]), ("dY", dY_prev, dy),
                     *((n, grads[n], g[n]) for n in g)]
            for name, batched, per_step in pairs:
                got, want = bk.to_numpy(batched)[j], bk.to_numpy(per_step)
                np.testing.assert_array_equal(got, want, err_msg=f"{name} row {j} {dtype}")


def _conv(bk, X, W, b=None):
    return bk.to_numpy(NCB.conv2d_batched(bk.asarray(X), bk.asarray(W),
                                          None if b is None else bk.asarray(b)))


def test_the_fused_adjoint_passes_the_dot_product_test_in_float64(bk):
    """<J (v, δW, δb), w> = <v, dY> + <δW, dW> + <δb, db> for the step's Jacobian at (Y, W,
    b): J = v + h σ'(Z) ⊙ (W * v + δW * Y + δb), with the fused adjoint's (dY, dW, db) of w."""
    _, params, Y, w = _case(np.float64, 3)
    W, b = params["W"], params["b"]
    rng = np.random.default_rng(4)
    v, dW_dir, db_dir = (rng.standard_normal(a.shape) for a in (Y, W, b))
    _, Z = NCB.conv_step_batched(bk.asarray(Y), bk.asarray(W), bk.asarray(b), STEPS, "tanh")
    Z = bk.to_numpy(Z)
    lin = _conv(bk, v, W) + _conv(bk, Y, dW_dir) + db_dir[:, None, :, None, None]
    Jv = v + STEPS[:, None, None, None, None] * (1 - np.tanh(Z) ** 2) * lin
    dY, dW, db = map(bk.to_numpy, NCB.conv_step_batched_adjoint(
        bk.asarray(Y), bk.asarray(Z), bk.asarray(w), bk.asarray(W), STEPS, "tanh"))
    lhs, rhs = np.vdot(Jv, w), np.vdot(v, dY) + np.vdot(dW_dir, dW) + np.vdot(db_dir, db)
    np.testing.assert_allclose(lhs, rhs, rtol=1e-12)


def test_the_fused_adjoint_matches_central_finite_differences_in_float64(bk):
    """d<Φ(Y, W, b), w>/dθ at sampled entries θ of Y, W and b, central differences, ε 1e-6."""
    _, params, Y, w = _case(np.float64, 5)
    args = {"Y": Y, "W": params["W"], "b": params["b"]}

    def f(a):
        y_next, _ = NCB.conv_step_batched(*(bk.asarray(a[n]) for n in ("Y", "W", "b")),
                                          STEPS, "tanh")
        return float(np.vdot(bk.to_numpy(y_next), w))

    _, Z = NCB.conv_step_batched(*(bk.asarray(args[n]) for n in ("Y", "W", "b")), STEPS, "tanh")
    grads = dict(zip(("Y", "W", "b"), map(bk.to_numpy, NCB.conv_step_batched_adjoint(
        bk.asarray(Y), Z, bk.asarray(w), bk.asarray(args["W"]), STEPS, "tanh")), strict=True))
    rng, eps = np.random.default_rng(6), 1e-6
    for name, a in args.items():
        for flat in rng.choice(a.size, size=4, replace=False):
            at = np.unravel_index(flat, a.shape)
            plus, minus = ({**args, name: a.copy()} for _ in range(2))
            plus[name][at] += eps
            minus[name][at] -= eps
            fd = (f(plus) - f(minus)) / (2 * eps)
            assert abs(fd - grads[name][at]) <= 1e-7 * max(1.0, abs(fd)), (
                f"ConvStep cuda fused adjoint: d{name} at {at}: {grads[name][at]} vs FD {fd}")


def _launches(fn) -> int:
    from refbraid.backends import launch_count

    return launch_count.count(fn).launches


def test_launches_before_and_after():
    """One batched forward: 4 launches (convolution, σ, ×h, +) → 1; the adjoint without the
    weight gradient 4 (σ'·dy, ×h, transposed convolution, +) → 2, with it 6 → 4."""
    from refbraid.backends import launch_count

    _, params, Y, dY = _case(np.float64, 7)
    with launch_count.counting("cuda") as cbk:
        Yd, Wd, bd, dYd = (cbk.asarray(a) for a in (Y, params["W"], params["b"], dY))
        _, Z = NCB.conv_step_batched(Yd, Wd, bd, STEPS, "tanh")  # step sizes copied once
        NCB._composed_step(Yd, Wd, bd, STEPS, "tanh")
        assert _launches(lambda: NCB._composed_step(Yd, Wd, bd, STEPS, "tanh")) == 4
        assert _launches(lambda: NCB.conv_step_batched(Yd, Wd, bd, STEPS, "tanh")) == 1
        for grads, before, after in ((False, 4, 2), (True, 6, 4)):
            assert _launches(lambda g=grads: NCB._composed_adjoint(
                Yd, Z, dYd, Wd, STEPS, "tanh", g)) == before
            assert _launches(lambda g=grads: NCB.conv_step_batched_adjoint(
                Yd, Z, dYd, Wd, STEPS, "tanh", g)) == after


def test_bad_arguments_are_named(bk):
    _, params, Y, _ = _case(np.float64, 8)
    W = np.concatenate([params["W"], params["W"]], axis=1)  # 2C output channels
    with pytest.raises(ValueError, match="`W` must map the 2 channels"):
        NCB.conv_step_batched(Y, W, np.concatenate([params["b"]] * 2, axis=1), STEPS, "tanh")
    with pytest.raises(ValueError, match="`b` must have shape"):
        NCB.conv_step_batched(Y, params["W"], params["b"][:, :1], STEPS, "tanh")


_COMPILE = textwrap.dedent("""
    import numba
    from numba import cuda
    from numba.cuda import dispatcher
    from numba.cuda.cudadrv.nvvm import NVVM
    NVVM()
    from refbraid.backends.numba_cuda_conv_batched import (
        _conv_step_rows_kernel, _conv2d_dx_rows_kernel, _conv2d_rows_kernel)
    class Target:  # device functions ask for the current GPU: answer with the target
        compute_capability = (9, 0)
    dispatcher.get_current_device = lambda: Target()
    for t in (numba.float32, numba.float64):
        a5, a2, a1 = t[:, :, :, :, ::1], t[:, ::1], t[::1]
        sigs = [(_conv_step_rows_kernel, (a5, a5, a2, a1, numba.int64, a5, a5)),
                (_conv2d_rows_kernel, (a5, a5, a2, numba.boolean, a5)),
                (_conv2d_dx_rows_kernel, (a5, a5, a5, numba.boolean, a5))]
        for k, sig in sigs:
            cuda.compile_ptx(k.py_func, sig, cc=(9, 0))
    print("compiled")
""")


def test_the_fused_conv_kernels_compile_for_compute_capability_9():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    run = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True,
                         text=True, timeout=600)
    if "compiled" not in run.stdout and ("NVVM" in run.stderr or "libnvvm" in run.stderr):
        pytest.skip("needs NVIDIA's NVVM (pip install 'numba-cuda[cu13]')")
    assert "compiled" in run.stdout, run.stderr[-3000:]
