"""Direct convolution kernels on CuPy: a convolution, its transpose and its weight gradient,
each in one launch and without a column matrix.

With x̃ = x zero-padded by r = s // 2 on both spatial axes (and likewise dz̃)::

    z[n,o,i,j]  = Σ_{c,p,q} W[o,c,p,q] · x̃[n,c,i+p,j+q]                (conv_direct)
    dx[n,c,i,j] = Σ_{o,p,q} W̃[c,o,p,q] · dz̃[n,o,i+p,j+q]               (conv_direct, flip)
    dW[o,c,p,q] = Σ_{n,i,j} dz[n,o,i,j] · x̃[n,c,i+p,j+q]                (conv_weight_grad)
    db[o]       = Σ_{n,i,j} dz[n,o,i,j]

with ``W̃[c,o,p,q] = W[o,c,s−1−p,s−1−q]`` (the transposed convolution is the correlation of
dz with the kernel flipped in both spatial axes and its channel axes swapped), every one
also over a leading row axis (k rows, row j with its own ``W[j]``: MGRIT's batched sweeps).

``conv_direct``: a block per (row, image, group of :data:`OUT_PER_THREAD` output channels,
tile of TILE × TILE pixels), a thread per output pixel, its group's sums in registers; per
chunk of input channels the block stages the tile's padded input and the group's weights in
shared memory (:data:`SHARED_BYTES`), the weights of one (c, p, q) side by side, read by
every thread as 16-byte loads of the same address. With ``flip`` it reads W̃ from W in place.
The sums end in an epilogue (``convolution``'s ``add`` and ``step``): z written as it is,
or with the rows of another array added (the adjoint's ``dy_next + W̃ * s``), or as the conv
ODE step, ``z = sum + b`` and ``y_next = y + h σ(z)`` with cupy_fused.BIAS_ACT_EULER's
arithmetic (σ from cupy_fused.ACT) — one launch for what was a convolution and an
element-wise kernel, z read back no more — y_next written where it is asked to be (MGRIT's
F-sweep rows of the iterate, by offset and row stride) with the level's right-hand side g
added (``Φ + g``, the sweep's own rounding: no copy or sum after the step). A prologue
(``convolution``'s ``scale``) stages ``h σ'(z) ⊙ x`` instead of x, with
cupy_fused.SCALED_ACT_ADJOINT's arithmetic (σ' from cupy_fused.ACT_ADJOINT): the conv step's
adjoint without a weight gradient, ``dy_next + W̃ * (h σ'(z) ⊙ dy_next)``, in one launch —
the scaled adjoint never written.
``conv_weight_grad``: a block per (row, o, c), its threads along (n, i, j), each summing its
share of the s² taps in registers (s ≤ :data:`MAX_WEIGHT_SIDE`), then each tap's block sum
in a fixed-order tree in double; the blocks with c = 0 sum db too; with ``scale`` its threads
form ``h σ'(z) ⊙ dy`` as they read it, as the convolution's prologue does.

Traffic: each reads its inputs and writes its outputs once (the column-matrix form writes
and reads s² copies of the input). The input rows of a batched call may be MGRIT's strided
rows of a level, and its weights and biases every m-th layer's of the stacked weights
(:func:`refbraid.backends.device_batching.weight_rows`): all read in place
(:func:`refbraid.backends.cupy_raw.row_layout`).

Off a GPU (the CuPy stand-in) each kernel is its NumPy equivalent (a column-matrix GEMM,
:mod:`refbraid.backends.cupy_conv_direct_host`), charged one launch. Round-off: the kernels
sum a point's products in their own order (input channel chunks, then (c, p, q); dW per
thread, then a tree), so they agree with the reference's stencil sums to round-off
(tests/cuda_c/test_raw_kernels.py).

Shape legend: k rows (optional, any lead axes), B batch, C input channels, O output
channels, H × W the image, s the (odd) kernel size.
"""

from __future__ import annotations

import math

import numpy as np

from .cupy_conv_direct_host import convolution_on_host, weight_gradient_on_host
from .cupy_fused import ACT, ACT_ADJOINT
from .cupy_raw import BLOCK_REDUCTIONS, compiled, real_cupy, row_args, row_layout

