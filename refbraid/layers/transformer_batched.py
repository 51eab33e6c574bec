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

The forward's cache ``Z`` is an object array (k,) of :class:`CacheRow` handles: row j names
the call's stacked activations (LN means and reciprocal deviations, the normalised inputs,
q, k, v, the attention weights, the merged heads, X + a, the MLP's pre- and post-GELU rows)
and j, with no copy. So the layer-parallel propagators can keep ``(Y[j], Z[j])`` as a layer's
cache (``EncoderStep.adjoint`` takes it: :func:`unpack_row`, views) and hand rows of Z back to
:func:`adjoint_batched` (:mod:`refbraid.step_caches`), which reads evenly spaced rows of one
call as views of its stacks and stacks any other rows.

Shape legend: k rows (layers), B batch, T tokens, E width, F MLP width, nh heads, d = E/nh,
R = B·T token rows, G = k·B·nh attention matrices.
"""

from __future__ import annotations

import numpy as np

from ..backends import reference
from ..backends.device_batching import chunk_rows, transposed_once, values_on
from ..backends.portable import contiguous
from ..indexing import signed_even_slice
from .attention import _t
from .mlp import ACTIVATION

#: Token rows (k·B·T) per stacked call. One call for a whole sweep was up to 2× slower than
#: per-step calls at B·T = 128 (its (k, B, T, ·) temporaries leave the cache); chunks of
#: 128–512 token rows were fastest at B·T = 16–128 (docs/batched.md, "Transformer blocks").
TOKEN_ROWS_PER_CALL = 256
#: Fewer layers per call than this (B·T > 64 tokens per layer) did not pay: a stack of 2
#: layers at B·T = 128 ran 0.5–0.85× per-step speed; those rows go through the per-step calls.
MIN_LAYERS_PER_CALL = 4


# ----------------------------------------------------------------------------- pieces
def _linear(xp, X, W, b):
    """Z[j] = X[j] W[j]ᵀ + b[j]: X (k, R, n), W (k, m, n), b (k, m) -> (k, R, m)
    (on a GPU Wᵀ copied once per gradient: device_batching.transposed_once)."""
    Z = xp.matmul(X, transposed_once(W))
    Z += b[:, None, :]
    return Z


def _linear_adjoint(xp, X, W, dZ, grads: bool):
    """(dX, dW, db)[j] = (dZ[j] W[j], dZ[j]ᵀ X[j], Σ_R dZ[j]); dW, db None unless grads."""
    dX = xp.matmul(dZ, W)
    if not grads:
        return dX, None, None
    return dX, xp.matmul(xp.permute_dims(dZ, (0, 2, 1)), X), xp.sum(dZ, axis=1)


def _layernorm(bk, X, gamma, beta, eps: float):
    """LN of every row: X (k, B, T, E), γ, β (k, E) -> (Y, mean (k, B, T), rstd (k, B, T)).
    One call with γ, β broadcast per layer where the backend's kernel takes that (the
    reference; ``takes_row_groups``: cupy's one-launch kernel), else one call per layer."""
    if bk.layernorm is reference.layernorm or getattr(bk.layernorm, "takes_row_groups", False):
        return bk.layernorm(X, gamma[:, None, None, :], beta[:, None, None, :], eps)
    out = [bk.layernorm(X[j], gamma[j], beta[j], eps) for j in range(X.shape[0])]
    return tuple(bk.xp.stack([o[i] for o in out]) for i in range(3))


def _layernorm_adjoint(bk, X, mean, rstd, gamma, dY, grads: bool):
    """(dX, dγ (k, E), dβ (k, E)) of :func:`_layernorm`; dγ, dβ None unless grads. A
    backend kernel's ``per_layer`` (cupy's) does it all in one call."""
    xp = bk.xp
    per_layer = getattr(bk.layernorm_adjoint, "per_layer", None)
    if per_layer is not None:
        return per_layer(X, mean, rstd, gamma[:, None, None, :], dY, grads)
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


def _gelu(bk, z):
    """GELU of a stack (k, R, F). The reference kernel (NumPy: ``math.erf`` element by element
    through ``np.vectorize``) is called per row: on the whole stack its object temporaries
    made it 1.5–2× slower per element (measured here); element-wise either way, same bits."""
    if bk.activation is not reference.activation:
        return bk.activation(z, ACTIVATION)
    out = bk.xp.empty_like(z)
    for j in range(z.shape[0]):
        out[j, ...] = bk.activation(z[j, ...], ACTIVATION)
    return out


