"""A mixed ("staged") network: opening → stages of ODE steps separated by shape-changing
transitions → closing, as one time grid for MGRIT (TorchBraid's ``layer_blocks``).

Fine grid: stage s has n_s ODE steps with ``h_s = T / n_s``; transition s sits between stage s
and s+1 and is ONE fine step (no step size). With N = Σ n_s + #transitions fine steps::

    y[0] = opening(x)
    y[i+1] = y[i] + h_s F(θ_{s,j}, y[i])      if step i is layer j of stage s
    y[i+1] = T_s(τ_s, y[i])                   if step i is transition s
    logits = closing(y[N])

so the state shape S_i changes at transitions (:attr:`StagedNetwork.state_shapes`).

Coarse step over fine steps a..b-1 (the rule MGRIT's coarse levels use; transitions need
not be C-points): split [a, b) at transitions; each transition is applied exactly, each run
of k ODE steps of stage s starting at fine step c is ONE Euler step
``y + k h_s F(θ_{s, layer(c)}, y)`` (the coarse step of :mod:`refbraid.layer_parallel`, with
the weights of the run's first layer). For b = a + 1 this is the fine step, so converged
MGRIT reproduces the sequential network whatever the coarse rule.

Parameters: ``opening.*``, ``stage{s}.*`` stacked over the stage's layers (n_s, ...),
``transition{s}.*``, ``closing.*``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ..backends import Backend, get_backend
from ..backends.host import host_float
from ..layers.init import check_positive_int
from ..network import Params, group, layer_params, set_row
from ..network import row as row_of
from .transitions import transition_at


def transition_out_shape(transition, shape: tuple[int, ...], stage: int) -> tuple[int, ...]:
    """The state shape after ``transition`` (a plain layer whose ``in_shape`` is ``shape``)."""
    if tuple(getattr(transition, "in_shape", ())) != tuple(shape):
        raise ValueError(f"`transitions[{stage}]` takes states of shape "
                         f"{tuple(getattr(transition, 'in_shape', ()))}, but stage {stage} "
                         f"ends with shape {tuple(shape)}.")
    return tuple(transition.out_shape)


@dataclass(frozen=True)
class Stage:
    """``n_layers`` ODE steps of kind ``step`` (forward(θ, y, h, bk), adjoint, init)."""

    step: Any
    n_layers: int

    def __post_init__(self):
        check_positive_int("n_layers", self.n_layers)


@dataclass(frozen=True)
class FineStep:
    """What fine step i is: layer ``layer`` of stage ``stage``, or transition ``stage``."""

    kind: str  # 'ode' | 'transition'
    stage: int
    layer: int = 0


@dataclass(frozen=True, eq=False)
class StagedNetwork:
    """Opening, stages of ODE steps with transitions between them, closing (module doc)."""

    opening: Any
    stages: tuple[Stage, ...]
    transitions: tuple[Any, ...]
    closing: Any
    T: float = 1.0

    def __post_init__(self):
        if not self.stages:
            raise ValueError("`stages` must hold at least one Stage.")
        if len(self.transitions) != len(self.stages) - 1:
            raise ValueError(f"`transitions` must have len(stages) - 1 = "
                             f"{len(self.stages) - 1} entries, got {len(self.transitions)}.")
        first = 0
        for s, stage in enumerate(self.stages):
            want = getattr(stage.step, "state_shape", None)
            if want is not None and tuple(want) != self.state_shapes[first]:
                raise ValueError(f"`stages[{s}]` steps states of shape {tuple(want)}, but the "
                                 f"state entering stage {s} has shape "
                                 f"{self.state_shapes[first]}.")
            first += stage.n_layers + 1
        if tuple(self.state_shapes[-1]) != tuple(self.closing.in_shape):
            raise ValueError(f"`closing` expects states of shape {self.closing.in_shape}, the "
                             f"last stage has {self.state_shapes[-1]}.")

    @cached_property
    def fine_steps(self) -> tuple[FineStep, ...]:
        out = []
        for s, stage in enumerate(self.stages):
            out += [FineStep("ode", s, j) for j in range(stage.n_layers)]
            if s < len(self.transitions):
                out.append(FineStep("transition", s))
        return tuple(out)

    @property
    def n_steps(self) -> int:
        return len(self.fine_steps)

    @cached_property
    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        """S_i for i = 0..N (per sample, without the batch axis)."""
        shapes = [tuple(self.opening.out_shape)]
        for fs in self.fine_steps:
            shape = shapes[-1]
            if fs.kind == "transition":
                shape = transition_out_shape(self.transitions[fs.stage], shape, fs.stage)
            shapes.append(shape)
        return tuple(shapes)

    @cached_property
    def point_stage(self) -> tuple[int, ...]:
        """The stage whose shape state i (i = 0..N) has: transitions passed before i."""
        out, stage = [0], 0
        for fs in self.fine_steps:
            stage += fs.kind == "transition"
            out.append(stage)
        return tuple(out)

    def h(self, stage: int) -> float:
        return self.T / self.stages[stage].n_layers

    def segments(self, a: int, b: int) -> list[tuple[FineStep, int]]:
        """The coarse step a → b as pieces (first fine step, number of fine steps)."""
        pieces: list[tuple[FineStep, int]] = []
        for fs in self.fine_steps[a:b]:
            last = pieces[-1] if pieces else None
            if (fs.kind == "ode" and last is not None and last[0].kind == "ode"
                    and last[0].stage == fs.stage):
                pieces[-1] = (last[0], last[1] + 1)
            else:
                pieces.append((fs, 1))
        return pieces


def init_params(net: StagedNetwork, seed: int | np.random.Generator = 0,
                dtype=np.float64) -> Params:
    """Initial weights as a flat dict of named host arrays (module docstring's names)."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    params: Params = {f"opening.{k}": v for k, v in net.opening.init(rng, dtype).items()}
    for s, stage in enumerate(net.stages):
        per_layer = [stage.step.init(rng, dtype) for _ in range(stage.n_layers)]
        for k in per_layer[0]:
            params[f"stage{s}.{k}"] = np.stack([p[k] for p in per_layer])
        if s < len(net.transitions):
            for k, v in net.transitions[s].init(rng, dtype).items():
                params[f"transition{s}.{k}"] = v
    params.update({f"closing.{k}": v for k, v in net.closing.init(rng, dtype).items()})
    return params


# ----------------------------------------------------------------------------- one piece
def piece_forward(net: StagedNetwork, params: Params, piece, y, bk: Backend):
    """One piece of a (coarse or fine) step: a transition, or k ODE steps as one Euler step."""
    fs, k = piece
    if fs.kind == "transition":  # rebuilt for the maps it gets (smaller on a coarse level)
        layer = transition_at(net.transitions[fs.stage], y.shape[1:])
        y_next, cache = layer.forward(group(params, f"transition{fs.stage}"), y, bk)
        return y_next, (layer, cache)
    theta = layer_params(group(params, f"stage{fs.stage}"), fs.layer)
    return net.stages[fs.stage].step.forward(theta, y, k * net.h(fs.stage), bk)


def piece_adjoint(net: StagedNetwork, params: Params, piece, cache, lam, bk: Backend,
                  grads: bool):
    """Adjoint of :func:`piece_forward`: (λ before the piece, {param name: (row, dθ)})."""
    fs, k = piece
    if fs.kind == "transition":
        name, (layer, cache) = f"transition{fs.stage}", cache
        lam, d = layer.adjoint(group(params, name), cache, lam, bk)
        return lam, ({f"{name}.{n}": (None, v) for n, v in d.items()} if grads else {})
    theta = layer_params(group(params, f"stage{fs.stage}"), fs.layer)
    lam, d = net.stages[fs.stage].step.adjoint(theta, cache, lam, k * net.h(fs.stage), bk,
                                                grads=grads)
    return lam, ({f"stage{fs.stage}.{n}": (fs.layer, v) for n, v in d.items()} if grads else {})


def accumulate(grads: Params, parts: dict) -> None:
    """Add ``{name: (row or None, value)}`` into the gradient dict (rows of stacked params)."""
    for name, (row, v) in parts.items():
        if row is None:
            grads[name] = grads[name] + v
        else:
            set_row(grads[name], row, row_of(grads[name], row) + v)


# ----------------------------------------------------------------------------- sequential
def forward(net: StagedNetwork, params: Params, x, bk: Backend | str = "numpy"):
    """Sequential forward pass: (logits, states y[0..N], (opening, [step], closing caches))."""
    bk = get_backend(bk)
    y, open_cache = net.opening.forward(group(params, "opening"), x, bk)
    states, caches = [y], []
    for fs in net.fine_steps:
        y, cache = piece_forward(net, params, (fs, 1), y, bk)
        states.append(y)
        caches.append(cache)
    logits, close_cache = net.closing.forward(group(params, "closing"), y, bk)
    return logits, states, (open_cache, caches, close_cache)


def backprop(net: StagedNetwork, params: Params, x, labels, bk: Backend | str = "numpy"):
    """Loss and gradient by sequential backprop; info holds logits, states, adjoints and the
    fine-step caches (``caches[i]``: where a BN layer's batch statistics are read)."""
    bk = get_backend(bk)
    logits, states, (open_cache, caches, close_cache) = forward(net, params, x, bk)
    loss, probs = bk.softmax_cross_entropy(logits, labels)
    dlogits = bk.softmax_cross_entropy_adjoint(probs, labels, 1.0)
    lam, dclose = net.closing.adjoint(group(params, "closing"), close_cache, dlogits, bk)
    grads = {k: bk.xp.zeros_like(v) for k, v in params.items()}
    grads.update({f"closing.{k}": v for k, v in dclose.items()})
    adjoints = [None] * (net.n_steps + 1)
    adjoints[-1] = lam
    for i in reversed(range(net.n_steps)):
        lam, parts = piece_adjoint(net, params, (net.fine_steps[i], 1), caches[i], lam, bk,
                                   grads=True)
        accumulate(grads, parts)
        adjoints[i] = lam
    _, dopen = net.opening.adjoint(group(params, "opening"), open_cache, lam, bk)
    grads.update({f"opening.{k}": v for k, v in dopen.items()})
    return host_float(loss), grads, {"logits": logits, "states": states, "adjoints": adjoints,
                                "caches": caches}
