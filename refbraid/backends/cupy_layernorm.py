"""Layer norm of the ``cupy`` backend in one launch forward and three for the adjoint.

:func:`refbraid.backends.reference.layernorm` is ten CuPy operations (two means, the centring,
the squares, the square root, ...), its adjoint thirteen; on a GPU each is a launch around a
kernel of a few microseconds. Here, over the rows of x (R rows of N: every leading axis)::

    layernorm_rows        one thread block per row: μ = mean x, σ² = mean (x − μ)²,
                          r = 1/√(σ² + eps), y = (x − μ) r γ + β; writes y, μ and r
    layernorm_dx_rows     one block per row: x̂ = (x − μ) r, g = dy γ, m₁ = mean g,
                          m₂ = mean g x̂, dx = r (g − m₁ − x̂ m₂)
    layernorm_param_parts one thread per column and chunk of at most L rows (CHUNK, or more
                          where the chunks would exceed a grid's 65535 rows): the
                          chunk's Σ dy x̂ and Σ dy, then one CuPy sum over the chunks gives
                          dγ = Σ_rows dy x̂ and dβ = Σ_rows dy (over every row, or per
                          group of S rows: the chunks never straddle two groups)

(the reference's formulas, in its order of operations per element). γ and β are (N,) or
broadcast per group of rows (MGRIT's batched sweeps pass (k, 1, 1, N): G = R / k rows each).
Sums accumulate in double (a fixed-order tree in shared memory, or down a column) and are
rounded to T once: on a GPU the results agree with the reference to round-off, as CuPy's own
``mean`` does. Off a GPU (the CuPy stand-in) each kernel runs the reference path and reports
one launch to the launch counter (:mod:`.cupy_raw`); its CUDA source is compiled for sm_75,
sm_80 and sm_90 with NVRTC by tests/test_gpu_fused.py (no GPU needed).
"""

from __future__ import annotations

import math

import numpy as np

from .cupy_raw import BLOCK_REDUCTIONS, compiled, on_host, real_cupy

THREADS = 256  # threads per block of the row kernels (a power of two: the tree reduction)
CHUNK = 64  # rows per partial sum of the parameter gradients

_SOURCES = {
    "layernorm_rows": """
extern "C" __global__ void layernorm_rows(const T* x, const T* gamma, const T* beta, T* y,
    T* mean, T* rstd, long long R, long long N, long long G, double eps) {
  __shared__ double buf[THREADS];
  long long r = blockIdx.x;
  if (r >= R) return;
  const T* xr = x + r * N;
  const T* gr = gamma + (r / G) * N;
  const T* br = beta + (r / G) * N;
  double acc = 0;
  for (long long j = threadIdx.x; j < N; j += blockDim.x) acc += (double)xr[j];
  T mu = (T)(block_sum(buf, acc) / (double)N);
  acc = 0;
  for (long long j = threadIdx.x; j < N; j += blockDim.x) {
    T d = xr[j] - mu;
    acc += (double)(d * d);
  }
  T var = (T)(block_sum(buf, acc) / (double)N);
  T rs = (T)1 / sqrt(var + (T)eps);
  for (long long j = threadIdx.x; j < N; j += blockDim.x)
    y[r * N + j] = (xr[j] - mu) * rs * gr[j] + br[j];
  if (threadIdx.x == 0) { mean[r] = mu; rstd[r] = rs; }
}
""",
    "layernorm_dx_rows": """
extern "C" __global__ void layernorm_dx_rows(const T* x, const T* mean, const T* rstd,
    const T* gamma, const T* dy, T* dx, long long R, long long N, long long G) {
  __shared__ double buf[THREADS];
  long long r = blockIdx.x;
  if (r >= R) return;
  const T* xr = x + r * N;
  const T* dyr = dy + r * N;
  const T* gr = gamma + (r / G) * N;
  T mu = mean[r], rs = rstd[r];
  double a1 = 0, a2 = 0;
  for (long long j = threadIdx.x; j < N; j += blockDim.x) {
    T xh = (xr[j] - mu) * rs;
    T g = dyr[j] * gr[j];
    a1 += (double)g;
    a2 += (double)(g * xh);
  }
  T m1 = (T)(block_sum(buf, a1) / (double)N);
  T m2 = (T)(block_sum(buf, a2) / (double)N);
  for (long long j = threadIdx.x; j < N; j += blockDim.x) {
    T xh = (xr[j] - mu) * rs;
    T g = dyr[j] * gr[j];
    dx[r * N + j] = rs * (g - m1 - xh * m2);
  }
}
""",
    "layernorm_param_parts": """
extern "C" __global__ void layernorm_param_parts(const T* x, const T* mean, const T* rstd,
    const T* dy, T* parts, long long R, long long N, long long S, long long L,
    long long per_group, long long chunks) {
  long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  long long c = blockIdx.y;  // chunk c: group c / per_group, its (c % per_group)-th L rows
  if (j >= N || c >= chunks) return;
  double ag = 0, ab = 0;
  long long first = (c / per_group) * S + (c % per_group) * L;
  long long group_end = (c / per_group + 1) * S;
  long long stop = first + L < group_end ? first + L : group_end;
  for (long long r = first; r < stop; ++r) {
    long long i = r * N + j;
    T xh = (x[i] - mean[r]) * rstd[r];
    ag += (double)(dy[i] * xh);
    ab += (double)dy[i];
  }
  parts[c * N + j] = (T)ag;
  parts[(chunks + c) * N + j] = (T)ab;
}
""",
}