def _gelu_adjoint(bk, z, dy):
    """gelu'(z) ⊙ dy of a stack, per row on the reference kernel (as :func:`_gelu`)."""
    if bk.activation_adjoint is not reference.activation_adjoint:
        return bk.activation_adjoint(z, dy, ACTIVATION)
    out = bk.xp.empty_like(dy)
    for j in range(z.shape[0]):
        out[j, ...] = bk.activation_adjoint(z[j, ...], dy[j, ...], ACTIVATION)
    return out


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
class CacheRow:
    """Row j of a batched call's caches: the call's stacked activations (shared) and j."""

    __slots__ = ("stacks", "j")

    def __init__(self, stacks: dict, j: int):
        self.stacks, self.j = stacks, j


def _row_handles(stacks: dict, k: int):
    """Z: an object array (k,) of :class:`CacheRow` (no copy of the activations)."""
    Z = np.empty(k, dtype=object)
    for j in range(k):
        Z[j] = CacheRow(stacks, j)
    return Z


def _gather(xp, Z) -> dict:
    """The stacks (k, ...) of the rows Z (an object array of :class:`CacheRow`): views when
    all rows are evenly spaced rows of one call, else the rows stacked (a copy)."""
    rows = list(np.reshape(Z, (-1,)))
    first = rows[0].stacks
    if all(r.stacks is first for r in rows):
        at = signed_even_slice([r.j for r in rows])
        if at is not None:
            return {n: a[at, ...] for n, a in first.items()}
    return {n: xp.stack([r.stacks[n][r.j, ...] for r in rows]) for n in first}


def unpack_row(step, y, row: CacheRow):
    """The per-step cache ``EncoderStep.forward`` returns, from ``(Y[j], Z[j])`` of a batched
    call (views of its stacks)."""
    c = {n: a[row.j, ...] for n, a in row.stacks.items()}
    B, T = c["u"].shape[0], step.seq_len
    return ((y, c["mean1"], c["rstd1"]),
            (c["l1"], None, c["q"], c["k"], c["v"], c["p"], c["o2"], (B, T, T, B)),
            (c["u"], c["mean2"], c["rstd2"]),
            (c["l2"], c["z"], c["a"], (B, T, step.dim)))


# ----------------------------------------------------------------------------- forward
def rows_per_call(B: int, T: int) -> int:
    """Layers per stacked call: as many as keep k·B·T ≤ :data:`TOKEN_ROWS_PER_CALL`, when that
    is at least :data:`MIN_LAYERS_PER_CALL`; else 1 (the per-step call, row by row)."""
    k = TOKEN_ROWS_PER_CALL // (B * T)
    return k if k >= MIN_LAYERS_PER_CALL else 1


def batched_pays(B: int, T: int) -> bool:
    """Whether stacked calls paid for B samples of T tokens (measured: B·T ≤ 64)."""
    return rows_per_call(B, T) > 1


def _chunks(k: int, size: int):
    return [slice(a, min(a + size, k)) for a in range(0, k, size)]


def _rows_of(params: dict, at, k: int | None = None) -> dict:
    """The stacked params of rows ``at`` — the stacks themselves when ``at`` is all ``k``
    rows (the same arrays, so what is kept per array, as device_batching.transposed_once's
    copies, is found again)."""
    if k is not None and isinstance(at, slice) and at.indices(k) == (0, k, 1):
        return params
    return {n: v[at, ...] for n, v in params.items()}


