"""The ``cupy`` backend's hand-written CUDA C kernels, run on the CPU by the emulator.

Each kernel's own source (layer norm, softmax, attention heads, GRU cell, the convolutions'
column matrix, the direct convolution and its weight gradient:
refbraid.backends.cupy_layernorm, cupy_softmax, cupy_heads, cupy_gru, cupy_conv_columns,
cupy_conv_direct), launched by the backend's GPU branch — its grid, its argument order — on NumPy
arrays (tests/cuda_c/emulator.py), against the NumPy reference: float64 to 1e-12 and float32
to 1e-5 of the largest entry (the kernels sum in double and in another order; glibc's exp and
tanh stand in for CUDA's; the head and column kernels move data: bit for bit). Blocks of 32
threads and chunks of 8 rows (the kernels' sizes are parameters; one host thread per GPU
thread makes the full sizes slow) let small cases cross the kernels' edges: rows wider than a
block, more rows than a chunk of the weight-gradient sums, γ per group of rows, fully masked
softmax rows, classic and implicit GRU steps, images wider than a block of the column kernel;
4×4 tiles, 4 output channels a thread and 2–4 channels a chunk of the direct convolution.
"""

from __future__ import annotations

import numpy as np
import pytest

from refbraid.backends import (
    cupy_conv_columns,
    cupy_conv_direct,
    cupy_conv_direct_host,
    cupy_gru,
    cupy_heads,
    cupy_layernorm,
    cupy_raw,
    cupy_softmax,
    reference,
)

from .emulator import available, fake_cupy

pytestmark = pytest.mark.skipif(not available(), reason="needs g++ (C++20)")
TOL = {np.float64: 1e-12, np.float32: 1e-5}


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    for module in (cupy_layernorm, cupy_softmax, cupy_gru, cupy_heads, cupy_conv_columns,
                   cupy_conv_direct):
        monkeypatch.setattr(module, "THREADS", 32)
    monkeypatch.setattr(cupy_layernorm, "CHUNK", 8)


