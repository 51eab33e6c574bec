"""Layer-parallel gradient: MGRIT forward solve, MGRIT adjoint solve, gradient from the last.

The ODE block of a :class:`~refbraid.network.Network` is the time-stepping problem
(docs/references.md §1–2, TorchBraid's coarse levels)::

    forward   y[0] = opening(x),        y[i] = Φ(y[i-1]; i-1 → i)
              Φ(y; a → b) = y + (b − a)·h·F(θ_a, y)    (coarse: step (b−a)h, weights of layer a)
    adjoint   λ[N] = ∂L/∂y[N],          λ[i] = Ψ(λ[i+1]; i+1 → i)
              Ψ(λ; b → a) = Φ'(y[a]; a → b)ᵀ λ          (linearised at the forward state y[a])
    gradient  ∂L/∂θ_n = (∂Φ(y[n]; n → n+1)/∂θ_n)ᵀ λ[n+1],   n = 0..N-1

Both recurrences are solved by :func:`refbraid.mgrit.solve` (the adjoint on the reversed grid).
The gradient of layer n needs only ``y[n]`` and ``λ[n+1]``, and it is what the *fine* adjoint
step n+1 → n yields besides ``λ[n]`` (``step.adjoint(..., grads=True)``). The solve's last
relaxation on the finest level makes every fine step from the final iterate (F-relaxation into
the F-points, the residual's step into the C-points), so :class:`CapturingAdjoint` keeps the
gradient rows from it, linearised at the forward caches :class:`CachingForward` kept from the
forward solve's last relaxation: no extra pass over the layers, as TorchBraid takes its
gradient from the final relaxation. Since every layer uses the fine adjoint, a converged MGRIT
adjoint gives sequential backprop's gradient to round-off. With inexact solves, the gradient
is that of the approximate trajectory: the error ``refbraid verify --layer-parallel`` measures.

With one MGRIT level both solves are sequential substitutions and the result equals
:func:`refbraid.network.backprop` to round-off.

Where it sits: the layer-parallel peer of :mod:`refbraid.network`'s sequential backprop, and the
only place a network's steps meet MGRIT (the propagators turn layers into the step functions
:class:`refbraid.mgrit.Problem` takes). The sequence models (:mod:`refbraid.sequence`) and
training (:mod:`refbraid.training`) both build on it; it imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .backends import Backend, batched_sweeps_on, device_batching, get_backend
from .backends.host import host_float
from .layers.forward_into import adjoint_into, forward_into
from .mgrit import GradientWorkspace, MGRITResult, MGRITSettings, Problem, solve
from .mgrit.transfer import SpatialCoarsening, restrict_to_shape
from .network import (
    Network,
    Params,
    check_inputs,
    group,
    layer_params,
    layers_params,
    row,
    set_rows_from,
    stacked_rows,
)
from .relative_error import relative_gradient_error  # noqa: F401  (re-exported)
from .step_caches import cached_stacks, remember


def _default_forward() -> MGRITSettings:
    # TorchBraid's examples: 3 levels, cfactor 4, 2 forward iterations (skip + 1 cycle here).
    return MGRITSettings.torchbraid(max_iter=1)


def _default_backward() -> MGRITSettings:
    # ... and 1 backward iteration (the skipped down-cycle, then relaxation and measurement).
    return MGRITSettings.torchbraid(max_iter=0)


@dataclass(frozen=True)
class LayerParallelSettings:
    """MGRIT settings for the forward and the adjoint solve (TorchBraid's defaults).

    ``spatial`` (a :class:`~refbraid.mgrit.transfer.SpatialCoarsening`, or None) makes the
    listed coarse levels run on coarser feature maps: the forward solve uses its (R, P), the
    adjoint solve the transposed pair (docs/coarsening.md).
    """

    forward: MGRITSettings = field(default_factory=_default_forward)
    backward: MGRITSettings = field(default_factory=_default_backward)
    spatial: SpatialCoarsening | None = None

    def __post_init__(self):
        for name in ("forward", "backward"):
            if not isinstance(getattr(self, name), MGRITSettings):
                raise TypeError(f"`{name}` must be an MGRITSettings, got {getattr(self, name)!r}.")
        if self.spatial is not None and not isinstance(self.spatial, SpatialCoarsening):
            raise TypeError(f"`spatial` must be a SpatialCoarsening or None, got "
                            f"{self.spatial!r}.")

    @property
    def forward_transfer(self) -> SpatialCoarsening | None:
        return self.spatial

    @property
    def backward_transfer(self) -> SpatialCoarsening | None:
        return None if self.spatial is None else self.spatial.transposed()

    @classmethod
    def exact(cls) -> LayerParallelSettings:
        """One level each way: sequential substitution, the exactness baseline."""
        one = MGRITSettings(levels=1)
        return cls(forward=one, backward=one)

    @classmethod
    def with_iterations(cls, forward: int, backward: int, **common) -> LayerParallelSettings:
        """TorchBraid-like hierarchy with fixed iteration counts (tolerances off)."""
        base = dict(abs_tol=None, rel_tol=None, skip_first_down=False)
        base.update(common)
        return cls(
            forward=MGRITSettings.torchbraid(max_iter=forward, **base),
            backward=MGRITSettings.torchbraid(max_iter=backward, **base),
        )


# ----------------------------------------------------------------------------- the two problems
def batchable(net: Network, bk: Backend) -> bool:
    """Whether the propagators offer MGRIT batched steps (one call per sweep,
    :mod:`refbraid.mgrit.batched`): a step layer with ``forward_batched`` / ``adjoint_batched``,
    bit-identical to its per-step calls, where the backend's batched sweeps are on and pay: by
    the layer's measured ``batched_sweeps_pay`` on the CPU, by launch counts on a GPU, or as
    ``sweeps_batched`` forces (:func:`refbraid.backends.device_batching.batches`)."""
    layer = getattr(net, "step", None)
    return (callable(getattr(layer, "forward_batched", None))
            and device_batching.batches(layer, bk, batched_sweeps_on(bk)))


@dataclass(frozen=True, eq=False)
class ForwardPropagator:
    """Φ(y; a → b) = the network's step from layer a with step size (b − a)·h.

    ``batched_step`` (MGRIT's one call per sweep): Φ on k intervals at once, rows
    ``starts[j] → stops[j]`` with layer ``starts[j]``'s weights, where :func:`batchable`."""

    net: Network
    steps: dict[str, Any]
    bk: Backend

    #: a step y + (b − a)·h·F(θ_a, y) keeps a NaN or inf of y (refbraid.mgrit.Problem reads
    #: this: its finiteness check then reads one row per interval)
    carries_nonfinite = True

    def step(self, y, start: int, stop: int, out=None, add=None):  # out=, add=: forward_into
        theta, hc = layer_params(self.steps, start), (stop - start) * self.net.h
        return forward_into(self.net.step, theta, y, hc, self.bk, out, add)[0]

    @property
    def batched_step(self):
        return self._steps_at_once if batchable(self.net, self.bk) else None

    def _steps_at_once(self, Y, starts, stops):
        theta = layers_params(self.steps, starts, self.bk)  # k rows of stacked weights
        Y_next, _ = self.net.step.forward_batched(theta, Y, (stops - starts) * self.net.h,
                                                  self.bk)
        return Y_next


@dataclass(frozen=True, eq=False)
class AdjointPropagator:
    """Ψ(λ; b → a) = Φ'(y[a]; a → b)ᵀ λ for b > a, linearised at the forward states ``states``.

    On a spatially coarsened level (λ smaller than y[a]) the linearisation point is the
    restricted state ``R y[a]`` (the forward solve's R, applied until the shapes agree).
    """

    net: Network
    steps: dict[str, Any]
    states: Any  # (N + 1, *S) forward trajectory, fine order
    bk: Backend
    restriction: str = "average"

    #: Ψ(λ) = λ + h·(∂F/∂y)ᵀ λ keeps a NaN or inf of λ (as ForwardPropagator's)
    carries_nonfinite = True

    def step(self, lam, start: int, stop: int, out=None, add=None):  # out=, add=: adjoint_into
        theta = layer_params(self.steps, stop)
        hc = (start - stop) * self.net.h
        y = row(self.states, stop)
        if tuple(lam.shape) != tuple(y.shape):
            y = restrict_to_shape(y, tuple(lam.shape), self.restriction)
        _, cache = self.net.step.forward(theta, y, hc, self.bk)
        lam_prev, _ = adjoint_into(self.net.step, theta, cache, lam, hc, self.bk, False, out, add)
        return lam_prev

    @property
    def batched_step(self):
        """Ψ on k intervals at once (as :class:`ForwardPropagator`'s), where :func:`batchable`."""
        return self._steps_at_once if batchable(self.net, self.bk) else None

    def _steps_at_once(self, L, starts, stops):
        theta = layers_params(self.steps, stops, self.bk)
        hc = (starts - stops) * self.net.h
        Y = stacked_rows(self.states, stops, self.bk)  # k,*S
        if tuple(L.shape[1:]) != tuple(Y.shape[1:]):  # coarse in space: R y per step
            return self.bk.xp.stack([self.step(L[j], a, b) for j, (a, b) in
                                     enumerate(zip(starts.tolist(), stops.tolist(), strict=True))])
        _, Z = self.net.step.forward_batched(theta, Y, hc, self.bk)
        L_prev, _ = self.net.step.adjoint_batched(theta, Y, Z, L, hc, self.bk, grads=False)
        return L_prev


class CachingForward(ForwardPropagator):
    """Φ of :class:`ForwardPropagator`, keeping the layer cache of the latest FINE step a → a+1.

    The solve's last relaxation makes every fine step of the rank's block from the final
    states, so afterwards ``caches[a]`` is the cache of ``step.forward(θ_a, y[a], h)`` at the
    returned trajectory: the adjoint reuses it instead of recomputing the forward pass.
    """

    def __init__(self, net: Network, steps: dict[str, Any], bk: Backend):
        super().__init__(net, steps, bk)
        object.__setattr__(self, "caches", {})
        object.__setattr__(self, "origins", {})  # layer -> batched call (step_caches.py)

    def step(self, y, start: int, stop: int, out=None, add=None):
        if stop - start != 1:
            return super().step(y, start, stop, out, add)
        y_next, cache = forward_into(self.net.step, layer_params(self.steps, start), y,
                                     self.net.h, self.bk, out, add)
        self.caches[start] = cache
        self.origins.pop(start, None)
        return y_next

    def _steps_at_once(self, Y, starts, stops):
        if not np.all(stops - starts == 1):
            return super()._steps_at_once(Y, starts, stops)
        theta = layers_params(self.steps, starts, self.bk)
        h = np.full(len(starts), self.net.h)
        Y_next, Z = self.net.step.forward_batched(theta, Y, h, self.bk)
        for j, a in enumerate(starts.tolist()):
            self.caches[a] = (Y[j], Z[j])  # the cache step.forward(θ_a, y[a], h) returns
        remember(self.origins, starts.tolist(), Y, Z)
        return Y_next


class CapturingAdjoint(AdjointPropagator):
    """Ψ of :class:`AdjointPropagator`; FINE steps a+1 → a also return ∂L/∂θ_a.

    A fine adjoint step is ``step.adjoint(θ_a, cache(y[a], h), λ[a+1], h)``: with
    ``grads=True`` the same call yields ``(∂Φ_a/∂θ_a)ᵀ λ[a+1]``, the layer's gradient. The
    latest one per layer is kept; the solve's last relaxation makes every fine step of the
    block from the final λ, so ``grads[a]`` is ``(∂Φ_a/∂θ_a)ᵀ λ[a+1]`` at the returned
    trajectories, with no extra pass over the layers (TorchBraid likewise takes the gradient
    from its final relaxation).
    A coarse step a + m → a reuses the fine cache of layer a where the layer's cache does not
    depend on the step size (:meth:`_reusable_cache`), else it is :class:`AdjointPropagator`'s
    (forward recomputed at step m·h).
    """

    def __init__(self, net: Network, steps: dict[str, Any], states, caches: dict[int, Any],
                 bk: Backend, restriction: str = "average", origins: dict | None = None):
        super().__init__(net, steps, states, bk, restriction)
        object.__setattr__(self, "caches", caches)
        object.__setattr__(self, "origins", {} if origins is None else origins)
        object.__setattr__(self, "grads", {})
        object.__setattr__(self, "counts", {"cache_hits": 0, "recomputed": 0,
                                            "coarse_cache_hits": 0})

    def step(self, lam, start: int, stop: int, out=None, add=None):  # out=, add=: adjoint_into
        if start - stop != 1:
            cache = self._reusable_cache(stop, lam.shape)
            if cache is None:
                return super().step(lam, start, stop, out, add)
            self.counts["coarse_cache_hits"] += 1
            return adjoint_into(self.net.step, layer_params(self.steps, stop), cache, lam,
                                (start - stop) * self.net.h, self.bk, False, out, add)[0]
        theta = layer_params(self.steps, stop)
        cache = self.caches.get(stop)
        if cache is None:  # a step that started on another rank (MPI): recompute its cache
            _, cache = self.net.step.forward(theta, row(self.states, stop), self.net.h, self.bk)
            self.counts["recomputed"] += 1
        else:
            self.counts["cache_hits"] += 1
        lam_prev, dtheta = adjoint_into(self.net.step, theta, cache, lam, self.net.h, self.bk,
                                        True, out, add)
        self.grads[stop] = dtheta
        return lam_prev

    def _reusable_cache(self, a: int, lam_shape):
        """The fine forward cache of layer ``a`` for a COARSE adjoint step from ``a``, or None
        (recompute). A coarse step ``a + m → a`` is linearised at ``y[a]`` with θ_a, as the
        fine step is, only with step size m·h: where the layer's cache does not depend on h
        (``cache_independent_of_h``: e.g. ``(y, z)``, ``z = W * y + b``) the fine cache is the
        one the coarse step would recompute, bit for bit. Not on a spatially coarsened level
        (λ smaller than ``y[a]``), nor for a block's first layer on another rank."""
        if not getattr(self.net.step, "cache_independent_of_h", False) or a not in self.caches:
            return None
        if tuple(lam_shape) != tuple(row(self.states, a).shape):
            return None
        return self.caches[a]

    def _steps_at_once(self, L, starts, stops):
        layers = stops.tolist()
        if not np.all(starts - stops == 1):
            if any(self._reusable_cache(a, L.shape[1:]) is None for a in layers):
                return super()._steps_at_once(L, starts, stops)
            theta = layers_params(self.steps, stops, self.bk)
            Y, Z = cached_stacks(self.caches, self.origins, layers, self.bk.xp)  # k,*S each
            L_prev, _ = self.net.step.adjoint_batched(theta, Y, Z, L,
                                                      (starts - stops) * self.net.h, self.bk,
                                                      grads=False)
            self.counts["coarse_cache_hits"] += len(layers)
            return L_prev
        if any(a not in self.caches for a in layers):  # a block's first step (MPI): per step
            return self.bk.xp.stack([self.step(L[j], a + 1, a) for j, a in enumerate(layers)])
        theta = layers_params(self.steps, stops, self.bk)
        Y, Z = cached_stacks(self.caches, self.origins, layers, self.bk.xp)  # k,*S each
        h = np.full(len(layers), self.net.h)
        L_prev, d = self.net.step.adjoint_batched(theta, Y, Z, L, h, self.bk, grads=True)
        for j, a in enumerate(layers):
            self.grads[a] = {k: v[j] for k, v in d.items()}
        self.counts["cache_hits"] += len(layers)
        return L_prev


def forward_problem(net: Network, steps: dict[str, Any], y0, bk: Backend) -> Problem:
    return Problem(step=ForwardPropagator(net, steps, bk), u0=y0, n_steps=net.n_layers)


def adjoint_problem(net: Network, steps: dict[str, Any], states, lam_N, bk: Backend) -> Problem:
    prop = AdjointPropagator(net, steps, states, bk)
    return Problem(step=prop, u0=lam_N, n_steps=net.n_layers, direction="backward")


def as_settings(settings: LayerParallelSettings | None) -> LayerParallelSettings:
    """``settings``, TorchBraid's defaults for None; TypeError naming ``settings`` otherwise."""
    if settings is None:
        return LayerParallelSettings()
    if not isinstance(settings, LayerParallelSettings):
        raise TypeError(f"`settings` must be a LayerParallelSettings, got "
                        f"{type(settings).__name__}.")
    return settings


# ----------------------------------------------------------------------------- the gradient
@dataclass
class LayerParallelInfo:
    """What one layer-parallel gradient leaves behind: both MGRIT records and the trajectories."""

    forward: MGRITResult
    backward: MGRITResult
    states: Any
    adjoints: Any
    logits: Any

    def stats(self) -> dict[str, float]:
        """Numbers for the training log: final fine C-point residual norms and cycles of each
        solve, and Φ applications of both solves (the parameter gradient comes with them)."""
        f, b = self.forward, self.backward
        return {"fwd_res": float(f.norms[-1]), "fwd_iters": float(f.iterations),
                "bwd_res": float(b.norms[-1]), "bwd_iters": float(b.iterations),
                "phi_calls": float(f.total_steps + b.total_steps)}


def captured_gradient(adjoint: CapturingAdjoint, steps: dict[str, Any], layers) -> dict:
    """The stacked ``steps.*`` gradient rows ``(∂Φ_a/∂θ_a)ᵀ λ[a+1]`` of ``layers`` that the
    adjoint solve's final relaxation captured (rows of other layers stay zero)."""
    missing = [int(a) for a in layers if int(a) not in adjoint.grads]
    if missing:  # cannot happen: the final relaxation makes every fine adjoint step
        raise RuntimeError(f"no captured gradient for layers {missing[:8]}.")
    dsteps = {k: adjoint.bk.xp.zeros_like(v) for k, v in steps.items()}
    rows = [int(a) for a in layers]
    for k, v in dsteps.items():
        set_rows_from(v, rows, [adjoint.grads[a][k] for a in rows])
    return dsteps


def mgrit_forward(net: Network, params: Params, x, settings: MGRITSettings,
                  bk: Backend | str = "numpy", propagator: ForwardPropagator | None = None,
                  transfer=None):
    """The network's forward pass with the ODE block solved by MGRIT.

    Returns (logits, the MGRIT result — its ``solution`` is y[0..N] —, (opening cache,
    closing cache)). This is the network a layer-parallel run trains, so it is also the one
    its accuracy is measured with (as TorchBraid does). ``propagator`` (e.g. a
    :class:`CachingForward`) replaces the plain :class:`ForwardPropagator`; ``transfer`` is
    the spatial transfer (``LayerParallelSettings.forward_transfer``). ``params`` and ``x``
    are checked first (:func:`refbraid.network.check_inputs`).
    """
    bk = get_backend(bk)
    check_inputs(net, params, x)
    return _mgrit_forward(net, params, x, settings, bk, propagator, transfer)


def _mgrit_forward(net: Network, params: Params, x, settings: MGRITSettings, bk: Backend,
                   propagator: ForwardPropagator | None = None, transfer=None, workspace=None):
    """:func:`mgrit_forward` without the checks (for callers that have made them)."""
    y0, open_cache = net.opening.forward(group(params, "opening"), x, bk)
    prop = propagator or ForwardPropagator(net, group(params, "steps"), bk)
    fwd = solve(Problem(prop, y0, net.n_layers, transfer=transfer), settings, workspace=workspace)
    logits, close_cache = net.closing.forward(group(params, "closing"), fwd.solution[-1, ...], bk)
    return logits, fwd, (open_cache, close_cache)


def layer_parallel_gradient(
    net: Network,
    params: Params,
    x,
    labels,
    settings: LayerParallelSettings | None = None,
    bk: Backend | str = "numpy",
    workspace: GradientWorkspace | None = None,
) -> tuple[float, Params, LayerParallelInfo]:
    """Loss and gradient with MGRIT forward and adjoint solves (see the module docstring).

    Returns (loss, grads keyed like params, info). ``workspace``: arrays both solves reuse (a
    GradientWorkspace; the next call with it overwrites info's trajectories). The loss is
    evaluated on the MGRIT forward solution, the gradient is the exact gradient of that
    approximate forward pass when the adjoint solve has converged. ``params``, ``x`` and
    ``labels`` are checked first (:func:`refbraid.network.check_inputs`).
    """
    bk = get_backend(bk)
    settings = as_settings(settings)
    check_inputs(net, params, x, labels)
    steps = group(params, "steps")
    forward = CachingForward(net, steps, bk)
    logits, fwd, (open_cache, close_cache) = _mgrit_forward(
        net, params, x, settings.forward, bk, forward, settings.forward_transfer,
        workspace and workspace.forward)
    states = fwd.solution  # (N + 1, *S)
    loss, probs = bk.softmax_cross_entropy(logits, labels)
    dlogits = bk.softmax_cross_entropy_adjoint(probs, labels, 1.0)
    lam_N, dclose = net.closing.adjoint(group(params, "closing"), close_cache, dlogits, bk)
    restriction = settings.spatial.restriction if settings.spatial else "average"
    adjoint = CapturingAdjoint(net, steps, states, forward.caches, bk, restriction,
                               forward.origins)
    bwd = solve(Problem(adjoint, lam_N, net.n_layers, direction="backward",
                        transfer=settings.backward_transfer), settings.backward,
                workspace=workspace and workspace.backward)
    adjoints = bwd.solution  # (N + 1, *S), fine order
    dsteps = captured_gradient(adjoint, steps, range(net.n_layers))
    _, dopen = net.opening.adjoint(group(params, "opening"), open_cache, adjoints[0, ...], bk)
    grads = {f"opening.{k}": v for k, v in dopen.items()}
    grads.update({f"steps.{k}": v for k, v in dsteps.items()})
    grads.update({f"closing.{k}": v for k, v in dclose.items()})
    info = LayerParallelInfo(fwd, bwd, states, adjoints, logits)
    return host_float(loss), {k: grads[k] for k in params}, info
