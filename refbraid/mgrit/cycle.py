"""The MGRIT cycle: a short recursion over the pure functions of relax.py and coarse.py.

One rank holds, per level ℓ, the block of points it owns (``LevelState``): iterate ``u``,
right-hand side ``g`` and the counting step. Neighbour values come only from the
communicator (``exchange_stepped``, ``pipeline``); with one rank that is the whole grid. A
step that crosses a block boundary is made by the block where it starts and its result sent
on, so each rank applies only the steps from its own points (its own layers).

::

    cycle(ℓ, kind):                                   # kind 'V' or 'F'
        if ℓ is the coarsest:  u_ℓ = forward substitution of A_ℓ(u) = g_ℓ      (pipeline)
        else:                  r = relax(ℓ);  record;  coarse_correction(ℓ, r, kind)

    relax(ℓ):          F-sweep; r = residual at C; ν × (C-relax, F-sweep, r = residual)
    coarse_correction(ℓ, r, kind):
        v = R u_ℓ[C];   g_{ℓ+1} = R r + A_{ℓ+1}(v);   u_{ℓ+1} = v             (FAS)
        cycle(ℓ+1, kind);   if kind == 'F': cycle(ℓ+1, 'V')                   (F-cycle)
        F-sweep on ℓ+1 (interpolation to its F-points)
        u_ℓ[C] += P(u_{ℓ+1} - v)

R and P are the problem's spatial transfer (identity unless ``Problem.transfer`` is set,
:mod:`refbraid.mgrit.transfer`); each level's states then have their own shape.

After a cycle the F-points of level ℓ are stale until the next F-sweep (the first step of
every relaxation); on level 0 that sweep is the interpolation of the previous cycle, so no
step is spent twice.

Nested iteration (cold-start initial guesses)::

    g_{ℓ+1} = R g_ℓ[C], u_{ℓ+1} = R u_ℓ[C] for all ℓ;  solve the coarsest level
    for ℓ = L-2 .. 0:  F-sweep on ℓ+1;  u_ℓ[C] = u_{ℓ+1}  (with a spatial transfer:
                       u_ℓ[C] += P(u_{ℓ+1} − R u_ℓ[C]));  if ℓ > 0: vcycles × cycle(ℓ, 'V')

``vcycles = 0`` is the skipped first down-cycle (Parareal's coarse initial guess),
``vcycles = 1`` the FMG (full multigrid) initial guess.

This module is the textbook cycle, step by step (``MGRITSettings(fused=False)``). The solver
runs it by default with its bookkeeping fused into the sweeps (:mod:`.fused_cycle`: the
residual formed by the sweep that produces it, restriction and FAS right-hand side in one
pass, the correction applied by the next F-sweep): the same recursion and the same numbers
bit for bit, fewer passes over whole blocks (docs/solver_fusion.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ..backends.host import host_float
from ..backends.portable import copy_of, indexes_with_integer_arrays
from ..parallel.comm import Comm, exchange_ghost, pipeline
from ..parallel.layout import Layout
from . import batched
from .arrays import namespace
from .coarse import (
    correct,
    fas_rhs,
    forward_substitution,
    inject_up,
    to_coarse_space,
    to_fine_space,
)
from .grid import Hierarchy, Level
from .problem import CountingStep, Problem
from .record import LevelVisit
from .relax import Stepped, c_relax, copy, f_relax, propagate_at, rows_view
from .settings import MGRITSettings
from .workspace import Workspace


@dataclass(eq=False)
class LevelState:
    """This rank's block of one level: points, C/F positions, ghost point, step, u, g."""

    level: Level
    points: np.ndarray  # (n,) solver indices owned here
    c_pos: np.ndarray  # local positions of C-points (the points of level ℓ+1)
    f_pos: np.ndarray  # local positions of F-points
    ghost_point: int | None  # solver index of the previous block's last point on this level
    next_point: int | None  # solver index of the next block's first point on this level
    step: CountingStep
    coarsest: bool
    u: Any = None  # (n, *S)
    g: Any = None  # (n, *S)

    @cached_property
    def f_sweeps(self) -> list[batched.Sweep]:
        """F-positions grouped by sweep, planned for the batched F-relaxation once per level
        (batched.f_sweeps, batched.sweep_plan)."""
        return batched.sweep_plan(batched.f_sweeps(self.f_pos), self.points)


