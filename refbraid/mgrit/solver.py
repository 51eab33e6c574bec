"""``solve``: MGRIT iterations until the fine C-point residual is small, with a full record.

::

    u = initial iterate (warm start u_init, or u0 at every point, or nested iteration)
    for k = 0, 1, ...:
        relax level 0;  r_k = fine C-point residual          (XBraid convention)
        record k;  stop if ‖r_k‖ ≤ abs_tol or ‖r_k‖ ≤ rel_tol·‖r_first‖  → 'converged'
                   stop if ‖r_k‖ is NaN/inf or > max_growth·‖r_first‖      → 'diverged'
                   stop if k == max_iter                                   → 'max_iter'
        coarse correction of level 0 (V- or F-cycle below it)
    return the iterate of the last measurement (F-points consistent, residual ‖r_k‖)
    final_fc_relax:  u[C] ← u[C] + r_k = Φ(u[c-1]) + g[c]     (XBraid's final FC relaxation)

Divergence: ``on_divergence='raise'`` raises :class:`MGRITDiverged` (its ``result`` holds the
record so far); ``'flag'`` returns the result with ``status == 'diverged'``. A non-finite
value anywhere in the returned solution is also divergence. The message (and the result's
``message``) names the iteration and the level where it arose: growth is measured on level 0;
a NaN/inf is detected on level 0 but may have arisen on a coarse level in the cycle before.
That level is the first whose recorded residual in that cycle is non-finite (a relaxation
passes NaN on to every coarser level), else the coarsest level whose iterate holds NaN/inf
(the exact coarsest solve, or an interpolating F-sweep, passes it only to finer levels), else
level 0.

Adjoint (backward) problems run the same code on the reversed grid (solver order
``s = N - i``) with the communicator's ranks reverted.

With several ranks each one calls :func:`solve` with its communicator and gets the solution
of its own block (``result.fine_indices``); :func:`gather_solution` assembles the whole
trajectory on one rank.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from ..backends.capture_state import host_reads_allowed
from ..backends.portable import stack_rows, zeros_on
from ..parallel.comm import SerialComm
from ..parallel.layout import Layout, check_layout, partition
from .arrays import namespace
from .cycle import Cycler, build_states
from .fused_cycle import FusedCycler
from .grid import build_hierarchy
from .norms import PendingNorms, defer_norms, status_after
from .outcome import MGRITDiverged, divergence_level, solution_finite, where
from .problem import Problem, as_problem, from_fine_order, rhs_solver_order, stacked
from .record import IterationRecord, LevelVisit, MGRITResult
from .relax import copy, rows_view, set_rows, take_rows
from .settings import MGRITSettings
from .workspace import Workspace

_COMM_METHODS = ("send_next", "recv_prev", "allreduce_sum", "gather", "reverted")


def _check_comm(comm) -> None:
    missing = [m for m in _COMM_METHODS if not callable(getattr(comm, m, None))]
    if missing or not hasattr(comm, "size") or not hasattr(comm, "position"):
        raise TypeError(
            f"`comm` must implement the refbraid.parallel.comm.Comm interface "
            f"(missing {missing or ['size/position']}), got {comm!r}."
        )


def _overwritten(problem: Problem, u_init, settings: MGRITSettings, n_levels: int) -> bool:
    """Whether the start replaces every value of level 0's initial iterate before reading it:
    the exact one-level solve, and nested iteration without a spatial transfer (its
    restriction of u_0 to the coarse levels is overwritten there by the coarsest solve, the
    injections and the interpolating F-sweeps; with a transfer, u_ℓ[C] += P(w − R u_ℓ[C])
    reads it)."""
    if u_init is not None or problem.guess is not None:
        return False
    nested = settings.fmg or settings.skip_first_down
    return n_levels == 1 or (nested and problem.transfer is None)


def _initial_iterate(problem: Problem, u_init, g_block, rows: slice, overwritten: bool = False,
                     workspace=None):
    """Solver-order block of the initial iterate: u_init if given, else the problem's
    ``guess(i)`` at every fine index i (u0 at the initial point), else u0 everywhere.

    ``overwritten`` (:func:`_overwritten`): the start replaces every value, so the block is
    zeros (lazily zeroed pages: no pass over the whole trajectory) with u0 at s = 0; with a
    ``workspace`` its kept level-0 array as it is (every value is written before it is read).
    Otherwise a workspace's array receives the same values a fresh one would (a warm start
    excepted: it stays a fresh copy, since ``u_init`` may be the workspace's last solution)."""
    xp = namespace(problem.u0)
    n = rows.stop - rows.start
    shape = (n, *problem.state_shape)
    if overwritten:
        if workspace is None:
            u = zeros_on(problem.u0, shape)
        else:
            u = workspace.empty("u", 0, problem.u0, shape)
        if rows.start == 0:
            u[0, ...] = g_block[0, ...]
        return u
    if u_init is None and problem.guess is not None:
        u = stack_rows([problem.guess(problem.to_fine(s)) for s in range(rows.start, rows.stop)])
        if workspace is not None:
            u = workspace.copy_into("u", 0, u)
        if rows.start == 0:
            u[0, ...] = g_block[0, ...]
        return u
    if u_init is None:
        out = None if workspace is None else workspace.empty("u", 0, problem.u0, shape)
        return stacked(xp, problem.u0, n, out)
    want = (problem.n_steps + 1, *problem.state_shape)
    if tuple(getattr(u_init, "shape", ())) != want:
        raise ValueError(
            f"`u_init` must have shape (n_steps + 1, *u0.shape) = {want}, "
            f"got {getattr(u_init, 'shape', type(u_init).__name__)}."
        )
    # a fresh copy even with a workspace: a warm start may be the workspace's own last solution
    u = copy(from_fine_order(problem, xp.asarray(u_init, dtype=problem.u0.dtype))[rows, ...])
    if rows.start == 0:
        u[0, ...] = g_block[0, ...]  # the initial value is not a guess
    return u


