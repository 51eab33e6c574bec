"""The training loop, with a pluggable gradient.

One epoch (``B`` = batch size, π a fresh seeded permutation of the n training samples)::

    for each batch I = π[k B : (k+1) B]:
        L, ∇θ, stats = gradient(θ, x[I], y[I])      # any method: backprop, MGRIT, ...
        stop if L is NaN/inf
        θ ← optimizer(θ, ∇θ)
    log: mean train loss Σ_I |I| L_I / n, train/val accuracy, val loss, mean of each numeric stat

The gradient is a callable ``gradient(params, x, labels) -> (loss, grads, stats)``;
:func:`select_gradient` is the single place that picks it from the config (sequential
backprop with ``--serial``, layer-parallel MGRIT otherwise, which reports solver statistics
in ``stats``; the loop averages them per epoch without knowing what they mean).

Sharded gradients (``refbraid train`` under ``mpiexec``,
:class:`~refbraid.training.sharded.ShardedGradient`) bring optional hooks: ``localize(state)``
turns the state into this rank's shard before the first epoch (the loop step above then runs
on the shard), ``gather_params`` / ``gather_optimizer`` collect the full parameters and
optimizer state on world rank 0 once per epoch, where they are evaluated and checkpointed, and
``share`` gives every rank rank 0's epoch record. At the end ``state`` holds the full
parameters again on rank 0 (its shard elsewhere).

Files in the output folder, each written atomically: ``log.json`` (every epoch),
``curves.png`` (at checkpoints and at the end), ``checkpoint.npz`` (every
``checkpoint_every`` epochs and at the last epoch).

Shape legend: n training samples, B batch, in_shape one network input.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Number
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from ..backends import Backend, get_backend
from ..data import Dataset, load_dataset
from ..mgrit import MGRITDiverged
from ..network import Network, forward, init_params, to_backend
from .atomic import save_figure, write_json
from .checkpoint import FILENAME as CHECKPOINT_FILE
from .checkpoint import check_params_match, load_checkpoint, save_checkpoint
from .config import TrainConfig
from .gradients import (  # noqa: F401  (re-exported: the trainer's public gradient choices)
    GradientFn,
    layer_parallel_settings,
    mgrit_gradient,
    select_gradient,
    sequential_gradient,
)
from .models import as_network_input, build_network
from .optim import Optimizer, make_optimizer
from .plots import plot_solver_history, plot_training_curves

Params = dict[str, Any]

LOG_FILE = "log.json"
CURVES_FILE = "curves.png"
MGRIT_FILE = "mgrit.png"  # layer-parallel runs: residuals (and gradient error) per epoch
GRADIENT_ERROR_FILE = "gradient_error.png"  # layer-parallel runs: error vs MGRIT cycles
EVAL_BATCH = 4096  # samples per forward pass when measuring accuracy


class TrainingDiverged(ValueError):
    """The loss became NaN or inf."""


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


def _mean_stats(per_step: list[dict[str, Any]]) -> dict[str, float | None]:
    """Mean over the steps of every numeric scalar stat (bools count as 0/1); others skipped."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for stats in per_step:
        for k, v in stats.items():
            if isinstance(v, np.ndarray) and v.ndim == 0:
                v = v.item()
            if isinstance(v, (Number, np.number)) and not isinstance(v, complex):
                sums[k] = sums.get(k, 0.0) + float(v)
                counts[k] = counts.get(k, 0) + 1
    return {k: _finite_or_none(sums[k] / counts[k]) for k in sums}


