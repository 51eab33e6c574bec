"""Numba CPU kernels (backend ``"numba"``), part 3: the 'same' 2-D convolution.

Every public kernel has the signature and semantics of the same-named function in
:mod:`refbraid.backends.reference`; its docstring says only what it changes. The math::

    conv2d              z = W * x + b                         3×3: direct kernel; else im2col+GEMM
    conv2d_adjoint      dx = W *ᵀ dz, dW = dz ⋆ x̃, db = Σ dz  3×3: direct kernels; else im2col

Shape legend: ``B`` batch, ``C`` input channels, ``O`` output channels, ``H, W`` image
height and width, ``k`` (odd) kernel size, ``r = k // 2`` padding.

**3×3 kernels (what the conv layers use): direct, on zero-padded flat images.** Image by
image, each channel is copied into a zero-padded flat row ``x̃``: a line of zeros, then the
H lines of the image, each led by one zero (``Wp = W + 1`` values a line: that zero is the
left padding of its line and the right padding of the line before), a line of zeros and two
more. Output pixel (i, j) then sits at ``t = i·Wp + j`` and its nine inputs at
``t + p·Wp + q`` (p, q ∈ 0..2): shifted views of one row, so::

    z[o, t] = b[o] + Σ_c Σ_p Σ_q W[o,c,p,q] x̃[c, t + p·Wp + q]      t < H·Wp

is a set of long, branch-free, unit-stride loops over t (the column past each line is computed
and dropped, 3.6% extra at 28×28). One loop per (c, p) adds three taps to :data:`O_BLOCK`
output rows: each loaded x̃ value feeds O_BLOCK outputs, and the 12 weights sit in registers
(tuples, not arrays: a weight read from an array inside the loop stops LLVM from vectorising
it, measured 10× slower). dx is the same kernel on the padded dz with the flipped, transposed
kernels ``W'[c,o,p,q] = W[o,c,2−p,2−q]`` (the transposed convolution), and
``dW[o,c,p,q] = Σ_{n,t} dz[n,o,t] x̃[n,c,t + p·Wp + q]`` is, per (c, p), 24 sums (8 output
channels × 3 taps) kept in registers over one pass. No im2col buffer is built: one image's
padded copies (rows 64-byte aligned) and accumulator rows stay in cache.

**Other kernel sizes: im2col + BLAS GEMM**, in :mod:`refbraid.backends.numba_cpu_im2col`.

Measured on the 2-core CI machine (AVX-512), one thread, 28×28 images, C = 8…32 channels
(``benchmarks/kernels.py``; kernels alone): the 3×3 loops run at ≈200 GFLOP/s in float32
and ≈110 in float64, against ≈110 and ≈55 for this machine's OpenBLAS GEMM (it runs its AVX2
"Haswell" kernels here), and skip im2col's copies: the conv step is 2.5–3× faster than with
im2col + BLAS. Blocking measured best of 1–8 output channels × 3 or 9 taps: 4 × 3 for z and dx,
8 × 3 for dW. Measured effects of layout: 64-byte aligned rows 1.2–1.5× (hence
:func:`_aligned_rows`), copying lines through views 3× (:func:`_pad_image`), and inlining the
convolution loop into its two drivers (a driver loaded from Numba's cache ran 1.25× slower when
it called a separately compiled loop instead).

Precision: every product and sum runs in the array dtype (float32 stays float32: the
accumulators are typed from the arrays, no float64 literal drags them up). The 3×3 kernels are
compiled with ``fastmath`` :data:`FASTMATH` = {reassoc, contract} and nothing else: sums may be
split into SIMD partial sums (as BLAS does; the dW sums vectorise only so) and a·b + c fused
into an FMA. db accumulates in float64. The shared choices (one thread, non-float inputs to
the reference) are listed in :mod:`refbraid.backends.numba_cpu`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import reference
from .numba_cpu import check_ndim, check_size, common_dtype, native_floats
from .numba_cpu_im2col import im2col_conv2d, im2col_conv2d_adjoint

OVERRIDES = ("conv2d", "conv2d_adjoint")

#: Output channels the direct 3×3 kernel computes together (each input load feeds all of them;
#: 4 measured best of 2, 3, 4, 6, 8 at C = 16 and 32; _conv3x3_image spells out 4).
O_BLOCK = 4

#: The only fast-math freedoms of the 3×3 kernels: regroup sums (SIMD partial sums, as BLAS
#: does) and fuse a·b + c into one FMA (one rounding instead of two). No approximate functions,
#: NaN/Inf semantics unchanged. Measured: the dW sums vectorise only with "reassoc"; "contract"
#: adds 3–5% in float32, "reassoc" 25% to the float64 convolutions.
FASTMATH = {"reassoc", "contract"}

# ----------------------------------------------------------------------------- 3×3 kernels
@njit(inline="always")
def _pad_image(x, Wp, out):
    """out[c, (i+1)·Wp + j+1] = x[c, i, j], 0 elsewhere (and for every c ≥ C).

    x: (C, H, W) one image; out: (C', P) with C' ≥ C, Wp = W + 1, P ≥ (H+2)·Wp + 2. Line i
    of the image fills out[c, (i+1)·Wp :][:Wp]: one zero, then its W values. (Copying line by
    line through views measured 3× faster than indexing x[c, i, j] and out[c, t] directly.)
    """
    C, H, Wd = x.shape
    for c in range(out.shape[0]):
        row = out[c]
        if c >= C:
            row[:] = 0
            continue
        for t in range(Wp):  # the top line of zeros
            row[t] = 0
        for i in range(H):
            line, xi = row[(i + 1) * Wp:], x[c, i]
            line[0] = 0
            for j in range(Wd):
                line[j + 1] = xi[j]
        for t in range((H + 1) * Wp, row.shape[0]):  # the bottom line of zeros and the tail
            row[t] = 0


@njit(inline="always")
def _taps3(w):
    """One line (p) of a 3×3 kernel as a 3-tuple: values in registers, not reloaded."""
    return (w[0], w[1], w[2])


@njit(inline="always")
def _dot3(u, v):
    """Σ_q u[q] v[q] over three taps."""
    return u[0] * v[0] + u[1] * v[1] + u[2] * v[2]


@njit(inline="always")
def _axpy3(a, e, v):
    """a + e v for 3-tuples a, v and a scalar e."""
    return (a[0] + e * v[0], a[1] + e * v[1], a[2] + e * v[2])


@njit(cache=True)
def _aligned_rows(n_rows, n_cols, like):
    """An uninitialised (n_rows, ≥ n_cols) array of like's dtype whose rows start on 64-byte
    boundaries (one AVX-512 vector). The 3×3 kernels ran 1.2–1.5× faster on padded images and
    accumulator rows aligned so than on rows at NumPy's or Numba's 16- or 32-byte alignment."""
    cols = -(-n_cols // 16) * 16  # 16 elements: a multiple of 64 bytes for float32 and float64
    buf = np.empty(n_rows * cols + 16, like.dtype)
    off = (64 - buf.ctypes.data % 64) % 64 // buf.itemsize
    return buf[off : off + n_rows * cols].reshape(n_rows, cols)


@njit(inline="always")
def accumulate_block(xp, W, Wp, L, o0, acc):
    """acc[m, t] = Σ_{c,p,q} W[o0+m,c,p,q] xp[c, t + p·Wp + q] for m < O_BLOCK, t < L = H·Wp
    (the output block o0 … o0+3 of one image, before its bias): one pass over t per (c, p),
    three taps for O_BLOCK outputs."""
    acc[:] = 0
    a0, a1, a2, a3 = acc[0], acc[1], acc[2], acc[3]
    for c in range(W.shape[1]):
        row = xp[c]
        for p in range(3):
            x0, x1, x2 = row[p * Wp:], row[p * Wp + 1:], row[p * Wp + 2:]
            u0, u1 = _taps3(W[o0, c, p]), _taps3(W[o0 + 1, c, p])
            u2, u3 = _taps3(W[o0 + 2, c, p]), _taps3(W[o0 + 3, c, p])
            for t in range(L):
                v = (x0[t], x1[t], x2[t])
                a0[t] += _dot3(u0, v)
                a1[t] += _dot3(u1, v)
                a2[t] += _dot3(u2, v)
                a3[t] += _dot3(u3, v)


@njit(inline="always")
def _conv3x3_image(xp, W, Wp, b, acc, out):
    """out[o,i,j] = b[o] + Σ_{c,p,q} W[o,c,p,q] xp[c, (i+p)·Wp + j+q] for one image.

    xp: (≥ C, P) padded image; W: (O4, C, 3, 3), O4 ≥ O a multiple of O_BLOCK (extra rows zero);
    b: (O,); acc: (O_BLOCK, ≥ H·Wp) scratch, rows 64-byte aligned; out: (O, H, W).
    """
    O, H, Wd = out.shape
    for o0 in range(0, W.shape[0], O_BLOCK):
        accumulate_block(xp, W, Wp, H * Wp, o0, acc)
        for m in range(min(O_BLOCK, O - o0)):
            bo = b[o0 + m]
            for i in range(H):
                zi, ai = out[o0 + m, i], acc[m, i * Wp:]
                for j in range(Wd):
                    zi[j] = ai[j] + bo


@njit(cache=True, fastmath=FASTMATH)
def _weight_grad3x3_image(xp, dzp, Wp, H, dW):
    """dW[o,c,p,q] += Σ_{t < H·Wp} dzp[o, Wp+1 + t] xp[c, t + p·Wp + q] for one image.

    xp, dzp: padded x (C, P) and dz (O8, P), O8 a multiple of 8 (extra channels zero); dz's
    zero padding zeroes the dropped columns. dW: (O8, C, 3, 3). One pass over t per (c, p):
    8 output channels × 3 taps, 24 sums in registers.
    """
    L = H * Wp
    zero = dW.dtype.type(0)
    for o0 in range(0, dzp.shape[0], 8):
        d0, d1, d2, d3 = (dzp[o0, Wp + 1:], dzp[o0 + 1, Wp + 1:], dzp[o0 + 2, Wp + 1:],
                          dzp[o0 + 3, Wp + 1:])
        d4, d5, d6, d7 = (dzp[o0 + 4, Wp + 1:], dzp[o0 + 5, Wp + 1:], dzp[o0 + 6, Wp + 1:],
                          dzp[o0 + 7, Wp + 1:])
        for c in range(xp.shape[0]):
            row = xp[c]
            for p in range(3):
                x0, x1, x2 = row[p * Wp:], row[p * Wp + 1:], row[p * Wp + 2:]
                a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = (zero, zero, zero)
                for t in range(L):
                    v = (x0[t], x1[t], x2[t])
                    a0, a1 = _axpy3(a0, d0[t], v), _axpy3(a1, d1[t], v)
                    a2, a3 = _axpy3(a2, d2[t], v), _axpy3(a3, d3[t], v)
                    a4, a5 = _axpy3(a4, d4[t], v), _axpy3(a5, d5[t], v)
                    a6, a7 = _axpy3(a6, d6[t], v), _axpy3(a7, d7[t], v)
                for m, a in enumerate((a0, a1, a2, a3, a4, a5, a6, a7)):
                    w = dW[o0 + m, c, p]
                    w[0], w[1], w[2] = w[0] + a[0], w[1] + a[1], w[2] + a[2]


@njit(cache=True, fastmath=FASTMATH)
def _conv3x3(x, W, b, out):
    """conv2d with 3×3 kernels, image by image (the padded copy of one image stays in cache).

    x: (B, C, H, W); W: (O4, C, 3, 3) as in _conv3x3_image; b: (O,); out: (B, O, H, W).
    """
    C, H, Wd = x.shape[1], x.shape[2], x.shape[3]
    Wp = Wd + 1
    xp = _aligned_rows(C, (H + 2) * Wp + 2, x)
    acc = _aligned_rows(O_BLOCK, H * Wp, x)
    for n in range(x.shape[0]):
        _pad_image(x[n], Wp, xp)
        _conv3x3_image(xp, W, Wp, b, acc, out[n])


@njit(cache=True, fastmath=FASTMATH)
def _conv3x3_adjoint(x, W_t, dz, dx, dW):
    """dx and dW of conv2d with 3×3 kernels, image by image: dx[n] = conv(d̃z[n], W_t),
    dW += the correlation of d̃z[n] with x̃[n].

    x: (B, C, H, W); W_t: (C4, O, 3, 3) the flipped, transposed kernels (zero rows up to C4, a
    multiple of O_BLOCK); dz: (B, O, H, W); dx: like x; dW: (O8, C, 3, 3), O8 = O rounded up
    to a multiple of 8.
    """
    C, H, Wd = x.shape[1], x.shape[2], x.shape[3]
    Wp = Wd + 1
    P = (H + 2) * Wp + 2
    xp = _aligned_rows(C, P, x)
    dzp = _aligned_rows(dW.shape[0], P, x)
    acc = _aligned_rows(O_BLOCK, H * Wp, x)
    no_bias = np.zeros(C, x.dtype)
    dW[:] = 0
    for n in range(x.shape[0]):
        _pad_image(x[n], Wp, xp)
        _pad_image(dz[n], Wp, dzp)
        _conv3x3_image(dzp, W_t, Wp, no_bias, acc, dx[n])
        _weight_grad3x3_image(xp, dzp, Wp, H, dW)


@njit(cache=True, fastmath={"reassoc"})
def _channel_sum(dz, out):
    """out[o] = Σ_{n,t} dz[n, o, t], accumulated in float64.  dz: (B, O, H·W)."""
    for o in range(dz.shape[1]):
        s = 0.0
        for n in range(dz.shape[0]):
            for t in range(dz.shape[2]):
                s += dz[n, o, t]
        out[o] = s


# ----------------------------------------------------------------------------- conv2d
def check_conv_args(x, W, b=None, dz=None) -> None:
    """ValueError unless x: (B, C, H, W), W: (O, C, k, k) odd k, b: (O,), dz: (B, O, H, W)."""
    check_ndim("x", x, 4, "(batch, channels, height, width)")
    check_ndim("W", W, 4, "(out_channels, in_channels, k, k)")
    k = W.shape[-1]
    if W.shape[2] != k or k % 2 == 0:
        raise ValueError(f"`W` must hold odd square k×k kernels, got shape {W.shape}.")
    check_size("W", W.shape[1], x.shape[1], "in_channels (shape[1]) equal to x.shape[1] =")
    if b is not None and b.shape != (W.shape[0],):
        raise ValueError(f"`b` must have shape ({W.shape[0]},), got {b.shape}.")
    expected = (x.shape[0], W.shape[0], x.shape[2], x.shape[3])
    if dz is not None and dz.shape != expected:
        raise ValueError(f"`dz` must have shape {expected}, got {dz.shape}.")


def _blocked(W: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """A contiguous copy of the kernels W (O, C, k, k), zero-extended to (rows, cols, k, k)."""
    out = np.zeros((rows, cols, *W.shape[2:]), W.dtype)
    out[: W.shape[0], : W.shape[1]] = W
    return out


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def conv2d(x, W, b):
    """'Same' cross-correlation (reference.conv2d): a direct kernel on padded images for 3×3
    kernels, im2col + BLAS GEMM chunk by chunk for any other size.

    3×3: z[n, o, t] = b[o] + Σ_{c,p,q} W[o,c,p,q] x̃[n, c, t + p·Wp + q];
    else: z[n] = W₂ cols(x[n]) + b,  W₂ = W.reshape(O, C·k·k),  cols: (C·k·k, H·W).
    """
    if not native_floats(x, W, b):
        return reference.conv2d(x, W, b)
    check_conv_args(x, W, b)
    dtype = common_dtype(x, W, b)
    x = np.ascontiguousarray(x, dtype)  # B,C,H,W
    B, C, H, Wd = x.shape
    O, k = W.shape[0], W.shape[-1]
    if k == 3:
        bias = np.zeros(O, dtype) if b is None else np.ascontiguousarray(b, dtype)
        z = np.empty((B, O, H, Wd), dtype)
        _conv3x3(x, _blocked(W.astype(dtype, copy=False), _round_up(O, O_BLOCK), C), bias, z)
        return z
    return im2col_conv2d(x, W.astype(dtype, copy=False), b if b is None else b.astype(dtype))


def conv2d_adjoint(x, W, dz):
    """(dx, dW, db) of conv2d (reference.conv2d_adjoint).

    3×3: dx = conv3x3(d̃z, W') with W'[c,o,p,q] = W[o,c,2−p,2−q] (the transposed convolution),
    dW[o,c,p,q] = Σ_{n,t} dz[n,o,t] x̃[n,c,t + p·Wp + q], both on the padded images.
    Else from the im2col columns of x: dW₂ = Σ_n dz[n] colsᵀ; dx[n] = col2im(W₂ᵀ dz[n]).
    db[o] = Σ_{n,i,j} dz[n,o,i,j].
    """
    if not native_floats(x, W, dz):
        return reference.conv2d_adjoint(x, W, dz)
    check_conv_args(x, W, dz=dz)
    dtype = common_dtype(x, W, dz)
    x = np.ascontiguousarray(x, dtype)  # B,C,H,W
    B, C, H, Wd = x.shape
    O, k = W.shape[0], W.shape[-1]
    dz = np.ascontiguousarray(dz, dtype)  # B,O,H,W
    db = np.empty(O, dtype)
    _channel_sum(dz.reshape(B, O, H * Wd), db)
    if k != 3:
        return (*im2col_conv2d_adjoint(x, W.astype(dtype, copy=False), dz), db)
    O8 = _round_up(O, 8)  # the weight-gradient kernel takes output channels 8 at a time
    W_t = W.astype(dtype, copy=False)[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)  # C,O,3,3
    dx = np.empty_like(x)
    dW = np.empty((O8, C, 3, 3), dtype)
    _conv3x3_adjoint(x, _blocked(W_t, _round_up(C, O_BLOCK), O), dz, dx, dW)
    return dx, dW[:O], db
