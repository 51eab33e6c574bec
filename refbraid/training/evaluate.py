"""Scoring a network: loss and accuracy over a data set, and per-epoch means of solver stats.

Per-token outputs (sequence taggers and decoders: logits (B, T, K), labels (B, T)) are scored
per token: loss and accuracy over all n·T tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Number
from typing import Any

import numpy as np

from ..backends import Backend, get_backend
from ..backends.host import host_float, host_range, to_host
from ..backends.portable import contiguous
from ..network import Network, forward

Params = dict[str, Any]

EVAL_BATCH = 4096  # samples per forward pass when measuring accuracy


def mean_stats(per_step: list[dict[str, Any]]) -> dict[str, float | None]:
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
    return {k: finite_or_none(sums[k] / counts[k]) for k in sums}


def finite_or_none(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def evaluate(net: Network, params: Params, x, labels, bk: Backend | str = "numpy",
             batch: int = EVAL_BATCH, logits_fn: Callable | None = None) -> tuple[float, float]:
    """(mean cross-entropy loss, accuracy) of the network on x (n, *in_shape), in chunks.

    ``logits_fn(params, x)`` replaces the sequential forward pass (e.g. the MGRIT forward
    solve a layer-parallel run trains with). Per-token outputs (B, T, K) with labels (B, T)
    (sequence models) are scored per token: loss and accuracy over all n·T tokens, except
    those labelled IGNORE (−1; a language model's prompt).
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
        xp = bk.xp
        if logits.ndim == 3:  # one prediction per token; IGNORE (-1) labels are not scored
            logits = xp.reshape(logits, (-1, logits.shape[-1]))
            yb = xp.reshape(yb, (-1,))
            if host_range(yb)[0] < 0:  # the scored rows, gathered where they live
                scored = xp.nonzero(yb >= 0)[0]
                logits, yb = xp.take(logits, scored, axis=0), contiguous(xp.take(yb, scored))
        loss, _ = bk.softmax_cross_entropy(logits, yb)
        loss_sum += host_float(loss) * yb.shape[0]
        n += yb.shape[0]
        hits = xp.astype(xp.argmax(logits, axis=1) == yb, xp.int64)  # counted on the device
        correct += int(to_host(xp.sum(hits)))
    return loss_sum / n, correct / n
