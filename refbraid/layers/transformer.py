"""Transformer blocks as ODE steps (Lu et al. 2019; docs/references.md §1), and the heads that
close a transformer.

A step is forward Euler ``X_next = X + h·F(X)`` on the token states X (B, T, E), with
``φ1 = SA∘LN1`` (self-attention), ``φ2 = MLP∘LN2`` and ``φ3 = CA∘LN3`` (cross-attention to
the encoder output, the *memory*)::

    encoder  F_enc(x) = a + c,        a = φ1(x),  u = x + a,  c = φ2(u)
    decoder  F_dec(x) = a + c + e,    a = φ1(x),  u = x + a,  c = φ3(u),  v = u + c,  e = φ2(v)

Discrete adjoint, with λ = dX_next and g = h λ (each φ' ᵀ is a sub-layer's ``adjoint``)::

    encoder  du = φ2'(u)ᵀ g,                         dX = λ + du + φ1'(x)ᵀ (g + du)
    decoder  dv = φ2'(v)ᵀ g,  du = dv + φ3'(u)ᵀ (g + dv),  dX = λ + du + φ1'(x)ᵀ (g + du)

and each sub-layer's weight gradient comes out of the same call (``grads=False``, the
state-only adjoint of an MGRIT sweep, skips the weight-gradient products and the memory's).

With ``h = 1`` a step is exactly torch's pre-norm layer,
``nn.TransformerEncoderLayer(E, nh, F, dropout=0, activation="gelu", batch_first=True,
norm_first=True)`` (and the decoder layer likewise), whose weights map onto ours as

=====================  ==========================================================
refbraid               torch (encoder layer / decoder layer)
=====================  ==========================================================
``ln1.gamma, .beta``   ``norm1.weight, .bias``
``sa.W_in`` …          ``self_attn.in_proj_weight`` … (see refbraid.layers.attention)
``ln2.*``              ``norm2.*`` (encoder) / ``norm3.*`` (decoder): before the MLP
``mlp.W1, b1, W2, b2`` ``linear1.weight, .bias, linear2.weight, .bias``
``ln3.*``              decoder only: ``norm2.*``, before the cross-attention
``ca.W_in`` …          decoder only: ``multihead_attn.in_proj_weight`` …
=====================  ==========================================================

Data in the params dict (put there by the caller; not weights, no optimiser should touch them):

* ``memory`` (decoder): the encoder output (B or 1, S, E). It is *data* of every decoder step
  (all steps attend to the same memory), so it travels in params and its adjoint comes back in
  dparams as ``memory``: a network sums ``dparams["memory"]`` over its decoder steps and hands
  the sum to the encoder's adjoint. ``init`` makes a (1, S, E) stand-in (a leading 1 broadcasts
  over the batch) so that a step verifies on its own.
* ``key_padding_mask`` (optional, bool (B, T)): padded tokens of X, ignored as keys of the
  self-attention; ``memory_padding_mask`` (decoder, optional, bool (B, S)): padded memory
  tokens. Masks have no adjoint and are never in dparams.
* The causal mask is a hyper-parameter, the step attribute ``causal`` (default: off for the
  encoder, on for the decoder).

Heads: ``PooledClassifier`` (mean over tokens, then a dense map to class logits) and
``TokenClassifier`` (per-token logits (B, T, classes)) with ``token_cross_entropy`` and its
adjoint (the mean over all B·T tokens, as torch's ``cross_entropy`` on flattened logits).

Shape legend: B batch, T tokens (``seq_len``), S memory tokens (``memory_len``), E width
(``dim``), F MLP hidden width (``hidden``), nh heads, K classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np

from ..backends.portable import contiguous
from .attention import MultiheadAttention
from .init import (
    check_adjoint,
    check_dtype,
    check_positive_int,
    check_step_size,
    uniform_fan_in,
)
from .layernorm import EPS, LayerNorm, check_eps
from .mlp import MLP
from .transformer_batched import adjoint_batched, batched_pays, forward_batched, unpack_row


def subparams(params: dict, prefix: str) -> dict:
    """The entries ``prefix.name`` of a step's params, as ``name``."""
    head = prefix + "."
    return {k[len(head) :]: v for k, v in params.items() if k.startswith(head)}


