"""Every combination of flags, data and model that cannot work, refused before any work.

:class:`~refbraid.training.config.TrainConfig` checks what the flags alone decide (ranges,
choices, flags that exclude each other). What also needs the data, the network or the MPI
world is checked here, by :func:`check_before_work`, right after the data and the network are
built and before the first step — so a run that cannot work stops with one line naming the
flags, leaves no run folder behind, and never trains an epoch first:

* a flag that would do nothing: DASO's ``--dp-groups`` / ``--global-sync-every`` in one
  process (there is nothing to average across), ``--trace`` of a run with fewer steps than
  the one it records, or of a ``--serial`` run in one process (nothing to record);
* an MGRIT hierarchy that does not fit the time grid (``--levels``, ``--cfactor`` and the
  layers, or the sequence positions of a GRU), the same check and message in one process and
  under ``mpiexec``;
* a model whose predictions do not match the data's labels: a classifier of whole sequences
  on next-token data (``--model gru --data lm-reverse``) and the like — found by one forward
  pass on two samples, whose logits (B, [T,] K) must match labels (B, [T]) and K classes.
"""

from __future__ import annotations

from typing import Any

from ..backends import Backend
from ..models import as_network_input
from ..network import Network, forward
from .config import TrainConfig
from .gradients import check_levels_fit

PROBE_SAMPLES = 2  # samples of the forward pass that checks the model against the labels


def check_before_work(config: TrainConfig, net, data, params: dict[str, Any],
                      bk: Backend, ranks: int = 1, start_epoch: int = 0) -> None:
    """Raise ValueError naming the flags when ``config`` cannot train ``net`` on ``data``
    (from ``start_epoch``, the resumed checkpoint's, on ``ranks`` MPI ranks)."""
    if config.trace:
        check_trace(config, data, ranks, start_epoch)
    daso = config.dp_groups > 1 or config.global_sync_every > 1
    if daso and ranks == 1 and config.data_parallel == 1:  # (else the DASO setup explains)
        flag = "--dp-groups" if config.dp_groups > 1 else "--global-sync-every"
        raise ValueError(f"`{flag}` (DASO) groups data-parallel ranks under mpiexec; in one "
                         f"process there is nothing to group or average, so it would do "
                         f"nothing: run mpiexec -n P refbraid train --data-parallel P "
                         f"{flag} ..., or drop it.")
    if not config.serial and not config.mgopt_levels:
        check_levels_fit(config, net)
    check_model_fits_labels(config, net, data, params, bk)


def check_trace(config: TrainConfig, data, ranks: int, start_epoch: int) -> None:
    """``--trace`` records the run's :data:`~.tracing.TRACED_STEP`-th training step: the run
    must have that many, and in one process something to record (MGRIT's steps)."""
    from ..parallel.traced_gradient import TRACED_STEP

    steps = -(-data.n_train // config.batch_size) * (config.epochs - start_epoch)
    if steps < TRACED_STEP:
        raise ValueError(f"`--trace` records training step {TRACED_STEP} (step 1 warms up), "
                         f"and this run has {steps}: give more `--epochs` or `--samples`, or "
                         f"a smaller `--batch-size`.")
    if config.serial and ranks == 1:
        raise ValueError("`--trace` records MGRIT's step applications and the messages "
                         "between MPI ranks; a `--serial` run in one process has neither, so "
                         "its trace would be empty: drop `--serial` or run under mpiexec.")


def check_model_fits_labels(config: TrainConfig, net, data, params: dict[str, Any],
                            bk: Backend) -> None:
    """One forward pass on :data:`PROBE_SAMPLES` samples: the logits' shape (B, [T,] K) must
    match the labels (B, [T]) and the data's K classes."""
    x = bk.asarray(as_network_input(net, data.x_train[:PROBE_SAMPLES]))
    if isinstance(net, Network):
        logits = forward(net, params, x, bk, keep=False)[0]
    else:
        logits = net.logits(params, x, bk)
    per_sample = tuple(int(s) for s in logits.shape[1:-1])
    labels = tuple(int(s) for s in data.y_train.shape[1:])
    if per_sample != labels:
        def says(shape):
            return "one class per sample" if not shape else \
                f"one class per position of shape {shape}"

        raise ValueError(f"`--model {config.model}` does not fit `--data {config.data}`: the "
                         f"model predicts {says(per_sample)}, the data labels "
                         f"{says(labels)}; choose a model and data set of the same kind "
                         f"(see `refbraid train --help`).")
    if int(logits.shape[-1]) < data.n_classes:
        raise ValueError(f"`--model {config.model}` does not fit `--data {config.data}`: it "
                         f"predicts {int(logits.shape[-1])} classes, the data has "
                         f"{data.n_classes}.")
