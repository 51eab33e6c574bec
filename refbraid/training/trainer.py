"""The training loop, with a pluggable gradient.

One epoch (``B`` = batch size, π a fresh seeded permutation of the n training samples)::

    for each batch I = π[k B : (k+1) B]:
        L, ∇θ, stats = gradient(θ, x[I], y[I])      # any method: backprop, MGRIT, ...
        stop if L is NaN/inf
        θ ← optimizer(θ, ∇θ)
    stop if Σ_I |I| L_I / n  >  10 · ln K       (worse than guessing: the loss blew up)
    log: mean train loss, train/val accuracy, val loss, mean of each numeric stat

The gradient is a callable ``gradient(params, x, labels) -> (loss, grads, stats)``;
:func:`~refbraid.training.gradients.select_gradient` is the single place that picks it from
the config (sequential backprop with ``--serial``, layer-parallel MGRIT otherwise, which
reports solver statistics in ``stats``; the loop averages them per epoch without knowing what
they mean).

Sharded gradients (``refbraid train`` under ``mpiexec``,
:class:`~refbraid.distributed.sharded.ShardedGradient`) bring optional hooks: ``localize(state)``
turns the state into this rank's shard before the first epoch (the loop step above then runs
on the shard), ``gather_params`` / ``gather_optimizer`` collect the full parameters and
optimizer state on world rank 0 once per epoch, where they are evaluated and checkpointed, and
``share`` gives every rank rank 0's epoch record. At the end ``state`` holds the full
parameters again on rank 0 (its shard elsewhere).

Files in the output folder, each written atomically: ``log.json`` (every epoch, and with the
final status: "finished", "diverged", "interrupted" or "error"), ``curves.png``, ``mgrit.png``
(at checkpoints and at the end), ``checkpoint.npz`` (every ``checkpoint_every`` epochs and at
the last epoch; with the model's buffers, batch norm's running statistics). However the loop
ends, the log says how, and the exception that ended it carries a note saying what the folder
kept (:func:`refbraid.errors.add_note`).

Shape legend: n training samples, B batch, in_shape one network input.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from .. import interrupts
from ..atomic import save_figure, write_json
from ..backends import Backend, get_backend
from ..data import Dataset
from ..errors import add_note
from ..layers.init import NonFiniteError
from ..mgrit import MGRITDiverged
from ..models import as_network_input
from ..network import Network
from .buffers import model_buffers
from .checkpoint import FILENAME as CHECKPOINT_FILE
from .checkpoint import save_checkpoint
from .divergence import (
    TrainingDiverged,
    check_batch_loss,
    check_epoch_loss,
    diverged,
    loss_limit,
)
from .evaluate import EVAL_BATCH, evaluate, finite_or_none, mean_stats  # noqa: F401
from .gradients import (  # noqa: F401  (re-exported: the trainer's public gradient choices)
    GradientFn,
    layer_parallel_settings,
    mgrit_gradient,
    select_gradient,
    sequential_gradient,
)
from .optim import Optimizer
from .plots import plot_solver_history, plot_training_curves, run_title

Params = dict[str, Any]

LOG_FILE = "log.json"
CURVES_FILE = "curves.png"
MGRIT_FILE = "mgrit.png"  # layer-parallel runs: residuals (and gradient error) per epoch


def run_status(err: BaseException) -> str:
    """``log.json``'s status for a run that ``err`` ended."""
    if isinstance(err, TrainingDiverged):
        return "diverged"
    if interrupts.ended_by_interrupt(err):  # a Ctrl-C, or an error it caused on its way out
        return "interrupted"
    return "error"


# ----------------------------------------------------------------------------- state
@dataclass
class TrainState:
    """Everything a checkpoint holds: parameters, optimizer, shuffling RNG, epoch, history."""

    params: Params
    optimizer: Optimizer
    rng: np.random.Generator
    epoch: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class TrainResult:
    """What :func:`fit` leaves behind."""

    state: TrainState
    out_dir: Path
    files: dict[str, Path]
    elapsed_s: float
    status: str = "finished"

    @property
    def final(self) -> dict[str, Any]:
        return self.state.history[-1] if self.state.history else {}


