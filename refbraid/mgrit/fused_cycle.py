"""The cycle of cycle.py with its bookkeeping fused into the sweeps (``MGRITSettings.fused``).

:class:`FusedCycler` runs the same recursion as :class:`~refbraid.mgrit.cycle.Cycler` (its
``cycle``, ``nested_iteration``, ``solve_coarsest`` and the norms are the textbook's) and
replaces three of its steps by the fused functions of :mod:`refbraid.mgrit.fused`::

    relax(ℓ):      F-sweep and the C-point residual in one pass (the residual of each C-point
                   as soon as the interval before it is swept); on FCF levels C-relaxation
                   writes Φ + g straight into u[C] (no block of (P u)[C]), and only the
                   residuals someone reads are formed (the last one; the first on level 0,
                   for the record's post-cycle norm)
    coarse_correction(ℓ):
                   w = v and g_{ℓ+1} = R r + A_{ℓ+1}(v) in one pass over the coarse rows;
                   the correction u_ℓ[C] += P(w − v) is not applied here but handed to the
                   next F-sweep of level ℓ (always the next thing that touches level ℓ),
                   which applies it at each C-point just before stepping from it

The row-by-row forms run on NumPy states with per-point sweeps (a CPU's cache holds rows).
Batched sweeps (a problem with ``batched_step``) keep their one call per sweep, and device
arrays (CuPy, the ``cuda`` backend's) the textbook's block operations, one launch each where
a row loop would launch per row: there the residual and the FAS right-hand side are formed in
place where NumPy allows, and the correction is applied as a block before the first sweep.
A batched step that writes rows (``out=``/``add=``: the layer-parallel propagators) writes
the residual's, C-relaxation's and the FAS right-hand side's rows itself
(:func:`~refbraid.mgrit.batched.residual_at`, ``c_relax_at``, ``fas_rhs``: no stacked block
of ``(P u)[C]``), and on CuPy arrays the residual's last pass ``− u[C]`` also makes the
``Σ r²`` its norm needs (``batched.residual_and_squares``; :meth:`local_sq` takes it).
Either way FCF forms only the residuals someone reads and nested iteration skips the copies
it never reads; on NumPy rows and with batched sweeps, when the first down-cycle is skipped,
it writes each coarse level straight into the C-rows of the level above (no injection:
:meth:`nested_iteration`).
When the solver knows a level-0 relaxation is its last (``watch_finite``), the row-by-row
sweep also checks each (large) F-row it writes for NaN/inf (``f_rows_finite``), so
the solver's finiteness check of the solution reads only the C-rows afterwards. Every value
equals the textbook cycle's bit for bit (fused.py's docstring; tests/mgrit/test_fused.py).
"""

from __future__ import annotations

import numpy as np
from array_api_compat import is_cupy_array

from ..backends.host import host_float
from ..backends.into import in_place_ok
from ..backends.portable import empty_on
from . import batched
from .coarse import correct, fas_sum
from .cycle import Cycler, LevelState, exchange_stepped
from .fused import (
    WATCH_MIN_ROW,
    Correction,
    FiniteWatch,
    c_relax_rows,
    first_residual_row,
    restrict_fas,
    sweep_residual,
)
from .relax import c_relax, copy, row_slice, rows_view


def _view_of(rows, u, c_pos) -> bool:
    """Whether ``rows`` (``rows_view(u, c_pos)``) is a view of ``u``'s C-rows that writes
    reach ``u`` through: NumPy's (checked), or CuPy's for evenly spaced positions (a
    slice of a CuPy array is a view)."""
    if isinstance(rows, np.ndarray):
        return rows.base is not None and np.may_share_memory(rows, u)
    return is_cupy_array(rows) and is_cupy_array(u) and row_slice(c_pos) is not None


