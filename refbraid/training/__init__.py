"""Sequential training: models, optimizers, the training loop, checkpoints, plots, CLI.

===============  ==============================================================
module           job
===============  ==============================================================
models.py        model name + data shape → Network ("resnet", "conv")
optim.py         SGD (momentum) and Adam, in place on the flat params dict
trainer.py       mini-batch loop with a pluggable ``gradient(params, x, y)``
checkpoint.py    atomic .npz checkpoints; bit-identical resume
config.py        the frozen, validated TrainConfig (one field per CLI flag)
cli.py           ``refbraid train``
plots.py         training curves, decision regions, trajectories (Figures)
atomic.py        temp-file + os.replace writes for every output file
===============  ==============================================================
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