def _finite_or_none(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def evaluate(net: Network, params: Params, x, labels, bk: Backend | str = "numpy",
             batch: int = EVAL_BATCH, logits_fn: Callable | None = None) -> tuple[float, float]:
    """(mean cross-entropy loss, accuracy) of the network on x (n, *in_shape), in chunks.

    ``logits_fn(params, x)`` replaces the sequential forward pass (e.g. the MGRIT forward
    solve a layer-parallel run trains with). Per-token outputs (B, T, K) with labels (B, T)
    (sequence models) are scored per token: loss and accuracy over all n·T tokens.
    """
    bk = get_backend(bk)
    n = 0
    loss_sum, correct = 0.0, 0
    for s in range(0, x.shape[0], batch):
        xb, yb = bk.asarray(x[s : s + batch]), bk.asarray(labels[s : s + batch])
        if logits_fn is not None:
            logits = logits_fn(params, xb)
        elif isinstance(net, Network):
            logits, _, _ = forward(net, params, xb, bk, keep=False)
        else:
            logits = net.logits(params, xb, bk)
        if logits.ndim == 3:  # one prediction per token
            logits, yb = logits.reshape(-1, logits.shape[-1]), yb.reshape(-1)
        loss, _ = bk.softmax_cross_entropy(logits, yb)
        loss_sum += float(loss) * yb.shape[0]
        n += yb.shape[0]
        correct += int((bk.to_numpy(logits).argmax(axis=1) == bk.to_numpy(yb)).sum())
    return loss_sum / n, correct / n


# ----------------------------------------------------------------------------- the loop
def train_epoch(state: TrainState, gradient: GradientFn, x_train, y_train, batch_size: int,
                bk: Backend, epoch: int) -> tuple[float, list[dict[str, Any]]]:
    """One pass over a fresh seeded permutation: θ ← optimizer(θ, ∇θ L_I) for each batch I.

    Returns (Σ_I |I| L_I / n, the stats dict of every step); raises TrainingDiverged on a
    NaN/inf loss, before applying that batch's update.
    """
    n = x_train.shape[0]
    perm = state.rng.permutation(n)
    loss_sum, per_step = 0.0, []
    for b, s in enumerate(range(0, n, batch_size)):
        idx = perm[s : s + batch_size]
        xb, yb = bk.asarray(x_train[idx]), bk.asarray(y_train[idx])  # B,*in_shape and B
        lr_hint = f"try a smaller learning rate `--lr`, now {state.optimizer.hyper()['lr']:g}"
        try:
            loss, grads, stats = gradient(state.params, xb, yb)
        except MGRITDiverged as err:  # the layer-parallel solves blew up: same remedy
            raise TrainingDiverged(f"{err} (epoch {epoch}, batch {b + 1}); stopped ({lr_hint}, "
                                   f"or check the MGRIT settings).") from None
        loss = float(loss)
        if not math.isfinite(loss):
            raise TrainingDiverged(
                f"the training loss became {loss} at epoch {epoch}, batch {b + 1}; stopped "
                f"({lr_hint})."
            )
        if not isinstance(stats, dict):
            raise TypeError(f"`gradient` must return (loss, grads, stats: dict), got stats of "
                            f"type {type(stats).__name__}.")
        state.optimizer.step(state.params, grads)
        loss_sum += loss * idx.size
        per_step.append(stats)
    return loss_sum / n, per_step


def fit(net: Network, state: TrainState, data: Dataset, gradient: GradientFn, *, epochs: int,
        batch_size: int, bk: Backend | str = "numpy", out_dir: str | Path | None = None,
        checkpoint_every: int = 0, meta: dict[str, Any] | None = None, quiet: bool = False,
        stream: TextIO | None = None) -> TrainResult:
    """Train from ``state.epoch`` up to ``epochs`` (total), updating ``state`` in place.

    ``meta`` (e.g. the config and data summary) goes into the log and, under ``config``, the
    checkpoints. With ``out_dir`` None nothing is written; over MPI (a gradient with
    ``is_root``) only world rank 0 writes.
    """
    bk = get_backend(bk)
    stream = stream or sys.stdout
    meta = dict(meta or {})
    out = Path(out_dir) if out_dir is not None and getattr(gradient, "is_root", True) else None
    files: dict[str, Path] = {}  # over MPI only world rank 0 writes
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
        res = {"train_acc": train_acc, "val_loss": _finite_or_none(val_loss), "val_acc": val_acc}
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

    def write_log(status: str, error: str | None = None) -> None:
        if out is None:
            return
        log = {**meta, "status": status, "epoch": state.epoch, "history": state.history}
        if error:
            log["error"] = error
        files["log"] = write_json(out / LOG_FILE, log)

    def write_curves() -> None:
        if out is not None and state.history:
            title = f"{data.name}: {meta.get('model', '')}".rstrip(": ")
            files["curves"] = save_figure(plot_training_curves(state.history, title),
                                          out / CURVES_FILE)
            solver = plot_solver_history(state.history)
            if solver is not None:
                files["mgrit"] = save_figure(solver, out / MGRIT_FILE)

    try:
        for epoch in range(state.epoch + 1, epochs + 1):
            t0 = time.perf_counter()
            train_loss, per_step = train_epoch(state, gradient, x_train, data.y_train,
                                               batch_size, bk, epoch)
            params = full_params()  # gathered once per epoch: evaluated and checkpointed
            state.epoch = epoch
            record = {
                "epoch": epoch,
                "train_loss": _finite_or_none(train_loss),
                **(scores(params) or {}),
                "steps": len(per_step),
                "time_s": time.perf_counter() - t0,
                "stats": _mean_stats(per_step),
            }
            if share is not None:  # the record rank 0 logs, on every rank
                record = share(record)
            train_acc, val_acc = record["train_acc"], record["val_acc"]
            state.history.append(record)
            if not quiet:
                extra = "".join(f"  {k} {v:.3g}" for k, v in record["stats"].items()
                                if v is not None)
                print(f"epoch {epoch:>{len(str(epochs))}}/{epochs}  loss {record['train_loss']:.4f}"
                      f"  train acc {100 * train_acc:5.1f}%  val acc {100 * val_acc:5.1f}%"
                      f"  ({record['time_s']:.2f} s){extra}", file=stream, flush=True)
            write_log("running")
            if writes and checkpoint_every and (epoch % checkpoint_every == 0
                                                or epoch == epochs):
                optimizer = state.optimizer if localize is None else \
                    gradient.gather_optimizer(state.optimizer, params)
                if out is not None:
                    files["checkpoint"] = save_checkpoint(
                        out / CHECKPOINT_FILE, epoch=epoch, params=params,
                        optimizer=optimizer, rng=state.rng, config=meta.get("config", {}),
                        history=state.history)
                    write_curves()
    except TrainingDiverged as err:
        unshard()
        write_log("diverged", str(err))
        write_curves()
        if out is not None:
            kept = ", ".join(sorted(p.name for p in files.values()))
            raise TrainingDiverged(f"{err} Kept {kept} in {out}.") from None
        raise
    unshard()
    write_log("finished")
    write_curves()
    return TrainResult(state, out if out is not None else Path("."), files,
                       time.perf_counter() - t_start)


# ----------------------------------------------------------------------------- from a config
def setup(config: TrainConfig) -> tuple[Network, Dataset, TrainState, Backend]:
    """Data, network, initial (or resumed) state and backend for ``config``.

    Seeds: the data set uses ``seed``; the weights and the shuffling use two independent
    streams spawned from ``SeedSequence(seed)``.
    """
    bk = get_backend(config.backend)
    data = load_dataset(config.data, data_dir=config.data_dir, n_samples=config.samples,
                        seed=config.seed, val_fraction=config.val_fraction).astype(config.dtype)
    try:
        net = build_network(config.model, data.input_shape, data.n_classes, config.layers,
                            config.width, config.T, config.activation, data.info)
    except ValueError as err:
        raise ValueError(f"`--model {config.model}` does not fit `--data {config.data}`: "
                         f"{err}") from err
    init_seq, shuffle_seq = np.random.SeedSequence(config.seed).spawn(2)
    init_rng = np.random.default_rng(init_seq)
    if isinstance(net, Network):
        params = init_params(net, init_rng, np.dtype(config.dtype))
    else:  # a sequence model (refbraid.sequence) lays out its own parameters
        params = net.init_params(init_rng, np.dtype(config.dtype))
    optimizer = make_optimizer(config.optimizer, config.lr, config.momentum)
    state = TrainState(params, optimizer, np.random.default_rng(shuffle_seq))
    if config.resume:
        state = resume_state(config, params, optimizer)
    state.params = to_backend(state.params, bk)
    if config.resume:  # buffers follow the parameters to the backend's arrays
        state.optimizer.load_state_dict(state.optimizer.state_dict(), state.params, bk.asarray)
    return net, data, state, bk


def resume_state(config: TrainConfig, params: Params, optimizer: Optimizer) -> TrainState:
    """The state saved in ``config.resume``, checked against the freshly built run."""
    ckpt = load_checkpoint(config.resume)
    source = f"checkpoint {config.resume!r}"
    try:
        saved = TrainConfig.from_dict(ckpt.config)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{source} holds an invalid config: {err}") from err
    mismatches = config.resume_mismatches(saved)
    if mismatches:
        raise ValueError(f"{source} does not match this run: " + "; ".join(mismatches) + ".")
    check_params_match(ckpt, params, source)
    if ckpt.optimizer.get("name") != optimizer.name:
        raise ValueError(f"{source} holds {ckpt.optimizer.get('name')!r} optimizer state, this "
                         f"run uses {optimizer.name!r}.")
    if ckpt.epoch > config.epochs:
        raise ValueError(f"`--epochs` {config.epochs} is below the checkpoint's epoch "
                         f"{ckpt.epoch}; ask for at least {ckpt.epoch}.")
    new_params = {k: np.array(ckpt.params[k]) for k in params}
    optimizer.load_state_dict(ckpt.optimizer_state, new_params)
    return TrainState(new_params, optimizer, ckpt.rng(), ckpt.epoch, ckpt.history)


def run_summary(config: TrainConfig, net: Network, data: Dataset, optimizer: Optimizer,
                gradient_name: str) -> dict[str, Any]:
    """The description of a run stored at the top of ``log.json``."""
    return {
        "config": config.to_dict(),
        "model": config.model,
        "gradient": gradient_name,
        "data": {"name": data.name, "n_train": data.n_train, "n_val": data.n_val,
                 "n_classes": data.n_classes, "input_shape": list(data.input_shape)},
        "network": {"layers": net.n_layers, "T": net.T, "h": net.h,
                    "state_shape": list(net.step.state_shape)},
        "optimizer": {"name": optimizer.name, **optimizer.hyper()},
    }


def train(config: TrainConfig, gradient: GradientFn | None = None,
          stream: TextIO | None = None) -> TrainResult:
    """Run the training described by ``config`` (resuming if asked); see :func:`fit`."""
    net, data, state, bk = setup(config)
    name, default = select_gradient(config, net, bk)
    if gradient is None:
        gradient = default
    else:
        name = getattr(gradient, "__name__", "custom")
    meta = run_summary(config, net, data, state.optimizer, name)
    root = getattr(gradient, "is_root", True)  # over MPI only world rank 0 prints and writes
    result = fit(net, state, data, gradient, epochs=config.epochs, batch_size=config.batch_size,
                 bk=bk, out_dir=config.out_dir if root else None,
                 checkpoint_every=config.checkpoint_every, meta=meta,
                 quiet=config.quiet or not root, stream=stream)
    if name == "layer-parallel" and config.out_dir and isinstance(net, Network):
        result.files["gradient_error"] = write_gradient_error(config, net, data, state, bk)
    return result


def write_gradient_error(config: TrainConfig, net: Network, data: Dataset, state: TrainState,
                         bk: Backend) -> Path:
    """After a layer-parallel run: the gradient error vs MGRIT cycles at the final weights,
    on one training batch, as ``gradient_error.png`` (and its table in ``gradient_error.json``)."""
    from .gradient_error import gradient_error_study, plot_gradient_error

    x = bk.asarray(as_network_input(net, data.x_train[: config.batch_size]))
    y = bk.asarray(data.y_train[: config.batch_size])
    rows = gradient_error_study(net, state.params, x, y, range(0, 9), bk,
                                default=layer_parallel_settings(config),
                                levels=config.levels, cfactor=config.cfactor,
                                relax=config.relax_per_level, cycle=config.cycle)
    out = Path(config.out_dir)
    write_json(out / "gradient_error.json", [r.__dict__ for r in rows])
    title = f"final weights, {config.levels} levels, cfactor {config.cfactor}"
    return save_figure(plot_gradient_error(rows, title), out / GRADIENT_ERROR_FILE)
