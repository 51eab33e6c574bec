"""``refbraid train``: train layer-parallel (or ``--serial``); write log, curves, checkpoints.

Flags map one-to-one onto :class:`refbraid.training.config.TrainConfig` fields, whose
defaults they show; the config validates them (errors name the flag). Example::

    refbraid train                                   # Peaks, ResNet, defaults
    refbraid train --data digits --model conv --layers 4 --width 4 --epochs 5
    refbraid train --checkpoint-every 5 --epochs 10  # then: --resume runs/peaks-resnet --epochs 20
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

import numpy as np

from ..backends import BACKENDS
from ..backends.reference import ACTIVATIONS
from ..conventions import add_conventions_flag, refbraid_counts
from ..data import DATASETS
from ..models import MODEL_DEFAULTS, MODELS
from .config import DTYPES, TrainConfig, config_from_args
from .optim import OPTIMIZERS

_DEFAULTS = {f.name: f.default for f in fields(TrainConfig)}


def _add(parser, name: str, type_, help_: str, **kwargs) -> None:
    flag = "--" + name.replace("_", "-")
    default = _DEFAULTS[name]
    if default is None and name in MODEL_DEFAULTS["resnet"]:
        shown = f" (default: per --model; resnet: {MODEL_DEFAULTS['resnet'][name]})"
    else:
        shown = "" if default is None else f" (default: {default})"
    parser.add_argument(flag, dest=name, type=type_, default=default, help=help_ + shown, **kwargs)


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``train`` sub-command on ``subparsers``."""
    p = subparsers.add_parser(
        "train",
        help="train a network (layer-parallel MGRIT or --serial); write log, curves, checkpoints",
        description="Train a layer-as-time-step network. Writes to --out: log.json (config, "
        "per-epoch history, final status), curves.png (loss and accuracy), with checkpoints "
        "checkpoint.npz, and for layer-parallel runs mgrit.png (solver residuals per epoch), "
        "gradient_error.png and gradient_error.json (gradient error vs MGRIT cycles at the "
        "final weights), with --trace trace.json and timeline.png (one training step, every "
        "rank); .refbraid.lock marks a folder in use. "
        "Accuracy: 'val acc' is measured with the forward pass the run trains (the MGRIT "
        "solve for a layer-parallel run, as TorchBraid reports it); 'exact-forward val acc' "
        "runs the same weights through the exact sequential forward pass.",
        epilog="A folder holding a run is never overwritten unasked: continue it with "
        "--resume DIR, or replace it with --overwrite. log.json's status: running, finished, "
        "diverged (stopped: the loss became NaN/inf, or an epoch's mean loss exceeded 10x "
        "that of a uniform guess, 10 ln K for K classes), interrupted (Ctrl-C), error.",
    )
    add_config_arguments(p)
    g = p.add_argument_group("output")
    _add(g, "out", str, "output folder (default: the --resume run's folder, else "
         "runs/<data>-<model>); a folder that holds a run is refused unless --resume points "
         "at it or --overwrite is given", metavar="DIR")
    _add(g, "checkpoint_every", int, "write checkpoint.npz every K epochs and at the end "
         "(0: never)", metavar="K")
    _add(g, "resume", str, "continue from a checkpoint file (or a run folder holding "
         "checkpoint.npz); --epochs is the new total; writes to that run's folder unless "
         "--out is given", metavar="PATH")
    g.add_argument("--overwrite", dest="overwrite", action="store_true",
                   help="replace the run already in --out (its log, checkpoint and figures "
                   "are deleted first)")
    g.add_argument("--trace", dest="trace", action="store_true",
                   help="record the second training step on every rank (each step "
                   "application, message and reduction): trace.json and timeline.png")
    g.add_argument("--quiet", dest="quiet", action="store_true",
                   help="no per-epoch progress lines (the final summary is still printed)")
    p.set_defaults(func=run)
    return p


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that describe a run's data, network, optimisation, execution and MGRIT
    settings (shared by ``refbraid train`` and ``refbraid scale``)."""
    g = p.add_argument_group("data")
    _add(g, "data", str, f"data set: {' | '.join(DATASETS)}", metavar="NAME")
    _add(g, "data_dir", str, "folder with the MNIST IDX files (train-images-idx3-ubyte, "
         "train-labels-idx1-ubyte, optionally .gz)", metavar="DIR")
    _add(g, "samples", int, "Peaks points (default 5000), or a seeded subset of digits/MNIST "
         "(default: all)", metavar="N")
    _add(g, "val_fraction", float, "share of the samples held out for validation", metavar="F")
    g = p.add_argument_group("network")
    _add(g, "model", str, f"network: {' | '.join(MODELS)}", metavar="NAME")
    _add(g, "layers", int, "number N of ODE steps (residual layers)", metavar="N")
    _add(g, "width", int, "width C: features (resnet) or channels (conv)", metavar="C")
    _add(g, "T", float, "final time; step size h = T/N", metavar="T")
    _add(g, "activation", str, f"activation: {' | '.join(ACTIVATIONS)}", metavar="NAME")
    _add(g, "buffer", int, "gpt: serial buffer layers at each end, outside the MGRIT block",
         metavar="B")
    g = p.add_argument_group("optimisation")
    _add(g, "epochs", int, "total number of epochs", metavar="E")
    _add(g, "batch_size", int, "mini-batch size", metavar="B")
    _add(g, "lr", float, "learning rate", metavar="LR")
    _add(g, "optimizer", str, f"optimizer: {' | '.join(OPTIMIZERS)}", metavar="NAME")
    _add(g, "momentum", float, "SGD momentum", metavar="MU")
    _add(g, "seed", int, "seed of the data, the initial weights and the shuffling", metavar="S")
    g = p.add_argument_group("execution")
    _add(g, "backend", str, f"kernels: {' | '.join(BACKENDS)}", metavar="NAME")
    _add(g, "dtype", str, f"floating point type: {' | '.join(DTYPES)}", metavar="NAME")
    g.add_argument("--serial", dest="serial", action="store_true",
                   help="sequential backprop (layer by layer) instead of layer-parallel MGRIT")
    g.add_argument("--cuda-graphs", dest="cuda_graphs", action="store_true",
                   help="cupy: record each gradient once as a CUDA graph and replay it (one "
                   "launch per step; MGRIT always runs its --fwd-iters/--bwd-iters cycles)")
    _add(g, "data_parallel", int, "under mpiexec -n P: D data-parallel groups of P/D "
         "layer-parallel ranks (D must divide P)", metavar="D")
    _add(g, "dp_groups", int, "DASO: the data-parallel ranks form G nodes that sum gradients "
         "every step (G must divide the ranks)", metavar="G")
    _add(g, "global_sync_every", int, "DASO: nodes average parameters every K batches at most "
         "(adapted on loss plateaus; 1: plain data parallelism)", metavar="K")
    _add(g, "space_parallel", int, "under mpiexec -n P: S ranks split every feature map by "
         "rows (conv model; layer ranks are P/(D·S))", metavar="S")
    g = p.add_argument_group("layer-parallel MGRIT (defaults: TorchBraid's examples)")
    _add(g, "levels", int, "MGRIT levels (1: exact sequential solves)", metavar="L")
    _add(g, "cfactor", int, "coarsening factor", metavar="M")
    _add(g, "fwd_iters", int, "forward MGRIT cycles after the skipped first down-cycle "
         "(TorchBraid counts one more; see --torchbraid-conventions)", metavar="K")
    _add(g, "bwd_iters", int, "adjoint MGRIT cycles after the skipped first down-cycle",
         metavar="K")
    add_conventions_flag(g, "; training never does a final FC relaxation, TorchBraid's "
                         "adjoint does: `refbraid compare --torchbraid-conventions` models it")
    _add(g, "fwd_tol", float, "forward absolute residual tolerance", metavar="TOL")
    _add(g, "bwd_tol", float, "adjoint absolute residual tolerance", metavar="TOL")
    _add(g, "relax", str, "relaxation per level, finest first: F or FCF, comma-separated",
         metavar="LIST")
    _add(g, "cycle", str, "V or F cycle", metavar="V|F")
    g.add_argument("--no-skip-down", dest="skip_down", action="store_false",
                   help="do a full first cycle instead of TorchBraid's skipped down-cycle")
    _add(g, "check_gradient_every", int, "every K steps also compute sequential backprop and "
         "log the relative gradient error (0: never)", metavar="K")
    g.add_argument("--batch-norm", dest="batch_norm", action="store_true",
                   help="conv-stages: batch-normalised ODE steps y + h σ(BN(W * y)) and a BN "
                   "transition (running statistics from the final fine sweep, in checkpoints)")
    _add(g, "transition", str, "conv-stages: the down-sampling transition, pool (2×2 average "
         "pool + zero channels) or strided (stride-2 conv)", metavar="KIND")
    _add(g, "nested_init", int, "nested initialisation: first train N/2^K, …, N/2 layers "
         "(resnet, conv, conv-stages: every stage), interpolating the weights in t to the next "
         "depth", metavar="K")
    _add(g, "nested_epochs", int, "epochs at each shallower depth of --nested-init",
         metavar="E")
    _add(g, "nested_interp", str, "--nested-init weights in t: constant or linear",
         metavar="KIND")
    _add(g, "mgopt_levels", int, "one MG/Opt cycle in depth per step over L levels (N, "
         "N/2, …; resnet, conv, conv-stages; needs --optimizer sgd --momentum 0)", metavar="L")
    _add(g, "spatial_levels", str, "coarse levels that also halve the feature maps (spatial "
         "coarsening, TorchBraid's levels_to_coarsen), comma-separated, e.g. 1 or 1,2; conv "
         "models only; the levels above them need FCF relaxation", metavar="LIST")
    g = p.add_argument_group("gradient-bias control (layer-parallel runs)")
    _add(g, "bias_control", str, "off | measure (log bias and noise) | iterations (raise the "
         "MGRIT cycles) | serial (switch to backprop) when bias/noise > --bias-threshold",
         metavar="MODE")
    _add(g, "bias_every", int, "steps between bias/noise measurements", metavar="K")
    _add(g, "bias_threshold", float, "act when ‖g_MGRIT − g‖ / noise exceeds this",
         metavar="R")
    _add(g, "bias_micro", int, "micro-batches of the mini-batch noise estimate", metavar="M")
    _add(g, "bias_max_iters", int, "cap on forward/adjoint MGRIT cycles (mode iterations)",
         metavar="K")
    _add(g, "bias_signal", str, "what the controller acts on: measured (bias/noise, with "
         "backprop) | residual (the forward MGRIT residual, no serial pass)", metavar="S")
    _add(g, "bias_residual", float, "with --bias-signal residual: act when the final forward "
         "residual norm exceeds this", metavar="R")


def run(args: argparse.Namespace) -> int:
    """Build the config from the flags, train, print a short summary; returns 0."""
    from .. import interrupts
    from ..parallel.mpi import is_world_root
    from .run import train

    config = config_from_args(refbraid_counts(args))
    # NumPy's overflow warnings are not for the user: a loss that blows up ends the run with
    # one line saying "diverged" (refbraid.training.divergence), which is the message
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        result = train(config)  # under mpiexec an error ends the job: refbraid.cli.main
    interrupts.finished()  # every file is written: a late Ctrl-C has nothing left to stop
    if result.final and is_world_root():
        print(summary_line(config, result), file=sys.stdout, flush=True)
    return 0


def summary_line(config: TrainConfig, result) -> str:
    """The final line: accuracy of the trained forward pass and, for layer-parallel runs, of
    the same weights under the exact sequential forward pass."""
    final = result.final
    names = ", ".join(sorted(p.name for p in result.files.values()))
    exact = final.get("val_acc_sequential_forward")
    exact_text = "" if exact is None else f", exact-forward val acc {100 * exact:.1f}%"
    return (f"finished {config.data}-{config.model}: {final['epoch']} epochs, val acc "
            f"{100 * final['val_acc']:.1f}%{exact_text} (train acc {100 * final['train_acc']:.1f}"
            f"%, train loss {final['train_loss']:.4f}) in {result.elapsed_s:.1f} s; wrote "
            f"{names} to {result.out_dir}/")