def build_states(
    hierarchy: Hierarchy, layout: Layout, position: int, problem: Problem
) -> list[LevelState]:
    """Per-level blocks of block ``position`` of ``layout`` (u and g still unset)."""
    states = []
    shapes = problem.level_shapes(len(hierarchy))
    for lvl in hierarchy:
        sl = layout.positions(lvl.points, position)
        is_c = lvl.is_c[sl]
        states.append(
            LevelState(
                level=lvl,
                points=lvl.points[sl],
                c_pos=np.flatnonzero(is_c),
                f_pos=np.flatnonzero(~is_c),
                ghost_point=int(lvl.points[sl.start - 1]) if sl.start > 0 else None,
                next_point=int(lvl.points[sl.stop]) if sl.stop < len(lvl.points) else None,
                step=CountingStep(problem, lvl.index, shapes[lvl.index]),
                coarsest=lvl is hierarchy.coarsest,
            )
        )
    return states


def stepped_across(s: LevelState, last):
    """``Φ(last; p_last → next block's first point)`` on ``s``'s level, made by this block
    (the owner of the step's start point: its layer, its weights, its forward cache), or
    None for the last block. An array of its own: it travels while this block's rows change
    (a step may return its input, or a view of it; device arrays are copied as before)."""
    if s.next_point is None:
        return None
    value = s.step(last, int(s.points[-1]), s.next_point)
    if isinstance(value, np.ndarray) and not np.may_share_memory(value, last):
        return value
    return copy_of(value)


def exchange_stepped(comm: Comm, s: LevelState, last):
    """The ghost exchange across block boundaries on ``s``'s level: this block's ``last``
    point stepped to the next block's first point is sent on, and the previous block's
    returned as a :class:`~refbraid.mgrit.relax.Stepped` ghost (None for the first block).
    Each boundary step is made once, by the rank that owns its start point, so every rank
    applies the steps of its own layers only (XBraid makes it where it ends)."""
    ghost = exchange_ghost(comm, stepped_across(s, last), copy=False)  # an array of its own
    return None if ghost is None else Stepped(ghost)