class FusedCycler(Cycler):
    """:class:`~refbraid.mgrit.cycle.Cycler` with fused bookkeeping (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pending: dict[int, Correction] = {}  # level -> correction for its next F-sweep
        #: id(r) -> (r, Σ r²) for residuals whose sum of squares their last pass made (a
        #: device residual: batched.residual_and_squares), until local_sq takes it
        self._squares: dict[int, tuple] = {}
        # the row-by-row forms: NumPy states, per-point sweeps (else block operations)
        self._rows = (not self.batched and bool(self.states)
                      and isinstance(self.states[0].step.problem.u0, np.ndarray))
        #: set by the solver before the level-0 relaxation it knows is its last: that
        #: relaxation's final F-sweep checks the rows it writes (fused.FiniteWatch)
        self.watch_finite = False
        #: after a level-0 relaxation: (all its final F-sweep's rows finite, rows seen, whether
        #: the watch was ``carried``), or None when that sweep checked none (not watched, or
        #: not the row-by-row path)
        self.f_rows_finite: tuple[bool, int, bool] | None = None
        #: nested iteration without V-cycles: level -> its iterate, a view of the C-rows of
        #: the level above it (nested_iteration)
        self._aliases: dict[int, np.ndarray] = {}
        self._alias_down = False

    # -- sweeps ----------------------------------------------------------------------------
    def _sweep(self, s: LevelState, residual: bool):
        """F-sweep on a level's block with its pending correction; with ``residual`` also the
        C-point residual (the ghost exchanged once the block is swept). Returns r or None."""
        ell = s.level.index
        g_sweep = None if (self._unforced0 and ell == 0) else s.g
        corr = self._pending.pop(ell, None)
        if not self._rows:
            if corr is not None:
                spatial = s.step.problem.transfer is not None
                s.u = correct(s.u, s.c_pos, corr.w, corr.v, inplace=True,
                              interpolate=(lambda d: self.to_fine(ell, d)) if spatial else None)
            super()._f_relax(s)
            if not residual:
                return None
            if self.batched:  # the residual's rows written where they end (batched.py)
                ghost = exchange_stepped(self.comm, s, s.u[-1, ...])
                r, sq = batched.residual_and_squares(
                    s.u, s.g, s.points, s.c_pos, s.step, ghost, s.ghost_point,
                    unforced=self._unforced0 and ell == 0)
                if sq is not None:  # Σ r² made with r's last pass: local_sq takes it
                    self._squares[id(r)] = (r, sq)
                return r
            pu = self._propagate_c(s)  # a new block (Φ + g)
            uc = rows_view(s.u, s.c_pos)
            return np.subtract(pu, uc, out=pu) if in_place_ok(pu, uc) else pu - uc
        watch = (FiniteWatch(s.step.problem.carries_nonfinite)
                 if residual and ell == 0 and self.watch_finite
                 and s.u[0, ...].size >= WATCH_MIN_ROW else None)
        r = sweep_residual(s.u, g_sweep, s.g, s.points, s.c_pos, s.step, corr, residual, watch)
        if not residual:
            return None
        if ell == 0:
            self.f_rows_finite = None if watch is None else (watch.ok, watch.rows, watch.carried)
        ghost = exchange_stepped(self.comm, s, s.u[-1, ...])
        return first_residual_row(r, s.u, s.g, s.points, s.step, ghost, s.ghost_point)

    def _f_relax(self, s: LevelState) -> None:
        self._sweep(s, residual=False)

    def local_sq(self, r, on_host: bool = True):
        """:meth:`Cycler.local_sq`, taking the sum of squares a residual's last pass made
        where there is one (the same sum up to its order of additions)."""
        known = self._squares.pop(id(r), None)
        if known is None or known[0] is not r:
            return super().local_sq(r, on_host)
        return host_float(known[1]) if on_host else known[1]

    def relax(self, ell: int, snapshot: bool = False, first: bool = True):
        """As :meth:`Cycler.relax`; ``first=False`` skips the first residual of an FCF
        relaxation (the cycle never reads it; the solver's level-0 record does)."""
        s = self.states[ell]
        sweeps = 0 if s.coarsest else self.settings.sweeps_on(ell)
        if not sweeps:
            r = self._sweep(s, residual=True)
            return r, r, (s.u if snapshot else None)
        self._sweep(s, residual=False)
        u_first = copy(s.u) if snapshot else None
        r = r_first = None
        for i in range(sweeps):
            want = first and i == 0
            ghost = exchange_stepped(self.comm, s, s.u[-1, ...])
            if self.batched and not want:  # Φ + g written into u[C] (batched.py)
                s.u = batched.c_relax_at(s.u, s.g, s.points, s.c_pos, s.step, ghost,
                                         s.ghost_point, unforced=self._unforced0 and ell == 0)
            elif not self._rows:
                pu = self._propagate(s.u, s.g, s.points, s.c_pos, s.step, ghost, s.ghost_point)
                if want:
                    r_first = pu - rows_view(s.u, s.c_pos)
                s.u = c_relax(s.u, pu, s.c_pos, inplace=True)
            else:
                rf = c_relax_rows(s.u, s.g, s.points, s.c_pos, s.step, ghost, s.ghost_point,
                                  residual=want)
                r_first = rf if want else r_first
            r = self._sweep(s, residual=i == sweeps - 1)
        return r, r_first, u_first

    def nested_iteration(self, vcycles: int) -> None:
        """:meth:`Cycler.nested_iteration`; without V-cycles on the way up (the skipped first
        down-cycle), on NumPy rows or with batched sweeps (NumPy or CuPy blocks), with
        F-relaxation on level 0 and no final FC relaxation, each coarse level's iterate *is*
        the C-rows of the level above (a strided view): the coarsest solve and the F-sweeps
        write their values where injection would copy them, and injection has nothing left
        to do. The same values in the same rows, one pass over
        every C-row less per level. Level 0's C-rows then change only after each coarse
        level has its own iterate again (the first coarse correction gives it one), so a
        coarse level's values stay its own."""
        s = self.settings
        self._alias_down = (vcycles == 0 and (self._rows or self.batched)
                            and s.sweeps_on(0) == 0 and not s.final_fc_relax)
        try:
            super().nested_iteration(vcycles)
        finally:
            self._alias_down = False

    def _nested_start(self, ell: int, c_rows):
        """An array of the injected rows' shape, values unset: without a spatial transfer
        nested iteration overwrites every value of a coarse level before reading it (the
        coarsest solve; above it, injection into the C-points, then the F-sweep), so the
        textbook's copy down is never read. Where :meth:`nested_iteration` allows, the
        C-rows themselves (a view of the level above: nothing to inject later)."""
        above = self.states[ell - 1]
        if self._alias_down and _view_of(c_rows, above.u, above.c_pos):
            self._aliases[ell] = c_rows
            return c_rows
        self._aliases.pop(ell, None)
        if self.workspace is not None:
            return self.workspace.empty("u", ell, c_rows, c_rows.shape)
        return empty_on(c_rows, c_rows.shape)

    def _aliased(self, ell: int) -> bool:
        """Whether level ``ell``'s iterate is still the view of the C-rows above it."""
        return self._aliases.get(ell) is self.states[ell].u

    def _coarsest_out(self, c: LevelState):
        """The coarsest solve writes into the C-rows above it when its iterate is their view."""
        return c.u if self._aliased(c.level.index) else super()._coarsest_out(c)

    def _inject_up(self, ell: int) -> None:
        """Nothing to copy where level ℓ+1's iterate is the view of level ℓ's C-rows."""
        if not self._aliased(ell + 1):
            super()._inject_up(ell)

    # -- the recursion ---------------------------------------------------------------------
    def _fas(self, ell: int, r, v, ghost_v):
        """(w, g_{ℓ+1}): the coarse level's start (restrict_fas; as blocks: Φ_Δ of every
        point, then ``v − Φ_Δ`` and ``+ R r``, into the right-hand side's own array where
        NumPy allows: coarse.fas_rhs's operations without its temporaries)."""
        c, ws = self.states[ell + 1], self.workspace
        g_out = None if ws is None else ws.empty("g", ell + 1, v, v.shape)
        rr = self.to_coarse(ell, r)
        if self._rows:
            u_out = None if ws is None else ws.empty("u", ell + 1, v, v.shape)
            return restrict_fas(v, rr, c.points, c.step, ghost_v, c.ghost_point, u_out, g_out)
        w = self._level_copy(ell + 1, v)
        if self.batched:  # Φ_Δ written into the right-hand side's rows (batched.py)
            return w, batched.fas_rhs(rr, v, c.points, c.step, ghost_v, c.ghost_point, g_out)
        phi = self._propagate(v, None, c.points, range(len(c.points)), c.step, ghost_v,
                              c.ghost_point)
        return w, fas_sum(rr, v, phi, g_out)

    def coarse_correction(self, ell: int, r, kind: str) -> None:
        """FAS restriction to ℓ+1 and the coarse cycle(s) as in :meth:`Cycler.coarse_correction`;
        the correction of level ℓ waits for its next F-sweep (module docstring)."""
        s, c = self.states[ell], self.states[ell + 1]
        v = self.to_coarse(ell, rows_view(s.u, s.c_pos))  # a view of u_ℓ[C] without R
        ghost_v = exchange_stepped(self.comm, c, v[-1, ...])
        c.u, c.g = self._fas(ell, r, v, ghost_v)
        self.cycle(ell + 1, kind)
        if kind == "F" and not c.coarsest:
            self.cycle(ell + 1, "V")
        self.interpolate(ell + 1)
        transfer = s.step.problem.transfer
        row_p = None
        if transfer is not None:
            fine = self._fine_indices(ell)

            def row_p(j, d, ell=ell, fine=fine):
                return transfer.interpolate(d, ell, int(fine[j]))
        self._pending[ell] = Correction(c.u, v, row_p)

    def cycle(self, ell: int, kind: str) -> None:
        """:meth:`Cycler.cycle`, without the first residual of an FCF relaxation."""
        s = self.states[ell]
        if s.coarsest:
            self.solve_coarsest()
            return
        r, _, _ = self.relax(ell, first=False)
        self.visits.append(self.visit(ell, r))
        self.coarse_correction(ell, r, kind)