def _start(cycler: Cycler, n_levels: int, settings: MGRITSettings, warm: bool) -> str:
    """Build the initial iterate; returns how: 'exact' (one level: the sequential solve),
    'warm' (u_init as given), 'fmg' / 'skip' (nested iteration with 1 / 0 V-cycles per level),
    or 'cold' (u0 at every point)."""
    if n_levels == 1:
        cycler.solve_coarsest()
        return "exact"
    if warm:
        return "warm"
    if settings.fmg:
        cycler.nested_iteration(vcycles=1)
        return "fmg"
    if settings.skip_first_down:
        cycler.nested_iteration(vcycles=0)
        return "skip"
    return "cold"


def _check_spatial_relaxation(transfer, settings: MGRITSettings, n_levels: int) -> None:
    """ValueError naming ``relax`` when a level coarsened in space relaxes with F only.

    F-relaxation never changes C-points, so they change only by the correction
    ``P(w − R u)``: the part ``(I − P R) e`` of a C-point's error would never be corrected
    and the iteration would stagnate. C-relaxation (FCF) propagates it one interval per
    iteration, so the iteration still terminates (docs/coarsening.md).
    """
    if transfer is None:
        return
    coarsens = getattr(transfer, "coarsens", lambda level: True)
    bad = [ell for ell in range(n_levels - 1)
           if coarsens(ell) and settings.relax_on(ell) != "FCF"]
    if bad:
        raise ValueError(
            f"`relax` must be 'FCF' on level(s) {bad}, whose coarse level is coarsened in "
            f"space: with F-relaxation the C-point error outside the range of the spatial "
            f"interpolation P is never corrected and MGRIT stagnates (docs/coarsening.md)."
        )


def final_c_relax(u, c_pos, r):
    """XBraid's final FC relaxation on a block whose F-points are already relaxed (the last
    measurement's F-sweep): ``u[c] ← u[c] + r[c] = Φ(u[c-1]) + g[c]`` at the C-positions
    ``c_pos``, from the residual ``r`` the measurement computed (no step is applied again).
    The F-point after each C-point keeps its value (it was stepped from the old ``u[c]``), as
    in XBraid, whose final relaxation ends with the C-sweep. Modifies ``u`` in place."""
    return set_rows(u, c_pos, rows_view(u, c_pos) + r, inplace=True)  # the sum is a new array


