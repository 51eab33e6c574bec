"""The NumPy reference kernels: the contract every backend implements.

Every function here is written against the array-API namespace of its inputs
(:func:`refbraid.backends.portable.namespace`), so the same code runs on NumPy arrays (the ``numpy``
backend) and on CuPy arrays (the ``cupy`` backend). Only the standard's functions are used
(``xp.sum(x)``, not ``x.sum()``; no ``np.pad`` or ``einsum``), and new arrays are made on
the device of the inputs (:mod:`refbraid.backends.portable`): the tests run these kernels on
array-api-strict arrays on a non-default device (:mod:`refbraid.backends.strict_device`),
which holds the code to exactly that. The fast backends (``numba``,
``cuda``) keep these exact signatures and are tested against these functions.

Shape legend: ``B`` batch, ``K`` input features, ``C`` features/channels,
``H, W`` image height and width, ``O`` output channels.

Adjoint arguments carry a ``d`` prefix (``dz`` = ∂L/∂z); adjoints return fresh arrays,
they never accumulate into their inputs.
"""

from __future__ import annotations

import math

import numpy as np

from .dtypes import dtype_kind
from .portable import arange_on, zeros_on
from .portable import namespace as array_namespace  # the one lookup (array-api-compat)

ACTIVATIONS = ("tanh", "relu", "gelu", "identity")


def _erf(xp, z):
    # erf is not in the array API standard: NumPy uses the vectorised math.erf, CuPy (and
    # the CuPy stand-in's fake cupyx) cupyx.scipy.special, the strict test device its own
    # kernel (strict_device.erf)
    if xp is np:
        return np.vectorize(math.erf, otypes=[z.dtype])(z) if z.size else z.copy()
    if xp.__name__.startswith("array_api_strict"):
        from .strict_device import erf

        return erf(z)
    import cupyx.scipy.special

    return cupyx.scipy.special.erf(z)


def check_activation(act: str) -> None:
    if act not in ACTIVATIONS:
        raise ValueError(f"`activation` must be one of {ACTIVATIONS}, got {act!r}.")


# ----------------------------------------------------------------------------- activations
def activation(z, act: str):
    """σ(z) element-wise; tanh, relu, exact (erf) gelu as ``torch.nn.GELU()``, identity.

    Complex z (the complex-step tangent of refbraid.verify) follows the first-order dual-number
    rule σ(a + ib) := σ(a) + i·b·σ'(a), exact for a complex step and valid for relu and gelu.
    """
    xp = array_namespace(z)
    if dtype_kind(z.dtype) == "c":
        a = xp.real(z)
        return activation(a, act) + 1j * xp.imag(z) * activation_adjoint(a, xp.ones_like(a), act)
    if act == "tanh":
        return xp.tanh(z)
    if act == "relu":
        return xp.maximum(z, 0)
    if act == "gelu":  # z Φ(z), Φ the standard normal CDF
        return 0.5 * z * (1.0 + _erf(xp, z / math.sqrt(2.0)))
    if act == "identity":
        return xp.asarray(z, copy=True)
    check_activation(act)


def activation_adjoint(z, dy, act: str):
    """dz = σ'(z) ⊙ dy; complex z uses the dual-number rule σ'(a + ib) := σ'(a) + i·b·σ''(a)."""
    xp = array_namespace(z)
    if dtype_kind(z.dtype) == "c":
        a = xp.real(z)
        slope = activation_adjoint(a, xp.ones_like(a), act)
        return (slope + 1j * xp.imag(z) * _activation_curvature(a, act)) * dy
    if act == "tanh":
        t = xp.tanh(z)
        return (1.0 - t * t) * dy
    if act == "relu":
        return xp.where(z > 0, dy, xp.zeros_like(dy))
    if act == "gelu":  # d/dz [z Φ(z)] = Φ(z) + z φ(z)
        cdf = 0.5 * (1.0 + _erf(xp, z / math.sqrt(2.0)))
        pdf = xp.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
        return (cdf + z * pdf) * dy
    if act == "identity":
        return array_namespace(dy).asarray(dy, copy=True)
    check_activation(act)


