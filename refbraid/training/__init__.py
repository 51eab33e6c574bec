"""Training: models, gradient selection, optimizers, the loop, checkpoints, CLI.

The gradients themselves live below training, beside the network they differentiate:
:mod:`refbraid.network` (sequential backprop), :mod:`refbraid.layer_parallel` (MGRIT forward
and adjoint solves) and :mod:`refbraid.gradient_error` (how far apart the two are). Training
picks one (``gradients.py``) and builds the models (``models.py``, including
:mod:`refbraid.sequence`'s, which use the same layer-parallel solve).

=================  ==============================================================
module             job
=================  ==============================================================
models.py          model name + data shape → Network (resnet, conv) or sequence model
optim.py           SGD (momentum) and Adam, in place on the flat params dict
gradients.py       the one place that picks a gradient: backprop, MGRIT, MPI
                   (the MPI gradients themselves: :mod:`refbraid.distributed`)
bias_control.py    ``--bias-control``: the rule that sets MGRIT's iterations from measurements
multilevel.py      MG/Opt in depth; ``mgopt_step.py`` its training step, ``nested.py``
                   nested initialisation from shallower networks
buffers.py         model buffers (batch norm's running statistics) kept and restored
trainer.py         mini-batch loop with a pluggable ``gradient(params, x, y)``
evaluate.py        loss and accuracy over a data set; per-epoch means of solver stats
divergence.py      the rules that stop a diverging run (NaN/inf, a loss that blew up)
run.py             a run from a config: claim the folder, set up, fit, final figures
run_folder.py      the run folder: checked before work, locked, never overwritten unasked
checkpoint.py      atomic .npz checkpoints; bit-identical resume
config.py          the frozen, validated TrainConfig (one field per CLI flag)
cli.py             ``refbraid train``
plots.py           training curves, solver history, decision regions, trajectories
atomic.py          temp-file + os.replace writes for every output file
=================  ==============================================================
"""

from ..models import MODELS, build_network
from .config import TrainConfig
from .divergence import TrainingDiverged
from .gradients import select_gradient, sequential_gradient
from .optim import SGD, Adam, make_optimizer
from .run import train
from .trainer import TrainResult, TrainState, fit

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
