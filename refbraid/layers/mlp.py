"""Position-wise feed-forward block of a transformer: ``Linear(E→F) → GELU → Linear(F→E)``.

Forward and adjoint, applied to every token independently (GELU is the exact, erf-based one,
as ``torch.nn.GELU()``; docs/references.md §1)::

    z  = x W1ᵀ + b1,   a = gelu(z),   y = a W2ᵀ + b2          # (BT,F), (BT,F), (BT,E)
    da = dy W2,        dW2 = dyᵀ a,    db2 = Σ dy
    dz = gelu'(z) ⊙ da
    dx = dz W1,        dW1 = dzᵀ x,    db1 = Σ dz

Parameters map onto ``torch.nn.Sequential(Linear(E, F), GELU(), Linear(F, E))`` as
``W1`` ↔ ``0.weight`` (F, E), ``b1`` ↔ ``0.bias``, ``W2`` ↔ ``2.weight`` (E, F),
``b2`` ↔ ``2.bias``.

Shape legend: B batch, T tokens (``seq_len``), E width (``dim``), F hidden width
(``hidden``); BT = B·T rows. Inputs of any shape (..., E) are flattened to rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .init import check_adjoint, check_dtype, check_positive_int, uniform_fan_in

ACTIVATION = "gelu"  # exact GELU, z Φ(z)


@dataclass(frozen=True)
class MLP:
    """``y = W2 gelu(W1 x + b1) + b2`` token by token, E → F → E."""

    dim: int
    hidden: int
    seq_len: int = 1

    def __post_init__(self):
        check_positive_int("dim", self.dim)
        check_positive_int("hidden", self.hidden)
        check_positive_int("seq_len", self.seq_len)

    @property
    def in_shape(self) -> tuple[int, ...]:
        return (self.seq_len, self.dim)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.seq_len, self.dim)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        """PyTorch's Linear default: U(±1/√fan_in) for weights and biases."""
        E, F = self.dim, self.hidden
        return {
            "W1": uniform_fan_in(rng, (F, E), E, dtype),
            "b1": uniform_fan_in(rng, (F,), E, dtype),
            "W2": uniform_fan_in(rng, (E, F), F, dtype),
            "b2": uniform_fan_in(rng, (E,), F, dtype),
        }

    def forward(self, params, x, bk):
        """y = gelu(x W1ᵀ + b1) W2ᵀ + b2; returns (y, cache = (rows, z, a, x.shape))."""
        if x.shape[-1] != self.dim:
            raise ValueError(f"`x` must have last axis {self.dim}, got shape {tuple(x.shape)}.")
        check_dtype("x", x, params)
        rows = bk.xp.reshape(x, (-1, self.dim))  # BT,E
        z = bk.linear(rows, params["W1"], params["b1"])  # BT,F
        a = bk.activation(z, ACTIVATION)  # BT,F
        y = bk.linear(a, params["W2"], params["b2"])  # BT,E
        return bk.xp.reshape(y, x.shape), (rows, z, a, tuple(x.shape))

    def adjoint(self, params, cache, dout, bk, grads: bool = True):
        """dx = (gelu'(z) ⊙ dout W2) W1 and, with ``grads``, the weight gradients (else
        None); returns (dx, dparams)."""
        rows, z, a, out_shape = cache
        check_adjoint("dout", dout, out_shape)
        drows = bk.xp.reshape(dout, rows.shape)  # BT,E
        da, dW2, db2 = _linear_adjoint(bk, a, params["W2"], drows, grads)  # BT,F
        dz = bk.activation_adjoint(z, da, ACTIVATION)  # BT,F
        dx, dW1, db1 = _linear_adjoint(bk, rows, params["W1"], dz, grads)  # BT,E
        dparams = {"W1": dW1, "b1": db1, "W2": dW2, "b2": db2} if grads else None
        return bk.xp.reshape(dx, dout.shape), dparams


def _linear_adjoint(bk, x, W, dz, grads: bool):
    """(dx, dW, db) = (dz W, dzᵀ x, Σ dz) of z = x Wᵀ + b; only dx (and None, None) when
    ``grads`` is False (the state-only adjoint of an MGRIT sweep)."""
    if grads:
        return bk.linear_adjoint(x, W, dz)
    return bk.matmul(dz, W), None, None
