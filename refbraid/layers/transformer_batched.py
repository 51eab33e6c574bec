"""k encoder steps at once, each with its own weights: MGRIT's batched sweeps of a transformer.

Row j of a batched call is :meth:`refbraid.layers.EncoderStep.forward` (``adjoint``) with the
weights ``params[·][j]`` and step size ``h[j]``, on the stacked states Y (k, B, T, E)::

    X_next[j] = X[j] + h[j] (a[j] + c[j]),   a = SA(LN1 X),  c = MLP(LN2 (X + a))
    dX[j] = λ[j] + du[j] + φ1'ᵀ(g[j] + du[j]),   du = φ2'ᵀ g,   g[j] = h[j] λ[j]

(the sub-layers' formulas: :mod:`refbraid.layers.attention`, ``layernorm``, ``mlp``).

Bit-identical to k per-step calls, by construction:

* every product with a layer's weights is ``matmul`` of the stacks, (k, B·T, n) @ (k, n, m):
  NumPy runs the per-step 2-D GEMM ``x Wᵀ`` (``dz W``, ``dzᵀ x``) once per row, from operands
  of the same layout; the bias is added to the product, the bias gradient is the sum over the
  B·T rows in their order (NumPy's per-step ``sum(axis=0)`` and numba's column-sum loop);
* the attention's products run over k·B·nh matrices instead of B·nh, the same 2-D products;
* softmax, its adjoint and the GELU are row-wise or element-wise kernels: one backend call on
  the stack gives each row the per-step bits (the causal and padding masks are stacked too);
* layer norm: on the reference kernel (NumPy) one call on the stack with γ, β broadcast per
  row (element-wise and last-axis means: the same bits), the per-row dγ, dβ summed over the
  B·T tokens as the kernel sums them; on other backends (numba's fused kernels take one γ)
  one kernel call per row.

The forward's cache is one array ``Z`` (k, W): row j packs layer j's activations (LN means
and reciprocal deviations, the normalised inputs, q, k, v, the attention weights, the merged
heads, X + a, the MLP's pre- and post-GELU rows) so that the layer-parallel propagators can
keep ``(Y[j], Z[j])`` as a layer's cache and hand views of Z back to :func:`adjoint_batched`
(:mod:`refbraid.step_caches`); ``EncoderStep.adjoint`` accepts such a cache (``unpack_row``).

Shape legend: k rows (layers), B batch, T tokens, E width, F MLP width, nh heads, d = E/nh,
R = B·T token rows, G = k·B·nh attention matrices, W the packed cache width per row.
"""

from __future__ import annotations

import numpy as np

from ..backends import reference
from ..backends.portable import asarray_on, contiguous
from .attention import _merge_heads, _split_heads, _t
from .mlp import ACTIVATION


# ----------------------------------------------------------------------------- pieces
def _linear(xp, X, W, b):
    """Z[j] = X[j] W[j]ᵀ + b[j]: X (k, R, n), W (k, m, n), b (k, m) -> (k, R, m)."""
    Z = xp.matmul(X, xp.permute_dims(W, (0, 2, 1)))
    Z += b[:, None, :]
    return Z


def _linear_adjoint(xp, X, W, dZ, grads: bool):
    """(dX, dW, db)[j] = (dZ[j] W[j], dZ[j]ᵀ X[j], Σ_R dZ[j]); dW, db None unless grads."""
    dX = xp.matmul(dZ, W)
    if not grads:
        return dX, None, None
    return dX, xp.matmul(xp.permute_dims(dZ, (0, 2, 1)), X), xp.sum(dZ, axis=1)


def _layernorm(bk, X, gamma, beta, eps: float):
    """LN of every row: X (k, B, T, E), γ, β (k, E) -> (Y, mean (k, B, T), rstd (k, B, T))."""
    if bk.layernorm is reference.layernorm:
        return bk.layernorm(X, gamma[:, None, None, :], beta[:, None, None, :], eps)
    out = [bk.layernorm(X[j], gamma[j], beta[j], eps) for j in range(X.shape[0])]
    return tuple(bk.xp.stack([o[i] for o in out]) for i in range(3))


def _layernorm_adjoint(bk, X, mean, rstd, gamma, dY, grads: bool):
    """(dX, dγ (k, E), dβ (k, E)) of :func:`_layernorm`; dγ, dβ None unless grads."""
    xp = bk.xp
    if bk.layernorm_adjoint is reference.layernorm_adjoint:
        dX, _, _ = bk.layernorm_adjoint(X, mean, rstd, gamma[:, None, None, :], dY)
        if not grads:
            return dX, None, None
        xhat = (X - mean[..., None]) * rstd[..., None]  # as the kernel forms x̂
        return dX, xp.sum(dY * xhat, axis=(1, 2)), xp.sum(dY, axis=(1, 2))
    out = [bk.layernorm_adjoint(X[j], mean[j], rstd[j], gamma[j], dY[j])
           for j in range(X.shape[0])]
    dX = xp.stack([o[0] for o in out])
    if not grads:
        return dX, None, None
    return dX, xp.stack([o[1] for o in out]), xp.stack([o[2] for o in out])


