"""What an MGRIT solve leaves behind: residuals per iteration and level, counters, timings.

Residual convention (docs/references.md §3). The reported norm of iteration k is XBraid's::

    ‖r_k‖ = ( Σ over fine C-points of ‖r[c]‖² )^½,   r[c] = Φ(u[c-1]) + g[c] - u[c]

measured after the relaxation of level 0 (F, or FCF...) and before the coarse-grid
correction of that cycle; iteration 0 is the (relaxed) initial guess. The solution returned
is the iterate of the last measurement, so its residual is exactly the last reported norm
(zero at F-points, ``‖r_k‖`` at C-points).

PyMGRIT's convention (the residual of the iterate right after the whole cycle, F-points
interpolated) is recorded as ``post_cycle_norm``; it is free: it is the residual of the first
F-sweep of the next relaxation, i.e. the change the first C-relaxation makes. With
F-relaxation on level 0 the two conventions coincide.

Coarse levels: every visit of level ℓ in a cycle (one per V-cycle, more in an F-cycle)
records the FAS residual of that level after its relaxation. They are attached to the
iteration whose fine residual was measured at the start of that cycle. The coarsest level is
solved exactly and has no residual.

Shape legend: c C-points of a level owned by this rank, n its points, S the state shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .grid import Hierarchy
from .settings import MGRITSettings

STATUSES = ("converged", "max_iter", "diverged")


@dataclass
class LevelVisit:
    """One relaxation of a level: FAS residual norm and (optionally) vectors."""

    level: int
    norm: float
    residual: Any = None  # (c, *S) at this level's C-points, or None
    iterate: Any = None  # (n, *S) the level's iterate when the residual was measured, or None


@dataclass
class IterationRecord:
    """Iteration ``iteration``: fine residual and the coarse visits of the cycle that follows."""

    iteration: int
    norm: float  # XBraid convention (see module docstring)
    post_cycle_norm: float  # PyMGRIT convention
    visits: list[LevelVisit] = field(default_factory=list)  # visits[0] is level 0
    step_counts: tuple[int, ...] = ()  # cumulative Φ applications per level at measurement
    seconds: float = 0.0  # wall time since the previous record
    post_cycle_iterate: Any = None  # level-0 iterate right after the previous cycle (keep_iterates)

    def level_visits(self, level: int) -> list[LevelVisit]:
        return [v for v in self.visits if v.level == level]


@dataclass
class MGRITResult:
    """The solution and the full record of an MGRIT solve (printing gives the residual table)."""

    solution: Any  # (n_owned, *S) in fine-index order; the whole grid with SerialComm
    fine_indices: np.ndarray  # fine index of each solution row
    status: str  # 'converged' | 'max_iter' | 'diverged' ('pending' until settle())
    iterations: int  # cycles performed after the first measurement
    records: list[IterationRecord]
    hierarchy: Hierarchy
    settings: MGRITSettings
    direction: str = "forward"
    start: str = "cold"  # 'cold' | 'warm' | 'skip' | 'fmg' | 'exact' (one level)
    step_counts: tuple[int, ...] = ()  # Φ applications per level, this rank
    step_seconds: tuple[float, ...] = ()  # seconds spent inside the step, per level
    setup_seconds: float = 0.0
    solve_seconds: float = 0.0
    rank: int = 0
    n_ranks: int = 1
    message: str = ""

    # -- a solve made inside host_reads_deferred (a captured gradient) ----------------------
    def settle_later(self, settle) -> None:
        """Keep ``settle()``, which reads the deferred norms and decides the status."""
        self._settle = settle

    def settle(self) -> MGRITResult:
        """Decide the status of a solve made inside
        :func:`~refbraid.backends.capture_state.host_reads_deferred` (``status`` is
        ``'pending'`` until then): its norms are read from the device, its status decided
        from all its records (MGRITDiverged raised as the solve would have). After each
        replay of a captured solve it reads the replay's values. A no-op for any other solve.
        Returns the result."""
        settle = self.__dict__.get("_settle")
        if settle is not None:
            settle()
        return self

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_settle", None)  # a closure over the device arrays: never pickled
        return state

    # -- convenience views -----------------------------------------------------------------
    @property
    def converged(self) -> bool:
        return self.status == "converged"

    @property
    def iteration_numbers(self) -> np.ndarray:
        return np.array([r.iteration for r in self.records], dtype=int)

    @property
    def norms(self) -> np.ndarray:
        """Fine C-point residual norm per iteration (XBraid convention)."""
        return np.array([r.norm for r in self.records])

    @property
    def post_cycle_norms(self) -> np.ndarray:
        """Residual norm of the iterate right after each cycle (PyMGRIT convention)."""
        return np.array([r.post_cycle_norm for r in self.records])

    @property
    def conv_factors(self) -> np.ndarray:
        """``‖r_k‖ / ‖r_{k-1}‖`` (NaN for the first iteration)."""
        n = self.norms
        out = np.full(len(n), np.nan)
        with np.errstate(divide="ignore", invalid="ignore"):
            out[1:] = n[1:] / n[:-1]
        return out

    @property
    def total_steps(self) -> int:
        return int(sum(self.step_counts))

    def level_norms(self, level: int) -> np.ndarray:
        """Residual norm of ``level`` at its first visit in each iteration (NaN if not visited)."""
        out = []
        for r in self.records:
            v = r.level_visits(level)
            out.append(v[0].norm if v else np.nan)
        return np.array(out)

    def residuals(self, level: int = 0) -> list[Any]:
        """C-point residual vectors of ``level`` per iteration (first visit; None if not kept)."""
        out = []
        for r in self.records:
            v = r.level_visits(level)
            out.append(v[0].residual if v else None)
        return out

    def post_cycle_iterates(self) -> list[Any]:
        """Level-0 iterates right after each cycle (F-points interpolated, before the next
        relaxation's C-sweeps), in solver order; iteration 0 is the initial guess after one
        F-sweep. Needs ``keep_iterates``. With F-relaxation they equal :meth:`iterates`."""
        return [r.post_cycle_iterate for r in self.records]

    def iterates(self, level: int = 0) -> list[Any]:
        """Iterates of ``level`` per iteration, in solver order (needs ``keep_iterates``)."""
        out = []
        for r in self.records:
            v = r.level_visits(level)
            out.append(v[0].iterate if v else None)
        return out

    # -- printing --------------------------------------------------------------------------
    def table(self) -> str:
        """XBraid-like residual table (iteration, ‖r‖, convergence factor, post-cycle ‖r‖)."""
        s, h = self.settings, self.hierarchy
        relax = "/".join(s.relax_on(lvl) for lvl in range(len(h) - 1)) or "-"
        lines = [
            f"MGRIT {self.direction} solve: {len(h)} level(s), cfactors {h.cfactors}, "
            f"relax {relax}, {s.cycle}-cycle, start {self.start}, N = {h.n_steps}",
            "  ||r||: fine C-point residual after relaxation, before coarse correction (XBraid)",
            f"  {'iter':>4}  {'||r||':>12}  {'conv. factor':>12}  {'||r|| post-cycle':>16}",
        ]
        for rec, rho in zip(self.records, self.conv_factors, strict=False):
            rho_s = "-" if math.isnan(rho) else f"{rho:.4f}"
            lines.append(
                f"  {rec.iteration:>4}  {rec.norm:>12.4e}  {rho_s:>12}"
                f"  {rec.post_cycle_norm:>16.4e}"
            )
        lines.append(f"  {self.status}: {self.message}")
        lines.append(
            f"  step applications per level {list(self.step_counts)} "
            f"(total {self.total_steps}; sequential solve: {h.n_steps}); "
            f"solve {self.solve_seconds:.3g} s"
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        last = f"{self.records[-1].norm:.3e}" if self.records else "-"
        return (
            f"MGRITResult(status={self.status!r}, iterations={self.iterations}, "
            f"final_norm={last}, levels={len(self.hierarchy)})"
        )
