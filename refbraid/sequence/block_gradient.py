"""The gradient of one block (a :class:`~refbraid.network.Network`) under any loss: sequential
backprop and the layer-parallel MGRIT gradient, the two the transformer models chain.

A block's loss is given as ``dloss_fn(out) -> (L, ∂L/∂out)``, so a block may end in the next
block (the encoder of an encoder–decoder gets ``(0, ∂L/∂M)``) as well as in a classifier::

    λ[N] = closing'ᵀ ∂L/∂out,   λ[n] = Φ_n'(X[n])ᵀ λ[n+1],   ∂L/∂θ_n = (∂Φ_n/∂θ_n)ᵀ λ[n+1]
    ∂L/∂(opening params) = opening'ᵀ λ[0]

:func:`block_backprop` runs the recurrences sequentially; :func:`block_layer_parallel` solves
them by MGRIT with the propagators of :mod:`refbraid.layer_parallel` (coarse steps ``m·h`` with
the weights of the first fine layer, TorchBraid's injection) and takes the gradient rows from
the adjoint solve's last relaxation, exactly as
:func:`refbraid.layer_parallel.layer_parallel_gradient` does for a ResNet's cross-entropy.
"""

from __future__ import annotations

from dataclasses import replace

from ..backends import Backend
from ..layer_parallel import (
    LayerParallelInfo,
    LayerParallelSettings,
    captured_gradient,
    mgrit_forward,
)
from ..mgrit import Problem, solve
from ..network import Network, forward, group, layer_params, stacked_gradients
from ..propagators import CachingForward, CapturingAdjoint


def for_batch(net: Network, batch: int) -> Network:
    """``net`` with its step's batched MGRIT sweeps switched on where they pay for ``batch``
    samples (a step with ``for_batch``, e.g. :class:`refbraid.layers.EncoderStep`)."""
    step_for = getattr(net.step, "for_batch", None)
    return net if step_for is None else replace(net, step=step_for(batch))


def block_backprop(net: Network, params, x, dloss_fn, bk: Backend):
    """Sequential forward and discrete adjoint through one Network with a given loss.

    ``dloss_fn(out) -> (loss, dout)``. Returns (loss, grads keyed like params, out).
    """
    out, _, (open_cache, step_caches, close_cache) = forward(net, params, x, bk)
    loss, dout = dloss_fn(out)
    lam, dclose = net.closing.adjoint(group(params, "closing"), close_cache, dout, bk)
    steps = group(params, "steps")
    layer_grads = [None] * net.n_layers
    for n in reversed(range(net.n_layers)):
        lam, layer_grads[n] = net.step.adjoint(layer_params(steps, n), step_caches[n], lam,
                                               net.h, bk)
    dsteps = stacked_gradients(steps, layer_grads, bk)
    _, dopen = net.opening.adjoint(group(params, "opening"), open_cache, lam, bk)
    grads = {f"opening.{k}": v for k, v in dopen.items()}
    grads.update({f"steps.{k}": v for k, v in dsteps.items()})
    grads.update({f"closing.{k}": v for k, v in dclose.items()})
    return loss, grads, out


def block_layer_parallel(net: Network, params, x, dloss_fn, settings: LayerParallelSettings,
                         bk: Backend):
    """MGRIT forward solve, loss, MGRIT adjoint solve (gradient rows from its last relaxation).

    Returns (loss, grads keyed like params, info).
    """
    steps = group(params, "steps")
    caching = CachingForward(net, steps, bk)
    out, fwd, (open_cache, close_cache) = mgrit_forward(net, params, x, settings.forward, bk,
                                                        caching)
    loss, dout = dloss_fn(out)
    lam_N, dclose = net.closing.adjoint(group(params, "closing"), close_cache, dout, bk)
    adjoint = CapturingAdjoint(net, steps, fwd.solution, caching.caches, bk)
    bwd = solve(Problem(adjoint, lam_N, net.n_layers, direction="backward"), settings.backward)
    dsteps = captured_gradient(adjoint, steps, range(net.n_layers))
    _, dopen = net.opening.adjoint(group(params, "opening"), open_cache, bwd.solution[0, ...], bk)
    grads = {f"opening.{k}": v for k, v in dopen.items()}
    grads.update({f"steps.{k}": v for k, v in dsteps.items()})
    grads.update({f"closing.{k}": v for k, v in dclose.items()})
    return loss, grads, LayerParallelInfo(fwd, bwd, fwd.solution, bwd.solution, out)