def _activation_curvature(a, act: str):
    """σ''(a) for real a: tanh −2t(1 − t²), gelu φ(a)(2 − a²), relu and identity 0."""
    xp = array_namespace(a)
    if act == "tanh":
        t = xp.tanh(a)
        return -2.0 * t * (1.0 - t * t)
    if act == "gelu":  # d/da [Φ(a) + a φ(a)] = 2φ(a) + a φ'(a) = φ(a)(2 − a²)
        return xp.exp(-0.5 * a * a) / math.sqrt(2.0 * math.pi) * (2.0 - a * a)
    if act in ("relu", "identity"):
        return xp.zeros_like(a)
    check_activation(act)


def euler_act(y, z, h: float, act: str, out=None):
    """Forward-Euler update with activation: y_next = y + h σ(z).

    ``out`` (NumPy arrays): the sum is written there (``numpy.add(y, h σ(z), out=out)``, the
    same additions), and ``out`` returned."""
    if out is None:
        return y + h * activation(z, act)
    return np.add(y, h * activation(z, act), out=out)


# ----------------------------------------------------------------------------- dense
def matmul(a, b):
    """c = a @ b for 2-D a (M, K) and b (K, N) (``xp.matmul``: a CUDA graph recording
    replaces CuPy's, refbraid.backends.cupy_blas; the ``@`` operator would bypass it)."""
    return array_namespace(a).matmul(a, b)


def linear(x, W, b):
    """z = x Wᵀ + b.  x: (B, K), W: (C, K), b: (C,) or None  ->  z: (B, C)."""
    z = array_namespace(x).matmul(x, W.T)
    if b is not None:
        z = z + b
    return z


def linear_adjoint(x, W, dz):
    """Adjoint of z = x Wᵀ + b:  dx = dz W,  dW = dzᵀ x,  db = Σ_B dz."""
    xp = array_namespace(dz)
    return xp.matmul(dz, W), xp.matmul(dz.T, x), xp.sum(dz, axis=0)


# ----------------------------------------------------------------------------- conv
def _pad_hw(x, p: int):
    """x zero-padded by p on both sides of the two spatial axes: (B, C, H + 2p, W + 2p)."""
    B, C, H, Wd = x.shape
    xpad = zeros_on(x, (B, C, H + 2 * p, Wd + 2 * p))
    xpad[:, :, p : p + H, p : p + Wd] = x
    return xpad


