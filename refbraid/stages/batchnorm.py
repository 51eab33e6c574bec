"""Batch norm inside the layer-parallel section: where the running statistics come from.

A staged network may hold batch-normalised layers (``ConvBNStep`` as the ODE step of a stage,
``BatchNorm`` as a transition or a part of a :class:`~refbraid.stages.transitions.Chain`). In
training mode each uses the statistics of the batch it sees, so every MGRIT step — on any
level, in any iteration — normalises with its own batch statistics and changes nothing else.
The running statistics (evaluation mode) follow TorchBraid's rule: once per training step,
from the caches of the FINAL fine forward sweep (sequential: the forward pass)::

    for every BN layer ℓ at fine step i:   (μ_ℓ, σ²_ℓ) = batch statistics in cache[i]
        running_ℓ ← (1 − m) running_ℓ + m (μ_ℓ, σ²_ℓ n/(n − 1))       (torch's momentum rule)

never from coarse levels or intermediate iterations (``StagedForward.caches`` keeps only
level-0 fine steps, each overwritten by its latest evaluation, so after the solve it holds
the final sweep). Names: ``stage{s}.running_mean`` is (n_s, C) (row j: layer j of stage s),
``transition{s}.running_mean`` (C) or ``transition{s}.{j}_running_mean`` for part j of a
chain, as the evaluation-mode layers read them from params.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..backends import Backend
from ..layers.batchnorm import MOMENTUM, BatchStats, init_running_stats, update_running_stats
from .network import StagedNetwork
from .transitions import Chain


def is_normalised(layer) -> bool:
    """True for a batch-normalised layer (it reports ``batch_stats``)."""
    return hasattr(layer, "batch_stats")


def _transition_parts(transition) -> list[tuple[str, object]]:
    """(name suffix, part) of a transition: ``""`` for itself, ``"{j}_"`` for chain parts."""
    if isinstance(transition, Chain):
        return [(f"{j}_", part) for j, part in enumerate(transition.parts)]
    return [("", transition)]


def has_batch_norm(net: StagedNetwork) -> bool:
    return any(is_normalised(stage.step) for stage in net.stages) or any(
        is_normalised(part) for t in net.transitions for _, part in _transition_parts(t))


def init_running(net: StagedNetwork, dtype=np.float64) -> dict[str, np.ndarray]:
    """Running statistics of every BN layer: mean 0, variance 1 (as torch)."""
    out: dict[str, np.ndarray] = {}
    for s, stage in enumerate(net.stages):
        if is_normalised(stage.step):
            for k, v in init_running_stats(stage.step.channels, dtype).items():
                out[f"stage{s}.{k}"] = np.stack([v] * stage.n_layers)
    for s, t in enumerate(net.transitions):
        for suffix, part in _transition_parts(t):
            if is_normalised(part):
                for k, v in init_running_stats(part.channels, dtype).items():
                    out[f"transition{s}.{suffix}{k}"] = v
    return out


def final_sweep_stats(net: StagedNetwork, caches, bk: Backend, steps=None
                      ) -> list[tuple[str, int | None, BatchStats]]:
    """(name prefix, row or None, batch statistics) of every BN layer, from the fine-step
    caches ``caches[i]``, i = 0..N-1 (a list, or ``StagedForward.caches``); ``steps``: only
    those fine steps i (one MPI rank's part of the sweep), in increasing order."""
    out = []
    for i in range(net.n_steps) if steps is None else sorted(int(i) for i in steps):
        fs = net.fine_steps[i]
        if fs.kind == "ode":
            step = net.stages[fs.stage].step
            if is_normalised(step):
                out.append((f"stage{fs.stage}.", fs.layer, step.batch_stats(caches[i], bk)))
            continue
        layer, cache = caches[i]  # the transition as rebuilt for its input, its cache
        parts = _transition_parts(layer)
        part_caches = cache if isinstance(layer, Chain) else [cache]
        for (suffix, part), part_cache in zip(parts, part_caches, strict=True):
            if is_normalised(part):
                out.append((f"transition{fs.stage}.{suffix}", None,
                            part.batch_stats(part_cache, bk)))
    return out


def updated_running(running: dict[str, np.ndarray], stats, momentum: float = MOMENTUM
                    ) -> dict[str, np.ndarray]:
    """New running statistics after ONE training step with the given batch statistics."""
    new = {k: v.copy() for k, v in running.items()}
    for prefix, row, batch in stats:
        keys = (f"{prefix}running_mean", f"{prefix}running_var")
        old = {"running_mean": new[keys[0]], "running_var": new[keys[1]]}
        if row is not None:
            old = {k: v[row] for k, v in old.items()}
        fresh = update_running_stats(old, batch, momentum)
        for key, name in zip(keys, ("running_mean", "running_var"), strict=True):
            if row is None:
                new[key] = fresh[name]
            else:
                new[key][row] = fresh[name]
    return new


def evaluation_network(net: StagedNetwork) -> StagedNetwork:
    """The same network with every BN layer in evaluation mode (running statistics)."""
    def ev(layer):
        if isinstance(layer, Chain):
            return Chain(tuple(ev(part) for part in layer.parts))
        return layer.evaluation() if is_normalised(layer) else layer

    stages = tuple(replace(stage, step=ev(stage.step)) for stage in net.stages)
    return replace(net, stages=stages, transitions=tuple(ev(t) for t in net.transitions))
