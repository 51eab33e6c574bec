"""How a solve ends: whether its solution is finite, and where a divergence arose.

:func:`~refbraid.mgrit.solver.solve` calls these after its last relaxation:
:func:`solution_finite` (this rank's block; the fused cycle's last F-sweep may have checked
its F-rows already), and for a divergence :func:`divergence_level` and :func:`where`, which
name the level where a NaN/inf arose (the solver's module docstring says how), in the
message of :class:`MGRITDiverged` and of the result.
"""

from __future__ import annotations

import math

import numpy as np

from ..backends.host import all_finite as holds_only_finite
from .arrays import namespace
from .cycle import Cycler
from .fused import FiniteWatch
from .norms import FiniteBySum
from .record import IterationRecord, MGRITResult
from .relax import row_slice, rows_view


class MGRITDiverged(RuntimeError):
    """The residual became NaN/inf or grew beyond ``max_growth``; ``result`` has the record,
    ``iteration`` and ``level`` say where (module docstring)."""

    def __init__(self, message: str, result: MGRITResult, iteration: int | None = None,
                 level: int | None = None):
        super().__init__(message)
        self.result = result
        self.iteration = iteration
        self.level = level


def holds_nonfinite(u, comm) -> bool:
    """True when any rank's block ``u`` holds NaN/inf (a collective: every rank calls it)."""
    bad = 0.0
    if u is not None and u.shape[0]:
        bad = 0.0 if holds_only_finite(u) else 1.0
    return comm.allreduce_sum(bad) > 0


def block_finite(cycler: Cycler, u, c_pos, c_rows_rewritten: bool = False) -> bool:
    """Whether this rank's solution block ``u`` holds only finite values: every F-row when
    the last fine F-sweep checked them as it wrote them (the fused cycle's
    ``f_rows_finite``), then the C-rows; else the whole block.

    A ``carried`` watch (the problem's ``carries_nonfinite``) read the last F-row of each
    interval, made from its C-row's final value: a non-finite C-row made it non-finite, so
    only the C-rows no F-row of the block follows are read — unless something rewrote the
    C-rows after that sweep (``c_rows_rewritten``: the final FC relaxation)."""
    if not u.shape[0]:
        return True
    seen = getattr(cycler, "f_rows_finite", None)
    if seen is None or seen[1] != u.shape[0] - len(c_pos):
        return holds_only_finite(u)
    if not seen[0]:
        return False
    rows = np.asarray(c_pos).tolist()
    if seen[2] and not c_rows_rewritten:
        c_set = set(rows)
        rows = [k for k in rows if k + 1 == u.shape[0] or k + 1 in c_set]
    watch = FiniteWatch()  # those C-rows, as the sweep checked the F-rows
    for k in rows:
        watch.see(u[k, ...])
    return watch.ok


def solution_finite(cycler: Cycler, u, c_pos, c_rows_rewritten: bool = False):
    """Whether this rank's solution block holds only finite values (:func:`block_finite`);
    for a device block the answer left where it was reduced (copied with the deferred sums):
    a real block's sum (:class:`~refbraid.mgrit.norms.FiniteBySum`), else the 0-d boolean.

    The sum reads only the last row of each interval (:func:`interval_ends`) where the
    problem's step carries a NaN/inf (``carries_nonfinite``) and the solve's last pass over
    the block was an F-sweep (every F-row ``Φ`` of the row before it: a non-finite row makes
    every later row of its interval non-finite): a 1/m of the block. Its exact recheck, if
    the sum is not finite, reads the whole block."""
    if isinstance(u, np.ndarray) or not u.shape[0]:
        return block_finite(cycler, u, c_pos, c_rows_rewritten)
    xp = namespace(u)
    if not xp.isdtype(u.dtype, "real floating"):
        return xp.all(xp.isfinite(u))
    state = cycler.states[0]
    if (state.step.problem.carries_nonfinite and not c_rows_rewritten
            and not state.coarsest):
        return FiniteBySum(_sum_of_rows(xp, u, interval_ends(c_pos, u.shape[0])), u)
    return FiniteBySum(xp.sum(u), u)


def _sum_of_rows(xp, u, positions: list[int]):
    """``Σ u[positions]`` through strided views: one sum when the positions are evenly
    spaced, else the evenly spaced ones and the last apart (a block whose last interval is
    shorter: a view and a row, not a gathered copy)."""
    if row_slice(positions) is not None or len(positions) < 3 \
            or row_slice(positions[:-1]) is None:
        return xp.sum(rows_view(u, positions))
    return xp.sum(rows_view(u, positions[:-1])) + xp.sum(u[positions[-1], ...])


def interval_ends(c_pos, n: int) -> list[int]:
    """The positions of the last row of each interval of a block of ``n`` rows whose
    C-points are at ``c_pos``: the row before each C-point (none before position 0) and the
    block's last row (rows before the first C-point end an interval begun on the rank
    before)."""
    return sorted({int(c) - 1 for c in np.asarray(c_pos).tolist() if int(c) > 0} | {n - 1})


def divergence_level(records: list[IterationRecord], cycler: Cycler) -> int:
    """The level where a NaN/inf arose (module docstring): the first non-finite coarse
    residual of the last cycle, else the coarsest level holding NaN/inf, else 0."""
    if len(records) >= 2:
        for visit in records[-2].visits[1:]:  # chronological; visits[0] is level 0 itself
            if not math.isfinite(visit.norm):
                return visit.level
    for ell in range(len(cycler.states) - 1, 0, -1):
        if holds_nonfinite(cycler.states[ell].u, cycler.comm):
            return ell
    return 0


def where(level: int, n_levels: int, iteration: int) -> str:
    """'on level ℓ (...)' for a divergence message."""
    if level == 0:
        return "on level 0 (the fine grid)"
    kind = "the coarsest, solved exactly" if level == n_levels - 1 else "a coarse level"
    when = f"the cycle after iteration {iteration - 1}" if iteration else "the initial guess"
    return (f"on level {level} ({kind}; the NaN/inf arose there in {when} and reached the "
            f"fine grid)")