def prefixed(params: dict, prefix: str) -> dict:
    """The inverse of subparams: ``name`` → ``prefix.name``."""
    return {f"{prefix}.{k}": v for k, v in params.items()}


def _check_state(name: str, y, shape: tuple[int, ...]) -> None:
    """Raise ValueError unless y has shape (batch, *shape)."""
    if getattr(y, "ndim", None) != 3 or tuple(y.shape[1:]) != shape:
        raise ValueError(f"`{name}` must have shape (batch, {shape[0]}, {shape[1]}), "
                         f"got {getattr(y, 'shape', type(y).__name__)}.")


@dataclass(frozen=True)
class EncoderStep:
    """``X_next = X + h (φ1(X) + φ2(X + φ1(X)))``: pre-norm self-attention and MLP."""

    dim: int
    heads: int
    hidden: int
    seq_len: int
    causal: bool = False
    eps: float = EPS

    #: MGRIT's sweeps call :meth:`forward_batched` / :meth:`adjoint_batched` (k layers per call,
    #: bit-identical) where True (``refbraid.propagators.batchable``). It pays for small
    #: batches only (B·T ≤ 64 tokens), so it is off here and :meth:`for_batch` sets it per batch
    #: (docs/batched.md, "Transformer blocks"). Not part of the step's identity (compare=False).
    batched_sweeps_pay: bool = field(default=False, compare=False, repr=False)

    #: params entries that are data, not weights (module docstring)
    data_entries: ClassVar[tuple[str, ...]] = ("key_padding_mask",)

    def __post_init__(self):
        check_eps(self.eps)
        self.parts()  # validates dim, heads, hidden, seq_len, causal

    def parts(self) -> dict[str, object]:
        """The sub-layers, keyed by their parameter prefix."""
        E, T = self.dim, self.seq_len
        return {
            "ln1": LayerNorm(E, T, self.eps),
            "sa": MultiheadAttention(E, self.heads, T, causal=self.causal),
            "ln2": LayerNorm(E, T, self.eps),
            "mlp": MLP(E, self.hidden, T),
        }

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.seq_len, self.dim)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        """Every sub-layer's weights (as torch initialises them), prefixed ``ln1.``, ``sa.``, …"""
        params = {}
        for name, part in self.parts().items():
            params.update(prefixed(part.init(rng, dtype), name))
        return params

    def forward(self, params, y, h: float, bk):
        """X_next = X + h (a + c); returns (X_next, cache)."""
        _check_state("y", y, self.state_shape)
        h = check_step_size("h", h)
        check_dtype("y", y, params)
        P = self.parts()
        sa_params = {**subparams(params, "sa"), "key_padding_mask": params.get("key_padding_mask")}
        l1, c_ln1 = P["ln1"].forward(subparams(params, "ln1"), y, bk)  # B,T,E
        a, c_sa = P["sa"].forward(sa_params, l1, bk)  # φ1(x)
        l2, c_ln2 = P["ln2"].forward(subparams(params, "ln2"), y + a, bk)  # LN2(u)
        c, c_mlp = P["mlp"].forward(subparams(params, "mlp"), l2, bk)  # φ2(u)
        return y + h * (a + c), (c_ln1, c_sa, c_ln2, c_mlp)

    def adjoint(self, params, cache, dy_next, h: float, bk, grads: bool = True):
        """dX = λ + du + φ1'ᵀ(g + du), du = φ2'ᵀ g, g = h λ; returns (dX, dparams or None).
        ``cache``: :meth:`forward`'s, or ``(Y[j], Z[j])`` of a :meth:`forward_batched` call."""
        c_ln1, c_sa, c_ln2, c_mlp = unpack_row(self, *cache) if len(cache) == 2 else cache
        h = check_step_size("h", h)
        check_adjoint("dy_next", dy_next, c_ln1[0].shape)  # the cache of LN1 holds y
        P = self.parts()
        g = h * dy_next
        dl2, d_mlp = P["mlp"].adjoint(subparams(params, "mlp"), c_mlp, g, bk, grads)
        du, d_ln2 = P["ln2"].adjoint(subparams(params, "ln2"), c_ln2, dl2, bk, grads)
        dl1, d_sa = P["sa"].adjoint(subparams(params, "sa"), c_sa, g + du, bk, grads)
        dx, d_ln1 = P["ln1"].adjoint(subparams(params, "ln1"), c_ln1, dl1, bk, grads)
        dy = dy_next + du + dx
        if not grads:
            return dy, None
        dparams = {}
        for name, d in (("ln1", d_ln1), ("sa", d_sa), ("ln2", d_ln2), ("mlp", d_mlp)):
            dparams.update(prefixed(d, name))
        return dy, dparams

    # -- k layers at once (MGRIT's batched sweeps; refbraid.layers.transformer_batched) -----
    def for_batch(self, batch: int) -> EncoderStep:
        """This step with batched sweeps on if they pay for ``batch`` samples (B·T ≤ 64)."""
        return replace(self, batched_sweeps_pay=batched_pays(batch, self.seq_len))

    def forward_batched(self, params, Y, h, bk):
        """Row j = :meth:`forward` (θ = ``params[·][j]``, ``h[j]``), bit for bit: Y (k, B, T, E),
        stacked params (k, ...), h (k,). Returns (Y_next, Z: the (k,) cache handles)."""
        return forward_batched(self, params, Y, h, bk)

    def adjoint_batched(self, params, Y, Z, dY_next, h, bk, grads: bool = True):
        """Row j = :meth:`adjoint` at the cache ``(Y[j], Z[j])``; returns (dY, stacked dparams
        or None)."""
        return adjoint_batched(self, params, Y, Z, dY_next, h, bk, grads)