def conv2d(x, W, b):
    """'Same' 2-D cross-correlation, stride 1, zero padding k//2 (odd k), as torch Conv2d.

    z[n,o,i,j] = b[o] + Σ_{c,p,q} W[o,c,p,q] · x̃[n,c,i+p,j+q],  x̃ = x zero-padded by k//2.
    x: (B, C, H, W), W: (O, C, k, k), b: (O,) or None  ->  z: (B, O, H, W).
    """
    xp = array_namespace(x)
    k = W.shape[-1]
    H, Wd = x.shape[2], x.shape[3]
    xpad = _pad_hw(x, k // 2)
    z = zeros_on(x, (x.shape[0], W.shape[0], H, Wd))
    for p in range(k):
        for q in range(k):  # Σ_c W[o,c,p,q] x̃[n,c,i+p,j+q]: contract c, then n,h,w,o -> n,o,h,w
            window = xpad[:, :, p : p + H, q : q + Wd]
            z += xp.permute_dims(xp.tensordot(window, W[:, :, p, q], axes=([1], [1])),
                                 (0, 3, 1, 2))
    if b is not None:
        z += b[None, :, None, None]
    return z


def conv2d_adjoint(x, W, dz):
    """Adjoint of conv2d: dx is the transposed convolution of dz, dW correlates dz with x̃.

    dx̃[n,c,i+p,j+q] += Σ_o W[o,c,p,q] dz[n,o,i,j];
    dW[o,c,p,q] = Σ_{n,i,j} dz[n,o,i,j] x̃[n,c,i+p,j+q];  db[o] = Σ_{n,i,j} dz[n,o,i,j].
    Returns (dx, dW, db).
    """
    xp = array_namespace(x)
    k = W.shape[-1]
    r = k // 2
    H, Wd = x.shape[2], x.shape[3]
    xpad = _pad_hw(x, r)
    dxpad = xp.zeros_like(xpad)
    dW = xp.zeros_like(W)
    for p in range(k):
        for q in range(k):
            window = (slice(None), slice(None), slice(p, p + H), slice(q, q + Wd))
            # Σ_o W[o,c,p,q] dz[n,o,i,j]: contract o, then n,h,w,c -> n,c,h,w
            dxpad[window] += xp.permute_dims(
                xp.tensordot(dz, W[:, :, p, q], axes=([1], [0])), (0, 3, 1, 2))
            # Σ_{n,i,j} dz[n,o,i,j] x̃[n,c,i+p,j+q]
            dW[:, :, p, q] = xp.tensordot(dz, xpad[window], axes=([0, 2, 3], [0, 2, 3]))
    dx = xp.asarray(dxpad[:, :, r : r + H, r : r + Wd], copy=True)
    return dx, dW, xp.sum(dz, axis=(0, 2, 3))


# ----------------------------------------------------------------------------- loss
def softmax_cross_entropy(logits, labels):
    """Mean softmax cross-entropy, as torch.nn.functional.cross_entropy.

    L = -(1/B) Σ_b log p[b, y_b],  p = softmax(logits) row-wise.  Returns (L, p).
    """
    xp = array_namespace(logits)
    # shift by the row maximum of the real part, so complex logits (a complex step) work too
    shifted = logits - xp.max(xp.real(logits), axis=1, keepdims=True)
    logsum = xp.log(xp.sum(xp.exp(shifted), axis=1, keepdims=True))
    logp = shifted - logsum
    B = logits.shape[0]
    loss = -xp.mean(logp[arange_on(logits, B), labels])
    return loss, xp.exp(logp)


def softmax_cross_entropy_adjoint(probs, labels, dloss: float = 1.0):
    """dlogits = dloss · (p − onehot(y)) / B."""
    xp = array_namespace(probs)
    B, K = probs.shape
    onehot = xp.astype(labels[:, None] == arange_on(probs, K)[None, :], probs.dtype)  # B,K
    return (probs - onehot) * (dloss / B)


# ----------------------------------------------------------------------------- transformer kernels
# Kernels of the attention, layer-norm, embedding and GRU layers (refbraid.layers.attention,
# layernorm, embedding, gru). Shape legend for this section: G batched matrices (batch·heads),
# R rows (every leading axis flattened), N row length, E model width, V vocabulary size,
# B batch, T tokens, H GRU hidden size.
#
# Complex-step safety (refbraid.verify differentiates these kernels with complex inputs): every
# formula is analytic, and comparisons (the softmax row maximum) look at real parts only.


def bmm(a, b):
    """Batched matrix product c[g] = a[g] @ b[g].  a: (G, M, K), b: (G, K, N) -> c: (G, M, N)."""
    return array_namespace(a).matmul(a, b)


def split_heads(a, B: int, L: int, heads: int, parts: int = 1):
    """The attention's heads of ``parts`` stacked projections, each as a batch of matrices.

    a: (B·L, P·E) rows, the P = ``parts`` blocks of E = heads·d columns side by side (as the
    stacked projection [q | k | v] gives them)  ->  P arrays (B·heads, L, d), block p's head j
    of sample b the matrix [b·heads + j]: out_p[b·heads + j, l, i] = a[b·L + l, p·E + j·d + i].
    """
    xp = array_namespace(a)
    E = a.shape[-1] // parts
    d = E // heads
    return tuple(xp.reshape(xp.permute_dims(xp.reshape(a[:, p * E:(p + 1) * E], (B, L, heads, d)),
                                            (0, 2, 1, 3)), (B * heads, L, d))
                 for p in range(parts))


def merge_heads(blocks, B: int, heads: int):
    """Adjoint (and inverse) of :func:`split_heads`: P arrays (B·heads, L, d) -> (B·L, P·E),
    the heads of each concatenated along the features (as torch does), the blocks side by
    side: out[b·L + l, p·E + j·d + i] = blocks[p][b·heads + j, l, i]."""
    xp = array_namespace(blocks[0])
    merged = []
    for a in blocks:
        _, L, d = a.shape
        merged.append(xp.reshape(xp.permute_dims(xp.reshape(a, (B, heads, L, d)), (0, 2, 1, 3)),
                                 (B * L, heads * d)))
    return merged[0] if len(merged) == 1 else xp.concat(merged, axis=1)


def softmax(x, mask, scale: float = 1.0):
    """Row softmax over the last axis of ``scale``·x, masked entries excluded.

    With z = scale·x: p[..., j] = exp(z_j − m) / Σ_{k unmasked} exp(z_k − m) for unmasked j,
    p = 0 where ``mask`` is True; m = max over unmasked k of Re z_k (any shift gives the same
    p; the maximum avoids overflow). A fully masked row is all zeros, never NaN.
    x: (..., N), mask: None or a bool array of x's shape  ->  p: (..., N).
    """
    xp = array_namespace(x)
    if scale != 1.0:
        x = x * scale
    re = xp.real(x)  # comparisons on the real part (complex-step safe)
    if mask is None:
        e = xp.exp(x - xp.max(re, axis=-1, keepdims=True))
    else:
        m = xp.max(xp.where(mask, -xp.inf, re), axis=-1, keepdims=True)
        m = xp.where(xp.isfinite(m), m, 0.0)  # fully masked row: any finite shift will do
        e = xp.where(mask, 0.0, xp.exp(xp.where(mask, 0.0, x - m)))
    s = xp.sum(e, axis=-1, keepdims=True)
    return e / xp.where(s == 0, 1.0, s)


def softmax_adjoint(p, dp, scale: float = 1.0):
    """Adjoint of p = softmax(x, mask, scale) (masked or not): dx = scale · p ⊙ (dp − Σ_j p_j
    dp_j) row-wise, the product by ``scale`` taken last.

    Masked entries have p = 0, so they get dx = 0. p, dp: (..., N) -> dx: (..., N).
    """
    xp = array_namespace(p)
    dx = p * (dp - xp.sum(p * dp, axis=-1, keepdims=True))
    return dx * scale if scale != 1.0 else dx


def layernorm(x, gamma, beta, eps: float):
    """Layer norm over the last axis, as ``torch.nn.LayerNorm(N, eps)`` (biased variance).

    μ = mean_j x_j,  σ² = mean_j (x_j − μ)²,  r = 1/√(σ² + eps),  y = (x − μ) r γ + β.
    x: (..., N), gamma, beta: (N,)  ->  (y (..., N), mean (...), rstd (...)).
    """
    xp = array_namespace(x)
    mean = xp.mean(x, axis=-1)
    xc = x - mean[..., None]
    rstd = 1.0 / xp.sqrt(xp.mean(xc * xc, axis=-1) + eps)  # xc·xc, not |xc|²: analytic
    return xc * rstd[..., None] * gamma + beta, mean, rstd


def layernorm_adjoint(x, mean, rstd, gamma, dy):
    """Adjoint of layernorm, with x̂ = (x − μ) r and g = dy ⊙ γ:

    dx = r (g − mean_j g − x̂ mean_j(g ⊙ x̂)),  dγ = Σ dy ⊙ x̂,  dβ = Σ dy (sums over all
    leading axes). Returns (dx (..., N), dgamma (N,), dbeta (N,)).
    """
    xp = array_namespace(x)
    xhat = (x - mean[..., None]) * rstd[..., None]
    g = dy * gamma
    dx = rstd[..., None] * (
        g - xp.mean(g, axis=-1, keepdims=True) - xhat * xp.mean(g * xhat, axis=-1, keepdims=True)
    )
    lead = tuple(range(x.ndim - 1))
    return dx, xp.sum(dy * xhat, axis=lead), xp.sum(dy, axis=lead)


def embedding(tokens, W):
    """Row lookup out[..., :] = W[tokens[...], :].  tokens: int (...), W: (V, E) -> (..., E)."""
    xp = array_namespace(W)
    rows = xp.take(W, xp.reshape(tokens, (-1,)), axis=0)  # R,E
    return xp.reshape(rows, (*tokens.shape, W.shape[1]))


def embedding_adjoint(tokens, dout, n_rows: int):
    """dW[v] = Σ_{positions with token v} dout[position], i.e. dW = onehot(tokens)ᵀ dout.

    tokens: int (...), dout: (..., E)  ->  dW: (n_rows, E).
    """
    xp = array_namespace(dout)
    flat = xp.reshape(tokens, (-1,))
    onehot = xp.astype(flat[:, None] == arange_on(dout, n_rows)[None, :], dout.dtype)  # R,V
    return xp.matmul(onehot.T, xp.reshape(dout, (flat.shape[0], -1)))


def _sigmoid(xp, a):
    return 1.0 / (1.0 + xp.exp(-a))


def check_gru(h, *named) -> None:
    """Validate the GRU kernel shapes: h (B, H), each (name, array, width) (B, width·H)."""
    if h.ndim != 2:
        raise ValueError(f"`h` must be 2-D (batch, hidden), got shape {tuple(h.shape)}.")
    B, H = h.shape
    for name, a, k in named:
        if tuple(a.shape) != (B, k * H):
            raise ValueError(f"`{name}` must have shape ({B}, {k * H}), got {tuple(a.shape)}.")


def gru_cell(gx, gh, h, dt: float, implicit: bool):
    """Gate algebra of a GRU step (torch.nn.GRUCell gate order r, z, n), after the matmuls.

    gx = x W_ihᵀ + b_ih and gh = h W_hhᵀ + b_hh, each (B, 3H) laid out [r | z | n]:
        r = σ(gx_r + gh_r),  z = σ(gx_z + gh_z),  n = tanh(gx_n + r ⊙ gh_n)
        classic  (implicit=False): h_new = h + dt (1 − z) ⊙ (n − h)     (GRUCell when dt = 1)
        implicit (implicit=True):  h_new = (h + dt (1 − z) ⊙ n) / (1 + dt (1 − z))
    Returns (h_new (B, H), gates (B, 3H) = [r | z | n]).
    """
    check_gru(h, ("gx", gx, 3), ("gh", gh, 3))
    xp = array_namespace(gx)
    H = h.shape[-1]
    r = _sigmoid(xp, gx[:, :H] + gh[:, :H])
    z = _sigmoid(xp, gx[:, H : 2 * H] + gh[:, H : 2 * H])
    n = xp.tanh(gx[:, 2 * H :] + r * gh[:, 2 * H :])
    q = dt * (1.0 - z)
    h_new = (h + q * n) / (1.0 + q) if implicit else h + q * (n - h)
    return h_new, xp.concat([r, z, n], axis=1)


def gru_cell_adjoint(gates, gh, h, dh_new, dt: float, implicit: bool):
    """Adjoint of gru_cell. With q = dt (1 − z), D = 1 + q and λ = dh_new:

    classic:  ∂h_new/∂h = 1 − q,  ∂h_new/∂n = q,    ∂h_new/∂z = −dt (n − h)
    implicit: ∂h_new/∂h = 1/D,    ∂h_new/∂n = q/D,  ∂h_new/∂z = −dt (n − h)/D²
    dn = λ ∂h_new/∂n,  da_n = dn (1 − n²),  da_z = λ ∂h_new/∂z · z (1 − z),
    da_r = da_n ⊙ gh_n · r (1 − r);  dgx = [da_r | da_z | da_n],  dgh = [da_r | da_z | r ⊙ da_n],
    dh = λ ∂h_new/∂h (the direct part; the layer adds dgh W_hh for the path through the gates).
    Returns (dgx (B, 3H), dgh (B, 3H), dh (B, H)).
    """
    check_gru(h, ("gates", gates, 3), ("gh", gh, 3), ("dh_new", dh_new, 1))
    xp = array_namespace(gates)
    H = h.shape[-1]
    r, z, n = gates[:, :H], gates[:, H : 2 * H], gates[:, 2 * H :]
    q = dt * (1.0 - z)
    if implicit:
        D = 1.0 + q
        dh, dn, dz = dh_new / D, dh_new * q / D, -dt * dh_new * (n - h) / (D * D)
    else:
        dh, dn, dz = dh_new * (1.0 - q), dh_new * q, -dt * dh_new * (n - h)
    da_n = dn * (1.0 - n * n)
    da_z = dz * z * (1.0 - z)
    da_r = da_n * gh[:, 2 * H :] * r * (1.0 - r)
    dgx = xp.concat([da_r, da_z, da_n], axis=1)
    dgh = xp.concat([da_r, da_z, r * da_n], axis=1)
    return dgx, dgh, dh
