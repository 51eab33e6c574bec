"""A network = opening layer → N ODE steps over [0, T] → closing layer, and the sequential
baseline every solver is compared with.

Forward (forward Euler, ``h = T/N``)::

    y[0]   = opening(x)
    y[n+1] = Φ_n(y[n]) = y[n] + h F(θ_n, y[n]),   n = 0..N-1
    logits = closing(y[N]),   L = loss(logits, labels)

Sequential backprop (the discrete adjoint, run backwards)::

    λ[N] = ∂L/∂y[N] = closing'ᵀ ∂L/∂logits
    λ[n] = Φ_n'(y[n])ᵀ λ[n+1],   ∂L/∂θ_n = (∂Φ_n/∂θ_n)ᵀ λ[n+1]
    ∂L/∂x = opening'ᵀ λ[0]

Parameters are one flat dict of named arrays: ``opening.W``, ``closing.b``, and the step
parameters stacked over layers, ``steps.W`` of shape (N, ...), so a layer's weights are the
view ``steps.W[n]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .backends import Backend, get_backend
from .backends.reference import array_namespace
from .layers.init import check_positive_int

Params = dict[str, Any]

GROUPS = ("opening", "steps", "closing")


@dataclass(frozen=True)
class Network:
    """Opening layer, ``n_layers`` ODE steps of kind ``step`` over ``[0, T]``, closing layer."""

    opening: Any
    step: Any
    closing: Any
    n_layers: int
    T: float = 1.0

    def __post_init__(self):
        check_positive_int("n_layers", self.n_layers)
        if not (np.isfinite(self.T) and self.T > 0):
            raise ValueError(f"`T` must be a positive finite number, got {self.T!r}.")
        if tuple(self.opening.out_shape) != tuple(self.step.state_shape):
            raise ValueError(
                f"opening output shape {self.opening.out_shape} does not match the step state "
                f"shape {self.step.state_shape}."
            )
        closing_in = getattr(self.closing, "in_shape", None)
        if closing_in is not None and tuple(closing_in) != tuple(self.step.state_shape):
            raise ValueError(
                f"closing input shape {tuple(closing_in)} does not match the step state "
                f"shape {self.step.state_shape}."
            )

    @property
    def h(self) -> float:
        """Layer step size h = T / N."""
        return self.T / self.n_layers


# ----------------------------------------------------------------------------- parameters
def init_params(net: Network, seed: int | np.random.Generator = 0, dtype=np.float64) -> Params:
    """Initial weights (PyTorch's fan-in uniform rule) as a flat dict of named host arrays."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    params: Params = {}
    for name, value in net.opening.init(rng, dtype).items():
        params[f"opening.{name}"] = value
    per_layer = [net.step.init(rng, dtype) for _ in range(net.n_layers)]
    for name in per_layer[0]:
        params[f"steps.{name}"] = np.stack([p[name] for p in per_layer])
    for name, value in net.closing.init(rng, dtype).items():
        params[f"closing.{name}"] = value
    return params


def group(params: Params, prefix: str) -> dict[str, Any]:
    """The parameters of one group (``opening``, ``steps``, ``closing``) without the prefix."""
    head = prefix + "."
    return {k[len(head) :]: v for k, v in params.items() if k.startswith(head)}


def layer_params(steps: dict[str, Any], n: int) -> dict[str, Any]:
    """Layer n's weights as views into the stacked step parameters."""
    return {k: v[n] for k, v in steps.items()}


def to_backend(params: Params, bk: Backend | str) -> Params:
    bk = get_backend(bk)
    return {k: bk.asarray(v) for k, v in params.items()}


def zeros_like_params(params: Params, bk: Backend | str = "numpy") -> Params:
    bk = get_backend(bk)
    return {k: bk.xp.zeros_like(v) for k, v in params.items()}


# ----------------------------------------------------------------------------- checks
def check_batch(net: Network, x, labels=None) -> None:
    """Validate a batch: shape (B, *opening.in_shape), finite values, labels in range."""
    shape = tuple(net.opening.in_shape)
    if getattr(x, "ndim", None) != len(shape) + 1 or tuple(x.shape[1:]) != shape:
        raise ValueError(f"`x` must have shape (batch, {', '.join(map(str, shape))}), "
                         f"got {getattr(x, 'shape', type(x).__name__)}.")
    if x.shape[0] < 1:
        raise ValueError("`x` must hold at least one sample.")
    if x.dtype.kind in "fc" and not bool(array_namespace(x).isfinite(x).all()):
        raise ValueError("`x` must be finite, got NaN or infinite values.")
    if labels is not None:
        if getattr(labels, "shape", None) != (x.shape[0],):
            raise ValueError(f"`labels` must have shape ({x.shape[0]},), "
                             f"got {getattr(labels, 'shape', None)}.")
        if labels.dtype.kind not in "iu":
            raise TypeError(f"`labels` must be integer class indices, got dtype {labels.dtype}.")
        n_classes = net.closing.out_shape[0]
        if int(labels.min()) < 0 or int(labels.max()) >= n_classes:
            raise ValueError(f"`labels` must lie in [0, {n_classes}), got range "
                             f"[{int(labels.min())}, {int(labels.max())}].")


# ----------------------------------------------------------------------------- sequential
def forward(net: Network, params: Params, x, bk: Backend | str = "numpy", keep=True):
    """Sequential forward pass.

    Returns (logits, states, caches): states[n] = y[n] for n = 0..N and caches = (opening
    cache, [step caches], closing cache) when ``keep``; otherwise only y[N] and no step caches.
    """
    bk = get_backend(bk)
    y, open_cache = net.opening.forward(group(params, "opening"), x, bk)
    steps = group(params, "steps")
    states, step_caches = [y], []
    for n in range(net.n_layers):
        y, cache = net.step.forward(layer_params(steps, n), y, net.h, bk)
        if keep:
            states.append(y)
            step_caches.append(cache)
    if not keep:
        states = [y]
    logits, close_cache = net.closing.forward(group(params, "closing"), y, bk)
    return logits, states, (open_cache, step_caches, close_cache)


def loss_and_logits(net: Network, params: Params, x, labels, bk: Backend | str = "numpy"):
    bk = get_backend(bk)
    logits, _, _ = forward(net, params, x, bk, keep=False)
    loss, _ = bk.softmax_cross_entropy(logits, labels)
    return float(loss), logits


def backprop(net: Network, params: Params, x, labels, bk: Backend | str = "numpy"):
    """Loss and its gradient by sequential backprop (the exact discrete adjoint).

    Returns (loss, grads, info) with grads keyed like params and ``info`` holding the
    logits, the forward states y[0..N] and the adjoints λ[0..N].
    """
    bk = get_backend(bk)
    check_batch(net, x, labels)
    logits, states, (open_cache, step_caches, close_cache) = forward(net, params, x, bk)
    loss, probs = bk.softmax_cross_entropy(logits, labels)
    dlogits = bk.softmax_cross_entropy_adjoint(probs, labels, 1.0)
    lam, dclose = net.closing.adjoint(group(params, "closing"), close_cache, dlogits, bk)
    grads = {f"closing.{k}": v for k, v in dclose.items()}
    steps = group(params, "steps")
    dsteps = {k: bk.xp.zeros_like(v) for k, v in steps.items()}
    adjoints = [None] * (net.n_layers + 1)
    adjoints[net.n_layers] = lam
    for n in reversed(range(net.n_layers)):
        theta = layer_params(steps, n)
        lam, dtheta = net.step.adjoint(theta, step_caches[n], lam, net.h, bk)
        adjoints[n] = lam
        for k, v in dtheta.items():
            dsteps[k][n] = v
    grads.update({f"steps.{k}": v for k, v in dsteps.items()})
    _, dopen = net.opening.adjoint(group(params, "opening"), open_cache, lam, bk)
    grads.update({f"opening.{k}": v for k, v in dopen.items()})
    info = {"logits": logits, "states": states, "adjoints": adjoints}
    return float(loss), {k: grads[k] for k in params}, info
