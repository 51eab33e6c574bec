"""The ``cupy`` backend's conv ODE step: one convolution kernel forward, one or two back.

On the counting device (the CuPy stand-in: each kernel runs its NumPy path and is charged
one launch) :class:`ConvStep`'s forward is the direct convolution kernel with the bias per
channel, activation and Euler update as its epilogue (:mod:`refbraid.backends.cupy_conv`), or
with ``REFBRAID_CUPY_CONV=im2col`` the column matrix and a GEMM, then ``bias_act_euler`` (both
forms tested); its adjoint the transposed convolution staging ``h σ'(z) ⊙ dy`` as it reads
its input (dy_next added in its epilogue), and the weight gradient forming it as it sums;
one step and k at once (the
kernels' own CUDA C: tests/cuda_c/test_raw_kernels.py). Oracles: the NumPy reference to
round-off (every activation, float32 and float64: a convolution sums a point's C·s² products
in its own order, the element-wise work is the reference's), the catalogue's convolution
kernels likewise; launch counts against the
composition they replace; the dot-product test and central finite differences of the adjoint
in float64.
"""

from __future__ import annotations

import numpy as np
import pytest

from refbraid.backends import get_backend, launch_count, reference, reference_batched
from refbraid.backends.cupy_fused import ACT_ADJOINT_KERNEL, EULER_ACT
from refbraid.backends.device_batching import values_on
from refbraid.backends.host import to_host
from refbraid.backends.launch_model import tracking
from refbraid.backends.reference import ACTIVATIONS
from refbraid.layers import ConvStep

NUMPY = get_backend("numpy")
#: the cupy backend's two forms of a convolution (cupy_conv.CONV_ENV)
FORMS = ["direct", "im2col"]
#: round-off of a convolution summed in another order than the stencil-summed reference, in
#: ulps of the largest entry (measured ≤ 2 at these sizes)
ULPS = 16
K, B, C, H, WD = 3, 2, 2, 3, 4
STEPS = np.array([0.25, 0.5, 0.25])


def _case(dtype, seed=0, act="tanh"):
    rng = np.random.default_rng(seed)
    layer = ConvStep(C, H, WD, act)
    per = [layer.init(rng, dtype) for _ in range(K)]
    params = {n: np.stack([p[n] for p in per]) for n in per[0]}
    Y, dY = (rng.standard_normal((K, B, C, H, WD)).astype(dtype) for _ in range(2))
    return layer, params, Y, dY


def _step(layer, bk, params, Y, dY, grads, batched: bool):
    """Host copies of (Y_next, Z, dY_prev, dW, db) through ``bk``: k steps at once or row 0."""
    p = {n: bk.asarray(v if batched else v[0]) for n, v in params.items()}
    y, dy = bk.asarray(Y if batched else Y[0]), bk.asarray(dY if batched else dY[0])
    if batched:
        y_next, z = layer.forward_batched(p, y, STEPS, bk)
        dy_prev, g = layer.adjoint_batched(p, y, z, dy, STEPS, bk, grads)
    else:
        y_next, cache = layer.forward(p, y, float(STEPS[0]), bk)
        z = cache[1]
        dy_prev, g = layer.adjoint(p, cache, dy, float(STEPS[0]), bk, grads)
    return [to_host(a) for a in (y_next, z, dy_prev, *((g["W"], g["b"]) if grads else ()))]


