"""Multilevel training in depth: nested initialisation and MG/Opt (docs/coarsening.md).

A network with N layers over [0, T] has layer n at time t_n = n·h (h = T/N); a coarser one
has N_c = N/r layers with step r·h. Weights move between them in depth (only the weights
stacked over layers: ``steps.*``, or ``stage{s}.*`` of each stage of a staged network, each
stage on its own [0, T] with n_s → n_s/r layers; the opening, transition and closing weights
are shared, transfer = identity) with

    P (N × N_c)  interpolation in t:
                 'constant':  θ[n] = θ_c[⌊n/r⌋]
                 'linear':    θ[n] = (1 − w) θ_c[j] + w θ_c[j+1],  j = ⌊n/r⌋, w = n/r − j
                              (θ_c[N_c] := θ_c[N_c − 1])
    R (N_c × N)  restriction of weights: the average of the r layers of a coarse interval
                 (R P = I for 'constant')
    Pᵀ           restriction of gradients (the gradient of θ_c ↦ f(P θ_c) is Pᵀ ∇f)

Nested initialisation: train N/r^k layers, ``θ ← P θ`` to the next depth, train, … up to N.

MG/Opt (Nash 2000; Cyr, Günther, Schroder 2019 for layer-parallel training), one cycle on
level ℓ for ψ_ℓ(θ) = f_ℓ(θ) − v_ℓᵀθ (v_0 = 0, f_ℓ the loss of the level-ℓ network on the
cycle's batch)::

    ν₁ smoothing steps  θ ← θ − η ∇ψ_ℓ(θ)           (the layer-parallel gradient step)
    θ_c = R θ;   v_{ℓ+1} = ∇f_{ℓ+1}(θ_c) − Pᵀ ∇ψ_ℓ(θ)   (first-order coherence)
    θ_c⁺ = cycle on ℓ+1 from θ_c (coarsest: ``coarse_steps`` smoothing steps)
    θ ← θ + β P(θ_c⁺ − θ_c),  β the first of 1, ½, ¼ that lowers ψ_ℓ (else 0)
    ν₂ smoothing steps

so the corrected coarse objective is first-order coherent: ∇ψ_{ℓ+1}(R θ) = Pᵀ ∇ψ_ℓ(θ)
(tests/test_multilevel.py checks it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..network import Network

Params = dict[str, Any]
#: gradient(params, x, labels) -> (loss, grads, stats), as training.gradients' functions
GradientFn = Callable[[Params, Any, Any], tuple]
INTERPOLATIONS = ("constant", "linear")
STEP_SIZES = (1.0, 0.5, 0.25)  # line search on the coarse correction


def _check_depths(n_fine: int, n_coarse: int) -> int:
    if n_coarse < 1 or n_fine % n_coarse:
        raise ValueError(f"`n_layers`={n_fine} must be a multiple of the coarse depth "
                         f"{n_coarse} (use a depth divisible by the coarsening factor).")
    return n_fine // n_coarse


def interpolation_matrix(n_coarse: int, n_fine: int, kind: str = "constant") -> np.ndarray:
    """P (n_fine × n_coarse): weights from the coarse to the fine depth (module docstring)."""
    if kind not in INTERPOLATIONS:
        raise ValueError(f"`interpolation` must be one of {INTERPOLATIONS}, got {kind!r}.")
    r = _check_depths(n_fine, n_coarse)
    P = np.zeros((n_fine, n_coarse))
    for n in range(n_fine):
        j, w = divmod(n, r)
        w = w / r if kind == "linear" else 0.0
        P[n, j] += 1.0 - w
        P[n, min(j + 1, n_coarse - 1)] += w
    return P


def restriction_matrix(n_fine: int, n_coarse: int) -> np.ndarray:
    """R (n_coarse × n_fine): each coarse layer the average of its r fine layers."""
    r = _check_depths(n_fine, n_coarse)
    return np.kron(np.eye(n_coarse), np.full((1, r), 1.0 / r))


def depth_groups(params: Params) -> dict[str, int]:
    """The stacked-over-layers groups of ``params``: {key prefix: number of layers}.

    ``steps.`` for a plain network (N layers); ``stage{s}.`` for each stage of a staged
    network (n_s layers; its batch-norm running statistics share the prefix). Everything else
    (opening, transitions, closing) is not stacked in depth and moves unchanged."""
    groups: dict[str, int] = {}
    for k, v in params.items():
        prefix = _group_of(k)
        if prefix is not None:
            groups.setdefault(prefix, int(np.shape(v)[0]))
    if not groups:
        raise ValueError("`params` holds no weights stacked over layers (`steps.*` or "
                         "`stage{s}.*`): nothing to move in depth.")
    return groups


def _group_of(key: str) -> str | None:
    if key.startswith("steps."):
        return "steps."
    head, dot, _ = key.partition(".")
    if dot and head.startswith("stage") and head[5:].isdigit():
        return head + "."
    return None


def _apply_depth(matrix: Callable[[int], np.ndarray], params: Params) -> Params:
    """``matrix(n_g)`` along the layer axis of every array of each depth group (n_g layers);
    other entries copied."""
    out = {}
    for k, v in params.items():
        prefix = _group_of(k)
        if prefix is not None:
            M = matrix(int(np.shape(v)[0]))
            out[k] = np.tensordot(M, np.asarray(v), axes=(1, 0)).astype(v.dtype)
        else:
            out[k] = np.array(v, copy=True)
    return out


def _ratio(n_from: int, n_to: int, what: str) -> int:
    """The depth factor between the totals ``n_from`` and ``n_to`` (the larger / smaller)."""
    big, small = max(n_from, n_to), min(n_from, n_to)
    if small < 1 or big % small:
        raise ValueError(f"`{what}`={n_to} and the weights' {n_from} layers are not "
                         f"multiples of each other.")
    return big // small


def prolong_weights(params: Params, n_fine: int, kind: str = "constant") -> Params:
    """``P θ``: the coarse network's weights interpolated in t to ``n_fine`` layers in all
    (each depth group, e.g. each stage, on its own [0, T]: n_g → r n_g layers)."""
    r = _ratio(sum(depth_groups(params).values()), n_fine, "n_fine")
    return _apply_depth(lambda n: interpolation_matrix(n, r * n, kind), params)


def restrict_weights(params: Params, n_coarse: int) -> Params:
    """``R θ``: layer averages over each coarse interval (per depth group)."""
    r = _ratio(sum(depth_groups(params).values()), n_coarse, "n_coarse")
    return _apply_depth(lambda n: restriction_matrix(n, n // r), params)


def restrict_gradient(grads: Params, n_coarse: int, kind: str = "constant") -> Params:
    """``Pᵀ g``: the gradient of ``θ_c ↦ f(P θ_c)`` from the fine gradient ``g``."""
    r = _ratio(sum(depth_groups(grads).values()), n_coarse, "n_coarse")
    return _apply_depth(lambda n: interpolation_matrix(n // r, n, kind).T, grads)


def coarser_network(net, factor: int):
    """The same network with ``n_layers / factor`` layers over the same [0, T]; for a staged
    model (conv-stages) every stage ``n_s / factor`` layers
    (:func:`refbraid.stages.depth.coarser_model`)."""
    if not isinstance(net, Network):
        from ..stages.depth import coarser_model

        return coarser_model(net, factor)
    _check_depths(net.n_layers, net.n_layers // factor if factor > 0 else 0)
    return replace(net, n_layers=net.n_layers // factor)


# ----------------------------------------------------------------------------- MG/Opt
@dataclass(frozen=True)
class MGOptSettings:
    """One MG/Opt cycle per batch (module docstring).

    levels         depth levels (2: N and N/factor layers)
    factor         layers per coarse layer between levels
    lr             smoothing step size η (plain gradient descent on ψ_ℓ)
    pre, post      smoothing steps ν₁, ν₂ on every level but the coarsest
    coarse_steps   smoothing steps on the coarsest level
    interpolation  'constant' or 'linear' P in depth
    """

    levels: int = 2
    factor: int = 2
    lr: float = 0.1
    pre: int = 1
    post: int = 1
    coarse_steps: int = 2
    interpolation: str = "constant"

    def __post_init__(self):
        for name in ("levels", "factor", "pre", "post", "coarse_steps"):
            v = getattr(self, name)
            lo = 2 if name in ("levels", "factor") else 0
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"`{name}` must be an integer >= {lo}, got {v!r}.")
        if not self.lr > 0:
            raise ValueError(f"`lr` must be > 0, got {self.lr!r}.")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"`interpolation` must be one of {INTERPOLATIONS}, "
                             f"got {self.interpolation!r}.")


def _axpy(params: Params, a: float, d: Params) -> Params:
    return {k: params[k] + a * d[k] for k in params}


def _dot(v: Params, params: Params) -> float:
    return float(sum(np.vdot(v[k], params[k]) for k in v))


def corrected_objective(gradient: GradientFn, v: Params | None):
    """ψ(θ) = f(θ) − vᵀθ and its gradient ∇f(θ) − v, from f's ``gradient`` function."""
    def psi(params, x, labels):
        loss, grads, stats = gradient(params, x, labels)
        if v is None:
            return loss, grads, stats
        return loss - _dot(v, params), {k: grads[k] - v[k] for k in grads}, stats
    return psi


