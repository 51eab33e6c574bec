"""The network's steps as MGRIT step functions: Φ and Ψ, and the variants that keep caches.

Each propagator is what :class:`refbraid.mgrit.Problem` takes as ``step`` (docs/references.md
§1–2)::

    Φ(y; a → b) = y + (b − a)·h·F(θ_a, y)                  ForwardPropagator
    Ψ(λ; b → a) = Φ'(y[a]; a → b)ᵀ λ,   b > a               AdjointPropagator

:class:`CachingForward` keeps the layer cache of each fine forward step; :class:`CapturingAdjoint`
reuses it and keeps each fine adjoint step's parameter gradient ``(∂Φ_a/∂θ_a)ᵀ λ[a+1]``. Their
``batched_step`` (one call per sweep over k intervals) is offered where :func:`batchable` says.

Where it sits: below :mod:`refbraid.layer_parallel` (which assembles the gradient from them) and
:mod:`refbraid.distributed.network` (the same over MPI ranks); above the layers and MGRIT.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .backends import Backend, batched_sweeps_on, device_batching
from .backends.portable import stack_rows
from .layers.forward_into import (
    adjoint_batched_into,
    adjoint_into,
    forward_batched_into,
    forward_into,
    written_into,
)
from .mgrit.transfer import restrict_to_shape
from .network import Network, layer_params, layers_params, row, stacked_rows
from .step_caches import cached_stacks, remember


def batchable(net: Network, bk: Backend) -> bool:
    """Whether the propagators offer MGRIT batched steps (one call per sweep,
    :mod:`refbraid.mgrit.batched`): a step layer with ``forward_batched`` / ``adjoint_batched``,
    bit-identical to its per-step calls, where the backend's batched sweeps are on and pay: by
    the layer's measured ``batched_sweeps_pay`` on the CPU, by launch counts on a GPU, or as
    ``sweeps_batched`` forces (:func:`refbraid.backends.device_batching.batches`)."""
    layer = getattr(net, "step", None)
    return (callable(getattr(layer, "forward_batched", None))
            and device_batching.batches(layer, bk, batched_sweeps_on(bk)))


def _weights(prop, layers: np.ndarray) -> dict[str, Any]:
    """The stacked weights of ``layers`` for one of ``prop``'s batched calls: gathered, or
    views of the stacks where the backend's kernels read the rows in place
    (:func:`refbraid.backends.device_batching.rows_read_in_place`)."""
    return layers_params(prop.steps, layers, prop.bk,
                         device_batching.rows_read_in_place(prop.net.step, prop.bk))


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

    def _steps_at_once(self, Y, starts, stops, out=None, add=None):  # out=, add=: MGRIT's rows
        theta = _weights(self, starts)  # k rows of stacked weights
        h = (stops - starts) * self.net.h
        return forward_batched_into(self.net.step, theta, Y, h, self.bk, out, add)[0]


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

    def _steps_at_once(self, L, starts, stops, out=None, add=None):  # out=, add=: MGRIT's rows
        theta = _weights(self, stops)
        hc = (starts - stops) * self.net.h
        Y = stacked_rows(self.states, stops, self.bk)  # k,*S
        if tuple(L.shape[1:]) != tuple(Y.shape[1:]):  # coarse in space: R y per step
            pairs = zip(starts.tolist(), stops.tolist(), strict=True)
            L_prev = stack_rows([self.step(L[j], a, b) for j, (a, b) in enumerate(pairs)])
            return written_into(L_prev, out, add)
        _, Z = self.net.step.forward_batched(theta, Y, hc, self.bk)
        return adjoint_batched_into(self.net.step, theta, Y, Z, L, hc, self.bk, False, out,
                                    add)[0]


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

    def _steps_at_once(self, Y, starts, stops, out=None, add=None):
        if not np.all(stops - starts == 1):
            return super()._steps_at_once(Y, starts, stops, out, add)
        theta = _weights(self, starts)
        h = np.full(len(starts), self.net.h)
        Y_next, Z = forward_batched_into(self.net.step, theta, Y, h, self.bk, out, add)
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
        #: layer a -> (the batched gradient dict, row j) where ``grads[a]`` are rows of one
        #: batched call's arrays (batched sweeps), so they can be placed as one strided block
        object.__setattr__(self, "grad_batches", {})
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
        self.grad_batches.pop(stop, None)
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

    def _steps_at_once(self, L, starts, stops, out=None, add=None):
        layers = stops.tolist()
        if not np.all(starts - stops == 1):
            if any(self._reusable_cache(a, L.shape[1:]) is None for a in layers):
                return super()._steps_at_once(L, starts, stops, out, add)
            theta = _weights(self, stops)
            Y, Z = cached_stacks(self.caches, self.origins, layers, self.bk.xp)  # k,*S each
            L_prev, _ = adjoint_batched_into(self.net.step, theta, Y, Z, L,
                                             (starts - stops) * self.net.h, self.bk, False,
                                             out, add)
            self.counts["coarse_cache_hits"] += len(layers)
            return L_prev
        if any(a not in self.caches for a in layers):  # a block's first step (MPI): per step
            L_prev = stack_rows([self.step(L[j], a + 1, a) for j, a in enumerate(layers)])
            return written_into(L_prev, out, add)
        theta = _weights(self, stops)
        Y, Z = cached_stacks(self.caches, self.origins, layers, self.bk.xp)  # k,*S each
        h = np.full(len(layers), self.net.h)
        L_prev, d = adjoint_batched_into(self.net.step, theta, Y, Z, L, h, self.bk, True, out,
                                         add)
        for j, a in enumerate(layers):
            self.grads[a] = {k: v[j] for k, v in d.items()}
            self.grad_batches[a] = (d, j)
        self.counts["cache_hits"] += len(layers)
        return L_prev
