"""The attention's row softmax on CuPy in one launch each way (``cupy`` backend).

:func:`refbraid.backends.reference.softmax` is five CuPy operations without a mask (the row
maximum, the shift, exp, the row sum, the division) and ten with one; its adjoint three.
Here one thread block per row (R rows of N: every leading axis)::

    softmax_rows          z_j = c·x_j (c the scale: the attention's 1/√d),
                          m = max of the unmasked z_j (0 for a fully masked row),
                          e_j = exp(z_j − m) (0 where masked), s = Σ e,
                          p = e / s (s = 0: p = e = 0)
    softmax_adjoint_rows  s = Σ_j p_j dp_j,  dx = (p (dp − s))·c

The reference's formulas per element; the row sums accumulate in double in a fixed-order tree
and are rounded to T once, so on a GPU the results agree with the reference to round-off (as
CuPy's own sums do). Off a GPU (the CuPy stand-in) each kernel runs the reference (its bits)
and reports one launch to the launch counter (:mod:`.cupy_raw`); the CUDA source compiles
with NVRTC for sm_75, sm_80 and sm_90 (tests/test_gpu_fused.py).
"""

from __future__ import annotations

import numpy as np

from .cupy_raw import BLOCK_REDUCTIONS, compiled, on_host, real_cupy

THREADS = 128  # threads per block (a power of two: the tree reductions)

_SOURCES = {
    "softmax_rows": """
extern "C" __global__ void softmax_rows(const T* x, const bool* mask, T* p, long long R,
    long long N, int masked, T c) {
  __shared__ double buf[THREADS];
  long long r = blockIdx.x;
  if (r >= R) return;
  const T* xr = x + r * N;
  const bool* mr = mask + (masked ? r * N : 0);
  T* pr = p + r * N;
  double m = -__longlong_as_double(0x7ff0000000000000LL);  // −∞
  for (long long j = threadIdx.x; j < N; j += blockDim.x)
    if (!masked || !mr[j]) m = fmax(m, (double)(xr[j] * c));
  m = block_max(buf, m);
  T shift = isfinite(m) ? (T)m : (T)0;
  double acc = 0;
  for (long long j = threadIdx.x; j < N; j += blockDim.x) {
    T e = (masked && mr[j]) ? (T)0 : exp(xr[j] * c - shift);
    pr[j] = e;
    acc += (double)e;
  }
  T s = (T)block_sum(buf, acc);
  if (s == (T)0) s = (T)1;
  for (long long j = threadIdx.x; j < N; j += blockDim.x) pr[j] = pr[j] / s;
}
""",
    "softmax_adjoint_rows": """
extern "C" __global__ void softmax_adjoint_rows(const T* p, const T* dp, T* dx, long long R,
    long long N, T c) {
  __shared__ double buf[THREADS];
  long long r = blockIdx.x;
  if (r >= R) return;
  const T* pr = p + r * N;
  const T* dpr = dp + r * N;
  double acc = 0;
  for (long long j = threadIdx.x; j < N; j += blockDim.x) acc += (double)(pr[j] * dpr[j]);
  T s = (T)block_sum(buf, acc);
  for (long long j = threadIdx.x; j < N; j += blockDim.x)
    dx[r * N + j] = (pr[j] * (dpr[j] - s)) * c;
}
""",
}

#: the kernels (the compile check walks these)
KERNELS = tuple(_SOURCES)


def cuda_source(name: str, T: str = "double") -> str:
    """The complete CUDA C source of kernel ``name`` for element type ``T``."""
    return f"typedef {T} T;\n#define THREADS {THREADS}\n{BLOCK_REDUCTIONS}{_SOURCES[name]}"


def softmax(x, mask, scale: float = 1.0):
    """reference.softmax in one launch; ``mask`` None or a bool array of x's shape."""
    from . import reference

    if not real_cupy(x):
        if mask is None:
            return on_host("softmax_rows", lambda a: reference.softmax(a, None, scale), x)
        return on_host("softmax_rows", lambda a, m: reference.softmax(a, m, scale), x, mask)
    import cupy  # pragma: no cover - needs a GPU

    x = cupy.ascontiguousarray(x)
    N = x.shape[-1]
    R = x.size // N
    masked = mask is not None
    mask = cupy.ascontiguousarray(mask) if masked else cupy.empty(1, dtype=cupy.bool_)  # unread
    p = cupy.empty_like(x)
    compiled(cuda_source, "softmax_rows", x.dtype)((R,), (THREADS,), (
        x, mask, p, np.int64(R), np.int64(N), np.int32(masked), x.dtype.type(scale)))
    return p


def softmax_adjoint(p, dp, scale: float = 1.0):
    """reference.softmax_adjoint in one launch."""
    from . import reference

    if not real_cupy(p):
        return on_host("softmax_adjoint_rows",
                       lambda a, b: reference.softmax_adjoint(a, b, scale), p, dp)
    import cupy  # pragma: no cover - needs a GPU

    p, dp = cupy.ascontiguousarray(p), cupy.ascontiguousarray(dp)
    N = p.shape[-1]
    R = p.size // N
    dx = cupy.empty_like(p)
    compiled(cuda_source, "softmax_adjoint_rows", p.dtype)((R,), (THREADS,), (
        p, dp, dx, np.int64(R), np.int64(N), p.dtype.type(scale)))
    return dx
