"""Numba CPU kernels (backend ``"numba"``), part 8: batch normalisation over (batch, space).

Same signatures and semantics as ``batchnorm_stats``, ``batchnorm_apply`` and
``batchnorm_adjoint`` in :mod:`refbraid.backends.reference_spatial`. What changes: the image
batch is read as (B, C, L) with L = |S| spatial positions, and each channel's sums are one
pass over its B·L values, accumulated in float64 (the reference makes broadcast temporaries)::

    batchnorm_stats    μ_c = Σ x / n,  σ²_c = Σ (x − μ_c)² / n  (two passes),  r_c = 1/√(σ²_c + eps)
    batchnorm_apply    y = (x − μ_c) (r_c γ_c) + β_c
    batchnorm_adjoint  S1 = Σ g, S2 = Σ g x̂ (g = γ dy);  dx = r (g − S1/n − x̂ S2/n) (batch stats)
                       or dx = r g (fixed stats);  dγ = Σ dy x̂,  dβ = Σ dy

n = B·L values per channel. Results are cast to the array dtype (float32 stays float32).
Complex inputs (the harness's complex step) go to the reference.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import reference_spatial
from .numba_cpu import common_dtype, native_floats

OVERRIDES = ("batchnorm_stats", "batchnorm_apply", "batchnorm_adjoint")


@njit(cache=True)
def _stats(x, eps, mean, rstd):
    B, C, L = x.shape
    n = B * L
    for c in range(C):
        s = 0.0
        for b in range(B):
            for t in range(L):
                s += x[b, c, t]
        m = s / n
        q = 0.0
        for b in range(B):
            for t in range(L):
                d = x[b, c, t] - m
                q += d * d
        mean[c] = m
        rstd[c] = 1.0 / np.sqrt(q / n + eps)


@njit(cache=True)
def _apply(x, mean, scale, beta, y):
    B, C, L = x.shape
    for b in range(B):
        for c in range(C):
            m, s, o = mean[c], scale[c], beta[c]
            for t in range(L):
                y[b, c, t] = (x[b, c, t] - m) * s + o


@njit(cache=True)
def _adjoint(x, mean, rstd, gamma, dy, batch_stats, dx, dgamma, dbeta):
    B, C, L = x.shape
    n = B * L
    for c in range(C):
        m, r, g = mean[c], rstd[c], gamma[c]
        s_dy = 0.0
        s_dyx = 0.0
        for b in range(B):
            for t in range(L):
                s_dy += dy[b, c, t]
                s_dyx += dy[b, c, t] * (x[b, c, t] - m) * r
        dgamma[c] = s_dyx
        dbeta[c] = s_dy
        mean_g = g * s_dy / n if batch_stats else 0.0
        mean_gx = g * s_dyx / n if batch_stats else 0.0
        for b in range(B):
            for t in range(L):
                xhat = (x[b, c, t] - m) * r
                dx[b, c, t] = r * (g * dy[b, c, t] - mean_g - xhat * mean_gx)


def _flat(a, dtype):
    return np.ascontiguousarray(a, dtype).reshape(a.shape[0], a.shape[1], -1)  # B,C,L


def _check(x, *channel_arrays) -> None:
    if x.ndim < 3:
        raise ValueError(f"`x` must be (batch, channels, spatial…), got shape {x.shape}.")
    for name, a in channel_arrays:
        if a.shape != (x.shape[1],):
            raise ValueError(f"`{name}` must have shape ({x.shape[1]},), got {a.shape}.")


def batchnorm_stats(x, eps: float):
    """(mean, rstd) per channel (reference_spatial.batchnorm_stats), one pass per sum."""
    if not native_floats(x):
        return reference_spatial.batchnorm_stats(x, eps)
    _check(x)
    mean, rstd = np.empty(x.shape[1]), np.empty(x.shape[1])
    _stats(_flat(x, x.dtype), float(eps), mean, rstd)
    return mean.astype(x.dtype), rstd.astype(x.dtype)


def batchnorm_apply(x, mean, rstd, gamma, beta):
    """y = (x − μ) r γ + β (reference_spatial.batchnorm_apply), one pass."""
    if not native_floats(x, mean, rstd, gamma, beta):
        return reference_spatial.batchnorm_apply(x, mean, rstd, gamma, beta)
    _check(x, ("mean", mean), ("rstd", rstd), ("gamma", gamma), ("beta", beta))
    dtype = common_dtype(x, mean, rstd, gamma, beta)
    y = np.empty(x.shape, dtype)
    scale = (rstd * gamma).astype(dtype)
    _apply(_flat(x, dtype), mean.astype(dtype), scale, beta.astype(dtype),
           y.reshape(x.shape[0], x.shape[1], -1))
    return y


def batchnorm_adjoint(x, mean, rstd, gamma, dy, batch_stats: bool):
    """(dx, dγ, dβ) (reference_spatial.batchnorm_adjoint), two passes per channel."""
    if not native_floats(x, mean, rstd, gamma, dy):
        return reference_spatial.batchnorm_adjoint(x, mean, rstd, gamma, dy, batch_stats)
    _check(x, ("mean", mean), ("rstd", rstd), ("gamma", gamma))
    if dy.shape != x.shape:
        raise ValueError(f"`dy` must have the shape of `x` {x.shape}, got {dy.shape}.")
    dtype = common_dtype(x, mean, rstd, gamma, dy)
    dx = np.empty(x.shape, dtype)
    dgamma, dbeta = np.empty(x.shape[1]), np.empty(x.shape[1])
    _adjoint(_flat(x, dtype), mean.astype(np.float64), rstd.astype(np.float64),
             gamma.astype(np.float64), _flat(dy, dtype), bool(batch_stats),
             dx.reshape(x.shape[0], x.shape[1], -1), dgamma, dbeta)
    return dx, dgamma.astype(dtype), dbeta.astype(dtype)
