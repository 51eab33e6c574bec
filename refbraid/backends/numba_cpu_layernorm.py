"""Numba CPU kernels of the layer norm (merged into backend ``"numba"``).

Every public function keeps the signature and semantics of the same-named function in
:mod:`refbraid.backends.reference` (section "transformer kernels"); its docstring says only
what it changes. With x̂ = (x − μ) r and g = dy γ (N = row length, R rows)::

    layernorm          μ = Σ x / N, σ² = Σ (x − μ)² / N,      one pass per row (two-pass
                       r = 1/√(σ² + eps), y = x̂ γ + β           variance), no temporaries
    layernorm_adjoint  dx = r (g − Σ g / N − x̂ Σ g x̂ / N)       one pass per row, which also adds
                       dγ = Σ_R dy x̂,  dβ = Σ_R dy               the row's terms to dγ, dβ

Precision and speed. The row sums run in the data's dtype — float32 sums for float32 data,
as NumPy's reference and torch do — and every loop is compiled with ``fastmath={"reassoc"}``
and no other flag: it lets LLVM split each row sum into SIMD partial sums, which is what
vectorises it (a strict left-to-right float sum cannot be). Measured (kernels suite,
E = 128, 512 rows, forward + adjoint, one thread): 0.22 → 0.04 ms in float32 and 0.20 →
0.055 ms in float64 against float64 sums in strict order; 4–6× faster than the reference.
The partial sums make float32 results differ from the reference by a few ulps (the test
catalogue holds them to 1e-5; float64 to 1e-12). dγ and dβ sum over all R rows, so they keep
float64 accumulators (row by row, unit stride). Numba promotes float32 to float64 at any
float literal or integer divisor, so the CPU loops take their constants typed
(``x.dtype.type(N)``): they are written out here rather than reusing :func:`layernorm_row`,
:func:`layernorm_adjoint_row` and :func:`layernorm_param_col`, the same math with float64
accumulators that :mod:`refbraid.backends.numba_cuda_attention` compiles as device functions
(one thread per row, and per column for dγ, dβ).

Arrays that are not float32/float64 NumPy arrays (the verifier's complex steps, CuPy arrays)
go to the reference unchanged. Shape legend: R rows (all leading axes flattened), N row length.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from . import reference
from .numba_cpu_attention import check_same_shape, check_vector, fast, result_dtype, rows

OVERRIDES = ("layernorm", "layernorm_adjoint")


# ----------------------------------------------------------------------------- GPU row bodies
def layernorm_row(x, gamma, beta, eps, y, mean, rstd, i):
    """y[i] = γ (x[i] − μ) r + β with μ = mean x[i], r = 1/√(mean (x[i] − μ)² + eps)."""
    N = x.shape[1]
    mu = 0.0
    for j in range(N):
        mu += x[i, j]
    mu /= N
    var = 0.0
    for j in range(N):
        d = x[i, j] - mu
        var += d * d
    r = 1.0 / math.sqrt(var / N + eps)
    for j in range(N):
        y[i, j] = (x[i, j] - mu) * r * gamma[j] + beta[j]
    mean[i] = mu
    rstd[i] = r


def layernorm_adjoint_row(x, mean, rstd, gamma, dy, dx, i):
    """dx[i] = r (g − mean g − x̂ mean(g x̂)), g = dy[i] γ, x̂ = (x[i] − μ) r."""
    N = x.shape[1]
    mu, r = mean[i], rstd[i]
    sg = 0.0
    sgx = 0.0
    for j in range(N):
        g = dy[i, j] * gamma[j]
        sg += g
        sgx += g * (x[i, j] - mu) * r
    sg /= N
    sgx /= N
    for j in range(N):
        xhat = (x[i, j] - mu) * r
        dx[i, j] = r * (dy[i, j] * gamma[j] - sg - xhat * sgx)


def layernorm_param_col(x, mean, rstd, dy, dgamma, dbeta, j):
    """dγ[j] = Σ_i dy[i, j] x̂[i, j],  dβ[j] = Σ_i dy[i, j]."""
    sgam = 0.0
    sbet = 0.0
    for i in range(x.shape[0]):
        sgam += dy[i, j] * (x[i, j] - mean[i]) * rstd[i]
        sbet += dy[i, j]
    dgamma[j] = sgam
    dbeta[j] = sbet


# ----------------------------------------------------------------------------- CPU loops
@njit(cache=True, fastmath={"reassoc"})
def _layernorm_kernel(x, gamma, beta, eps, y, mean, rstd):
    """layernorm_row for every row, in x's dtype (float32 sums for float32 data)."""
    N = x.shape[1]
    zero, one, n, eps = x.dtype.type(0), x.dtype.type(1), x.dtype.type(N), x.dtype.type(eps)
    for i in range(x.shape[0]):
        s = zero
        for j in range(N):
            s += x[i, j]
        mu = s / n
        v = zero
        for j in range(N):
            d = x[i, j] - mu
            v += d * d
        r = one / math.sqrt(v / n + eps)
        for j in range(N):
            y[i, j] = (x[i, j] - mu) * r * gamma[j] + beta[j]
        mean[i] = mu
        rstd[i] = r


