"""NumPy reference kernels, part 2: 3-D convolution, 2×2(×2) pooling and batch normalisation.

The same contract as :mod:`refbraid.backends.reference` (array-API code, fresh adjoint
outputs, ``d`` prefixes, complex-step safe: comparisons look at real parts only). The pooling
and batch-norm kernels work on images with any number ``s`` of spatial axes (``s = 2``: NCHW,
``s = 3``: NCDHW); the convolution is 3-D (the 2-D one is ``reference.conv2d``).

Shape legend: ``B`` batch, ``C`` input channels, ``O`` output channels, ``D, H, W`` depth,
height and width, ``S…`` the spatial axes (2 or 3 of them), ``k`` odd kernel size,
``r = k // 2``, ``P = 2^s`` entries of a pooling window.
"""

from __future__ import annotations

from .portable import arange_on, contiguous, zeros_on
from .reference import array_namespace

POOL = 2  # pooling windows are 2 wide along every spatial axis (stride 2, as nn.AvgPool2d(2))


# ----------------------------------------------------------------------------- conv3d
def _zero_pad(x, p: int):
    """x zero-padded by p on both sides of every spatial axis: (B, C, S + 2p …)."""
    xpad = zeros_on(x, (*x.shape[:2], *(n + 2 * p for n in x.shape[2:])))
    xpad[(slice(None), slice(None), *(slice(p, p + n) for n in x.shape[2:]))] = x
    return xpad


def _mix_channels(xp, a, M, axis: int):
    """Σ_c M[…c…] a[n,c,S…] with M's ``axis`` contracted: (B, C, S…) -> (B, O, S…).

    ``axis=1``: M is (O, C), the forward map; ``axis=0``: M is (C, O) read as Mᵀ (adjoint).
    """
    s = a.ndim - 2
    mixed = xp.tensordot(a, M, axes=([1], [axis]))  # B, S…, O
    return xp.permute_dims(mixed, (0, s + 1, *range(1, s + 1)))


