"""Training: models, gradients (sequential and layer-parallel), the loop, checkpoints, CLI.

=================  ==============================================================
module             job
=================  ==============================================================
models.py          model name + data shape → Network (resnet, conv) or sequence model
optim.py           SGD (momentum) and Adam, in place on the flat params dict
layer_parallel.py  MGRIT forward + adjoint solves through a network, gradient from them
gradient_error.py  layer-parallel gradient error vs MGRIT cycles (table, figure)
distributed.py     the layer-parallel gradient over MPI ranks (and data parallelism)
ownership.py       which rank owns which layers, ghosts and gradient rows (bookkeeping)
sharded.py         owned parameter shards: optimizer steps local to each rank
gradients.py       the one place that picks a gradient: backprop, MGRIT, MPI
trainer.py         mini-batch loop with a pluggable ``gradient(params, x, y)``
checkpoint.py      atomic .npz checkpoints; bit-identical resume
config.py          the frozen, validated TrainConfig (one field per CLI flag)
cli.py             ``refbraid train``
plots.py           training curves, solver history, decision regions, trajectories
atomic.py          temp-file + os.replace writes for every output file
=================  ==============================================================
"""

from .config import TrainConfig
from .models import MODELS, build_network
from .optim import SGD, Adam, make_optimizer
from .trainer import (
    TrainingDiverged,
    TrainResult,
    TrainState,
    fit,
    select_gradient,
    sequential_gradient,
    train,
)

__all__ = [
    "MODELS",
    "SGD",
    "Adam",
    "TrainConfig",
    "TrainResult",
    "TrainState",
    "TrainingDiverged",
    "build_network",
    "fit",
    "make_optimizer",
    "select_gradient",
    "sequential_gradient",
    "train",
]