@dataclass(frozen=True)
class DecoderStep:
    """``X_next = X + h (a + c + e)``: self-attention, cross-attention to ``memory``, MLP."""

    dim: int
    heads: int
    hidden: int
    seq_len: int
    memory_len: int
    causal: bool = True
    eps: float = EPS

    #: params entries that are data, not weights (module docstring)
    data_entries: ClassVar[tuple[str, ...]] = ("memory", "key_padding_mask",
                                               "memory_padding_mask")

    def __post_init__(self):
        check_eps(self.eps)
        self.parts()

    def parts(self) -> dict[str, object]:
        """The sub-layers, keyed by their parameter prefix."""
        E, T = self.dim, self.seq_len
        return {
            "ln1": LayerNorm(E, T, self.eps),
            "sa": MultiheadAttention(E, self.heads, T, causal=self.causal),
            "ln3": LayerNorm(E, T, self.eps),
            "ca": MultiheadAttention(E, self.heads, T, memory_len=self.memory_len),
            "ln2": LayerNorm(E, T, self.eps),
            "mlp": MLP(E, self.hidden, T),
        }

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.seq_len, self.dim)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        """Weights of every sub-layer plus a (1, S, E) stand-in ``memory`` (module docstring)."""
        params = {}
        for name, part in self.parts().items():
            p = part.init(rng, dtype)
            memory = p.pop("memory", None)
            params.update(prefixed(p, name))
            if memory is not None:
                params["memory"] = memory
        return params

    def _ca_params(self, params):
        """The cross-attention's params: its weights, the memory and the memory's padding."""
        return {**subparams(params, "ca"), "memory": params["memory"],
                "key_padding_mask": params.get("memory_padding_mask")}

    def forward(self, params, y, h: float, bk):
        """X_next = X + h (a + c + e); returns (X_next, cache)."""
        _check_state("y", y, self.state_shape)
        h = check_step_size("h", h)
        check_dtype("y", y, params)
        if "memory" not in params:
            raise ValueError("`params` of a DecoderStep must hold the encoder output "
                             "`memory` (B or 1, S, E).")
        P = self.parts()
        sa_params = {**subparams(params, "sa"), "key_padding_mask": params.get("key_padding_mask")}
        l1, c_ln1 = P["ln1"].forward(subparams(params, "ln1"), y, bk)
        a, c_sa = P["sa"].forward(sa_params, l1, bk)  # φ1(x)
        u = y + a
        l3, c_ln3 = P["ln3"].forward(subparams(params, "ln3"), u, bk)
        c, c_ca = P["ca"].forward(self._ca_params(params), l3, bk)  # φ3(u)
        l2, c_ln2 = P["ln2"].forward(subparams(params, "ln2"), u + c, bk)
        e, c_mlp = P["mlp"].forward(subparams(params, "mlp"), l2, bk)  # φ2(v)
        return y + h * (a + c + e), (c_ln1, c_sa, c_ln3, c_ca, c_ln2, c_mlp)

    def adjoint(self, params, cache, dy_next, h: float, bk, grads: bool = True):
        """dX = λ + du + φ1'ᵀ(g + du), du = dv + φ3'ᵀ(g + dv), dv = φ2'ᵀ g, g = h λ.

        Returns (dX, dparams or None); dparams holds ``memory`` (the adjoint of the memory).
        """
        c_ln1, c_sa, c_ln3, c_ca, c_ln2, c_mlp = cache
        h = check_step_size("h", h)
        check_adjoint("dy_next", dy_next, c_ln1[0].shape)  # the cache of LN1 holds y
        P = self.parts()
        g = h * dy_next
        dl2, d_mlp = P["mlp"].adjoint(subparams(params, "mlp"), c_mlp, g, bk, grads)
        dv, d_ln2 = P["ln2"].adjoint(subparams(params, "ln2"), c_ln2, dl2, bk, grads)
        dl3, d_ca = P["ca"].adjoint(self._ca_params(params), c_ca, g + dv, bk, grads)
        du3, d_ln3 = P["ln3"].adjoint(subparams(params, "ln3"), c_ln3, dl3, bk, grads)
        du = dv + du3
        dl1, d_sa = P["sa"].adjoint(subparams(params, "sa"), c_sa, g + du, bk, grads)
        dx, d_ln1 = P["ln1"].adjoint(subparams(params, "ln1"), c_ln1, dl1, bk, grads)
        dy = dy_next + du + dx
        if not grads:
            return dy, None
        dparams = {"memory": d_ca.pop("memory")}
        for name, d in (("ln1", d_ln1), ("sa", d_sa), ("ln3", d_ln3), ("ca", d_ca),
                        ("ln2", d_ln2), ("mlp", d_mlp)):
            dparams.update(prefixed(d, name))
        return dy, dparams