def cuda_source(name: str, T: str = "double") -> str:
    """The complete CUDA C source of kernel ``name`` for element type ``T``."""
    return (f"typedef {T} T;\n#define THREADS {THREADS}\n"
            f"{BLOCK_REDUCTIONS}{_SOURCES[name]}")


#: the kernels (the compile check walks these)
KERNELS = tuple(_SOURCES)


def rows_per_gamma(x, gamma) -> int | None:
    """G, the number of consecutive rows of x (R = Π x.shape[:-1]) that share one row of
    γ: R for a (N,) γ, R / k for γ of shape (k, 1, ..., 1, N) over x (k, ..., N); None for
    any other broadcast (the reference path takes it)."""
    lead, N = tuple(x.shape[:-1]), x.shape[-1]
    if tuple(gamma.shape[-1:]) != (N,) or gamma.ndim > x.ndim:
        return None
    g_lead = tuple(gamma.shape[:-1])
    g_lead = (1,) * (len(lead) - len(g_lead)) + g_lead
    m = 0  # γ's leading axes: a prefix equal to x's, then ones
    while m < len(lead) and g_lead[m] == lead[m] and g_lead[m] != 1:
        m += 1
    if any(n != 1 for n in g_lead[m:]):
        return None
    return max(1, math.prod(lead[m:]))


def layernorm(x, gamma, beta, eps: float, G: int):
    """reference.layernorm on CuPy in one launch: ``(y, mean, rstd)``; G from
    :func:`rows_per_gamma`."""
    from . import reference

    if not real_cupy(x):
        return on_host("layernorm_rows", reference.layernorm, x, gamma, beta, eps)
    import cupy  # pragma: no cover - needs a GPU

    x, gamma, beta = (cupy.ascontiguousarray(a) for a in (x, gamma, beta))
    N = x.shape[-1]
    R = x.size // N
    y = cupy.empty_like(x)
    mean, rstd = (cupy.empty(x.shape[:-1], dtype=x.dtype) for _ in range(2))
    compiled(cuda_source, "layernorm_rows", x.dtype)((R,), (THREADS,), (
        x, gamma, beta, y, mean, rstd, np.int64(R), np.int64(N), np.int64(G),
        np.float64(eps)))
    return y, mean, rstd


def layernorm_adjoint(x, mean, rstd, gamma, dy, G: int, grouped: bool = False,
                      grads: bool = True):
    """reference.layernorm_adjoint on CuPy in three launches: ``(dx, dgamma, dbeta)``.
    ``grouped``: dγ and dβ summed per row of x's first axis, ``(x.shape[0], N)`` each (as the
    batched transformer step sums the k layers' gradients), not over every row; without
    ``grads`` only dx (one launch), dγ and dβ None."""
    from . import reference

    N = x.shape[-1]
    R = x.size // N
    groups = x.shape[0] if grouped else 1
    if not real_cupy(x):
        dx = on_host("layernorm_dx_rows",
                      lambda *a: reference.layernorm_adjoint(*a)[0], x, mean, rstd, gamma, dy)
        if not grads:
            return dx, None, None
        parts = on_host("layernorm_param_parts", lambda *a: group_sums(grouped, *a),
                         x, mean, rstd, gamma, dy)
        sums = reference.array_namespace(parts).sum(parts, axis=2)  # CuPy's sum over chunks
    else:  # pragma: no cover - needs a GPU
        import cupy

        x, mean, rstd, gamma, dy = (cupy.ascontiguousarray(a)
                                    for a in (x, mean, rstd, gamma, dy))
        dx = cupy.empty_like(x)
        compiled(cuda_source, "layernorm_dx_rows", x.dtype)((R,), (THREADS,), (
            x, mean, rstd, gamma, dy, dx, np.int64(R), np.int64(N), np.int64(G)))
        if not grads:
            return dx, None, None
        S, L = R // groups, CHUNK
        while groups * -(-S // L) > 65535:  # a grid's y extent
            L *= 2
        per_group = max(1, -(-S // L))
        parts = cupy.empty((2, groups, per_group, N), dtype=x.dtype)
        grid = ((N + 127) // 128, groups * per_group)
        compiled(cuda_source, "layernorm_param_parts", x.dtype)(grid, (128,), (
            x, mean, rstd, dy, parts, np.int64(R), np.int64(N), np.int64(S), np.int64(L),
            np.int64(per_group), np.int64(groups * per_group)))
        sums = parts.sum(axis=2)
    if grouped:
        return dx, sums[0, ...], sums[1, ...]
    return dx, sums[0, 0, ...], sums[1, 0, ...]


def group_sums(grouped: bool, x, mean, rstd, gamma, dy):
    """What layernorm_param_parts leaves off a GPU, ``(2, groups, 1, N)`` (one chunk per
    group): the reference's own sums (its bits) over every row, or per row of x's first axis
    as transformer_batched sums them (x̂ formed as the reference forms it)."""
    from . import reference

    xp = reference.array_namespace(x)
    if not grouped:
        _, dgamma, dbeta = reference.layernorm_adjoint(x, mean, rstd, gamma, dy)
        return xp.stack([dgamma, dbeta])[:, None, None, :]
    xhat = (x - mean[..., None]) * rstd[..., None]
    inner = tuple(range(1, x.ndim - 1))
    return xp.stack([xp.sum(dy * xhat, axis=inner), xp.sum(dy, axis=inner)])[:, :, None, :]