@njit(cache=True, fastmath={"reassoc"})
def _layernorm_adjoint_kernel(x, mean, rstd, gamma, dy, dx, dgamma, dbeta):
    """layernorm_adjoint_row for every row, in x's dtype; dγ, dβ accumulate over the rows in
    float64, row by row (unit stride), the order of layernorm_param_col's column sums."""
    N = x.shape[1]
    zero, n = x.dtype.type(0), x.dtype.type(N)
    sgamma = np.zeros(N)
    sbeta = np.zeros(N)
    for i in range(x.shape[0]):
        mu, r = mean[i], rstd[i]
        sg = zero
        sgx = zero
        for j in range(N):
            g = dy[i, j] * gamma[j]
            sg += g
            sgx += g * (x[i, j] - mu) * r
        sg /= n
        sgx /= n
        for j in range(N):
            xhat = (x[i, j] - mu) * r
            dx[i, j] = r * (dy[i, j] * gamma[j] - sg - xhat * sgx)
            sgamma[j] += dy[i, j] * xhat
            sbeta[j] += dy[i, j]
    for j in range(N):
        dgamma[j] = sgamma[j]
        dbeta[j] = sbeta[j]


# ----------------------------------------------------------------------------- layer norm
def layernorm(x, gamma, beta, eps: float):
    """(y, mean, rstd) of reference.layernorm: one pass per row in x's dtype, no temporaries."""
    if not fast(x, gamma, beta) or x.ndim == 0 or x.size == 0:
        return reference.layernorm(x, gamma, beta, eps)
    N = x.shape[-1]
    check_vector("gamma", gamma, N)
    check_vector("beta", beta, N)
    dtype = result_dtype(x, gamma, beta)
    x2 = rows(x, dtype)  # R,N
    y = np.empty_like(x2)
    mean = np.empty(x2.shape[0], dtype)
    rstd = np.empty(x2.shape[0], dtype)
    _layernorm_kernel(x2, np.ascontiguousarray(gamma, dtype), np.ascontiguousarray(beta, dtype),
                      float(eps), y, mean, rstd)
    lead = x.shape[:-1]
    return y.reshape(x.shape), mean.reshape(lead), rstd.reshape(lead)


def check_layernorm_adjoint_args(x, mean, rstd, gamma, dy) -> int:
    """Shapes of layernorm_adjoint's arguments (each named when wrong); returns N."""
    N = x.shape[-1]
    check_vector("gamma", gamma, N)
    check_same_shape("dy", dy, "x", x)
    for name, a in (("mean", mean), ("rstd", rstd)):
        if tuple(a.shape) != tuple(x.shape[:-1]):
            raise ValueError(f"`{name}` must have shape {tuple(x.shape[:-1])}, "
                             f"got {tuple(a.shape)}.")
    return N


def layernorm_adjoint(x, mean, rstd, gamma, dy):
    """(dx, dgamma, dbeta) of reference.layernorm_adjoint: one pass per row."""
    if not fast(x, mean, rstd, gamma, dy) or x.ndim == 0 or x.size == 0:
        return reference.layernorm_adjoint(x, mean, rstd, gamma, dy)
    N = check_layernorm_adjoint_args(x, mean, rstd, gamma, dy)
    dtype = result_dtype(x, mean, rstd, gamma, dy)
    x2, dy2 = rows(x, dtype), rows(dy, dtype)
    mean1 = np.ascontiguousarray(mean, dtype).reshape(-1)
    rstd1 = np.ascontiguousarray(rstd, dtype).reshape(-1)
    dx = np.empty_like(x2)
    dgamma, dbeta = np.empty(N, dtype), np.empty(N, dtype)
    _layernorm_adjoint_kernel(x2, mean1, rstd1, np.ascontiguousarray(gamma, dtype), dy2,
                              dx, dgamma, dbeta)
    return dx.reshape(x.shape), dgamma, dbeta
