"""The virtual cluster's cost model: seconds per step, per message, per collective.

=====================  ============================================================
what                   seconds
=====================  ============================================================
step Φ on level ℓ      ``cost(ℓ, direction)``: a :class:`StepCosts` table, any callable
                       ``cost(level, direction) -> seconds``, or one number for all
message of b bytes     ``α + β·b`` from the send to the earliest receive
allreduce, bcast       ``⌈log₂ P⌉ · (α + β·b)``  (binomial tree, b = largest contribution)
gather, allgather,     ``⌈log₂ P⌉ · α + (P − 1) · β·b``  (P − 1 blocks reach the root;
scatter                scatter: b = the largest block)
alltoall               ``⌈log₂ P⌉ · α + β·b``  (b = the most bytes one rank sends to the
                       others; every rank's sends overlap)
ring (sum of arrays)   ``2(P − 1) · α + 2(P − 1)/P · β·b``  (ring allreduce of b bytes,
                       REFERENCES.md §4: the gradient reductions of ``sum_to_all``)
=====================  ============================================================

Used by :mod:`refbraid.parallel.virtual`; numbers can come from a calibration (time one step
per level and direction, one message per size) or be chosen to ask "what if".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Union

import numpy as np

DIRECTIONS = ("forward", "backward")


def _check_costs(name: str, value) -> tuple[float, ...]:
    values = value if isinstance(value, (tuple, list)) else (value,)
    if len(values) == 0:
        raise ValueError(f"`{name}` must be a number or a non-empty tuple, got {value!r}.")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
                or not math.isfinite(v) or v < 0:
            raise ValueError(f"`{name}` must hold finite seconds >= 0, got {value!r}.")
        out.append(float(v))
    return tuple(out)


@dataclass(frozen=True)
class StepCosts:
    """Seconds per step application: one number, or one per level (the last entry repeats
    for deeper levels), for each direction.

    forward   cost of Φ on level ℓ (``forward[min(ℓ, len - 1)]``)
    backward  cost of the adjoint step on level ℓ; None: the forward costs

    E.g. ``StepCosts(forward=1.0, backward=(1.0, 2.0))``: a fine adjoint step costs as much as
    a forward one (it reuses the forward cache), a coarse one twice (it recomputes it).
    """

    forward: float | tuple[float, ...] = 1.0
    backward: float | tuple[float, ...] | None = None

    def __post_init__(self):
        object.__setattr__(self, "forward", _check_costs("forward", self.forward))
        if self.backward is not None:
            object.__setattr__(self, "backward", _check_costs("backward", self.backward))

    def __call__(self, level: int, direction: str) -> float:
        table = self.backward if direction == "backward" and self.backward else self.forward
        return table[min(int(level), len(table) - 1)]


CostModel = Union[StepCosts, Callable[[int, str], float], float]  # noqa: UP007 (runtime alias)


def as_cost(costs: CostModel) -> Callable[[int, str], float]:
    """``cost(level, direction) -> seconds`` from a :class:`StepCosts`, a callable or a number."""
    if isinstance(costs, (int, float, np.integer, np.floating)) and not isinstance(costs, bool):
        return StepCosts(forward=float(costs))
    if callable(costs):
        return costs
    raise TypeError(f"`costs` must be a StepCosts, a callable cost(level, direction) or a "
                    f"number of seconds, got {costs!r}.")


def ceil_log2(n: int) -> int:
    """⌈log₂ n⌉ for n ≥ 1: rounds of a binomial tree over n ranks."""
    return (int(n) - 1).bit_length()


def collective_cost(kind: str, size: int, nbytes: int, alpha: float, beta: float) -> float:
    """Seconds a collective adds after the last rank arrives (module docstring)."""
    if size <= 1:
        return 0.0
    rounds = ceil_log2(size)
    if kind in ("gather", "allgather", "scatter"):
        return rounds * alpha + (size - 1) * beta * nbytes
    if kind == "alltoall":
        return rounds * alpha + beta * nbytes
    if kind == "ring":
        return 2 * (size - 1) * alpha + 2 * (size - 1) / size * beta * nbytes
    return rounds * (alpha + beta * nbytes)


def check_seconds(name: str, value) -> float:
    """``value`` as a float; ValueError naming ``name`` unless it is finite and >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"`{name}` must be a finite number >= 0, got {value!r}.")
    return float(value)
