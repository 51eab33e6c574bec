"""``refbraid train --mgopt-levels L``: one MG/Opt cycle in depth per training step.

Each batch runs one cycle of :class:`refbraid.training.multilevel.MGOpt` (levels N, N/2, …,
N/2^(L-1) layers; smoothing by gradient descent with step ``--lr`` on every level, using the
run's gradient: layer-parallel MGRIT with the run's settings where its hierarchy fits that
depth, else sequential backprop; the first-order coherence correction; a line search on the
coarse correction). The trainer applies a step as ``θ ← θ − lr·d``, so the cycle's result
θ⁺ is handed to it as the pseudo-gradient

    d = (θ − θ⁺) / lr          (θ − lr·d = θ⁺ up to rounding)

which is why MG/Opt runs with ``--optimizer sgd --momentum 0`` (checked in the config).

Models: ``resnet``, ``conv`` and ``conv-stages`` (coarse levels: every stage half as deep,
:mod:`refbraid.stages.depth`; weights restricted and interpolated per stage). Batch norm: a
training step updates the running statistics ONCE, from the fine forward sweep of the
gradient at the step's starting weights θ (the call that also gives the logged loss) —
the analogue of a plain step, whose statistics come from the gradient at θ. The cycle's
further fine evaluations (smoothing, line search) run with the statistics kept
(:func:`refbraid.training.buffers.buffers_kept`); coarse levels have their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..network import Network
from .buffers import buffers_kept
from .config import TrainConfig
from .multilevel import MGOpt, MGOptSettings

MGOPT_FACTOR = 2  # layers per coarse layer between MG/Opt levels


def check_mgopt(config: TrainConfig, net) -> None:
    """ValueError unless ``--mgopt-levels`` fits this model and run (one process)."""
    from ..parallel.mpi import world_size

    if not isinstance(net, Network) and not hasattr(net, "net"):
        raise ValueError(f"`--mgopt-levels` needs model resnet, conv or conv-stages, got "
                         f"`--model {config.model}`.")
    if config.data_parallel > 1 or world_size() > 1:
        raise ValueError("`--mgopt-levels` runs in one process (not under mpiexec).")


def mgopt_gradient(config: TrainConfig, net, fine: tuple[str, Callable],
                   coarse: Callable[[Any], Callable]):
    """The MG/Opt step as a gradient function (module docstring); stats: gradient calls and
    the line-search factor β of the cycle. ``fine`` is the run's (name, gradient) at full
    depth, ``coarse(n)`` the gradient of a shallower network ``n``
    (:func:`refbraid.training.gradients.select_gradient` builds both)."""
    check_mgopt(config, net)
    settings = MGOptSettings(levels=config.mgopt_levels, factor=MGOPT_FACTOR, lr=config.lr,
                             interpolation=config.nested_interp)
    fine_name, fine = fine
    mg = MGOpt.build(net, lambda n: fine if n is net else coarse(n), settings)
    def gradient(params, x, labels):
        loss = fine(params, x, labels)[0]  # with BN: this step's running-statistics update
        with buffers_kept(net):
            new, info = mg.cycle(params, x, labels)
        d = {k: (params[k] - new[k]) / config.lr for k in params}
        return loss, d, {"gradient_calls": float(info["gradient_calls"] + 1),
                         "beta": float(info.get("beta", 0.0))}

    if hasattr(fine, "logits"):
        gradient.logits = fine.logits
    gradient.__name__ = f"mgopt-{config.mgopt_levels} ({fine_name})"
    return gradient
