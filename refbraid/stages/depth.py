"""A staged model at another depth: every stage with ``n_s / r`` layers (same [0, T] per stage,
step r·h_s), transitions, opening and closing unchanged. Multilevel training in depth
(nested initialisation, MG/Opt: :mod:`refbraid.training.multilevel`) builds its coarse
networks with it; the weights move between depths stage by stage there.

Batch norm: the coarser model has its own running statistics (fresh: mean 0, variance 1), so
gradient evaluations on a coarse level never touch the fine model's.
"""

from __future__ import annotations

import copy
from dataclasses import replace

from .batchnorm import evaluation_network, has_batch_norm, init_running
from .network import StagedNetwork


def coarser_staged_network(net: StagedNetwork, factor: int) -> StagedNetwork:
    """``net`` with every stage's ``n_layers`` divided by ``factor`` (each must divide)."""
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
        raise ValueError(f"`factor` must be a positive integer, got {factor!r}.")
    bad = [(s, st.n_layers) for s, st in enumerate(net.stages) if st.n_layers % factor]
    if bad:
        raise ValueError(f"the stages' layers {[n for _, n in bad]} (stages "
                         f"{[s for s, _ in bad]}) are not divisible by the depth factor "
                         f"{factor}: use `--layers` divisible by {factor * len(net.stages)}.")
    stages = tuple(replace(st, n_layers=st.n_layers // factor) for st in net.stages)
    return replace(net, stages=stages)


def coarser_model(model, factor: int):
    """A copy of a staged model (:class:`~refbraid.stages.model.ConvStagesModel`) with every
    stage ``factor`` times shallower, fresh running statistics and update count."""
    net = getattr(model, "net", None)
    if not isinstance(net, StagedNetwork):
        raise ValueError(f"multilevel training in depth needs a Network or a staged model "
                         f"(conv-stages), got {type(model).__name__}.")
    coarse = copy.copy(model)
    coarse.net = coarser_staged_network(net, factor)
    coarse.eval_net = evaluation_network(coarse.net) if has_batch_norm(coarse.net) \
        else coarse.net
    coarse.running = init_running(coarse.net)
    coarse.updates = 0
    coarse.layers = sum(st.n_layers for st in coarse.net.stages)
    return coarse