def _stacked_mask(sa, xp, params, k: int, B: int, T: int, like):
    """The (k·B·nh, T, T) attention mask of k rows (causal and/or a stacked key-padding
    mask (k, B, T)), or None."""
    kpm = params.get("key_padding_mask")
    if kpm is not None:
        if tuple(kpm.shape) != (k, B, T):
            raise ValueError(f"stacked `key_padding_mask` must have shape {(k, B, T)}, "
                             f"got {tuple(kpm.shape)}.")
        kpm = xp.reshape(kpm, (k * B, T))
    return sa.mask(xp, k * B, T, T, kpm, like=like)


# ----------------------------------------------------------------------------- the cache
def cache_layout(step, B: int) -> list[tuple[str, tuple[int, ...]]]:
    """The packed cache of one row: (name, per-row shape) in packing order."""
    E, T, F, nh = step.dim, step.seq_len, step.hidden, step.heads
    d, G = E // nh, B * nh
    return [("mean1", (B, T)), ("rstd1", (B, T)), ("l1", (B * T, E)),
            ("q", (G, T, d)), ("k", (G, T, d)), ("v", (G, T, d)), ("p", (G, T, T)),
            ("o2", (B * T, E)), ("u", (B, T, E)), ("mean2", (B, T)), ("rstd2", (B, T)),
            ("l2", (B * T, E)), ("z", (B * T, F)), ("a", (B * T, F))]


def _pack(xp, k: int, parts: dict):
    """One (k, W) array holding ``parts`` (each with k rows) in :func:`cache_layout` order."""
    return xp.concat([xp.reshape(a, (k, -1)) for a in parts.values()], axis=1)


def _unpack(step, Z, k: int | None):
    """The named views of a packed cache: Z (k, W) -> {name: (k, *shape)} (with k), or
    Z (W,) -> {name: shape} (k None)."""
    xp = reference.array_namespace(Z)
    E, T, F, nh = step.dim, step.seq_len, step.hidden, step.heads
    per_sample = T * (4 + 7 * E + 2 * F + nh * T)
    B = Z.shape[-1] // per_sample
    out, at = {}, 0
    for name, shape in cache_layout(step, B):
        n = int(np.prod(shape))
        piece = Z[..., at : at + n]
        out[name] = xp.reshape(piece, shape if k is None else (k, *shape))
        at += n
    if at != Z.shape[-1]:
        raise ValueError(f"a packed encoder cache of width {Z.shape[-1]} does not fit "
                         f"dim={E}, seq_len={T}, hidden={F}, heads={nh}.")
    return out, B


def unpack_row(step, y, z):
    """The per-step cache ``EncoderStep.forward`` returns, from ``(y, Z[j])`` of a batched call."""
    c, B = _unpack(step, z, None)
    T = step.seq_len
    return ((y, c["mean1"], c["rstd1"]),
            (c["l1"], None, c["q"], c["k"], c["v"], c["p"], c["o2"], (B, T, T, B)),
            (c["u"], c["mean2"], c["rstd2"]),
            (c["l2"], c["z"], c["a"], (B, T, step.dim)))


