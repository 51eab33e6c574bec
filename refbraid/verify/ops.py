"""One shape for everything the harness checks: a map ``out = f(params, x)`` and its adjoint.

An :class:`Op` wraps an ODE step (``out = y_next``, input ``y``), a plain layer
(``out = layer(x)``), the loss (``out = L(logits)``) or a whole network
(``out = L(θ)``, input the data, not differentiated) behind two calls::

    out, cache       = op.forward(params, x, bk)
    dx, dparams      = op.adjoint(params, cache, dout, bk)     # dx = Jₓᵀ dout, dθ = J_θᵀ dout

so one set of checks (refbraid.verify.checks) serves them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import network as nw


@dataclass(frozen=True)
class StepOp:
    """An ODE step ``y_next = Φ(θ, y)`` at fixed step size ``h``."""

    step: Any
    h: float
    input_name = "y"
    differentiate_input = True

    def forward(self, params, y, bk):
        return self.step.forward(params, y, self.h, bk)

    def adjoint(self, params, cache, dy_next, bk):
        return self.step.adjoint(params, cache, dy_next, self.h, bk, grads=True)


@dataclass(frozen=True)
class LayerOp:
    """A plain layer ``out = f(θ, x)``; an integer (``discrete_input``) x is not differentiated."""

    layer: Any
    input_name = "x"

    @property
    def differentiate_input(self) -> bool:
        return not getattr(self.layer, "discrete_input", False)

    def forward(self, params, x, bk):
        return self.layer.forward(params, x, bk)

    def adjoint(self, params, cache, dout, bk):
        dx, dparams = self.layer.adjoint(params, cache, dout, bk)
        return (dx if self.differentiate_input else None), dparams


@dataclass(frozen=True)
class SoftmaxCrossEntropyLayer:
    """The loss as a plain layer: ``L = −(1/B) Σ_b log softmax(logits_b)[y_b]``, ``y_b = b mod C``.

    Parameter-free; the labels are fixed by the batch size so that the layer is a function
    of the logits alone.
    """

    n_classes: int

    @property
    def in_shape(self) -> tuple[int, ...]:
        return (self.n_classes,)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return ()

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        return {}

    def labels(self, batch: int, bk) -> Any:
        return bk.asarray(np.arange(batch) % self.n_classes)

    def forward(self, params, logits, bk):
        labels = self.labels(logits.shape[0], bk)
        loss, probs = bk.softmax_cross_entropy(logits, labels)
        return loss, (probs, labels)

    def adjoint(self, params, cache, dloss, bk):
        probs, labels = cache
        dlogits = bk.softmax_cross_entropy_adjoint(probs, labels, float(bk.to_numpy(dloss)))
        return dlogits, {}


@dataclass(frozen=True)
class NetworkOp:
    """The loss of a whole network as a function of its parameters: ``L(θ)`` for fixed data.

    The adjoint is the sequential backprop of refbraid.network (the thing under test).
    """

    net: nw.Network
    labels: np.ndarray
    input_name = "x"
    differentiate_input = False

    @property
    def constant_entries(self) -> tuple[str, ...]:
        """Params held fixed by their layer (e.g. batch norm's running statistics in eval
        mode), with the network's prefixes: not differentiated, not checked."""
        parts = (("opening", self.net.opening), ("steps", self.net.step),
                 ("closing", self.net.closing))
        return tuple(f"{prefix}.{k}" for prefix, layer in parts
                     for k in getattr(layer, "constant_entries", ()))

    def forward(self, params, x, bk):
        logits, _, _ = nw.forward(self.net, params, x, bk, keep=False)
        loss, _ = bk.softmax_cross_entropy(logits, bk.asarray(self.labels))
        return loss, x

    def adjoint(self, params, x, dloss, bk):
        _, grads, _ = nw.backprop(self.net, params, x, bk.asarray(self.labels), bk)
        scale = float(bk.to_numpy(dloss))
        fixed = self.constant_entries
        return None, {k: g * scale for k, g in grads.items() if k not in fixed}
