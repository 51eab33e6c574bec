"""Training with owned parameter shards over MPI: each rank's optimizer updates its own layers.

The optimizers are element-wise (SGD, Adam), so updating shards equals updating the whole;
checkpoints gather the shards on world rank 0, which writes them atomically.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np

from ..network import Params
from .distributed import DistributedGradient
from .optim import Optimizer


class ShardedTrainer:
    """Training with owned parameter shards: the optimizer step is local to the owner.

    ``step(x, labels)`` = sharded gradient + ``optimizer.step`` on this rank's shard. The
    optimizers are element-wise (SGD, Adam), so updating shards equals updating the whole.
    """

    def __init__(self, gradient: DistributedGradient, params: Params, optimizer: Optimizer):
        if not isinstance(gradient, DistributedGradient):
            raise TypeError(f"`gradient` must be a DistributedGradient, got "
                            f"{type(gradient).__name__}.")
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"`optimizer` must be a refbraid Optimizer, got "
                            f"{type(optimizer).__name__}.")
        self.gradient = gradient
        self.shard = gradient.shard(params)
        self.optimizer = optimizer

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
        full = self.gradient.gather(self.optimizer.state_dict(), root)
        return full

    def save_checkpoint(self, path: str | Path, *, epoch: int, rng: np.random.Generator,
                        config: dict[str, Any], history: list[dict[str, Any]],
                        root: int = 0) -> Path | None:
        """Gather shards and optimizer state; world rank ``root`` writes the checkpoint
        atomically (:func:`refbraid.training.checkpoint.save_checkpoint`). Collective."""
        from .checkpoint import save_checkpoint

        params = self.gather_params(root)
        state = self.gather_optimizer_state(root)
        if params is None:
            return None
        full_opt = copy.copy(self.optimizer)  # same class and hyper-parameters
        full_opt.load_state_dict(state, params)
        return save_checkpoint(path, epoch=epoch, params=params, optimizer=full_opt, rng=rng,
                               config=config, history=history)
