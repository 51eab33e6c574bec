"""PyTorch cross-check: refbraid's forward and hand-written adjoints against autograd.

An independent implementation (PyTorch is an optional dependency, never required): for each
layer kind the equivalent ``torch.nn`` module gets refbraid's weights copied in, then::

    out_t = module(x);  out_t.backward(w)        # autograd: x.grad = Jₓᵀ w, θ.grad = J_θᵀ w

and ``out``, ``dx`` and every ``dθ`` are compared with refbraid's forward and adjoint on the
backend under test, in float64, normwise (``torch:out``, ``torch:dx``, ``torch:dW``, …).

=====================  =====================================================================
refbraid               torch
=====================  =====================================================================
DenseStep(C, σ)        y + h·σ(Linear(C, C)(y))
ConvStep(C, H, W, σ)   y + h·σ(Conv2d(C, C, 3, padding=1)(y))
DenseLift(K, C, σ)     σ(Linear(K, C)(x))
ConvLift(Cin, C, …, σ) σ(Conv2d(Cin, C, 3, padding=1)(x))
Classifier(shape, n)   Linear(prod(shape), n)(Flatten()(x))
softmax cross-entropy  torch.nn.functional.cross_entropy(logits, labels)   (mean over B)
transformer and GRU    refbraid.verify.torch_sequence (LayerNorm, MLP, attention, encoder and
                       decoder steps, classic and implicit GRU cells, pooled and token heads)
3-D conv, batch norm,  refbraid.verify.torch_spatial (Conv3d, BatchNorm2d/3d in train and eval
transitions            mode, the BN conv step, pooling, strided conv, channel widening)
=====================  =====================================================================

σ: tanh → Tanh, relu → ReLU, gelu → GELU(approximate="none") (exact, erf), identity.
A new layer kind registers its builder in :data:`TORCH_EQUIVALENTS` with :func:`register`.

The spatial transfers R, P and the stage transitions register theirs from
:mod:`refbraid.verify.torch_transfers` (imported at the end of this module).

The weights are ``layer.init``'s plus ``PERTURB``·N(0, 1) on every entry, so that no weight
sits at a special value (zero biases, unit γ) that could hide a mixed-up parameter.
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod

import numpy as np
import torch
from torch import nn

from ..backends import Backend, get_backend
from ..layers import Classifier, ConvLift, ConvStep, DenseLift, DenseStep
from .checks import example_input, run_adjoint, run_forward
from .ops import LayerOp, SoftmaxCrossEntropyLayer, StepOp
from .result import CheckResult, compare_arrays, result, tolerance
from .torch_sequence import SEQUENCE_EQUIVALENTS
from .torch_spatial import SPATIAL_EQUIVALENTS, activation_module

DTYPE = torch.float64
PERTURB = 0.3  # size of the random perturbation added to layer.init's weights
#: layer type -> builder(layer, h) returning (module, {refbraid parameter name: torch Parameter})
TORCH_EQUIVALENTS: dict[type, Callable[..., tuple[nn.Module, dict[str, nn.Parameter]]]] = {
    **SEQUENCE_EQUIVALENTS, **SPATIAL_EQUIVALENTS}


def register(kind: type):
    """Decorator: register the torch builder of a refbraid layer type."""
    def wrap(builder):
        TORCH_EQUIVALENTS[kind] = builder
        return builder
    return wrap


class EulerStep(nn.Module):
    """y_next = y + h·σ(inner(y))."""

    def __init__(self, inner: nn.Module, act: str, h: float):
        super().__init__()
        self.inner, self.act, self.h = inner, activation_module(act), h

    def forward(self, y):
        return y + self.h * self.act(self.inner(y))


class CrossEntropy(nn.Module):
    """Mean cross-entropy against labels ``b mod C`` (as SoftmaxCrossEntropyLayer)."""

    def forward(self, logits):
        labels = torch.arange(logits.shape[0]) % logits.shape[1]
        return nn.functional.cross_entropy(logits, labels)


def _wb(inner: nn.Module) -> dict[str, nn.Parameter]:
    return {"W": inner.weight, "b": inner.bias}


@register(DenseStep)
def _dense_step(layer: DenseStep, h: float):
    inner = nn.Linear(layer.width, layer.width, dtype=DTYPE)
    return EulerStep(inner, layer.activation, h), _wb(inner)


@register(ConvStep)
def _conv_step(layer: ConvStep, h: float):
    inner = nn.Conv2d(layer.channels, layer.channels, 3, padding=1, dtype=DTYPE)
    return EulerStep(inner, layer.activation, h), _wb(inner)


@register(DenseLift)
def _dense_lift(layer: DenseLift, h: float):
    inner = nn.Linear(layer.in_features, layer.width, dtype=DTYPE)
    return nn.Sequential(inner, activation_module(layer.activation)), _wb(inner)


@register(ConvLift)
def _conv_lift(layer: ConvLift, h: float):
    inner = nn.Conv2d(layer.in_channels, layer.channels, 3, padding=1, dtype=DTYPE)
    return nn.Sequential(inner, activation_module(layer.activation)), _wb(inner)


@register(Classifier)
def _classifier(layer: Classifier, h: float):
    inner = nn.Linear(prod(layer.in_shape), layer.n_classes, dtype=DTYPE)
    return nn.Sequential(nn.Flatten(), inner), _wb(inner)


@register(SoftmaxCrossEntropyLayer)
def _cross_entropy(layer: SoftmaxCrossEntropyLayer, h: float):
    return CrossEntropy(), {}


def torch_equivalent(layer, h: float = 0.3):
    """(module, parameter map) for ``layer``, or None when its kind has no registered builder."""
    for kind in type(layer).__mro__:
        if kind in TORCH_EQUIVALENTS:
            return TORCH_EQUIVALENTS[kind](layer, h)
    return None


def torch_checks(name: str, layer, backend: str | Backend = "numpy", seed: int = 0,
                 batch: int = 3, h: float = 0.3) -> list[CheckResult]:
    """Forward and every adjoint output of ``layer`` on ``backend`` against torch autograd,
    float64, ≤ TOLERANCES['float64']['torch']; [] for a kind with no torch equivalent."""
    built = torch_equivalent(layer, h)
    if built is None:
        return []
    module, tparams = built
    bk = get_backend(backend)
    is_step = hasattr(layer, "state_shape")
    op = StepOp(layer, h) if is_step else LayerOp(layer)
    rng = np.random.default_rng(seed)
    params = {k: v + PERTURB * rng.standard_normal(v.shape)
              for k, v in layer.init(rng, np.float64).items()}
    shape = layer.state_shape if is_step else layer.in_shape
    x = example_input(layer, rng, batch, tuple(shape), np.float64)
    out, cache = run_forward(op, params, x, bk)
    w = np.asarray(rng.standard_normal(out.shape))
    grads = run_adjoint(op, params, cache, w, bk)

    with torch.no_grad():
        for key, p in tparams.items():
            p.copy_(torch.from_numpy(params[key]))
    xt = torch.from_numpy(x.copy()).requires_grad_(op.differentiate_input)
    out_t = module(xt)
    out_t.backward(torch.from_numpy(w))
    theirs = {"out": out_t.detach().numpy()}
    if op.differentiate_input:
        theirs[f"d{op.input_name}"] = xt.grad.numpy()
    # buffers (batch norm's running statistics in eval mode) are copied in, not differentiated
    theirs.update({f"d{k}": p.grad.numpy() for k, p in tparams.items() if p.requires_grad})
    ours = {"out": out, **{f"d{k}": g for k, g in grads.items()}}

    tol = tolerance(np.float64, "torch")
    results = []
    for label, t in theirs.items():
        a = ours.get(label)
        if a is None:
            results.append(result(name, f"torch:{label}", bk.name, np.float64, np.inf, tol,
                                  f"refbraid returned no `{label}`"))
            continue
        results.append(compare_arrays(name, f"torch:{label}", bk.name, np.float64, label, a, t,
                                      tol, ("refbraid", "torch")))
    return results


# R, P and the stage transitions (avg_pool, interpolate, channel padding): registered last
from .torch_transfers import TRANSFER_EQUIVALENTS  # noqa: E402

TORCH_EQUIVALENTS.update(TRANSFER_EQUIVALENTS)
