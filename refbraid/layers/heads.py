"""Closing layer and loss.

Classifier: flatten → dense → logits, ``logits = flat(x) Wᵀ + b``; adjoint
``dx = unflat(dlogits W)``, ``dW = dlogitsᵀ flat(x)``, ``db = Σ_B dlogits``.

Loss: mean softmax cross-entropy ``L = −(1/B) Σ_b log softmax(logits_b)[y_b]``, adjoint
``dlogits = (softmax(logits) − onehot(y)) / B`` (as ``torch.nn.functional.cross_entropy``).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from .init import check_adjoint, check_dtype, check_positive_int, uniform_fan_in


@dataclass(frozen=True)
class Classifier:
    """Closing layer: flatten the (C, ...) state, then a dense map to ``n_classes`` logits."""

    in_shape: tuple[int, ...]
    n_classes: int

    def __post_init__(self):
        if not self.in_shape or any(int(s) < 1 for s in self.in_shape):
            raise ValueError(
                f"`in_shape` must be a tuple of positive sizes, got {self.in_shape!r}.")
        check_positive_int("n_classes", self.n_classes)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.n_classes,)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        K = prod(self.in_shape)
        return {
            "W": uniform_fan_in(rng, (self.n_classes, K), K, dtype),
            "b": uniform_fan_in(rng, (self.n_classes,), K, dtype),
        }

    def forward(self, params, x, bk):
        check_dtype("x", x, params)
        flat = bk.xp.reshape(x, (x.shape[0], -1))  # B,K
        return bk.linear(flat, params["W"], params["b"]), flat

    def adjoint(self, params, cache, dlogits, bk):
        flat = cache
        check_adjoint("dlogits", dlogits, (flat.shape[0], self.n_classes))
        dflat, dW, db = bk.linear_adjoint(flat, params["W"], dlogits)
        return bk.xp.reshape(dflat, (flat.shape[0], *self.in_shape)), {"W": dW, "b": db}


def softmax_cross_entropy(logits, labels, bk):
    """Mean cross-entropy of softmax(logits) against integer labels; returns (loss, probs)."""
    return bk.softmax_cross_entropy(logits, labels)


def softmax_cross_entropy_adjoint(probs, labels, bk, dloss: float = 1.0):
    """dlogits = dloss (p − onehot(y)) / B."""
    return bk.softmax_cross_entropy_adjoint(probs, labels, dloss)
