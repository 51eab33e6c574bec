"""Layer-parallel gradient of a :class:`~refbraid.stages.network.StagedNetwork`: MGRIT forward
and adjoint solves over states whose shape changes at transitions (and, optionally, on
spatially coarsened levels).

The same recurrences as :mod:`refbraid.layer_parallel`, with Φ the staged step (coarse steps
split at transitions, :meth:`StagedNetwork.segments`) and states packed into flat rows
(:mod:`refbraid.stages.packing`)::

    forward   y[0] = opening(x),   y[b] = Φ(y[a]; a → b)
    adjoint   λ[N] = ∂L/∂y[N],     λ[a] = Φ'(y[a]; a → b)ᵀ λ[b]   (linearised at y[a], or at
                                                                  R y[a] on a coarse space)
    gradient  ∂L/∂θ of fine step a = (∂Φ(y[a]; a → a+1)/∂θ)ᵀ λ[a+1]

The fine adjoint steps of the solve's final relaxation yield the gradient (as in
:mod:`refbraid.layer_parallel`), so a converged solve gives sequential backprop's gradient.
Transitions need not be C-points: a coarse step applies them exactly inside its interval.
Batch-norm layers report the statistics of the final fine forward sweep
(``StagedInfo.batch_stats``, :mod:`refbraid.stages.batchnorm`): the caller folds them into the
running statistics once per training step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..backends import Backend, get_backend
from ..backends.host import host_float
from ..layer_parallel import LayerParallelSettings, as_settings
from ..mgrit import MGRITResult, Problem, solve
from ..mgrit.transfer import restrict_to_shape
from ..network import Params, group
from .batchnorm import final_sweep_stats, has_batch_norm
from .network import StagedNetwork, accumulate, piece_adjoint, piece_forward
from .packing import PackedTransfer, Packing


@dataclass(eq=False)
class StagedForward:
    """Φ(y; a → b) on packed rows; keeps the layer cache of every FINE step a → a+1."""

    net: StagedNetwork
    params: Params
    packing: Packing
    bk: Backend
    caches: dict = field(default_factory=dict)

    def step(self, u, start: int, stop: int):
        level = self.packing.level_of(u)
        y = self.packing.unpack(u, level, start)
        for piece in self.net.segments(start, stop):
            y, cache = piece_forward(self.net, self.params, piece, y, self.bk)
        if stop - start == 1 and level == 0:
            self.caches[start] = cache
        return self.packing.pack(y, level)


@dataclass(eq=False)
class StagedAdjoint:
    """Ψ(λ; b → a) = Φ'(y[a]; a → b)ᵀ λ on packed rows; FINE steps also keep ∂L/∂θ."""

    net: StagedNetwork
    params: Params
    packing: Packing
    states: Any  # (N + 1, L_0) packed forward trajectory, fine order
    caches: dict
    bk: Backend
    restriction: str = "average"
    grads: dict = field(default_factory=dict)

    def step(self, lam_packed, start: int, stop: int):
        a, b, pk = stop, start, self.packing
        level = pk.level_of(lam_packed)
        lam = pk.unpack(lam_packed, level, b)
        pieces = self.net.segments(a, b)
        fine = b - a == 1 and level == 0
        if fine and a in self.caches:
            caches = [self.caches[a]]
        else:
            y = pk.unpack(self.states[a, ...], 0, a)
            if tuple(y.shape) != pk.shape(level, a):
                y = restrict_to_shape(y, pk.shape(level, a), self.restriction)
            caches = []
            for piece in pieces:
                y, cache = piece_forward(self.net, self.params, piece, y, self.bk)
                caches.append(cache)
        for piece, cache in zip(reversed(pieces), reversed(caches), strict=True):
            lam, parts = piece_adjoint(self.net, self.params, piece, cache, lam, self.bk,
                                       grads=fine)
        if fine:
            self.grads[a] = parts
        return pk.pack(lam, level)


