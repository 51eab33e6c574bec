"""Optimizers that update the flat params dict in place, as ``torch.optim.SGD`` / ``Adam``.

SGD with momentum μ, dampening τ, weight decay λ (torch's convention, buffer b)::

    g ← ∇θ + λ θ
    b ← g                    at the first step,   b ← μ b + (1 − τ) g   afterwards  (μ > 0)
    g ← g + μ b  (Nesterov)  or   g ← b                                               (μ > 0)
    θ ← θ − η g

Adam (Kingma & Ba 2015, torch's arrangement of the bias corrections), step t = 1, 2, …::

    g ← ∇θ + λ θ
    m ← β1 m + (1 − β1) g,        v ← β2 v + (1 − β2) g²
    θ ← θ − (η / (1 − β1^t)) · m / (√v / √(1 − β2^t) + ε)

State is a flat dict of arrays (``step`` and one buffer per parameter, keyed
``"<buffer>/<param name>"``), so a checkpoint can store it as it is. Arrays keep the type
(NumPy or CuPy) and dtype of the parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..backends.dtypes import dtype_kind, numpy_dtype
from ..backends.host import first_non_finite, to_host
from ..backends.reference import array_namespace
from ..layers.init import NonFiniteError

Params = dict[str, Any]
OPTIMIZERS = ("sgd", "adam")


def _check_number(name: str, value, lo: float, hi: float = math.inf, lo_open=False,
                  hi_open=False) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if ok:
        v = float(value)
        above = v > lo if lo_open else v >= lo
        below = v < hi if hi_open else v <= hi
        ok = math.isfinite(v) and above and below
    if not ok:
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise ValueError(f"`{name}` must be a finite number in {interval}, got {value!r}.")
    return float(value)


def _check_grads(params: Params, grads: Params) -> None:
    """Raise unless ``grads`` has the keys and shapes of ``params`` and finite values (one
    isfinite pass: under 1 % of a backprop step on the default network)."""
    if set(grads) != set(params):
        missing, extra = sorted(set(params) - set(grads)), sorted(set(grads) - set(params))
        raise ValueError(f"`grads` must have the keys of `params`; missing {missing}, "
                         f"unexpected {extra}.")
    for k, p in params.items():
        g = grads[k]
        if not hasattr(g, "shape") or not hasattr(g, "dtype"):
            raise TypeError(f"`grads[{k!r}]` must be an array, got {type(g).__name__}.")
        if tuple(g.shape) != tuple(p.shape):
            raise ValueError(f"`grads[{k!r}]` has shape {tuple(g.shape)}, the parameter "
                             f"has {tuple(p.shape)}.")
    bad = first_non_finite((k, g) for k, g in grads.items() if dtype_kind(g.dtype) in "fc")
    if bad is not None:  # one copy to the host for every gradient's flag
        raise NonFiniteError(f"`grads[{bad!r}]` must be finite, got NaN or infinite "
                             f"values; the step was not applied.")


class Optimizer:
    """Base class: ``step(params, grads)`` updates params in place; state as a dict of arrays."""

    name = "optimizer"
    buffers: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.state: dict[str, Any] = {"step": np.array(0, dtype=np.int64)}

    @property
    def t(self) -> int:
        """Number of steps taken."""
        return int(self.state["step"])

    def hyper(self) -> dict[str, Any]:
        """The hyper-parameters, as plain numbers (for logs and checkpoints)."""
        raise NotImplementedError

    def step(self, params: Params, grads: Params) -> None:
        """θ ← update(θ, ∇θ) for every parameter, in place."""
        _check_grads(params, grads)
        self.state["step"] = np.array(self.t + 1, dtype=np.int64)
        for k, p in params.items():
            self._update(k, p, grads[k])

    def _update(self, key: str, p, grad) -> None:
        raise NotImplementedError

    def required_buffers(self) -> tuple[str, ...]:
        """The buffers every parameter has once a step has been taken."""
        return self.buffers

    def _buffer(self, buf: str, key: str, p):
        name = f"{buf}/{key}"
        if name not in self.state:
            self.state[name] = array_namespace(p).zeros_like(p)
        return self.state[name]

    def state_dict(self) -> dict[str, np.ndarray]:
        """A host (NumPy) copy of the state: ``step`` and the per-parameter buffers."""
        return {k: np.array(to_host(v), copy=True) for k, v in self.state.items()}

    def load_state_dict(self, state: dict[str, np.ndarray], params: Params,
                        asarray: Callable[[np.ndarray], Any] | None = None) -> None:
        """Restore a :meth:`state_dict` with buffers in the dtype of ``params``;
        ``asarray`` moves a host array to the parameters' device (e.g. ``Backend.asarray``)."""
        if "step" not in state:
            raise ValueError(f"{self.name} state has no 'step' entry; keys: {sorted(state)}.")
        new: dict[str, Any] = {"step": np.array(int(state["step"]), dtype=np.int64)}
        for name, value in state.items():
            if name == "step":
                continue
            buf, _, key = name.partition("/")
            if buf not in self.buffers or key not in params:
                raise ValueError(f"{self.name} state entry {name!r} does not match this "
                                 f"optimizer/parameters.")
            p = params[key]
            if tuple(value.shape) != tuple(p.shape):
                raise ValueError(f"{self.name} state entry {name!r} has shape {value.shape}, "
                                 f"the parameter has {tuple(p.shape)}.")
            host = np.array(value, dtype=numpy_dtype(p.dtype), copy=True)
            new[name] = asarray(host) if asarray is not None else host
        if int(state["step"]) > 0:  # every buffer exists after the first step: none may lack
            missing = [f"{b}/{k}" for b in self.required_buffers() for k in params
                       if f"{b}/{k}" not in state]
            if missing:
                raise ValueError(f"{self.name} state after {int(state['step'])} steps is "
                                 f"incomplete: it lacks {missing}.")
        self.state = new