@dataclass
class MGOpt:
    """MG/Opt over the depth hierarchy ``nets[0]`` (N layers) … ``nets[-1]`` (coarsest), with
    one gradient function per level (e.g. :func:`~refbraid.training.gradients.mgrit_gradient`)
    and optionally one loss function per level ``loss(params, x, labels) -> float`` for the
    line search (a forward pass only; default: the gradient function's loss)."""

    nets: list[Network]
    gradients: list[GradientFn]
    settings: MGOptSettings
    losses: list[Callable] | None = None

    @classmethod
    def build(cls, net: Network, make_gradient: Callable[[Network], GradientFn],
              settings: MGOptSettings, make_loss: Callable | None = None) -> MGOpt:
        nets = [net]
        for _ in range(settings.levels - 1):
            nets.append(coarser_network(nets[-1], settings.factor))
        losses = [make_loss(n) for n in nets] if make_loss is not None else None
        return cls(nets, [make_gradient(n) for n in nets], settings, losses)

    def objective(self, level: int, params: Params, x, labels, v: Params | None) -> float:
        """ψ_ℓ(θ) = f_ℓ(θ) − vᵀθ (a forward pass when loss functions were given)."""
        if self.losses is None:
            return float(corrected_objective(self.gradients[level], v)(params, x, labels)[0])
        f = float(self.losses[level](params, x, labels))
        return f if v is None else f - _dot(v, params)

    def coarse_correction_term(self, level: int, params: Params, fine_grad: Params, x, labels
                               ) -> tuple[Params, Params]:
        """(θ_c = R θ, v_{ℓ+1} = ∇f_{ℓ+1}(θ_c) − Pᵀ ∇ψ_ℓ(θ))."""
        n_c = self.nets[level + 1].n_layers
        theta_c = restrict_weights(params, n_c)
        _, g_c, _ = self.gradients[level + 1](theta_c, x, labels)
        rg = restrict_gradient(fine_grad, n_c, self.settings.interpolation)
        return theta_c, {k: g_c[k] - rg[k] for k in g_c}

    def cycle(self, params: Params, x, labels, level: int = 0, v: Params | None = None
              ) -> tuple[Params, dict[str, Any]]:
        """One MG/Opt cycle on ``level`` for ψ = f − vᵀθ; returns (new params, info)."""
        s = self.settings
        psi = corrected_objective(self.gradients[level], v)
        info: dict[str, Any] = {"gradient_calls": 0, "loss_calls": 0}

        def smooth(p, n):
            loss = None
            for _ in range(n):
                loss, g, _ = psi(p, x, labels)
                info["gradient_calls"] += 1
                p = _axpy(p, -s.lr, g)
            return p, loss

        if level == len(self.nets) - 1:
            params, _ = smooth(params, s.coarse_steps)
            return params, info
        params, _ = smooth(params, s.pre)
        loss, g, _ = psi(params, x, labels)
        theta_c, v_c = self.coarse_correction_term(level, params, g, x, labels)
        info["gradient_calls"] += 2
        theta_new, sub = self.cycle(theta_c, x, labels, level + 1, v_c)
        info["gradient_calls"] += sub["gradient_calls"]
        info["loss_calls"] += sub["loss_calls"]
        step = prolong_weights({k: theta_new[k] - theta_c[k] for k in theta_c},
                               self.nets[level].n_layers, s.interpolation)
        info["beta"] = 0.0
        for beta in STEP_SIZES:
            trial = _axpy(params, beta, step)
            trial_loss = self.objective(level, trial, x, labels, v)
            info["gradient_calls" if self.losses is None else "loss_calls"] += 1
            if trial_loss < loss:
                params, info["beta"] = trial, beta
                break
        params, _ = smooth(params, s.post)
        return params, info