def forward_batched(step, params, Y, h, bk):
    """k encoder steps (module docstring): Y (k, B, T, E), params stacked (k, ...), h (k,),
    in chunks of :func:`rows_per_call` layers. Returns (Y_next (k, B, T, E), Z the cache
    handles (k,), module docstring)."""
    if getattr(Y, "ndim", None) != 4 or tuple(Y.shape[2:]) != step.state_shape:
        raise ValueError(f"`Y` must have shape (k, batch, {step.seq_len}, {step.dim}), "
                         f"got {getattr(Y, 'shape', type(Y).__name__)}.")
    k, B, T, _ = Y.shape
    h = np.asarray(h, dtype=np.float64).reshape(-1)
    if len(h) != k:
        raise ValueError(f"`h` must hold one step size per row ({k}), got {len(h)}.")
    parts = [_forward_rows(step, _rows_of(params, at, k), Y[at, ...], h[at], bk)
             for at in _chunks(k, chunk_rows(bk, rows_per_call(B, T), k))]
    if len(parts) == 1:
        return parts[0]
    return bk.xp.concat([p[0] for p in parts], axis=0), np.concatenate([p[1] for p in parts])


def _forward_rows(step, params, Y, h, bk):
    """:func:`forward_batched` of one chunk, one stacked call per product (one row: the
    per-step call, its cache seen as one-row stacks)."""
    xp = bk.xp
    if Y.shape[0] == 1:
        y_next, (c_ln1, c_sa, c_ln2, c_mlp) = step.forward(_rows_of(params, 0), Y[0, ...],
                                                           float(h[0]), bk)
        cache = {"mean1": c_ln1[1], "rstd1": c_ln1[2], "l1": c_sa[0], "q": c_sa[2],
                 "k": c_sa[3], "v": c_sa[4], "p": c_sa[5], "o2": c_sa[6], "u": c_ln2[0],
                 "mean2": c_ln2[1], "rstd2": c_ln2[2], "l2": c_mlp[0], "z": c_mlp[1],
                 "a": c_mlp[2]}
        return y_next[None, ...], _row_handles({n: a[None, ...] for n, a in cache.items()}, 1)
    k, B, T, E = Y.shape
    R, nh = B * T, step.heads
    sa = step.parts()["sa"]
    hs = values_on(Y, h, Y.dtype)[:, None, None, None]  # copied once per content
    l1, mean1, rstd1 = _layernorm(bk, Y, params["ln1.gamma"], params["ln1.beta"], step.eps)
    qkv = xp.reshape(_linear(xp, xp.reshape(l1, (k, R, E)), params["sa.W_in"],
                             params["sa.b_in"]), (k * R, 3 * E))
    q, kk, v = bk.split_heads(qkv, k * B, T, nh, 3)  # G,T,d each
    s = bk.bmm(q, contiguous(_t(kk)))  # G,T,T: q kᵀ, scaled by 1/√d in the softmax
    p = bk.softmax(s, _stacked_mask(sa, xp, params, k, B, T, Y), sa.scale)
    o2 = xp.reshape(bk.merge_heads([bk.bmm(p, v)], k * B, nh), (k, R, E))
    a = xp.reshape(_linear(xp, o2, params["sa.W_out"], params["sa.b_out"]), Y.shape)
    u = Y + a
    l2, mean2, rstd2 = _layernorm(bk, u, params["ln2.gamma"], params["ln2.beta"], step.eps)
    l2 = xp.reshape(l2, (k, R, E))
    z = _linear(xp, l2, params["mlp.W1"], params["mlp.b1"])  # k,R,F
    act = _gelu(bk, z)
    c = xp.reshape(_linear(xp, act, params["mlp.W2"], params["mlp.b2"]), Y.shape)
    Y_next = Y + hs * (a + c)
    G = B * nh  # attention matrices per row
    stacks = {"mean1": mean1, "rstd1": rstd1, "l1": xp.reshape(l1, (k, R, E)),
              **{n: xp.reshape(a, (k, G, *a.shape[1:])) for n, a in (("q", q), ("k", kk),
                                                                      ("v", v), ("p", p))},
              "o2": o2, "u": u, "mean2": mean2, "rstd2": rstd2, "l2": l2, "z": z, "a": act}
    return Y_next, _row_handles(stacks, k)