class SGD(Optimizer):
    """Stochastic gradient descent with (Nesterov) momentum, as ``torch.optim.SGD``."""

    name = "sgd"
    buffers = ("momentum_buffer",)

    def __init__(self, lr: float, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False) -> None:
        super().__init__()
        self.lr = _check_number("lr", lr, 0.0, lo_open=True)
        self.momentum = _check_number("momentum", momentum, 0.0, 1.0, hi_open=True)
        self.dampening = _check_number("dampening", dampening, 0.0, 1.0)
        self.weight_decay = _check_number("weight_decay", weight_decay, 0.0)
        if nesterov and (self.momentum == 0.0 or self.dampening != 0.0):
            raise ValueError("`nesterov` needs `momentum` > 0 and `dampening` = 0.")
        self.nesterov = bool(nesterov)

    def hyper(self) -> dict[str, Any]:
        return {"lr": self.lr, "momentum": self.momentum, "dampening": self.dampening,
                "weight_decay": self.weight_decay, "nesterov": self.nesterov}

    def required_buffers(self) -> tuple[str, ...]:
        return self.buffers if self.momentum else ()

    def _update(self, key, p, grad) -> None:
        g = grad + self.weight_decay * p if self.weight_decay else grad
        if self.momentum:
            name = f"momentum_buffer/{key}"
            if name not in self.state:  # first step: b = g
                self.state[name] = array_namespace(p).astype(g, p.dtype, copy=True)
            else:
                b = self.state[name]
                b *= self.momentum
                b += (1.0 - self.dampening) * g
            b = self.state[name]
            g = g + self.momentum * b if self.nesterov else b
        p -= self.lr * g


class Adam(Optimizer):
    """Adam, as ``torch.optim.Adam`` (no amsgrad)."""

    name = "adam"
    buffers = ("exp_avg", "exp_avg_sq")

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        super().__init__()
        self.lr = _check_number("lr", lr, 0.0, lo_open=True)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"`betas` must be a pair (beta1, beta2), got {betas!r}.")
        self.beta1 = _check_number("betas[0]", betas[0], 0.0, 1.0, hi_open=True)
        self.beta2 = _check_number("betas[1]", betas[1], 0.0, 1.0, hi_open=True)
        self.eps = _check_number("eps", eps, 0.0, lo_open=True)
        self.weight_decay = _check_number("weight_decay", weight_decay, 0.0)

    def hyper(self) -> dict[str, Any]:
        return {"lr": self.lr, "betas": [self.beta1, self.beta2], "eps": self.eps,
                "weight_decay": self.weight_decay}

    def _update(self, key, p, grad) -> None:
        xp = array_namespace(p)
        g = grad + self.weight_decay * p if self.weight_decay else grad
        m = self._buffer("exp_avg", key, p)
        v = self._buffer("exp_avg_sq", key, p)
        m *= self.beta1
        m += (1.0 - self.beta1) * g
        v *= self.beta2
        v += (1.0 - self.beta2) * (g * g)
        t = self.t
        step_size = self.lr / (1.0 - self.beta1**t)
        denom = xp.sqrt(v) / math.sqrt(1.0 - self.beta2**t) + self.eps
        p -= step_size * (m / denom)


def make_optimizer(name: str, lr: float, momentum: float = 0.0, **kwargs) -> Optimizer:
    """The optimizer called ``name`` (``sgd`` or ``adam``); ``momentum`` is SGD's μ."""
    if name == "sgd":
        return SGD(lr, momentum=momentum, **kwargs)
    if name == "adam":
        return Adam(lr, **kwargs)
    raise ValueError(f"`optimizer` must be one of {OPTIMIZERS}, got {name!r}.")