@pytest.mark.parametrize("batched", [False, True], ids=["per-step", "batched"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("form", FORMS)
def test_the_fused_conv_step_matches_the_numpy_reference(form, act, dtype, batched, monkeypatch):
    from refbraid.backends import cupy_conv

    monkeypatch.setenv(cupy_conv.CONV_ENV, form)
    layer, params, Y, dY = _case(dtype, 1, act)
    for grads in (True, False):
        want = _step(layer, NUMPY, params, Y, dY, grads, batched)
        with launch_count.counting("cupy") as bk:
            assert {"conv_step", "conv_step_batched_adjoint"} <= set(bk.overrides)
            with tracking() as t:
                got = _step(layer, bk, params, Y, dY, grads, batched)
        fused = {"direct": {"conv_direct": 2}, "im2col": {"bias_act_euler": 1}}[form]
        assert fused.items() <= t.tally.by_name.items(), t.tally.by_name  # forward: one launch
        # h σ'(z) ⊙ dy: made by the direct kernels as they read it (no launch of its own)
        scaled = 0 if form == "direct" else 1
        assert t.tally.by_name.get("scaled_act_adjoint", 0) == scaled, t.tally.by_name
        assert "euler_act" not in t.tally.by_name and "act_adjoint" not in t.tally.by_name
        assert form == "im2col" or "add" not in t.tally.by_name  # dy_next: the epilogue's
        for name, g, w in zip(("Y_next", "Z", "dY", "dW", "db"), got, want, strict=False):
            assert g.dtype == w.dtype == dtype, name
            _close(g, w, f"{name} grads={grads}")


def _close(got, want, what: str) -> None:
    tol = ULPS * np.finfo(want.dtype).eps * max(1.0, float(np.max(np.abs(want))))
    np.testing.assert_allclose(got, want, rtol=0, atol=tol, err_msg=what)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("form", FORMS)
def test_the_catalogue_convolutions_match_the_reference(form, dtype, monkeypatch):
    """``conv2d``, ``conv2d_adjoint`` and their k-row forms on the cupy backend (the opening
    convolution, the spatial transfers) against NumPy's, a 5×5 kernel and uneven channels
    included."""
    from refbraid.backends import cupy_conv

    monkeypatch.setenv(cupy_conv.CONV_ENV, form)
    rng = np.random.default_rng(5)
    for s, C, O in ((3, 2, 3), (5, 3, 2), (1, 2, 2)):
        x, dz = rng.standard_normal((B, C, 6, 5)), rng.standard_normal((B, O, 6, 5))
        W, b = rng.standard_normal((O, C, s, s)), rng.standard_normal(O)
        X, dZ = rng.standard_normal((K, B, C, 6, 5)), rng.standard_normal((K, B, O, 6, 5))
        WW, bb = rng.standard_normal((K, O, C, s, s)), rng.standard_normal((K, O))
        x, dz, W, b, X, dZ, WW, bb = (a.astype(dtype) for a in (x, dz, W, b, X, dZ, WW, bb))
        want = [reference.conv2d(x, W, b), *reference.conv2d_adjoint(x, W, dz),
                reference_batched.conv2d_batched(X, WW, bb),
                *reference_batched.conv2d_adjoint_batched(X, WW, dZ, True)]
        with launch_count.counting("cupy") as bk:
            d = bk.asarray
            got = [bk.conv2d(d(x), d(W), d(b)), *bk.conv2d_adjoint(d(x), d(W), d(dz)),
                   bk.conv2d_batched(d(X), d(WW), d(bb)),
                   *bk.conv2d_adjoint_batched(d(X), d(WW), d(dZ), True)]
            got = [to_host(a) for a in got]
        for name, g, w in zip(("z", "dx", "dW", "db", "Z", "dX", "dWk", "dbk"), got, want,
                              strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype == dtype, name
            assert g.flags.c_contiguous, name
            _close(g, w, f"{name} s={s}")


@pytest.mark.parametrize("form", FORMS)
def test_a_column_matrix_over_the_budget_takes_the_reference(form, monkeypatch):
    """Above cupy_conv_columns.COLUMN_BYTES the column-matrix form keeps the reference's
    offset-by-offset convolution (no s²-fold copy of the input): NumPy's bits, the
    reference's launches. The direct kernels make no column matrix: they take it still."""
    from refbraid.backends import cupy_conv, cupy_conv_columns

    monkeypatch.setenv(cupy_conv.CONV_ENV, form)
    layer, params, Y, dY = _case(np.float64, 6)
    monkeypatch.setattr(cupy_conv_columns, "COLUMN_BYTES", Y[0].nbytes * 9 - 1)
    for batched in (False, True):
        want = _step(layer, NUMPY, params, Y, dY, True, batched)
        with launch_count.counting("cupy") as bk:
            with tracking() as t:
                got = _step(layer, bk, params, Y, dY, True, batched)
        if form == "direct":
            assert t.tally.launches == 3 and "im2col" not in t.tally.by_name, t.tally.by_name
            for name, g, w in zip(("Y_next", "Z", "dY", "dW", "db"), got, want, strict=True):
                _close(g, w, name)
            continue
        assert t.tally.launches > 60, t.tally.by_name  # im2col: 18 (5 + 13)
        for name, g, w in zip(("Y_next", "Z", "dY", "dW", "db"), got, want, strict=True):
            np.testing.assert_array_equal(g, w, err_msg=name)


def _launches(fn) -> int:
    return launch_count.count(fn).launches


@pytest.mark.parametrize("form, fwd, adj, adj_grads", [
    ("direct", 1, 1, 2), ("im2col", 3, 5, 9)])
def test_launches_before_and_after(form, fwd, adj, adj_grads, monkeypatch):
    """A step, one or k at once alike. With the direct kernels (the default): forward 1
    launch (the convolution with bias, activation and Euler update as its epilogue), adjoint
    1 without the weight gradient (the transposed convolution reading W in place, staging
    ``h σ'(z) ⊙ dy_next`` as it reads its input, dy_next added in its epilogue) and 2 with
    it (the kernel that sums dW and db forms ``h σ'(z) ⊙ dy_next`` as it reads it too).
    Through the
    column matrix (``REFBRAID_CUPY_CONV=im2col``): forward 3 (the column matrix, the GEMM,
    bias_act_euler), adjoint 5 (the flipped kernel's copy, a convolution of 2) and 9. The
    reference composition they replace — per stencil offset a tensordot and an accumulation
    — takes 23–54 launches per step at 3×3, 42–74 for k rows."""
    from refbraid.backends import cupy_conv

    monkeypatch.setenv(cupy_conv.CONV_ENV, form)
    layer, params, Y, dY = _case(np.float64, 2)
    h = float(STEPS[0])
    with launch_count.counting("cupy") as bk:
        p = {n: bk.asarray(v) for n, v in params.items()}
        Yd, dYd = bk.asarray(Y), bk.asarray(dY)
        p0, y0, dy0 = {n: v[0] for n, v in p.items()}, Yd[0], dYd[0]
        y_next, z = bk.conv_step(y0, p0["W"], p0["b"], h, "tanh")
        before = _launches(lambda: EULER_ACT("tanh", y0, reference.conv2d(y0, p0["W"], p0["b"]),
                                             h))
        assert before == 23
        assert _launches(lambda: bk.conv_step(y0, p0["W"], p0["b"], h, "tanh")) == fwd
        before = _launches(lambda: reference.conv2d_adjoint(
            y0, p0["W"], h * ACT_ADJOINT_KERNEL("tanh", z, dy0))[0] + dy0)
        assert before == 54
        for grads, want in ((True, adj_grads), (False, adj)):
            assert _launches(lambda g=grads: bk.conv_step_adjoint(y0, z, dy0, p0["W"], h,
                                                                  "tanh", g)) == want
        hs = values_on(Yd, STEPS, Yd.dtype)[:, None, None, None, None]  # copied once here

        def composed_forward():
            Z = reference_batched.conv2d_batched(Yd, p["W"], p["b"])
            return Yd + hs * reference.activation(Z, "tanh"), Z

        _, Z = composed_forward()
        assert _launches(composed_forward) == 43
        assert _launches(lambda: layer.forward_batched(p, Yd, STEPS, bk)) == fwd
        # with the weight gradient as one step: the k batched GEMMs read the transposed
        # column matrices in place (cupy_blas.product; CuPy's batched matmul would copy them)
        for grads, was, want in ((True, 74, adj_grads), (False, 42, adj)):
            before = _launches(lambda g=grads: reference_batched.conv2d_adjoint_batched(
                Yd, p["W"], hs * ACT_ADJOINT_KERNEL("tanh", Z, dYd), g)[0] + dYd)
            after = _launches(lambda g=grads: layer.adjoint_batched(p, Yd, Z, dYd, STEPS, bk, g))
            assert (before, after) == (was, want), grads


@pytest.mark.parametrize("batched", [False, True], ids=["per-step", "batched"])
@pytest.mark.parametrize("form", FORMS)
def test_the_fused_adjoint_passes_the_dot_product_test_and_finite_differences(form, batched,
                                                                              monkeypatch):
    """float64, tanh: <J (v, δW, δb), w> = <v, dY> + <δW, dW> + <δb, db> with the exact
    tangent J = v + h σ'(Z) ⊙ (W * v + δW * Y + δb), and central differences (ε 1e-6) of
    <Φ(Y, W, b), w> at sampled entries."""
    from refbraid.backends import cupy_conv

    monkeypatch.setenv(cupy_conv.CONV_ENV, form)
    layer, params, Y, w = _case(np.float64, 3)
    if not batched:
        params, Y, w = {n: v[:1] for n, v in params.items()}, Y[:1], w[:1]
    hs = STEPS[: len(Y), None, None, None, None]
    rng = np.random.default_rng(4)
    v, dW_dir, db_dir = (rng.standard_normal(a.shape) for a in (Y, params["W"], params["b"]))
    with launch_count.counting("cupy") as bk:

        def forward(a):
            out = _step(layer, bk, a, a["Y"], w, True, batched)
            return (out[0], out[1], out[2:]) if batched else (out[0][None], out[1][None],
                                                                [o[None] for o in out[2:]])

        args = {**params, "Y": Y}
        Y_next, Z, (dY, dW, db) = forward(args)
        conv = reference_batched.conv2d_batched
        lin = (conv(v, params["W"], None) + conv(Y, dW_dir, None)
               + db_dir[:, None, :, None, None])
        Jv = v + hs * (1 - np.tanh(Z) ** 2) * lin
        rhs = np.vdot(v, dY) + np.vdot(dW_dir, dW) + np.vdot(db_dir, db)
        np.testing.assert_allclose(np.vdot(Jv, w), rhs, rtol=1e-12)
        grads, eps = {"Y": dY, "W": dW, "b": db}, 1e-6
        for name in ("Y", "W", "b"):
            size = args[name].size
            for flat in rng.choice(size, size=min(3, size), replace=False):
                at = np.unravel_index(flat, args[name].shape)
                plus, minus = ({**args, name: args[name].copy()} for _ in range(2))
                plus[name][at] += eps
                minus[name][at] -= eps
                fd = (np.vdot(forward(plus)[0], w) - np.vdot(forward(minus)[0], w)) / (2 * eps)
                assert abs(fd - grads[name][at]) <= 1e-7 * max(1.0, abs(fd)), (
                    f"ConvStep cupy fused adjoint: d{name} at {at}: {grads[name][at]} vs {fd}")


@pytest.mark.parametrize("form, written", [("direct", (True, True)), ("im2col", (True, False))])
def test_a_step_writes_y_next_plus_g_into_a_row_of_the_iterate(form, written, monkeypatch):
    """The coarsest solve hands a step (forward and adjoint, one at a time) a row of its block
    and the right-hand side there: the direct kernels write ``result + g`` into the row in
    their own launch (one launch forward, one adjoint, as without the row), and so does the
    column-matrix form's bias_act_euler_add forward; its adjoint returns a new sum. The same
    bits as the step followed by ``+ g`` either way."""
    from refbraid.backends import cupy_conv

    monkeypatch.setenv(cupy_conv.CONV_ENV, form)
    layer, params, Y, dY = _case(np.float32, 4)
    h = float(STEPS[0])
    with launch_count.counting("cupy") as bk:
        p = {n: bk.asarray(v[0]) for n, v in params.items()}
        y, g, dy = bk.asarray(Y[0]), bk.asarray(Y[1]), bk.asarray(dY[0])
        block = bk.xp.zeros((3, *y.shape), dtype=y.dtype)
        y_next, cache = layer.forward(p, y, h, bk)
        dy_prev, _ = layer.adjoint(p, cache, dy, h, bk, False)
        for j, (run, want) in enumerate([
                (lambda: layer.forward(p, y, h, bk, out=block[1], add=g)[0], y_next + g),
                (lambda: layer.adjoint(p, cache, dy, h, bk, False, out=block[2], add=g)[0],
                 dy_prev + g)]):
            row = block[j + 1]
            got = run()
            np.testing.assert_array_equal(to_host(got), to_host(want))
            assert (to_host(row).tobytes() == to_host(want).tobytes()) is written[j]
            if form == "direct":
                assert _launches(run) == 1  # as without the row: the convolution's