def solve(
    problem,
    settings: MGRITSettings | None = None,
    comm=None,
    u_init=None,
    layout: Layout | None = None,
    workspace: Workspace | None = None,
) -> MGRITResult:
    """Solve ``u[i] = Φ(u[i∓1]) + g[i]`` with MGRIT; return the solution and the record.

    problem   a :class:`Problem` (or an object with ``step``, ``u0``, ``n_steps``)
    settings  :class:`MGRITSettings` (default: two-level F-relaxation, abs_tol 1e-10)
    comm      communicator (default :class:`SerialComm`: one rank, the whole grid)
    u_init    warm start, shape ``(N + 1, *S)`` in fine-index order (e.g. the previous solve)
    layout    block partition (default: balanced over ``comm.size`` ranks)
    workspace a :class:`~refbraid.mgrit.workspace.Workspace`: the per-level arrays are kept
              there and reused by the next solve of the same shapes (the same numbers). The
              returned ``solution`` is then the workspace's level-0 array, overwritten by
              that next solve: copy it if it must outlive it. None (default): fresh arrays.
    """
    t0 = time.perf_counter()
    problem = as_problem(problem)
    settings = MGRITSettings() if settings is None else settings
    if not isinstance(settings, MGRITSettings):
        raise TypeError(f"`settings` must be an MGRITSettings, got {type(settings).__name__}.")
    comm = SerialComm() if comm is None else comm
    _check_comm(comm)
    N = problem.n_steps
    hierarchy = build_hierarchy(N, settings.cfactors, settings.min_coarse)
    _check_spatial_relaxation(problem.transfer, settings, len(hierarchy))
    scomm = comm if problem.direction == "forward" else comm.reverted()
    if layout is None:
        layout = partition(hierarchy.coarsest.points, N, comm.size)
    check_layout(layout, hierarchy.coarsest.points, N)
    if layout.n_blocks != comm.size:
        raise ValueError(f"`layout` has {layout.n_blocks} blocks for {comm.size} ranks.")
    position = scomm.position
    states = build_states(hierarchy, layout, position, problem)
    lo, hi = layout.bounds(position)
    g_all = rhs_solver_order(problem, workspace)
    states[0].g = g_all[lo:hi, ...]  # a view: g_all is this solve's own (nothing writes g)
    states[0].u = _initial_iterate(problem, u_init, states[0].g, slice(lo, hi),
                                   _overwritten(problem, u_init, settings, len(hierarchy)),
                                   workspace)
    cycler = (FusedCycler if settings.fused else Cycler)(states, settings, scomm, workspace)
    pending = cycler.pending = PendingNorms()  # norms nobody decides on: reduced at the end
    start = _start(cycler, len(hierarchy), settings, warm=u_init is not None)
    setup = time.perf_counter() - t0

    # Inside host_reads_deferred (a CUDA graph capture) nothing is decided on the way: every
    # cycle runs, every norm waits, and the status is decided by result.settle() afterwards.
    deciding = host_reads_allowed()
    if not deciding and comm.size != 1:
        raise ValueError("a solve inside host_reads_deferred() (a captured gradient) runs on "
                         f"one process; `comm` has {comm.size} ranks.")
    records: list[IterationRecord] = []
    first = status = message = None
    cycles = 0
    t_prev = time.perf_counter()
    while True:
        # a relaxation known to be the last may check its rows for NaN/inf as it writes them,
        # and its norm may wait for the end-of-solve reduction (the loop ends whatever it is)
        last = cycles >= settings.max_iter or len(hierarchy) == 1
        cycler.watch_finite = last
        r, r_post, u_post = cycler.relax(0, snapshot=settings.keep_iterates)
        # without decisions every norm waits; else the last one may, unless the final FC
        # relaxation needs the status
        deferred = not deciding or (last and not settings.final_fc_relax)
        norm = math.nan if deferred else cycler.norm(r)
        u0_block = states[0].u
        visit = LevelVisit(
            0,
            norm,
            r if settings.keep_residuals else None,
            copy(u0_block) if settings.keep_iterates else None,
        )
        now = time.perf_counter()
        rec = IterationRecord(
            cycles,
            norm,
            norm if r_post is r else math.nan,  # a post-cycle norm of its own waits
            [visit],
            tuple(s.step.count for s in states),
            now - t_prev,
            post_cycle_iterate=(u_post if u_post is not u0_block else visit.iterate),
        )
        t_prev = now
        records.append(rec)
        defer_norms(pending, cycler.local_sq, rec, r, r_post, deferred)
        if deferred and last:
            break
        if deciding:
            first = norm if first is None else first
            status, message = status_after(norm, first, settings, cycles, len(hierarchy))
            if status is not None:
                break
        cycler.visits = rec.visits
        cycler.coarse_correction(0, r, settings.cycle)
        cycles += 1

    c_rewritten = settings.final_fc_relax and len(hierarchy) > 1 and status != "diverged"
    if c_rewritten:
        u0_block = final_c_relax(u0_block, states[0].c_pos, r)
    xp = namespace(u0_block)
    finite = solution_finite(cycler, u0_block, states[0].c_pos, c_rewritten)
    fine = np.array(states[0].points, dtype=np.int64)  # a writable copy (levels are read-only)
    fine = fine if problem.direction == "forward" else problem.n_steps - fine
    solution = u0_block
    if problem.direction == "backward":
        solution, fine = xp.flip(solution, axis=0), fine[::-1].copy()
    result = MGRITResult(
        solution=solution,
        fine_indices=fine,
        status="pending",
        iterations=cycles,
        records=records,
        hierarchy=hierarchy,
        settings=settings,
        direction=problem.direction,
        start=start,
        step_counts=tuple(s.step.count for s in states),
        step_seconds=tuple(s.step.seconds for s in states),
        setup_seconds=setup,
        solve_seconds=time.perf_counter() - t0,
        rank=int(getattr(comm, "rank", 0)),
        n_ranks=int(comm.size),
    )

    def settle() -> None:
        """Every rank's block, and the norms kept for the end: one collective (and on a
        device, one transfer for the sums and the flag); then the status. Without decisions
        on the way (``deciding`` false) it may run again after each replay of a captured
        solve: the kept sums are read anew and the status is decided from all records."""
        found, why, done = status, message, cycles
        all_finite = pending.resolve(scomm, finite=finite, keep=not deciding)
        if not deciding:  # the first record that says stop decides, as the loop would have
            found = None
            for done, rec in enumerate(records):
                found, why = status_after(rec.norm, records[0].norm, settings, done,
                                          len(hierarchy))
                if found is not None:
                    break
        if found is None:  # the last iteration's norm was one of them
            first_norm = records[0].norm if first is None else first
            found, why = status_after(records[-1].norm, first_norm, settings, done,
                                      len(hierarchy))
        if found != "diverged" and not all_finite:
            found, why = "diverged", "non-finite values in the solution"
        level = None
        if found == "diverged":
            grew = math.isfinite(records[-1].norm) and all_finite
            level = 0 if grew else divergence_level(records, cycler)
            why = f"{where(level, len(hierarchy), done)}: {why}"
        result.status, result.message = found, why
        if found == "diverged" and settings.on_divergence == "raise":
            raise MGRITDiverged(f"MGRIT diverged at iteration {done} {why}", result,
                                iteration=done, level=level)

    if deciding:
        settle()
    else:
        result.settle_later(settle)
    return result


def gather_solution(result: MGRITResult, comm, root: int = 0) -> Any | None:
    """Whole trajectory ``(N + 1, *S)``, fine order, on ``root`` from every rank's blocks (else
    None)."""
    parts = comm.gather((result.fine_indices, result.solution), root=root)
    if parts is None:
        return None
    idx = np.concatenate([p[0] for p in parts])
    xp = namespace(parts[0][1])
    full = xp.concat([p[1] for p in parts], axis=0)
    return take_rows(full, np.argsort(idx, kind="stable"))