# ----------------------------------------------------------------------------- heads
@dataclass(frozen=True)
class PooledClassifier:
    """Closing layer ``logits = mean_t(X) Wᵀ + b`` (B, K); adjoint dX = (dlogits W)/T per token."""

    seq_len: int
    dim: int
    n_classes: int

    def __post_init__(self):
        for name in ("seq_len", "dim", "n_classes"):
            check_positive_int(name, getattr(self, name))

    @property
    def in_shape(self) -> tuple[int, ...]:
        return (self.seq_len, self.dim)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.n_classes,)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        E, K = self.dim, self.n_classes
        return {"W": uniform_fan_in(rng, (K, E), E, dtype),
                "b": uniform_fan_in(rng, (K,), E, dtype)}

    def forward(self, params, x, bk):
        """logits = mean_t(x) Wᵀ + b; returns (logits (B, K), cache = the pooled x)."""
        _check_state("x", x, self.in_shape)
        check_dtype("x", x, params)
        pooled = bk.xp.mean(x, axis=1)  # B,E
        return bk.linear(pooled, params["W"], params["b"]), pooled

    def adjoint(self, params, cache, dlogits, bk):
        """dx[:, t] = (dlogits W)/T for every t,  dW = dlogitsᵀ pooled,  db = Σ_B dlogits."""
        pooled = cache
        check_adjoint("dlogits", dlogits, (pooled.shape[0], self.n_classes))
        dpooled, dW, db = bk.linear_adjoint(pooled, params["W"], dlogits)  # B,E
        T = self.seq_len
        dx = bk.xp.broadcast_to(dpooled[:, None, :] / T, (pooled.shape[0], T, self.dim))
        return contiguous(dx), {"W": dW, "b": db}