# ----------------------------------------------------------------------------- the loop
def train_epoch(state: TrainState, gradient: GradientFn, x_train, y_train, batch_size: int,
                bk: Backend, epoch: int, first_step: bool = False
                ) -> tuple[float, list[dict[str, Any]], float]:
    """One pass over a fresh seeded permutation: θ ← optimizer(θ, ∇θ L_I) for each batch I.

    Returns (Σ_I |I| L_I / n, the stats dict of every step, the first batch's loss); raises
    TrainingDiverged on a NaN/inf loss, before applying that batch's update (``first_step``:
    this epoch starts the run, so a bad first loss is not the optimizer's doing).
    """
    n = x_train.shape[0]
    perm = state.rng.permutation(n)
    loss_sum, per_step, first_loss = 0.0, [], float("nan")
    lr = state.optimizer.hyper()["lr"]
    for b, s in enumerate(range(0, n, batch_size)):
        interrupts.check()  # a Ctrl-C that a callback swallowed stops here, between steps
        idx = perm[s : s + batch_size]
        xb, yb = bk.asarray(x_train[idx]), bk.asarray(y_train[idx])  # B,*in_shape and B
        where = {"epoch": epoch, "batch": b + 1, "first_step": first_step and b == 0, "lr": lr}
        try:
            loss, grads, stats = gradient(state.params, xb, yb)
            loss = float(loss)
            check_batch_loss(loss, **where)
            if not isinstance(stats, dict):
                raise TypeError(f"`gradient` must return (loss, grads, stats: dict), got stats "
                                f"of type {type(stats).__name__}.")
            state.optimizer.step(state.params, grads)
        except MGRITDiverged as err:  # the layer-parallel solves blew up: same remedy
            raise diverged(str(err).rstrip("."), **where,
                           remedy=", or check the MGRIT settings") from None
        except NonFiniteError as err:  # NaN/inf parameters or gradients
            raise diverged(str(err).rstrip("."), **where) from None
        loss_sum += loss * idx.size
        per_step.append(stats)
        if b == 0:
            first_loss = loss
    return loss_sum / n, per_step, first_loss


class _RunFiles:
    """The files :func:`fit` writes in ``out`` (world rank 0; nothing when ``out`` is None)."""

    def __init__(self, out: Path | None, meta: dict[str, Any], title: str):
        self.out, self.meta, self.title = out, meta, title
        self.files: dict[str, Path] = {}
        self.checkpoint_epoch: int | None = None

    def log(self, state: TrainState, status: str, error: str | None = None) -> None:
        if self.out is None:
            return
        log = {**self.meta, "status": status, "epoch": state.epoch, "history": state.history}
        if error:
            log["error"] = error
        self.files["log"] = write_json(self.out / LOG_FILE, log)

    def curves(self, state: TrainState) -> None:
        if self.out is not None and state.history:
            self.files["curves"] = save_figure(plot_training_curves(state.history, self.title),
                                               self.out / CURVES_FILE)
            solver = plot_solver_history(state.history,
                                         f"MGRIT final residuals per batch, {self.title}")
            if solver is not None:
                self.files["mgrit"] = save_figure(solver, self.out / MGRIT_FILE)

    def checkpoint(self, state: TrainState, params: Params, optimizer: Optimizer,
                   buffers: dict[str, Any] | None = None) -> None:
        if self.out is None:
            return
        self.files["checkpoint"] = save_checkpoint(
            self.out / CHECKPOINT_FILE, epoch=state.epoch, params=params, optimizer=optimizer,
            rng=state.rng, config=self.meta.get("config", {}), history=state.history,
            buffers=buffers)
        self.checkpoint_epoch = state.epoch
        self.curves(state)

    def record_stop(self, state: TrainState, err: BaseException) -> None:
        """Best effort on the way out: the log gets the status, ``err`` a note of what is kept."""
        if self.out is None:
            return
        status = run_status(err)
        try:
            self.log(state, status, str(err) or type(err).__name__)
            if status == "diverged":
                self.curves(state)
        except Exception as write_err:  # e.g. the disk that failed is still full
            add_note(err, f"(log.json could not be updated: {write_err})")
        kept = []
        if (self.out / CHECKPOINT_FILE).exists():
            epoch = self.checkpoint_epoch
            kept.append("checkpoint.npz" + (f" (epoch {epoch})" if epoch else ""))
        if (self.out / LOG_FILE).exists():
            kept.append(f"log.json (status {status!r})")
        kept += [p.name for p in sorted(self.out.glob("*.png"))]
        if kept:
            note = f"Kept {', '.join(kept)} in {self.out}/"
            if self.checkpoint_epoch:
                note += f"; continue with `--resume {self.out}`"
            add_note(err, note + ".")


def record_stop(out: Path | None, meta: dict[str, Any], state: TrainState,
                err: BaseException) -> None:
    """After :func:`fit` returned: ``err`` (e.g. Ctrl-C while the final figures are made)
    ended the run; its log gets the status and ``err`` a note of what the folder kept."""
    files = _RunFiles(out, meta, "")
    if out is not None and (out / CHECKPOINT_FILE).exists():
        files.checkpoint_epoch = state.epoch
    files.record_stop(state, err)


