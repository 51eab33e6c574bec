"""Training with owned parameter shards over MPI: each rank's optimizer updates its own layers.

Rank q holds θ_q = its rows of ``steps.*`` (its block of layers), plus the opening weights on
layer rank 0 and the closing weights on the last layer rank, and the optimizer state of
exactly those entries. One step::

    g_q = ∂L/∂θ_q                  (DistributedGradient.sharded: ghosts fetched, rows sent home)
    θ_q ← optimizer(θ_q, g_q)      local: the optimizers are element-wise (SGD, Adam), so
                                   updating the shards equals updating the whole

Full parameters exist only when gathered (collective) on world rank 0: to measure accuracy and
to write a checkpoint, in the single-process format, atomically. Two ways to drive it:

* :class:`ShardedGradient` — the trainer's gradient callable ``(shard, x, labels)`` with the
  hooks :func:`refbraid.training.trainer.fit` asks for (``localize``, ``gather_params``,
  ``gather_optimizer``, ``share``): ``refbraid train`` under ``mpiexec`` uses it;
* :class:`ShardedTrainer` — a stand-alone step/gather object for your own loop (its
  ``gather_state`` is what :func:`refbraid.training.checkpoint.save_checkpoint` writes).

Shape legend: N layers, Q layer ranks, [b_q, b_{q+1}) the layer block of rank q.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from ..network import Params
from .engine import WorldHooks
from .network import DistributedGradient

#: what a sharded gradient offers (DistributedGradient, or chained.py's encoder–decoder)
SHARDED_INTERFACE = ("sharded", "shard", "gather", "logits", "world", "is_root")


def _check_gradient(gradient) -> DistributedGradient:
    if not isinstance(gradient, DistributedGradient) and not all(
            hasattr(gradient, a) for a in SHARDED_INTERFACE):
        raise TypeError(f"`gradient` must be a DistributedGradient (or offer "
                        f"{', '.join(SHARDED_INTERFACE)}), got {type(gradient).__name__}.")
    return gradient


#: what an optimizer offers (refbraid.training.optim's SGD and Adam)
OPTIMIZER_INTERFACE = ("step", "state_dict", "load_state_dict")


def _check_optimizer(optimizer):
    if not all(callable(getattr(optimizer, a, None)) for a in OPTIMIZER_INTERFACE):
        raise TypeError(f"`optimizer` must be a refbraid Optimizer (offering "
                        f"{', '.join(OPTIMIZER_INTERFACE)}), got {type(optimizer).__name__}.")
    return optimizer


def shard_optimizer(gradient: DistributedGradient, optimizer, shard: Params) -> None:
    """Restrict ``optimizer``'s state (of the full parameters, or fresh) to this rank's
    ``shard``, in place: the step counter and the buffer entries of the owned parameters."""
    state = optimizer.state_dict()  # host copies (through the host door)
    local = gradient.shard({k: v for k, v in state.items() if k != "step"})
    optimizer.load_state_dict({"step": state["step"], **local}, shard, device_asarray(gradient))


def gather_optimizer(gradient: DistributedGradient, optimizer, params: Params | None,
                     root: int = 0):
    """On world rank ``root``: a copy of ``optimizer`` holding the state of the whole network
    (``params`` = the gathered full parameters there); None elsewhere. Collective."""
    state = gradient.gather(optimizer.state_dict(), root)
    if state is None:
        return None
    full = copy.copy(optimizer)  # same class and hyper-parameters; load_state_dict rebinds
    full.load_state_dict(state, params, device_asarray(gradient))
    return full


def device_asarray(gradient):
    """The gradient's backend ``asarray`` when its arrays live on a device (the optimizer
    state, a host copy, goes back there), else None."""
    bk = getattr(gradient, "bk", None)
    return None if bk is None or bk.xp is np else bk.asarray


class ShardedGradient(WorldHooks):
    """The trainer's view of sharded MPI training: ``gradient(shard, x, labels)``.

    Returns ``(loss, ∂L/∂shard, stats)``, so the unchanged loop step ``optimizer.step(shard,
    grads)`` is local. Hooks used by :func:`~refbraid.training.trainer.fit` and ``train``:

    ``localize(state)``          full params and optimizer state → this rank's shard (in place)
    ``gather_params(shard)``     full params on world rank 0, None elsewhere (collective)
    ``gather_optimizer(opt, p)`` full optimizer state on world rank 0 (collective)
    ``share(value)``             world rank 0's value on every rank (collective)
    ``logits(params, x)``        the MGRIT forward pass, on full params (rank 0 evaluates)
    """

    __name__ = "layer-parallel-mpi"

    def __init__(self, gradient: DistributedGradient):
        self.gradient = _check_gradient(gradient)
        self.logits, self.world = gradient.logits, gradient.world

    def __call__(self, shard: Params, x, labels) -> tuple[float, Params, dict[str, float]]:
        return self.gradient.sharded(shard, x, labels)

    def localize(self, state) -> None:
        """``state.params`` and ``state.optimizer`` (full, identical on every rank) become
        this rank's shard, in place."""
        state.params = self.gradient.shard(state.params)
        shard_optimizer(self.gradient, _check_optimizer(state.optimizer), state.params)

    def gather_params(self, shard: Params, root: int = 0) -> Params | None:
        """The full parameters on world rank ``root`` (None elsewhere). Collective."""
        return self.gradient.gather(shard, root)

    def gather_optimizer(self, optimizer, params: Params | None,
                         root: int = 0):
        """See :func:`gather_optimizer`. Collective."""
        return gather_optimizer(self.gradient, optimizer, params, root)


class ShardedTrainer:
    """Training with owned parameter shards: the optimizer step is local to the owner.

    ``step(x, labels)`` = sharded gradient + ``optimizer.step`` on this rank's shard. The
    optimizers are element-wise (SGD, Adam), so updating shards equals updating the whole.
    ``optimizer`` may hold the state of the full ``params`` (e.g. resumed): it is sharded too.
    """

    def __init__(self, gradient: DistributedGradient, params: Params, optimizer):
        self.gradient = _check_gradient(gradient)
        self.optimizer = _check_optimizer(optimizer)
        self.shard = gradient.shard(params)
        shard_optimizer(gradient, optimizer, self.shard)

    def step(self, x, labels) -> tuple[float, dict[str, float]]:
        """One training step on the batch (every rank passes the same full batch)."""
        loss, grads, stats = self.gradient.sharded(self.shard, x, labels)
        self.optimizer.step(self.shard, grads)
        return loss, stats

    def gather_params(self, root: int = 0) -> Params | None:
        """The full parameters on world rank ``root`` (None elsewhere). Collective."""
        return self.gradient.gather(self.shard, root)

    def gather_optimizer_state(self, root: int = 0) -> dict[str, np.ndarray] | None:
        """The optimizer state of the whole network on ``root`` (``step`` and buffers)."""
        return self.gradient.gather(self.optimizer.state_dict(), root)

    def gather_state(self, root: int = 0) -> tuple[Params | None, Any]:
        """(full parameters, optimizer of the whole network) on world rank ``root``, (None,
        None) elsewhere: what a checkpoint holds
        (:func:`refbraid.training.checkpoint.save_checkpoint` writes them). Collective."""
        params = self.gather_params(root)
        return params, gather_optimizer(self.gradient, self.optimizer, params, root)