class Cycler:
    """Runs relaxations, coarse corrections and cycles on a rank's :class:`LevelState` list.

    ``visits`` collects a :class:`LevelVisit` for every coarse-level relaxation; the solver
    points it at the current iteration's record.

    When the problem has a ``batched_step`` the sweeps and residual rows use the batched
    functions of :mod:`refbraid.mgrit.batched` (one step call per sweep); otherwise the
    per-point functions of :mod:`refbraid.mgrit.relax`, the reference. Same math either way.
    The batched functions index rows with integer arrays, which the array API standard
    leaves out: on other arrays (the strict device stand-in) the per-point path runs instead.
    """

    def __init__(self, states: list[LevelState], settings: MGRITSettings, comm: Comm,
                 workspace: Workspace | None = None):
        self.states = states
        self.settings = settings
        self.comm = comm
        self.workspace = workspace  # kept coarse-level arrays (workspace.py), or None
        self.visits: list[LevelVisit] = []
        self.pending = None  # a PendingNorms: coarse norms reduced at the end of the solve
        self.batched = (bool(states) and states[0].step.batched
                        and indexes_with_integer_arrays(states[0].step.problem.u0))
        self._propagate = batched.propagate_at if self.batched else propagate_at
        # level 0's right-hand side is u0 at s = 0 and the problem's forcing elsewhere: with
        # no forcing, F-sweeps there add nothing (g None), a saving of one add per fine step
        self._unforced0 = bool(states) and states[0].step.problem.g is None

    def _f_relax(self, s: LevelState) -> None:
        """F-sweep on a level's block, in place (batched when the problem allows)."""
        g = None if (self._unforced0 and s.level.index == 0) else s.g
        if self.batched:
            s.u = batched.f_relax(s.u, g, s.points, s.f_sweeps, s.step, inplace=True)
        else:
            s.u = f_relax(s.u, g, s.points, s.f_pos, s.step, inplace=True)

    # -- reductions ------------------------------------------------------------------------
    def local_sq(self, r, on_host: bool = True):
        """This rank's ``Σ r²`` of a residual block, reduced where ``r`` lives: a float on the
        host, or (``on_host=False``, for a norm that waits for the end of the solve) the 0-d
        device array it would be copied from — no synchronisation now (norms.PendingNorms
        copies every such sum of a solve in one transfer)."""
        xp = namespace(r)
        if not r.shape[0]:
            return 0.0
        if isinstance(r, np.ndarray) and r.dtype.kind == "f":
            # NumPy's |r| ** 2 is square(|r|) = r·r exactly, and numba_cpu_sums forms
            # numpy.sum(r * r) in one pass with its bits (other arrays: the general form)
            from ..backends.numba_cpu_sums import sum_of_squares  # numba on first use only

            return sum_of_squares(r)
        # real: Σ r·r, one temporary (|r| ** 2 makes two and reads r's size three times)
        total = (xp.sum(xp.square(r)) if xp.isdtype(r.dtype, "real floating")
                 else xp.sum(xp.abs(r) ** 2))
        return host_float(total) if on_host else total

    def norm(self, r) -> float:
        """Global 2-norm ``(Σ_ranks Σ r²)^½`` of a residual block (the stopping test and the
        record need it on the host)."""
        return math.sqrt(self.comm.allreduce_sum(self.local_sq(r)))

    # -- building blocks -------------------------------------------------------------------
    def _level_copy(self, ell: int, block):
        """A copy of ``block`` to become level ``ell``'s iterate: the workspace's kept array
        when there is one (its previous content is dead: the level's last iterate), else a
        fresh copy. The same values either way."""
        if self.workspace is None:
            return copy(block)
        return self.workspace.copy_into("u", ell, block)

    def _nested_start(self, ell: int, c_rows):
        """Level ``ell``'s iterate on the way down of nested iteration (no spatial transfer):
        the injected C-rows of the level above."""
        return self._level_copy(ell, c_rows)

    def _propagate_c(self, s: LevelState):
        ghost = exchange_stepped(self.comm, s, s.u[-1, ...])
        return self._propagate(s.u, s.g, s.points, s.c_pos, s.step, ghost, s.ghost_point)

    def relax(self, ell: int, snapshot: bool = False):
        """F-sweep, then ν × (C, F) on level ``ell``; returns ``(r, r_first, u_first)``: the
        C-point residual after the relaxation and after its first F-sweep, and (if
        ``snapshot``) the iterate after that first F-sweep (else None)."""
        s = self.states[ell]
        self._f_relax(s)
        sweeps = 0 if s.coarsest else self.settings.sweeps_on(ell)
        u_first = (copy(s.u) if sweeps else s.u) if snapshot else None
        pu = self._propagate_c(s)
        r = r_first = pu - rows_view(s.u, s.c_pos)
        for _ in range(sweeps):
            s.u = c_relax(s.u, pu, s.c_pos, inplace=True)
            self._f_relax(s)
            pu = self._propagate_c(s)
            r = pu - rows_view(s.u, s.c_pos)
        return r, r_first, u_first

    def interpolate(self, ell: int) -> None:
        """F-sweep on level ``ell`` so its F-points match its (corrected) C-points."""
        s = self.states[ell]
        if not s.coarsest:
            self._f_relax(s)

    def solve_coarsest(self) -> None:
        """Forward substitution on the coarsest level, block after block (pipeline)."""
        c = self.states[-1]
        # with a workspace the block is its kept array, overwritten by the next coarsest
        # solve while a message may be in flight: what is sent on is the last point stepped
        # across the boundary, an array of its own (stepped_across)
        out = self._coarsest_out(c)
        c.u = pipeline(
            self.comm,
            lambda ghost: forward_substitution(c.g, c.points, c.step,
                                               None if ghost is None else Stepped(ghost),
                                               c.ghost_point, out=out),
            last=lambda u: stepped_across(c, u[-1, ...]),
        )

    def _coarsest_out(self, c: LevelState):
        """Where the coarsest solve writes its block: the workspace's kept array, or None (a
        new one)."""
        ws = self.workspace
        return None if ws is None else ws.empty("u", c.level.index, c.g, c.g.shape)

    def _inject_up(self, ell: int) -> None:
        """Nested iteration's way up: ``u_ℓ[C] = u_{ℓ+1}`` (in place: the level arrays are the
        cycle's own, no copy of the whole level)."""
        st = self.states
        st[ell].u = inject_up(st[ell].u, st[ell].c_pos, st[ell + 1].u, inplace=True)

    # -- space: R and P between level ℓ and ℓ+1 (identity without a transfer) ------------
    def _fine_indices(self, ell: int):
        c = self.states[ell + 1]
        return [c.step.problem.to_fine(int(p)) for p in c.points]

    def to_coarse(self, ell: int, block):
        """``R`` on a block of level ℓ's C-point rows (shaped for level ℓ+1)."""
        transfer = self.states[ell].step.problem.transfer
        if transfer is None:
            return block
        return to_coarse_space(block, transfer, ell, self._fine_indices(ell))

    def to_fine(self, ell: int, block):
        """``P`` on a block of level ℓ+1 rows (shaped for level ℓ's C-points)."""
        transfer = self.states[ell].step.problem.transfer
        if transfer is None:
            return block
        return to_fine_space(block, transfer, ell, self._fine_indices(ell))

    # -- the recursion ---------------------------------------------------------------------
    def coarse_correction(self, ell: int, r, kind: str) -> None:
        """FAS restriction to ℓ+1, coarse cycle(s), interpolation, correction of level ℓ."""
        s, c = self.states[ell], self.states[ell + 1]
        # v = u_ℓ[C]: a view of the C-rows where it can be (NumPy, evenly spaced C-points),
        # not a gathered copy. Safe: nothing writes u_ℓ until `correct` has read v (the
        # coarse cycle works on level ℓ+1's own arrays, c.u is a copy, the ghost travels as
        # a copy), and `correct` forms w - v before it adds to u_ℓ[C].
        v = self.to_coarse(ell, rows_view(s.u, s.c_pos))
        ghost_v = exchange_stepped(self.comm, c, v[-1, ...])
        g_out = (None if self.workspace is None
                 else self.workspace.empty("g", ell + 1, v, v.shape))
        c.g = fas_rhs(self.to_coarse(ell, r), v, c.points, c.step, ghost_v, c.ghost_point,
                      self._propagate, out=g_out)
        c.u = self._level_copy(ell + 1, v)
        self.cycle(ell + 1, kind)
        if kind == "F" and not c.coarsest:
            self.cycle(ell + 1, "V")
        self.interpolate(ell + 1)
        spatial = s.step.problem.transfer is not None
        s.u = correct(s.u, s.c_pos, c.u, v, inplace=True,
                      interpolate=(lambda d: self.to_fine(ell, d)) if spatial else None)

    def cycle(self, ell: int, kind: str) -> None:
        """One V- or F-cycle for level ``ell``'s problem ``A_ℓ(u) = g_ℓ``."""
        s = self.states[ell]
        if s.coarsest:
            self.solve_coarsest()
            return
        r, _, _ = self.relax(ell)
        self.visits.append(self.visit(ell, r))
        self.coarse_correction(ell, r, kind)

    def visit(self, ell: int, r) -> LevelVisit:
        """Record of a relaxation of level ``ell`` (norm always, vectors as configured). With
        ``pending`` (the solver's :class:`~refbraid.mgrit.norms.PendingNorms`) the norm is
        stored when the solve ends (nothing decides on a coarse level's norm), else now."""
        s = self.states[ell]
        visit = LevelVisit(
            level=ell,
            norm=math.nan if self.pending is not None else self.norm(r),
            residual=r if self.settings.keep_residuals else None,
            iterate=copy(s.u) if self.settings.keep_iterates else None,
        )
        if self.pending is not None:
            self.pending.add(self.local_sq(r, on_host=False),
                             lambda norm: setattr(visit, "norm", norm))
        return visit

    def nested_iteration(self, vcycles: int) -> None:
        """Cold-start initial guess from the coarsest grid up (see module docstring)."""
        st = self.states
        spatial = st[0].step.problem.transfer is not None
        for ell in range(len(st) - 1):
            # g_ℓ[C] as a view where it can be: no level's g is ever written in place (the
            # coarse correction assigns a fresh FAS right-hand side), u_ℓ[C] stays a copy
            st[ell + 1].g = self.to_coarse(ell, rows_view(st[ell].g, st[ell].c_pos))
            # u_ℓ[C]: read through a view; level ℓ+1's iterate is a copy (R's output, else
            # a copy of the rows, into the workspace's kept array when there is one)
            c_rows = rows_view(st[ell].u, st[ell].c_pos)
            st[ell + 1].u = (self.to_coarse(ell, c_rows) if spatial
                             else self._nested_start(ell + 1, c_rows))
        self.solve_coarsest()
        for ell in range(len(st) - 2, -1, -1):
            self.interpolate(ell + 1)
            if spatial:  # u_ℓ[C] += P(w − R u_ℓ[C]): keeps u_ℓ's fine detail (and u0 exact)
                # v is read only (R makes new rows): a view of u_ℓ[C] suffices
                v = self.to_coarse(ell, rows_view(st[ell].u, st[ell].c_pos))
                st[ell].u = correct(st[ell].u, st[ell].c_pos, st[ell + 1].u, v,
                                    interpolate=lambda d, ell=ell: self.to_fine(ell, d))
            else:
                self._inject_up(ell)
            if ell > 0:
                for _ in range(vcycles):
                    self.cycle(ell, "V")