def conv3d(x, W, b):
    """'Same' 3-D cross-correlation, stride 1, zero padding k//2 (odd k), as torch Conv3d.

    z[n,o,d,i,j] = b[o] + Σ_{c,p,q,u} W[o,c,p,q,u] · x̃[n,c,d+p,i+q,j+u],  x̃ = x zero-padded.
    x: (B, C, D, H, W), W: (O, C, k, k, k), b: (O,) or None  ->  z: (B, O, D, H, W).
    """
    xp = array_namespace(x)
    k = W.shape[-1]
    D, H, Wd = x.shape[2:]
    xpad = _zero_pad(x, k // 2)
    z = zeros_on(x, (x.shape[0], W.shape[0], D, H, Wd))
    for p in range(k):
        for q in range(k):
            for u in range(k):
                window = xpad[:, :, p : p + D, q : q + H, u : u + Wd]
                z += _mix_channels(xp, window, W[:, :, p, q, u], axis=1)
    if b is not None:
        z += b[None, :, None, None, None]
    return z


def conv3d_adjoint(x, W, dz):
    """Adjoint of conv3d: dx the transposed convolution of dz, dW the correlation of dz with x̃.

    dx̃[n,c,d+p,i+q,j+u] += Σ_o W[o,c,p,q,u] dz[n,o,d,i,j];
    dW[o,c,p,q,u] = Σ_{n,d,i,j} dz[n,o,d,i,j] x̃[n,c,d+p,i+q,j+u];  db[o] = Σ_{n,d,i,j} dz.
    Returns (dx, dW, db).
    """
    xp = array_namespace(x)
    k = W.shape[-1]
    r = k // 2
    D, H, Wd = x.shape[2:]
    xpad = _zero_pad(x, r)
    dxpad = xp.zeros_like(xpad)
    dW = xp.zeros_like(W)
    for p in range(k):
        for q in range(k):
            for u in range(k):
                sl = (slice(None), slice(None), slice(p, p + D), slice(q, q + H), slice(u, u + Wd))
                dxpad[sl] += _mix_channels(xp, dz, W[:, :, p, q, u], axis=0)
                dW[:, :, p, q, u] = xp.tensordot(dz, xpad[sl], axes=([0, 2, 3, 4], [0, 2, 3, 4]))
    dx = dxpad[:, :, r : r + D, r : r + H, r : r + Wd]
    return contiguous(dx), dW, xp.sum(dz, axis=(0, 2, 3, 4))


# ----------------------------------------------------------------------------- stride 2
def _taps(k: int, s: int):
    """Every tap (t₁, …, t_s) of a k^s stencil, row-major."""
    taps = [()]
    for _ in range(s):
        taps = [(*t, a) for t in taps for a in range(k)]
    return taps


def _stride2_window(xpad, tap, out_size):
    """x̃[:, :, 2m + t …] for every output position m: the inputs one tap sees."""
    return xpad[(slice(None), slice(None),
                 *(slice(t, t + 2 * (m - 1) + 1, 2) for t, m in zip(tap, out_size, strict=True)))]


def conv_stride2(x, W, b):
    """Stride-2 cross-correlation with zero padding k//2 (odd k), 2-D or 3-D, as torch
    ``Conv2d/Conv3d(C, O, k, stride=2, padding=k//2)``:

    z[n,o,m…] = b[o] + Σ_{c,t…} W[o,c,t…] · x̃[n,c,2m+t…],  ⌈S/2⌉ outputs per axis.
    x: (B, C, S…), W: (O, C, k…), b: (O,) or None  ->  z: (B, O, ⌈S/2⌉…).
    """
    xp = array_namespace(x)
    k, s = W.shape[-1], x.ndim - 2
    out_size = tuple(-(-n // 2) for n in x.shape[2:])
    xpad = _zero_pad(x, k // 2)
    z = zeros_on(x, (x.shape[0], W.shape[0], *out_size))
    for tap in _taps(k, s):
        z += _mix_channels(xp, _stride2_window(xpad, tap, out_size),
                           W[(slice(None), slice(None), *tap)], axis=1)
    if b is not None:
        z += xp.reshape(b, (1, -1) + (1,) * s)
    return z


def conv_stride2_adjoint(x, W, dz):
    """Adjoint of conv_stride2: dx̃[n,c,2m+t…] += Σ_o W[o,c,t…] dz[n,o,m…];
    dW[o,c,t…] = Σ_{n,m} dz[n,o,m…] x̃[n,c,2m+t…];  db[o] = Σ_{n,m} dz[n,o,m…].
    Returns (dx, dW, db)."""
    xp = array_namespace(x)
    k, s = W.shape[-1], x.ndim - 2
    r = k // 2
    out_size = dz.shape[2:]
    xpad = _zero_pad(x, r)
    dxpad = xp.zeros_like(xpad)
    dW = xp.zeros_like(W)
    for tap in _taps(k, s):
        w_index = (slice(None), slice(None), *tap)
        window = (slice(None), slice(None),
                  *(slice(t, t + 2 * (m - 1) + 1, 2) for t, m in zip(tap, out_size, strict=True)))
        dxpad[window] += _mix_channels(xp, dz, W[w_index], axis=0)
        summed = [0, *range(2, dz.ndim)]  # batch and output positions
        dW[w_index] = xp.tensordot(dz, xpad[window], axes=(summed, summed))  # O,C
    dx = dxpad[(slice(None), slice(None), *(slice(r, r + n) for n in x.shape[2:]))]
    return contiguous(dx), dW, xp.sum(dz, axis=(0, *range(2, dz.ndim)))


# ----------------------------------------------------------------------------- pooling
def pooled_shape(in_shape) -> tuple[int, ...]:
    """(B, C, S…) -> (B, C, ⌊S/2⌋…): a trailing odd row is dropped, as torch's pooling does."""
    return (*in_shape[:2], *(n // POOL for n in in_shape[2:]))


def _windows(xp, x):
    """x (B, C, S…) -> (B, C, ⌊S/2⌋…, P): the 2×…×2 window of every output as its last axis."""
    out = pooled_shape(x.shape)
    s = x.ndim - 2
    crop = x[(slice(None), slice(None), *(slice(0, POOL * m) for m in out[2:]))]
    split = xp.reshape(crop, (*out[:2], *(d for m in out[2:] for d in (m, POOL))))  # B,C,S1,2,S2,2…
    order = (0, 1, *range(2, 2 + 2 * s, 2), *range(3, 3 + 2 * s, 2))
    return xp.reshape(xp.permute_dims(split, order), (*out, POOL**s))


def _unwindows(xp, win, in_shape):
    """Adjoint of _windows: (B, C, ⌊S/2⌋…, P) -> (B, C, S…), zeros in dropped odd rows."""
    out = win.shape[:-1]
    s = len(in_shape) - 2
    split = xp.reshape(win, (*out, *(POOL,) * s))  # B,C,S1,S2…,2,2…
    order = [0, 1]
    for a in range(s):
        order += [2 + a, 2 + s + a]
    crop = xp.reshape(xp.permute_dims(split, tuple(order)),
                      (*out[:2], *(POOL * m for m in out[2:])))
    dx = zeros_on(win, tuple(in_shape))
    dx[(slice(None), slice(None), *(slice(0, POOL * m) for m in out[2:]))] = crop
    return dx


def avgpool(x):
    """2×…×2 average pooling, stride 2, as nn.AvgPool2d(2)/AvgPool3d(2):
    out[n,c,m…] = (1/P) Σ_{window of m} x.   x: (B, C, S…) -> (B, C, ⌊S/2⌋…)."""
    xp = array_namespace(x)
    return xp.mean(_windows(xp, x), axis=-1)


def avgpool_adjoint(dout, in_shape):
    """dx[n,c,i…] = dout[n,c,i//2…] / P inside the kept region, 0 in a dropped odd row."""
    xp = array_namespace(dout)
    P = POOL ** (len(in_shape) - 2)
    win = xp.broadcast_to(dout[..., None] / P, (*dout.shape, P))
    return _unwindows(xp, contiguous(win), in_shape)


def maxpool(x):
    """2×…×2 max pooling, stride 2, as nn.MaxPool2d(2)/MaxPool3d(2).

    out = x at the window's arg-max (of the real part; the first one on ties).
    x: (B, C, S…) -> (out (B, C, ⌊S/2⌋…), index (B, C, ⌊S/2⌋…) int64 in 0..P−1).
    """
    xp = array_namespace(x)
    win = _windows(xp, x)
    index = xp.argmax(xp.real(win), axis=-1)
    return xp.take_along_axis(win, index[..., None], axis=-1)[..., 0], index


def maxpool_adjoint(dout, index, in_shape):
    """dx = dout routed to the arg-max entry of each window, 0 elsewhere."""
    xp = array_namespace(dout)
    P = POOL ** (len(in_shape) - 2)
    win = xp.astype(index[..., None] == arange_on(dout, P), dout.dtype) * dout[..., None]
    return _unwindows(xp, win, in_shape)


# ----------------------------------------------------------------------------- batch norm
def _channel_axes(x) -> tuple[int, ...]:
    return (0, *range(2, x.ndim))


def _per_channel(a, ndim: int):
    """(C,) -> (1, C, 1…) for broadcasting against a (B, C, S…) array."""
    return array_namespace(a).reshape(a, (1, a.shape[0]) + (1,) * (ndim - 2))


def batchnorm_stats(x, eps: float):
    """Batch statistics per channel (biased variance, as nn.BatchNorm2d/3d in training):

    μ_c = mean_{n,S} x[n,c,S],  σ²_c = mean_{n,S} (x − μ_c)²,  r_c = 1/√(σ²_c + eps).
    x: (B, C, S…) -> (mean (C,), rstd (C,)).
    """
    xp = array_namespace(x)
    axes = _channel_axes(x)
    mean = xp.mean(x, axis=axes)
    xc = x - _per_channel(mean, x.ndim)
    return mean, 1.0 / xp.sqrt(xp.mean(xc * xc, axis=axes) + eps)  # xc·xc: analytic


def batchnorm_apply(x, mean, rstd, gamma, beta):
    """y = γ_c (x − μ_c) r_c + β_c, per channel c.  x: (B, C, S…), the rest (C,) -> (B, C, S…)."""
    n = x.ndim
    return ((x - _per_channel(mean, n)) * _per_channel(rstd * gamma, n)
            + _per_channel(beta, n))


def batchnorm_adjoint(x, mean, rstd, gamma, dy, batch_stats: bool):
    """Adjoint of y = γ x̂ + β with x̂ = (x − μ) r, g = dy ⊙ γ, means over (B, S…) per channel:

    batch_stats (training: μ, r are functions of x):  dx = r (g − mean g − x̂ mean(g ⊙ x̂));
    fixed μ, r (evaluation with running statistics):  dx = r g;
    dγ = Σ dy ⊙ x̂,  dβ = Σ dy.   Returns (dx (B, C, S…), dgamma (C,), dbeta (C,)).
    """
    xp = array_namespace(x)
    n, axes = x.ndim, _channel_axes(x)
    xhat = (x - _per_channel(mean, n)) * _per_channel(rstd, n)
    g = dy * _per_channel(gamma, n)
    if batch_stats:
        g = (g - xp.mean(g, axis=axes, keepdims=True)
             - xhat * xp.mean(g * xhat, axis=axes, keepdims=True))
    return g * _per_channel(rstd, n), xp.sum(dy * xhat, axis=axes), xp.sum(dy, axis=axes)