# ----------------------------------------------------------------------------- forward
def forward_batched(step, params, Y, h, bk):
    """k encoder steps (module docstring): Y (k, B, T, E), params stacked (k, ...), h (k,).
    Returns (Y_next (k, B, T, E), Z the packed caches (k, W))."""
    xp = bk.xp
    if getattr(Y, "ndim", None) != 4 or tuple(Y.shape[2:]) != step.state_shape:
        raise ValueError(f"`Y` must have shape (k, batch, {step.seq_len}, {step.dim}), "
                         f"got {getattr(Y, 'shape', type(Y).__name__)}.")
    k, B, T, E = Y.shape
    R, nh = B * T, step.heads
    if len(h) != k:
        raise ValueError(f"`h` must hold one step size per row ({k}), got {len(h)}.")
    sa = step.parts()["sa"]
    hs = asarray_on(Y, h, dtype=Y.dtype)[:, None, None, None]
    l1, mean1, rstd1 = _layernorm(bk, Y, params["ln1.gamma"], params["ln1.beta"], step.eps)
    qkv = xp.reshape(_linear(xp, xp.reshape(l1, (k, R, E)), params["sa.W_in"],
                             params["sa.b_in"]), (k * R, 3 * E))
    q = _split_heads(qkv[:, :E], k * B, T, nh)  # G,T,d
    kk = _split_heads(qkv[:, E : 2 * E], k * B, T, nh)
    v = _split_heads(qkv[:, 2 * E :], k * B, T, nh)
    s = bk.bmm(q, contiguous(_t(kk))) * sa.scale  # G,T,T
    p = bk.softmax(s, _stacked_mask(sa, xp, params, k, B, T, Y))
    o2 = xp.reshape(_merge_heads(bk.bmm(p, v), k * B, nh), (k, R, E))
    a = xp.reshape(_linear(xp, o2, params["sa.W_out"], params["sa.b_out"]), Y.shape)
    u = Y + a
    l2, mean2, rstd2 = _layernorm(bk, u, params["ln2.gamma"], params["ln2.beta"], step.eps)
    l2 = xp.reshape(l2, (k, R, E))
    z = _linear(xp, l2, params["mlp.W1"], params["mlp.b1"])  # k,R,F
    act = bk.activation(z, ACTIVATION)
    c = xp.reshape(_linear(xp, act, params["mlp.W2"], params["mlp.b2"]), Y.shape)
    Y_next = Y + hs * (a + c)
    Z = _pack(xp, k, {"mean1": mean1, "rstd1": rstd1, "l1": l1, "q": q, "k": kk, "v": v,
                      "p": p, "o2": o2, "u": u, "mean2": mean2, "rstd2": rstd2, "l2": l2,
                      "z": z, "a": act})
    return Y_next, Z


# ----------------------------------------------------------------------------- adjoint
def adjoint_batched(step, params, Y, Z, dY_next, h, bk, grads: bool = True):
    """The adjoints of k encoder steps: dY (k, B, T, E) and, with grads, the weight gradients
    stacked (k, ...) keyed as the step's params (else None). Z: :func:`forward_batched`'s."""
    xp = bk.xp
    k, B, T, E = Y.shape
    if tuple(dY_next.shape) != tuple(Y.shape):
        raise ValueError(f"`dY_next` must have shape {tuple(Y.shape)}, "
                         f"got {tuple(dY_next.shape)}.")
    R, nh = B * T, step.heads
    c, _ = _unpack(step, Z, k)
    scale = step.parts()["sa"].scale
    hs = asarray_on(Y, h, dtype=dY_next.dtype)[:, None, None, None]
    g = hs * dY_next
    # MLP: dl2 = φ2'ᵀ g (before LN2)
    da, dW2, db2 = _linear_adjoint(xp, c["a"], params["mlp.W2"], xp.reshape(g, (k, R, E)),
                                   grads)
    dz = bk.activation_adjoint(c["z"], da, ACTIVATION)
    dl2, dW1, db1 = _linear_adjoint(xp, c["l2"], params["mlp.W1"], dz, grads)
    du, dg2, dbe2 = _layernorm_adjoint(bk, c["u"], c["mean2"], c["rstd2"], params["ln2.gamma"],
                                       xp.reshape(dl2, Y.shape), grads)
    # self-attention with dout = g + du
    q, kk, v, p = (xp.reshape(c[n], (k * B * nh, *c[n].shape[2:])) for n in "qkvp")
    do2, dW_out, db_out = _linear_adjoint(xp, c["o2"], params["sa.W_out"],
                                          xp.reshape(g + du, (k, R, E)), grads)
    do = _split_heads(xp.reshape(do2, (k * R, E)), k * B, T, nh)  # G,T,d
    dp = bk.bmm(do, contiguous(_t(v)))
    ds = bk.softmax_adjoint(p, dp) * scale
    dq2 = _merge_heads(bk.bmm(ds, kk), k * B, nh)  # kR,E
    dv2 = _merge_heads(bk.bmm(contiguous(_t(p)), do), k * B, nh)
    dk2 = _merge_heads(bk.bmm(contiguous(_t(ds)), q), k * B, nh)
    dqkv = xp.reshape(xp.concat([dq2, dk2, dv2], axis=1), (k, R, 3 * E))
    dl1, dW_in, db_in = _linear_adjoint(xp, c["l1"], params["sa.W_in"], dqkv, grads)
    dx, dg1, dbe1 = _layernorm_adjoint(bk, Y, c["mean1"], c["rstd1"], params["ln1.gamma"],
                                       xp.reshape(dl1, Y.shape), grads)
    dY = dY_next + du + dx
    if not grads:
        return dY, None
    return dY, {"ln1.gamma": dg1, "ln1.beta": dbe1, "sa.W_in": dW_in, "sa.b_in": db_in,
                "sa.W_out": dW_out, "sa.b_out": db_out, "ln2.gamma": dg2, "ln2.beta": dbe2,
                "mlp.W1": dW1, "mlp.b1": db1, "mlp.W2": dW2, "mlp.b2": db2}