def _close(got, want, dtype, what):
    assert got.shape == want.shape and got.dtype == want.dtype, what
    scale = max(1.0, float(np.max(np.abs(want))))
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL[dtype] * scale, err_msg=what)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, gamma_shape, grouped", [
    ((3, 10, 50), (50,), False),  # rows wider than a block (32), 30 rows: 4 chunks of ≤ 8
    ((3, 2, 5, 6), (3, 1, 1, 6), True),  # γ per layer, the weight gradients per layer
    ((2, 13, 4), (2, 1, 4), True),  # a layer's 13 rows: chunks of 8 and 5, none straddling
])
def test_the_layernorm_kernels_match_the_reference(dtype, shape, gamma_shape, grouped):
    rng = np.random.default_rng(0)
    x, dy = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    x += 3.0  # a mean to take out
    gamma, beta = (rng.standard_normal(gamma_shape).astype(dtype) for _ in range(2))
    y, mean, rstd = reference.layernorm(x, gamma, beta, 1e-5)
    dx, dgamma, dbeta = reference.layernorm_adjoint(x, mean, rstd, gamma, dy)
    if grouped:  # per layer, as the batched transformer step sums them
        xhat = (x - mean[..., None]) * rstd[..., None]
        inner = tuple(range(1, x.ndim - 1))
        dgamma, dbeta = np.sum(dy * xhat, axis=inner), np.sum(dy, axis=inner)
    G = cupy_layernorm.rows_per_gamma(x, gamma)
    with fake_cupy():
        got = cupy_layernorm.layernorm(x, gamma, beta, 1e-5, G)
        got_adj = cupy_layernorm.layernorm_adjoint(x, mean, rstd, gamma, dy, G, grouped)
        dx_only = cupy_layernorm.layernorm_adjoint(x, mean, rstd, gamma, dy, G, grouped,
                                                   grads=False)
    for name, g, w in zip(("y", "mean", "rstd", "dx", "dgamma", "dbeta"), (*got, *got_adj),
                          (y, mean, rstd, dx, dgamma, dbeta), strict=True):
        _close(g, w, dtype, name)
    assert dx_only[1] is None and dx_only[2] is None
    np.testing.assert_array_equal(dx_only[0], got_adj[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
def test_the_softmax_kernels_match_the_reference(dtype, masked):
    rng = np.random.default_rng(1)
    x, dp = (rng.standard_normal((3, 4, 50)).astype(dtype) for _ in range(2))
    x[0, 0] *= 40.0  # large logits: the shift by the row maximum matters
    mask = None
    if masked:
        mask = rng.random(x.shape) < 0.5
        mask[1, 2, :] = True  # fully masked: zeros
    p = reference.softmax(x, mask)
    dx = reference.softmax_adjoint(p, dp)
    with fake_cupy():
        got_p = cupy_softmax.softmax(x, mask)
        got_dx = cupy_softmax.softmax_adjoint(p, dp)
    _close(got_p, p, dtype, "p")
    _close(got_dx, dx, dtype, "dx")
    if masked:
        assert not np.any(got_p[1, 2]) and np.all(got_p[mask] == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_scaled_softmax_kernels_match_the_reference(dtype):
    rng = np.random.default_rng(5)
    x, dp = (rng.standard_normal((2, 3, 40)).astype(dtype) for _ in range(2))
    p = reference.softmax(x, None, 0.35)
    dx = reference.softmax_adjoint(p, dp, 0.35)
    with fake_cupy():
        got_p = cupy_softmax.softmax(x, None, 0.35)
        got_dx = cupy_softmax.softmax_adjoint(p, dp, 0.35)
    _close(got_p, p, dtype, "p")
    _close(got_dx, dx, dtype, "dx")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("parts", [1, 2, 3])
def test_the_head_kernels_move_the_reference_bits(dtype, parts, monkeypatch):
    """Data movement only: bit for bit. B 3, L 5, 2 heads of d 4: with 32 threads a block
    crosses samples, heads and blocks, and a grid of 2 blocks loops over the 3·5·8·P
    elements."""
    monkeypatch.setattr(cupy_heads, "MAX_GRID", 2)
    B, L, heads, d = 3, 5, 2, 4
    rng = np.random.default_rng(6)
    a = rng.standard_normal((B * L, parts * heads * d)).astype(dtype)
    want = reference.split_heads(a, B, L, heads, parts)
    blocks = [rng.standard_normal((B * heads, L, d)).astype(dtype) for _ in range(parts)]
    with fake_cupy():
        got = cupy_heads.split_heads(a, B, L, heads, parts)
        merged = cupy_heads.merge_heads(blocks, B, heads)
    assert len(got) == parts
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(merged, reference.merge_heads(blocks, B, heads))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("implicit", [False, True], ids=["classic", "implicit"])
def test_the_gru_kernels_match_the_reference(dtype, implicit):
    rng = np.random.default_rng(2)
    B, H = 5, 14  # B·H = 70: three blocks of 32, the last one part empty
    gx, gh = (rng.standard_normal((B, 3 * H)).astype(dtype) for _ in range(2))
    h, dh_new = (rng.standard_normal((B, H)).astype(dtype) for _ in range(2))
    want = reference.gru_cell(gx, gh, h, 0.3, implicit)
    want_adj = reference.gru_cell_adjoint(want[1], gh, h, dh_new, 0.3, implicit)
    with fake_cupy():
        got = cupy_gru.gru_cell(gx, gh, h, 0.3, implicit)
        got_adj = cupy_gru.gru_cell_adjoint(want[1], gh, h, dh_new, 0.3, implicit)
    for name, g, w in zip(("h_new", "gates", "dgx", "dgh", "dh"), (*got, *got_adj),
                          (*want, *want_adj), strict=True):
        _close(g, w, dtype, name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, s, rows", [
    ((2, 3, 4, 5), 3, None),  # one step: no lead axis
    ((7, 2, 3, 6, 7), 3, slice(1, None, 2)),  # every 2nd state of a level: a strided view
    ((3, 2, 2, 1, 9, 5), 5, None),  # two lead axes, a 5x5 kernel, images wider than a block
    ((5, 2, 2, 3, 3), 1, slice(0, None, 3)),  # a 1x1 kernel: no padding
    ((4, 3, 2, 2, 3, 4), 3, (slice(None), slice(1, None))),  # lead axes that do not collapse
])
def test_the_column_kernel_copies_the_padded_windows(dtype, shape, s, rows):
    """The im2col kernel, launched by cupy_conv_columns.columns' GPU branch, equals the
    strided windows of the zero-padded input bit for bit: reading rows of a strided view
    in place, or a contiguous copy of a view whose rows are not evenly spaced; and the
    images transposed (not rows of C-ordered images: a copy first)."""
    u = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    for x in (u if rows is None else u[rows], np.swapaxes(u, -1, -2)):
        want = cupy_conv_columns.strided_columns(x, s)
        with fake_cupy():
            got = cupy_conv_columns.columns(x, s)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_the_column_kernel_reads_strided_rows_in_place():
    """Evenly spaced rows of a C-contiguous array, ascending or descending, are read where they
    lie (offset and stride into the base array); rows that are not (or transposed images) are
    not."""
    u = np.zeros((9, 2, 3, 4, 5))
    base, offset, stride = cupy_raw.row_layout(u[2::3])
    assert base is u and offset == 2 * u[0].size and stride == 3 * u[0].size
    base, offset, stride = cupy_raw.row_layout(u[7::-3])  # descending: the adjoint's order
    assert base is u and offset == 7 * u[0].size and stride == -3 * u[0].size
    assert cupy_raw.row_layout(u[:, :, :, :2]) is None
    assert cupy_raw.row_layout(np.swapaxes(u, -1, -2)) is None
    v = np.zeros((4, 3, 2, 3, 4, 5))
    assert cupy_raw.row_layout(v[:, 1:]) is None  # lead axes with a gap between them
    assert cupy_raw.row_layout(v[1:3])[1:] == (v[0].size, v[0, 0].size)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, O, s, rows", [
    ((2, 3, 4, 5), 6, 3, None),  # one step: partial tiles, a partial group of output channels
    ((7, 2, 5, 6, 9), 3, 3, slice(1, None, 2)),  # strided rows read in place; 5 channels
    ((7, 2, 3, 4, 5), 2, 3, slice(6, None, -3)),  # descending rows (the adjoint's), in place
    ((3, 2, 2, 1, 5, 3), 2, 5, None),  # two lead axes, a 5x5 kernel wider than the image
    ((5, 2, 3, 3, 3), 5, 1, slice(0, None, 3)),  # a 1x1 kernel: no padding
])
def test_the_direct_kernel_matches_the_reference_convolution(dtype, shape, O, s, rows,
                                                             monkeypatch):
    """The conv_direct kernel, launched by cupy_conv_direct.convolution's GPU branch: ``W * x``
    and the transposed convolution (``flip``: the kernel read from W (C, O, s, s) flipped in
    place) against the NumPy reference's stencil sums, with 4×4 output tiles, 4 output
    channels a thread and shared memory for 2–4 input channels a chunk (the kernel's sizes
    are parameters): tiles and channel groups cut at the image's and the channels' edges,
    the input's channels staged in several chunks, MGRIT's strided rows read in place; and
    images transposed (not rows of C-ordered images: a copy first)."""
    from refbraid.backends import reference_batched

    monkeypatch.setattr(cupy_conv_direct, "TILE", 4)
    monkeypatch.setattr(cupy_conv_direct, "OUT_PER_THREAD", 4)
    rng = np.random.default_rng(2)
    u = rng.standard_normal(shape).astype(dtype)
    C = u.shape[-3]
    for x in (u if rows is None else u[rows], np.swapaxes(u, -1, -2)):
        W = rng.standard_normal((*x.shape[:-4], O, C, s, s)).astype(dtype)
        Wt = rng.standard_normal((*x.shape[:-4], C, O, s, s)).astype(dtype)
        flat = (-1, *x.shape[-4:])

        def conv(a, w):
            z = reference_batched.conv2d_batched(np.reshape(a, (-1, *a.shape[-4:])),
                                                 np.reshape(w, (-1, *w.shape[-4:])), None)
            return np.reshape(z, (*a.shape[:-4], *z.shape[-4:]))

        th, tw = min(4, x.shape[-2]), min(4, x.shape[-1])
        monkeypatch.setattr(cupy_conv_direct, "SHARED_BYTES",
                            16 * ((th + s - 1) * (tw + s - 1) + 4 * s * s) + 16)  # 2 / 4 a chunk
        plan = cupy_conv_direct.plan(x, W)
        assert plan == (th, tw, min(C, 16 // x.itemsize))
        with fake_cupy():
            got = cupy_conv_direct.convolution(x, W, plan)
            got_t = cupy_conv_direct.convolution(x, Wt, cupy_conv_direct.plan(x, Wt), flip=True)
        assert got.flags.c_contiguous and got_t.flags.c_contiguous
        _close(got, conv(x, W), dtype, f"conv {flat}")
        _close(got_t, conv(x, cupy_conv_direct_host.transposed_kernel(np, Wt)), dtype,
               f"flip {flat}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", ["tanh", "relu", "gelu", "identity"])
def test_the_direct_kernel_epilogues_match_the_separate_kernels(dtype, act, monkeypatch):
    """The conv_direct kernel's epilogues against the separate launches they replace: the
    ODE step (``z = W * y + b``, ``y_next = y + h σ(z)``: cupy_fused.BIAS_ACT_EULER's
    arithmetic; one step size, and one per row), and ``dy_next + W *ᵀ s`` for the adjoint;
    with MGRIT's strided rows of y and dy_next read in place. glibc's tanh, erf and exp
    stand in for CUDA's (1e-12 / 1e-5 of the largest entry)."""
    from refbraid.backends import cupy_conv
    from refbraid.backends.cupy_fused import BIAS_ACT_EULER

    monkeypatch.setattr(cupy_conv_direct, "TILE", 4)
    monkeypatch.setattr(cupy_conv_direct, "OUT_PER_THREAD", 4)
    rng = np.random.default_rng(4)
    k, B, C, H, Wd = 3, 2, 5, 5, 6
    U = rng.standard_normal((2 * k, B, C, H, Wd)).astype(dtype)
    Y, G = U[::2], U[1::2]  # strided rows, as MGRIT's every second state
    W = (0.3 * rng.standard_normal((k, C, C, 3, 3))).astype(dtype)
    b = rng.standard_normal((k, C)).astype(dtype)
    hs = np.array([0.25, 0.5, 0.125], dtype)[:, None, None, None, None]
    for h in (0.25, hs):
        want_z, want_y = BIAS_ACT_EULER.reference(
            act, cupy_conv_direct_host.direct_on_host(Y, W, False), b[:, None, :, None, None], Y, h)
        with fake_cupy():
            z, y_next = cupy_conv.ode_step(Y, W, b, h, act)
        _close(z, want_z, dtype, f"z h={h if isinstance(h, float) else 'per row'}")
        _close(y_next, want_y, dtype, f"y_next h={h if isinstance(h, float) else 'per row'}")
    want_dx = G + cupy_conv_direct_host.direct_on_host(Y, W, True)
    with fake_cupy():
        dx = cupy_conv.conv2d_adjoint(Y, W, Y, grads=False, add=G)[0]
    _close(dx, want_dx, dtype, "dy_next + W *ᵀ s")
    # MGRIT's F-sweep: Φ + g written into every third row of an iterate, both forms (the
    # direct kernel's epilogue; the GEMM's then BIAS_ACT_EULER_ADD with its output given)
    for form in ("direct", "im2col"):
        monkeypatch.setenv(cupy_conv.CONV_ENV, form)
        for g in (G, None):
            iterate = np.zeros((3 * k, B, C, H, Wd), dtype)
            rows = iterate[2::3]
            with fake_cupy():
                z, y_next = cupy_conv.ode_step(Y, W, b, hs, act, into=rows, g=g)
            assert y_next is rows
            want = want_y + (0 if g is None else g)  # want_y: the per-row step sizes' above
            _close(rows, want, dtype, f"{form}: Φ + g into the rows (g: {g is not None})")
            assert not iterate[0::3].any() and not iterate[1::3].any()  # nothing else written
            # the adjoint's: dy_next + W *ᵀ s + g into the rows (the direct form only)
            rows[...] = 0
            with fake_cupy():
                dx = cupy_conv.conv2d_adjoint(Y, W, Y, grads=False, add=G, into=rows, g=g)[0]
            assert (dx is rows) == (form == "direct")  # else new, without g: the caller adds
            want = want_dx + (0 if g is None or form == "im2col" else g)
            _close(dx, want, dtype, f"{form}: dy_next + W *ᵀ s + g (g: {g is not None})")
    # the weights and biases as MGRIT's batched sweeps hand them over: every m-th layer's rows
    # of the stacked weights, ascending or from the reversed stack (device_batching.weight_rows)
    from refbraid.backends.device_batching import weight_rows

    monkeypatch.setenv(cupy_conv.CONV_ENV, "direct")
    Ws = (0.3 * rng.standard_normal((3 * k + 1, C, C, 3, 3))).astype(dtype)
    bs = rng.standard_normal((3 * k + 1, C)).astype(dtype)
    for idx in (np.arange(1, 3 * k + 1, 3), np.arange(3 * k, 0, -3)):
        Wv, bv = (weight_rows(a, idx, None) for a in (Ws, bs))
        # views the kernel reads in place (offset and row stride), not gathers nor copies
        first = 1 if idx[0] == 1 else 0  # rows 1, 4, 7; or 9, 6, 3: rows 0, 3, 6 reversed
        assert cupy_raw.row_layout(Wv)[1:] == (first * Ws[0].size, 3 * Ws[0].size)
        assert cupy_raw.row_layout(bv, inner=1)[2] == 3 * C
        stack_z, stack_y = BIAS_ACT_EULER.reference(
            act, cupy_conv_direct_host.direct_on_host(Y, Ws[idx], False),
            bs[idx][:, None, :, None, None], Y, hs)
        with fake_cupy():
            z, y_next = cupy_conv.ode_step(Y, Wv, bv, hs, act)
            dx = cupy_conv.conv2d_adjoint(Y, Wv, Y, grads=False, add=G)[0]
        _close(z, stack_z, dtype, f"z, the rows {idx.tolist()} of the stacked weights")
        _close(y_next, stack_y, dtype, f"y_next, the rows {idx.tolist()}")
        _close(dx, G + cupy_conv_direct_host.direct_on_host(Y, Ws[idx], True), dtype,
               f"dy_next + W *ᵀ s, the rows {idx.tolist()}")
    # rows a kernel cannot address (every second column): not written, the result new, no g
    wide = np.zeros((k, B, C, H, 2 * Wd), dtype)
    with fake_cupy():
        z, y_next = cupy_conv.ode_step(Y, W, b, hs, act, into=wide[..., ::2], g=G)
    assert not wide.any()
    _close(y_next, want_y, dtype, "rows it cannot write: Φ, new")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", ["tanh", "relu", "gelu", "identity"])
def test_the_direct_kernel_stages_the_scaled_adjoint_as_the_separate_kernel_makes_it(
        dtype, act, monkeypatch):
    """The transposed convolution with ``scale = (z, h, act)``: its input ``h σ'(z) ⊙ dy``
    formed as it is staged (cupy_fused.SCALED_ACT_ADJOINT's arithmetic, σ' as ACT_ADJOINT
    writes it), ``dy_next + W *ᵀ s`` (+ g into MGRIT's rows) in one launch — against the
    separate scaled-adjoint kernel's values convolved; likewise the weight gradient of s;
    dy and z MGRIT's strided rows read in place; one step size and one per row; a padded
    tile's border stays 0 (z there is not read). glibc's tanh, erf and exp stand in for
    CUDA's."""
    from refbraid.backends import cupy_conv
    from refbraid.backends.cupy_fused import SCALED_ACT_ADJOINT

    monkeypatch.setattr(cupy_conv_direct, "TILE", 4)
    monkeypatch.setattr(cupy_conv_direct, "OUT_PER_THREAD", 4)
    rng = np.random.default_rng(7)
    k, B, C, H, Wd = 3, 2, 5, 5, 6
    U = rng.standard_normal((3 * k, B, C, H, Wd)).astype(dtype)
    dY, Z, G = U[::3], U[1::3], U[2::3]  # strided rows, as MGRIT's
    W = (0.3 * rng.standard_normal((k, C, C, 3, 3))).astype(dtype)
    hs = np.array([0.25, 0.5, 0.125], dtype)[:, None, None, None, None]
    for h in (0.25, hs):
        S = SCALED_ACT_ADJOINT.reference(act, Z, dY, h)
        want = dY + cupy_conv_direct_host.direct_on_host(S, W, True)
        label = "h" if isinstance(h, float) else "per-row h"
        with fake_cupy():
            got = cupy_conv.conv2d_adjoint(dY, W, dY, grads=False, add=dY, scale=(Z, h, act))[0]
        _close(got, want, dtype, f"dy_next + W *ᵀ (h σ'(z) ⊙ dy_next), {label}")
        iterate = np.zeros((2 * k, B, C, H, Wd), dtype)
        rows = iterate[1::2]
        with fake_cupy():
            got = cupy_conv.conv2d_adjoint(dY, W, dY, grads=False, add=dY, into=rows, g=G,
                                           scale=(Z, h, act))[0]
        assert got is rows and not iterate[0::2].any()
        _close(rows, want + G, dtype, f"into MGRIT's rows, + g, {label}")
        # the weight gradient forms h σ'(z) ⊙ dy as its threads read it (x: G's rows)
        want_dW, want_db = cupy_conv_direct_host.weight_gradient_on_host(G, S, 3)
        with fake_cupy():
            dW, db = cupy_conv_direct.weight_gradient(G, dY, 3, scale=(Z, h, act))
        _close(dW, want_dW, dtype, f"dW of h σ'(z) ⊙ dy, {label}")
        _close(db, want_db, dtype, f"db of h σ'(z) ⊙ dy, {label}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, O, s, rows", [
    ((3, 2, 5, 6), 4, 3, None),  # one step: B·H·W = 90, not a multiple of the block
    ((7, 2, 3, 4, 9), 2, 3, slice(1, None, 2)),  # MGRIT's strided rows, read in place
    ((7, 2, 3, 4, 5), 2, 3, slice(5, None, -2)),  # descending rows (the adjoint's)
    ((2, 2, 3, 1, 6, 5), 3, 5, None),  # two lead axes, a 5x5 kernel: taps outside the image
    ((5, 2, 3, 3, 3), 2, 1, slice(0, None, 3)),  # a 1x1 kernel
])
def test_the_weight_gradient_kernel_matches_the_reference(dtype, shape, O, s, rows):
    """The conv_weight_grad kernel, launched by cupy_conv_direct.weight_gradient's GPU
    branch, against the NumPy reference's dW and db (reference_batched's convolution
    adjoint), with blocks of 32 threads: the rows of x and dz read in place, or (transposed
    images) from a contiguous copy."""
    from refbraid.backends import reference_batched

    rng = np.random.default_rng(3)
    u = rng.standard_normal(shape).astype(dtype)
    for x in (u if rows is None else u[rows], np.swapaxes(u, -1, -2)):
        lead, (B, C, H, Wd) = x.shape[:-4], x.shape[-4:]
        dz = rng.standard_normal((*lead, B, O, H, Wd)).astype(dtype)[..., ::-1, :, :]
        W = np.zeros((*lead, O, C, s, s), dtype)
        flat = lambda a: np.reshape(a, (-1, *a.shape[-4:]))  # noqa: E731
        _, dW, db = reference_batched.conv2d_adjoint_batched(flat(x), flat(W), flat(dz), True)
        with fake_cupy():
            got_dW, got_db = cupy_conv_direct.weight_gradient(x, dz, s)
        _close(got_dW, np.reshape(dW, W.shape), dtype, f"dW {x.shape}")
        _close(got_db, np.reshape(db, (*lead, O)), dtype, f"db {x.shape}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_fused_elementwise_bodies_match_their_reference_paths(dtype):
    """cupy_fused's ElementwiseKernel bodies (the CUDA C CuPy wraps around them: one thread
    per element of contiguous operands) for every activation, against the NumPy path each
    kernel runs off a GPU; the column-sum kernel on (k, B, C) stacks."""
    from refbraid.backends import cupy_fused
    from refbraid.backends.reference import ACTIVATIONS

    from .emulator import RawKernel

    T = {np.float32: "float", np.float64: "double"}[dtype]
    rng = np.random.default_rng(3)
    shape, n = (4, 37), 4 * 37
    for kernel in cupy_fused.KERNELS:
        if kernel is cupy_fused.ADD_COLUMN_SUMS:
            continue
        ins = [p.split()[1] for p in kernel.in_params.split(",")]
        n_out = len(kernel.out_params.split(","))
        source = "".join(kernel.cuda_kernel(act, T) for act in ACTIVATIONS)  # one compile
        for act in ACTIVATIONS:
            args = [rng.standard_normal(shape).astype(dtype) for _ in ins]
            if "h" in ins:
                args[ins.index("h")] = np.full(shape, 0.37, dtype=dtype)
            want = kernel.reference(act, *args)
            want = want if isinstance(want, tuple) else (want,)
            outs = [np.empty(shape, dtype=dtype) for _ in range(n_out)]
            RawKernel(source, f"{kernel.name}_{act}")(
                (-(-n // 32),), (32,), (*args, *outs, np.int64(n)))
            for o, w in zip(outs, want, strict=True):
                _close(o, np.broadcast_to(w, shape).astype(dtype), dtype,
                       f"{kernel.name} {act}")
    # more rows than row groups, a partial tile of columns: the kernel's launch as _cupy's
    k, B, C = 2, 70, 40
    p, dy_next, s = (rng.standard_normal((k, B, C)).astype(dtype) for _ in range(3))
    with fake_cupy():
        dy, db = cupy_fused.ADD_COLUMN_SUMS._cupy("identity", p, dy_next, s)
        alone = cupy_fused.ADD_COLUMN_SUMS._cupy("identity", *(a[1:] for a in (p, dy_next, s)))
    want_dy, want_db = cupy_fused.ADD_COLUMN_SUMS.reference("identity", p, dy_next, s)
    np.testing.assert_array_equal(dy, want_dy)
    _close(db, want_db, dtype, "add_column_sums db")
    np.testing.assert_array_equal(alone[1][0], db[1])  # a row's sum: the same bits in a stack


@pytest.mark.parametrize("with_g", [False, True], ids=["no g", "g"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_column_sum_kernel_reads_and_writes_strided_rows_in_place(dtype, with_g):
    """MGRIT's adjoint F-sweep with the weight gradient: dy_next is every m-th state of the
    iterate and ``(dy_next + p) + g`` goes into other rows of it (g: rows of the right-hand
    side), read and written by offset and row stride: the same bits as the contiguous
    kernel's dy plus g, the rows between left alone, db unchanged; rows the kernel cannot
    address (a transposed state) get the same values through a copy."""
    from refbraid.backends import cupy_fused

    k, B, C, m = 3, 37, 33, 4
    rng = np.random.default_rng(7)
    u, rhs = (rng.standard_normal((k * m + 1, B, C)).astype(dtype) for _ in range(2))
    p, s = (rng.standard_normal((k, B, C)).astype(dtype) for _ in range(2))
    dy_next, rows, g = u[0:k * m:m], u[1::m][:k], (rhs[1::m][:k] if with_g else None)
    with fake_cupy():
        plain_dy, plain_db = cupy_fused.ADD_COLUMN_SUMS._cupy("identity", p, dy_next.copy(), s)
        want = plain_dy + g if with_g else plain_dy
        before = u.copy()
        got, db = cupy_fused.ADD_COLUMN_SUMS.into_rows(p, dy_next, s, rows, g)
        assert got is rows
        np.testing.assert_array_equal(u[1::m][:k], want)
        untouched = np.ones(len(u), bool)
        untouched[1:k * m:m] = False
        np.testing.assert_array_equal(u[untouched], before[untouched])
        np.testing.assert_array_equal(db, plain_db)
        other = np.zeros((k, C, B), dtype).transpose(0, 2, 1)  # not C-ordered states
        assert cupy_raw.row_layout(other, 2) is None
        got, _ = cupy_fused.ADD_COLUMN_SUMS.into_rows(p, dy_next, s, other, g)
        np.testing.assert_array_equal(other, want)


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "per-step"])
@pytest.mark.parametrize("model", ["dense", "conv", "transformer", "gru"])
def test_a_layer_parallel_gradient_on_the_emulated_gpu_equals_numpy(model, batched):
    """Every network's layer-parallel gradient (TorchBraid's settings, float64) through the
    ``cupy`` backend's GPU branches — the fused ElementwiseKernels, the RawKernels, cuBLAS's
    β = 1 GEMM, the im2col convolutions, batched sweeps or per step — with their CUDA C run
    by the emulator: the NumPy backend's gradient to 1e-10."""
    from refbraid.backends import assemble, get_backend, launch_count
    from refbraid.backends.device_batching import sweeps_batched
    from refbraid.training.gradients import mgrit_gradient

    net, params, x, labels = launch_count.build_model(model, 16, np.random.default_rng(0))
    settings = launch_count.default_settings()
    with sweeps_batched(batched):
        loss, want, _ = mgrit_gradient(net, settings, get_backend("numpy"))(params, x, labels)
        with fake_cupy() as fake:
            bk = assemble("cupy", fake)  # the cupy backend on the fake CuPy
            got_loss, got, _ = mgrit_gradient(net, settings, bk)(params, x, labels)
    assert got_loss == pytest.approx(loss, rel=1e-12)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=0, atol=1e-10 * max(1.0, np.max(np.abs(v))),
                                   err_msg=k)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_residual_kernel_subtracts_in_place_and_sums_squares_in_a_fixed_order(dtype):
    """cupy_residual's kernel on every m-th state of an iterate (read in place), with more
    blocks than one (their partial sums added by the last block to finish): r − u exactly,
    Σ r² as NumPy's in double to round-off, the same bits at a second launch (the counter of
    finished blocks back at 0); u that is not evenly spaced rows (a transposed view) gives
    the same through a copy, and states of one value (r 1-D) too."""
    from refbraid.backends import cupy_residual

    rng = np.random.default_rng(11)
    m, c = 4, 9
    u = rng.standard_normal((m * c, 7, 33)).astype(dtype)
    r = rng.standard_normal((c, 7, 33)).astype(dtype)  # 2079 values: 9 blocks of 256
    want = r - u[::m]
    want_sq = float(np.sum(np.square(want, dtype=np.float64)))
    with fake_cupy():
        got, again = r.copy(), r.copy()
        sq = cupy_residual.subtract_sum_squares(got, u[::m])
        sq2 = cupy_residual.subtract_sum_squares(again, u[::m])
        flipped = np.ascontiguousarray(np.swapaxes(u[::m], 1, 2))
        t = np.swapaxes(flipped, 1, 2)  # u[::m]'s values, not C-ordered states
        assert cupy_raw.row_layout(t, 2) is None
        third = r.copy()
        sq3 = cupy_residual.subtract_sum_squares(third, t)
        r1, u1 = rng.standard_normal(300).astype(dtype), rng.standard_normal(300).astype(dtype)
        got1 = r1.copy()
        sq1 = cupy_residual.subtract_sum_squares(got1, u1)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(third, want)
    assert float(sq) == pytest.approx(want_sq, rel=1e-12)
    assert float(sq) == float(sq2) == float(sq3)
    np.testing.assert_array_equal(got1, r1 - u1)
    assert float(sq1) == pytest.approx(float(np.sum(np.square(r1 - u1, dtype=np.float64))),
                                       rel=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_ordered_row_sum_kernel_gives_the_loops_bits(dtype):
    """ordered_sums.add_rows_in_order's CUDA C (a thread per element running through the k
    rows in order) against ``acc += rows[j]`` for j in order: bit for bit, values of very
    different sizes (where another order would round differently); the CuPy stand-in's
    reference path the same bits, counted as one launch; a non-contiguous acc by the loop."""
    from refbraid.backends import launch_count, ordered_sums
    from refbraid.backends.host import to_host

    rng = np.random.default_rng(13)
    k, shape = 37, (9, 31)
    rows = (rng.standard_normal((k, *shape)) * 10.0 ** rng.integers(-6, 7, (k, 1, 1)))
    rows, acc = rows.astype(dtype), rng.standard_normal(shape).astype(dtype)
    want = acc.copy()
    for j in range(k):
        want += rows[j]
    with fake_cupy():
        got = acc.copy()
        ordered_sums.add_rows_in_order(got, rows)
        strided = np.zeros((9, 62), dtype)[:, ::2]
        strided[...] = acc
        ordered_sums.add_rows_in_order(strided, rows)
    assert got.tobytes() == want.tobytes()
    np.testing.assert_array_equal(strided, want)
    with launch_count.counting("cupy") as bk:
        dacc, drows = bk.asarray(acc), bk.asarray(rows)
        assert launch_count.count(lambda: ordered_sums.add_rows_in_order(dacc, drows)
                                  ).launches == 1
        assert to_host(dacc).tobytes() == want.tobytes()
