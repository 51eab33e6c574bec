"""MGRIT: multigrid reduction in time for ``u[i] = Φ(u[i-1]) + g[i]``, as a teaching object.

It knows nothing about neural networks: it sees a step function and arrays.

==============  =====================================================================
module          job
==============  =====================================================================
problem.py      the problem (step in fine indices, u0, g, t, direction); sequential solve
arrays.py       the array namespace of a state (shared by every module below)
settings.py     MGRITSettings: levels, cfactors, relaxation, cycle, tolerances
grid.py         the level hierarchy and C/F points (any N)
relax.py        F-/C-relaxation and the C-point residual (pure functions)
coarse.py       injection, FAS right-hand side, correction, exact coarse solve (pure)
spatial.py      spatial grid transfers R, P on feature maps and their exact transposes
transfer.py     SpatialCoarsening: R/P between levels (Problem.transfer), adjoint pair
cycle.py        the V-/F-cycle recursion and nested iteration over those functions
fused.py        the cycle's bookkeeping fused into the sweeps, per block (same numbers)
fused_cycle.py  the cycle with those fused pieces (MGRITSettings.fused, the default)
solver.py       solve(): iterate, stop, record; gather_solution()
workspace.py    Workspace: per-level arrays kept across solves of the same shapes
record.py       MGRITResult: residuals per iteration and level, counters, timings
theory.py       two-level error-propagator bounds and matrices (docs/references.md §3)
plots.py        figures from a record
problems.py     model problems: Dahlquist, 1-D heat equation, a nonlinear ODE
==============  =====================================================================
"""

from .grid import Hierarchy, Level, build_hierarchy, max_levels
from .outcome import MGRITDiverged
from .problem import Problem, as_problem, sequential_solve
from .record import IterationRecord, LevelVisit, MGRITResult
from .settings import MGRITSettings
from .solver import gather_solution, solve
from .workspace import GradientWorkspace, Workspace

__all__ = [
    "GradientWorkspace",
    "Hierarchy",
    "IterationRecord",
    "Level",
    "LevelVisit",
    "MGRITDiverged",
    "MGRITResult",
    "MGRITSettings",
    "Problem",
    "as_problem",
    "build_hierarchy",
    "gather_solution",
    "max_levels",
    "sequential_solve",
    "solve",
    "Workspace",
]