def fit(net: Network, state: TrainState, data: Dataset, gradient: GradientFn, *, epochs: int,
        batch_size: int, bk: Backend | str = "numpy", out_dir: str | Path | None = None,
        checkpoint_every: int = 0, meta: dict[str, Any] | None = None, quiet: bool = False,
        stream: TextIO | None = None) -> TrainResult:
    """Train from ``state.epoch`` up to ``epochs`` (total), updating ``state`` in place.

    ``meta`` (e.g. the config and data summary) goes into the log and, under ``config``, the
    checkpoints. With ``out_dir`` None nothing is written; over MPI (a gradient with
    ``is_root``) only world rank 0 writes. ``fit`` writes into ``out_dir`` as it is:
    :func:`refbraid.training.run.train` is what checks and locks a run folder first.
    """
    bk = get_backend(bk)
    stream = stream or sys.stdout
    meta = dict(meta or {})
    out = Path(out_dir) if out_dir is not None and getattr(gradient, "is_root", True) else None
    run_files = _RunFiles(out, meta, run_title(meta, data.name))
    if out is not None and (out / CHECKPOINT_FILE).exists() and state.epoch:
        run_files.checkpoint_epoch = state.epoch  # resumed from this folder's checkpoint
    x_train = as_network_input(net, data.x_train)
    x_val = as_network_input(net, data.x_val)
    logits_fn = getattr(gradient, "logits", None)  # the forward pass the gradient trains
    localize = getattr(gradient, "localize", None)  # owned shards over MPI: see the docstring
    share = getattr(gradient, "share", None)
    writes = out is not None if share is None else share(out is not None)  # same on all ranks
    t_start = time.perf_counter()
    if localize is not None:
        localize(state)

    def full_params() -> Params | None:
        """The full parameters where they are evaluated (collective for shards)."""
        return state.params if localize is None else gradient.gather_params(state.params)

    def scores(params: Params | None) -> dict[str, float] | None:
        """Train accuracy, validation loss and accuracy of ``params`` (None: not here)."""
        if params is None:
            return None
        _, train_acc = evaluate(net, params, x_train, data.y_train, bk, logits_fn=logits_fn)
        val_loss, val_acc = evaluate(net, params, x_val, data.y_val, bk, logits_fn=logits_fn)
        res = {"train_acc": train_acc, "val_loss": finite_or_none(val_loss), "val_acc": val_acc}
        if logits_fn is not None:  # the same weights with an exact (sequential) forward
            res["val_acc_sequential_forward"] = evaluate(net, params, x_val, data.y_val, bk)[1]
        return res

    def unshard() -> None:
        """Shards back to the full parameters and optimizer state on world rank 0."""
        if localize is not None:
            params = gradient.gather_params(state.params)
            optimizer = gradient.gather_optimizer(state.optimizer, params)
            if params is not None:
                state.params, state.optimizer = params, optimizer

    limit = loss_limit(data.n_classes)  # an epoch's mean loss above it: diverged
    first_loss = None  # the loss of the run's first batch
    try:
        for epoch in range(state.epoch + 1, epochs + 1):
            t0 = time.perf_counter()
            if hasattr(gradient, "begin_epoch"):  # epoch hooks: DASO (distributed/daso.py)
                gradient.begin_epoch(epoch)
            train_loss, per_step, epoch_first = train_epoch(
                state, gradient, x_train, data.y_train, batch_size, bk, epoch,
                first_step=first_loss is None)
            if hasattr(gradient, "end_epoch"):  # e.g. average the nodes before evaluating
                gradient.end_epoch(epoch, state, train_loss)
            first_loss = epoch_first if first_loss is None else first_loss
            params = full_params()  # gathered once per epoch: evaluated and checkpointed
            state.epoch = epoch
            record = {
                "epoch": epoch,
                "train_loss": finite_or_none(train_loss),
                **(scores(params) or {}),
                "steps": len(per_step),
                "time_s": time.perf_counter() - t0,
                "stats": mean_stats(per_step),
            }
            if share is not None:  # the record rank 0 logs, on every rank
                record = share(record)
            state.history.append(record)
            if not quiet:
                print(_progress_line(record, epochs), file=stream, flush=True)
            check_epoch_loss(train_loss, limit, epoch=epoch, lr=state.optimizer.hyper()["lr"],
                             first_loss=first_loss)
            run_files.log(state, "running")
            if writes and checkpoint_every and (epoch % checkpoint_every == 0
                                                or epoch == epochs):
                optimizer = state.optimizer if localize is None else \
                    gradient.gather_optimizer(state.optimizer, params)
                run_files.checkpoint(state, params, optimizer, model_buffers(net))
        interrupts.check()
        unshard()
        run_files.log(state, "finished")
        run_files.curves(state)
    except BaseException as err:
        if isinstance(err, TrainingDiverged):  # every rank diverges together: gather is safe
            unshard()
        run_files.record_stop(state, err)
        interrupts.reraise(err)
    return TrainResult(state, out if out is not None else Path("."), run_files.files,
                       time.perf_counter() - t_start)


def _progress_line(record: dict[str, Any], epochs: int) -> str:
    extra = "".join(f"  {k} {v:.3g}" for k, v in record["stats"].items() if v is not None)
    loss = "inf" if record["train_loss"] is None else f"{record['train_loss']:.4f}"
    return (f"epoch {record['epoch']:>{len(str(epochs))}}/{epochs}  loss {loss}  train acc "
            f"{100 * record['train_acc']:5.1f}%  val acc {100 * record['val_acc']:5.1f}%  "
            f"({record['time_s']:.2f} s){extra}")
