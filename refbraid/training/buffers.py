"""A model's buffers: state that training changes but the optimizer does not (batch norm's
running statistics), as checkpoints save and restore them.

A model with batch norm (``refbraid train --model conv-stages --batch-norm``,
:class:`refbraid.stages.model.ConvStagesModel`) keeps its running statistics in
``model.running`` (names as :mod:`refbraid.stages.batchnorm` gives them, e.g.
``stage0.running_mean`` (n_0, C)) and the number of training steps folded into them in
``model.updates``. A checkpoint stores them as ``buffer/<name>`` arrays, the count as
``buffer/updates`` (a 0-d integer array)::

    model_buffers(model)          {name: host array}   ({} for a model without buffers)
    restore_buffers(model, saved) model.running, model.updates ← the checkpoint's, checked

Checkpoints written before buffers were saved hold none. Resuming a batch-norm model from one
is refused (:class:`MissingBuffers`): its evaluation would run on reset statistics (mean 0,
variance 1) and the resumed run would no longer equal an uninterrupted one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..backends.host import to_host

UPDATES = "updates"  # the buffer that counts running-statistics updates


class MissingBuffers(ValueError):
    """A batch-norm model resumed from a checkpoint without running statistics."""


def has_buffers(model) -> bool:
    """True for a model that keeps running statistics (batch norm)."""
    return bool(getattr(model, "running", None))


def model_buffers(model) -> dict[str, np.ndarray]:
    """The model's running statistics and update count as host arrays (empty if none)."""
    if not has_buffers(model):
        return {}
    out = {k: np.array(to_host(v), copy=True) for k, v in model.running.items()}
    out[UPDATES] = np.array(int(getattr(model, "updates", 0)), dtype=np.int64)
    return out


def buffer_mismatches(expected: dict[str, np.ndarray], saved: dict[str, np.ndarray]
                      ) -> list[str]:
    """What differs between the buffers a model has and those a checkpoint holds."""
    out = []
    only_here = sorted(set(expected) - set(saved))
    only_there = sorted(set(saved) - set(expected))
    if only_here:
        out.append(f"running statistics {only_here} are missing in the checkpoint")
    if only_there:
        out.append(f"the checkpoint holds running statistics {only_there} this network has not")
    for k in sorted(set(expected) & set(saved)):
        e, s = expected[k], saved[k]
        if tuple(e.shape) != tuple(s.shape) or (k != UPDATES and e.dtype != s.dtype):
            out.append(f"`{k}` is {s.dtype}{tuple(s.shape)} there and "
                       f"{e.dtype}{tuple(e.shape)} here")
    return out


def restore_buffers(model, saved: dict[str, np.ndarray], source: str = "checkpoint") -> None:
    """Set ``model.running`` and ``model.updates`` from ``saved`` (a checkpoint's buffers).

    Raises :class:`MissingBuffers` when the model has batch norm and ``saved`` is empty (an
    older checkpoint), ValueError naming every difference when the names or shapes differ,
    or when statistics are not finite / variances negative. A model without buffers accepts
    only an empty ``saved``."""
    expected = model_buffers(model)
    if expected and not saved:
        raise MissingBuffers(
            f"{source} holds no batch-norm running statistics (it was written by a refbraid "
            f"that did not save them), so this run cannot be resumed exactly: evaluation "
            f"would use reset statistics. Start a new run, or resume without `--batch-norm` "
            f"from a checkpoint of a run without it.")
    problems = buffer_mismatches(expected, saved)
    if problems:
        raise ValueError(f"{source} does not match the network's batch norm: "
                         + "; ".join(problems) + ".")
    if not expected:
        return
    bad = [k for k, v in saved.items() if not np.isfinite(v).all()
           or (k.endswith("running_var") and (v < 0).any())]
    if bad:
        raise ValueError(f"{source} holds invalid running statistics in {bad} (NaN, infinite "
                         f"or a negative variance).")
    model.running = {k: np.array(saved[k], copy=True) for k in model.running}
    model.updates = int(saved[UPDATES])


@contextlib.contextmanager
def buffers_kept(model) -> Iterator[None]:
    """Inside: gradient evaluations may fold batch statistics into ``model.running``; on exit
    the running statistics and count are put back as they were (MG/Opt's extra evaluations
    within one training step, :mod:`refbraid.training.mgopt_step`)."""
    if not has_buffers(model):
        yield
        return
    running: dict[str, Any] = {k: np.array(v, copy=True) for k, v in model.running.items()}
    updates = model.updates
    try:
        yield
    finally:
        model.running, model.updates = running, updates
