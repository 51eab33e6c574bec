"""Numba CUDA kernels (backend ``"cuda"``), part 7: batch normalisation over (batch, space).

Same signatures and semantics as ``batchnorm_stats``, ``batchnorm_apply`` and
``batchnorm_adjoint`` in :mod:`refbraid.backends.reference_spatial`; host or device arrays in,
NumPy arrays out, as in :mod:`refbraid.backends.numba_cuda`. The batch is read as (B, C, L),
L = |S| positions; n = B·L values per channel. No atomics::

    _stats_kernel       μ_c, r_c (two passes over channel c)       one thread per channel
    _sums_kernel        Σ dy, Σ dy x̂ over channel c               one thread per channel
    _apply_kernel       y = (x − μ_c) r_c γ_c + β_c                  one thread per element
    _dx_kernel          dx = r (γ dy − γ Σdy/n − x̂ γ Σdy x̂/n)       one thread per element
                        (the two means only with batch statistics)

A channel's sums run in one thread, in float64 (fine for the simulator's sizes and for the
channel counts of the layers; a GPU-sized batch would want a block reduction per channel).
"""

from __future__ import annotations

import numpy as np

from . import reference_spatial
from .numba_cuda import THREADS, blocks, common_dtype, cuda, cuda_floats, cuda_jit, to_device

OVERRIDES = ("batchnorm_stats", "batchnorm_apply", "batchnorm_adjoint") if cuda is not None \
    else ()


@cuda_jit
def _stats_kernel(x, eps, mean, rstd):
    c = cuda.grid(1)
    if c < x.shape[1]:
        B, L = x.shape[0], x.shape[2]
        s = 0.0
        for b in range(B):
            for t in range(L):
                s += x[b, c, t]
        m = s / (B * L)
        q = 0.0
        for b in range(B):
            for t in range(L):
                d = x[b, c, t] - m
                q += d * d
        mean[c] = m
        rstd[c] = 1.0 / (q / (B * L) + eps) ** 0.5


@cuda_jit
def _apply_kernel(x, mean, rstd, gamma, beta, y):
    idx = cuda.grid(1)
    if idx < x.size:
        _, C, L = x.shape
        c = (idx // L) % C
        b = idx // (L * C)
        t = idx % L
        y[b, c, t] = (x[b, c, t] - mean[c]) * (rstd[c] * gamma[c]) + beta[c]


@cuda_jit
def _sums_kernel(x, mean, rstd, dy, dgamma, dbeta):
    c = cuda.grid(1)
    if c < x.shape[1]:
        s_dy = 0.0
        s_dyx = 0.0
        for b in range(x.shape[0]):
            for t in range(x.shape[2]):
                s_dy += dy[b, c, t]
                s_dyx += dy[b, c, t] * (x[b, c, t] - mean[c]) * rstd[c]
        dgamma[c] = s_dyx
        dbeta[c] = s_dy


@cuda_jit
def _dx_kernel(x, mean, rstd, gamma, dy, sum_dy, sum_dyx, batch_stats, dx):
    idx = cuda.grid(1)
    if idx < x.size:
        B, C, L = x.shape
        c = (idx // L) % C
        b = idx // (L * C)
        t = idx % L
        r, g = rstd[c], gamma[c]
        v = g * dy[b, c, t]
        if batch_stats:
            n = B * L
            xhat = (x[b, c, t] - mean[c]) * r
            v -= g * sum_dy[c] / n + xhat * g * sum_dyx[c] / n
        dx[b, c, t] = r * v


def _flat(a, dtype):
    """A (B, C, L) device array of ``a`` (B, C, S…)."""
    return to_device(a, dtype).reshape((a.shape[0], a.shape[1], int(np.prod(a.shape[2:]))))


def batchnorm_stats(x, eps: float):
    """(mean, rstd) per channel (reference_spatial.batchnorm_stats), a thread per channel."""
    if not cuda_floats(x):
        return reference_spatial.batchnorm_stats(x, eps)
    C = x.shape[1]
    mean = cuda.device_array(C, dtype=np.float64)
    rstd = cuda.device_array(C, dtype=np.float64)
    _stats_kernel[blocks(C), THREADS](_flat(x, x.dtype), float(eps), mean, rstd)
    return mean.copy_to_host().astype(x.dtype), rstd.copy_to_host().astype(x.dtype)


def batchnorm_apply(x, mean, rstd, gamma, beta):
    """y = (x − μ) r γ + β (reference_spatial.batchnorm_apply), a thread per element."""
    if not cuda_floats(x, mean, rstd, gamma, beta):
        return reference_spatial.batchnorm_apply(x, mean, rstd, gamma, beta)
    dtype = common_dtype(x, mean, rstd, gamma, beta)
    xd = _flat(x, dtype)
    y = cuda.device_array(xd.shape, dtype=dtype)
    _apply_kernel[blocks(xd.size), THREADS](xd, *(to_device(a, dtype) for a in
                                                  (mean, rstd, gamma, beta)), y)
    return y.copy_to_host().reshape(tuple(x.shape))


def batchnorm_adjoint(x, mean, rstd, gamma, dy, batch_stats: bool):
    """(dx, dγ, dβ) (reference_spatial.batchnorm_adjoint): channel sums, then dx per element."""
    if not cuda_floats(x, mean, rstd, gamma, dy):
        return reference_spatial.batchnorm_adjoint(x, mean, rstd, gamma, dy, batch_stats)
    if tuple(dy.shape) != tuple(x.shape):
        raise ValueError(f"`dy` must have the shape of `x` {tuple(x.shape)}, got "
                         f"{tuple(dy.shape)}.")
    dtype = common_dtype(x, mean, rstd, gamma, dy)
    xd, dyd = _flat(x, dtype), _flat(dy, dtype)
    md, rd, gd = (to_device(a, dtype) for a in (mean, rstd, gamma))
    C = x.shape[1]
    dgamma = cuda.device_array(C, dtype=np.float64)
    dbeta = cuda.device_array(C, dtype=np.float64)
    _sums_kernel[blocks(C), THREADS](xd, md, rd, dyd, dgamma, dbeta)
    dx = cuda.device_array(xd.shape, dtype=dtype)
    _dx_kernel[blocks(xd.size), THREADS](xd, md, rd, gd, dyd, dbeta, dgamma, bool(batch_stats),
                                         dx)
    return (dx.copy_to_host().reshape(tuple(x.shape)), dgamma.copy_to_host().astype(dtype),
            dbeta.copy_to_host().astype(dtype))