#: threads of one block of the weight-gradient kernel (a power of two: its block sums)
THREADS = 256
#: the convolution's output tile, TILE × TILE pixels (a thread each; TILE² ≤ THREADS)
TILE = 16
#: output channels one thread of the convolution sums at once (its registers; a multiple of
#: 4, the floats of a 16-byte load)
OUT_PER_THREAD = 16
#: shared memory of one block of the convolution: a chunk of input channels' padded tile
#: and the weights of its output channels for them
SHARED_BYTES = 32768
#: the largest kernel side s whose weight gradient the kernel sums (its s² taps are registers
#: of each thread)
MAX_WEIGHT_SIDE = 7

_SOURCES = {
    "conv_direct": """
// z[l, n, o, i, j] = sum over (c, p, q) of K(o, c, p, q) x[l, n, c, i+p-r, j+q-r], 0 outside
// the image, K = w[l, o, c, p, q], or with flip K = w[l, c, o, s-1-p, s-1-q] (w as (C, O, s, s):
// the transposed convolution's kernel); w's row l starts w_offset + l w_row_stride into w (a
// layer's weights, or every m-th layer's of the stacked weights, read in place). One block per
// (l, n, group of OUT_PER_THREAD output channels, TH x TW tile of the image), one thread per
// pixel of the tile; per chunk of cc input channels the block stages the tile's padded input
// and the group's weights in shared memory, the weights of one (c, p, q) side by side: read
// as 16-byte packs, the same for every thread.
#define LANES (16 / (int)sizeof(T))
struct alignas(16) Pack { T v[16 / sizeof(T)]; };
// The epilogue (MODE): 0 writes out = the sum; 1 writes the sum plus the rows of `extra`
// (the sum's layout, offset and row stride of their own) into the rows of `y_next`; 2 is the
// ODE step: z = sum + bias[l, o] into `out` (bias's row l at b_offset + l b_row_stride),
// y + h sigma(z) into the rows of `y_next`, y the rows of `extra` (h = hs[l] if per_row).
// In 1 and 2, with ADD_G, the rows of `rhs` added last (MGRIT's F-sweep: Phi + g). With
// SCALE (the prologue) the input staged is h sigma'(z) x (x the adjoint's dy, z the rows of
// `zs`; h as above): the scaled adjoint's arithmetic as it stages, no array of it written.
extern "C" __global__ void conv_direct(const T* x, const T* w, long long w_offset,
    long long w_row_stride, T* out, long long offset, long long row_stride, int B, int C,
    int O, int H, int W, int s, int flip, int TH, int TW, int CC, const T* extra,
    long long extra_offset, long long extra_row_stride, const T* bias, long long b_offset,
    long long b_row_stride, const T* hs, T h, int per_row, T* y_next, long long next_offset,
    long long next_row_stride, const T* rhs, long long rhs_offset, long long rhs_row_stride,
    const T* zs, long long z_offset, long long z_row_stride) {
  __shared__ Pack packs[SHARED_BYTES / 16];
  T* staged = (T*)packs;
  int r = s / 2, s2 = s * s, PH = TH + 2 * r, PW = TW + 2 * r;
  int tiles_w = (W + TW - 1) / TW, tiles_h = (H + TH - 1) / TH;
  int groups = (O + OUT_PER_THREAD - 1) / OUT_PER_THREAD;
  long long rest = blockIdx.x;
  int tw = (int)(rest % tiles_w);
  rest /= tiles_w;
  int th = (int)(rest % tiles_h);
  rest /= tiles_h;
  int g = (int)(rest % groups);
  rest /= groups;
  int n = (int)(rest % B);
  long long l = rest / B;
  int t = threadIdx.x, ti = t / TW, tj = t - ti * TW;
  int i = th * TH + ti, j = tw * TW + tj;
  bool inside = ti < TH && i < H && j < W;
  const T* src = x + offset + l * row_stride + (long long)n * C * H * W;
#if SCALE
  const T* zsrc = zs + z_offset + l * z_row_stride + (long long)n * C * H * W;
  T hl = per_row ? hs[l] : h;
#endif
  const T* wl = w + w_offset + l * w_row_stride;
  T* tile = staged;  // (cc, PH, PW): the input around the tile, 0 outside
  // (cc, s, s, OUT_PER_THREAD), 16-byte aligned: 0 past the last output channel
  T* weights = staged + (CC * PH * PW + LANES - 1) / LANES * LANES;
  T acc[OUT_PER_THREAD];
#pragma unroll
  for (int k = 0; k < OUT_PER_THREAD; ++k) acc[k] = (T)0;
  for (int c0 = 0; c0 < C; c0 += CC) {
    int cc = min(CC, C - c0);
    for (int e = t; e < cc * PH * PW; e += blockDim.x) {
      int c = e / (PH * PW), a = (e - c * PH * PW) / PW, b = e - c * PH * PW - a * PW;
      int yi = th * TH + a - r, xj = tw * TW + b - r;
      bool in_image = yi >= 0 && yi < H && xj >= 0 && xj < W;
      long long at = ((long long)(c0 + c) * H + yi) * W + xj;
#if SCALE
      T dy = in_image ? src[at] : (T)0, z = in_image ? zsrc[at] : (T)0;
      tile[e] = in_image ? hl * (SIGMA_PRIME_DY) : (T)0;
#else
      tile[e] = in_image ? src[at] : (T)0;
#endif
    }
    for (int e = t; e < cc * s2 * OUT_PER_THREAD; e += blockDim.x) {
      int k = e % OUT_PER_THREAD, cpq = e / OUT_PER_THREAD, c = cpq / s2, pq = cpq - c * s2;
      int o = g * OUT_PER_THREAD + k;
      weights[e] = o >= O ? (T)0 : flip
          ? wl[((long long)(c0 + c) * O + o) * s2 + (s2 - 1 - pq)]
          : wl[((long long)o * C + c0 + c) * s2 + pq];
    }
    __syncthreads();
    if (inside)
      for (int c = 0; c < cc; ++c)
        for (int p = 0; p < s; ++p)
          for (int q = 0; q < s; ++q) {
            T v = tile[(c * PH + ti + p) * PW + tj + q];
            const Pack* k_cpq = (const Pack*)(weights + ((c * s + p) * s + q) * OUT_PER_THREAD);
#pragma unroll
            for (int m = 0; m < OUT_PER_THREAD / LANES; ++m) {
              Pack k = k_cpq[m];
#pragma unroll
              for (int e = 0; e < LANES; ++e) acc[m * LANES + e] += k.v[e] * v;
            }
          }
    __syncthreads();
  }
  if (inside)
    for (int k = 0; k < OUT_PER_THREAD && g * OUT_PER_THREAD + k < O; ++k) {
      int o = g * OUT_PER_THREAD + k;
      long long at = (((l * B + n) * O + o) * H + i) * W + j;
      long long in_row = (((long long)n * O + o) * H + i) * W + j;
      long long there = extra_offset + l * extra_row_stride + in_row;
#if MODE == 0
      out[at] = acc[k];
#else
#if MODE == 1
      T v = acc[k] + extra[there];
#else
      T z = acc[k] + bias[b_offset + l * b_row_stride + o];
      out[at] = z;
      T v = extra[there] + (per_row ? hs[l] : h) * (SIGMA);
#endif
#if ADD_G
      v = v + rhs[rhs_offset + l * rhs_row_stride + in_row];
#endif
      y_next[next_offset + l * next_row_stride + in_row] = v;
#endif
    }
}
""",
    "conv_weight_grad": """
// dW[l, o, c, p, q] = sum over (n, i, j) of dz[l, n, o, i, j] x[l, n, c, i+p-r, j+q-r] (0 outside
// the image) for the S x S taps, and (blocks with c = 0) db[l, o] = sum over (n, i, j) of
// dz[l, n, o, i, j]. One block per (l, o, c), its THREADS threads along (n, i, j), each summing
// its share of every tap; then the block's sums (block_sum: in double, a fixed-order tree).
// With SCALE, dz is h sigma'(z) dy formed as each thread reads it (dy the rows of `dz`, z
// those of `zs`; h = hs[l] if per_row), as the convolution's prologue forms it.
extern "C" __global__ void conv_weight_grad(const T* x, const T* dz, T* dW, T* db,
    long long x_offset, long long x_row_stride, long long dz_offset, long long dz_row_stride,
    int B, int C, int O, int H, int W, const T* zs, long long z_offset, long long z_row_stride,
    const T* hs, T h, int per_row) {
  __shared__ double buf[THREADS];
  long long rest = blockIdx.x;
  int c = (int)(rest % C);
  rest /= C;
  int o = (int)(rest % O);
  long long l = rest / O;
  int r = S / 2, HW = H * W;
  const T* xs = x + x_offset + l * x_row_stride + (long long)c * HW;
  const T* dzs = dz + dz_offset + l * dz_row_stride + (long long)o * HW;
#if SCALE
  const T* zrow = zs + z_offset + l * z_row_stride + (long long)o * HW;
  T hl = per_row ? hs[l] : h;
#endif
  T acc[S * S], bias = (T)0;
#pragma unroll
  for (int k = 0; k < S * S; ++k) acc[k] = (T)0;
  for (long long e = threadIdx.x; e < (long long)B * HW; e += blockDim.x) {
    long long n = e / HW;
    int ij = (int)(e - n * HW), i = ij / W, j = ij - i * W;
#if SCALE
    T dy = dzs[n * O * HW + ij], z = zrow[n * O * HW + ij];
    T g = hl * (SIGMA_PRIME_DY);
#else
    T g = dzs[n * O * HW + ij];
#endif
    const T* xn = xs + n * C * HW;
    bias += g;
#pragma unroll
    for (int p = 0; p < S; ++p)
#pragma unroll
      for (int q = 0; q < S; ++q) {
        int yi = i + p - r, xj = j + q - r;
        if (yi >= 0 && yi < H && xj >= 0 && xj < W) acc[p * S + q] += g * xn[yi * W + xj];
      }
  }
  T* out = dW + ((l * O + o) * C + c) * (S * S);
  for (int k = 0; k < S * S; ++k) {
    double total = block_sum(buf, (double)acc[k]);
    if (threadIdx.x == 0) out[k] = (T)total;
  }
  if (c == 0) {
    double total = block_sum(buf, (double)bias);
    if (threadIdx.x == 0) db[l * O + o] = (T)total;
  }
}
""",
}

