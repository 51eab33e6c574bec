"""The closing layer of a causal language model: a final layer norm and a map to the vocabulary.

Forward and adjoint (per token; ``W`` is the head's own (V, E) matrix or, *tied*, the token
embedding's ``W`` handed in by the model, which then adds the two gradients of the one matrix)::

    Z = LN_f(X)                      (B, T, E)
    logits[b, t] = Z[b, t] Wᵀ + b    (B, T, V)
    dZ = dlogits W,   dW = Σ_{b,t} dlogits[b,t] Z[b,t]ᵀ,   db = Σ_{b,t} dlogits[b,t]
    dX = LN_f'(X)ᵀ dZ

As torch: ``nn.LayerNorm(E)`` then ``nn.Linear(E, V)`` (untied) or ``F.linear(z, emb.weight,
b)`` (tied, GPT-2's head with a bias). Parameters ``ln.gamma``, ``ln.beta``, ``W``, ``b``.

Shape legend: B batch, T tokens, E width, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .init import check_adjoint, check_dtype, check_positive_int, uniform_fan_in
from .layernorm import EPS, LayerNorm
from .transformer import prefixed, subparams


@dataclass(frozen=True)
class LMHead:
    """``logits = LN_f(X) Wᵀ + b`` token by token: next-token logits over the vocabulary."""

    seq_len: int
    dim: int
    vocab_size: int
    eps: float = EPS

    def __post_init__(self):
        for name in ("seq_len", "dim", "vocab_size"):
            check_positive_int(name, getattr(self, name))

    @property
    def norm(self) -> LayerNorm:
        return LayerNorm(self.dim, self.seq_len, self.eps)

    @property
    def in_shape(self) -> tuple[int, ...]:
        return (self.seq_len, self.dim)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.seq_len, self.vocab_size)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        """γ = 1, β = 0; W, b ~ U(±1/√E) as ``nn.Linear(E, V)``."""
        E, V = self.dim, self.vocab_size
        return {**prefixed(self.norm.init(rng, dtype), "ln"),
                "W": uniform_fan_in(rng, (V, E), E, dtype),
                "b": uniform_fan_in(rng, (V,), E, dtype)}

    def forward(self, params, x, bk):
        """logits = LN_f(x) Wᵀ + b; returns (logits (B, T, V), cache)."""
        if getattr(x, "ndim", None) != 3 or tuple(x.shape[1:]) != self.in_shape:
            raise ValueError(f"`x` must have shape (batch, {self.seq_len}, {self.dim}), "
                             f"got {getattr(x, 'shape', type(x).__name__)}.")
        check_dtype("x", x, params)
        z, c_ln = self.norm.forward(subparams(params, "ln"), x, bk)  # B,T,E
        rows = z.reshape(-1, self.dim)  # BT,E
        logits = bk.linear(rows, params["W"], params["b"])  # BT,V
        return logits.reshape(x.shape[0], self.seq_len, self.vocab_size), (c_ln, rows)

    def adjoint(self, params, cache, dlogits, bk):
        """dZ = dlogits W, dW = dlogitsᵀ Z, db = Σ dlogits, dX = LN_f'ᵀ dZ."""
        c_ln, rows = cache
        check_adjoint("dlogits", dlogits, (rows.shape[0] // self.seq_len, *self.out_shape))
        drows, dW, db = bk.linear_adjoint(rows, params["W"],
                                          dlogits.reshape(rows.shape[0], self.vocab_size))
        dx, d_ln = self.norm.adjoint(subparams(params, "ln"), c_ln,
                                     drows.reshape(-1, self.seq_len, self.dim), bk)
        return dx, {**prefixed(d_ln, "ln"), "W": dW, "b": db}