def stage_guesses(net: StagedNetwork, params: Params, y0, bk: Backend):
    """Cold-start iterates of the two solves (instead of u0 at every point, which would put
    a stage-0 state into the rows of later stages)::

        forward   guess(i) = T_{s-1}(… T_0(y0))              for state i in stage s
        adjoint   guess(i) = T_sᵀ(… T_{S-2}ᵀ(λ_N))           (linearised at those states)

    Returns (forward guess(i), adjoint guess factory lam_N -> guess(i)) on unpacked states.
    """
    ys, caches = [y0], []
    for s, t in enumerate(net.transitions):
        y, cache = t.forward(group(params, f"transition{s}"), ys[-1], bk)
        ys.append(y)
        caches.append(cache)

    def adjoint_guess(lam_N):
        lams = [lam_N]
        for s in reversed(range(len(net.transitions))):
            lam, _ = net.transitions[s].adjoint(group(params, f"transition{s}"), caches[s],
                                                lams[0], bk)
            lams.insert(0, lam)
        return lambda i: lams[net.point_stage[i]]

    return (lambda i: ys[net.point_stage[i]]), adjoint_guess


@dataclass
class StagedInfo:
    """Both MGRIT records, the packing (``stats()`` as LayerParallelInfo's) and the batch
    statistics of the final fine forward sweep (empty without BN layers)."""

    forward: MGRITResult
    backward: MGRITResult
    packing: Packing
    batch_stats: list = field(default_factory=list)

    def stats(self) -> dict[str, float]:
        f, b = self.forward, self.backward
        return {"fwd_res": float(f.norms[-1]), "fwd_iters": float(f.iterations),
                "bwd_res": float(b.norms[-1]), "bwd_iters": float(b.iterations),
                "phi_calls": float(f.total_steps + b.total_steps)}


def staged_layer_parallel_gradient(net: StagedNetwork, params: Params, x, labels,
                                   settings: LayerParallelSettings | None = None,
                                   bk: Backend | str = "numpy"
                                   ) -> tuple[float, Params, StagedInfo]:
    """Loss and gradient with MGRIT forward and adjoint solves (module docstring)."""
    bk = get_backend(bk)
    settings = as_settings(settings)
    if not isinstance(net, StagedNetwork):
        raise TypeError(f"`net` must be a StagedNetwork, got {type(net).__name__}.")
    N = net.n_steps
    n_levels = max(settings.forward.levels, settings.backward.levels)
    pk = Packing.build(net.state_shapes, x.shape[0], n_levels, settings.spatial)
    fwd_transfer = bwd_transfer = None
    if settings.spatial is not None:
        fwd_transfer = PackedTransfer(pk, settings.forward_transfer)
        bwd_transfer = PackedTransfer(pk, settings.backward_transfer)
    y0, open_cache = net.opening.forward(group(params, "opening"), x, bk)
    forward = StagedForward(net, params, pk, bk)
    y_guess, adjoint_guess = stage_guesses(net, params, y0, bk)
    fwd = solve(Problem(forward, pk.pack(y0, 0), N, transfer=fwd_transfer,
                        guess=lambda i: pk.pack(y_guess(i), 0)), settings.forward)
    states = fwd.solution  # (N + 1, L_0)
    logits, close_cache = net.closing.forward(group(params, "closing"),
                                              pk.unpack(states[N, ...], 0, N), bk)
    loss, probs = bk.softmax_cross_entropy(logits, labels)
    dlogits = bk.softmax_cross_entropy_adjoint(probs, labels, 1.0)
    lam_N, dclose = net.closing.adjoint(group(params, "closing"), close_cache, dlogits, bk)
    restriction = settings.spatial.restriction if settings.spatial else "average"
    adjoint = StagedAdjoint(net, params, pk, states, forward.caches, bk, restriction)
    lam_guess = adjoint_guess(lam_N)
    bwd = solve(Problem(adjoint, pk.pack(lam_N, 0), N, direction="backward",
                        transfer=bwd_transfer, guess=lambda i: pk.pack(lam_guess(i), 0)),
                settings.backward)
    grads = {k: bk.xp.zeros_like(v) for k, v in params.items()}
    for a in range(N):
        accumulate(grads, adjoint.grads[a])
    grads.update({f"closing.{k}": v for k, v in dclose.items()})
    _, dopen = net.opening.adjoint(group(params, "opening"), open_cache,
                                   pk.unpack(bwd.solution[0, ...], 0, 0), bk)
    grads.update({f"opening.{k}": v for k, v in dopen.items()})
    stats = final_sweep_stats(net, forward.caches, bk) if has_batch_norm(net) else []
    return host_float(loss), grads, StagedInfo(fwd, bwd, pk, stats)
