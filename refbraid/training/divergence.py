"""When training has diverged: the rules that stop a run with status "diverged".

Three signs, each with its own message and remedy:

1. **A non-finite loss** on a batch (NaN or ±inf): stop before applying that batch's update.
   If it happens on the very first step of a run, before any update, the learning rate cannot
   be the cause: the message points at the weights or the network instead (a checkpoint full
   of NaN is refused when it is loaded; what remains is the network itself, e.g. a huge
   ``--T``, whose step size ``h = T/N`` overflows the forward pass).
2. **A finite loss that has blown up** (the named rule :data:`LOSS_GROWTH_LIMIT`): an epoch's
   mean training loss above ``LOSS_GROWTH_LIMIT · ln K``, ten times the cross-entropy of a
   uniform guess over the K classes. A classifier that does ten times worse than guessing is
   not learning: with ``--lr 1e9`` the loss reaches 1e9 within the first epoch. Checked once
   per epoch, on the epoch mean, so one noisy batch cannot trip it. If the run's very first
   batch was already above the limit, the network was broken at its starting weights (e.g.
   ``--T 1e300``: a finite loss of 1e299), and the message says that instead of blaming the
   learning rate.
3. **MGRIT solves that blew up** (:class:`refbraid.mgrit.MGRITDiverged`), or parameters or
   gradients that became NaN/inf (:class:`refbraid.layers.init.NonFiniteError` from the
   gradient or the optimizer): same remedy as 1 (:func:`diverged` words all three).

Each raises :class:`TrainingDiverged`; the loop writes ``log.json`` with status "diverged" and
the command line exits with a non-zero code.
"""

from __future__ import annotations

import math

#: An epoch whose mean training loss exceeds this multiple of ln K (a uniform guess) diverged.
LOSS_GROWTH_LIMIT = 10.0

class TrainingDiverged(ValueError):
    """The loss became NaN/inf, blew up (:data:`LOSS_GROWTH_LIMIT`), or MGRIT diverged."""


def loss_limit(n_classes: int) -> float:
    """The epoch-mean loss above which a run counts as diverged: ``LOSS_GROWTH_LIMIT · ln K``."""
    return LOSS_GROWTH_LIMIT * math.log(max(n_classes, 2))


def diverged(what: str, *, epoch: int, batch: int, first_step: bool, lr: float,
             remedy: str = "") -> TrainingDiverged:
    """The error for a step that went non-finite, with the remedy that fits: on the run's
    very first step (no update yet) the learning rate cannot be the cause."""
    where = f"at epoch {epoch}, batch {batch}"
    if first_step:
        return TrainingDiverged(
            f"{what} {where}, before any update, so the learning rate is not the cause: the "
            f"network overflows at its starting weights (check `--T`, which sets the step size "
            f"h = T/N, `--width` and the data); stopped.")
    return TrainingDiverged(f"{what} {where}; stopped (try a smaller learning rate `--lr`, now "
                            f"{lr:g}{remedy}).")


def check_batch_loss(loss: float, *, epoch: int, batch: int, first_step: bool, lr: float) -> None:
    """Rule 1: raise :class:`TrainingDiverged` when ``loss`` is NaN or infinite."""
    if not math.isfinite(loss):
        raise diverged(f"the training loss became {loss}", epoch=epoch, batch=batch,
                       first_step=first_step, lr=lr)


def check_epoch_loss(mean_loss: float, limit: float, *, epoch: int, lr: float,
                     first_loss: float) -> None:
    """Rule 2: raise :class:`TrainingDiverged` when the epoch's mean loss exceeds ``limit``
    (``first_loss``: the run's first batch loss, which tells a broken start from a blow-up)."""
    if not mean_loss > limit:
        return
    if first_loss > limit:
        raise TrainingDiverged(
            f"the training loss is {mean_loss:.4g} at epoch {epoch} and was already "
            f"{first_loss:.4g} on the first batch, before any update (limit "
            f"{LOSS_GROWTH_LIMIT:g}·ln K = {limit:.4g}): the network is broken at its starting "
            f"weights, not by the learning rate (check `--T`, which sets the step size "
            f"h = T/N, `--width` and the data); stopped.")
    raise TrainingDiverged(
        f"the training loss diverged: its mean over epoch {epoch} is {mean_loss:.4g}, more than "
        f"{LOSS_GROWTH_LIMIT:g}× that of a uniform guess (limit {limit:.4g}); stopped (try a "
        f"smaller learning rate `--lr`, now {lr:g}).")