#: the kernels (the compile check walks these)
KERNELS = tuple(_SOURCES)


#: the convolution's epilogues (its MODE): the sum, the sum plus rows of an array, the ODE step
EPILOGUES = ("sum", "add", "step")


def cuda_source(name: str, T: str = "double", s: int = 3, epilogue: str = "sum",
                act: str = "identity", add_g: bool = False, scale: bool = False) -> str:
    """The complete CUDA C source of kernel ``name`` for element type ``T``: the weight
    gradient's for s×s kernels (its taps are registers); the convolution's with one of
    :data:`EPILOGUES` (``step``: with activation ``act``, σ(z) as cupy_fused.ACT writes it;
    ``add_g``: with MGRIT's right-hand side added; ``scale``: the input staged as
    ``h σ'(z) ⊙ x``, σ' of ``act`` as cupy_fused.ACT_ADJOINT writes it)."""
    return (f"typedef {T} T;\n#define THREADS {THREADS}\n#define SHARED_BYTES {SHARED_BYTES}\n"
            f"#define OUT_PER_THREAD {OUT_PER_THREAD}\n#define S {s}\n"
            f"#define MODE {EPILOGUES.index(epilogue)}\n#define SIGMA {ACT[act]}\n"
            f"#define SIGMA_PRIME_DY {ACT_ADJOINT[act]}\n#define SCALE {int(scale)}\n"
            f"#define ADD_G {int(add_g)}\n{BLOCK_REDUCTIONS}{_SOURCES[name]}")


