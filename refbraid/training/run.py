"""A training run from a :class:`~.config.TrainConfig`: what ``refbraid train`` does.

:func:`train` = claim the run folder (checked, locked, never a previous run overwritten
unasked: :mod:`refbraid.training.run_folder`) → :func:`setup` (data, network, initial or
resumed state, backend) → :func:`~refbraid.training.trainer.fit` → after a layer-parallel
run, the gradient error vs MGRIT cycles at the final weights.

Seeds: the data set uses ``seed``; the weights and the shuffling use two independent streams
spawned from ``SeedSequence(seed)``, so a resumed run continues bit-identically.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from .. import interrupts
from ..atomic import save_figure, write_json
from ..backends import Backend, get_backend, require_usable
from ..data import Dataset, load_dataset
from ..models import as_network_input, build_network, initial_params
from ..network import Network, to_backend
from ..parallel.faults import root_decides
from ..parallel.mpi import is_world_root, world_size
from ..parallel.traced_gradient import TracedGradient, write_trace
from .buffers import restore_buffers
from .checkpoint import check_params_match, load_checkpoint
from .config import TrainConfig
from .gradients import GradientFn, layer_parallel_settings, mpi_backend, select_gradient
from .optim import Optimizer, make_optimizer
from .preflight import check_before_work
from .run_folder import RunFolder, claim_run_folder
from .trainer import TrainResult, TrainState, fit, record_stop

GRADIENT_ERROR_FILE = "gradient_error.png"  # layer-parallel runs: error vs MGRIT cycles


def setup(config: TrainConfig) -> tuple[Network, Dataset, TrainState, Backend]:
    """Data, network, initial (or resumed) state and backend for ``config``."""
    require_usable(config.backend)
    bk = get_backend(config.backend)
    data = load_dataset(config.data, data_dir=config.data_dir, n_samples=config.samples,
                        seed=config.seed, val_fraction=config.val_fraction).astype(config.dtype)
    try:
        net = build_network(config.model, data.input_shape, data.n_classes, config.layers,
                            config.width, config.T, config.activation, data.info,
                            config.buffer, **config.model_options())
    except ValueError as err:
        raise ValueError(f"`--model {config.model}` does not fit `--data {config.data}`: "
                         f"{err}") from err
    if world_size() > 1:  # device-resident for the plain networks, host arrays otherwise
        bk = mpi_backend(config, net, bk, say=_warn_on_root)
    init_seq, shuffle_seq = np.random.SeedSequence(config.seed).spawn(2)
    init_rng = np.random.default_rng(init_seq)
    params = initial_params(net, init_rng, np.dtype(config.dtype))
    if config.nested_init and not config.resume:
        from .nested import nested_initial_weights

        params = nested_initial_weights(config, net, data, bk)
    optimizer = make_optimizer(config.optimizer, config.lr, config.momentum)
    state = TrainState(params, optimizer, np.random.default_rng(shuffle_seq))
    if config.resume:
        state = resume_state(config, params, optimizer, net)
    state.params = to_backend(state.params, bk)
    check_before_work(config, net, data, state.params, bk, world_size(), state.epoch)
    if config.resume:  # buffers follow the parameters to the backend's arrays
        state.optimizer.load_state_dict(state.optimizer.state_dict(), state.params, bk.asarray)
    return net, data, state, bk


def _warn_on_root(message: str) -> None:
    """A RuntimeWarning from world rank 0 only (every rank reaches the same decision)."""
    if is_world_root():
        import warnings

        warnings.warn(message, RuntimeWarning, stacklevel=3)


def resume_state(config: TrainConfig, params: dict[str, Any], optimizer: Optimizer,
                 net=None) -> TrainState:
    """The state saved in ``config.resume``, checked against the freshly built run; ``net``'s
    buffers (batch norm's running statistics) are restored from it in place."""
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
    broken = [k for k, v in ckpt.params.items() if not np.isfinite(v).all()]
    if broken:
        raise ValueError(f"{source} holds NaN or infinite values in {broken}: a run that "
                         f"diverged saved it, so it cannot be resumed; resume from an earlier "
                         f"checkpoint or start a new run.")
    if ckpt.optimizer.get("name") != optimizer.name:
        raise ValueError(f"{source} holds {ckpt.optimizer.get('name')!r} optimizer state, this "
                         f"run uses {optimizer.name!r}.")
    if ckpt.epoch > config.epochs:
        raise ValueError(f"`--epochs` {config.epochs} is below the checkpoint's epoch "
                         f"{ckpt.epoch}; ask for at least {ckpt.epoch}.")
    if net is not None:
        restore_buffers(net, ckpt.buffers, source)
    new_params = {k: np.array(ckpt.params[k]) for k in params}
    try:
        optimizer.load_state_dict(ckpt.optimizer_state, new_params)
    except ValueError as err:
        raise ValueError(f"{source} holds unusable optimizer state: {err}") from None
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


@contextlib.contextmanager
def claimed_folder(config: TrainConfig, stream: TextIO | None = None) -> Iterator[Path]:
    """Claim ``config.out_dir`` for this run (world rank 0 decides for every rank), say what
    claiming it changed, and release it on exit."""
    claim: RunFolder | None = root_decides(
        lambda: claim_run_folder(config.out_dir, resume=config.resume,
                                 overwrite=config.overwrite))
    failed = True
    try:
        if claim is not None:
            say = stream or sys.stdout
            if claim.replaced:
                print(f"replacing the run in {claim.path}/ (--overwrite): removed "
                      f"{', '.join(claim.replaced)}", file=say, flush=True)
            if claim.stale_removed:
                print(f"removed {len(claim.stale_removed)} temporary file(s) left by an "
                      f"interrupted run in {claim.path}/", file=say, flush=True)
        yield Path(config.out_dir)
        failed = False
    finally:
        if claim is not None:
            claim.release(discard_if_unused=failed)


def train(config: TrainConfig, gradient: GradientFn | None = None,
          stream: TextIO | None = None) -> TrainResult:
    """Run the training described by ``config`` (resuming if asked); see :func:`fit`."""
    require_usable(config.backend)  # before the folder is touched
    with claimed_folder(config, stream) as out:
        net, data, state, bk = setup(config)
        name, default = select_gradient(config, net, bk)
        if gradient is None:
            gradient = default
        else:
            name = getattr(gradient, "__name__", "custom")
        meta = run_summary(config, net, data, state.optimizer, name)
        root = getattr(gradient, "is_root", True)  # over MPI only world rank 0 prints, writes
        if config.trace:
            gradient = TracedGradient(gradient)
        result = fit(net, state, data, gradient, epochs=config.epochs,
                     batch_size=config.batch_size, bk=bk, out_dir=out if root else None,
                     checkpoint_every=config.checkpoint_every, meta=meta,
                     quiet=config.quiet or not root, stream=stream)
        try:
            _finish(config, result, gradient, net, data, state, bk, name, root, stream)
        except BaseException as err:  # e.g. Ctrl-C: the log says so, as during training
            record_stop(out if root else None, meta, state, err)
            interrupts.reraise(err)
    return result


def _finish(config: TrainConfig, result: TrainResult, gradient: GradientFn, net, data: Dataset,
            state: TrainState, bk: Backend, name: str, root: bool, stream: TextIO | None) -> None:
    """The files a run writes after training: trace, gradient error, bias control, language."""
    out = Path(config.out_dir)
    if config.trace:
        result.files.update(write_trace(gradient, out if root else None,
                                        f"{config.data}-{config.model} ({name})"))
    if name == "layer-parallel" and isinstance(net, Network):
        result.files["gradient_error"] = write_gradient_error(config, net, data, state, bk)
    if root and hasattr(gradient, "decisions"):  # --bias-control: measurements, decisions
        result.files["bias_control"] = write_json(Path(config.out_dir) / "bias_control.json",
                                                  gradient.summary())
    if root and data.info.get("language_model") and result.status == "finished":
        result.files["language"] = write_language_report(
            config, net, data, state, bk, getattr(gradient, "logits", None), stream)


def write_language_report(config: TrainConfig, net, data: Dataset, state: TrainState,
                          bk: Backend, logits_fn, stream: TextIO | None) -> Path:
    """A language model's perplexity, exact match and samples: printed, and ``language.json``."""
    from .language import language_report, print_language_report

    report = language_report(net, state.params, data, bk, logits_fn)
    if not config.quiet:
        print_language_report(report, stream or sys.stdout)
    return write_json(Path(config.out_dir) / "language.json", report)


def write_gradient_error(config: TrainConfig, net: Network, data: Dataset, state: TrainState,
                         bk: Backend) -> Path:
    """After a layer-parallel run: the gradient error vs MGRIT cycles at the final weights,
    on one training batch, as ``gradient_error.png`` (and its table in ``gradient_error.json``)."""
    from ..gradient_error import gradient_error_study, plot_gradient_error

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
