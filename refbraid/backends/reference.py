"""The NumPy reference kernels: the contract every backend implements.

Every function here is written against the array-API namespace of its inputs
(``x.__array_namespace__()``), so the same code runs on NumPy arrays (the ``numpy``
backend) and on CuPy arrays (the ``cupy`` backend). The fast backends (``numba``,
``cuda``) keep these exact signatures and are tested against these functions.

Shape legend: ``B`` batch, ``K`` input features, ``C`` features/channels,
``H, W`` image height and width, ``O`` output channels.

Adjoint arguments carry a ``d`` prefix (``dz`` = ∂L/∂z); adjoints return fresh arrays,
they never accumulate into their inputs.
"""

from __future__ import annotations

import math

import numpy as np

ACTIVATIONS = ("tanh", "relu", "gelu", "identity")


def array_namespace(*arrays):
    """The array module (numpy or cupy) the arrays belong to."""
    for a in arrays:
        if hasattr(a, "__array_namespace__"):
            return a.__array_namespace__()
    return np


def _erf(xp, z):
    # numpy has no erf; use the vectorised math.erf there, cupyx.scipy.special elsewhere.
    if xp is np:
        return np.vectorize(math.erf, otypes=[z.dtype])(z) if z.size else z.copy()
    import cupyx.scipy.special  # pragma: no cover - needs a GPU

    return cupyx.scipy.special.erf(z)  # pragma: no cover


def check_activation(act: str) -> None:
    if act not in ACTIVATIONS:
        raise ValueError(f"`activation` must be one of {ACTIVATIONS}, got {act!r}.")


# ----------------------------------------------------------------------------- activations
def activation(z, act: str):
    """σ(z) element-wise; tanh, relu, exact (erf) gelu as ``torch.nn.GELU()``, identity."""
    xp = array_namespace(z)
    if act == "tanh":
        return xp.tanh(z)
    if act == "relu":
        return xp.maximum(z, 0)
    if act == "gelu":  # z Φ(z), Φ the standard normal CDF
        return 0.5 * z * (1.0 + _erf(xp, z / math.sqrt(2.0)))
    if act == "identity":
        return z.copy()
    check_activation(act)


def activation_adjoint(z, dy, act: str):
    """dz = σ'(z) ⊙ dy."""
    xp = array_namespace(z)
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
        return dy.copy()
    check_activation(act)


def euler_act(y, z, h: float, act: str):
    """Forward-Euler update with activation: y_next = y + h σ(z)."""
    return y + h * activation(z, act)


# ----------------------------------------------------------------------------- dense
def matmul(a, b):
    """c = a @ b for 2-D a (M, K) and b (K, N)."""
    return a @ b


def linear(x, W, b):
    """z = x Wᵀ + b.  x: (B, K), W: (C, K), b: (C,) or None  ->  z: (B, C)."""
    z = x @ W.T
    if b is not None:
        z = z + b
    return z


def linear_adjoint(x, W, dz):
    """Adjoint of z = x Wᵀ + b:  dx = dz W,  dW = dzᵀ x,  db = Σ_B dz."""
    return dz @ W, dz.T @ x, dz.sum(axis=0)


# ----------------------------------------------------------------------------- conv
def _pad_hw(xp, x, p: int):
    return xp.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))


def conv2d(x, W, b):
    """'Same' 2-D cross-correlation, stride 1, zero padding k//2 (odd k), as torch Conv2d.

    z[n,o,i,j] = b[o] + Σ_{c,p,q} W[o,c,p,q] · x̃[n,c,i+p,j+q],  x̃ = x zero-padded by k//2.
    x: (B, C, H, W), W: (O, C, k, k), b: (O,) or None  ->  z: (B, O, H, W).
    """
    xp = array_namespace(x)
    k = W.shape[-1]
    H, Wd = x.shape[2], x.shape[3]
    xpad = _pad_hw(xp, x, k // 2)
    z = xp.zeros((x.shape[0], W.shape[0], H, Wd), dtype=x.dtype)
    for p in range(k):
        for q in range(k):
            z += xp.einsum("oc,nchw->nohw", W[:, :, p, q], xpad[:, :, p : p + H, q : q + Wd])
    if b is not None:
        z += b[None, :, None, None]
    return z


def conv2d_adjoint(x, W, dz):
    """Adjoint of conv2d: dx is the transposed convolution of dz, dW correlates dz with x̃.

    dx̃[n,c,i+p,j+q] += Σ_o W[o,c,p,q] dz[n,o,i,j];  dW[o,c,p,q] = Σ_{n,i,j} dz[n,o,i,j] x̃[n,c,i+p,j+q];
    db[o] = Σ_{n,i,j} dz[n,o,i,j].  Returns (dx, dW, db).
    """
    xp = array_namespace(x)
    k = W.shape[-1]
    r = k // 2
    H, Wd = x.shape[2], x.shape[3]
    xpad = _pad_hw(xp, x, r)
    dxpad = xp.zeros_like(xpad)
    dW = xp.zeros_like(W)
    for p in range(k):
        for q in range(k):
            dxpad[:, :, p : p + H, q : q + Wd] += xp.einsum("oc,nohw->nchw", W[:, :, p, q], dz)
            dW[:, :, p, q] = xp.einsum("nohw,nchw->oc", dz, xpad[:, :, p : p + H, q : q + Wd])
    dx = dxpad[:, :, r : r + H, r : r + Wd]
    return xp.ascontiguousarray(dx), dW, dz.sum(axis=(0, 2, 3))


# ----------------------------------------------------------------------------- loss
def softmax_cross_entropy(logits, labels):
    """Mean softmax cross-entropy, as torch.nn.functional.cross_entropy.

    L = -(1/B) Σ_b log p[b, y_b],  p = softmax(logits) row-wise.  Returns (L, p).
    """
    xp = array_namespace(logits)
    shifted = logits - logits.max(axis=1, keepdims=True)
    logsum = xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
    logp = shifted - logsum
    B = logits.shape[0]
    loss = -logp[xp.arange(B), labels].mean()
    return loss, xp.exp(logp)


def softmax_cross_entropy_adjoint(probs, labels, dloss: float = 1.0):
    """dlogits = dloss · (p − onehot(y)) / B."""
    xp = array_namespace(probs)
    B = probs.shape[0]
    dlogits = probs.copy()
    dlogits[xp.arange(B), labels] -= 1.0
    return dlogits * (dloss / B)