def plan(x, W) -> tuple[int, int, int] | None:
    """The convolution kernel's ``(TH, TW, CC)`` for x (..., B, C, H, W) and W (..., O, C,
    s, s) — output tile TH × TW, input channels staged CC at a time — or None where it does
    not apply: an empty axis, W with lead axes other than x's (the kernel pairs lead row l of
    x with W's row l), or a padded tile and weights of one channel beyond SHARED_BYTES."""
    if W.shape[:-4] != x.shape[:-4] or 0 in x.shape or 0 in W.shape:
        return None
    *_, H, Wd = x.shape
    C, s = x.shape[-3], W.shape[-1]
    th, tw = min(TILE, max(H, 1)), min(TILE, max(Wd, 1))
    per_channel = (th + s - 1) * (tw + s - 1) + s * s * OUT_PER_THREAD
    lanes = 16 // x.dtype.itemsize  # the weights start at a 16-byte boundary
    chunk = min(C, (SHARED_BYTES // x.dtype.itemsize - lanes + 1) // per_channel)
    return (th, tw, chunk) if chunk >= 1 else None


def convolution(x, W, tiling: tuple[int, int, int], flip: bool = False, add=None,
                step: tuple | None = None, into=None, g=None, scale: tuple | None = None):
    """``z = K * x`` by one launch of the ``conv_direct`` kernel, tiled as :func:`plan` says: x
    (..., B, C, H, W), z (..., B, O, H, W) C-ordered; K = W (..., O, C, s, s), or with ``flip``
    the transposed convolution's kernel read from W (..., C, O, s, s) in place, ``K[o,c,p,q] =
    W[c,o,s−1−p,s−1−q]``; W's rows (and b's) read in place where they are evenly spaced in a
    C-ordered stack, else from a copy. Epilogues in the same launch: ``add`` (z's shape) returns
    ``K * x + add``; ``step = (b, y, h, act)`` returns ``(z, y_next)`` with ``z = K * x + b`` (b
    (..., O)) and ``y_next = y + h σ(z)`` (y z's shape; h a float, or one per lead row as an
    array (k, 1, 1, 1, 1)), as cupy_fused.BIAS_ACT_EULER computes them, then ``+ g`` where g is
    given, written into ``into`` where given (rows of MGRIT's iterate; returned as y_next) — the
    F-sweep's ``Φ + g`` without a copy or a sum after it; with ``add``, ``K * x + add (+ g)``
    likewise (the adjoint's F-sweep; ``into`` and ``g`` need ``add`` or ``step``). ``scale = (z,
    h, act)`` (z x's shape, h as for ``step``): the kernel convolves ``h σ'(z) ⊙ x``
    (cupy_fused.SCALED_ACT_ADJOINT's arithmetic, formed as the input is staged: the adjoint
    step's ``s`` never written) — with ``flip`` and ``add = x`` the conv step's adjoint
    ``dy_next + W *ᵀ (h σ'(z) ⊙ dy_next)`` in one launch. Rows the kernel cannot address (not
    evenly spaced C-ordered images: no :func:`~refbraid.backends.cupy_raw.row_layout`) are not
    written: the result is then new and without g. Off a GPU the column-matrix GEMM and that
    kernel's reference in NumPy (on the stand-in counted as the kernel's one launch)."""
    if not real_cupy(x):
        return convolution_on_host(x, W, flip, add, step, into, g, scale)
    import cupy  # pragma: no cover - needs a GPU (the emulator runs this branch)

    if into is not None and row_layout(into) is None:  # rows the kernel cannot address
        into = g = None
    *lead, B, C, H, Wd = x.shape
    O, s = W.shape[-3 if flip else -4], W.shape[-1]
    th, tw, chunk = tiling
    size = B * O * H * Wd  # of one lead row of the result
    base, offset, row_stride = row_args(x)
    z = (cupy.empty((*lead, B, O, H, Wd), dtype=x.dtype)
         if step is not None or into is None else base)  # (base: a pointer never written)
    # where the sum (+ add, or the step's y_next) (+ g) goes: new, or the rows ``into``
    dest = (z if step is None else cupy.empty_like(z), 0, size) if into is None \
        else row_layout(into)
    epilogue, act, plus = "sum", "identity", (base, 0, 0)
    extra, bias, hs, h, per_row, zs = (base, 0, 0), (base, 0, 0), base, 0.0, 0, (base, 0, 0)
    if add is not None:
        epilogue, extra = "add", row_args(add)
    if step is not None:
        b, y, h, act = step
        epilogue, extra, bias = "step", row_args(y), row_args(b, inner=1)
    if scale is not None:  # (no step with it: the two share h and act)
        z_in, h, act = scale
        zs = row_args(z_in)
    if step is not None or scale is not None:
        hs, h, per_row = _step_size_args(h, base)
    if g is not None:
        plus = row_args(g)
    tiles = -(-H // th) * -(-Wd // tw)
    blocks = math.prod(lead) * B * -(-O // OUT_PER_THREAD) * tiles
    kernel = compiled(lambda name, T: cuda_source(name, T, epilogue=epilogue, act=act,
                                                  add_g=g is not None,
                                                  scale=scale is not None),
                      "conv_direct", x.dtype)
    weights = row_args(W)  # a layer's, or evenly spaced rows of the stack: read in place
    kernel((blocks,), (th * tw,), (
        base, weights[0], np.int64(weights[1]), np.int64(weights[2]), z, np.int64(offset),
        np.int64(row_stride),
        np.int32(B), np.int32(C), np.int32(O), np.int32(H), np.int32(Wd), np.int32(s),
        np.int32(flip), np.int32(th), np.int32(tw), np.int32(chunk), extra[0],
        np.int64(extra[1]), np.int64(extra[2]), bias[0], np.int64(bias[1]), np.int64(bias[2]),
        hs, x.dtype.type(h), np.int32(per_row),
        dest[0], np.int64(dest[1]), np.int64(dest[2]), plus[0], np.int64(plus[1]),
        np.int64(plus[2]), zs[0], np.int64(zs[1]), np.int64(zs[2])))
    result = dest[0] if into is None else into
    if step is not None:
        return z, result
    return z if add is None else result


def weight_gradient(x, dz, s: int, scale: tuple | None = None):
    """``(dW, db)`` of the convolution ``z = W * x + b`` with an s×s kernel by one launch of
    the ``conv_weight_grad`` kernel: x (..., B, C, H, W), dz (..., B, O, H, W) → dW (..., O,
    C, s, s), db (..., O); both inputs' rows read in place when they are rows of C-ordered
    images. ``scale = (z, h, act)``: dz stands for ``h σ'(z) ⊙ dz``, made as each thread
    reads it (as :func:`convolution`'s prologue). Off a GPU the column-matrix GEMM in NumPy
    (on the stand-in counted as one launch)."""
    if not real_cupy(x):
        return weight_gradient_on_host(x, dz, s, scale)
    import cupy  # pragma: no cover - needs a GPU (the emulator runs this branch)

    *lead, B, C, H, Wd = x.shape
    O = dz.shape[-3]
    dW = cupy.empty((*lead, O, C, s, s), dtype=x.dtype)
    db = cupy.empty((*lead, O), dtype=x.dtype)
    (xb, x_offset, x_stride), (gb, g_offset, g_stride) = (row_args(a) for a in (x, dz))
    zs, act, (hs, h, per_row) = (gb, 0, 0), "identity", (gb, 0.0, 0)
    if scale is not None:
        zs, act, (hs, h, per_row) = row_args(scale[0]), scale[2], _step_size_args(scale[1], gb)
    kernel = compiled(lambda name, T: cuda_source(name, T, s, act=act, scale=scale is not None),
                      "conv_weight_grad", x.dtype)
    kernel((math.prod(lead) * O * C,), (THREADS,), (
        xb, gb, dW, db, np.int64(x_offset), np.int64(x_stride), np.int64(g_offset),
        np.int64(g_stride), np.int32(B), np.int32(C), np.int32(O), np.int32(H), np.int32(Wd),
        zs[0], np.int64(zs[1]), np.int64(zs[2]), hs, x.dtype.type(h), np.int32(per_row)))
    return dW, db


def _step_size_args(h, unread):  # pragma: no cover - needs a GPU (the emulator runs this)
    """A kernel's ``(hs, h, per_row)`` for step size ``h``: a float (``hs`` then ``unread``, a
    pointer of the kernel's type it never reads), or one per lead row (an array (k, 1, …))
    read from ``hs[l]``."""
    import cupy

    if isinstance(h, (int, float, np.floating)):
        return unread, float(h), 0
    return cupy.ascontiguousarray(cupy.reshape(h, (-1,))), 0.0, 1