# ----------------------------------------------------------------------------- adjoint
def adjoint_batched(step, params, Y, Z, dY_next, h, bk, grads: bool = True):
    """The adjoints of k encoder steps: dY (k, B, T, E) and, with grads, the weight gradients
    stacked (k, ...) keyed as the step's params (else None). Z: rows of
    :func:`forward_batched`'s handles; chunks of at most :func:`rows_per_call` rows that come
    from one forward chunk (so their activations are views)."""
    xp = bk.xp
    k, B, T, _ = Y.shape
    if tuple(dY_next.shape) != tuple(Y.shape):
        raise ValueError(f"`dY_next` must have shape {tuple(Y.shape)}, "
                         f"got {tuple(dY_next.shape)}.")
    h = np.asarray(h, dtype=np.float64).reshape(-1)
    handles = list(np.reshape(Z, (-1,)))
    size, cuts = chunk_rows(bk, rows_per_call(B, T), k), [0]
    for j in range(1, k):  # a new chunk when full or where the rows' forward call changes
        if j - cuts[-1] == size or handles[j].stacks is not handles[j - 1].stacks:
            cuts.append(j)
    parts = [_adjoint_rows(step, _rows_of(params, at, k), Y[at, ...], Z[at], dY_next[at, ...],
                           h[at], bk, grads) for at in map(slice, cuts, [*cuts[1:], k])]
    if len(parts) == 1:
        return parts[0]
    dY = xp.concat([p[0] for p in parts], axis=0)
    if not grads:
        return dY, None
    return dY, {n: xp.concat([p[1][n] for p in parts], axis=0) for n in parts[0][1]}


def _adjoint_rows(step, params, Y, Z, dY_next, h, bk, grads: bool):
    """:func:`adjoint_batched` of one chunk (one row: the per-step call)."""
    xp = bk.xp
    if Y.shape[0] == 1:
        dy, d = step.adjoint(_rows_of(params, 0), (Y[0, ...], np.reshape(Z, (-1,))[0]),
                             dY_next[0, ...], float(h[0]), bk, grads)
        return dy[None, ...], (None if d is None else {n: a[None, ...] for n, a in d.items()})
    k, B, T, E = Y.shape
    R, nh = B * T, step.heads
    c = _gather(xp, Z)
    scale = step.parts()["sa"].scale
    hs = values_on(Y, h, dY_next.dtype)[:, None, None, None]
    g = hs * dY_next
    # MLP: dl2 = φ2'ᵀ g (before LN2)
    da, dW2, db2 = _linear_adjoint(xp, c["a"], params["mlp.W2"], xp.reshape(g, (k, R, E)),
                                   grads)
    dz = _gelu_adjoint(bk, c["z"], da)
    dl2, dW1, db1 = _linear_adjoint(xp, c["l2"], params["mlp.W1"], dz, grads)
    du, dg2, dbe2 = _layernorm_adjoint(bk, c["u"], c["mean2"], c["rstd2"], params["ln2.gamma"],
                                       xp.reshape(dl2, Y.shape), grads)
    # self-attention with dout = g + du
    q, kk, v, p = (xp.reshape(c[n], (k * B * nh, *c[n].shape[2:])) for n in "qkvp")
    do2, dW_out, db_out = _linear_adjoint(xp, c["o2"], params["sa.W_out"],
                                          xp.reshape(g + du, (k, R, E)), grads)
    (do,) = bk.split_heads(xp.reshape(do2, (k * R, E)), k * B, T, nh)  # G,T,d
    dp = bk.bmm(do, contiguous(_t(v)))
    ds = bk.softmax_adjoint(p, dp, scale)
    dq, dv = bk.bmm(ds, kk), bk.bmm(contiguous(_t(p)), do)  # G,T,d
    dk = bk.bmm(contiguous(_t(ds)), q)
    dqkv = xp.reshape(bk.merge_heads([dq, dk, dv], k * B, nh), (k, R, 3 * E))
    dl1, dW_in, db_in = _linear_adjoint(xp, c["l1"], params["sa.W_in"], dqkv, grads)
    dx, dg1, dbe1 = _layernorm_adjoint(bk, Y, c["mean1"], c["rstd1"], params["ln1.gamma"],
                                       xp.reshape(dl1, Y.shape), grads)
    dY = dY_next + du + dx
    if not grads:
        return dY, None
    return dY, {"ln1.gamma": dg1, "ln1.beta": dbe1, "sa.W_in": dW_in, "sa.b_in": db_in,
                "sa.W_out": dW_out, "sa.b_out": db_out, "ln2.gamma": dg2, "ln2.beta": dbe2,
                "mlp.W1": dW1, "mlp.b1": db1, "mlp.W2": dW2, "mlp.b2": db2}