@dataclass(frozen=True)
class TokenClassifier:
    """Closing layer ``logits[b, t] = X[b, t] Wᵀ + b`` (B, T, K): one prediction per token."""

    seq_len: int
    dim: int
    n_classes: int

    def __post_init__(self):
        for name in ("seq_len", "dim", "n_classes"):
            check_positive_int(name, getattr(self, name))

    @property
    def in_shape(self) -> tuple[int, ...]:
        return (self.seq_len, self.dim)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.seq_len, self.n_classes)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        E, K = self.dim, self.n_classes
        return {"W": uniform_fan_in(rng, (K, E), E, dtype),
                "b": uniform_fan_in(rng, (K,), E, dtype)}

    def forward(self, params, x, bk):
        """logits[b, t] = x[b, t] Wᵀ + b; returns (logits (B, T, K), cache = x as rows)."""
        _check_state("x", x, self.in_shape)
        check_dtype("x", x, params)
        rows = bk.xp.reshape(x, (-1, self.dim))  # BT,E
        logits = bk.linear(rows, params["W"], params["b"])  # BT,K
        return bk.xp.reshape(logits, (x.shape[0], self.seq_len, self.n_classes)), rows

    def adjoint(self, params, cache, dlogits, bk):
        """dx = dlogits W,  dW = Σ_{b,t} dlogits[b,t] x[b,t]ᵀ,  db = Σ_{b,t} dlogits[b,t]."""
        rows = cache
        check_adjoint("dlogits", dlogits, (rows.shape[0] // self.seq_len, *self.out_shape))
        drows, dW, db = bk.linear_adjoint(rows, params["W"],
                                          bk.xp.reshape(dlogits, (rows.shape[0], -1)))
        return bk.xp.reshape(drows, (-1, self.seq_len, self.dim)), {"W": dW, "b": db}


def token_cross_entropy(logits, labels, bk):
    """Mean cross-entropy over all B·T tokens: L = −(1/BT) Σ_{b,t} log softmax(logits[b,t])[y_bt].

    logits (B, T, K), labels int (B, T); as ``F.cross_entropy(logits.reshape(-1, K),
    labels.reshape(-1))``. Returns (L, probs (B, T, K)).
    """
    if getattr(labels, "shape", None) != tuple(logits.shape[:2]):
        raise ValueError(f"`labels` must have shape {tuple(logits.shape[:2])}, "
                         f"got {getattr(labels, 'shape', None)}.")
    K = logits.shape[-1]
    xp = bk.xp
    loss, probs = bk.softmax_cross_entropy(xp.reshape(logits, (-1, K)), xp.reshape(labels, (-1,)))
    return loss, xp.reshape(probs, logits.shape)


def token_cross_entropy_adjoint(probs, labels, bk, dloss: float = 1.0):
    """dlogits[b, t] = dloss (p[b, t] − onehot(y_bt)) / (B·T)."""
    K = probs.shape[-1]
    xp = bk.xp
    d = bk.softmax_cross_entropy_adjoint(xp.reshape(probs, (-1, K)), xp.reshape(labels, (-1,)),
                                         dloss)
    return xp.reshape(d, probs.shape)
